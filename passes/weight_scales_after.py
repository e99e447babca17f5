"""weight-scales-after: a Q/DQ model's per-channel weight scales move after the layer, the
form MIGraphX 2.16 lowers to int8 kernels.

MIGraphX 2.16's simplify_qdq throws on every per-axis weight DequantizeLinear
(shared/migraphx/PROFILE.md item 9: "(broadcast ndims - axis) is less than s0 ndims"), so a
model quantized elsewhere with per-channel weights (onnxruntime's quantize_static does that
by default) fails to compile for int8 on 2.16; 2.15 lowers it. insert-qdq writes its own
layers in the form both versions lower (``weight_form: mul``); this pass puts a model's own
Q/DQ layers into it. Before -> after::

    W_int8 -> DequantizeLinear(s[K], 0, axis) -> Conv(x_dq, ., b) -> y
    =>  W_int8 -> DequantizeLinear(1.0, 0) -> Conv(x_dq, .) -> Mul(s[1,K,1,1]) -> Add(b) -> y

Conv(x, q * s) = Conv(x, q) * s per output channel (a conv is linear in each filter), so
only float rounding changes. MatMul (B per column, axis 1) and Gemm (per output column;
its bias C, times beta, moves to the Add) the same way; the layer keeps its name and ``y``
its readers. A bias that is itself a DequantizeLinear of constants (an int32 bias, scale
s_x * s_w) becomes the float constant onnxruntime computes from it, which is what MIGraphX
makes of it too (PROFILE.md item 14).

Only with MIGraphX as the target, and for 2.16 and later or an unknown version (the form
lowers on 2.15 as well). Skips (reasons in the report): a weight zero point that is not all
zero (``weight-zero-point``), a weight DQ read by more than one layer (``shared-weight``),
a Gemm with alpha != 1 (it stays float on MIGraphX anyway), a bias computed at run time.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, packed, peek_values, weight_out_axis
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

LAYERS = ("Conv", "MatMul", "Gemm")
# onnxruntime's quantizers write com.microsoft Q/DQ for int4/int16 below opset 21 (an int8
# weight beside them too); MIGraphX reads those as the standard ones. The DQ written is
# a standard int8 one.
DOMAINS = (None, "", "ai.onnx", "com.microsoft")


class WeightScalesAfter(Pass):
    name = "weight-scales-after"
    phase = Phase.FOLD
    # Exact in real arithmetic, but the float rounding it changes flips activation
    # QuantizeLinear roundings downstream, each a whole step: judged as a Q/DQ model's
    # outputs are (PP-OCR's text-direction classifier quantized by onnxruntime, 32 fresh
    # lines: cosine 0.9996 mean, 0.987 worst against the model as given, the same top-1;
    # the model itself is 0.9989 from FP32).
    numerics = Numerics.LOSSY
    summary = "per-channel weight DequantizeLinear scales of a Q/DQ model -> a Mul after the layer"

    shape_ops = ()

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        from rewriter.passes.insert_qdq import _Site

        res = PassResult()
        version = ctx.options.migraphx_version
        if version is not None and tuple(version[:2]) < (2, 16):
            return res
        for g in iter_graphs(graph):
            site = _Site(g, ctx, res, {}, "mul", False)
            for node in list(g.nodes):
                if node.op in LAYERS and node.domain in (None, "", "ai.onnx") \
                        and len(node.inputs) > 1:
                    res.outcome(_move(node, site), "weight-scales-moved")
        return res


def _move(node: gs.Node, site) -> str | None:
    """Move the per-channel scale of ``node``'s weight DQ after it (PassResult.outcome:
    None when done, "" when not such a layer, else a skip reason)."""
    wd = node.inputs[1]
    dq = wd.inputs[0] if len(wd.inputs) == 1 else None
    if dq is None or dq.op != "DequantizeLinear" or dq.domain not in DOMAINS:
        return ""
    q, s = dq.inputs[0], dq.inputs[1]
    zp = dq.inputs[2] if len(dq.inputs) > 2 and dq.inputs[2].name else None
    if not (isinstance(q, gs.Constant) and isinstance(s, gs.Constant)) or s.shape is None \
            or int(np.prod(s.shape)) <= 1:
        return ""            # per tensor already, or computed
    # peek_values: ``values`` would load a memory-mapped weight for good (the writer then
    # inlines what it would stream), and the weight is read by the new DQ as it is
    qv = peek_values(q)
    if packed(qv.dtype) and qv.dtype.name == "int4" and qv.ndim >= 2:
        # 2.16 throws on an int4 per-axis weight as on an int8 one (2.15 lowers both): the
        # same values in int8 take the same path (twice the bytes of that weight).
        qv = qv.astype(np.int8)
        q = gs.Constant(site.ctx.namer(f"{q.name}_int8"), qv)
        if zp is not None and isinstance(zp, gs.Constant):
            zp = gs.Constant(site.ctx.namer(f"{zp.name}_int8"), peek_values(zp).astype(np.int8))
    if qv.dtype != np.int8 or qv.ndim < 2:
        return ""
    rank = qv.ndim
    axis = int(dq.attrs.get("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if node.op == "Gemm" and float(node.attrs.get("alpha", 1.0)) != 1.0:
        return "gemm-alpha"
    out_axis = weight_out_axis(node, rank)
    if out_axis is None:
        return "matmul-rank"
    sv = peek_values(s)
    if axis != out_axis or sv.size != qv.shape[axis]:
        return "not-output-channels"
    if zp is not None and (not isinstance(zp, gs.Constant) or np.any(peek_values(zp))):
        return "weight-zero-point"
    if len(wd.outputs) != 1:
        return "shared-weight"
    b = node.inputs[2] if node.op == "Conv" and len(node.inputs) > 2 else None
    if b is not None and b.name and not isinstance(b, gs.Constant):
        bias = _dequantized_bias(b)
        if bias is None:
            return "computed-bias"
        node.inputs[2] = gs.Constant(site.ctx.namer(f"{b.name}_float"), bias)
    one = site.const(f"{q.name}_unit_scale", np.array(1.0, np.float32))
    zero = site.const(f"{q.name}_zero_point", np.array(0, np.int8))
    node.inputs[1] = site.add_node("DequantizeLinear", f"{dq.name or q.name}_unit",
                                   [q, one, zero], f"{q.name}_dequantized", np.float32,
                                   list(qv.shape))
    site.scale_after(node, sv.astype(np.float32).reshape(-1), out_axis)
    return None


def _dequantized_bias(b: gs.Tensor) -> np.ndarray | None:
    """A conv bias that is a DequantizeLinear of constants, as onnxruntime computes it
    ((q - zp) * s in float32); None when computed at run time."""
    dq = b.inputs[0] if len(b.inputs) == 1 else None
    if dq is None or dq.op != "DequantizeLinear" or dq.domain not in DOMAINS or not all(
            isinstance(t, gs.Constant) for t in dq.inputs if t.name):
        return None
    q, s = peek_values(dq.inputs[0]), peek_values(dq.inputs[1]).astype(np.float32)
    zp = peek_values(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2].name else 0
    return ((q.astype(np.int64) - np.asarray(zp, np.int64)).astype(np.float32)
            * s).astype(np.float32)
