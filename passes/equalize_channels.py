"""equalize-channels: move per-channel activation ranges into the weights before INT8.

An INT8 conv's input is quantised with ONE scale for all its channels (MIGraphX takes
per-tensor activation scales only), so a channel whose values span 0.1 next to one that
spans 30 keeps about one level of 255. Channel ranges of MobileNet activations differ by
100x and more. This pass divides each channel c of such an input by s_c and multiplies the
conv's weights for that input channel by s_c: the same function, with the channels brought
to one range before the quantiser sees them (cross-layer equalization, Nagel et al. 2019;
with activation statistics, as SmoothQuant does)::

    x -> Q/DQ -> Conv(W)            =>   x -> Mul(1/s) -> Q/DQ -> Conv(W * s)
    y = Conv1(...) -> Relu -> x     =>   Conv1 rows and bias / s -> Relu -> Conv(W * s)

Scales, from the calibration data's per-channel max |x| (``a_c``) and the weights' max |W|
over each input channel (``w_c``, all INT8 consumers of the tensor):

* only depthwise consumers: ``s_c = a_c / max(a)``. A depthwise conv's output channel c
  reads input channel c alone, so with per-channel weight scales the weights lose nothing:
  every channel comes out at the full range.
* otherwise ``s_c = a_c^alpha / w_c^(1 - alpha)`` (alpha 0.5, SmoothQuant's balance): input
  channel c feeds every output channel, so its range is shared between the activation's
  quantiser and the weights'.

s is normalised to max 1 and floored at 1e-4 (an all-zero channel stays zero).

Where 1/s goes: into the producing conv's output rows and bias when the tensor comes from a
Conv or ConvTranspose (its output channels are W's axis 1, per group: DPT's reassemble
stage upsamples with one; a Mul after it, a second rewrite's fuse-conv-bn folded), directly
or through a Relu (positively homogeneous: Relu(y / s) = Relu(y) / s), or
into a BatchNormalization's scale and bias, and nothing else reads it: no op is added.
Otherwise, in particular after HardSwish, HardSigmoid, Relu6/Clip or Sigmoid, which are NOT
positively homogeneous (HardSwish(x / s) != HardSwish(x) / s), the function is kept exact by
an explicit per-channel Mul after the activation, on the quantised branch only (a residual
Add reading the same tensor still sees it unscaled); before a Transpose that only the
equalized convs read, its scales permuted (where sink-transposes would move it). MIGraphX
fuses that Mul with the activation before it; the Q/DQ -> Conv form it lowers to
quant_convolution is unchanged (tests/test_migraphx_models.py).

Skips (reasons in the report): no channel statistics, weights not constant, a weight the
model stores as int8 (``stored-int8-weight``: insert-qdq keeps those values bit for bit, and
W * s would need quantising again; every INT8 conv reading that tensor is left as it is),
grouped (not depthwise) convs, channel counts that do not match, tensors of rank < 3, a
weight or a channel range that is NaN or infinite (``not-finite``: s would carry the NaN to
every channel of the input, the layers beside it too), scales that are all 1
(``unit-scales``: one input channel, or ranges already even; nothing to move), a tensor
no INT8 conv reads (``no-int8-reader``: scope "all" once the plan is chosen), and
activations that 1/s would take within 2^10 of float32's top (``near-overflow``: after a
conv of 1.6e37 weights they became inf). A producer whose weights 1/s would take past
sqrt(max), fuse-conv-bn's limit, is not folded into: the Mul is inserted instead. So is
one before a Relu whose output 1/s would take past a quarter of float16's range where it
was within it, and the Relu's scaled output too (``pre-activation-growth``): s comes from
the Relu's output, and a channel that is mostly negative has a small one, so its negatives
grew by 1/s unseen (CenterFace: a conv's output from 17 to 4.7e4, and convert-fp16 then
kept that FP16 layer float32). Its statistics: ``rewriter.quant.ranges.stat_tensors``.
Nor is a producer whose weights or bias 1/s would take past float16's range where they
were within it (``weight-growth``: CenterFace's conv 504, 60 -> 2.9e5, FP16 in the plan).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.errors import PreconditionError
from rewriter.core.graph import (FP16_MAX, FP16_SAFE, StoredInt8, float32_layer,
                                 near_overflow, node_id, own_constant, pre_activation,
                                 stored_int8_weight)
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

MIN_SCALE = 1e-4


def _past_fp16(grown: np.ndarray, before: np.ndarray) -> bool:
    """Weights 1/s takes past float16's range where they were within it: an FP16 producer
    would stay float32 (convert-fp16's ``weight-beyond-fp16``)."""
    return bool(np.abs(grown).max(initial=0) > FP16_MAX >= np.abs(before).max(initial=0))


class EqualizeChannels(Pass):
    name = "equalize-channels"
    phase = Phase.QUANTIZE
    numerics = Numerics.CLOSE
    summary = "per-channel activation ranges of INT8 conv inputs moved into their weights"

    def requires(self, graph, ctx):
        if ctx.assignment is None:
            raise PreconditionError("equalize-channels needs a plan: use --plan (and --calib)")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        alpha = float(ctx.plan.int8.get("equalize_alpha", 0.5)) if ctx.plan is not None else 0.5
        # int8.equalize: true equalises the inputs of the plan's INT8 convs; "all" those of
        # every conv the plan could put in INT8 (the planner: one graph for every candidate).
        scope = ctx.plan.int8.get("equalize") if ctx.plan is not None else True
        consumers: dict[int, list] = {}
        tensors = {}
        for node in graph.nodes:
            wanted = (scope == "all" and node_id(node) in ctx.assignment.precision) or \
                ctx.assignment.precision.get(node_id(node)) == "int8"
            if node.op == "Conv" and wanted:
                x = node.inputs[0]
                consumers.setdefault(id(x), []).append(node)
                tensors[id(x)] = x
        for key, convs in consumers.items():
            x = tensors[key]
            res.outcome(self._equalize(graph, x, convs, ctx, alpha, res), "equalized-tensors")
        return res

    def _equalize(self, graph, x, convs, ctx, alpha, res) -> str | None:
        if not any(ctx.assignment.precision.get(node_id(c)) == "int8" for c in convs):
            # scope "all" (the planner's graph, s from every candidate reader): a tensor
            # whose readers all ended FP16 or FP32 has nothing to quantise, and its Mul
            # before a float32 conv was folded into that conv by a second rewrite
            # (CenterFace, --plan auto --max-abs: 187 -> 181 nodes, not a fixed point)
            return "no-int8-reader"
        if not all(float32_layer(conv) for conv in convs):
            # insert-qdq quantises float32 layers only: ISNet's float16 ones got a float32
            # Mul beside a float16 tensor, a model onnxruntime cannot load (exit 3); their
            # inputs are not calibrated either
            return "not-fp32"
        stats = ctx.channel_stats.get(x.name)
        if stats is None:
            return "no-channel-statistics"
        a = np.asarray(stats.absmax, np.float64)
        c = len(a)
        if x.shape is not None and len(x.shape) < 3:
            return "rank-below-3"
        w_max = np.zeros(c)
        depthwise = True
        for conv in convs:
            w = conv.inputs[1] if len(conv.inputs) > 1 else None
            if not isinstance(w, gs.Constant):
                # A weight stored as int8 (weight-only quantized) keeps its int8 values
                # under a plan: scaling its input channels would quantise it again.
                return ("stored-int8-weight" if isinstance(stored_int8_weight(conv), StoredInt8)
                        else "weights-not-constant")
            group = int(conv.attrs.get("group", 1))
            if w.values.shape[1] * group != c:
                return "channel-mismatch"
            if group == 1:
                depthwise = False
                w_max = np.maximum(w_max, np.abs(w.values).reshape(w.shape[0], c, -1)
                                   .max(axis=(0, 2)))
            elif group == c and w.values.shape[1] == 1:
                per_out = np.abs(w.values).reshape(w.shape[0], -1).max(axis=1)
                w_max = np.maximum(w_max, per_out.reshape(c, -1).max(axis=1))
            else:
                return "grouped-conv"
        if not np.any(a > 0):
            return "all-zero-activation"
        if depthwise:
            s = a / a.max()
        else:
            s = a ** alpha / np.maximum(w_max, 1e-12) ** (1 - alpha)
            s = s / s.max()
        if not np.all(np.isfinite(s)):
            # a NaN weight or an infinite range: s would carry it to every channel (x * NaN)
            return "not-finite"
        grown = a / np.maximum(s, MIN_SCALE)   # the input, scaled by 1/s before its convs
        if not np.isfinite(grown).all() or grown.max() > np.finfo(np.float32).max / 1024:
            return "near-overflow"   # inf where the original was finite (fuzz, seed 61408)
        s = np.maximum(s, MIN_SCALE)
        if np.all(s == 1.0):
            # one input channel (a spectrogram's Unsqueeze), or ranges already even: a Mul
            # by 1 that a second rewrite's collapse-chains removed (not a fixed point)
            return "unit-scales"
        if self._fold_into_producer(graph, x, convs, s, ctx, res):
            xs = x
        else:
            xs = self._insert_mul(graph, x, convs, s, ctx)
            res.count("mul-inserted")
        for conv in convs:
            group = int(conv.attrs.get("group", 1))
            w = conv.inputs[1].values.astype(np.float64)
            if group == 1:
                w = w * s.reshape((1, c) + (1,) * (w.ndim - 2))
            else:   # depthwise: output channel k reads input channel k // multiplier
                mult = w.shape[0] // c
                w = w * np.repeat(s, mult).reshape((-1,) + (1,) * (w.ndim - 1))
            own_constant(conv, 1, w.astype(conv.inputs[1].values.dtype), ctx.namer,
                         "equalized")
            conv.inputs[0] = xs
        return None

    def _fold_into_producer(self, graph, x, convs, s, ctx, res) -> bool:
        """Scale the producing conv's rows and bias by 1/s when that is exact and nothing
        but these convs reads x (and, through a Relu, nothing else reads the conv): not a
        graph output either, whose values the scaling would change (a feature map a model
        returns beside its head)."""
        outs = {id(t) for t in graph.outputs}
        if len(x.outputs) != len(convs) or not x.inputs or id(x) in outs:
            return False
        # The scaled tensor itself within float16 (a Mul in its place would overflow in an
        # FP16 region otherwise): then the producer's growth past it is what to avoid.
        fits = np.max(ctx.channel_stats[x.name].absmax / s) <= FP16_SAFE
        y = pre_activation(x)
        if y is not None:
            if id(y) in outs:
                return False
            pre = ctx.channel_stats.get(y.name)
            if fits and pre is not None and len(pre.absmax) == len(s) and \
                    np.max(pre.absmax / s) > FP16_SAFE >= np.max(pre.absmax):
                res.skip("pre-activation-growth")
                return False
            conv = y.inputs[0]
        else:
            conv = x.inputs[0]
        if conv.op == "BatchNormalization":
            return self._fold_into_bn(conv, s, ctx, res, fits)
        if conv.op not in ("Conv", "ConvTranspose") or not isinstance(conv.inputs[1],
                                                                       gs.Constant):
            return False
        group = int(conv.attrs.get("group", 1))
        w = conv.inputs[1].values.astype(np.float64)
        if conv.op == "ConvTranspose":
            # its output channel g * (C_out / group) + j is W[g's input rows, j]
            if w.ndim < 3 or w.shape[0] % group or w.shape[1] * group != len(s):
                return False
            rows = s.reshape(group, 1, -1, *(1,) * (w.ndim - 2))
            w = (w.reshape(group, w.shape[0] // group, *w.shape[1:]) / rows).reshape(w.shape)
        elif (group != 1 and group != len(s)) or w.shape[0] != len(s):
            return False
        else:
            w = w / s.reshape((-1,) + (1,) * (w.ndim - 1))
        b = (conv.inputs[2].values.astype(np.float64) / s
             if len(conv.inputs) > 2 and isinstance(conv.inputs[2], gs.Constant) else None)
        if len(conv.inputs) > 2 and b is None:
            return False
        if near_overflow(w, conv.inputs[1].values.dtype) or (
                b is not None and near_overflow(b, conv.inputs[2].values.dtype)):
            return False   # weights of 1.6e37 grown by 1/s: inf (fuzz, seed 61408)
        if fits and (_past_fp16(w, conv.inputs[1].values) or (
                b is not None and _past_fp16(b, conv.inputs[2].values))):
            res.skip("weight-growth")
            return False
        own_constant(conv, 1, w.astype(conv.inputs[1].values.dtype), ctx.namer, "equalized")
        if b is not None:
            own_constant(conv, 2, b.astype(conv.inputs[2].values.dtype), ctx.namer,
                         "equalized")
        res.count("folded-into-producer")
        return True

    def _fold_into_bn(self, bn, s, ctx, res, fits: bool) -> bool:
        """BN(x) / s is BN with scale and bias / s: a pre-activation block's BN -> Conv
        (OpenSpindleNet) took a Mul, which a second rewrite's fuse-conv-bn merged with
        the BN into Mul+Add (a plan's output was not a fixed point)."""
        params = bn.inputs[1:5]
        if len(params) < 4 or not all(isinstance(p, gs.Constant) for p in params) or any(
                p.values.shape != s.shape for p in params) or any(
                t.outputs for t in bn.outputs[1:]):
            return False
        new = [bn.inputs[i].values.astype(np.float64) / s for i in (1, 2)]
        if any(near_overflow(v, bn.inputs[i].values.dtype) for i, v in zip((1, 2), new)):
            return False   # as for a conv's weights: the Mul goes in instead
        if fits and any(_past_fp16(v, bn.inputs[i].values) for i, v in zip((1, 2), new)):
            res.skip("weight-growth")
            return False
        for i, v in zip((1, 2), new):
            own_constant(bn, i, v.astype(bn.inputs[i].values.dtype), ctx.namer, "equalized")
        res.count("folded-into-producer")
        return True

    def _insert_mul(self, graph, x, convs, s, ctx) -> gs.Variable:
        rank = len(x.shape) if x.shape is not None else len(convs[0].inputs[1].shape)
        inv = (1.0 / s).reshape((1, -1) + (1,) * (rank - 2)).astype(np.float32)
        t = x.inputs[0] if len(x.inputs) == 1 else None
        if (t is not None and t.op == "Transpose" and t.domain in (None, "", "ai.onnx")
                and len(t.attrs.get("perm", ())) == rank and x not in graph.outputs
                and all(any(r is c for c in convs) for r in x.outputs)):
            # Only these convs read the Transpose: the Mul goes before it, its scales
            # permuted, which is where a second rewrite's sink-transposes moved it
            # (ConvNeXt's LayerNorm -> Transpose, BlazeFace's input Transpose: not a
            # fixed point)
            u = t.inputs[0]
            perm = [int(a) for a in t.attrs["perm"]]
            out = gs.Variable(ctx.namer(f"{u.name}_equalized"), dtype=u.dtype, shape=u.shape)
            graph.nodes.append(gs.Node("Mul", ctx.namer(f"{x.name}_Equalize"), inputs=[
                u, gs.Constant(ctx.namer(f"{x.name}_equalize"),
                               np.ascontiguousarray(np.transpose(inv, np.argsort(perm))))],
                outputs=[out]))
            t.inputs[0] = out
            return x
        out = gs.Variable(ctx.namer(f"{x.name}_equalized"), dtype=x.dtype, shape=x.shape)
        graph.nodes.append(gs.Node("Mul", ctx.namer(f"{x.name}_Equalize"), inputs=[
            x, gs.Constant(ctx.namer(f"{x.name}_equalize"), inv)], outputs=[out]))
        return out
