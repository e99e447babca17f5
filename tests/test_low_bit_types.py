"""Weights of the types numpy lacks (ml_dtypes): int4 and uint4 (packed two to a byte in
ONNX), bfloat16, float8.

Written as they came (packed, byte for byte), verified in onnxruntime, read from external
data at their packed size, and never dequantized into float by fold-constants
(fourteenth round: every int4 model failed, exit 3 or a wrong exit 2).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import TensorProto, helper, numpy_helper

import rewriter


def _int4_mlp(rng, k=64, n=48, dtype=TensorProto.INT4, block=16) -> onnx.ModelProto:
    """x -> MatMul(DQ(int4 w1, blockwise)) -> Add -> Relu -> MatMul(DQ(int4 w2)) -> y."""
    lo, hi = (-8, 8) if dtype == TensorProto.INT4 else (0, 16)
    np_type = ml_dtypes.int4 if dtype == TensorProto.INT4 else ml_dtypes.uint4
    inits, nodes = [], []
    for w, (r, c) in (("w1", (k, n)), ("w2", (n, 10))):
        q = rng.integers(lo, hi, size=(r, c)).astype(np_type)
        s = rng.uniform(0.01, 0.06, size=(-(-r // block), c)).astype(np.float32)
        inits += [numpy_helper.from_array(q, f"{w}_q"), numpy_helper.from_array(s, f"{w}_s")]
        nodes.append(helper.make_node("DequantizeLinear", [f"{w}_q", f"{w}_s"], [w], axis=0,
                                      block_size=block))
    inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b1"))
    nodes += [helper.make_node("MatMul", ["x", "w1"], ["m1"]),
              helper.make_node("Add", ["m1", "b1"], ["a1"]),
              helper.make_node("Relu", ["a1"], ["r1"]),
              helper.make_node("MatMul", ["r1", "w2"], ["y"])]
    g = helper.make_graph(nodes, "int4", [helper.make_tensor_value_info("x", 1, ["N", k])],
                          [helper.make_tensor_value_info("y", 1, ["N", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(m, full_check=True)
    return m


def _raw(model: onnx.ModelProto, dtypes) -> dict[str, bytes]:
    return {t.name: numpy_helper.from_array(numpy_helper.to_array(t)).raw_data
            for t in model.graph.initializer if t.data_type in dtypes}


@pytest.mark.parametrize("dtype", [TensorProto.INT4, TensorProto.UINT4])
@pytest.mark.parametrize("target", ["none", "migraphx"])
def test_int4_weights_written_packed_and_verified(rng, dtype, target):
    # w1 is 1536 bytes packed (a stub above 1 KB: onnxruntime took no int4 OrtValue);
    # the MIGraphX target's weight-scales-after reads every weight DQ's values, which
    # graphsurgeon then wrote one element a byte, a tensor twice its declared size.
    m = _int4_mlp(rng, dtype=dtype)
    out, report = rewriter.rewrite(m, verify=True, target=target)
    assert report.verified
    onnx.checker.check_model(out, full_check=True)
    assert _raw(out, {dtype}) == _raw(m, {dtype})
    x = {"x": rng.standard_normal((3, 64)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(out, x)[0], run_ort(m, x)[0])


def test_int4_weights_in_external_data_read_at_their_packed_size(rng, tmp_path):
    m = _int4_mlp(rng, k=128, n=64)
    want = _raw(m, {TensorProto.INT4})
    onnx.save_model(m, tmp_path / "m.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.bin", size_threshold=1024)
    out, report = rewriter.rewrite(str(tmp_path / "m.onnx"), verify=True, target="migraphx")
    assert report.verified
    assert _raw(out, {TensorProto.INT4}) == want


@pytest.mark.parametrize("np_type", [ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_bfloat16_and_float8_weights_over_1kb_verify(rng, np_type):
    # Cast(bfloat16 weight) -> MatMul: fold-constants read graphsurgeon's dtype 16 as numpy's
    # (TypeError, exit 3); a weight over 1 KB reached onnxruntime as an OrtValue it refused.
    w = rng.standard_normal((64, 32)).astype(np_type)
    g = helper.make_graph(
        [helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
         helper.make_node("MatMul", ["x", "wf"], ["m"]),
         helper.make_node("Mul", ["m", "wf2"], ["y"])],
        "bf16", [helper.make_tensor_value_info("x", 1, ["N", 64])],
        [helper.make_tensor_value_info("y", 1, ["N", 32])],
        [numpy_helper.from_array(w, "w"),
         numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "wf2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    out, report = rewriter.rewrite(m, verify=True, target="none")
    assert report.verified
    x = {"x": rng.standard_normal((2, 64)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(out, x)[0], run_ort(m, x)[0])
