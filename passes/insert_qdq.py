"""insert-qdq: put INT8 layers of a plan into the QDQ form MIGraphX turns into int8 kernels.

Before -> after, for a Conv the plan puts in INT8::

    x -> Conv(W, b) -> Relu
    x -> QuantizeLinear(s_x, 0) -> DequantizeLinear(s_x, 0) -> Conv -> Relu
         W_int8 -> DequantizeLinear(s_w, 0, axis=0) ------------^   (b stays float)

With ``weight_form: mul`` (what ``auto`` picks for MIGraphX >= 2.16 or an unknown version)
the per-channel scale leaves the DequantizeLinear and follows the layer::

    W_int8 -> DequantizeLinear(1.0, 0) -> Conv(no bias) -> Mul(s_w[1,K,1,1]) -> Add(b) -> Relu

The same arithmetic (conv is linear per output channel), and every MIGraphX version run here
lowers it to quant_convolution; MIGraphX 2.16's simplify_qdq throws on any per-axis weight
DQ (PROFILE.md item 9). MatMul/Gemm scale their output columns the same way.

The form (shared/migraphx/PROFILE.md, "Quantized layers"): signed int8 activations and
weights, symmetric; an explicit int8 zero point (0) on every Q and DQ (a DQ without one does
not match and the layer silently stays float); per-tensor activation scales as 0-d fp32
constants; weight scales per output channel (axis 0 for Conv, the output axis of Gemm/MatMul
B; on the DQ or as a Mul after the layer) or per-tensor; weights stored as int8 initializers
behind a DequantizeLinear, never pre-dequantized (fold-constants never folds DQ). A Gemm's
alpha is folded into its weights first (MIGraphX puts mul(alpha) between DQ and dot, which
keeps the layer float). Nothing sits between a conv's epilogue and its activation.

Scales: activation s_x = amax / 127 from calibration (``ctx.ranges``: tensor name ->
amax); weight s_w[k] = max|W[k]| / 127, W_int8 = clip(round(W / s_w), -127, 127). A scale is
always > 0 and normal: an all-zero channel (e.g. from pad-channels) gets 1.0, and scales are
floored at 1e-12, since MIGraphX fails on a zero scale (#4235).

Bias: float by default (MIGraphX fuses the add into the kernel); ``int32`` stores
round(b / (s_x * s_w)) behind a DequantizeLinear with that product as scale (axis form and
per-tensor weights only; with ``mul`` the bias is the float Add after the scale, which is
what MIGraphX makes of an int32 bias DQ anyway, PROFILE.md item 14).

A weight the model stores as int8 and dequantises in the graph (weight-only quantized:
``Cast(q) -> Mul(c)`` or ``DequantizeLinear(q, s, 0)`` on a float input,
``core.graph.stored_int8_weight``) is not quantised again: the DQ reads q itself, bit for
bit, with c per channel on its axis (``axis``) or after the layer (``mul``, and
``per-tensor``, which cannot hold c), a per-tensor c as its 0-d scale in every form; a
Gemm's alpha goes into the scale. No GPTQ for it. Counted ``stored-int8-weights-kept``::

    Cast(q) -> Mul(c[K,1,1,1]) -> Conv(x, ., b)
    =>  q -> DequantizeLinear(1.0, 0) -> Conv(x_dq, .) -> Mul(c[1,K,1,1]) -> Add(b)

Skips (reasons in the report): weight not constant, a stored integer weight that is not
symmetric int8 per tensor or per output channel (its ``stored-*`` reason), not fp32, a
weight holding NaN or infinity (``weight-not-finite``: int8 has neither, so the layer's
NaN outputs would become numbers), no calibration range for the activation, an activation
range that is not finite (``activation-not-finite``: the input held inf or NaN on the
calibration data, which int8 would turn into numbers), per-channel
axis-form weights on opset < 13 (falls back to per-tensor, noted; the mul form needs no
per-axis DQ).
The activation Q/DQ pair is shared by every INT8 layer reading the same tensor; an INT8
weight shared by several layers is quantised once.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.errors import PreconditionError
from rewriter.core.graph import (AUTO_PADS, StoredInt8, auto_pad, float32_layer, node_id,
                                 stored_int8_weight, weight_out_axis)
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

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


GPTQ_BLOCK = 128
# A stacked solve (_gptq_groups) holds ~34 d^2 bytes of float64 a group at its peak
# (tracemalloc: 131 MiB for 256 groups of d = 126, 8.5x their float32 H), beyond the one
# group's solve hessian.within_budget counts: groups are stacked this many bytes at a time.
STACK_BYTES = 16 << 20


def gptq_round(w: np.ndarray, scale: np.ndarray, hessian: np.ndarray, group: int,
               damp: float = 0.01) -> np.ndarray:
    """Error-compensating int8 rounding (GPTQ) of conv weights ``w`` [K, C/g, kh, kw] with
    per-output-channel ``scale`` [K] (or a 0-d one) and ``hessian`` [g, D, D] = E[x x^T]
    of the input patches of each group (rewriter.quant.hessian). Columns are rounded in
    descending order of their input energy; each rounding error is spread over the
    columns not yet rounded along H^-1, which minimises the output error
    (w - q)^T H (w - q) greedily. Returns int8 values."""
    k = w.shape[0]
    d = int(np.prod(w.shape[1:]))
    per_group = k // group
    s = np.broadcast_to(np.asarray(scale, np.float64).reshape(-1), (k,)) \
        if np.ndim(scale) else np.full(k, float(scale))
    w2 = w.reshape(k, d).astype(np.float64)
    if group > 1 and d <= GPTQ_BLOCK:   # depthwise: thousands of tiny solves, stacked
        w3, s2 = w2.reshape(group, per_group, d), s.reshape(group, per_group)
        step = max(1, STACK_BYTES // (34 * d * d))
        try:
            return np.concatenate([_gptq_groups(w3[a:a + step], s2[a:a + step],
                                                np.asarray(hessian[a:a + step]), damp)
                                   for a in range(0, group, step)]).reshape(w.shape)
        except np.linalg.LinAlgError:
            pass   # one group's factor failed: each on its own below, as it handles that
    out = np.empty((k, d), np.int8)
    for g in range(group):
        rows = slice(g * per_group, (g + 1) * per_group)
        out[rows] = _gptq_block(w2[rows], s[rows], hessian[g], damp)
    return out.reshape(w.shape)


def _gptq_block(w: np.ndarray, s: np.ndarray, h: np.ndarray, damp: float) -> np.ndarray:
    """GPTQ's rounding of rows ``w`` [R, D] (float64) with scales ``s`` [R] against one
    group's ``h`` [D, D]; int8 [R, D].

    GPTQ rounds column k of the weights moved by the errors before it, w~_k = w_k -
    sum_{i<k} e_i U_ik with U^T U = H^-1 (U upper) and e_i = (w~_i - q_i s) / U_ii. As
    W - Q s = E U, E = (W - Q s) V with V = U^-1, and w~_k = w_k + (sum_{i<k} (w_i -
    q_i s) V_ik) / V_kk. V is upper with H = V V^T: the reversed Cholesky factor of the
    reversed H (V = R L R, R H R = L L^T). No inverse is formed: one Cholesky (n^3/3
    flops) where U took 2n^3/3 more (a 4608-wide solve of 512 rows: 6.3-9.0 -> 3.4-3.7 s).
    The same int8 as through U on all 110 GPTQ layers of a 1024x1024 segmenter (36.9 M
    weights, its real H; docs/benchmarks_quant.md)."""
    diag = np.diag(h).astype(np.float64)
    dead = diag <= 0
    order = np.argsort(-np.where(dead, 1.0, diag))
    # Dead columns (no input energy: a dilated tap that reads only padding, a channel a
    # ReLU never opens) are left out of the factor and the loop: H holds them as unit
    # columns with zero off-diagonals, so their factor rows are zero off the diagonal, they
    # take no error and pass none on, and their weights round to 0. DeepLabV3's ASPP
    # convs at rates 24 and 36 on a 16x16 map are 960 live columns of 8640: their two
    # float64 factors and loops took 31 s of a 59-101 s --plan default, 1.8 s now.
    keep = order[~dead[order]]
    n = len(keep)
    # [n, R]: a column's weights contiguous, for the column loop below
    wt = np.ascontiguousarray(w[:, keep].T)
    out = np.zeros(w.shape, np.int8)
    try:   # V = R L R, or nearest rounding
        v = _check_factor(_damped_factor(h, order, ~dead[order], damp)[::-1, ::-1])
    except np.linalg.LinAlgError:
        out[:, keep] = np.clip(np.rint(wt.T / s[:, None]), -QMAX, QMAX)
        return out
    q, delta = np.empty_like(wt), np.empty_like(wt)
    acc = np.zeros_like(wt)       # sum_{i<k} (w_i - q_i s) V_ik, of the columns rounded
    # Columns in blocks (GPTQ's lazy batch updates): inside a block each column's
    # deviation reaches the block's later columns; the columns after the block take the
    # block's deviations in one product, not one pass over them per column.
    for a in range(0, n, GPTQ_BLOCK):
        b = min(a + GPTQ_BLOCK, n)
        vb = np.ascontiguousarray(v[a:b, a:b])
        for j in range(b - a):
            k = a + j
            qk = np.clip(np.rint((wt[k] + acc[k] / vb[j, j]) / s), -QMAX, QMAX)
            q[k] = qk
            delta[k] = wt[k] - qk * s
            acc[k + 1:b] += vb[j, j + 1:, None] * delta[k]
        acc[b:] += v[a:b, b:].T @ delta[a:b]
    out[:, keep] = q.T
    return out


def _gptq_groups(w: np.ndarray, s: np.ndarray, h: np.ndarray, damp: float) -> np.ndarray:
    """_gptq_block on every group at once: ``w`` [G, R, D] float64, ``s`` [G, R], ``h``
    [G, D, D], D <= GPTQ_BLOCK; the same arithmetic element for element (stacked LAPACK
    calls factor each matrix alone). A depthwise conv's groups are 1-row solves of 9 or
    25 columns, where calling _gptq_block per group cost ~3 ms of overhead each (2498 of
    them, 7.9 s, on a MobileNetV3's --plan default). LinAlgError if any factor fails."""
    n, _, d = w.shape
    diag = np.diagonal(h, axis1=1, axis2=2).astype(np.float64)
    dead = diag <= 0
    w = np.where(dead[:, None, :], 0.0, w)
    order = np.argsort(-np.where(dead, 1.0, diag), axis=1)
    w = np.take_along_axis(w, order[:, None, :], axis=2)
    live = ~np.take_along_axis(dead, order, axis=1)
    hp = np.take_along_axis(np.take_along_axis(h, order[:, :, None], axis=1),
                            order[:, None, :], axis=2).astype(np.float64)
    hp = np.where(live[:, :, None] & live[:, None, :], hp, 0.0)
    idx = np.arange(d)
    hp[:, idx, idx] = np.where(live, hp[:, idx, idx], 1.0)
    hp[:, idx, idx] += damp * np.mean(hp[:, idx, idx], axis=1, keepdims=True) + 1e-12
    v = _check_factor(np.linalg.cholesky(hp[:, ::-1, ::-1])[:, ::-1, ::-1])
    q = np.empty_like(w)
    acc = np.zeros_like(w)
    for j in range(d):
        qj = np.clip(np.rint((w[:, :, j] + acc[:, :, j] / v[:, j, j][:, None]) / s),
                     -QMAX, QMAX)
        q[:, :, j] = qj
        delta = w[:, :, j] - qj * s
        acc[:, :, j + 1:] += v[:, None, j, j + 1:] * delta[:, :, None]
    back = np.argsort(order, axis=1)
    return np.take_along_axis(q, back[:, None, :], axis=2).astype(np.int8)


def _check_factor(v: np.ndarray) -> np.ndarray:
    """``v`` if GPTQ can divide by its diagonal, else LinAlgError. An H holding inf
    (activations beyond float32's square root: a fuzzed ResNet's BN variance) can factor
    into NaN without LAPACK raising (NaN rounded to int8; its inverse, which GPTQ formed
    before, raised 'Singular matrix' out of insert-qdq: exit 3)."""
    if not (np.isfinite(v).all() and (np.diagonal(v, axis1=-2, axis2=-1) > 0).all()):
        raise np.linalg.LinAlgError("H's factor is not finite")
    return v


def _damped_factor(h: np.ndarray, order: np.ndarray, live: np.ndarray,
                   damp: float) -> np.ndarray:
    """The lower Cholesky factor of R H' R (R the reversal), H' the stored float32 H's
    live columns (``order[live]``) as float64, damped by ``damp`` of the mean diagonal of
    H in ``order`` with its dead columns (no input energy) unit: their rows and columns
    of the factor are zero off the diagonal, so they are left out, not factored. The
    float64 H lives only in here: with LAPACK's copy and the factor, three d x d float64
    at the peak (hessian.ConvSpec.solve_bytes)."""
    keep = order[live]
    diag = np.where(live, np.asarray(h)[order, order].astype(np.float64), 1.0)
    hp = np.asarray(h)[np.ix_(keep, keep)].astype(np.float64)
    hp[np.diag_indices(len(keep))] += damp * float(np.mean(diag)) + 1e-12
    return np.linalg.cholesky(hp[::-1, ::-1])


class InsertQdq(Pass):
    name = "insert-qdq"
    phase = Phase.QUANTIZE
    numerics = Numerics.LOSSY
    summary = "INT8 layers of a plan -> QuantizeLinear/DequantizeLinear in MIGraphX's int8 form"

    def requires(self, graph, ctx):
        if ctx.assignment is None:
            raise PreconditionError("insert-qdq needs a plan: use --plan (and --calib)")
        # A plan with no INT8 layer it quantizes (fp16, what --plan auto chose, or float16
        # layers it leaves as they are) needs no Q/DQ: the api converts the opset only then.
        if graph.opset < 10 and any(ctx.assignment.precision.get(node_id(n)) == "int8"
                                    and float32_layer(n) for n in graph.nodes):
            raise PreconditionError(f"insert-qdq needs opset >= 10 (model has {graph.opset})")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        assignment, plan = ctx.assignment, ctx.plan
        form, why = (plan.weight_form(ctx.options.migraphx_version) if plan is not None
                     else ("axis", "no plan"))
        layers = [n for n in graph.nodes if assignment.precision.get(node_id(n)) == "int8"]
        if not layers:   # `--plan fp16` printed 'nothing to do' and a weight form under it
            return res
        if form == "axis" and graph.opset < 13:
            form = "per-tensor"
            res.notes.append(f"opset {graph.opset} < 13 has no per-axis DequantizeLinear: "
                             "per-tensor weight scales used")
        res.notes.append(f"weight form: {form} ({why})")
        site = _Site(graph, ctx, res, ctx.ranges, form,
                     plan is not None and plan.int8.get("bias") == "int32")
        from rewriter.core.progress import progress_bar

        # GPTQ rounding can take a minute (a 9216-wide conv): a bar when it runs.
        kept: dict[str, list[str]] = {}
        gptq = plan is not None and plan.int8.get("rounding") == "gptq"
        # INT8 convs GPTQ's statistics cannot round, by why
        nearest: dict[str, list[str]] = {"3d": [], "auto-pad": []}
        for node in progress_bar(ctx.progress and bool(ctx.hessians), iterable=layers,
                                 desc="int8 weights", unit="layer"):
            why = _no_gptq(node) if gptq else None
            reason = site.quantize(node)
            if reason:
                res.skip(reason)
                kept.setdefault(reason, []).append(node_id(node))
            else:
                res.count(f"int8-{node.op.lower()}")
                res.changed = True
                if why:
                    nearest[why].append(node_id(node))
        for why, ids in nearest.items():
            if not ids:
                continue
            res.skip(f"gptq-conv-{why}", len(ids))
            res.notes.append(
                ("GPTQ rounding takes 1-D and 2-D convs" if why == "3d" else
                 "GPTQ rounding needs a conv's pads")
                + f": {len(ids)} INT8 conv{'s' * (len(ids) > 1)} "
                + ("(3-D)" if why == "3d" else "(an auto_pad ONNX does not know)")
                + " rounded to nearest: " + ", ".join(ids[:3])
                + (f" and {len(ids) - 3} more" if len(ids) > 3 else ""))
        for reason, ids in kept.items():   # one line a reason (MViT-V2: 48 lines of one)
            res.notes.append(f"{reason}: {len(ids)} layer{'s' * (len(ids) > 1)} kept float32: "
                             + ", ".join(ids[:3])
                             + (f" and {len(ids) - 3} more" if len(ids) > 3 else ""))
        res.count("qdq-activation-pairs", len(site.act_cache))
        if site.int32_bias and form == "mul":
            res.notes.append("bias: int32 is not used with weight form mul: the bias is the "
                             "float Add after the per-channel scale")
        return res


def _no_gptq(node) -> str | None:
    """Why GPTQ's statistics cannot take this INT8 conv: "3d", or "auto-pad" (an auto_pad
    ONNX does not know; SAME_* over an input whose size is not known takes each batch's
    pads, quant.hessian), or None."""
    w = node.inputs[1] if node.op == "Conv" and len(node.inputs) > 1 else None
    if not isinstance(w, gs.Constant) or w.shape is None:
        return None
    if len(w.shape) > 4:
        return "3d"
    return "auto-pad" if auto_pad(node) not in AUTO_PADS else None


class _Site:
    """Quantises one INT8 layer at a time; caches shared activation pairs and weights."""

    def __init__(self, graph, ctx, res, ranges, form, int32_bias):
        self.graph, self.ctx, self.res, self.ranges = graph, ctx, res, ranges
        self.form, self.int32_bias = form, int32_bias
        self.act_cache: dict[str, tuple] = {}
        self.w_cache: dict[tuple, tuple] = {}
        self.current: str | None = None     # the layer being quantised (its Hessian)
        self.shared_cache: dict[tuple, gs.Constant] = {}

    def const(self, base: str, values) -> gs.Constant:
        return gs.Constant(self.ctx.namer(base), np.asarray(values))

    def shared(self, base: str, values) -> gs.Constant:
        """A zero point or a scale (activation, weight, channel, bias): one constant per
        value, type and shape for the whole pass, and a scalar the model already has is
        used as it is. One per tensor, or a second 1.0 beside the model's, left equal
        constants that a second run's merge-duplicates merged, so a plan's output was not
        a fixed point (83 -> 54 initializers on resnet_mini, docs audit; an ALBERT's
        weights read by 4 layers each: 83 -> 64, twenty-seventh round; two activations
        calibrated to one scale, 236 -> 234 on caustic-nmr's PaiNN, thirtieth round).
        Nothing edits a scale in place after this pass (correct-bias copies what it
        changes, ``own_constant``)."""
        values = np.asarray(values)
        key = (values.dtype.str, values.shape, values.tobytes())
        if not self.shared_cache:
            self.shared_cache.update({(t.values.dtype.str, (), t.values.tobytes()): t
                                      for t in reversed(self.graph.tensors().values())
                                      if isinstance(t, gs.Constant) and not len(t.shape)})
        if key not in self.shared_cache:
            self.shared_cache[key] = self.const(base, values)
        return self.shared_cache[key]

    def add_node(self, op: str, base: str, inputs, out_base: str, dtype, shape, attrs=None):
        out = gs.Variable(self.ctx.namer(out_base), dtype=dtype, shape=shape)
        self.graph.nodes.append(gs.Node(op, self.ctx.namer(base), attrs=attrs or {},
                                        inputs=list(inputs), outputs=[out]))
        return out

    def quantize(self, node) -> str | None:
        self.current = node_id(node) if node.op == "Conv" else None
        x = node.inputs[0]
        w = node.inputs[1] if len(node.inputs) > 1 else None
        stored = stored_int8_weight(node)
        if isinstance(stored, str):
            return stored
        if not isinstance(w, gs.Constant) and stored is None:
            return "weights-not-constant"
        if not float32_layer(node):
            return "not-fp32"
        if node.op == "Gemm" and int(node.attrs.get("transA", 0)):
            return "gemm-transposed-activation"
        if node.op == "MatMul" and len((w if stored is None else stored.q).shape) != 2:
            return "matmul-weight-not-2d"
        if stored is None and not np.all(np.isfinite(w.values)):
            return "weight-not-finite"
        amax = self.ranges.get(x.name)
        if amax is None:
            return "no-calibration-range"
        if not np.all(np.isfinite(amax)):
            return "activation-not-finite"   # int8 has no inf or NaN: they became numbers
        axis = weight_out_axis(node, 2)   # Conv's is 0 at any rank, a MatMul's is 2-D here
        alpha = float(node.attrs.get("alpha", 1.0)) if node.op == "Gemm" else 1.0
        if alpha != 1.0:
            # MIGraphX's Gemm builder puts mul(alpha, A) between the DQ and the dot, which
            # keeps the layer float (PROFILE.md item 11): fold alpha into the weights.
            node.attrs["alpha"] = 1.0
            self.res.count("gemm-alpha-folded")
        node.inputs[0] = self.activation(x, amax)
        s_x = self.act_cache[x.name][1]
        if stored is not None:
            return self.keep_stored(node, stored, alpha, axis, s_x)
        if self.form == "mul":
            node.inputs[1], s_w = self.weight(w, alpha, axis, unit_scale=True)
            self.scale_after(node, s_w, axis)
            return None
        per_axis = axis if self.form == "axis" else None
        node.inputs[1], s_w = self.weight(w, alpha, per_axis)
        if (self.int32_bias and node.op == "Conv" and len(node.inputs) > 2
                and isinstance(node.inputs[2], gs.Constant)):
            self.int32_bias_dq(node, s_x, s_w, per_axis)
        return None

    def keep_stored(self, node, stored: StoredInt8, alpha: float, axis: int,
                    s_x: float) -> None:
        """A weight the model stores as int8 (Cast -> Mul or a weight-only DQ): its int8
        values read as they are by a DequantizeLinear in the pass's weight form, with the
        stored scale (times a Gemm's alpha). No re-rounding: the values stay bit for bit.
        A per-tensor scale is a 0-d DQ scale in every form (every version lowers it)."""
        s = stored.scale
        if alpha != 1.0:
            s = (s.astype(np.float64) * alpha).astype(np.float32)
        per_channel = s.ndim == 1
        unit = per_channel and self.form != "axis"
        key = (stored.q.name, s.tobytes(), s.shape, unit)
        if key not in self.w_cache:
            if unit:
                ws = self.shared("unit_scale", np.array(1.0, np.float32))
            elif per_channel:
                ws = self.shared(f"{stored.q.name}_scale", s)
            else:
                ws = self.shared("weight_scale", s)
            wz = self.shared("zero_point", np.zeros(ws.values.shape, np.int8))
            attrs = {"axis": axis} if per_channel and not unit else {}
            wd = self.add_node("DequantizeLinear", f"{stored.q.name}_DequantizeLinear",
                               [stored.q, ws, wz], f"{stored.q.name}_dequantized", np.float32,
                               list(stored.q.shape), attrs)
            self.w_cache[key] = (wd, s)
            self.res.count("stored-int8-weights-kept")
        node.inputs[1], s_w = self.w_cache[key]
        if unit:
            self.scale_after(node, s_w, axis)
        elif (self.int32_bias and node.op == "Conv" and len(node.inputs) > 2
                and isinstance(node.inputs[2], gs.Constant)):
            self.int32_bias_dq(node, s_x, s_w, axis if per_channel else None)

    def activation(self, x: gs.Tensor, amax) -> gs.Variable:
        """One Q->DQ pair per tensor, shared by all its INT8 consumers."""
        if x.name not in self.act_cache:
            s = self.shared(f"{x.name}_scale", safe_scale(amax).reshape(()))
            zp = self.shared("zero_point", np.array(0, dtype=np.int8))
            xq = self.add_node("QuantizeLinear", f"{x.name}_QuantizeLinear", [x, s, zp],
                               f"{x.name}_quantized", np.int8, x.shape)
            xd = self.add_node("DequantizeLinear", f"{x.name}_DequantizeLinear", [xq, s, zp],
                               f"{x.name}_dequantized", np.float32, x.shape)
            self.act_cache[x.name] = (xd, float(s.values))
        return self.act_cache[x.name][0]

    def weight(self, w: gs.Constant, alpha: float, axis: int | None,
               unit_scale: bool = False) -> tuple[gs.Variable, np.ndarray]:
        """int8 initializer -> DequantizeLinear (never folded), shared when the weight is.

        ``alpha`` multiplies the weights first (a Gemm's). With ``unit_scale`` the DQ
        carries a 0-d scale of 1.0 and the per-channel scales are returned for the caller
        to apply after the layer."""
        key = (w.name, axis, unit_scale, alpha)
        if key not in self.w_cache:
            values = w.values
            if alpha != 1.0:
                values = (values.astype(np.float64) * alpha).astype(np.float32)
            cached = self.ctx.weight_cache.get((self.current,) + key)
            if cached is not None:
                q, s_w = cached
            else:
                q, s_w = quantize_weight(values, axis)
                h = self.ctx.hessians.get(self.current) if self.current is not None else None
                if h is not None and values.ndim in (3, 4) and axis in (0, None):
                    q = gptq_round(values, s_w, h, h.shape[0])
                    self.ctx.weight_cache[(self.current,) + key] = (q, s_w)
            if self.current in self.ctx.hessians:
                self.res.count("weights-gptq-rounded")
            dq_scale = np.array(1.0, np.float32) if unit_scale else s_w
            wq = self.const(f"{w.name}_quantized", q)
            ws = (self.shared("unit_scale", dq_scale) if unit_scale
                  else self.shared(f"{w.name}_scale", dq_scale))
            wz = self.shared("zero_point", np.zeros(dq_scale.shape, np.int8))
            attrs = {"axis": axis} if axis is not None and not unit_scale else {}
            wd = self.add_node("DequantizeLinear", f"{w.name}_DequantizeLinear", [wq, ws, wz],
                               f"{w.name}_dequantized", np.float32, list(w.shape), attrs)
            self.w_cache[key] = (wd, s_w)
            self.res.count("weights-quantized")
        return self.w_cache[key]

    def scale_after(self, node, s_w: np.ndarray, axis: int) -> None:
        """layer -> Mul(per-channel scale) -> Add(bias): the layer keeps its name and the
        tensor it wrote keeps its name and consumers; its bias moves to the Add (none for
        an all-zero bias)."""
        out = node.outputs[0]
        rank = len(out.shape) if out.shape is not None else None
        if node.op == "Conv":
            rank = rank or (len(node.inputs[1].shape) if node.inputs[1].shape else 4)
            shape = [1, -1] + [1] * (rank - 2)
        else:
            shape = [-1]          # MatMul/Gemm: output columns are the last axis
        bias = None
        if node.op == "Conv" and len(node.inputs) > 2:
            bias = node.inputs[2]
            node.inputs.pop(2)
        elif node.op == "Gemm" and len(node.inputs) > 2:
            bias = self.gemm_bias(node)
        if isinstance(bias, gs.Constant) and not np.any(bias.values):
            bias = None     # tf2onnx's zero biases: an Add of zeros a second run would drop
        if not node.name and not any(n.name == out.name for n in self.graph.nodes):
            # An unnamed layer is known by its output's name (plan.node_id), and that output
            # moves to the Mul: name the layer after it so plans and reports still find it.
            node.name = out.name
        last = out if bias is None else gs.Variable(
            self.ctx.namer(f"{out.name}_scaled"), dtype=np.float32, shape=out.shape)
        if np.all(s_w == 1.0):
            # weights on the int8 grid already (scale 1 on every channel): a Mul by 1, which
            # a second rewrite's collapse-chains removed (not a fixed point; fuzz, 61404)
            node.outputs[0] = last
        else:
            raw = gs.Variable(self.ctx.namer(f"{out.name}_int8_acc"), dtype=np.float32,
                              shape=out.shape)
            node.outputs[0] = raw
            scale = self.shared(f"{node.inputs[1].name}_channel_scale",
                                s_w.astype(np.float32).reshape(shape))
            self.graph.nodes.append(gs.Node(
                "Mul", self.ctx.namer(f"{node.name or out.name}_scale"),
                inputs=[raw, scale], outputs=[last]))
        if bias is not None:
            if isinstance(bias, gs.Constant) and node.op == "Conv":
                bias = self.const(f"{bias.name}_channel", bias.values.reshape(shape))
            self.graph.nodes.append(gs.Node("Add", self.ctx.namer(f"{node.name or out.name}_bias"),
                                            inputs=[last, bias], outputs=[out]))
        self.res.count("channel-scales-after-layer")

    def gemm_bias(self, node) -> gs.Tensor:
        """A Gemm's C input, scaled by beta, removed from the Gemm (it is added after the
        per-channel scale)."""
        c = node.inputs.pop(2)
        beta = float(node.attrs.pop("beta", 1.0))
        if self.graph.opset < 11:   # C is optional from Gemm-11 on: before, a zero stands in
            node.inputs.append(self.const(f"{c.name}_zero", np.zeros([1], np.float32)))
        if beta == 1.0:
            return c
        if isinstance(c, gs.Constant):
            return self.const(f"{c.name}_beta", (c.values.astype(np.float64) * beta)
                              .astype(c.values.dtype))
        b = self.const(f"{c.name}_beta_value", np.array(beta, np.float32))
        return self.add_node("Mul", f"{c.name}_beta", [c, b], f"{c.name}_times_beta",
                             np.float32, c.shape)

    def int32_bias_dq(self, node, s_x: float, s_w: np.ndarray, axis: int | None) -> None:
        """The bias as int32 behind a DQ of scale s_x * s_w: per channel (axis 0) with
        per-axis weights, 0-d with per-tensor ones (an opset below 13 has no axis). Left
        float, and counted, where a value would not fit in int32 (a tiny s_x * s_w)."""
        b = node.inputs[2]
        sb64 = np.float64(s_x) * s_w.astype(np.float64)
        sb = sb64.astype(np.float32)
        if np.any(sb <= 0) or not np.all(np.isfinite(sb)):
            self.res.skip("int32-bias-scale-underflow")
            return
        bq = np.rint(b.values.astype(np.float64) / sb.astype(np.float64).reshape(-1))
        if np.any(np.abs(bq) > 2**31 - 1):
            self.res.skip("int32-bias-overflow")
            return
        bqc = self.const(f"{b.name}_quantized", bq.astype(np.int32))
        bsc = self.shared(f"{b.name}_scale", sb)
        bzp = self.shared("bias_zero_point", np.zeros(sb.shape, np.int32))
        node.inputs[2] = self.add_node("DequantizeLinear", f"{b.name}_DequantizeLinear",
                                       [bqc, bsc, bzp], f"{b.name}_dequantized", np.float32,
                                       list(b.shape), {"axis": 0} if axis is not None else {})
