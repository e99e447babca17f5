"""rewriter.core.gs_io builds the graph onnx-graphsurgeon's own import builds (and the
import step's one-count shape decision agrees with asking every pass).

Compared on every model the onnx wheel ships under backend/test/data, the generated
models, hand-made edge cases (subgraphs reading outer names, shadowing, empty optional
names, value_info that adds or overrides types) and, when fetched, the trained models:
the export is byte-identical and every tensor has the same kind, type, shape, producers
and consumers (by position), so passes cannot tell the two imports apart.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import pytest
from onnx_graphsurgeon.ir.tensor import LazyValues
from onnx_graphsurgeon.util import misc as gs_misc
from conftest import CACHE_MODELS, ONNX_DATA, ROOT
from onnx import helper, numpy_helper

from rewriter.core.graph import iter_graphs
from rewriter.core.gs_io import export_model, gc_paused, import_model, supported


def _signature(graph: gs.Graph) -> list:
    out = []
    for g in iter_graphs(graph):
        pos = {id(n): i for i, n in enumerate(g.nodes)}
        out.append([(n.op, n.name, n.domain, [t.name for t in n.inputs],
                     [t.name for t in n.outputs], sorted(n.attrs)) for n in g.nodes])
        out.append([t.name for t in g.inputs] + ["|"] + [t.name for t in g.outputs])
        for name, t in sorted(g.tensors().items()):
            row = [name, type(t).__name__, [pos.get(id(n)) for n in t.inputs],
                   [pos.get(id(n)) for n in t.outputs]]
            if isinstance(t, gs.Constant):
                v = t._values
                row += [isinstance(v, LazyValues), str(v.dtype), list(v.shape), v.nbytes,
                        t.data_location, t._export_dtype]
                if isinstance(v, LazyValues) and v.tensor.data_location != 1:
                    a = v.load()   # the same array (ours may be read-only, never copied)
                    row += [str(a.dtype), a.shape, a.tobytes()]
            else:
                row += [str(t.dtype), t.shape, t.type]
            out.append(row)
    return out


def assert_same_import(model: onnx.ModelProto) -> None:
    """Same graph from both imports, and the same model from both exports."""
    ref, got = gs.import_onnx(model), import_model(model)
    assert _signature(got) == _signature(ref)
    a = gs.export_onnx(ref, do_type_check=False).SerializeToString()
    b = gs.export_onnx(got, do_type_check=False).SerializeToString()
    assert a == b
    assert_same_export(got)


def assert_same_export(graph: gs.Graph) -> None:
    a = gs.export_onnx(graph, do_type_check=False)
    b = export_model(graph)
    assert b.SerializeToString() == a.SerializeToString()
    keep = {vi.name for vi in a.graph.value_info[::2]}
    c = export_model(graph, value_info=keep.__contains__)
    assert [vi.name for vi in c.graph.value_info] == [vi.name for vi in a.graph.value_info
                                                     if vi.name in keep]


def _backend_models() -> list[Path]:
    return sorted(Path(ONNX_DATA).rglob("*.onnx"))


def test_every_backend_data_model_imports_the_same():
    paths = _backend_models()
    assert len(paths) > 100
    fast = 0
    for p in paths:
        m = onnx.load(str(p), load_external_data=False)
        fast += supported(m)
        assert_same_import(m)
    assert fast > 0.9 * len(paths)   # the fast path is what runs, not the fallback


@pytest.mark.parametrize("name", ["resnet_mini.onnx", "mobilenet_mini.onnx"])
def test_generated_models_import_the_same(name):
    assert_same_import(onnx.load(str(ROOT / "models" / name)))


@pytest.mark.slow
def test_trained_models_import_the_same():
    paths = sorted(CACHE_MODELS.glob("*.onnx"))
    if not paths:
        pytest.skip("no trained models fetched (python tools/fetch_models.py)")
    for p in paths:
        assert_same_import(onnx.load(str(p), load_external_data=False))


def test_subgraphs_outer_names_shadowing_and_value_info():
    """An If whose branches read outer tensors, shadow one with their own initializer and
    produce outputs with empty optional names; value_info that types an intermediate twice
    (the second adds the shape) and re-types a graph input; a Constant node's tensor."""
    then_g = helper.make_graph(
        [helper.make_node("Add", ["a", "w"], ["t_out"])], "then", [],
        [helper.make_tensor_value_info("t_out", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [5.0, 6.0])])
    else_g = helper.make_graph(
        [helper.make_node("Dropout", ["b"], ["e_out", ""])], "else", [],
        [helper.make_tensor_value_info("e_out", onnx.TensorProto.FLOAT, [2])])
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor(
            "cv", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])),
        helper.make_node("Add", ["x", "c"], ["a"], name="add"),
        helper.make_node("Mul", ["a", "w"], ["b"]),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Resize", ["x", "", "scales"], ["r"], mode="nearest"),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n"]),
         helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor("w", onnx.TensorProto.FLOAT, [2], [3.0, 4.0]),
         helper.make_tensor("scales", onnx.TensorProto.FLOAT, [1], [1.0])],
        value_info=[helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, None),
                    helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2]),
                    helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2]),
                    helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert supported(m)
    assert_same_import(m)


def test_what_the_fast_path_does_not_cover_goes_to_graphsurgeon():
    """Local functions: the fallback is graphsurgeon's import itself."""
    f = helper.make_function("local", "Twice", ["x"], ["y"],
                             [helper.make_node("Add", ["x", "x"], ["y"])],
                             [helper.make_opsetid("", 17)])
    g = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="local")], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    m = helper.make_model(g, functions=[f], opset_imports=[helper.make_opsetid("", 17),
                                                           helper.make_opsetid("local", 1)])
    assert not supported(m)
    assert_same_import(m)
    assert len(import_model(m).functions) == 1


def test_io_lists_keep_no_instance_dict_and_stay_synchronised():
    """Each node and tensor has two SynchronizedLists; graphsurgeon's hold their parent and
    field in an instance dict: 36 MB of a 4,000-block chain's 90,666 lists (8 MB in a slot
    and on the class), 299 -> 269 MB peak of its whole rewrite. They still keep the other
    side in step, and one of graphsurgeon's own lists sits beside them."""
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
        a = Relu (x)
        y = Neg (a)
    }""")
    g = import_model(m)
    relu, neg = g.nodes
    a = relu.outputs[0]
    lists = [relu.inputs, relu.outputs, neg.inputs, a.inputs, a.outputs]
    assert all(isinstance(s, gs_misc.SynchronizedList) for s in lists)
    assert all(not getattr(s, "__dict__", None) for s in lists)
    assert (relu.inputs.field_name, relu.outputs.field_name) == ("outputs", "inputs")
    assert a.inputs.parent_obj is a and relu.outputs.parent_obj is relu
    b = gs.Variable("b", dtype=np.float32, shape=[2])
    extra = gs.Node("Abs", inputs=[a], outputs=[b])   # graphsurgeon's own lists
    assert a.outputs == [neg, extra]
    neg.inputs[0] = b
    assert a.outputs == [extra] and b.outputs == [neg]
    neg.inputs.clear()
    assert b.outputs == [] and list(neg.inputs) == []
    relu.outputs.append(b)
    assert b.inputs == [extra, relu]
    relu.outputs.remove(b)
    assert b.inputs == [extra]


def test_gc_paused_restores_the_collector():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()   # left as the caller had it
    finally:
        gc.enable()


def test_export_of_every_attribute_kind_and_new_constants():
    """What passes create: numpy-valued constants (weights, shapes), attributes of every
    kind graphsurgeon accepts (python and numpy scalars, bools, mixed int/float lists,
    strings, bytes, string lists, tensors, a nested graph), nodes without names, an
    optional empty input, a domain, a constant graph output."""
    import numpy as np

    x = gs.Variable("x", np.float32, [1, 2])
    w = gs.Constant("w", np.arange(4, dtype=np.float32).reshape(2, 2))
    shape = gs.Constant("shape", np.array([2, 1], np.int64))
    h = gs.Variable("h", np.float32, None)
    y = gs.Variable("y", np.float32, [2, 1])
    body_out = gs.Variable("b_out", np.float32, [1])
    body = gs.Graph(nodes=[gs.Node("Identity", inputs=[x], outputs=[body_out])],
                    outputs=[body_out], name="body")
    attrs = {"i": 3, "f": 0.5, "b": True, "ni": np.int64(7), "nf": np.float32(0.25),
             "ints": [1, 2], "floats": [1.0, 2.5], "mixed": [1, 2.5], "s": "abc",
             "bytes": b"raw", "strs": ["a", "b"], "t": gs.Constant("tv", np.ones(2, np.int32)),
             "g": body, "dt": np.float32}
    nodes = [gs.Node("MatMul", inputs=[x, w], outputs=[h]),
             gs.Node("Custom", "custom", attrs=attrs, inputs=[h, gs.Variable.empty(), shape],
                     outputs=[y], domain="my.domain")]
    const_out = gs.Constant("const_out", np.ones(3, np.float32))   # an output no node makes
    graph = gs.Graph(nodes=nodes, inputs=[x], outputs=[y, const_out], opset=17)
    assert_same_export(graph)


def test_freeze_next_import_freezes_once():
    """The console script's request: the next import freezes (gc.freeze), later ones not."""
    from rewriter.core import gs_io

    m = onnx.load(str(ROOT / "models" / "resnet_mini.onnx"))
    before = gc.get_freeze_count()
    try:
        gs_io.freeze_next_import()
        import_model(m)
        frozen = gc.get_freeze_count()
        assert frozen > before
        import_model(m)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_collect_frozen_frees_a_dropped_frozen_graph():
    """The CLI's graph, frozen at import, is garbage the collector never sees once dropped:
    collect_frozen frees it (and does nothing when no import froze)."""
    import weakref

    from rewriter.core import gs_io

    m = onnx.load(str(ROOT / "models" / "resnet_mini.onnx"))
    try:
        gs_io.freeze_next_import()
        graph = import_model(m)
        node = weakref.ref(graph.nodes[0])
        del graph
        gc.collect()
        assert node() is not None   # frozen: a plain collection does not see it
        gs_io.collect_frozen()
        assert node() is None and gc.get_freeze_count() == 0
        graph = import_model(m)   # no freeze asked: nothing to collect, nothing unfrozen
        gc.freeze()
        frozen = gc.get_freeze_count()
        gs_io.collect_frozen()
        # Unfrozen, the count would be 0. Frozen objects that die by reference count leave
        # it meanwhile (another thread's: 261877 -> 261875 once on a loaded machine).
        assert gc.get_freeze_count() > 0.99 * frozen
    finally:
        gc.unfreeze()


def test_pipeline_needs_shapes_agrees_with_asking_every_pass():
    """One op count for the whole pipeline gives each pass's own answer (backend-data
    models and the generated ones; at least one model needs shapes, one does not)."""
    from rewriter.core import registry
    from rewriter.core.pass_base import pipeline_needs_shapes

    passes = registry.resolve(None)
    seen = set()
    for p in _backend_models()[::7] + [ROOT / "models" / "resnet_mini.onnx"]:
        m = onnx.load(str(p), load_external_data=False)
        for k in range(len(passes)):
            want = any(q.needs_shapes(m) for q in passes[k:])
            assert pipeline_needs_shapes(passes[k:], m) == want, (p, k)
            seen.add(want)
    assert seen == {True, False}


def test_every_default_pass_says_which_ops_need_shapes():
    """Shape inference at import (and again before every later round) is skipped when no
    pass needs it. A pass that keeps the safe default asks for it on every model:
    expand-ml and default-attributes did, so a plain `rewrite IN -o OUT` (MIGraphX the
    target) inferred the shapes of a chain of 4,000 Conv+BN+Relu twice (0.3 s at import,
    0.6 s before the second round). Each default pass now names its ops or its own rule,
    and a model with none of those ops is imported without inference."""
    from rewriter.core import registry
    from rewriter.core.pass_base import Pass, pipeline_needs_shapes

    passes = registry.resolve("default", "migraphx")
    assert {p.name for p in passes} == set(registry.DEFAULT_PIPELINE)
    vague = [p.name for p in passes
             if p.shape_ops is None and type(p).needs_shapes is Pass.needs_shapes]
    assert not vague, vague
    rng = np.random.default_rng(51)
    chain = helper.make_model(helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "s", "b", "mu", "var"], ["n"]),
         helper.make_node("Relu", ["n"], ["y"])], "chain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 2, 4, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 2, 4, 4])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in {
            "w": rng.standard_normal((2, 2, 3, 3)), "s": rng.uniform(0.5, 2, 2),
            "b": rng.standard_normal(2), "mu": rng.standard_normal(2),
            "var": rng.uniform(0.5, 2, 2)}.items()]),
        opset_imports=[helper.make_opsetid("", 17)])
    assert not pipeline_needs_shapes(passes, chain)
    scaler = helper.make_model(helper.make_graph(
        [helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", scale=[2.0],
                          offset=[0.5])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 3])]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    assert registry.get("expand-ml")().needs_shapes(scaler)


def test_the_console_script_freezes_only_fp32_runs(tmp_path, monkeypatch):
    """cli.main(freeze_graph=True) asks for the freeze on a plain rewrite, not with --plan
    (the planner's graph would stay frozen through the rewrite after it)."""
    from rewriter import cli
    from rewriter.core import gs_io

    asked = []
    monkeypatch.setattr(gs_io, "freeze_next_import", lambda: asked.append(True))
    model = ROOT / "models" / "resnet_mini.onnx"
    assert cli.main([str(model), "-o", str(tmp_path / "a.onnx"), "-q", "--target", "none"],
                    freeze_graph=True) == 0
    assert asked == [True]
    assert cli.main([str(model), "-o", str(tmp_path / "b.onnx"), "-q", "--target", "none"]) == 0
    assert asked == [True]
    cli.main([str(model), "-o", str(tmp_path / "c.onnx"), "-q", "--target", "none",
              "--plan", "fp16"], freeze_graph=True)
    assert asked == [True]


def test_long_lists_and_unread_kinds_are_carried_as_they_came():
    """A tree ensemble's attributes (tens of millions of entries) became Python lists and
    back, 25 s and gigabytes (tenth round); graphsurgeon's importer dropped Optional's
    TYPE_PROTO attribute. Both are kept as their AttributeProto, and written back byte for
    byte; a Constant's long list is a value fold-constants reads, and stays a list."""
    from rewriter.core.gs_io import LONG_LIST, RawAttribute
    n = LONG_LIST + 1
    tree = helper.make_node("TreeLike", ["x"], ["y"], domain="ai.onnx.ml",
                            nodes_values=[0.5] * n, nodes_ids=list(range(n)))
    const = helper.make_node("Constant", [], ["c"], value_floats=[1.0] * n)
    opt = helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(
        onnx.TensorProto.FLOAT, [2]))
    g = helper.make_graph([tree, const, opt], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18),
                                            helper.make_opsetid("ai.onnx.ml", 3)])
    graph = import_model(m)
    kinds = {node.op: {k: type(v) for k, v in node.attrs.items()} for node in graph.nodes}
    assert kinds["TreeLike"] == {"nodes_values": RawAttribute, "nodes_ids": RawAttribute}
    assert kinds["Constant"] == {"value_floats": list}
    assert kinds["Optional"] == {"type": RawAttribute}
    back = export_model(graph)
    for a, b in zip(m.graph.node, back.graph.node):
        assert a.SerializeToString() == b.SerializeToString()


def test_the_pipeline_counts_nodes_again_only_after_a_change(monkeypatch):
    """Each pass's record says the nodes before and after it; counting walks every node of
    every graph, and was done twice per pass (76 counts, 0.1 s, over the two rounds of a
    chain of 4,000 Conv+BN+Relu). Now once, then again only after a pass that changed the
    graph; the records say what they said."""
    from rewriter.core import manager, registry

    m = onnx.load(str(ROOT / "models" / "resnet_mini.onnx"))
    counted = []
    real = manager.count_nodes
    monkeypatch.setattr(manager, "count_nodes", lambda g: counted.append(1) or real(g))
    import rewriter
    out, rep = rewriter.rewrite(m, registry.resolve("default"), target=None)
    changed = [r for r in rep.passes if r.changed]
    rounds = 1 + max(r.round for r in rep.passes)
    assert len(counted) == rounds + len(changed)
    assert rep.passes[0].nodes_before == len(m.graph.node)
    assert rep.passes[-1].nodes_after == len(out.graph.node)
    for a, b in zip(rep.passes, rep.passes[1:]):
        assert b.nodes_before == a.nodes_after or b.round != a.round
    assert all(r.nodes_after == r.nodes_before for r in rep.passes if not r.changed)
