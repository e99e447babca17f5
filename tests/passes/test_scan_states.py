"""scan-states: a Scan's computed initial states and its body's next states written by a
Reshape to their own shape, exactly; MIGraphX 2.15 and 2.16 refuse a state they hold as a
strided view (a Slice, Transpose ...) and fail to compile a body whose next state is one."""

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import rewriter
from rewriter.core.registry import default_pipeline


def _body(rng, tag, rows=1):
    """state s [1, 240], frame f [1, 400] -> next = (Concat(s, f[:, :160]) * w)[:, 160:],
    a view of a longer tensor; scan output y = Concat(s, f[:, :160]) * w."""
    w = numpy_helper.from_array(rng.standard_normal((1, 400)).astype(np.float32), f"w{tag}")
    ints = [numpy_helper.from_array(np.array(v, np.int64), f"{n}{tag}")
            for n, v in (("z", [0]), ("a160", [160]), ("a400", [400]), ("ax", [1]))]
    nodes = [h.make_node("Slice", ["f", f"z{tag}", f"a160{tag}", f"ax{tag}"], ["head"]),
             h.make_node("Concat", ["s", "head"], ["c"], axis=1),
             h.make_node("Mul", ["c", f"w{tag}"], ["y"]),
             h.make_node("Slice", ["y", f"a160{tag}", f"a400{tag}", f"ax{tag}"], ["next"])]
    vi = h.make_tensor_value_info
    g = h.make_graph(nodes, f"body{tag}", [vi("s", T.FLOAT, [rows, 240]),
                                           vi("f", T.FLOAT, [1, 400])],
                     [vi("next", T.FLOAT, [rows, 240]), vi("y", T.FLOAT, [rows, 400])],
                     [w] + ints)
    for v in list(g.input) + list(g.output) + list(g.value_info):   # MIGraphX: unique names
        v.name += tag
    for n in g.node:
        n.input[:] = [x + tag if x in ("s", "f", "head", "c", "y") else x for x in n.input]
        n.output[:] = [x + tag for x in n.output]
    return g


def scan_model(rng, batch="B"):
    """Two Scans (two sites, distinct weights): one's initial state a Slice of x (a
    symbolic batch: the Shape path), the other's a Transpose (static)."""
    vi = h.make_tensor_value_info
    ints = [numpy_helper.from_array(np.array(v, np.int64), n)
            for n, v in (("b0", [0]), ("e240", [240]), ("ax1", [1]))]
    nodes = [h.make_node("Slice", ["x", "b0", "e240", "ax1"], ["i1"]),
             h.make_node("Scan", ["i1", "fr"], ["st1", "y1"], body=_body(rng, "1", batch),
                         num_scan_inputs=1),
             h.make_node("Transpose", ["xt"], ["i2"], perm=[1, 0]),
             h.make_node("Scan", ["i2", "fr"], ["st2", "y2"], body=_body(rng, "2"),
                         num_scan_inputs=1)]
    g = h.make_graph(nodes, "g", [vi("x", T.FLOAT, [batch, 1000]), vi("xt", T.FLOAT, [240, 1]),
                                  vi("fr", T.FLOAT, [5, 1, 400])],
                     [vi("st1", T.FLOAT, [batch, 240]), vi("y1", T.FLOAT, [5, batch, 400]),
                      vi("st2", T.FLOAT, [1, 240]), vi("y2", T.FLOAT, [5, 1, 400])], ints)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _feeds(rng):
    return {"x": rng.standard_normal((1, 1000)).astype(np.float32),
            "xt": rng.standard_normal((240, 1)).astype(np.float32),
            "fr": rng.standard_normal((5, 1, 400)).astype(np.float32)}


def _reshaped(model):
    """(top-level Reshapes feeding a Scan, Reshapes writing a body's first output)"""
    prod = {o: n for n in model.graph.node for o in n.output}
    top = sum(prod[n.input[0]].op_type == "Reshape" for n in model.graph.node
              if n.op_type == "Scan" and n.input[0] in prod)
    bodies = [a.g for n in model.graph.node if n.op_type == "Scan" for a in n.attribute
              if a.name == "body"]
    inner = sum(any(b.op_type == "Reshape" and b.output[0] == g.output[0].name
                    for b in g.node) for g in bodies)
    return top, inner


def test_states_and_next_states_reshaped_exactly(rng):
    m = scan_model(rng)
    out, rep = rewriter.rewrite(m, ["scan-states"], verify=True)
    counts = rep.passes[0].counts
    assert counts.get("reshaped-states") == 2 and counts.get("reshaped-next-states") == 2
    assert _reshaped(out) == (2, 2)
    assert any(n.op_type == "Shape" for n in out.graph.node)    # the symbolic batch's state
    onnx.checker.check_model(out)
    feeds = _feeds(rng)
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_kept_through_the_pipeline_and_idempotent(rng):
    m = scan_model(rng, batch=1)
    out, rep = rewriter.rewrite(m, target="migraphx")
    assert _reshaped(out) == (2, 2)
    assert not any("still changed" in w for w in rep.warnings), rep.warnings
    again, rep2 = rewriter.rewrite(out, ["scan-states"])
    counts = rep2.passes[0].counts
    assert not rep2.passes[0].changed
    assert counts.get("skip:state-already-reshaped") == 2, counts
    assert counts.get("skip:next-state-already-reshaped") == 2, counts
    feeds = _feeds(rng)
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_in_the_default_pipeline_for_migraphx_only():
    # after every pass that could drop its Reshapes (bound-loops only writes trip counts)
    assert default_pipeline("migraphx")[-2:] == ["scan-states", "bound-loops"]
    assert "scan-states" not in default_pipeline(None)


def test_states_that_are_inputs_need_none(rng):
    m = scan_model(rng)
    scans = [n for n in m.graph.node if n.op_type == "Scan"]
    scans[0].input[0] = "xt_row"                  # a graph input as the state
    m.graph.input.append(h.make_tensor_value_info("xt_row", T.FLOAT, [1, 240]))
    del m.graph.node[0]                           # the Slice, now unread
    out, rep = rewriter.rewrite(m, ["scan-states"])
    assert rep.passes[0].counts.get("skip:state-not-computed") == 1
    assert rep.passes[0].counts.get("reshaped-states") == 1


@pytest.mark.migraphx
def test_migraphx_refuses_the_original_and_runs_the_rewrite(rng, tmp_path, migraphx_version):
    from rewriter.migraphx import backend

    m = scan_model(rng, batch=1)
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(m, src)
    feeds = _feeds(rng)
    with pytest.raises(backend.MigraphxError, match="State input 0 shape"):
        backend.compile_and_run(src, feeds, None, target="ref")
    out, _ = rewriter.rewrite(m, target="migraphx")
    onnx.save(out, dst)
    run = backend.compile_and_run(dst, feeds, None, target="ref")
    assert run.output_names == ["st1", "y1", "st2", "y2"]
    for got, want in zip(run.outputs, run_ort(m, feeds)):
        np.testing.assert_allclose(np.reshape(got, want.shape), want, rtol=1e-5, atol=1e-5)


def random_scan_model(seed):
    """A Scan of 1-3 states, each made by one of the producers MIGraphX holds as a view or
    not (Slice on the last or the first axis, Transpose, Expand, Add of a Slice, Split, a
    graph input, an initializer) and carried by the body through a Slice of a Concat, an
    Add, an Identity, or unchanged (which onnxruntime computes wrongly: ort.session adds
    an Identity); opsets 11-21."""
    rng = np.random.default_rng(seed)
    opset, w = int(rng.choice([11, 13, 16, 17, 19, 21])), 8
    vi = h.make_tensor_value_info
    nodes, ginputs = [], [vi("x", T.FLOAT, [1, 64]), vi("xt", T.FLOAT, [w, 1]),
                          vi("fr", T.FLOAT, [4, 1, w])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (
        ("z", [0]), ("one", [1]), ("two", [2]), ("wd", [w]), ("w1", [1 + w]),
        ("w2", [2 + w]), ("shp", [1, w]), ("halves", [w, w]))]
    states = []
    for i in range(int(rng.integers(1, 4))):
        kind, s = rng.choice(["last", "first", "transpose", "expand", "add", "split", "input",
                              "init"]), f"st{i}"
        if kind == "last":
            nodes.append(h.make_node("Slice", ["x", "one", "w1", "one"], [s]))
        elif kind == "first":
            ginputs.append(vi(f"x0_{i}", T.FLOAT, [3, w]))
            nodes.append(h.make_node("Slice", [f"x0_{i}", "one", "two", "z"], [s]))
        elif kind == "transpose":
            nodes.append(h.make_node("Transpose", ["xt"], [s], perm=[1, 0]))
        elif kind == "expand":
            ginputs.append(vi(f"xe{i}", T.FLOAT, [1, 1]))
            nodes.append(h.make_node("Expand", [f"xe{i}", "shp"], [s]))
        elif kind == "add":
            nodes += [h.make_node("Slice", ["x", "two", "w2", "one"], [f"v{i}"]),
                      h.make_node("Add", [f"v{i}", f"v{i}"], [s])]
        elif kind == "split":
            ginputs.append(vi(f"xs{i}", T.FLOAT, [1, 2 * w]))
            nodes.append(h.make_node("Split", [f"xs{i}", "halves"], [s, f"rest{i}"], axis=1)
                         if opset >= 13 else
                         h.make_node("Split", [f"xs{i}"], [s, f"rest{i}"], axis=1, split=[w, w]))
        elif kind == "input":
            ginputs.append(vi(s, T.FLOAT, [1, w]))
        else:
            inits.append(numpy_helper.from_array(rng.standard_normal((1, w)).astype(
                np.float32), s))
        states.append(s)
    bn, bins, bouts = [], [], []
    for i in range(len(states)):
        bins.append(vi(f"bs{i}", T.FLOAT, [1, w]))
        carry, o = rng.choice(["slice", "add", "identity", "unchanged"]), f"bn{i}"
        if carry == "slice":
            bn += [h.make_node("Concat", [f"bs{i}", "bf"], [f"bc{i}"], axis=1),
                   h.make_node("Slice", [f"bc{i}", "bw", "b2w", "bax"], [o])]
        elif carry == "add":
            bn.append(h.make_node("Add", [f"bs{i}", "bf"], [o]))
        elif carry == "identity":
            bn.append(h.make_node("Identity", [f"bs{i}"], [o]))
        else:
            o = f"bs{i}"
        bouts.append(vi(o, T.FLOAT, [1, w]))
    bn.append(h.make_node("Mul", ["bf", "bf"], ["by"]))
    body = h.make_graph(bn, "body", bins + [vi("bf", T.FLOAT, [1, w])],
                        bouts + [vi("by", T.FLOAT, [1, w])],
                        [numpy_helper.from_array(np.array(v, np.int64), n)
                         for n, v in (("bw", [w]), ("b2w", [2 * w]), ("bax", [1]))])
    outs = [f"so{i}" for i in range(len(states))]
    nodes.append(h.make_node("Scan", states + ["fr"], outs + ["ys"], body=body,
                             num_scan_inputs=1))
    g = h.make_graph(nodes, "g", ginputs, [vi(o, T.FLOAT, [1, w]) for o in outs]
                     + [vi("ys", T.FLOAT, [4, 1, w])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _random_feeds(model, seed):
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


@pytest.mark.parametrize("seed", range(40))
def test_random_scans_verify_and_reach_a_fixed_point(seed):
    m = random_scan_model(seed)
    _, rep = rewriter.rewrite(m, target="migraphx", verify=True,
                              inputs=_random_feeds(m, seed))
    assert rep.ok and rep.verified
    assert not any("still changed" in w for w in rep.warnings), rep.warnings


@pytest.mark.migraphx
def test_random_scans_compile_on_migraphx_once_rewritten(tmp_path, migraphx_version):
    """20 random Scans: the rewrite of each compiles on MIGraphX `ref` and equals onnx's
    reference evaluator; most originals are refused (measured, 2.15 and 2.16: 90 of 100)."""
    import onnx.reference

    from rewriter.migraphx import backend
    refused = 0
    for seed in range(20):
        m = random_scan_model(seed)
        feeds = _random_feeds(m, seed)
        src, dst = tmp_path / f"i{seed}.onnx", tmp_path / f"o{seed}.onnx"
        onnx.save(m, src)
        refused += backend.refuses(src, {k: list(v.shape) for k, v in feeds.items()}) is not None
        out, _ = rewriter.rewrite(m, target="migraphx")
        onnx.save(out, dst)
        run = backend.compile_and_run(dst, feeds, None, target="ref")
        for got, want in zip(run.outputs, onnx.reference.ReferenceEvaluator(m).run(None, feeds)):
            np.testing.assert_allclose(np.reshape(got, want.shape), want, rtol=1e-5, atol=1e-5)
    assert refused >= 10, refused


def loop_model(rng):
    """A Loop of 4 steps whose initial state is a Slice of the input ([2, 5] -> [2, 3]: a
    strided view for MIGraphX) and whose body's next state is Tanh(s * w)[:, :3] of a
    wider product: chars2vec's tf2onnx LSTM Loops start from such computed states."""
    w = rng.standard_normal((2, 4)).astype(np.float32)
    return onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 5] x) => (float[2, 3] y, float[4, 2, 4] ys) {{
        m = Constant <value = int64 {{4}}> ()
        st = Constant <value = int64[1] {{1}}> ()
        en = Constant <value = int64[1] {{4}}> ()
        ax = Constant <value = int64[1] {{1}}> ()
        xs = Slice (x, st, en, ax)
        y, ys = Loop (m, "", xs) <body = b (int64 i, bool cin, float[2, 3] s) => (bool cout,
                                                            float[2, 3] s2, float[2, 4] o) {{
            cout = Identity (cin)
            w = Constant <value = float[2, 4] {{{", ".join(map(str, w.ravel()))}}}> ()
            z = Constant <value = float[2, 1] {{0.25, -0.5}}> ()
            c = Concat <axis = 1> (s, z)
            o = Mul (c, w)
            t = Tanh (o)
            s0 = Constant <value = int64[1] {{0}}> ()
            s3 = Constant <value = int64[1] {{3}}> ()
            a1 = Constant <value = int64[1] {{1}}> ()
            s2 = Slice (t, s0, s3, a1)
        }}>
    }}""")


def test_loop_states_and_next_states_reshaped_exactly(rng):
    m = loop_model(rng)
    out, rep = rewriter.rewrite(m, ["scan-states"], verify=True)
    counts = rep.passes[0].counts
    assert counts.get("reshaped-states") == 1 and counts.get("reshaped-next-states") == 1
    loop = next(n for n in out.graph.node if n.op_type == "Loop")
    prod = {o: n for n in out.graph.node for o in n.output}
    assert prod[loop.input[2]].op_type == "Reshape" and not loop.input[1]
    body = loop.attribute[0].g
    assert next(n for n in body.node if n.output[0] == body.output[1].name).op_type == "Reshape"
    onnx.checker.check_model(out)
    feeds = {"x": rng.standard_normal((2, 5)).astype(np.float32)}
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)
    again, rep2 = rewriter.rewrite(out, ["scan-states"])
    assert not rep2.passes[0].changed


@pytest.mark.migraphx
def test_migraphx_refuses_a_loop_from_a_slice_and_runs_the_rewrite(rng, tmp_path,
                                                                  migraphx_version):
    from rewriter.migraphx import backend

    m = loop_model(rng)
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(m, src)
    feeds = {"x": rng.standard_normal((2, 5)).astype(np.float32)}
    with pytest.raises(backend.MigraphxError, match="not in standard layout"):
        backend.compile_and_run(src, feeds, None, target="ref")
    out, _ = rewriter.rewrite(m, target="migraphx")
    onnx.save(out, dst)
    run = backend.compile_and_run(dst, feeds, None, target="ref")
    for got, want in zip(run.outputs, run_ort(m, feeds)):
        np.testing.assert_allclose(np.reshape(got, want.shape), want, rtol=1e-5, atol=1e-5)


SCALAR_LOOP = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, T] x) => (float y, float[3] ys) {
        m = Constant <value = int64 {3}> ()
        s0 = ReduceSum <keepdims = 0> (x)
        y, ys = Loop (m, "", s0) <body = b (int64 i, bool cin, float s) => (bool cout, float s2,
                                                                          float o) {
            cout = Identity (cin)
            h = Constant <value = float {0.75}> ()
            t = Mul (s, h)
            s2 = Tanh (t)
            o = Identity (t)
        }>
    }"""


def test_scalar_states_are_left_alone(rng):
    """chars2vec's Loops carry 0-d counters and lengths: a Reshape to [] made MIGraphX 2.15
    refuse the model ("Reshape: ... reshape has 0 elements whereas the input has 1") and
    2.16 fail at "MULTIBROADCAST: input dimensions should be > 0". A 0-d tensor has no
    strides to fix: skipped."""
    m = onnx.parser.parse_model(SCALAR_LOOP)
    out, rep = rewriter.rewrite(m, ["scan-states"])
    counts = rep.passes[0].counts
    assert counts.get("skip:state-scalar") == 1 and counts.get("skip:next-state-scalar") == 1
    assert not rep.passes[0].changed


@pytest.mark.migraphx
def test_a_loop_of_scalar_states_compiles_and_other_shapes_are_said(tmp_path, capfd,
                                                                   migraphx_version):
    from rewriter.cli import main

    src, feeds = tmp_path / "m.onnx", tmp_path / "feeds"
    onnx.save(onnx.parser.parse_model(SCALAR_LOOP), src)
    feeds.mkdir()
    for k, t in enumerate((5, 5, 7)):
        np.save(feeds / f"{k}.npy", np.linspace(-1, 1, t, dtype=np.float32)[None] * (k + 1))
    code = main([str(src), "-o", str(tmp_path / "o.onnx"), "--inputs", str(feeds),
                 "--migraphx-target", "ref"])
    out = capfd.readouterr().out
    assert code == 0, out
    assert "compiled, 2 sample(s) (1 given of other shapes not run: one compiled shape)" \
        in out, out
