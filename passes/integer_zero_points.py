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
    ConvInteger(A, W)  (a uint8 operand, zero points left out)
        =>  ConvInteger(A, W, 0, 0)

where B' = int8(B - b_zp), a constant, and colsum(B') its int32 sums over K. Since
(A - a_zp) B' = (A - c) B' + (c - a_zp) colsum(B'), with c = 128 for uint8 (MIGraphX's
symmetric point) and 0 for int8, the result is the same int32 to the last bit. A constant
a_zp makes the correction a constant vector (one Add); a computed one (DynamicQuantizeLinear's)
adds Cast, Sub, Mul and Add.

Skips (reasons in the report): B computed at run time (``weight-not-constant``), B - b_zp
outside int8 (``weight-outside-int8``), a zero point per row of A (``a-zero-point-per-row``),
a MatMulInteger already in a right form (not counted).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase
from rewriter.migraphx.check import COMPUTED, integer_op_wrong

_SYMMETRIC = {np.dtype(np.uint8): 128, np.dtype(np.int8): 0}


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
    if at not in _SYMMETRIC or bt not in _SYMMETRIC:
        return "unknown-dtype"
    if not _wrong(node, at, bt):
        return ""
    if not isinstance(b, gs.Constant):
        return "weight-not-constant"
    bz = _zp_value(b_zp, bt)
    if bz is None:
        return "weight-not-constant"
    w = b.values.astype(np.int32)
    # b_zp is a scalar or one per column of B (its last axis).
    w = w - np.asarray(bz, np.int32)
    if w.min(initial=0) < -128 or w.max(initial=0) > 127:
        return "weight-outside-int8"
    az = _zp_value(a_zp, at)
    if a_zp is not None and not _one_value(a_zp):
        return "a-zero-point-per-row"
    c = _SYMMETRIC[at]
    colsum = w.sum(axis=-2, keepdims=w.ndim > 2)          # [..., 1, N] or [N]
    y = node.outputs[0]
    base = node.name or y.name
    mm = gs.Variable(namer(f"{base}_symmetric"), dtype=np.int32)
    w8 = gs.Constant(namer(f"{b.name}_int8"), w.astype(np.int8))
    inputs = [a, w8, gs.Constant(namer(f"{base}_a_zero_point"), np.array(c, at))]
    if az is not None:
        corr = gs.Constant(namer(f"{base}_correction"),
                           ((c - np.int32(np.ravel(az)[0])) * colsum).astype(np.int32))
        extra = []
    else:   # (c - a_zp) computed at run time
        zi = gs.Variable(namer(f"{base}_a_zero_point_int32"), dtype=np.int32)
        d = gs.Variable(namer(f"{base}_a_zero_point_shift"), dtype=np.int32)
        corr = gs.Variable(namer(f"{base}_correction"), dtype=np.int32)
        extra = [gs.Node("Cast", namer(f"{base}_zp_cast"), {"to": 6}, [a_zp], [zi]),
                 gs.Node("Sub", namer(f"{base}_zp_shift"), inputs=[
                     gs.Constant(namer(f"{base}_c"), np.array(c, np.int32)), zi], outputs=[d]),
                 gs.Node("Mul", namer(f"{base}_zp_correction"), inputs=[
                     d, gs.Constant(namer(f"{base}_colsum"), colsum.astype(np.int32))],
                     outputs=[corr])]
    node.inputs.clear()
    node.inputs.extend(inputs)
    node.outputs[0] = mm
    g.nodes.extend(extra + [gs.Node("Add", namer(f"{base}_zp_add"), inputs=[mm, corr],
                                    outputs=[y])])
    return None


def _conv(node: gs.Node, namer) -> str | None:
    a, w = node.inputs[0], node.inputs[1]
    at, wt = _dtype(a), _dtype(w)
    if at not in _SYMMETRIC or wt not in _SYMMETRIC:
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
