"""integer-zero-points: MatMulInteger and ConvInteger in the zero-point forms MIGraphX computes
right.

MIGraphX 2.15 and 2.16 turn a uint8 operand of MatMulInteger into int8 by subtracting 128
(src/op/builder/bias_uint8.cpp, called from src/onnx/parse_matmul.cpp:295) and lose any
zero point but 128 on the way; an int8 operand with a non-zero zero point throws. So
onnxruntime's dynamic quantization (DynamicQuantizeLinear -> MatMulInteger: uint8
activations with a zero point computed at run time) runs without an error and gives wrong
numbers: traceforge's T5 encoder comes out at cosine -0.01 against onnxruntime. ConvInteger
is wrong when a uint8 operand's zero point is left out (measured on both builds:
tests/test_migraphx_rules.py). The forms MIGraphX gets right: int8 without a zero point
(or 0), uint8 with the constant zero point 128. Before -> after (exact in int32)::

    MatMulInteger(A:uint8, B, a_zp, b_zp)
        =>  MatMulInteger(A, B', 128) + (128 - a_zp) * colsum(B')
    MatMulInteger(A:int8, B, a_zp, b_zp)
        =>  MatMulInteger(A, B') - a_zp * colsum(B')
    MatMulInteger(A, B:uint8, a_zp, b_zp), B - b_zp outside int8 (asymmetric uint8 weights)
        =>  MatMulInteger(A, B, c, 128) + (c - a_zp) * colsum(B - 128)
                                        + rowsum(A - a_zp) * (128 - b_zp)
    ConvInteger(A, W)  (a uint8 operand, zero points left out)
        =>  ConvInteger(A, W, 0, 0)

where B' = int8(B - b_zp), a constant, and colsum its int32 sums over K. Since
(A - a_zp) B' = (A - c) B' + (c - a_zp) colsum(B'), with c = 128 for uint8 (MIGraphX's
symmetric point) and 0 for int8, the result is the same int32 to the last bit. A constant
a_zp makes the correction a constant vector (one Add); a computed one (DynamicQuantizeLinear's)
adds Cast, Sub, Mul and Add; uint8 weights kept as uint8 add a row sum of A (Cast,
ReduceSum, Sub, Mul, Add).

Skips (reasons in the report): B computed at run time (``weight-not-constant``), int8 B -
b_zp outside int8 (``weight-outside-int8``), a zero point per row of A
(``a-zero-point-per-row``), a MatMulInteger already in a right form (not counted).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase
from rewriter.core.integer_ops import COMPUTED, SYMMETRIC, integer_op_wrong


class IntegerZeroPoints(Pass):
    name = "integer-zero-points"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = "MatMulInteger/ConvInteger zero points in the forms MIGraphX computes right"

    shape_ops = ("MatMulInteger", "ConvInteger")   # the operands' dtypes

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.domain not in (None, "", "ai.onnx") or len(node.inputs) < 2:
                    continue
                if node.op == "MatMulInteger":
                    res.outcome(_matmul(node, g, ctx.namer), "matmul-integer-rewritten")
                elif node.op == "ConvInteger":
                    res.outcome(_conv(node, ctx.namer), "conv-integer-zero-points-explicit")
        return res


def _input(node: gs.Node, i: int):
    """Input ``i``, or None when it is left out."""
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i].name else None


def _dtype(t) -> np.dtype | None:
    if isinstance(t, gs.Constant):
        return t.values.dtype
    try:
        return np.dtype(t.dtype) if t.dtype is not None else None
    except TypeError:
        return None


def _zp_value(zp, dtype):
    """A zero point's constant value (0 when left out), or None when computed."""
    if zp is None:
        return np.zeros((), dtype)
    return zp.values if isinstance(zp, gs.Constant) else None


def _wrong(node: gs.Node, at, bt) -> bool:
    """The static check's verdict (the measured table) on this node's form."""
    zps = [_input(node, 2), _input(node, 3)]
    form = [None if z is None else z.values if isinstance(z, gs.Constant) else COMPUTED
            for z in zps]
    return integer_op_wrong(node.op, at, bt, *form)


def _one_value(zp) -> bool:
    """A zero point of one value (per tensor): DynamicQuantizeLinear's, or of known size 1."""
    if isinstance(zp, gs.Constant):
        return zp.values.size == 1
    if zp.shape is not None and all(isinstance(d, (int, np.integer)) for d in zp.shape):
        return int(np.prod(zp.shape)) == 1
    return len(zp.inputs) == 1 and zp.inputs[0].op == "DynamicQuantizeLinear"


def _matmul(node: gs.Node, g: gs.Graph, namer) -> str | None:
    a, b = node.inputs[0], node.inputs[1]
    a_zp, b_zp = _input(node, 2), _input(node, 3)
    at, bt = _dtype(a), _dtype(b)
    if at not in SYMMETRIC or bt not in SYMMETRIC:
        return "unknown-dtype"
    if not _wrong(node, at, bt):
        return ""
    if not isinstance(b, gs.Constant):
        return "weight-not-constant"
    bz = _zp_value(b_zp, bt)
    if bz is None:
        return "weight-not-constant"
    if a_zp is not None and not _one_value(a_zp):
        return "a-zero-point-per-row"
    # b_zp is a scalar or one per column of B (its last axis).
    bz = np.asarray(bz, np.int32)
    w = b.values.astype(np.int32) - bz
    if w.min(initial=0) >= -128 and w.max(initial=0) <= 127:
        wq, cb, row = w.astype(np.int8), None, None      # B - b_zp itself, int8
    elif bt == np.dtype(np.uint8):
        # B stays uint8 at MIGraphX's zero point 128; the rest, (A - a_zp) (128 - b_zp),
        # is a row sum of A times a constant vector.
        wq, cb, row = b.values, np.array(128, np.uint8), (128 - bz).astype(np.int32)
        w = b.values.astype(np.int32) - 128
    else:
        return "weight-outside-int8"
    y = node.outputs[0]
    base = node.name or y.name
    ca = SYMMETRIC[at]
    colsum = w.sum(axis=-2, keepdims=w.ndim > 2)          # [..., 1, N] or [N]
    extra: list[gs.Node] = []

    def var(tag):
        return gs.Variable(namer(f"{base}_{tag}"), dtype=np.int32)

    def const(tag, v, dtype=np.int32):
        return gs.Constant(namer(f"{base}_{tag}"), np.asarray(v, dtype))

    def add_node(op, inputs, tag, **attrs):
        out = var(tag)
        extra.append(gs.Node(op, namer(f"{base}_{tag}_node"), attrs, inputs, [out]))
        return out

    az = _zp_value(a_zp, at)
    az = None if az is None else int(np.ravel(az)[0])   # one value (checked above)
    zp_a = None   # a_zp as int32 when computed at run time
    if az is None:
        zp_a = add_node("Cast", [a_zp], "a_zero_point_int32", to=6)
    terms = []
    # (ca - a_zp) * colsum(B - b_zp'), the part of A's zero point MIGraphX does not apply
    if az is not None:
        if az != ca:
            terms.append(const("a_correction", (ca - az) * colsum))
    else:
        shift = add_node("Sub", [const("c", ca), zp_a], "a_zero_point_shift")
        terms.append(add_node("Mul", [shift, const("colsum", colsum)], "a_correction"))
    if row is not None:   # rowsum(A - a_zp) * (128 - b_zp)
        ai = add_node("Cast", [a], "a_int32", to=6)
        if g.opset >= 13:
            rs = add_node("ReduceSum", [ai, const("axes", [-1], np.int64)], "a_rowsum",
                          keepdims=1)
        else:   # axes an attribute before ReduceSum-13
            rs = add_node("ReduceSum", [ai], "a_rowsum", axes=[-1], keepdims=1)
        k = int(b.values.shape[-2])
        if az is not None and az != 0:
            rs = add_node("Sub", [rs, const("k_zp", k * az)], "a_rows")
        elif az is None:
            kz = add_node("Mul", [zp_a, const("k", k)], "k_zero_point")
            rs = add_node("Sub", [rs, kz], "a_rows")
        terms.append(add_node("Mul", [rs, const("b_shift", row)], "b_correction"))
    mm = var("symmetric")
    zps = [const("a_zero_point", ca, at)] + ([gs.Constant(namer(f"{base}_b_zero_point"), cb)]
                                             if cb is not None else [])
    node.inputs.clear()
    node.inputs.extend([a, gs.Constant(namer(f"{b.name}_symmetric"), wq)] + zps)
    node.outputs[0] = mm
    acc = mm
    for i, t in enumerate(terms):
        out = y if i == len(terms) - 1 else var(f"sum{i}")
        extra.append(gs.Node("Add", namer(f"{base}_zp_add{i}"), inputs=[acc, t], outputs=[out]))
        acc = out
    if not terms:   # nothing to add back (a_zp was already MIGraphX's): the node writes y
        node.outputs[0] = y
    g.nodes.extend(extra)
    return None


def _conv(node: gs.Node, namer) -> str | None:
    a, w = node.inputs[0], node.inputs[1]
    at, wt = _dtype(a), _dtype(w)
    if at not in SYMMETRIC or wt not in SYMMETRIC:
        return "unknown-dtype"
    a_zp, w_zp = _input(node, 2), _input(node, 3)
    if not _wrong(node, at, wt):
        return ""
    base = node.name or node.outputs[0].name
    zps = [a_zp or gs.Constant(namer(f"{base}_x_zero_point"), np.zeros((), at)),
           w_zp or gs.Constant(namer(f"{base}_w_zero_point"), np.zeros((), wt))]
    while len(node.inputs) > 2:
        node.inputs.pop()
    node.inputs.extend(zps)
    return None
