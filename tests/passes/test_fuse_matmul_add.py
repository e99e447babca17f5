"""fuse-matmul-add: 2-D MatMul + constant bias -> Gemm; batched or odd biases stay."""

import numpy as np
import onnx
from conftest import make_model, ops, run_ort

import rewriter


def test_linear_layers_become_gemm_shared_weight_two_sites(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8] x) => (float[N, 4] y) {
        a = MatMul (x, W)
        b = Add (a, bias)
        r = Relu (b)
        c = MatMul (r, W2)
        d = Add (bias2, c)
        e = MatMul (x, W)
        f = Add (e, bias)
        y0 = Add (d, f)
        y = Identity (y0)
    }""", {"W": (8, 4), "bias": (4,), "W2": (4, 4), "bias2": (1, 4)})
    out, rep = rewriter.rewrite(m, ["fuse-matmul-add"], verify=True, input_shapes={"x": [3, 8]})
    assert ops(out).count("Gemm") == 3 and "MatMul" not in ops(out)
    assert rep.passes[0].counts["fused"] == 3
    for n in (1, 5):
        f = {"x": rng.standard_normal((n, 8)).astype(np.float32)}
        np.testing.assert_allclose(run_ort(out, f)[0], run_ort(m, f)[0], rtol=1e-5, atol=1e-6)
    onnx.checker.check_model(out, full_check=True)


def test_batched_matmul_and_row_bias_of_unknown_rows_stay(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8] x, float[M, 8] z) => (float[N, 3, 4] y, float[M, 4] w) {
        a = MatMul (x, W)
        y = Add (a, bias)
        c = MatMul (z, W)
        w = Add (c, rows)
    }""", {"W": (8, 4), "bias": (4,), "rows": (5, 4)})
    out, rep = rewriter.rewrite(m, ["fuse-matmul-add"])
    assert "Gemm" not in ops(out)
    assert rep.passes[0].counts.get("skip:not-2d") == 1
    assert rep.passes[0].counts.get("skip:bias-shape") == 1


def test_matmul_output_read_twice_stays(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8] x) => (float[N, 4] y, float[N, 4] z) {
        a = MatMul (x, W)
        y = Add (a, bias)
        z = Relu (a)
    }""", {"W": (8, 4), "bias": (4,)})
    out, _ = rewriter.rewrite(m, ["fuse-matmul-add"])
    assert "Gemm" not in ops(out)
