"""GPTQ statistics per fold: the planner rounds fold f's weights with the other folds'
Hessians, computed in one pass; they must equal a pass over those folds alone."""

import numpy as np
import onnx
from onnx import TensorProto, helper

from rewriter.quant.hessian import ConvSpec, conv_hessians


def _model():
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_fold_complements_equal_a_pass_over_the_other_folds():
    rng = np.random.default_rng(1)
    data = [{"x": (rng.standard_normal((1, 3, 6, 6)) * (1 + i)).astype(np.float32)}
            for i in range(8)]
    spec = ConvSpec("conv", "x", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    folds = [list(range(f, 8, 4)) for f in range(4)]
    total, without = conv_hessians(_model(), [spec], data, progress=False, folds=folds)
    np.testing.assert_allclose(total["conv"], conv_hessians(_model(), [spec], data,
                                                            progress=False)["conv"])
    for f in range(4):
        rest = [data[j] for g in range(4) if g != f for j in folds[g]]
        direct = conv_hessians(_model(), [spec], rest, progress=False)["conv"]
        np.testing.assert_allclose(without[f]["conv"], direct, rtol=1e-10)
        assert not np.allclose(without[f]["conv"], total["conv"])
