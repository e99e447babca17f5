"""fold-constants: evaluate constant subgraphs into initializers; remove dead code.

Before -> after::

    ConstantOfShape(shape=[64,3,7,7]) -> W -> Conv     =>   W (initializer) -> Conv
    x -> Shape -> Gather(0) -> Unsqueeze -> Concat     =>   [1, -1] (initializer) (static dims)
    x -> Identity -> y / x -> Dropout (inference) -> y  =>   x -> consumers of y

What is folded: a node of the default ONNX domain whose inputs are all constant, and
Shape/Size of a tensor whose shape is fully static. Values come from ONNX's reference
evaluator (onnx.reference), never from hand-written kernels, and keep the dtype the graph
declares.

What is never folded, and why:

* QuantizeLinear / DequantizeLinear (and DynamicQuantizeLinear): MIGraphX turns a conv into
  an int8 kernel only when its weight is ``int8 initializer -> DequantizeLinear``; a folded
  DQ silently leaves the conv in float (shared/migraphx/PROFILE.md, rule 4).
* a weight dequantised by hand: ``Cast`` of an 8- or 16-bit integer weight, or an int4,
  uint4, float4 or float8 one (1024 elements or more) to a float type, as weight-only int8
  exports write ``Cast -> Mul(scale)`` (skip:weight-dequantization). Folded, the weight is
  stored 2-8 times larger and the model file grows (an int8 MiniLM: 22.9 MB -> 34.1 MB);
  a backend dequantises it on load.
* random ops (each run must draw anew), control flow (If/Loop/Scan: their bodies are folded
  in place instead), sequence/optional ops, custom domains (we cannot run them).
* outputs that are graph outputs (an initializer as a graph output is not portable), and
  results that grow: a result over ``fold_size_limit`` bytes (default 1 MiB) and more than
  ``fold_growth`` (default 2) times its inputs stays a node (skip:size-guard), unless every
  consumer uses it as a weight (Conv/Gemm/MatMul/BN parameters), which a backend has to
  materialise anyway. Sizes are estimated *before* evaluating (from the constant inputs of
  ConstantOfShape/Expand/Tile/Range, else the inferred output shapes), and nothing over
  ``fold_max_bytes`` (default 1 GiB) is ever evaluated, weight or not (skip:too-large): a
  hostile ConstantOfShape would otherwise exhaust memory before any guard saw its result.

Dead code: Identity and inference Dropout are bypassed (kept when both sides are graph
inputs/outputs); unused nodes and initializers go in the manager's cleanup. Graph inputs
are never removed: the interface stays. If/Loop/Scan bodies are processed too; outer-scope
names are shared tensor objects, so references stay intact.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from rewriter.core.graph import (SUBGRAPH_OPS, bypass, iter_graphs, np_dtype, static_shape,
                                 toposort)
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

NEVER = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
    "Bernoulli", "If", "Loop", "Scan",
    "SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert",
    "SequenceLength", "SequenceMap", "SplitToSequence", "ConcatFromSequence",
    "Optional", "OptionalGetElement", "OptionalHasElement",
}
# No folded result may exceed this, weight or not: a 1 GB constant made from a 12-byte
# ConstantOfShape is a hostile or broken model, and evaluating it would exhaust memory.
MAX_BYTES = 1 << 30
# Input slots that hold parameters a backend must have as constants anyway.
WEIGHT_SLOTS = {
    "Conv": {1, 2}, "ConvTranspose": {1, 2}, "Gemm": {1, 2}, "MatMul": {1},
    "BatchNormalization": {1, 2, 3, 4}, "InstanceNormalization": {1, 2},
    "LayerNormalization": {1, 2}, "PRelu": {1},
}


class FoldConstants(Pass):
    name = "fold-constants"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = "evaluate constant subgraphs (never Q/DQ), drop Identity/Dropout and dead nodes"

    shape_ops = ("Shape", "Size")   # only Shape/Size folding reads inferred shapes

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        o = ctx.options
        limit, growth = int(o.fold_size_limit), float(o.fold_growth)
        max_bytes, strict = int(o.fold_max_bytes), bool(o.strict)
        toposort(graph)  # one forward sweep then folds whole constant chains
        for g in iter_graphs(graph):
            outputs = {id(t) for t in g.outputs}
            for node in list(g.nodes):
                if not node.outputs:
                    continue
                if node.op in ("Identity", "Dropout") and node.domain in (None, "", "ai.onnx"):
                    reason = _bypass(node, g, outputs)   # a plugin's 'Identity' is its own
                    res.outcome(reason, f"removed-{node.op.lower()}")
                    continue
                reason = _check(node, outputs)
                if reason is not None:
                    if reason:
                        res.skip(reason)
                    continue
                in_bytes = sum(t.values.nbytes for t in node.inputs
                               if isinstance(t, gs.Constant))
                est = _estimate_bytes(node)
                if est is not None and est > max_bytes:
                    res.skip("too-large")
                    continue
                if est is not None and est > limit and est > growth * in_bytes and not all(
                        _only_weight_use(t) for t in node.outputs):
                    res.skip("size-guard")
                    continue
                try:
                    values = _evaluate(node, g.opset)
                except Exception as e:
                    if strict:
                        raise
                    res.skip("eval-failed")
                    res.notes.append(f"{node.op} '{node.name}': {type(e).__name__}: {e}"[:200])
                    continue
                out_bytes = sum(v.nbytes for v in values)
                if out_bytes > limit and out_bytes > growth * in_bytes and not all(
                        _only_weight_use(t) for t in node.outputs):
                    res.skip("size-guard")
                    continue
                for t, v in zip(node.outputs, values):
                    if t.dtype is not None and np_dtype(t.dtype) != v.dtype:
                        v = v.astype(np_dtype(t.dtype))
                    t.to_constant(np.array(v, order="C", copy=None))  # ascontiguousarray makes 0-d 1-d
                node.outputs.clear()
                node.inputs.clear()
                res.count("folded")
                res.changed = True
        return res


def _check(node: gs.Node, graph_outputs: set[int]) -> str | None:
    """None if foldable, '' if simply not constant, else a skip reason."""
    if node.domain not in (None, "", "ai.onnx") or node.op in NEVER:
        return ""
    if node.op in SUBGRAPH_OPS:   # If/Loop/Scan: their bodies are folded, not the node
        return ""
    if node.op in ("Shape", "Size"):
        x = node.inputs[0]
        if isinstance(x, gs.Constant) or static_shape(x):
            return "graph-output" if any(id(t) in graph_outputs for t in node.outputs) else None
        return ""
    if not all(isinstance(t, gs.Constant) or (t.name == "" and not t.inputs) for t in node.inputs):
        return ""
    if not node.inputs and node.op not in ("Constant", "ConstantOfShape", "Range", "EyeLike"):
        return ""
    if any(id(t) in graph_outputs for t in node.outputs):
        return "graph-output"
    if node.op == "Cast" and _dequantizes_weight(node):
        return "weight-dequantization"
    return None


def _dequantizes_weight(node: gs.Node) -> bool:
    """A Cast of a low-precision weight to a float type: an 8- or 16-bit integer, or one of
    ml_dtypes' types of a byte or less (int4, uint4, float4, float8), stored compressed on
    purpose, so folding it would undo the compression (an int4 weight: 8x)."""
    x, to = node.inputs[0], node.attrs.get("to")
    if not isinstance(x, gs.Constant) or to is None:
        return False
    dtype = np_dtype(x.dtype)   # from the tensor's header: a lazy weight stays on disk
    try:
        target = np_dtype(int(to))
    except (KeyError, TypeError, ValueError):
        return False
    low = (np.issubdtype(dtype, np.integer) and dtype.itemsize <= 2) or (
        dtype.kind == "V" and dtype.itemsize == 1)
    floating = np.issubdtype(target, np.floating) or target.kind == "V"
    return low and floating and _prod(x.shape) >= 1024


def _estimate_bytes(node: gs.Node) -> int | None:
    """Bytes a node's outputs will take, known *before* evaluating it, or None.

    The ops that build big tensors from small constants (ConstantOfShape, Expand, Tile,
    Range) are sized from their constant inputs; others from their inferred static output
    shapes. A hostile model can ask ConstantOfShape for 2^60 elements: evaluating first
    and measuring after would exhaust memory before the size guard ever saw the result.
    """
    def vals(i):
        t = node.inputs[i] if len(node.inputs) > i else None
        return np.asarray(t.values) if isinstance(t, gs.Constant) else None

    try:
        if node.op == "ConstantOfShape":
            shape, value = vals(0), node.attrs.get("value")
            item = np.asarray(value.values).dtype.itemsize if isinstance(value, gs.Constant) else 4
            return None if shape is None else int(_prod(shape)) * item
        if node.op in ("Expand", "Tile") and isinstance(node.inputs[0], gs.Constant):
            x, arg = vals(0), vals(1)
            if arg is None:
                return None
            if node.op == "Tile":
                return int(x.nbytes * _prod(arg))
            dims = list(x.shape)
            arg = [int(d) for d in arg.ravel()]
            n = max(len(dims), len(arg))
            dims = [1] * (n - len(dims)) + dims
            arg = [1] * (n - len(arg)) + arg
            return int(_prod([max(a, b) for a, b in zip(dims, arg)]) * x.dtype.itemsize)
        if node.op == "Range":
            start, limit, delta = vals(0), vals(1), vals(2)
            if start is None or limit is None or delta is None or float(delta) == 0:
                return None
            n = max(0.0, np.ceil((float(limit) - float(start)) / float(delta)))
            return int(min(n, 2.0**62)) * start.dtype.itemsize
    except (TypeError, ValueError, OverflowError):
        return None
    total = 0
    for t in node.outputs:
        if t.dtype is None or not static_shape(t):
            return None
        total += _prod(t.shape) * np_dtype(t.dtype).itemsize
    return int(min(total, 2.0**62))


def _prod(dims) -> float:
    # float: absurd dims must not wrap around like int64 products do
    return float(np.prod([max(float(d), 0.0) for d in np.asarray(dims).ravel()]))


# Ops that only re-lay out or re-type a weight on its way to the op that uses it.
WEIGHT_PATH = {"Reshape", "Transpose", "Cast", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def _only_weight_use(t: gs.Tensor, depth: int = 0) -> bool:
    """Does every use of ``t`` end, through layout ops, in a weight slot?"""
    if not t.outputs or depth > 8:
        return False
    for consumer in t.outputs:
        if consumer.op in WEIGHT_PATH and consumer.inputs and consumer.inputs[0] is t:
            if not all(_only_weight_use(o, depth + 1) for o in consumer.outputs):
                return False
            continue
        slots = WEIGHT_SLOTS.get(consumer.op, set())
        if not any(i in slots for i, x in enumerate(consumer.inputs) if x is t):
            return False
    return True


def _evaluate(node: gs.Node, opset: int) -> list[np.ndarray]:
    if node.op in ("Shape", "Size"):
        x = node.inputs[0]
        shape = np.array(x.shape if not isinstance(x, gs.Constant) else x.values.shape,
                         dtype=np.int64)
        if node.op == "Size":
            return [np.array(np.prod(shape), dtype=np.int64)]
        start = int(node.attrs.get("start", 0))
        end = node.attrs.get("end", None)
        return [shape[start:end if end is None else int(end)]]
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    # The node with positional names, so that nodes alike but for their tensors (hundreds of
    # ConstantOfShape in a model-zoo file) share one evaluator: building one costs ~2 ms.
    proto = OnnxExporter.export_node(node)
    consts = list({id(t): t for t in node.inputs if isinstance(t, gs.Constant)}.values())
    slot = {id(t): f"i{k}" for k, t in enumerate(consts)}
    del proto.input[:]
    proto.input.extend(slot[id(t)] if isinstance(t, gs.Constant) else "" for t in node.inputs)
    del proto.output[:]
    proto.output.extend(f"o{k}" for k in range(len(node.outputs)))
    proto.name = ""
    key = (opset, proto.SerializeToString(),
           tuple((t.values.dtype.str, t.values.shape) for t in consts))
    ref = _EVALUATORS.get(key)
    if ref is None:
        from onnx.reference import ReferenceEvaluator

        ref = ReferenceEvaluator(_single_node_model(proto, consts, len(node.outputs), opset))
        if len(_EVALUATORS) > 4096:
            _EVALUATORS.clear()
        _EVALUATORS[key] = ref
    outs = ref.run(None, {slot[id(t)]: t.values for t in consts})
    return [np.asarray(o) for o in outs]


_EVALUATORS: dict = {}


def _single_node_model(proto: onnx.NodeProto, consts: list, n_out: int, opset: int
                       ) -> onnx.ModelProto:
    inputs = [onnx.helper.make_tensor_value_info(
        f"i{k}", onnx.helper.np_dtype_to_tensor_dtype(t.values.dtype), t.values.shape)
        for k, t in enumerate(consts)]
    outputs = [onnx.helper.make_empty_tensor_value_info(f"o{k}") for k in range(n_out)]
    g = onnx.helper.make_graph([proto], "fold", inputs, outputs)
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)])


def _bypass(node: gs.Node, g: gs.Graph, graph_outputs: set[int]) -> str | None:
    """Route the consumers of an Identity/inference Dropout to its input; None if done."""
    if node.op == "Dropout":
        if len(node.outputs) > 1 and node.outputs[1].outputs:
            return "dropout-mask-used"
        if len(node.outputs) > 1 and id(node.outputs[1]) in graph_outputs:
            return "dropout-mask-used"
        if len(node.inputs) > 2 and node.inputs[2].name:
            mode = node.inputs[2]
            if not isinstance(mode, gs.Constant) or bool(np.asarray(mode.values).any()):
                return "dropout-training-mode"
        if int(node.attrs.get("is_test", 1)) == 0 and g.opset < 7:
            return "dropout-training-mode"
    return bypass(node, g, graph_outputs)
