"""fuse-conv-bn: fold inference BatchNormalization (and per-channel scale/shift) into convs.

Before -> after::

    x -> Conv(W, b) -> BatchNormalization(g, beta, m, v) -> Relu -> y
    x -> Conv(W', b')                                    -> Relu -> y

    x -> Conv(W, b) -> Mul(c) -> Add(d) -> y      =>   x -> Conv(W*c, b*c + d) -> y

The algebra, per output channel k, computed in float64 and stored in W's dtype::

    s_k  = g_k / sqrt(v_k + eps)
    W'_k = W_k * s_k
    b'_k = (b_k - m_k) * s_k + beta_k

For ConvTranspose the output channel is axis 1 of W (per group). Per-channel Mul/Div by
a constant c scales W and b; Add/Sub of a constant d shifts b. Chains are absorbed until
the conv's output reaches anything else, so the activation (Relu, Clip, HardSwish, ...)
ends up directly after the conv, where MIGraphX (rocMLIR/MIOpen) fuses conv+bias+act.

A Mul by a constant per input channel (or a scalar) whose result only convs read as their
data goes into their weights (``scale-into-next-conv``): Conv(x * c, W) = Conv(x, W * c), zero
padding included. GELU's trailing Mul by 0.5 before a conv is the common case. The same
before MatMul/Gemm with a constant weight, c over x's last axis (``scale-into-next-matmul``):
MatMul(x * c, W) = MatMul(x, W * c[:, None]), a transformer MLP's fc2. Not a float16 c
(``float16-scale``): a plan's FP16 region, whose weights were rounded once already; rounded
again, they move a Q/DQ model's QuantizeLinear roundings downstream by whole steps
(BlazeFace's --plan auto output rewritten again: max_rel 3.6e-2, --verify exit 1).

Parallel branches of one input added together, as RepVGG/MobileOne blocks are exported
before re-parameterisation, become one conv (``merged-branches``): Add(Conv_a(x), Conv_b(x))
with one kernel centred in the other (same stride, dilation, group) is a Conv with
Wa + pad(Wb), and Add(Conv(x), BN(x)) puts the BN's scale on each channel's centre tap
(stride 1, as many outputs as inputs per group).

A BatchNormalization over the last axis of a MatMul with a constant weight (directly on a
2-D MatMul, or through a Flatten that keeps the last axis: timm's LinearNorm) goes into the
weight's columns and one Add after the MatMul (``fused-bn-after-matmul``); after a Gemm
(torch's Linear then BatchNorm1d) into its weight and bias, no Add. Not when the MatMul's
output is a graph output too: it would change with the weight.

A BatchNormalization that does not follow a conv (DenseNet's BN after Concat) but is
followed by per-channel Mul/Add becomes one Mul and one Add with per-channel constants, the
chain merged into them (fewer nodes); a BN followed by nothing it can merge with stays as it
is (Mul+Add would be one node more; MIGraphX decomposes BN into them at parse time anyway).

A BatchNormalization (with the per-channel Mul/Add after it) read only by convs without
padding goes into their weights and biases (``bn-into-next-conv``): Conv(x * s + t, W, b)
= Conv(x, W * s, b + sum(W * t)); with padding the shift would reach the zero border, so a
padded conv keeps it (MaxViT's MBConv pre-norm BN before its 1x1 conv).

Preconditions (else skipped with a reason in the report):

* the conv output feeds only this BN/Mul/Add and is not a graph output;
* W, b and the BN parameters are constants, or W is a weight-only int8 export's
  ``Cast(q) -> Mul(c)`` with c per output channel, read by this Conv alone: the scale goes
  into c, q stays as stored (folding W would store it 4x larger; fold-constants keeps it);
  BN is in inference mode (no training_mode,
  no used mean/var outputs, spatial=1 in old opsets);
* the constant of Mul/Add broadcasts per channel only (shape [K,1,..], [1,K,1,..] or a
  scalar), so the result does not change shape;
* a float dtype;
* var + epsilon > 0 for every channel (otherwise BN outputs NaN and stays as it is);
* the weights, before and after folding, stay below sqrt(max) of their dtype (1.8e19 for
  float32, 256 for float16): near the top of the range the conv's sums overflow, and
  folding would move which ones do (skip:weights-near-overflow).

A weight shared by several convs is copied for the conv being changed, never edited in
place; the conv keeps its name so plans naming it stay valid, and the BN's output tensor
name is kept (it becomes the conv's output), so graph outputs and downstream names survive.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import (bypass, cast_chain, iter_graphs, near_overflow, own_constant,
                                 peek_values)
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

CONVS = ("Conv", "ConvTranspose")
AFFINE = ("Mul", "Div", "Add", "Sub")
# Activations MIGraphX fuses into a conv epilogue; counted to show the fused pairs.
ACTIVATIONS = ("Relu", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish", "Sigmoid", "Tanh",
               "Elu", "Selu", "PRelu")


class FuseConvBn(Pass):
    name = "fuse-conv-bn"
    phase = Phase.FUSE
    numerics = Numerics.CLOSE
    summary = "fold BatchNorm and per-channel Mul/Add into Conv weights; keep the activation next"

    def needs_shapes(self, model) -> bool:
        # Only a BatchNormalization that does not follow a conv needs its input's rank.
        prod = {o: n.op_type for n in model.graph.node for o in n.output}
        return any(n.op_type == "BatchNormalization" and prod.get(n.input[0]) not in CONVS
                   for n in model.graph.node) or any(
            a.type in (a.GRAPH, a.GRAPHS) for n in model.graph.node for a in n.attribute)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        self._reported: set[int] = set()  # BNs whose skip reason is already counted
        self._keep: set[int] = set()  # BNs to leave exactly as they are
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            local = {id(n) for n in g.nodes}
            for node in _onnx_nodes(g):
                if node.op in CONVS and node.outputs:
                    self._absorb_into_conv(node, g, outs, local, ctx, res)
            for node in _onnx_nodes(g):
                if node.op == "BatchNormalization" and node.outputs:
                    self._bn_after_matmul(node, g, outs, ctx, res)
            for node in _onnx_nodes(g):
                if node.op == "Add" and node.outputs:
                    self._merge_branches(node, outs, ctx, res)
            for node in _onnx_nodes(g):
                if node.op == "BatchNormalization" and node.outputs:
                    self._standalone_bn(node, g, outs, local, ctx, res)
            for node in _onnx_nodes(g):
                if node.op == "Mul" and node.outputs:
                    self._scale_into_next_convs(node, outs, ctx, res)
                if node.op == "Mul" and node.outputs:
                    self._scale_into_next_matmuls(node, outs, ctx, res)
            res.counts["conv+activation pairs"] = (res.counts.get("conv+activation pairs", 0)
                                                   + _count_pairs(g))
        return res

    # ------------------------------------------------------------------ conv head
    def _absorb_into_conv(self, conv, g, outs, local, ctx, res):
        w = conv.inputs[1] if len(conv.inputs) > 1 else None
        deq = None if isinstance(w, gs.Constant) else _weight_dequantized(conv, outs)
        if not isinstance(w, gs.Constant) and deq is None:
            self._note_blocked(conv, res, "weights-not-constant")
            return
        b = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2].name else None
        if b is not None and not isinstance(b, gs.Constant):
            self._note_blocked(conv, res, "bias-not-constant")
            return
        if (deq[1] if deq else w).values.dtype.kind != "f":
            self._note_blocked(conv, res, "unsupported-dtype")
            return
        if deq:
            w = deq[2]   # the stored (integer) weight: its shape, and the bound on |W|
        group = int(conv.attrs.get("group", 1))
        k = w.shape[1] * group if conv.op == "ConvTranspose" else w.shape[0]
        scale = np.ones(k, dtype=np.float64)
        shift = np.zeros(k, dtype=np.float64)
        absorbed = []
        y = conv.outputs[0]
        rank = len(w.shape)
        while True:
            if len(y.outputs) != 1:
                if any(n.op == "BatchNormalization" for n in y.outputs):
                    res.skip("conv-output-has-other-consumers")
                break
            nxt = y.outputs[0]
            if id(nxt) not in local:
                break
            if id(y) in outs:
                if nxt.op == "BatchNormalization":
                    res.skip("conv-output-is-graph-output")
                break
            if nxt.op == "BatchNormalization":
                st, reason = _bn_affine(nxt, k, g.opset)
            elif nxt.op in AFFINE:
                st, reason = _channel_affine(nxt, y, k, rank)
                if reason:  # a Mul/Add that is not per-channel simply ends the chain
                    break
            else:
                break
            if reason:
                res.skip(reason)
                self._reported.add(id(nxt))
                break
            s, t = st
            scale, shift = scale * s, shift * s + t
            absorbed.append(nxt)
            y = nxt.outputs[0]
        if not absorbed:
            return
        if deq:
            self._into_dequantization(conv, deq, b, scale, shift, absorbed, ctx, res)
            return
        dtype = w.values.dtype
        # float32 weights are scaled in float32 by the float64 scale rounded once (as
        # onnxruntime folds BN; within an ulp of the float64 product, and half the memory
        # traffic on big convs); float16/bfloat16 go through float64.
        work = np.float32 if dtype == np.float32 else np.float64
        wv = w.values.astype(work, copy=False)
        sw = scale.astype(work)
        if conv.op == "ConvTranspose":
            cin = wv.shape[0]
            wv = wv.reshape((group, cin // group, k // group) + wv.shape[2:])
            wv = wv * sw.reshape((group, 1, k // group) + (1,) * (rank - 2))
            wv = wv.reshape((cin, k // group) + wv.shape[3:])
        else:
            wv = wv * sw.reshape((k,) + (1,) * (rank - 1))
        bv = (b.values.astype(np.float64) if b is not None else np.zeros(k)) * scale + shift
        # Weights near the top of the dtype's range: the conv's sums overflow in the original
        # already, and folding moves which ones do (inf where BN gave a finite value, or the
        # reverse). Real weights are nowhere near; a broken or hostile file is. The bound
        # max|W| * max|scale| spares a pass over the folded weights when it is far below.
        limit = float(np.finfo(dtype).max) ** 0.5
        wvals = w.values   # max|W| without an |W| temporary (NaN propagates as before)
        w_max = float(np.maximum(wvals.max(), -wvals.min())) if wvals.size else 0.0
        bound = w_max * float(np.abs(scale).max(initial=0))
        if not (np.isfinite(bound) and bound < 0.5 * limit):
            bound = float(np.abs(wv).max(initial=0)) if np.isfinite(wv).all() else np.inf
        if not (np.isfinite(bound) and np.isfinite(bv).all()) or max(
                bound, w_max, float(np.abs(bv).max(initial=0))) > limit:
            res.skip("weights-near-overflow")
            self._keep.update(id(n) for n in absorbed)  # not as Mul+Add either
            return
        own_constant(conv, 1, wv.astype(dtype, copy=False), ctx.namer, "fused")
        self._finish(conv, w, b, bv.astype(dtype), absorbed, ctx, res)

    def _into_dequantization(self, conv, deq, b, scale, shift, absorbed, ctx, res):
        """W = Cast(q) * c with c per output channel: the chain's scale goes into c, its
        shift into the bias; q stays as stored (int8 on disk, the size it was)."""
        mul, c, q = deq
        dtype = c.values.dtype
        cv = np.broadcast_to(c.values.astype(np.float64).reshape(-1), scale.shape) * scale
        bv = (b.values.astype(np.float64) if b is not None else np.zeros(len(scale))) * scale
        bv = bv + shift
        q_max = float(np.abs(peek_values(q)).max(initial=0))
        if near_overflow(cv * q_max, dtype) or near_overflow(bv, dtype):
            res.skip("weights-near-overflow")
            self._keep.update(id(n) for n in absorbed)
            return
        i = next(i for i, t in enumerate(mul.inputs) if t is c)
        own_constant(mul, i, cv.reshape((-1,) + (1,) * (len(q.shape) - 1)).astype(dtype),
                     ctx.namer, "fused")
        self._finish(conv, q, b, bv.astype(dtype), absorbed, ctx, res)

    def _finish(self, conv, w, b, bv, absorbed, ctx, res):
        """The new bias in, the absorbed nodes out; the conv takes the chain's output."""
        if b is not None:
            own_constant(conv, 2, bv, ctx.namer, "fused")
        else:
            while len(conv.inputs) < 2:
                conv.inputs.append(gs.Variable(""))
            new_b = gs.Constant(ctx.namer(f"{w.name}_bias"), bv)
            if len(conv.inputs) == 2:
                conv.inputs.append(new_b)
            else:
                conv.inputs[2] = new_b
        # The conv takes over the last absorbed node's output tensor (its name survives).
        last_out = absorbed[-1].outputs[0]
        for n in absorbed:
            n.outputs.clear()
            n.inputs.clear()
        conv.outputs[0] = last_out
        res.count("fused-bn", sum(n.op == "BatchNormalization" for n in absorbed))
        res.count("fused-scale-shift", sum(n.op != "BatchNormalization" for n in absorbed))
        res.changed = True

    # ------------------------------------------------------------------ scale before convs
    def _scale_into_next_convs(self, mul, outs, ctx, res):
        """x -> Mul(c) -> Conv(W) ... with c a constant per input channel (or a scalar) and
        the Mul read only by convs as their data: Conv(x, W * c) for each (zero padding
        stays zero, so it is exact up to rounding). GELU's trailing Mul by 0.5 before a
        conv is the common case."""
        found = _constant_mul(mul, outs)
        if found is None:
            return
        x, c, y = found
        if c.values.dtype.itemsize < 4:
            # float16 weights (a plan's FP16 region) would be rounded a second time: in a
            # Q/DQ model that moves QuantizeLinear roundings downstream by whole steps
            res.skip("float16-scale")
            return
        convs = list({id(n): n for n in y.outputs}.values())
        if any(n.op != "Conv" or n.inputs[0] is not y or y in n.inputs[1:]
               or not isinstance(n.inputs[1], gs.Constant)
               or n.inputs[1].values.dtype != c.values.dtype for n in convs):
            return
        v = c.values
        rank = len(convs[0].inputs[1].shape)
        cin = {int(n.inputs[1].shape[1]) * int(n.attrs.get("group", 1)) for n in convs}
        if v.ndim > rank or len(cin) != 1 or any(len(n.inputs[1].shape) != rank for n in convs):
            return
        cin = cin.pop()
        full = (1,) * (rank - v.ndim) + tuple(v.shape)
        if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, cin):
            return
        if full[1] != 1 and (x.shape is None or len(x.shape) != rank or x.shape[1] != cin):
            return   # x might have one channel that the Mul broadcasts: keep it
        vec = np.broadcast_to(v.astype(np.float64).reshape(-1), (cin,))
        new = []
        for conv in convs:
            w = conv.inputs[1]
            group = int(conv.attrs.get("group", 1))
            k, per = w.shape[0], w.shape[1]
            # output channel o reads input channels (o // (k / group)) * per + j
            f = vec.reshape(group, per)[np.arange(k) // (k // group)]
            wv = w.values.astype(np.float64) * f.reshape((k, per) + (1,) * (rank - 2))
            if near_overflow(wv, w.values.dtype):
                res.skip("weights-near-overflow")
                return
            new.append(wv.astype(w.values.dtype))
        _read_x_scaled(mul, x, convs, new, ctx, res, "scale-into-next-conv")

    def _scale_into_next_matmuls(self, mul, outs, ctx, res):
        """x -> Mul(c) -> MatMul(., W) (or Gemm without transA) with c a constant over x's
        last axis (or a scalar) and the Mul read only by such layers as their data:
        MatMul(x, W * c[:, None]). A transformer MLP's GELU ends in a Mul by 0.5 before
        fc2 (ViT, DeiT, Swin: 12 each, eleventh round)."""
        found = _constant_mul(mul, outs)
        if found is None:
            return
        x, c, y = found
        if c.values.dtype.itemsize < 4:
            return      # as before a conv (counted there: both look at every Mul)
        layers = list({id(n): n for n in y.outputs}.values())

        def weight_axis(n):   # W's K axis (the one x's last axis meets), or None
            if (len(n.inputs) < 2 or n.inputs[0] is not y or y in n.inputs[1:]
                    or not isinstance(n.inputs[1], gs.Constant)
                    or n.inputs[1].values.ndim != 2
                    or n.inputs[1].values.dtype != c.values.dtype):
                return None
            if n.op == "MatMul":
                return 0
            if n.op == "Gemm" and not int(n.attrs.get("transA", 0)):
                return 1 if int(n.attrs.get("transB", 0)) else 0
            return None

        axes = [weight_axis(n) for n in layers]
        if any(a is None for a in axes):
            return
        v = c.values
        ks = {int(n.inputs[1].values.shape[a]) for n, a in zip(layers, axes)}
        if len(ks) != 1:
            return
        k = ks.pop()
        rank = len(x.shape) if x.shape is not None else None
        if v.ndim >= 2 and (rank is None or v.ndim > rank):
            return   # the Mul might add dims to x
        if v.size > 1 and (any(d != 1 for d in v.shape[:-1]) or v.shape[-1] != k
                           or not rank or x.shape[-1] != k):
            return   # not per K, or x may broadcast up to K (a 0-d x: no last axis)
        if any(n.op == "Gemm" for n in layers) and (rank != 2 or v.ndim > 2):
            return
        vec = np.broadcast_to(v.astype(np.float64).reshape(-1), (k,))
        new = []
        for n, a in zip(layers, axes):
            w = n.inputs[1].values
            wv = w.astype(np.float64) * (vec[:, None] if a == 0 else vec[None, :])
            if near_overflow(wv, w.dtype):
                res.skip("weights-near-overflow")
                return
            new.append(wv.astype(w.dtype))
        _read_x_scaled(mul, x, layers, new, ctx, res, "scale-into-next-matmul")

    def _bn_after_matmul(self, bn, g, outs, ctx, res):
        """MatMul(x, W[K, C]) -> [Flatten to [M, C] ->] BatchNormalization over C: the BN's
        scale goes into W's columns and its shift becomes an Add right after the MatMul
        (MatMul(x, W * s) + t). timm's LinearNorm (LeViT: 46 of them, eleventh round)."""
        z = bn.inputs[0]
        c = _channels(bn)
        # z also a graph output would change with the weight
        if c is None or len(z.inputs) != 1 or len(z.outputs) != 1 or id(z) in outs:
            return
        p = z.inputs[0]
        flat = None
        if p.op == "Flatten":
            if id(bn.outputs[0]) in outs:
                return
            flat, y = p, p.inputs[0]
            rank = len(y.shape) if y.shape is not None else None
            # y may also be read by Shape nodes (reshape_as(y) after the BN): its shape
            # is the same once the Add writes it; any other reader would see the shift.
            if rank is None or int(p.attrs.get("axis", 1)) % max(rank, 1) != rank - 1 \
                    or len(y.inputs) != 1 or id(y) in outs \
                    or any(r is not flat and r.op != "Shape" for r in y.outputs):
                return
            p = y.inputs[0]
        else:
            y = z
            if p.op == "Gemm":
                self._bn_into_gemm(bn, p, c, ctx, res)
                return
            if z.shape is None or len(z.shape) != 2:
                return   # BN's channel axis is 1: the MatMul's last axis only when 2-D
        if (p.op != "MatMul" or len(p.inputs) != 2 or p.inputs[0] is y
                or not isinstance(p.inputs[1], gs.Constant) or p.inputs[1].values.ndim != 2
                or int(p.inputs[1].values.shape[1]) != c or isinstance(p.inputs[0], gs.Constant)):
            return
        st, reason = _bn_affine(bn, c, 0)
        w = p.inputs[1].values
        if reason or w.dtype.kind != "f" or bn.inputs[1].values.dtype != w.dtype:
            return
        scale, shift = st
        wv = w.astype(np.float64) * scale[None, :]
        if near_overflow(wv, w.dtype):
            res.skip("weights-near-overflow")
            return
        own_constant(p, 1, wv.astype(w.dtype), ctx.namer, "fused")
        t = gs.Constant(ctx.namer(f"{bn.name or y.name}_shift"), shift.astype(w.dtype))
        out = bn.outputs[0]
        if flat is None:   # MatMul -> Add, which writes the BN's output (its name stays)
            bn.inputs.clear()
            bn.outputs.clear()
            g.nodes.append(gs.Node("Add", ctx.namer(f"{out.name}_add"), inputs=[z, t],
                                   outputs=[out]))
        else:   # MatMul -> Add -> Flatten (-> the BN's readers): the shift broadcasts on C
            raw = gs.Variable(ctx.namer(f"{y.name}_raw"), dtype=y.dtype, shape=y.shape)
            p.outputs[0] = raw
            g.nodes.append(gs.Node("Add", ctx.namer(f"{bn.name or y.name}_add"),
                                   inputs=[raw, t], outputs=[y]))
            bypass(bn, g, outs)   # the BN is an identity now: its readers read z
        res.count("fused-bn-after-matmul")
        res.changed = True

    def _bn_into_gemm(self, bn, gemm, c, ctx, res):
        """Gemm(A, B, C) -> BatchNormalization: torch's Linear then BatchNorm1d (a face
        embedder's or a landmark regressor's head). Y = alpha A B + beta C is [M, N] and the
        BN's channel axis is N, so s goes into B's N axis and the bias becomes beta C s + t
        (beta 1 then, C broadcast to [N] at least); the Gemm writes the BN's output."""
        a, b = gemm.inputs[0], gemm.inputs[1]
        bias = gemm.inputs[2] if len(gemm.inputs) > 2 and gemm.inputs[2].name else None
        if (isinstance(a, gs.Constant) or not isinstance(b, gs.Constant) or b.values.ndim != 2
                or not (bias is None or isinstance(bias, gs.Constant))):
            return
        trans_b = int(gemm.attrs.get("transB", 0))
        w = b.values
        if int(w.shape[0 if trans_b else 1]) != c:
            return
        st, reason = _bn_affine(bn, c, 0)
        if reason or w.dtype.kind != "f" or bn.inputs[1].values.dtype != w.dtype:
            return
        scale, shift = st
        wv = w.astype(np.float64) * (scale[:, None] if trans_b else scale[None, :])
        cv = shift if bias is None else (float(gemm.attrs.get("beta", 1.0)) * scale
                                         * bias.values.astype(np.float64) + shift)
        if near_overflow(wv, w.dtype) or near_overflow(cv, w.dtype):
            res.skip("weights-near-overflow")
            return
        own_constant(gemm, 1, wv.astype(w.dtype), ctx.namer, "fused")
        if bias is None:
            t = gs.Constant(ctx.namer(f"{bn.name or bn.outputs[0].name}_shift"), cv.astype(w.dtype))
            if len(gemm.inputs) > 2:   # an empty optional C
                gemm.inputs[2] = t
            else:
                gemm.inputs.append(t)
        else:
            own_constant(gemm, 2, cv.astype(w.dtype), ctx.namer, "fused")
        gemm.attrs["beta"] = 1.0
        out = bn.outputs[0]
        bn.inputs.clear()
        bn.outputs.clear()
        gemm.outputs[0] = out
        res.count("fused-bn-after-matmul")
        res.changed = True

    def _merge_branches(self, add, outs, ctx, res):
        """Add(Conv_a(x), Conv_b(x)) over the same x, one kernel centred in the other (same
        stride, dilation and group; pads differing by half the kernel difference): one
        Conv with Wa + pad(Wb) and ba + bb. Add(Conv(x), BN(x)) likewise, the BN's scale
        on the centre tap of each channel's own input (stride 1, as many outputs as
        inputs per group). RepVGG/MobileOne blocks not re-parameterised (22 and 17 in
        RepVGG-A0, eleventh round)."""
        if len(add.inputs) != 2:
            return   # (the merged conv takes over the Add's output, a graph output too)
        a, b = (t.inputs[0] if len(t.inputs) == 1 and len(t.outputs) == 1
                and id(t) not in outs else None for t in add.inputs)
        if a is None or b is None or a is b:
            return
        if a.op != "Conv" and b.op == "Conv":
            a, b = b, a
        if a.op != "Conv" or not _plain_conv(a):
            return
        x, w = a.inputs[0], a.inputs[1].values
        rank = w.ndim - 2
        if b.op == "Conv" and _plain_conv(b) and b.inputs[0] is x \
                and w.dtype == b.inputs[1].values.dtype:
            merged = _embed(a, b)
            if merged is None:
                merged = _embed(b, a)
                if merged is None:
                    return
                a, b = b, a
            wv, pads = merged
        elif b.op == "BatchNormalization" and b.inputs[0] is x:
            st, reason = _bn_affine(b, w.shape[0], 0)
            group = int(a.attrs.get("group", 1))
            k, per = w.shape[0], w.shape[1]
            if (reason or k != per * group or any(int(v) != 1 for v in _ints(a, "strides",
                                                                              rank))
                    or any(d % 2 == 0 for d in w.shape[2:]) or not _centred(a, rank)):
                return
            wv = w.astype(np.float64)
            centre = tuple(d // 2 for d in w.shape[2:])
            o = np.arange(k)
            wv[(o, o % per) + centre] += st[0]
            pads = None
        else:
            return
        bias = (a.inputs[2].values.astype(np.float64) if len(a.inputs) > 2
                else np.zeros(w.shape[0]))
        if b.op == "Conv":
            bias = bias + (b.inputs[2].values.astype(np.float64) if len(b.inputs) > 2
                           else 0.0)
        else:
            bias = bias + st[1]
        if near_overflow(wv, w.dtype) or near_overflow(bias, w.dtype):
            res.skip("weights-near-overflow")
            return
        own_constant(a, 1, wv.astype(w.dtype), ctx.namer, "merged")
        if len(a.inputs) > 2:
            own_constant(a, 2, bias.astype(w.dtype), ctx.namer, "merged")
        else:
            a.inputs.append(gs.Constant(ctx.namer(f"{a.inputs[1].name}_bias"),
                                        bias.astype(w.dtype)))
        if pads is not None:
            a.attrs["pads"] = pads
            a.attrs["kernel_shape"] = list(wv.shape[2:])
        out = add.outputs[0]
        for n in (add, b):
            n.inputs.clear()
            n.outputs.clear()
        a.outputs[0] = out
        res.count("merged-branches")
        res.changed = True

    def _note_blocked(self, conv, res, reason):
        y = conv.outputs[0]
        if len(y.outputs) == 1 and y.outputs[0].op == "BatchNormalization":
            res.skip(reason)
            self._reported.add(id(y.outputs[0]))

    # ------------------------------------------------------------------ BN alone
    def _standalone_bn(self, bn, g, outs, local, ctx, res):
        if id(bn) in self._keep:
            return
        x = bn.inputs[0]
        c = _channels(bn)
        st, reason = _bn_affine(bn, c, g.opset) if c is not None else (None, "bn-params-not-constant")
        if reason:
            if id(bn) not in self._reported:
                res.skip(reason)
            return
        if x.shape is None or len(x.shape) < 2:
            res.skip("bn-input-rank-unknown")
            return
        rank = len(x.shape)
        scale, shift = st
        y = bn.outputs[0]
        absorbed = [bn]
        while len(y.outputs) == 1 and id(y) not in outs and id(y.outputs[0]) in local:
            nxt = y.outputs[0]
            if nxt.op not in AFFINE:
                break
            st2, reason = _channel_affine(nxt, y, c, rank)
            if reason:
                break
            s, t = st2
            scale, shift = scale * s, shift * s + t
            absorbed.append(nxt)
            y = nxt.outputs[0]
        convs = _pad_free_readers(y, outs, c, rank)
        if convs:
            self._affine_into_next_convs(absorbed, x, convs, scale, shift, rank, ctx, res)
            return
        if len(absorbed) == 1:   # nothing to merge with: Mul+Add would be one node more
            return
        # The data's type, not the statistics': from opset 15 an fp16 BN may carry fp32
        # scale/mean/var, and Mul/Add need both operands of one type.
        dtype = np.dtype(x.dtype if x.dtype is not None else bn.inputs[1].values.dtype)
        shape = (c,) + (1,) * (rank - 2)
        sc = gs.Constant(ctx.namer(f"{bn.inputs[1].name}_scale"), scale.reshape(shape).astype(dtype))
        sh = gs.Constant(ctx.namer(f"{bn.inputs[2].name}_shift"), shift.reshape(shape).astype(dtype))
        mid = gs.Variable(ctx.namer(f"{y.name}_scaled"), dtype=x.dtype, shape=x.shape)
        last_out = absorbed[-1].outputs[0]
        for n in absorbed:
            n.outputs.clear()
            n.inputs.clear()
        base = bn.name or last_out.name
        g.nodes.append(gs.Node("Mul", ctx.namer(f"{base}_mul"), inputs=[x, sc], outputs=[mid]))
        g.nodes.append(gs.Node("Add", ctx.namer(f"{base}_add"), inputs=[mid, sh], outputs=[last_out]))
        res.count("bn-to-scale-shift")
        res.changed = True

    def _affine_into_next_convs(self, absorbed, x, convs, scale, shift, rank, ctx, res):
        """x -> BN (-> Mul/Add per channel) read only by convs without padding:
        Conv(x * s + t, W, b) = Conv(x, W * s, b + sum(W * t)) (MaxViT's MBConv pre-norm
        before its 1x1 conv, 11 BNs a float32 island each under --plan fp16)."""
        new = []
        for conv in convs:
            w = conv.inputs[1]
            group = int(conv.attrs.get("group", 1))
            k, per = w.shape[0], w.shape[1]
            rows = np.arange(k) // (k // group)   # output o reads inputs rows[o]*per + j
            f = (k, per) + (1,) * (rank - 2)
            wv = w.values.astype(np.float64)
            s = scale.reshape(group, per)[rows].reshape(f)
            t = shift.reshape(group, per)[rows].reshape(f)
            bv = (conv.inputs[2].values.astype(np.float64) if len(conv.inputs) > 2
                  else np.zeros(k))
            bv = bv + (wv * t).reshape(k, -1).sum(1)
            wv = wv * s
            if near_overflow(wv, w.values.dtype) or near_overflow(bv, w.values.dtype):
                res.skip("weights-near-overflow")
                return
            new.append((wv.astype(w.values.dtype), bv.astype(w.values.dtype)))
        for conv, (wv, bv) in zip(convs, new):
            own_constant(conv, 1, wv, ctx.namer, "scaled")
            if len(conv.inputs) > 2:   # a constant (_plain_conv)
                own_constant(conv, 2, bv, ctx.namer, "shifted")
            else:
                conv.inputs.append(gs.Constant(ctx.namer(f"{conv.name}_bias"), bv))
            conv.inputs[0] = x
        for n in absorbed:
            n.outputs.clear()
            n.inputs.clear()
        res.count("bn-into-next-conv")
        res.changed = True


def _onnx_nodes(g) -> list:
    """The graph's nodes of ONNX's own domain, a list taken now (each stage sees what the
    stages before it made): a custom domain's 'Conv' with one input is not a convolution
    (fuse-conv-bn read its weight: exit 3, fuzz seed 61722)."""
    return [n for n in g.nodes if n.domain in (None, "", "ai.onnx")]


def _pad_free_readers(y, outs, k, rank) -> list:
    """The convs reading ``y`` (k channels) as their data, when nothing else reads it and
    none pads (a shift before a padded conv would reach its zero border): [] otherwise."""
    convs = list({id(n): n for n in y.outputs}.values())
    if id(y) in outs or not convs or any(
            n.op != "Conv" or not _plain_conv(n) or n.inputs[0] is not y
            or y in n.inputs[1:] or len(n.inputs[1].shape) != rank
            or n.inputs[1].values.dtype.itemsize < 4
            or int(n.inputs[1].shape[1]) * int(n.attrs.get("group", 1)) != k
            or any(_ints(n, "pads", 2 * (rank - 2), 0))
            for n in convs):
        return []
    return convs


def _channels(bn) -> int | None:
    params = bn.inputs[1:5]
    if len(params) < 4 or not all(isinstance(p, gs.Constant) for p in params):
        return None
    return int(params[0].values.size)


def _bn_affine(bn, k, opset):
    """((scale, shift), None) for an inference BN with k channels, or (None, reason)."""
    params = bn.inputs[1:5]
    if len(params) < 4 or not all(isinstance(p, gs.Constant) for p in params):
        return None, "bn-params-not-constant"
    if int(bn.attrs.get("training_mode", 0)) or any(o.outputs for o in bn.outputs[1:]):
        return None, "bn-training-mode"
    if int(bn.attrs.get("spatial", 1)) != 1 or int(bn.attrs.get("is_test", 1)) == 0:
        return None, "bn-training-mode"
    gamma, beta, mean, var = (p.values.astype(np.float64).ravel() for p in params)
    if not (gamma.size == beta.size == mean.size == var.size == k):
        return None, "channel-mismatch"
    if params[0].values.dtype.kind != "f":
        return None, "unsupported-dtype"
    eps = float(bn.attrs.get("epsilon", 1e-5))
    if not np.all(var + eps > 0):
        # BN itself yields NaN there; keep that visible as a BN rather than NaN weights
        # (and no numpy warning on stderr).
        return None, "bn-nonpositive-variance"
    s = gamma / np.sqrt(var + eps)
    return (s, beta - mean * s), None


def _channel_affine(node, y, k, rank):
    """Per-channel (scale, shift) of Mul/Div/Add/Sub with a constant, or (None, reason)."""
    if len(node.inputs) != 2:
        return None, "not-binary"
    a, c = node.inputs
    if a is not y:
        if node.op in ("Sub", "Div"):  # c - y and c / y are not affine in y's form
            return None, "not-affine"
        a, c = c, a
    if a is not y or not isinstance(c, gs.Constant) or c.values.dtype.kind != "f":
        return None, "not-constant"
    v = c.values
    if v.ndim > rank:
        return None, "not-per-channel"
    # Align to the output's dims: [.., K, 1, 1] with channel at axis 1 of the output.
    full = (1,) * (rank - v.ndim) + tuple(v.shape)
    if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, k):
        return None, "not-per-channel"
    vec = np.broadcast_to(v.astype(np.float64).reshape(-1) if full[1] == k else
                          v.astype(np.float64).reshape(1), (k,)).copy()
    if node.op == "Mul":
        return (vec, np.zeros(k)), None
    if node.op == "Div":
        if (vec == 0).any():
            return None, "division-by-zero"
        return (1.0 / vec, np.zeros(k)), None
    if node.op == "Add":
        return (np.ones(k), vec), None
    return (np.ones(k), -vec), None


def _constant_mul(mul, outs):
    """(x, c, y) of y = Mul(x, c) with c a float constant, x computed, y read and not a
    graph output; else None."""
    if len(mul.inputs) != 2:
        return None
    x, c = mul.inputs
    if isinstance(x, gs.Constant):
        x, c = c, x
    y = mul.outputs[0]
    if (not isinstance(c, gs.Constant) or isinstance(x, gs.Constant) or id(y) in outs
            or not y.outputs or c.values.dtype.kind != "f"):
        return None
    return x, c, y


def _weight_dequantized(conv, outs):
    """(mul, c, q) when a Conv's weight is ``Cast(q) -> Mul(c)`` (:func:`cast_chain`, no
    zero point) read by this conv only, c a constant per output channel (or one value), as
    weight-only int8 exports write it (fold-constants keeps it: skip:weight-dequantization);
    else None."""
    w = conv.inputs[1]
    mul = w.inputs[0] if len(w.inputs) == 1 else None
    if (conv.op != "Conv" or mul is None or mul.op != "Mul"
            or len(w.outputs) != 1 or id(w) in outs):
        return None
    q, c, zp = cast_chain(mul)
    if q is None or zp is not None or not isinstance(c, gs.Constant):
        return None
    shape = (1,) * (len(q.shape) - len(c.shape)) + tuple(c.shape)
    if len(shape) != len(q.shape) or any(d != 1 for d in shape[1:]) or shape[0] not in (
            1, q.shape[0]):
        return None
    return mul, c, q


def _read_x_scaled(mul, x, layers, weights, ctx, res, count: str) -> None:
    """Each layer reads x with its weight scaled (a copy where shared); the Mul goes."""
    for n, wv in zip(layers, weights):
        own_constant(n, 1, wv, ctx.namer, "scaled")
        n.inputs[0] = x
    mul.outputs.clear()
    mul.inputs.clear()
    res.count(count)
    res.changed = True


def _ints(conv, name, rank, default=1):
    return [int(v) for v in conv.attrs.get(name, [default] * rank)]


def _plain_conv(conv) -> bool:
    """A Conv whose weight (and bias) are float constants and whose pads are explicit."""
    return (len(conv.inputs) >= 2 and isinstance(conv.inputs[1], gs.Constant)
            and conv.inputs[1].values.dtype.kind == "f"
            and (len(conv.inputs) < 3 or isinstance(conv.inputs[2], gs.Constant))
            and conv.attrs.get("auto_pad", "NOTSET") in ("NOTSET", b"NOTSET")
            and not isinstance(conv.inputs[0], gs.Constant))


def _centred(conv, rank) -> bool:
    """Pads that keep the output the input's size with stride 1: (k - 1) / 2 each side."""
    w = conv.inputs[1].values
    pads = _ints(conv, "pads", 2 * rank, 0)
    dil = _ints(conv, "dilations", rank)
    return all(pads[i] == pads[i + rank] == dil[i] * (w.shape[2 + i] - 1) // 2
               for i in range(rank))


def _embed(big, small):
    """(big's weight plus small's zero-padded to big's kernel, big's pads) when small's
    kernel sits centred in big's with the same stride, dilation and group; else None."""
    wb, ws = big.inputs[1].values, small.inputs[1].values
    rank = wb.ndim - 2
    if ws.shape[:2] != wb.shape[:2] or ws.ndim != wb.ndim:
        return None
    for attr, default in (("strides", 1), ("dilations", 1), ("group", None)):
        if attr == "group":
            if int(big.attrs.get("group", 1)) != int(small.attrs.get("group", 1)):
                return None
        elif _ints(big, attr, rank, default) != _ints(small, attr, rank, default):
            return None
    pb, ps = _ints(big, "pads", 2 * rank, 0), _ints(small, "pads", 2 * rank, 0)
    dil = _ints(big, "dilations", rank)
    lead = []
    for i in range(rank):
        diff = wb.shape[2 + i] - ws.shape[2 + i]
        if diff < 0 or diff % 2:
            return None
        half = diff // 2
        if pb[i] - ps[i] != dil[i] * half or pb[i + rank] - ps[i + rank] != dil[i] * half:
            return None
        lead.append(half)
    wv = wb.astype(np.float64)
    idx = (slice(None), slice(None)) + tuple(slice(h, h + ws.shape[2 + i])
                                             for i, h in enumerate(lead))
    wv[idx] += ws.astype(np.float64)
    return wv, pb


def _count_pairs(g) -> int:
    n = 0
    for node in g.nodes:
        if node.op in CONVS and node.outputs:
            y = node.outputs[0]
            if any(c.op in ACTIVATIONS for c in y.outputs) or _is_swish(y):
                n += 1
    return n


def _is_swish(y) -> bool:
    ops = sorted(c.op for c in y.outputs)
    return ops == ["Mul", "Sigmoid"]
