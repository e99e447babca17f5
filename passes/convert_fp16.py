"""convert-fp16: run the plan's FP16 layers, and what follows them, in float16 regions.

Before -> after, for a Conv the plan puts in FP16::

    x -> Conv(W, b) -> Relu -> y -> (fp32 consumers)
    x -> Cast(fp16) -> Conv(W16, b16) -> Relu -> y_fp16 -> Cast(fp32) -> y -> (fp32 consumers)

A region starts at each FP16 layer and grows forward through ops that are safe in float16
(activations, pooling, elementwise, Concat, reshapes) whose float inputs all come from the
region or are constants. Adjacent FP16 layers therefore share one region and no Cast pair
stands back to back between them. A Transpose read by the region alone is cast before,
not after (Cast -> Transpose -> Conv, as sink-transposes would move it: a plan's output
rewritten again stays the same); one that ends a region runs in float32 after the Cast
back, for the same reason. At the region's edge: one Cast to float16 per incoming
tensor, one Cast back to float32 per outgoing tensor; the float32 side keeps the original
tensor name (graph outputs and plans stay valid), the float16 side gets ``<name>_fp16``.

Constants inside a region become float16 (a constant also used outside gets a float16
copy); values beyond the float16 range (|x| > 65504) are clamped and counted, because
they would otherwise become inf. An FP16 layer whose input or output exceeds a quarter of
the float16 range on the calibration data (``Context.fp16_ranges``, max |x|) stays
float32 (``range-beyond-fp16``): onnxruntime's CPU computes a float16 region in float32, so
--verify would not see the overflow; so does one whose weights hold finite values beyond
float16's range (``weight-beyond-fp16``: clamped, they make another layer). Q/DQ nodes
are never in a region: next to INT8 layers the
Q/DQ and their scales stay float32, with the Casts around them (MIGraphX PR #3053 pattern;
from opset 19 a float16 input with a float32 scale does not even parse). So run it after
insert-qdq. Inside If/Loop/Scan bodies the same holds per body: its Casts go into the body,
its outputs and what it reads from outside stay float32 (the node's types do not change).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from rewriter.core.errors import PreconditionError
from rewriter.core.graph import FP16_MAX, FP16_SAFE, iter_graphs, node_id, set_values
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

# Ops whose float inputs and outputs may all be float16 (same-type semantics).
SAFE = {
    "Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh", "Elu", "PRelu",
    "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "MaxPool", "AveragePool",
    "GlobalAveragePool", "GlobalMaxPool", "Concat", "Flatten", "Reshape", "Transpose",
    "Squeeze", "Unsqueeze", "Identity", "Neg", "Abs", "Pad", "Slice", "Split",
    # A mean, max or min stays within its input's range: GlobalAveragePool as EfficientNet's
    # squeeze-excite writes it (a float32 island with two Casts per block under --plan fp16)
    "ReduceMean", "ReduceMax", "ReduceMin",
    # Erf within [-1, 1], Gelu within its input's range: both exporters' GELU (torchvision's
    # ConvNeXt-T: a float32 island per block, 18 of them)
    "Erf", "Gelu",
    # Gather by constant indices copies its data's values: the split of a fused QKV
    # projection, TorchScript's ViT (4 Casts a block, 48 in ViT-B/16). By computed indices
    # (boxes a TopK picks) it is post-processing, which stays float32 (_follows).
    "Gather",
    # ScatterND by constant indices without a reduction writes its updates' values into its
    # data's: torch's slice assignment as the dynamo exporter writes it (MViT-V2's relative
    # positions added into the attention, 3 a block: a float32 island, 162 Casts in all)
    "ScatterND",
}


def _beyond_fp16(t) -> bool:
    """A constant with finite values float16 cannot hold (clamping them to 65504 made a
    conv of weights ~2e5 on inputs ~1e-3 a new layer: cosine 0.87, written without
    --verify; inf and NaN are the same in float16)."""
    if not isinstance(t, gs.Constant) or t.values.dtype != np.float32:
        return False
    v = np.abs(t.values)
    return bool(np.any(np.isfinite(v) & (v > FP16_MAX)))


class ConvertFp16(Pass):
    name = "convert-fp16"
    phase = Phase.QUANTIZE
    numerics = Numerics.LOSSY
    summary = "FP16 layers of a plan (and their activations) -> float16 regions with shared Casts"

    def requires(self, graph, ctx):
        if ctx.assignment is None:
            raise PreconditionError("convert-fp16 needs a plan: use --plan")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        too_big: list[str] = []
        # The main graph's float16 twins of float32 tensors (Cast in, or the region's value
        # before its Cast back): a body region reading such a tensor from outside reads the
        # twin, not a Cast of a Cast (float16 -> float32 -> float16 is exact). A body's own
        # twins are not shared: a sibling branch cannot see them.
        twins: dict[str, gs.Tensor] = {}
        for g in list(iter_graphs(graph)):   # a body's Casts go into that body
            res.changed |= self._convert(g, ctx, res, too_big, twins, g is graph)
        if too_big:
            one = len(too_big) == 1
            res.notes.append(
                f"{len(too_big)} FP16 layer{'' if one else 's'} stay{'s' if one else ''} "
                f"float32: {'its' if one else 'their'} activations reach more "
                f"than {FP16_SAFE:.0f} (a quarter of float16's range) on the calibration "
                f"data (else --verify's inputs), or weights more than {FP16_MAX:.0f}: "
                + ", ".join(too_big[:3])
                + (f" and {len(too_big) - 3} more" if len(too_big) > 3 else ""))
        return res

    def _convert(self, graph: gs.Graph, ctx: Context, res: PassResult, too_big: list,
                 twins: dict, main: bool) -> bool:
        """One graph's regions (the main graph's, which fills ``twins``, or one body's,
        which reads them); whether it changed."""
        assignment, plan = ctx.assignment, ctx.plan
        clamp = plan.fp16.get("clamp", True) if plan is not None else True
        region: set[int] = set()
        producer = {id(t): n for n in graph.nodes for t in n.outputs}
        for node in graph.nodes:  # topological: one forward sweep grows every region
            fp = _float_inputs(node)
            typed = all(isinstance(t, gs.Constant) or t.dtype is not None or not t.name
                        for t in node.inputs)
            if assignment.precision.get(node_id(node)) == "fp16":
                if not typed:
                    res.skip("unknown-input-dtype")  # a Cast could not be placed right
                    continue
                w = node.inputs[1] if len(node.inputs) > 1 else None
                if isinstance(w, gs.Constant) and w.values.dtype != np.float32:
                    res.skip("not-fp32")
                    continue
                big = max((ctx.fp16_ranges.get(t.name, 0.0)
                           for t in node.inputs[:1] + node.outputs[:1]), default=0.0)
                if big > FP16_SAFE:
                    res.skip("range-beyond-fp16")
                    too_big.append(f"{node_id(node)} ({big:.3g})")
                    _kept_fp32(assignment, node_id(node), "activations beyond float16")
                    continue
                if any(_beyond_fp16(t) for t in node.inputs[1:]):   # clamped, a new layer
                    res.skip("weight-beyond-fp16")
                    too_big.append(f"{node_id(node)} (weights)")
                    _kept_fp32(assignment, node_id(node), "weights beyond float16")
                    continue
                _typed_like_input(node)
                region.add(id(node))
                res.count(f"fp16-{node.op.lower()}")
            elif _follows(node) and typed and fp and all(
                    isinstance(t, gs.Constant) or id(producer.get(id(t))) in region for t in fp
            ) and any(not isinstance(t, gs.Constant) for t in fp) and not any(
                    _beyond_fp16(t) for t in fp):
                _typed_like_input(node)
                region.add(id(node))
                res.count("fp16-follower")
        for node in reversed(graph.nodes):
            if id(node) in region and node.op == "Transpose" and not any(
                    id(c) in region for t in node.outputs for c in t.outputs):
                # A Transpose ending a region runs after the Cast back, not before it (as
                # sink-transposes moves it on a second run: the output stays a fixed point;
                # a Keras BERT's attention heads, twenty-sixth round)
                region.discard(id(node))
                res.counts["fp16-follower"] -= 1
        if not region:
            return False
        members = [n for n in graph.nodes if id(n) in region]
        to16: dict[str, gs.Tensor] = {}
        const16: dict[str, gs.Constant] = {}
        outputs = {id(t) for t in graph.outputs}
        # Inputs: constants become float16, activations get one Cast per tensor.
        for n in members:
            for i, t in enumerate(n.inputs):
                if not _is_float32(t):
                    continue
                if isinstance(t, gs.Constant):
                    if t.name not in const16:
                        v = t.values.astype(np.float64)
                        over = int(np.count_nonzero(np.abs(v) > FP16_MAX))
                        if over:
                            res.count("fp16-clamped-values", over)
                            if not clamp:
                                res.notes.append(f"{t.name}: {over} values overflow float16 to inf")
                        if clamp:
                            v = np.clip(v, -FP16_MAX, FP16_MAX)
                        v16 = np.asarray(v, dtype=np.float16)   # np.clip of 0-d is a scalar
                        if all(id(c) in region for c in t.outputs) and id(t) not in outputs:
                            set_values(t, v16)
                            const16[t.name] = t
                        else:
                            const16[t.name] = gs.Constant(ctx.namer(f"{t.name}_fp16"), v16)
                    n.inputs[i] = const16[t.name]
                elif id(producer.get(id(t))) not in region:
                    p = producer.get(id(t))
                    if t.name not in to16 and _transposes_into(p, t, region, outputs):
                        # Cast -> Transpose, not Transpose -> Cast, which sink-transposes
                        # turns into this on a second run: the output is a fixed point
                        p.inputs[0] = _cast_in(p.inputs[0], graph, to16, ctx, res)
                        t.dtype = np.float16
                        to16[t.name] = t
                    if not main and p is None and t.name in twins:
                        to16[t.name] = twins[t.name]    # an outer-scope read of the twin
                        res.count("outer-fp16-reads")
                    n.inputs[i] = to16.get(t.name) or _cast_in(t, graph, to16, ctx, res)
        # Outputs: float16 inside; a Cast back to float32 keeps the original name outside.
        for n in members:
            for j, t in enumerate(list(n.outputs)):
                if not _is_float32(t):
                    continue
                outside = [c for c in t.outputs if id(c) not in region] or id(t) in outputs
                if not outside:
                    t.dtype = np.float16
                    continue
                t16 = gs.Variable(ctx.namer(f"{t.name}_fp16"), dtype=np.float16, shape=t.shape)
                for c in list(t.outputs):
                    if id(c) in region:
                        for k, x in enumerate(c.inputs):
                            if x is t:
                                c.inputs[k] = t16
                n.outputs[j] = t16
                graph.nodes.append(gs.Node("Cast", ctx.namer(f"{t.name}_Cast_fp32"),
                                           attrs={"to": onnx.TensorProto.FLOAT},
                                           inputs=[t16], outputs=[t]))
                res.count("casts-out")
                if main:
                    twins[t.name] = t16
        if main:
            twins.update(to16)
        return True


def _cast_in(t: gs.Tensor, graph: gs.Graph, to16: dict, ctx: Context, res) -> gs.Tensor:
    """t in float16: one Cast per tensor, shared by every region member reading it."""
    if t.name not in to16:
        c = gs.Variable(ctx.namer(f"{t.name}_fp16"), dtype=np.float16, shape=t.shape)
        graph.nodes.append(gs.Node("Cast", ctx.namer(f"{t.name}_Cast_fp16"),
                                   attrs={"to": onnx.TensorProto.FLOAT16},
                                   inputs=[t], outputs=[c]))
        to16[t.name] = c
        res.count("casts-in")
    return to16[t.name]


def _transposes_into(p, t: gs.Tensor, region: set[int], outputs: set[int]) -> bool:
    """t is a Transpose of a float32 activation read by the region alone."""
    return (p is not None and p.op == "Transpose" and p.domain in (None, "", "ai.onnx")
            and len(p.inputs) == 1 and not isinstance(p.inputs[0], gs.Constant)
            and _is_float32(p.inputs[0]) and id(t) not in outputs
            and all(id(c) in region for c in t.outputs))


def _typed_like_input(node) -> None:
    """A region member's first output has its float32 input's type; where inference missed
    it (it stops at a contrib op, and a norm expand-contrib wrote after one has no type),
    it is set, so that the Cast back to float32 is placed (GPT-2 from onnxruntime's
    optimizer: a float16 MatMul read by an Add outside the region, exit 3)."""
    for t in node.outputs if node.op == "Split" else node.outputs[:1]:
        if t.dtype is None and _float_inputs(node):
            t.dtype = np.float32


def _follows(node) -> bool:
    return node.op in SAFE and (node.op not in ("Gather", "ScatterND") or isinstance(
        node.inputs[1], gs.Constant)) and node.attrs.get("reduction", "none") == "none"


def _float_inputs(node) -> list:
    return [t for t in node.inputs if _is_float32(t)]


def _is_float32(t) -> bool:
    if isinstance(t, gs.Constant):
        return t.values.dtype == np.float32
    return t.dtype is not None and np.dtype(t.dtype) == np.float32


def _kept_fp32(assignment, nid: str, why: str) -> None:
    """A layer planned FP16 that stays float32 is an FP32 layer of the plan: the report's
    layers and counts say what was written (the hot UNet's 8 convs were counted FP16)."""
    assignment.precision[nid] = "fp32"
    assignment.why[nid] += f" ({why})"
