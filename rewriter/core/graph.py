"""Graph utilities the passes and the rest share: one of each.

Protobuf level: :func:`graph_protos` (a graph and every If/Loop/Scan body),
:func:`iter_model_tensors`, :func:`node_id` (the one node label), :func:`weight_free_copy`
(the one copy without weight bytes), node-name dedupe, :func:`copy_fields`. onnx-graphsurgeon
level: :func:`iter_graphs`, :func:`unique_names` (across bodies), :func:`toposort`,
:func:`dead_code`, :func:`bypass` (drop a no-op node), :func:`static_shape`,
:func:`peek_values` (read a constant without making it resident), :class:`Namer` (fresh
names), :func:`set_values` and :func:`own_constant` (copy a shared constant before editing
it), :func:`stored_int8_weight` (a layer weight the model stores as int8 and dequantises:
the plan, the planner and insert-qdq read it alike; :func:`cast_chain`, the
``Cast(q) -> Mul(c)`` form of one, fuse-conv-bn's too).
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs

# onnx-graphsurgeon prints its warnings on *stdout* (e.g. a multi-line dump of every pair of
# nodes sharing a name): that breaks `-q` and one-line errors. Its errors still raise.
gs.logger.G_LOGGER.severity = max(gs.logger.G_LOGGER.severity, gs.logger.G_LOGGER.ERROR)


def node_id(node) -> str:
    """The one node label: its name, else its first output's name (ONNX node names may be
    empty), else ``<OpType>``. Works on onnx-graphsurgeon and protobuf nodes alike; plans,
    reports and the MIGraphX check all name nodes by it."""
    name = getattr(node, "name", "") or ""
    if name:
        return name
    outs = node.outputs if hasattr(node, "outputs") else node.output
    for o in outs:
        o = getattr(o, "name", o)
        if o:
            return o
    return f"<{getattr(node, 'op', None) or node.op_type}>"


def iter_model_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers and Constant-node tensors of a graph and all its subgraphs. Attributes
    of default-domain ops that cannot hold a tensor or a body are not scanned (onnx.checker
    refuses attributes an op does not define)."""
    yield from graph.initializer
    for sp in graph.sparse_initializer:
        yield sp.values
    for node in graph.node:
        if node.op_type not in TENSOR_ATTR_OPS and node.domain in ("", "ai.onnx"):
            continue
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from iter_model_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from iter_model_tensors(sg)


# The standard ops with graph attributes; any op outside the default domain may have some
# too (com.microsoft's BeamSearch, a custom op). Other nodes' attributes are not scanned:
# every pass walks the graphs, and scanning 10^4 attribute dicts each time added up.
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
# The default-domain ops with a tensor or graph attribute in any opset (onnx.defs).
TENSOR_ATTR_OPS = SUBGRAPH_OPS | {"Constant", "ConstantOfShape"}

# Elementwise ops: each output element from the same element of the inputs, so they run the
# same on a transposed or reshaped input (sink-transposes moves Transposes past them,
# collapse-chains lets them read the input of a Reshape round trip). Unary ones, and those
# that broadcast their other inputs (Clip's min/max are scalars: it broadcasts too).
SAME_SHAPE_OPS = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
    "Softplus", "Softsign", "Mish", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Erf",
    "Floor", "Ceil", "Round", "Sign", "Not", "Cast", "Identity", "Clip", "Sin", "Cos", "IsNaN",
    "Gelu"})
# Reductions with keepdims (and, from opset 13 or 18 on, axes as an input)
REDUCE_OPS = frozenset({
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"})
BROADCAST_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Clip", "Where",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "BitShift",
    "Mod"})


def iter_graphs(graph: gs.Graph) -> Iterator[gs.Graph]:
    """The graph and every subgraph (If/Loop/Scan bodies), outermost first."""
    yield graph
    for node in graph.nodes:
        if node.op not in SUBGRAPH_OPS and node.domain in (None, "", "ai.onnx"):
            continue
        for v in node.attrs.values():
            if isinstance(v, gs.Graph):
                yield from iter_graphs(v)
            elif isinstance(v, list) and v and isinstance(v[0], gs.Graph):
                for sg in v:
                    yield from iter_graphs(sg)


def standard_view_tensors(graph: gs.Graph) -> set[int]:
    """ids of the tensors MIGraphX must read in standard strides, in ``graph`` and its
    subgraphs: every Scan's initial states and its body's state outputs (opset 9+: the
    states come first among the inputs and the outputs; scan-states) and every Resize's
    data input, and what Casts before it read (resize-inputs). The Reshapes those passes put
    there stay (collapse-chains)."""
    ids = set()
    for g in iter_graphs(graph):
        for node in g.nodes:
            if node.domain not in (None, "", "ai.onnx"):
                continue
            t = node.inputs[0] if node.op == "Resize" and node.inputs else None
            while t is not None:        # and through convert-fp16's Casts to the Reshape
                ids.add(id(t))
                p = t.inputs[0] if len(t.inputs) == 1 else None
                t = p.inputs[0] if p is not None and p.op == "Cast" and p.inputs else None
            states = carried_states(node)
            if states is not None:
                ids.update(id(t) for t in states[0] + states[1])
    return ids


def carried_states(node: gs.Node) -> tuple[list[gs.Tensor], list[gs.Tensor]] | None:
    """A Scan's or Loop's loop-carried states: (the node's initial-state inputs, its body's
    next-state outputs), in the same order; None for other nodes or a malformed body. A
    Scan's states come first among its inputs and outputs (opset 9+); a Loop's follow the
    trip count and condition, and the body's condition output."""
    body = node.attrs.get("body") if node.op in ("Scan", "Loop") else None
    if not isinstance(body, gs.Graph):
        return None
    if node.op == "Scan":
        n, first_in, first_out = len(node.inputs) - int(node.attrs.get("num_scan_inputs", 0)), 0, 0
    else:
        n, first_in, first_out = len(node.inputs) - 2, 2, 1
    if n < 0 or len(body.outputs) < first_out + n:
        return None
    return node.inputs[first_in:first_in + n], body.outputs[first_out:first_out + n]


def cut_model(model: onnx.ModelProto, outputs: list[str], reads: dict) -> onnx.ModelProto:
    """The part of ``model`` that computes ``outputs`` from ``reads`` ({name: the type that
    will be fed, or an array: a constant then}), its constants and the graph inputs it
    reads directly, as a model whose inputs are those tensors: the replay of a selection's
    post-processing (verifier, migraphx.target) and each step of bias correction's
    measuring (quant.bias). What a node's bodies read from outside counts as its inputs."""
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    inits = {t.name: t for t in g.initializer}
    graph_inputs = {i.name: i for i in g.input}
    types = {v.name: v for v in g.output}
    keep, inputs, seen, stack = set(), [], set(), list(outputs)
    while stack:
        t = stack.pop()
        if t in seen or not t:
            continue
        seen.add(t)
        if t in reads or (t in graph_inputs and t not in inits):
            inputs.append(t)
        elif t in producer:
            keep.add(id(producer[t]))
            stack.extend(node_reads(producer[t]))
    m = onnx.ModelProto()
    m.ir_version = model.ir_version
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    sub = m.graph
    sub.name = g.name
    fed = set(inputs)
    for n in g.node:
        if id(n) in keep:
            c = sub.node.add()
            c.CopyFrom(n)
            # A node kept for one output whose other output is fed (a TopK's values read
            # beside its indices): that one is the original's value, not defined twice.
            for j, o in enumerate(c.output):
                if o in fed:
                    c.output[j] = f"{o}__replayed_unused"
    used = {t for n in sub.node for t in node_reads(n)}
    sub.initializer.extend(inits[t] for t in sorted(used & set(inits)))
    for t in sorted(set(inputs), key=(list(reads) + list(graph_inputs)).index):
        if t not in reads:
            sub.input.append(graph_inputs[t])
        elif isinstance(reads[t], np.ndarray):   # a shape MIGraphX must know at compile
            sub.initializer.append(onnx.numpy_helper.from_array(reads[t], t))
        else:
            sub.input.append(onnx.helper.make_tensor_value_info(
                t, onnx.helper.np_dtype_to_tensor_dtype(reads[t]), None))
    if model.ir_version < 4:   # there, every initializer is a graph input too
        sub.input.extend(graph_inputs[t.name] for t in sub.initializer
                         if t.name in graph_inputs and t.name not in fed)
    sub.sparse_initializer.extend(t for t in g.sparse_initializer if t.values.name in used)
    sub.output.extend(types[o] if o in types else onnx.ValueInfoProto(name=o) for o in outputs)
    return m


def keep_only_upstream(model: onnx.ModelProto, names: list[str]) -> bool:
    """Cut ``model`` (in place) down to what computes ``names``: they become its outputs and
    the nodes they do not depend on go (onnxruntime runs every node, whatever is fetched),
    and so do the initializers no kept node reads. Not done, and False, when a node has a
    body (it may read names from outside it) or a name is not produced in the graph."""
    g = model.graph
    producer = {}
    for i, n in enumerate(g.node):
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in n.attribute):
            return False
        for o in n.output:
            producer[o] = i
    sources = {i.name for i in g.input} | {t.name for t in g.initializer}
    if any(n not in producer and n not in sources for n in names):
        return False
    keep, todo = set(), [producer[n] for n in names if n in producer]
    while todo:
        i = todo.pop()
        if i in keep:
            continue
        keep.add(i)
        todo.extend(producer[x] for x in g.node[i].input if x in producer)
    _replace(g.output, [onnx.ValueInfoProto(name=n) for n in names])
    if len(keep) < len(g.node):
        _replace(g.node, [g.node[i] for i in sorted(keep)])
        read = {x for n in g.node for x in n.input} | set(names)
        _replace(g.initializer, [t for t in g.initializer if t.name in read])
    return True


def _replace(field, items) -> None:
    """A repeated proto field set to ``items`` (some of them its own elements): copied out
    first, since clearing the field would leave references to its elements dangling."""
    copies = [type(x)() for x in items]
    for dst, src in zip(copies, items):
        dst.CopyFrom(src)
    del field[:]
    field.extend(copies)


def tensor_nbytes(t: onnx.TensorProto) -> int:
    """Data size from dims and dtype: no copy (reading raw_data would copy the bytes)."""
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    item = _ITEMSIZE.get(t.data_type)
    if item is None:
        try:
            item = _ITEMSIZE[t.data_type] = onnx.helper.tensor_dtype_to_np_dtype(
                t.data_type).itemsize
        except Exception:
            return 0
    return math.prod(t.dims) * item


_ITEMSIZE: dict[int, int] = {}

# Packed types: several elements to a byte in ONNX raw data, one to a byte in numpy (ml_dtypes).
SUB_BYTE = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}
PACKED = {getattr(onnx.TensorProto, k) for k in SUB_BYTE if hasattr(onnx.TensorProto, k)}


def np_dtype(dtype) -> np.dtype:
    """A graphsurgeon dtype as a numpy one: graphsurgeon keeps the ONNX type number where
    numpy has no type (a bfloat16 or float8 constant's dtype is 16 or 17); onnx maps those
    to ml_dtypes' types, as it does for the int4 ones."""
    if isinstance(dtype, (int, np.integer)):
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(dtype)))
    return np.dtype(dtype)


def packed(dtype: np.dtype) -> bool:
    """int4, uint4, float4e2m1, int2, uint2: stored packed in ONNX raw data."""
    return dtype.kind == "V" and onnx.helper.np_dtype_to_tensor_dtype(dtype) in PACKED


def onnx_bytes(a: np.ndarray) -> bytes:
    """``a`` as ONNX raw data holds it: a packed type two or four elements to a byte
    (``tobytes`` gives one a byte, a tensor twice its declared size)."""
    if packed(a.dtype):
        return onnx.numpy_helper.from_array(np.asarray(a)).raw_data
    return np.ascontiguousarray(a).tobytes()


def constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The graph's constants by name: its initializers and its Constant nodes' ``value``
    tensors (not its bodies')."""
    out = {t.name: t for t in graph.initializer}
    out.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant"
                for a in n.attribute if a.name == "value"})
    return out


def const_ints(node: gs.Node, index: int, attr: str) -> list[int] | None:
    """An int list a node takes as the attribute ``attr`` (older opsets: Squeeze's axes
    before 13, Pad's pads before 11) or as the constant input ``index`` (later ones);
    None when it takes neither, or the input is computed."""
    if attr in node.attrs:
        return [int(a) for a in node.attrs[attr]]
    if len(node.inputs) > index and node.inputs[index].name:
        c = node.inputs[index]
        if not isinstance(c, gs.Constant):
            return None
        try:
            return [int(v) for v in np.asarray(c.values).ravel()]
        except Exception:  # noqa: BLE001 - unreadable external data
            return None
    return None


# Tensors up to this size are copied as they are (scales, zero points, shapes): readers such
# as the MIGraphX check need their values; above it only dims survive.
SMALL_TENSOR = 64 << 10


# ai.onnx.ml's tree ensembles hold their trees in attribute lists (a 194 MB LightGBM
# classifier: 4.8 million entries in each nodes_* list) that neither shape inference nor the
# checker needs: their outputs' types and shapes come from classlabels_* and n_targets, and
# the lists are optional. The weight-free copy leaves them out (2.7 s of inference and a
# copy of the 194 MB per call, on that model, to nothing).
_TREE_OPS = ("TreeEnsembleClassifier", "TreeEnsembleRegressor")
_TREE_LISTS = ("nodes_", "class_", "target_")


def weight_free_copy(model: onnx.ModelProto, keep_dims: bool = True) -> onnx.ModelProto:
    """The one copy of ``model`` without weight bytes: for shape inference, the checker and
    the static MIGraphX check, on models of any size (a 2.5 GB model's copy is kilobytes).

    Big or external tensors, top-level initializers and those inside If/Loop/Scan bodies
    alike, become stubs with no data: ``keep_dims`` keeps their dims (shape inference reads
    dims only; reading their values fails), otherwise they become empty (dims [0]), which
    onnx.checker accepts without looking for an external file. Small inline tensors are
    copied whole, and so are tensors in typed fields (float_data ...) when dims are dropped,
    since the checker validates those counts. Top-level weights are never copied.
    """
    def stubbed(t: onnx.TensorProto) -> bool:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            return True
        return tensor_nbytes(t) > SMALL_TENSOR and (keep_dims or t.HasField("raw_data"))

    def stub(t: onnx.TensorProto, into: onnx.TensorProto) -> None:
        name, dtype, dims = t.name, t.data_type, list(t.dims) if keep_dims else [0]
        into.Clear()   # ``into`` may be ``t`` itself
        into.name, into.data_type = name, dtype
        into.dims.extend(dims)

    out = onnx.ModelProto()
    copy_fields(model, out, "graph")
    copy_fields(model.graph, out.graph, ("initializer", "node"))
    for n in model.graph.node:
        if n.op_type in _TREE_OPS and n.domain == "ai.onnx.ml":
            c = out.graph.node.add()
            copy_fields(n, c, "attribute")
            c.attribute.extend(a for a in n.attribute if not a.name.startswith(_TREE_LISTS))
        else:
            out.graph.node.add().CopyFrom(n)
    for t in model.graph.initializer:
        if stubbed(t):
            stub(t, out.graph.initializer.add())
        else:
            out.graph.initializer.add().CopyFrom(t)
    for g in graph_protos(out.graph):   # nodes (and bodies) were copied as they are
        inits = list(g.initializer) if g is not out.graph else []
        for t in inits + [a.t for n in g.node for a in n.attribute
                          if a.type == onnx.AttributeProto.TENSOR]:
            if stubbed(t):
                stub(t, t)
    return out


def node_bodies(n: onnx.NodeProto) -> list[onnx.GraphProto]:
    """A node's graph attributes (If's branches, a Loop's or Scan's body)."""
    return [a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH] + [
        g for a in n.attribute if a.type == onnx.AttributeProto.GRAPHS for g in a.graphs]


def node_reads(n: onnx.NodeProto) -> list[str]:
    """The names a node reads: its inputs, then the outer names its bodies read (an If's
    branch may read any tensor of the graph around it, not only its condition)."""
    bodies = node_bodies(n)
    if not bodies:
        return list(n.input)
    reads = dict.fromkeys(n.input)
    for b in bodies:
        own = {i.name for i in b.input} | {t.name for t in b.initializer} | {
            t.values.name for t in b.sparse_initializer}
        for m in b.node:
            reads.update(dict.fromkeys(x for x in node_reads(m) if x not in own))
            own.update(m.output)
    return list(reads)


AUTO_PADS = ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER")   # what ONNX knows


def auto_pad(node) -> str:
    """A gs Conv's ``auto_pad`` as text (graphsurgeon may give bytes)."""
    auto = node.attrs.get("auto_pad", "NOTSET")
    return auto.decode() if isinstance(auto, bytes) else auto


def conv_pads(node, kernel) -> list[int] | None:
    """A gs Conv's pads in ONNX order (every begin, then every end) as its ``auto_pad``
    sets them: NOTSET its ``pads`` (0 by default), VALID none, SAME_* the ONNX rule, out =
    ceil(in / stride), the odd one after (UPPER) or before (LOWER); None where SAME_* pads
    an input whose spatial sizes are not known (GPTQ's statistics then take them from each
    batch: quant.hessian.ConvSpec.pads_at), or ``auto_pad`` is no value ONNX knows."""
    auto = auto_pad(node)
    k = len(kernel)
    if auto in ("NOTSET", ""):
        return [int(v) for v in node.attrs.get("pads", [0] * (2 * k))]
    if auto == "VALID":
        return [0] * (2 * k)
    shape = node.inputs[0].shape
    sizes = list(shape[2:]) if shape is not None and len(shape) == k + 2 else []
    if auto not in ("SAME_UPPER", "SAME_LOWER") or len(sizes) != k or not all(
            isinstance(n, (int, np.integer)) and n > 0 for n in sizes):
        return None
    return same_pads(sizes, kernel, node.attrs.get("strides", [1] * k),
                     node.attrs.get("dilations", [1] * k), auto == "SAME_LOWER")


def same_pads(sizes, kernel, strides, dilations, lower: bool) -> list[int]:
    """The pads (every begin, then every end) of ``auto_pad`` SAME_UPPER (``lower``:
    SAME_LOWER) over spatial ``sizes``: out = ceil(in / stride), the odd one after (UPPER)
    or before (LOWER), none where the kernel spans less than a stride (onnx's reference;
    onnxruntime shifts such a SAME_UPPER conv by one, measured)."""
    begin, end = [], []
    for n, kk, st, dl in zip(sizes, kernel, strides, dilations):
        total = max(0, (-(-int(n) // int(st)) - 1) * int(st) + (int(kk) - 1) * int(dl) + 1
                    - int(n))
        small = total // 2
        begin.append(total - small if lower else small)
        end.append(total - begin[-1])
    return begin + end


# Ops whose outputs select or order elements by value: what follows them changes wholesale
# when near-equal values swap (TopK's order, which boxes NMS keeps, where NonZero is true).
SELECTION_OPS = ("TopK", "NonMaxSuppression", "NonZero")


def selection_dependent(g: onnx.GraphProto, ops=SELECTION_OPS,
                        flow: bool = False) -> tuple[list, dict, set]:
    """(the first nodes of ``ops`` on each path, {tensor computed from what they select (a
    TopK: its indices): that first node}, the frontier: tensors the dependent part reads
    from the rest, weights and graph inputs aside). A TopK counts only with a constant k.
    None as the first item when control flow reads a dependent tensor. The nodes are in
    topological order. ``flow``: a TopK with a computed k counts too, and a node with
    bodies that reads a dependent tensor (torchvision's detectors: an If around their NMS
    after a TopK per level whose k is min(anchors, 1000)) is dependent, what its bodies
    read from outside counting as its inputs."""
    consts = constant_tensors(g)
    inputs = {i.name for i in g.input}
    roots, dependent, frontier = [], {}, set()
    for n in g.node:
        reads = node_reads(n) if flow else n.input
        root = next((dependent[t] for t in reads if t in dependent), None)
        if root is not None:
            if node_bodies(n) and not flow:
                return None, {}, set()
        elif n.op_type in ops and n.domain in ("", "ai.onnx") and (
                n.op_type != "TopK" or flow or (len(n.input) > 1 and n.input[1] in consts)):
            roots.append(n)
            root = n
        else:
            continue
        # A TopK's values are the top values whatever the order of ties: its indices select.
        outs = n.output[1:2] if n is root and n.op_type == "TopK" else n.output
        dependent.update(dict.fromkeys(outs, root))
        frontier.update(t for t in reads if t and t not in dependent and t not in consts
                        and t not in inputs)
    return roots, dependent, frontier


# Ops a quantization plan changes the numbers of. Where one computes from a selection (a
# mask head on the boxes NMS keeps), what the selection reads no longer decides the output.
_PLAN_CHANGED = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "QuantizeLinear",
                           "DequantizeLinear", "DynamicQuantizeLinear"})
# Decisions by value inside post-processing: they flip on near-equal values, as a selection.
_DECISIONS = frozenset({"Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Equal",
                        "ArgMax", "ArgMin", "And", "Or", "Xor", "Not"})


def _plain(n: onnx.NodeProto) -> bool:
    """Not a layer, a Q/DQ or a Cast to a 16-bit float: computes alike on equal inputs."""
    half = n.op_type == "Cast" and any(
        a.name == "to" and a.i in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
        for a in n.attribute)
    return n.op_type not in _PLAN_CHANGED and not half


def selection_reads(g: onnx.GraphProto) -> dict[str, tuple[onnx.NodeProto, list[str]]]:
    """{graph output computed from a selection (:func:`selection_dependent`): (the first
    selecting node on its path, the tensors its part of the graph reads from the rest, in
    graph order)}: an end-to-end detector's kept boxes -> (its NMS, [boxes, scores]). A
    decision read there (a score threshold's Greater, an ArgMax) flips on near-equal values
    as the selection does: what it decides from is read instead. Only outputs whose part is
    plain post-processing: no layer, no Q/DQ, no Cast to a 16-bit float, so that, the inputs
    being equal, it computes the same on both sides; and only where it reads something."""
    roots, dependent, _ = selection_dependent(g, flow=True)
    if not roots:
        return {}
    fixed = set(constant_tensors(g)) | {i.name for i in g.input} | {""}
    producer = {o: n for n in g.node for o in n.output if o}
    order: dict[str, tuple] = {}   # where each is first read
    for k, n in enumerate(g.node):
        for j, t in enumerate(n.input):
            order.setdefault(t, (k, j))
    out = {}
    for o in g.output:
        if o.name not in dependent:
            continue
        reads, seen, stack, plain = set(), set(), [o.name], True
        while stack and plain:
            n = producer[stack.pop()]
            if id(n) in seen:
                continue
            seen.add(id(n))
            plain = _plain(n) and all(_plain(m) for b in node_bodies(n)
                                      for sg in graph_protos(b) for m in sg.node)
            for t in node_reads(n):
                if t in dependent or (t not in fixed and producer[t].op_type in _DECISIONS):
                    stack.append(t)
                elif t not in fixed:
                    reads.add(t)
        if plain and reads:
            out[o.name] = (dependent[o.name], sorted(reads, key=order.__getitem__))
    return out


def op_schema(op: str, opset: int):
    """The standard op's onnx.defs schema at ``opset``, or None where there is none."""
    try:
        return onnx.defs.get_schema(op, opset, "")
    except onnx.defs.SchemaError:
        return None


def has_function_body(op: str, opset: int) -> bool:
    """Whether the standard op ``op`` is defined at ``opset`` by an ONNX function body
    (plain, or built for the node's attributes and types): passes/expand_functions."""
    schema = op_schema(op, opset)
    return schema is not None and any(v <= opset for v in list(schema.function_opset_versions)
               + list(schema.context_dependent_function_opset_versions))


# Default-domain ops onnxruntime registers schemas for itself where ONNX has none: op -> the
# first opset at which ONNX defines it (LayerNormalization from 17; SimplifiedLayerNormalization,
# the RMSNorm onnxruntime-genai's model builder writes in every model, never).
ORT_DEFAULT_DOMAIN = {"LayerNormalization": 17, "SimplifiedLayerNormalization": 1 << 30}


def ort_default_domain(op: str, domain: str, opset: int) -> bool:
    """Whether ``op`` in ``domain`` is onnxruntime's own schema at the model's ``opset``."""
    return (domain or "") in ("", "ai.onnx") and opset < ORT_DEFAULT_DOMAIN.get(op, 0)


def ort_schema_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes (bodies included) of onnxruntime's default-domain schemas, ORT_DEFAULT_DOMAIN
    at the model's opset: onnxruntime runs them, onnx.checker knows no such op in its domain
    ("No Op registered for SimplifiedLayerNormalization")."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    return [n for g in graph_protos(model.graph) for n in g.node
            if ort_default_domain(n.op_type, n.domain, opset)]


def ort_schemas_as_contrib(model: onnx.ModelProto) -> None:
    """Move those nodes into com.microsoft in ``model``, a copy for onnx.checker, which checks
    no custom domain's ops."""
    nodes = ort_schema_nodes(model)
    for n in nodes:
        n.domain = "com.microsoft"
    if nodes and not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.add(domain="com.microsoft", version=1)


def graph_protos(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every body (If/Loop/Scan/SequenceMap, and custom ops' graph
    attributes), outermost first; like :func:`iter_graphs`, default-domain ops that cannot
    hold a body are not scanned (their attributes cost 30 ms per 10^4 nodes)."""
    yield g
    for n in g.node:
        if n.op_type not in SUBGRAPH_OPS and n.domain in ("", "ai.onnx"):
            continue
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from graph_protos(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from graph_protos(sg)


def duplicate_node_names(model: onnx.ModelProto) -> bool:
    """Does any graph have two nodes with one (non-empty) name? onnxruntime refuses those."""
    for g in graph_protos(model.graph):
        names = [n.name for n in g.node if n.name]
        if len(names) != len(set(names)):
            return True
    return False


FP16_MAX = float(np.finfo(np.float16).max)
# An FP16 layer whose input or output reached more than this on the calibration data
# stays float32 (convert-fp16): a quarter of float16's range, for the samples not seen and
# for the followers (a residual Add doubles). equalize-channels keeps its folds within it.
FP16_SAFE = FP16_MAX / 4


def near_overflow(values: np.ndarray, dtype) -> bool:
    """Values not finite, or beyond the square root of the type's range (1.8e19 for float32):
    as weights, near the top of the range a layer's sums overflow, and rescaling them would
    move which ones do (fuse-conv-bn, equalize-channels)."""
    limit = float(np.finfo(dtype).max) ** 0.5
    return not np.isfinite(values).all() or float(np.abs(values).max(initial=0)) > limit


def unique_names(graph: gs.Graph) -> None:
    """Nodes sharing a name across the graph and its bodies get the names the export gives
    them (``name_1`` ...), the main graph's first: plans name nodes (node_id) and reach
    the layers inside If/Loop/Scan bodies, where two branches exported from one module
    share their node names. The rewrite and the planner both name nodes so."""
    nodes = [n for g in iter_graphs(graph) for n in g.nodes]
    names = [n.name for n in nodes if n.name]
    if len(names) == len(set(names)):
        return
    used, seen = set(names), set()
    for n in nodes:
        if n.name and n.name in seen:
            i = 1
            while f"{n.name}_{i}" in used:
                i += 1
            n.name = f"{n.name}_{i}"
            used.add(n.name)
        seen.add(n.name)


def runnable_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself, or a copy with :func:`unique_node_names` where nodes share a name:
    onnxruntime refuses those, and the rewrite renames them (so its output loads), so the
    original runs as that copy (the verifier's reference, calibration's check)."""
    if not duplicate_node_names(model):
        return model
    renamed = onnx.ModelProto()
    renamed.CopyFrom(model)
    unique_node_names(renamed)
    return renamed


def unique_node_names(model: onnx.ModelProto) -> int:
    """Rename the second and later nodes sharing a name within a graph (``name_1`` ...).

    ONNX only says node names are for diagnostics, but onnxruntime refuses a graph with two
    nodes of one name. The first keeps its name (plans name nodes). Returns how many changed.
    """
    changed = 0
    for g in graph_protos(model.graph):
        names = [n.name for n in g.node if n.name]
        if len(names) == len(set(names)):
            continue
        used, seen = set(names), set()
        for n in g.node:
            if not n.name:
                continue
            if n.name in seen:
                i = 1
                while f"{n.name}_{i}" in used:
                    i += 1
                n.name = f"{n.name}_{i}"
                used.add(n.name)
                changed += 1
            seen.add(n.name)
    return changed


def stable_order(deps: list[set[int]]) -> list[int] | None:
    """A topological order of items 0..n-1 (``deps[i]``: the items i waits for), keeping
    the given order wherever the dependencies allow it (Kahn's algorithm with the index as
    priority); None on a cycle."""
    import heapq

    users: dict[int, list[int]] = {}
    for i, ds in enumerate(deps):
        for d in ds:
            users.setdefault(d, []).append(i)
    left = [len(ds) for ds in deps]
    ready = [i for i, k in enumerate(left) if k == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users.get(i, ()):
            left[u] -= 1
            if left[u] == 0:
                heapq.heappush(ready, u)
    return order if len(order) == len(deps) else None


def toposort(graph: gs.Graph) -> None:
    """Stable topological sort of a graph and its subgraphs.

    Nodes keep their original order wherever the data flow allows it (:func:`stable_order`):
    outputs stay readable, diffs small and deterministic. A subgraph's outer-scope reads
    count as inputs of the node that owns it.
    """
    for g in iter_graphs(graph):
        nodes = g.nodes
        index = {id(n): i for i, n in enumerate(nodes)}
        producer = {}
        for n in nodes:
            for t in n.outputs:
                producer[id(t)] = n
        deps = []
        for n in nodes:
            ds = set()
            for t in list(n.inputs) + _subgraph_inputs(n):
                p = producer.get(id(t))
                if p is not None and p is not n:
                    ds.add(index[id(p)])
            deps.append(ds)
        order = stable_order(deps)
        if order is None:
            from .errors import InputError
            raise InputError(f"graph '{g.name}' has a cycle")
        g.nodes = [nodes[i] for i in order]


def dead_code(graph: gs.Graph) -> None:
    """Remove the nodes no graph output depends on, bodies first (as onnx-graphsurgeon's
    cleanup, which cost ~0.1 s per 4,000 nodes more): a body's reads of outer tensors
    keep their producers; removed nodes are disconnected, so no tensor counts them as a
    reader; graph inputs have no producer."""
    for g in reversed(list(iter_graphs(graph))):
        for t in g.inputs:
            if t.inputs:
                t.inputs.clear()
        producer = {}
        for n in g.nodes:
            for t in n.outputs:
                producer[id(t)] = n
        needed: set[int] = set()
        stack = [producer.get(id(t)) for t in g.outputs]
        while stack:
            n = stack.pop()
            if n is None or id(n) in needed:
                continue
            needed.add(id(n))
            for t in n.inputs:
                p = producer.get(id(t))
                if p is not None and id(p) not in needed:
                    stack.append(p)
            for t in _subgraph_inputs(n):
                p = producer.get(id(t))
                if p is not None and id(p) not in needed:
                    stack.append(p)
        if len(needed) == len(g.nodes):
            continue
        keep = []
        for n in g.nodes:
            if id(n) in needed:
                keep.append(n)
            else:
                n.inputs.clear()
                n.outputs.clear()
        g.nodes = keep


def static_shape(t: gs.Tensor) -> bool:
    """Every dim of ``t`` known and non-negative."""
    return t.shape is not None and all(isinstance(d, (int, np.integer)) and d >= 0
                                       for d in t.shape)


def shape_of(x: gs.Tensor, g: gs.Graph, namer) -> gs.Tensor:
    """x's shape: a constant where it is static, else Shape(x) added to ``g`` (what a
    Reshape of x to its own shape reads: scan-states, resize-inputs)."""
    if static_shape(x):
        return gs.Constant(namer(f"{x.name}_shape"), np.array(x.shape, np.int64))
    shape = gs.Variable(namer(f"{x.name}_shape"), dtype=np.int64, shape=[len(x.shape)])
    g.nodes.append(gs.Node("Shape", namer(f"{x.name}_Shape"), inputs=[x], outputs=[shape]))
    return shape


def bypass(node: gs.Node, g: gs.Graph, graph_outputs: set[int]) -> str | None:
    """Remove a node whose first output equals its first input (Identity, a no-op Cast or
    Reshape): its readers read the input. When the output is a graph output its name must
    survive, so the input's producer writes it instead. None if done, else a skip reason."""
    x, y = node.inputs[0], node.outputs[0]
    if id(y) in graph_outputs:
        # The graph output's name must survive: make x's producer write y instead.
        producer = x.inputs[0] if x.inputs else None
        if (producer is None or id(x) in graph_outputs or any(x is t for t in g.inputs)
                or not any(n is producer for n in g.nodes) or len(x.outputs) > 1):
            return "identity-between-graph-io"
        idx = producer.outputs.index(x)
        node.outputs.clear()
        node.inputs.clear()
        producer.outputs[idx] = y
        return None
    for consumer in list(y.outputs):
        for i, t in enumerate(consumer.inputs):
            if t is y:
                consumer.inputs[i] = x
    node.outputs.clear()
    node.inputs.clear()
    return None


class Namer:
    """Fresh, unique tensor/node names for one graph and its subgraphs.

    Two new tensors with one name would export as one and give silently wrong numbers, so
    every name a pass invents comes from here.
    """

    def __init__(self, graph: gs.Graph):
        self.used: set[str] = set()
        for g in iter_graphs(graph):
            self.used.update(g.tensors().keys())
            self.used.update(n.name for n in g.nodes if n.name)

    def __call__(self, base: str) -> str:
        base = base or "t"
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name


def peek_values(t: gs.Constant) -> np.ndarray:
    """A constant's values without making them resident: ``t.values`` replaces lazy
    (memory-mapped external) values with the loaded array for good, and the writer then
    inlines a weight it would have streamed."""
    from onnx_graphsurgeon.ir.tensor import LazyValues

    v = t._values
    return v.load() if isinstance(v, LazyValues) else v


def set_values(t: gs.Constant, values: np.ndarray) -> None:
    """Replace a constant's values (and dtype). Graph.copy() pins export_dtype to the old
    dtype, which would make the exporter refuse a new one."""
    t.values = values
    t._export_dtype = None


def own_constant(node: gs.Node, i: int, values: np.ndarray, namer: "Namer", tag: str) -> None:
    """Give ``node``'s input ``i`` (a constant) new values without touching anyone else's:
    in place when this node is its only reader and reads it once, else on a copy named
    ``<name>_<tag>`` (a weight shared by two convs must not be edited for one of them).
    Values equal to the ones it has leave it as it is: a copy would be a duplicate that a
    second rewrite merges (a zero bias shared by many convs, equalized)."""
    t = node.inputs[i]
    if isinstance(t, gs.Constant) and t.values.dtype == values.dtype \
            and t.values.shape == values.shape and np.array_equal(t.values, values):
        return
    sole = (isinstance(t, gs.Constant) and not t.inputs and len(t.outputs) == 1
            and sum(x is t for x in node.inputs) == 1)
    if sole:
        set_values(t, values)
    else:
        node.inputs[i] = gs.Constant(namer(f"{t.name}_{tag}"), values)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def copy_fields(src, dst, skip: str | tuple[str, ...]) -> None:
    skip = (skip,) if isinstance(skip, str) else skip
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        repeated = getattr(fd, "is_repeated", None)  # protobuf >= 6 dropped .label
        if repeated is None:
            repeated = fd.label == fd.LABEL_REPEATED
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _subgraph_inputs(node: gs.Node) -> list[gs.Tensor]:
    """Tensors a node's subgraphs read (outer-scope references included)."""
    found: list[gs.Tensor] = []
    if node.op not in SUBGRAPH_OPS and node.domain in (None, "", "ai.onnx"):
        return found
    for v in node.attrs.values():
        graphs = [v] if isinstance(v, gs.Graph) else (
            v if isinstance(v, list) and v and isinstance(v[0], gs.Graph) else [])
        for sg in graphs:
            for n in sg.nodes:
                found.extend(n.inputs)
                found.extend(_subgraph_inputs(n))
    return found


# A layer's weight that the model stores as int8 and dequantises in the graph (weight-only
# quantized: PP-OCRv6's tiny recogniser, twenty-second round). insert-qdq keeps the int8
# values as they are and calibrates only the activation; the planner counts the layer as
# an INT8 candidate like one with a float weight.
class StoredInt8:
    """``q`` (an int8 constant, kept bit for bit) times ``scale`` (float32, 0-d per tensor
    or [K] along ``axis``, the weight's output axis) is the layer's weight."""

    def __init__(self, q: gs.Constant, scale: np.ndarray, axis: int):
        self.q, self.scale, self.axis = q, scale, axis


def weight_out_axis(node: gs.Node, rank: int) -> int | None:
    """The axis of a Conv/MatMul/Gemm weight (of ``rank``) along its output channels."""
    if node.op == "Conv":
        return 0
    if node.op == "Gemm":
        return 0 if int(node.attrs.get("transB", 0)) else 1
    return rank - 1 if node.op == "MatMul" and rank == 2 else None


def stored_int8_weight(node) -> StoredInt8 | str | None:
    """A Conv/MatMul/Gemm weight written ``Cast(q) [-> Mul(c)]`` or ``DequantizeLinear(q, s
    [, 0])`` with q an integer constant and the layer's input not from a DequantizeLinear
    (that layer is quantized already): a :class:`StoredInt8` when q is int8, the zero point
    zero, the scale a non-zero finite float32 constant per tensor or per output channel,
    and only layers read the weight; else the reason it is not one (kebab-case). None
    when the weight is not dequantised from a stored integer at all (a constant, a
    computed tensor). Works on onnx-graphsurgeon nodes; a NodeProto is None."""
    inputs = getattr(node, "inputs", None)
    if inputs is None or node.op not in ("Conv", "MatMul", "Gemm") or len(inputs) < 2:
        return None
    w = inputs[1]
    if isinstance(w, gs.Constant) or len(w.inputs) != 1:
        return None
    p = w.inputs[0]
    if p.op == "DequantizeLinear" and p.domain in (None, "", "ai.onnx"):
        x = inputs[0]
        if len(x.inputs) == 1 and x.inputs[0].op == "DequantizeLinear":
            return None
        q, s = p.inputs[0], p.inputs[1]
        zp = p.inputs[2] if len(p.inputs) > 2 and p.inputs[2].name else None
        if not isinstance(q, gs.Constant):
            return None
        dq_axis = int(p.attrs.get("axis", 1))
        if int(p.attrs.get("block_size", 0)):
            dq_axis = None
    elif p.op in ("Mul", "Cast"):
        q, s, zp = cast_chain(p)
        if q is None:
            return None
        dq_axis = "broadcast"
        if peek_values(q).dtype.kind not in "iu" and not packed(peek_values(q).dtype):
            return None     # a float16 weight cast to float32: not an integer one
    else:
        return None
    qv = peek_values(q)
    if qv.dtype != np.int8:
        return "stored-weight-not-int8"
    if zp is not None and (not isinstance(zp, gs.Constant) or np.any(peek_values(zp))):
        return "stored-weight-zero-point"
    if s is not None and not isinstance(s, gs.Constant):
        return "stored-scale-not-constant"
    sv = np.ones((), np.float32) if s is None else peek_values(s)
    if sv.dtype != np.float32 or (w.dtype is not None and np.dtype(w.dtype) != np.float32):
        return "stored-weight-not-fp32"
    axis = weight_out_axis(node, qv.ndim)
    if axis is None or (dq_axis == "broadcast" and np.ndim(sv) > qv.ndim):
        # A scale of more axes than q broadcasts the weight to them (a [1, 1, 1] c makes
        # a [K, N] MatMul weight [1, K, N], its output 3-D): q alone would drop the axis.
        return "stored-weight-rank"
    scale = _channel_scale(sv, qv.shape, axis, dq_axis)
    if scale is None:
        return "stored-scale-not-per-channel"
    if not np.all(np.isfinite(scale)) or np.any(scale == 0):
        return "stored-scale-zero-or-not-finite"
    if any(n.op not in ("Conv", "MatMul", "Gemm") or n.inputs.index(w) != 1
           or sum(t is w for t in n.inputs) != 1 for n in w.outputs):
        return "stored-weight-read-elsewhere"
    return StoredInt8(q, scale, axis)


def float32_layer(node: gs.Node) -> bool:
    """Whether a Conv/MatMul/Gemm computes in float32: its activation float32 (or of unknown
    type) and its weight a float32 constant, a computed tensor, or stored as int8. INT8 is
    for these only: insert-qdq leaves any other (a float16 layer between Casts, ISNet's)
    as it is (not-fp32), so calibrating its tensors would be wasted (twenty-seventh round)."""
    x = node.inputs[0]
    if x.dtype is not None and np.dtype(x.dtype) != np.float32:
        return False
    w = node.inputs[1] if len(node.inputs) > 1 else None
    return not isinstance(w, gs.Constant) or np.dtype(w.dtype) == np.float32


def dequantize_stored(nodes: list, namer: "Namer") -> int:
    """Each layer of ``nodes`` whose weight is stored as int8 (:func:`stored_int8_weight`)
    reads that weight as a float32 constant instead (q times its scale, the values the
    graph computed): INT8 then quantises it again as any float weight, with equalization
    and GPTQ rounding, which a weight kept on its stored grid cannot take (PP-OCRv6's tiny
    recogniser: 92 of 100 fresh lines decode the same, 66 with its 27 stored weights
    kept). Layers sharing one weight share the constant. Returns how many layers."""
    made: dict[int, gs.Constant] = {}
    count = 0
    for node in nodes:
        st = stored_int8_weight(node)
        if not isinstance(st, StoredInt8):
            continue
        w = node.inputs[1]
        if id(w) not in made:
            q = np.asarray(peek_values(st.q), np.float32)
            shape = [1] * q.ndim
            if st.scale.ndim:
                shape[st.axis] = -1
            made[id(w)] = gs.Constant(namer(f"{w.name}_float"),
                                      (q * st.scale.reshape(shape)).astype(np.float32))
        node.inputs[1] = made[id(w)]
        count += 1
    return count


def cast_chain(p: gs.Node):
    """(q, c, zero point) of ``Cast(q) [-> Sub(z)] [-> Mul(c)]`` to float32 ending at ``p``;
    (None, None, None) when it is not one."""
    s = None
    if p.op == "Mul":
        cast = [t for t in p.inputs if len(t.inputs) == 1 and t.inputs[0].op in ("Cast", "Sub")]
        if len(cast) != 1 or len(p.inputs) != 2:
            return None, None, None
        s = p.inputs[1] if p.inputs[0] is cast[0] else p.inputs[0]
        p = cast[0].inputs[0]
    zp = None
    if p.op == "Sub" and len(p.inputs[0].inputs) == 1:
        zp, p = p.inputs[1], p.inputs[0].inputs[0]
    if p.op != "Cast" or not isinstance(p.inputs[0], gs.Constant):
        return None, None, None
    if int(p.attrs.get("to", 0)) != onnx.TensorProto.FLOAT:
        return None, None, None
    return p.inputs[0], s, zp


def _channel_scale(sv: np.ndarray, shape: tuple, axis: int, dq_axis) -> np.ndarray | None:
    """The scale as 0-d (one value) or [K] along the weight's output ``axis``; None when it
    varies along any other axis or has another size. ``dq_axis``: a DequantizeLinear's
    axis attribute (None: blockwise), or "broadcast" for a Mul's numpy broadcasting."""
    if sv.size == 1:
        return sv.reshape(()).astype(np.float32)
    if dq_axis == "broadcast":
        if sv.ndim > len(shape):
            return None
        full = (1,) * (len(shape) - sv.ndim) + tuple(sv.shape)
        if any(d != 1 for i, d in enumerate(full) if i != axis) or full[axis] != shape[axis]:
            return None
        return sv.reshape(-1).astype(np.float32)
    if dq_axis is None or sv.ndim != 1:
        return None
    dq_axis = dq_axis + len(shape) if dq_axis < 0 else dq_axis
    return sv.astype(np.float32) if dq_axis == axis and sv.size == shape[axis] else None


def pre_activation(x: gs.Variable) -> gs.Variable | None:
    """The tensor before the Relu that produces ``x``, when only that Relu reads it and a
    node produces it (equalize-channels scales that node through the Relu)."""
    node = x.inputs[0] if x.inputs else None
    if node is not None and node.op == "Relu" and len(node.inputs[0].outputs) == 1 \
            and node.inputs[0].inputs:
        return node.inputs[0]
    return None
