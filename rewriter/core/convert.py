"""ONNX <-> onnx-graphsurgeon, without copying weights.

* :func:`to_graph` imports a model; external weights become lazily memory-mapped
  :class:`rewriter.core.load.ExternalValues`, so a 2.5 GB model is never read whole;
  shapes and dtypes come from ONNX shape inference on a weight-free copy.
* :func:`export` exports back with big weights as stubs (:class:`Exported`): checking,
  verifying and saving then never copy weights through protobuf; :func:`to_model` keeps
  the original's model-level fields (IR version, opsets, metadata, functions).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from .errors import InputError
from .gs_io import export_model, import_model
from .graph import (PACKED, SUBGRAPH_OPS, constant_tensors, graph_protos, iter_graphs,
                    iter_model_tensors, node_bodies, onnx_bytes, packed, unique_node_names,
                    weight_free_copy)
from .load import ExternalValues, first_line, resolve_external

# Tensors above this many bytes go to the external data file when we write one.
EXTERNAL_THRESHOLD = 1024


def shape_info(model: onnx.ModelProto, fixed: dict[str, list[int]] | None = None,
               check: bool = False) -> dict[str, onnx.ValueInfoProto]:
    """Inferred value infos by name, computed on a weight-free copy of the model.

    Shape inference only needs the dims of big initializers, so they are replaced by
    empty stubs: no copy of the weights, and it works on models over 2 GB. ``fixed`` gives
    graph inputs static dims first (--fix-shapes); the model's own value_info, written for
    the symbolic shapes, is dropped then so that nothing stale survives. ``check`` (the
    import's) tests the model's declarations against a first inference without them
    (:func:`lying_declarations`) and leaves out those it contradicts; their names are the
    result's ``lies``.
    """
    stub = unknown_negative_dims(weight_free_copy(model))
    if fixed:
        write_input_dims(stub, fixed)
        del stub.graph.value_info[:]
        for vi in stub.graph.output:
            vi.type.tensor_type.ClearField("shape")
    same: list = []   # the inference without declarations, where it gave them all
    lies = lying_declarations(stub, same) if check else {}
    try:
        # onnx's data propagation keeps one value per name for the whole model: where two
        # graphs define a name (the branches of optimum's merged decoders, an If's output
        # named as its branches'), one graph's values reached the other, and the else
        # branch's [batch, 4, seq, 16] cache came out [1, 4, 4, 16]. Such a model is
        # inferred without it.
        inferred = same[0] if same else onnx.shape_inference.infer_shapes(
            stub, strict_mode=False, data_prop=not _names_shared(stub.graph))
    except Exception:
        return {}
    out = ShapeInfos()
    scopes = []   # (the graph's own infos, its infos of outer names, its parent's index)
    _scopes(inferred.graph, -1, scopes)
    torn = set()  # names two bodies each define, differently
    for own, _, _ in scopes:
        for name, vi in own.items():
            have = out.setdefault(name, vi)
            if have is not vi and have.type != vi.type:
                torn.add(name)
    for _, outer, _ in scopes:
        # A body's value_info for an outer tensor (onnx writes one, often less static:
        # akiki-vad's [unk, 128, unk] for a [1, 128, 1]) never replaces the outer one.
        for name, vi in outer.items():
            out.setdefault(name, vi)
    for name in torn:
        del out[name]
    out.scopes = scopes
    out.lies = lies
    _distrust_wrong_stft(inferred.graph, out)
    return out


def lying_declarations(stub: onnx.ModelProto, same: list | None = None) -> dict[str, str]:
    """The names whose declarations (value_info, graph and body outputs) what the model
    computes contradicts, each such declaration deleted from ``stub`` (a weight-free copy,
    edited in place; a body's inputs and the graph's inputs are not declarations here but
    the interface and what the node feeds). onnxruntime runs a model whatever its
    value_info says (a [2, 3] declared [2, 3, 1]: "falling back to lenient merge"), and
    onnx's inference keeps a declaration it cannot merge: believed, Shape of it folded to
    a wrong constant and a no-op Reshape removed. A second inference without them (those
    of an op onnx has no schema for kept: they are all that types what follows) is the
    truth where it infers anything; a declaration contradicts it by its element type, its
    rank, a size, a size or another input's dim name where the truth is an input's dim
    name (a batch declared 1), or a dim name it shares with dims of two different sizes.
    What inference cannot reach (a contrib op's own output) is believed, right or not.
    A value_info naming a graph input or an initializer is dropped: those have their own.
    Returns {name: "declared <type>, computes <type>"}; where every declaration is what
    that inference gives (most exporters'), ``same`` gets the inferred model: inferring
    again with them would give it again."""
    drop_shadowing_value_info(stub)
    known = {}   # op -> has a schema: what onnx infers without a declaration
    opset = {o.domain or "": o.version for o in stub.opset_import}

    def inferable(n: onnx.NodeProto) -> bool:
        key = (n.domain or "", n.op_type)
        if key not in known:
            known[key] = onnx.defs.has(n.op_type, opset.get(key[0], 1), key[0]) \
                if key[0] in ("", "ai.onnx", "ai.onnx.ml") else False
        return known[key]

    bare = onnx.ModelProto()
    bare.CopyFrom(stub)
    mine, theirs = list(graph_protos(stub.graph)), list(graph_protos(bare.graph))
    ops = {n.op_type for gp in mine for n in gp.node}
    declared = 0
    for gp in theirs:
        opaque = {o for n in gp.node if not inferable(n) for o in n.output}
        keep = [vi for vi in gp.value_info if vi.name in opaque]
        declared += len(gp.value_info) - len(keep) + len(gp.output)
        del gp.value_info[:]
        gp.value_info.extend(keep)
        for vi in gp.output:
            if vi.name not in opaque and vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")
                vi.type.tensor_type.elem_type = 0
    if not declared:
        return {}
    try:
        shared = _names_shared(bare.graph)
        inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=False,
                                                     data_prop=not shared)
    except Exception:  # noqa: BLE001 - nothing to test the declarations against
        return {}
    params = {d.dim_param for vi in stub.graph.input
              for d in vi.type.tensor_type.shape.dim if d.dim_param}
    truth: list = []
    _scopes(inferred.graph, -1, truth)
    if len(truth) != len(mine):
        return {}
    lies: set[str] = set()
    pairs = {}   # name -> (its declared type, its real type)
    if "STFT" in ops:   # there a declaration is right where inference is not
        _distrust_wrong_stft(inferred.graph, _flat(truth))
    states = _loop_states_that_lie(theirs, truth, params) if "Loop" in ops else {}
    if states:   # each as its first value (written so: MIGraphX reads a state input with
        # no shape as a scalar), then of unknown shape where the step changes that
        for (k, i), said in states.items():
            pairs[said[0]] = said[1:3]
            lies.add(said[0])
            for graphs in (mine, theirs):
                _state_shape(graphs[k].input[i], said[3], params)
        for moving in (True, False):
            try:
                inferred = onnx.shape_inference.infer_shapes(bare, strict_mode=False,
                                                             data_prop=not shared)
            except Exception:  # noqa: BLE001
                return {}
            truth = []
            _scopes(inferred.graph, -1, truth)
            moved = [(k, i) for k, i in states if moving and _moves(theirs, truth, k, i, params)]
            for k, i in moved:
                for graphs in (mine, theirs):
                    _state_shape(graphs[k].input[i], None, params)
            if not moved:
                break
        if "STFT" in ops:
            _distrust_wrong_stft(inferred.graph, _flat(truth))
    named: dict[str, set] = {}   # a declared dim name -> what it stands for, where known
    where: dict[str, set] = {}   # a declared dim name -> the names declaring it
    all_same = True
    for gp, (true, _, _) in zip(mine, truth):
        for vi in (*gp.value_info, *gp.output):   # each entry: a name may be declared twice
            name = vi.name
            got = true.get(name)
            if got is not None and got.type == vi.type:
                continue   # the same (most are): one comparison in C
            all_same = False
            if got is None or not vi.type.HasField("tensor_type") or not got.type.HasField(
                    "tensor_type"):
                continue
            a, b = vi.type.tensor_type, got.type.tensor_type
            pairs[name] = (a, got.type)
            names: list = []
            if _contradicts(a, b, params, names):
                lies.add(name)
            for p, real in names:
                named.setdefault(p, set()).add(real)
                where.setdefault(p, set()).add(name)
    for p, real in named.items():
        if len(real) > 1:
            lies |= where[p]
    if all_same and not lies and same is not None:
        same.append(inferred)
    if lies:
        for gp in mine:
            keep = [vi for vi in gp.value_info if vi.name not in lies]
            del gp.value_info[:]
            gp.value_info.extend(keep)
            for vi in gp.output:   # what it computes (its type: onnx needs one there)
                if vi.name in lies:
                    vi.type.CopyFrom(pairs[vi.name][1])
    return {name: f"declared {type_text(pairs[name][0])}, computes "
                  f"{type_text(pairs[name][1].tensor_type)}" for name in sorted(lies)}


def _flat(scopes: list) -> ShapeInfos:
    """:func:`_scopes`' infos as one :class:`ShapeInfos` (a body's own names last)."""
    flat = ShapeInfos((k, v) for own, outer, _ in scopes for k, v in (*outer.items(),
                                                                     *own.items()))
    flat.scopes = scopes
    return flat


def _state_shape(vi: onnx.ValueInfoProto, first: onnx.ValueInfoProto | None,
                 params: set) -> None:
    """A Loop body's state input given the shape of its ``first`` value (its sizes and its
    graph inputs' dim names; None: its rank and no size), in place."""
    tt = vi.type.tensor_type
    rank = len(tt.shape.dim) if first is None and tt.HasField("shape") else None
    tt.ClearField("shape")
    if rank is not None:   # its rank, no size
        tt.shape.SetInParent()
        for _ in range(rank):
            tt.shape.dim.add()
    if first is None or not first.type.tensor_type.HasField("shape"):
        return
    tt.shape.SetInParent()
    for d in first.type.tensor_type.shape.dim:
        new = tt.shape.dim.add()
        if d.HasField("dim_value"):
            new.dim_value = d.dim_value
        elif d.dim_param in params:   # an inference's unk__N would meet another run's
            new.dim_param = d.dim_param


def _moves(graphs: list, truth: list, k: int, i: int, params: set) -> bool:
    """Does the body ``graphs[k]`` compute its state ``i``'s next value (in ``truth``) of
    another shape than the state input declares?"""
    body = graphs[k]
    nxt = truth[k][0].get(body.output[i - 1].name) if len(body.output) > i - 1 else None
    return nxt is not None and nxt.type.HasField("tensor_type") and _contradicts(
        body.input[i].type.tensor_type, nxt.type.tensor_type, params, [])


def _contradicts(a: onnx.TypeProto.Tensor, b: onnx.TypeProto.Tensor, params: set,
                 names: list) -> bool:
    """Does declared ``a`` contradict ``b``, what inference without declarations gives: an
    element type, a rank, a size, or a size or another input's dim name where ``b`` has
    an input's dim name (``params``)? ``names`` gets (a declared dim name that is no
    input's, the size or input dim name it stands for here)."""
    if a.elem_type and b.elem_type and a.elem_type != b.elem_type:
        return True
    if not a.HasField("shape") or not b.HasField("shape"):
        return False
    if len(a.shape.dim) != len(b.shape.dim):
        return True
    for d, t in zip(a.shape.dim, b.shape.dim):
        real = t.dim_value if t.HasField("dim_value") else (
            t.dim_param if t.dim_param in params else None)
        if real is None:
            continue
        if d.HasField("dim_value") and d.dim_value != real or (
                d.dim_param in params and d.dim_param != real):
            return True
        if d.dim_param and d.dim_param not in params:
            names.append((d.dim_param, real))
    return False


def _loop_states_that_lie(graphs: list, truth: list, params: set) -> dict:
    """A Loop body's state inputs whose declared shape the first step contradicts (the
    Loop's initial value) or the step does (the body's next state, inferred from that
    declaration): {(the body's index in graph_protos, the input's): (its name, declared,
    real type, the first value's ValueInfo or None)}. onnx does not infer a body input's shape
    from the Loop (a state may change shape from step to step) and onnxruntime runs a
    [2, 3] state declared [2, 3, 1]: Shape of it was folded to [2, 3, 1]."""
    index = {id(gp): k for k, gp in enumerate(graphs)}
    every = _flat(truth)
    out = {}
    for gp in graphs:
        for n in gp.node:
            if n.op_type != "Loop" or n.domain not in ("", "ai.onnx"):
                continue
            body = next((a.g for a in n.attribute if a.name == "body"), None)
            if body is None or id(body) not in index:
                continue
            inner = truth[index[id(body)]][0]
            for k, vi in enumerate(body.input[2:]):
                if not vi.type.HasField("tensor_type") or len(n.input) <= 2 + k or len(
                        body.output) <= 1 + k:
                    continue
                a = vi.type.tensor_type
                for real in (every.get(n.input[2 + k]), inner.get(body.output[1 + k].name)):
                    if real is not None and real.type.HasField("tensor_type") and \
                            _contradicts(a, real.type.tensor_type, params, []):
                        declared = onnx.TypeProto()
                        declared.CopyFrom(vi.type)
                        out[index[id(body)], 2 + k] = (vi.name, declared.tensor_type,
                                                       real.type, every.get(n.input[2 + k]))
                        break
    return out


def type_text(tt: onnx.TypeProto.Tensor) -> str:
    """``float[2, 3, 1]``, ``int64[N, ?]``, ``float`` (no shape): a tensor type as said."""
    kind = onnx.TensorProto.DataType.Name(tt.elem_type).lower() if tt.elem_type else "?"
    if not tt.HasField("shape"):
        return kind
    return kind + "[" + ", ".join(str(d.dim_value) if d.HasField("dim_value") else
                                  d.dim_param or "?" for d in tt.shape.dim) + "]"


def drop_shadowing_value_info(model: onnx.ModelProto) -> set[str]:
    """value_info entries naming a graph's own input or initializer deleted from ``model``
    (any graph, in place); returns their names. Those tensors carry their own type and
    dims: graphsurgeon's import gave a graph input the value_info's shape, and the output
    model an input onnxruntime then refused for the feeds the original took."""
    gone = set()
    for gp in graph_protos(model.graph):
        own = {vi.name for vi in gp.input} | {t.name for t in gp.initializer}
        keep = [vi for vi in gp.value_info if vi.name not in own]
        gone.update(vi.name for vi in gp.value_info if vi.name in own)
        del gp.value_info[:]
        gp.value_info.extend(keep)
    return gone


def _names_shared(g: onnx.GraphProto) -> bool:
    """Do two graphs of ``g`` (bodies included) each define a name (node outputs, a body's
    inputs)?"""
    seen: set = set()
    for h in graph_protos(g):
        own = {o for n in h.node for o in n.output if o}
        if h is not g:
            own.update(vi.name for vi in h.input)
        if not seen.isdisjoint(own):
            return True
        seen |= own
    return False


class ShapeInfos(dict):
    """:func:`shape_info`'s value infos by name, over the whole model. ONNX scopes names
    by graph: the two branches of optimum's merged decoders (an If on use_cache_branch)
    each define '/decoder/Add_output_0', one float, one int64. Such a name is left out
    here, and :func:`scoped_infos` gives each graph its own."""

    scopes: list = []
    lies: dict = {}


def _scopes(g: onnx.GraphProto, parent: int, acc: list) -> None:
    """``acc`` gets (``g``'s infos of its own names, of outer names, its parent's index),
    then its bodies', in :func:`graph_protos`' order (that of :func:`iter_graphs` over the
    imported graph)."""
    own, outer = {}, {}
    # a body's own names: what its nodes write and its inputs (an output may be outer)
    local = None if parent < 0 else {o for n in g.node for o in n.output} | {
        vi.name for vi in g.input}
    for vi in list(g.value_info) + list(g.output) + list(g.input):
        # inputs and outputs win over a stale value_info
        (own if local is None or vi.name in local else outer)[vi.name] = vi
    acc.append((own, outer, parent))
    me = len(acc) - 1
    for n in g.node:
        if n.op_type not in SUBGRAPH_OPS and n.domain in ("", "ai.onnx"):
            continue
        for a in n.attribute:
            for sg in ([a.g] if a.type == onnx.AttributeProto.GRAPH else
                       a.graphs if a.type == onnx.AttributeProto.GRAPHS else []):
                _scopes(sg, me, acc)


def scoped_infos(graph: gs.Graph, infos: dict):
    """(each graph of ``graph``, its tensors' value infos by name: its own, then its
    enclosing graphs', then the whole model's). The model :func:`shape_info` read must be
    ``graph`` exported: where the bodies do not line up, every graph gets the whole
    model's (which leaves out the names bodies define differently)."""
    from collections import ChainMap

    graphs = list(iter_graphs(graph))
    scopes = getattr(infos, "scopes", [])
    if len(scopes) != len(graphs):
        return [(g, infos) for g in graphs]
    out = []
    for own, _, parent in scopes:
        chain = [own]
        while parent >= 0:
            chain.append(scopes[parent][0])
            parent = scopes[parent][2]
        out.append(ChainMap(*chain, infos))
    return list(zip(graphs, out))


def unknown_negative_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """Declared dims below zero (graph inputs, outputs, value_info) made unknown, and the
    shapes of outputs and value_info declared with no dims (:func:`unknown_rank_zero`), in
    place; returns ``model``. A negative dim is no size: onnxruntime reads it as unknown, while
    onnx's inference fails the whole model on it where an initializer or a broadcast gives
    the real size (an IR-3 weight input declared [-7], an input [1,-7,4,4] read by a Mul
    per channel), and passes then saw no dtypes at all (fuzz round, 2026-12-07)."""
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.Clear()
    for gp in graph_protos(g):
        for vi in (*gp.output, *gp.value_info):
            tt = vi.type.tensor_type
            if tt.HasField("shape") and not tt.shape.dim:
                tt.ClearField("shape")   # see unknown_rank_zero
    return model


def unknown_rank_zero(graph: gs.Graph) -> None:
    """A computed tensor declared with no dims (``float y`` in ONNX's text syntax: a graph
    output or value_info, in any graph) made of unknown shape, in place. onnxruntime runs
    such a model whatever rank the tensor has ("falling back to lenient merge"), and onnx's
    inference keeps the declaration: read as rank 0, Shape of a [2, 3] folded to [] and a
    conv's output took a [1, C] bias correction. :func:`shape_info` leaves them out as
    well, so a true scalar is inferred [] again; graph inputs keep theirs (the feeds)."""
    for g in iter_graphs(graph):
        for n in g.nodes:
            for t in n.outputs:
                if isinstance(t, gs.Variable) and t.shape is not None and len(t.shape) == 0:
                    t.shape = None


def write_input_dims(model: onnx.ModelProto, fixed: dict[str, list[int]]) -> onnx.ModelProto:
    """Write the --fix-shapes dims into ``model``'s graph inputs, in place; returns it."""
    for vi in model.graph.input:
        if vi.name in fixed:
            for d, v in zip(vi.type.tensor_type.shape.dim, fixed[vi.name]):
                d.Clear()
                d.dim_value = int(v)
    return model


def _distrust_wrong_stft(graph: onnx.GraphProto, infos: dict[str, onnx.ValueInfoProto]) -> None:
    """Drop the shapes onnx inferred from a wrong STFT shape, and everything downstream.

    onnx 1.23 infers STFT's bins as the frame length even when ``onesided`` (the default)
    makes them frame_length // 2 + 1 (fixed upstream later): shapes folded or written from
    that would be wrong, and onnxruntime refuses a model carrying them. The bins are
    re-derived from the spec; where they disagree, the STFT's output and every tensor
    computed from it keep their types but lose their shapes."""
    tainted = wrong_stfts(graph, infos)
    if not tainted:
        return
    # A node with bodies uses what its bodies read from outside too.
    uses = [(n, set(n.input).union(*(m.input for b in node_bodies(n) for h in graph_protos(b)
                                     for m in h.node)))
            for g in graph_protos(graph) for n in g.node]
    grew = True
    while grew:
        grew = False
        for n, names in uses:
            if not tainted.isdisjoint(names) and not tainted.issuperset(n.output):
                tainted.update(o for o in n.output if o)
                grew = True
    for d in [infos] + [own for own, _, _ in getattr(infos, "scopes", [])]:
        for name in tainted & d.keys():
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(d[name])
            if vi.type.HasField("tensor_type"):
                vi.type.tensor_type.ClearField("shape")
            d[name] = vi


def wrong_stfts(graph: onnx.GraphProto, infos: dict[str, onnx.ValueInfoProto] | None = None
                ) -> set[str]:
    """Outputs of STFT nodes whose inferred bins (in ``infos``, by default the graph's own
    value_info and outputs) disagree with the spec (see :func:`_distrust_wrong_stft`)."""
    if infos is None:
        infos = {vi.name: vi for g in graph_protos(graph)
                 for vi in list(g.value_info) + list(g.output)}
    stfts = [n for g in graph_protos(graph) for n in g.node if n.op_type == "STFT"]
    if not stfts:
        return set()
    consts = constant_tensors(graph)
    tainted: set[str] = set()
    for n in stfts:
        if not n.output or n.output[0] not in infos:
            continue
        onesided = next((a.i for a in n.attribute if a.name == "onesided"), 1)
        length = None
        if len(n.input) > 3 and n.input[3] in consts:
            length = int(onnx.numpy_helper.to_array(consts[n.input[3]]).reshape(-1)[0])
        elif len(n.input) > 2 and n.input[2] in consts:   # the window's length
            length = int(consts[n.input[2]].dims[0]) if len(consts[n.input[2]].dims) == 1 \
                else None
        elif len(n.input) > 2 and n.input[2] in infos:
            dims = infos[n.input[2]].type.tensor_type.shape.dim
            length = dims[0].dim_value if len(dims) == 1 and dims[0].HasField("dim_value") \
                else None
        dims = infos[n.output[0]].type.tensor_type.shape.dim
        if len(dims) == 4 and dims[2].HasField("dim_value") and (
                length is None or dims[2].dim_value != (length // 2 + 1 if onesided else length)):
            tainted.add(n.output[0])
    return tainted


def to_graph(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None,
             infer: bool = True, fixed: dict[str, list[int]] | None = None,
             notes: list | None = None) -> gs.Graph:
    """Import into onnx-graphsurgeon; external weights become memory-mapped lazy values.

    ``fixed`` ({input: dims}, checked by :func:`check_fixed_shapes`) writes static dims
    into those graph inputs and re-derives every shape from them (--fix-shapes).
    Declarations the model's computation contradicts are not believed
    (:func:`lying_declarations`); ``notes`` gets one line naming them."""
    graph = import_model(model)
    unknown_rank_zero(graph)
    _own_input_declarations(graph, model)
    if fixed:
        infer = True
        for t in graph.inputs:
            if t.name in fixed:
                t.shape = [int(v) for v in fixed[t.name]]
    if base_dir is not None and any(t.data_location == onnx.TensorProto.EXTERNAL
                                    for t in iter_model_tensors(model.graph)):
        for k, g in enumerate(iter_graphs(graph)):
            for t in g.tensors().values():
                if (isinstance(t, gs.Constant) and isinstance(t._values, LazyValues)
                        and not isinstance(t._values, ExternalValues)
                        and getattr(t._values.tensor, "data_location", 0) == onnx.TensorProto.EXTERNAL):
                    path, off, length = resolve_external(t._values.tensor, Path(base_dir))
                    values = ExternalValues(t._values.tensor, path, off, length)
                    if k == 0:
                        t._values = values
                    else:
                        # Inside an If/Loop/Scan body: read it now. The writer streams only
                        # top-level weights; a body's tensor must travel inline.
                        t.values = np.array(values.load())
                        t.data_location = None
            for node in g.nodes:
                for v in node.attrs.values():
                    # A Constant node's tensor stored outside (save_model(convert_attribute=
                    # True)): read it now. Exported as it came, its location would be
                    # resolved against the *output* folder, and it could not be folded.
                    if (isinstance(v, gs.Constant) and isinstance(v._values, LazyValues)
                            and v._values.tensor.data_location == onnx.TensorProto.EXTERNAL):
                        path, off, length = resolve_external(v._values.tensor, Path(base_dir))
                        v.values = np.array(
                            ExternalValues(v._values.tensor, path, off, length).load())
                        v.data_location = None
    if infer:
        infos = shape_info(model, fixed, check=True)
        lies = getattr(infos, "lies", {})
        for g in iter_graphs(graph) if lies else ():
            for t in g.tensors().values():   # what inference gives, or nothing
                if isinstance(t, gs.Variable) and t.name in lies and t not in graph.inputs:
                    t.shape = t.dtype = None
        if lies and notes is not None:
            outs = {t.name for t in graph.outputs}
            said = [f"{'output ' if k in outs else ''}'{k}' {v}"
                    for k, v in list(lies.items())[:3]]
            more = f" and {len(lies) - 3} more" if len(lies) > 3 else ""
            notes.append("declarations the model contradicts, not believed (written as it "
                         f"computes): {'; '.join(said)}{more}")
        for g, look in scoped_infos(graph, infos):
            for name, t in g.tensors().items():
                vi = look.get(name)
                if isinstance(t, gs.Variable) and vi is not None and vi.type.HasField("tensor_type"):
                    tt = vi.type.tensor_type
                    if t.dtype is None and tt.elem_type:
                        t.dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
                    if not tt.HasField("shape"):
                        continue
                    new = [d.dim_value if d.HasField("dim_value") else
                           (d.dim_param or None) for d in tt.shape.dim]
                    # The model's own value_info can be staler than inference (an exporter's
                    # [unk__0, unk__1, unk__2] where data propagation knows [N, 0, 1]).
                    if t.shape is None or fixed or _more_static(new, t.shape):
                        t.shape = new
        _schema_dtypes(graph, model)
    return graph


def _own_input_declarations(graph: gs.Graph, model: onnx.ModelProto) -> None:
    """A graph input named by a value_info too takes its own declaration again, in place:
    graphsurgeon's import gave it the value_info's (a [2, 3] input declared [2, 3, 1] there
    was written so, and onnxruntime refused the feeds the original took)."""
    if not any(any(vi.name in own for vi in gp.value_info) for gp in graph_protos(model.graph)
               for own in [{i.name for i in gp.input}]):
        return
    from onnx_graphsurgeon.importers.onnx_importer import OnnxImporter

    for g, gp in zip(iter_graphs(graph), graph_protos(model.graph)):
        own = {vi.name: vi for vi in gp.input}
        for t in g.inputs:
            if t.name in own and isinstance(t, gs.Variable):
                d = OnnxImporter.import_tensor(own[t.name])
                t.shape, t.dtype = d.shape, d.dtype


def _schema_dtypes(graph: gs.Graph, model: onnx.ModelProto) -> None:
    """Output dtypes that the operator's schema fixes, where inference gave none.

    Many ai.onnx.ml operators (Scaler, Normalizer, LinearRegressor, TreeEnsembleRegressor...)
    have no inference function, but their schema says ``tensor(float)``: without it a
    Cast to float after them looks like a real conversion and is kept."""
    versions = {o.domain or "": o.version for o in model.opset_import}
    for g in iter_graphs(graph):
        for node in g.nodes:
            if all(t.dtype is not None for t in node.outputs):
                continue
            domain = node.domain or ""
            try:
                schema = onnx.defs.get_schema(node.op, versions.get(domain, 1), domain)
            except Exception:   # noqa: BLE001 - unknown to onnx (contrib, custom domains)
                continue
            for t, formal in zip(node.outputs, schema.outputs):
                if formal.option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
                    break
                kind = formal.type_str[7:-1].upper() if formal.type_str.startswith(
                    "tensor(") else ""
                if (isinstance(t, gs.Variable) and t.dtype is None and kind != "STRING"
                        and kind in onnx.TensorProto.DataType.keys()):
                    t.dtype = onnx.helper.tensor_dtype_to_np_dtype(
                        onnx.TensorProto.DataType.Value(kind))


KEPT = "kept~"   # refresh_shapes' mark of a declared dim name (onnx never writes a ~)


def _more_static(new: list, old: list) -> bool:
    """Same rank, and more dims known as sizes in ``new`` than in ``old``."""
    return len(new) == len(old) and sum(isinstance(d, int) for d in new) > sum(
        isinstance(d, (int, np.integer)) and d >= 0 for d in old)


def refresh_shapes(graph: gs.Graph, tag: str) -> int:
    """Infer the shapes of ``graph`` as it is now (after a pass made shapes static that the
    first inference saw as computed) and give each variable the new shape where it is more
    static than the one it has. Weights are not copied (:func:`export` stubs them). onnx
    names the dims it cannot resolve ``unk__N`` afresh in every run: those names are
    prefixed with ``tag`` so that no dim of this run shares a name (and so a value, for
    fold-shapes) with one of another run; a name the graph declares already keeps it. Returns
    how many tensors gained a static dim."""
    stand_in = onnx.ModelProto(ir_version=onnx.IR_VERSION)
    domains = graph.import_domains or [onnx.helper.make_opsetid("", graph.opset)]
    stand_in.opset_import.extend(domains)
    # Inference stops at an op it has no schema for (a kept contrib op: GroupQueryAttention)
    # and at a computed Reshape: the shapes known go with the stand-in, so that what follows
    # is inferred, as it is when the written output (which declares them) is read again.
    stand_in.graph.value_info.extend(
        onnx.ValueInfoProto(name=o.name) for g in iter_graphs(graph) for n in g.nodes
        for o in n.outputs if o.name and (o.shape is not None or o.dtype is not None))
    model = export(graph, stand_in).model
    own = {d for t in graph.inputs for d in (t.shape or []) if isinstance(d, str)}
    # A dim the graph declares already (an earlier run's unk__N) keeps its name wherever
    # onnx carries it to: marked here, so that only this run's fresh names get ``tag``. Else
    # a tensor that gained a static dim would take "tag + name" where the tensors that kept
    # their shapes say "name" (one value, two symbols: a Reshape's dims not seen as copies).
    for gp in graph_protos(model.graph):
        for vi in (*gp.input, *gp.output, *gp.value_info):
            for d in vi.type.tensor_type.shape.dim:
                if d.dim_param and d.dim_param not in own:
                    d.dim_param = KEPT + d.dim_param
    infos = shape_info(model)
    if not infos:
        return 0
    gained = 0
    for g, look in scoped_infos(graph, infos):
        for name, t in g.tensors().items():
            vi = look.get(name)
            if not isinstance(t, gs.Variable) or vi is None or not vi.type.HasField(
                    "tensor_type"):
                continue
            elem = vi.type.tensor_type.elem_type
            if t.dtype is None and elem:   # a type inference missed the first time (after
                t.dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)   # a contrib op)
            if not vi.type.tensor_type.HasField("shape"):
                continue   # typed only: what reads a kept contrib op's output
            new = [d.dim_value if d.HasField("dim_value") else
                   (d.dim_param if d.dim_param in own else
                    d.dim_param[len(KEPT):] if d.dim_param.startswith(KEPT) else
                    f"{tag}{d.dim_param}" if d.dim_param else None)
                   for d in vi.type.tensor_type.shape.dim]
            if t.shape is None or _more_static(new, t.shape):
                t.shape = new
                gained += 1
    return gained


def set_input_values(model: onnx.ModelProto, values: dict, shapes: dict | None = None
                     ) -> list[str]:
    """--set-input: each named graph input becomes an initializer holding its value (a
    number, a bool or an array, broadcast to the input's dims; symbolic dims from
    ``shapes``), and leaves the interface, so that folding can take the branch or the size it
    decides (optimum's merged decoders: ``use_cache_branch``). ``model`` is changed in place;
    returns what was set, said as "name = value"."""
    inits = {t.name: t for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    said = []
    for name, value in values.items():
        vi = inputs.get(name)
        if vi is None:
            raise InputError(f"--set-input names '{name}', which is not a graph input "
                             f"(inputs: {', '.join(inputs) or 'none'})")
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.elem_type or tt.elem_type == onnx.TensorProto.STRING:
            raise InputError(f"--set-input {name}: only numeric and bool tensor inputs")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        given = (shapes or {}).get(name)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim] \
            if tt.HasField("shape") else None
        if given is not None:
            dims = list(given)
        arr = _input_value(name, value, dtype)
        if dims is None or None in dims:
            if dims is not None and arr.ndim == len(dims):
                dims = list(arr.shape)   # an array of the input's rank sizes it
            else:
                raise InputError(f"--set-input {name}: its dims are not all fixed "
                                 f"({_dims_text(tt)}): add --input-shape {name}:DIMS")
        try:
            arr = np.array(np.broadcast_to(arr, dims), dtype=dtype)
        except ValueError:
            raise InputError(f"--set-input {name}: a value of shape {list(arr.shape)} does "
                             f"not fit its dims {dims}") from None
        model.graph.input.remove(vi)
        model.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
        shown = arr.ravel()[0] if arr.size and (arr == arr.ravel()[0]).all() else "the array"
        said.append(f"{name} = {shown}")
    return said


def _input_value(name: str, value, dtype) -> np.ndarray:
    """The value --set-input gives, as an array of the input's type: a string from the CLI
    ("1", "0.5", "true"), or a number, a bool or an array from the API; refused where the
    type would change it (2.5 for an integer input, 300 for uint8)."""
    if isinstance(value, str):
        low = value.strip().lower()
        if low in ("true", "false"):
            value = low == "true"
        else:
            try:
                value = float(low) if any(c in low for c in ".en") else int(low)
            except ValueError:
                raise InputError(f"--set-input {name}={value}: a number, true or false"
                                 ) from None
    try:
        arr = np.asarray(value)
        if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or
                                       arr.dtype == np.bool_):
            raise TypeError
        with np.errstate(all="ignore"):
            cast = arr.astype(dtype)
    except (TypeError, ValueError):
        raise InputError(f"--set-input {name}: a number, a bool or an array of them, got "
                         f"{type(value).__name__}") from None
    if arr.size and not np.array_equal(cast.astype(arr.dtype), arr, equal_nan=True):
        raise InputError(f"--set-input {name}={value}: not a {np.dtype(dtype).name} value")
    return cast


def _dims_text(tt) -> str:
    return "x".join(d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
                    for d in tt.shape.dim) if tt.HasField("shape") else "no shape"


def check_fixed_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]] | None,
                       share: bool = True, lenient: bool = False) -> dict[str, list[int]]:
    """--fix-shapes: every named input exists, has that rank, and its static dims agree;
    with ``share``, a dim name gets one size, and the inputs that share it are fixed too.
    ``lenient`` (sizes for random inputs, nothing fixed): a name given two sizes is not an
    error, it only sizes no other input."""
    from rewriter.core.errors import InputError

    if not shapes:
        raise InputError("--fix-shapes needs --input-shape NAME:DIMS for the inputs to fix")
    inits = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    for name, dims in shapes.items():
        if name not in inputs:
            raise InputError(f"--input-shape names '{name}', which is not a graph input "
                             f"(inputs: {', '.join(inputs) or 'none'})")
        have = inputs[name].type.tensor_type.shape.dim
        if len(have) != len(dims):
            raise InputError(f"input '{name}' has rank {len(have)}, --input-shape gives "
                             f"{len(dims)} dims")
        for i, (d, v) in enumerate(zip(have, dims)):
            if int(v) < 0:
                raise InputError(f"input '{name}': dim {i} is {v}; dims must be >= 0")
            if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != int(v):
                # (-1 or 0 written for a dynamic dim, as some exporters do: free)
                raise InputError(f"input '{name}': dim {i} is {d.dim_value} in the model, "
                                 f"--input-shape gives {v}")
    fixed = {k: [int(v) for v in dims] for k, dims in shapes.items()}
    if not share:
        return fixed
    # A dim name is one size throughout: the inputs that share it take it too (PaiNN's
    # num_atoms in 19 inputs stayed symbolic in all but the one given, ninth round).
    sizes: dict[str, tuple[int, str]] = {}
    torn = set()
    for name, dims in fixed.items():
        for d, v in zip(inputs[name].type.tensor_type.shape.dim, dims):
            if d.dim_param:
                seen = sizes.setdefault(d.dim_param, (v, name))
                if seen[0] != v and lenient:
                    torn.add(d.dim_param)
                elif seen[0] != v:
                    raise InputError(f"--input-shape gives dim '{d.dim_param}' {seen[0]} in "
                                     f"'{seen[1]}' and {v} in '{name}'")
    for n in torn:
        del sizes[n]
    for name, vi in inputs.items():
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if name in fixed or not dims or not any(d.dim_param for d in dims):
            continue
        values = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0
                  else sizes.get(d.dim_param, (None,))[0] for d in dims]
        if all(v is not None for v in values):
            fixed[name] = [int(v) for v in values]
    return fixed


MEMORY = "__rewrite_memory__"  # location of a weight stub whose bytes live in Exported.weights


class Exported:
    """A model whose big weights are stubs, plus where each stub's bytes are.

    ``model`` is small (no big weights inside), so checking, verifying and saving it never
    copy the weights through protobuf; a stub is a TensorProto with external data at
    location ``MEMORY``; ``weights[name]`` is a numpy array or lazy values to stream.
    """

    def __init__(self, model: onnx.ModelProto, weights: dict, source_dir):
        self.model, self.weights, self.source_dir = model, weights, source_dir
        self.weight_bytes: int | None = None   # total, once someone computed it

    def array(self, name: str) -> np.ndarray:
        w = self.weights[name]
        return w if isinstance(w, np.ndarray) else w.load()

    def ort_initializers(self) -> tuple[list[str], list[np.ndarray]]:
        """The stubs' values, by name, for onnxruntime (those the model still holds)."""
        held = {t.name for t in self.model.graph.initializer}
        names = sorted(n for n in self.weights if n in held)
        return names, [np.ascontiguousarray(self.array(n)) for n in names]

    def checkable(self) -> onnx.ModelProto:
        """A copy onnx.checker accepts: stubs become empty tensors (structure only)."""
        return weight_free_copy(self.model, keep_dims=False)

    def materialize(self) -> onnx.ModelProto:
        """The full ModelProto with every weight inline (for the Python API): the stubs'
        bytes, and the tensors still in the input's external files (untouched weights
        kept their references, relative to the input's folder: the returned model did
        not load elsewhere, the API review found)."""
        def fill(t):
            t.raw_data = raw_bytes(self.weights[t.name])
        m = self._copy_replacing_stubs(fill)
        for t in iter_model_tensors(m.graph):
            if t.data_location == onnx.TensorProto.EXTERNAL and not is_stub(t):
                values = ExternalValues(t, *resolve_external(t, Path(self.source_dir)))
                t.raw_data = raw_bytes(values)
                del t.external_data[:]
                t.data_location = onnx.TensorProto.DEFAULT
        return m

    def _copy_replacing_stubs(self, fix) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        for t in m.graph.initializer:
            if is_stub(t):
                del t.external_data[:]
                t.data_location = onnx.TensorProto.DEFAULT
                fix(t)
        return m


def is_stub(t: onnx.TensorProto) -> bool:
    return (t.data_location == onnx.TensorProto.EXTERNAL and len(t.external_data) == 1
            and t.external_data[0].value == MEMORY)


def raw_bytes(w) -> bytes:
    if isinstance(w, np.ndarray):
        return onnx_bytes(w)
    if isinstance(w, ExternalValues):
        return b"".join(w.raw_chunks())
    t = w.tensor
    return t.raw_data if t.HasField("raw_data") else onnx_bytes(onnx.numpy_helper.to_array(t))


def _stub(name: str, dtype: int, dims) -> onnx.TensorProto:
    t = onnx.TensorProto(name=name, data_type=dtype, data_location=onnx.TensorProto.EXTERNAL)
    t.dims.extend(int(d) for d in dims)
    t.external_data.add(key="location", value=MEMORY)
    return t


def export(graph: gs.Graph, original: onnx.ModelProto, source_dir=None) -> Exported:
    """Export with big top-level weights as stubs (see :class:`Exported`).

    Untouched weights are never copied: their original proto or memory map is what gets
    streamed at save time. Weights in original external files stay references to them.
    """
    weights: dict = {}
    swapped = []
    top: list = []
    for g in iter_graphs(graph):
        tensors = list(g.tensors().values())
        if g is graph:
            top = tensors
        for t in tensors:
            if isinstance(t, gs.Constant) and not isinstance(t._values, LazyValues):
                # gs keeps the imported data_location and writes it on export: a weight that
                # was external and got new values would be "external" with inline bytes.
                t.data_location = None
    for t in top:
        if not isinstance(t, gs.Constant) or t.name in weights:
            continue
        v = t._values
        if isinstance(v, ExternalValues):
            if not v.inline:
                continue  # keeps its reference to the source file
            # an inline weight left in the input file: a stub whatever its size, so that
            # it is written back inline and the output never points into the input
            src, dtype, dims = v, v.tensor.data_type, v.shape
        elif isinstance(v, LazyValues):
            # onnxruntime takes no packed (int4 ...) OrtValue from Python: those stay inline
            if (v.tensor.data_type in (onnx.TensorProto.STRING, *PACKED)
                    or v.nbytes <= EXTERNAL_THRESHOLD):
                continue
            src, dtype, dims = v, v.tensor.data_type, v.shape
        else:
            arr = t.values
            if arr.dtype.kind in "OSU" or packed(arr.dtype) or arr.nbytes <= EXTERNAL_THRESHOLD:
                continue
            src, dtype, dims = arr, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape
        weights[t.name] = src
        swapped.append((t, v))
        t._values = LazyValues(_stub(t.name, dtype, dims))
    try:
        model = to_model(graph, original)
    finally:
        for t, v in swapped:  # the graph stays as it was
            t._values = v
    return Exported(model, weights, source_dir)


def to_model(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    """Export, keeping the original's model-level fields and only its value_info names."""
    keep_vi = {vi.name for vi in original.graph.value_info}
    model = export_model(graph, value_info=keep_vi.__contains__)
    model.ir_version = original.ir_version
    graph_inputs = {i.name for i in model.graph.input}
    if original.ir_version < 4 and any(t.name not in graph_inputs for t in model.graph.initializer):
        # IR 3 requires every initializer to be a graph input; we treat weights as constants
        # (dropping IR-3 weight inputs, adding folded initializers), which IR 4 allows.
        model.ir_version = 4
    # gs only knows the default domain's version: the original's opset list is the truth,
    # plus any domain a pass introduced, and a default-domain bump a pass made.
    added = [op for op in model.opset_import
             if op.domain not in {o.domain for o in original.opset_import}]
    opsets = [onnx.helper.make_opsetid(o.domain, max(o.version, graph.opset)
                                       if o.domain in ("", "ai.onnx") else o.version)
              for o in original.opset_import]
    del model.opset_import[:]
    model.opset_import.extend(opsets + added)
    model.producer_name, model.producer_version = "rewrite", _version()
    model.doc_string = original.doc_string
    model.domain, model.model_version = original.domain, original.model_version
    del model.metadata_props[:]
    model.metadata_props.extend(original.metadata_props)
    if not model.functions and original.functions:
        model.functions.extend(original.functions)
    model.graph.name = original.graph.name
    vis = [vi for vi in model.graph.value_info if vi.name in keep_vi]
    del model.graph.value_info[:]
    model.graph.value_info.extend(vis)
    # Bodies alike, and each describes only what it computes: a body's copy of an outer
    # tensor's shape kept dims onnx names afresh in every run (unk__4, then unk__9), and an
    # outer constant that the export moves into the body lets the next run infer shapes
    # this one could not: an output rewritten again differed (chars2vec, 27th round).
    keep_vi = {vi.name for g in graph_protos(original.graph) for vi in g.value_info}
    for body in list(graph_protos(model.graph))[1:]:
        made = {o for n in body.node for o in n.output}
        vis = [vi for vi in body.value_info if vi.name in made and vi.name in keep_vi]
        del body.value_info[:]
        body.value_info.extend(vis)
    # gs types every value as a tensor: a sequence, map or optional (scikit-learn's ZipMap
    # output, seq(map(int64, float))) keeps the original's type.
    typed = {vi.name: vi.type for g in (original.graph,)
             for vi in list(g.input) + list(g.output) + list(g.value_info)
             if vi.type.WhichOneof("value") not in (None, "tensor_type")}
    for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        if vi.name in typed:
            vi.type.CopyFrom(typed[vi.name])
    # An output declared with no dims that nothing inferred stays so declared (its graph
    # reads it as unknown, unknown_rank_zero): without a shape, onnx.checker refuses it.
    empty = {vi.name for g in graph_protos(original.graph) for vi in g.output
             if vi.type.tensor_type.HasField("shape") and not vi.type.tensor_type.shape.dim}
    for g in graph_protos(model.graph):
        for vi in g.output:
            tt = vi.type.tensor_type
            if vi.name in empty and vi.type.HasField("tensor_type") and not tt.HasField("shape"):
                tt.shape.SetInParent()
    unique_node_names(model)
    return model


def upgrade_opset(graph: gs.Graph, original: onnx.ModelProto, base_dir, target: int
                  ) -> tuple[gs.Graph, onnx.ModelProto]:
    """The graph converted to default-domain opset ``target`` with onnx's version converter
    (per-axis QuantizeLinear/DequantizeLinear need opset 13); (graph, new original)."""
    model = export(graph, original, base_dir).materialize()
    try:
        converted = onnx.version_converter.convert_version(model, target)
    except Exception as e:
        raise InputError(f"cannot convert the model to opset {target}: {first_line(e)}") from None
    new_original = onnx.ModelProto()
    new_original.CopyFrom(original)
    del new_original.opset_import[:]
    new_original.opset_import.extend(converted.opset_import)
    return to_graph(converted, base_dir), new_original


def _version() -> str:
    from .. import __version__
    return __version__
