"""MatMulInteger, ConvInteger and MatMulIntegerToFloat: the zero-point forms MIGraphX 2.15 and
2.16 compute wrongly without an error, or refuse. Measured on both builds against
onnxruntime's exact results (tests/test_migraphx_rules.py), and shared by the static check
(rewriter.migraphx.check) and the pass that fixes them (passes/integer_zero_points.py),
which may import nothing outside core; the profile's ``integer_ops`` says why.
"""

from __future__ import annotations

import numpy as np

COMPUTED = "computed"
# The zero point MIGraphX treats as no zero point, per operand type (its right forms).
SYMMETRIC = {np.dtype(np.uint8): 128, np.dtype(np.int8): 0}
# Integer ops MIGraphX gets wrong in some zero-point forms -> the index of a_zero_point.
INTEGER_OPS = {"MatMulInteger": 2, "ConvInteger": 2, "MatMulIntegerToFloat": 4}


def integer_op_wrong(op: str, a_type, b_type, a_zp, b_zp) -> bool:
    """Does MIGraphX (2.15, 2.16) compute this MatMulInteger/ConvInteger wrongly, or refuse
    it? ``a_type``/``b_type`` numpy dtypes of the operands, ``a_zp``/``b_zp`` a zero point:
    None when left out, :data:`COMPUTED` at run time, else its constant value. Measured on
    every form in tests/test_migraphx_rules.py; the profile's ``integer_ops`` says why."""
    u8, i8 = np.dtype(np.uint8), np.dtype(np.int8)
    if op == "ConvInteger":
        return (b_type == u8 and b_zp is None) or (a_zp is None and (
            b_zp is not None or a_type == u8))
    if op == "MatMulIntegerToFloat":   # the other way round: 128 is the one it gets wrong
        def off(t, zp):
            return t == u8 and zp is not None and (
                isinstance(zp, str) or bool(np.any(np.asarray(zp) == 128)))
        return off(a_type, a_zp) or off(b_type, b_zp) or (a_zp is None and b_zp is not None)

    def right(t, zp):
        if zp is None:
            return t == i8
        return not isinstance(zp, str) and bool(np.all(np.asarray(zp) == SYMMETRIC[t]))

    return not (right(a_type, a_zp) and right(b_type, b_zp)) or (a_zp is None and
                                                                   b_zp is not None)
