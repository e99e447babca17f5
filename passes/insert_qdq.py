"""insert-qdq: put INT8 layers of a plan into the QDQ form MIGraphX turns into int8 kernels.

Before -> after, for a Conv the plan puts in INT8::

    x -> Conv(W, b) -> Relu
    x -> QuantizeLinear(s_x, 0) -> DequantizeLinear(s_x, 0) -> Conv -> Relu
         W_int8 -> DequantizeLinear(s_w, 0, axis=0) ------------^   (b stays float)

The form (shared/migraphx/PROFILE.md, "Quantized layers"): signed int8 activations and
weights, symmetric; an explicit int8 zero point (0) on every Q and DQ (a DQ without one does
not match and the layer silently stays float); per-tensor activation scales as 0-d fp32
constants; weight scales per output channel (axis 0 for Conv, the output axis of Gemm/MatMul
B) or per-tensor; weights stored as int8 initializers behind a DequantizeLinear, never
pre-dequantized (fold-constants never folds DQ); nothing between a conv and its activation.

Scales: activation s_x = amax / 127 from calibration (``ctx.data['ranges']``: tensor name ->
amax); weight s_w[k] = max|W[k]| / 127, W_int8 = clip(round(W / s_w), -127, 127). A scale is
always > 0 and normal: an all-zero channel (e.g. from pad-channels) gets 1.0, and scales are
floored at 1e-12, since MIGraphX fails on a zero scale (#4235).

Bias: float by default (MIGraphX fuses the add into the kernel); ``int32`` stores
round(b / (s_x * s_w)) behind a DequantizeLinear with that product as scale.

Skips (reasons in the report): weight not constant, not fp32, no calibration range for the
activation, per-channel weights on opset < 13 (falls back to per-tensor, noted).
The activation Q/DQ pair is shared by every INT8 layer reading the same tensor; an INT8
weight shared by several layers is quantised once.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.errors import PreconditionError
from rewriter.pass_base import Context, Numerics, Pass, PassResult, Phase
from rewriter.plan import node_id

QMAX = 127
MIN_SCALE = 1e-12


def safe_scale(amax: np.ndarray | float) -> np.ndarray:
    """amax / 127 with zero, negative, non-finite and tiny values made safe (> 0, normal)."""
    a = np.asarray(amax, dtype=np.float64)
    s = np.where(np.isfinite(a) & (a > 0), a / QMAX, 1.0)
    return np.asarray(np.maximum(s, MIN_SCALE), dtype=np.float32)


def quantize_weight(w: np.ndarray, axis: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 weights and their scales (per channel along ``axis``, or per tensor)."""
    w64 = w.astype(np.float64)
    if axis is None:
        s = safe_scale(np.max(np.abs(w64)) if w64.size else 0.0)
        q = np.clip(np.rint(w64 / s), -QMAX, QMAX).astype(np.int8)
        return q, s.reshape(())
    other = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w64), axis=other) if w64.size else np.zeros(w.shape[axis])
    s = safe_scale(amax)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.rint(w64 / s.astype(np.float64).reshape(shape)), -QMAX, QMAX).astype(np.int8)
    return q, s


class InsertQdq(Pass):
    name = "insert-qdq"
    phase = Phase.QUANTIZE
    numerics = Numerics.LOSSY
    summary = "INT8 layers of a plan -> QuantizeLinear/DequantizeLinear in MIGraphX's int8 form"

    def requires(self, graph, ctx):
        if "assignment" not in ctx.data:
            raise PreconditionError("insert-qdq needs a plan: use --plan (and --calib)")
        if graph.opset < 10:
            raise PreconditionError(f"insert-qdq needs opset >= 10 (model has {graph.opset})")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        assignment = ctx.data["assignment"]
        ranges = ctx.data.get("ranges", {})
        plan = ctx.data.get("plan")
        per_channel = plan.per_channel if plan is not None else True
        int32_bias = plan is not None and plan.int8.get("bias") == "int32"
        if per_channel and graph.opset < 13:
            per_channel = False
            res.notes.append(f"opset {graph.opset} < 13 has no per-axis DequantizeLinear: "
                             "per-tensor weight scales used")
        act_cache: dict[str, gs.Variable] = {}
        w_cache: dict[tuple, gs.Variable] = {}
        for node in list(graph.nodes):
            nid = node_id(node)
            if assignment.precision.get(nid) != "int8":
                continue
            reason = self._quantize(graph, node, ranges, per_channel, int32_bias, act_cache,
                                    w_cache, ctx, res)
            if reason:
                res.skip(reason)
                res.notes.append(f"{nid}: {reason}")
            else:
                res.count(f"int8-{node.op.lower()}")
                res.changed = True
        res.count("qdq-activation-pairs", len(act_cache))
        return res

    def _quantize(self, graph, node, ranges, per_channel, int32_bias, act_cache, w_cache, ctx, res):
        x = node.inputs[0]
        w = node.inputs[1] if len(node.inputs) > 1 else None
        if not isinstance(w, gs.Constant):
            return "weights-not-constant"
        if w.values.dtype != np.float32 or (x.dtype is not None and np.dtype(x.dtype) != np.float32):
            return "not-fp32"
        if node.op == "Gemm" and int(node.attrs.get("transA", 0)):
            return "gemm-transposed-activation"
        if node.op == "MatMul" and w.values.ndim != 2:
            return "matmul-weight-not-2d"
        amax = ranges.get(x.name)
        if amax is None:
            return "no-calibration-range"
        if node.op == "Conv":
            axis = 0
        elif node.op == "Gemm":
            axis = 0 if int(node.attrs.get("transB", 0)) else 1
        else:
            axis = 1
        axis = axis if per_channel else None
        # Activation: one Q->DQ pair per tensor, shared by all its INT8 consumers.
        if x.name not in act_cache:
            s = gs.Constant(ctx.namer(f"{x.name}_scale"), safe_scale(amax).reshape(()))
            zp = gs.Constant(ctx.namer(f"{x.name}_zero_point"), np.array(0, dtype=np.int8))
            xq = gs.Variable(ctx.namer(f"{x.name}_quantized"), dtype=np.int8, shape=x.shape)
            xd = gs.Variable(ctx.namer(f"{x.name}_dequantized"), dtype=np.float32, shape=x.shape)
            graph.nodes.append(gs.Node("QuantizeLinear", ctx.namer(f"{x.name}_QuantizeLinear"),
                                       inputs=[x, s, zp], outputs=[xq]))
            graph.nodes.append(gs.Node("DequantizeLinear", ctx.namer(f"{x.name}_DequantizeLinear"),
                                       inputs=[xq, s, zp], outputs=[xd]))
            act_cache[x.name] = (xd, float(s.values))
        xd, s_x = act_cache[x.name]
        node.inputs[0] = xd
        # Weight: int8 initializer -> DequantizeLinear (never folded), shared when shared.
        key = (w.name, axis)
        if key not in w_cache:
            q, s_w = quantize_weight(w.values, axis)
            wq = gs.Constant(ctx.namer(f"{w.name}_quantized"), q)
            ws = gs.Constant(ctx.namer(f"{w.name}_scale"), s_w)
            wz = gs.Constant(ctx.namer(f"{w.name}_zero_point"), np.zeros(s_w.shape, np.int8))
            wd = gs.Variable(ctx.namer(f"{w.name}_dequantized"), dtype=np.float32,
                             shape=list(w.shape))
            attrs = {"axis": axis} if axis is not None else {}
            graph.nodes.append(gs.Node("DequantizeLinear", ctx.namer(f"{w.name}_DequantizeLinear"),
                                       attrs=attrs, inputs=[wq, ws, wz], outputs=[wd]))
            w_cache[key] = (wd, s_w)
            res.count("weights-quantized")
        wd, s_w = w_cache[key]
        node.inputs[1] = wd
        if int32_bias and node.op == "Conv" and len(node.inputs) > 2 and isinstance(node.inputs[2], gs.Constant):
            b = node.inputs[2]
            sb = (np.float64(s_x) * s_w.astype(np.float64)).reshape(-1)
            sb = np.broadcast_to(sb, b.values.shape).astype(np.float32)
            bq = np.clip(np.rint(b.values.astype(np.float64) / sb), -2**31, 2**31 - 1).astype(np.int32)
            bqc = gs.Constant(ctx.namer(f"{b.name}_quantized"), bq)
            bsc = gs.Constant(ctx.namer(f"{b.name}_scale"), sb)
            bzp = gs.Constant(ctx.namer(f"{b.name}_zero_point"), np.zeros(sb.shape, np.int32))
            bd = gs.Variable(ctx.namer(f"{b.name}_dequantized"), dtype=np.float32, shape=list(b.shape))
            graph.nodes.append(gs.Node("DequantizeLinear", ctx.namer(f"{b.name}_DequantizeLinear"),
                                       attrs={"axis": 0}, inputs=[bqc, bsc, bzp], outputs=[bd]))
            node.inputs[2] = bd
        return None
