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


def test_a_constant_added_after_a_gemm_goes_into_its_c(rng):
    """PointNet's T-Net: Linear (Gemm, transB) + the identity flattened -> one Gemm whose C
    is beta * C + eye; without a C the constant becomes it; a shared C is copied; a
    residual Add, a row bias of unknown rows and a Gemm read twice stay."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8] x, float[N, 9] r) => (float[N, 9] y, float[N, 9] z, float[N, 9] u,
                                          float[N, 9] v, float[N, 9] w) {
        a = Gemm <transB = 1, beta = 0.5> (x, W, C)
        y = Add (a, eye)
        b = Gemm <alpha = 2.0> (x, W2)
        z = Add (eye2, b)
        c = Gemm <transB = 1> (x, W, C)
        u = Add (c, r)
        d = Gemm (x, W2, C)
        v = Add (d, rows)
        w = Relu (d)
    }""", {"W": (9, 8), "C": (9,), "eye": np.eye(3, dtype=np.float32).ravel(),
           "W2": (8, 9), "eye2": (1, 9), "rows": (4, 9)})
    out, rep = rewriter.rewrite(m, ["fuse-matmul-add"], verify=True,
                                input_shapes={"x": [4, 8], "r": [4, 9]})
    counts = rep.passes[0].counts
    assert counts["folded-into-gemm"] == 2 and ops(out).count("Add") == 2
    assert counts.get("skip:bias-shape") is None   # d is read twice: no site
    gemms = {n.output[0]: n for n in out.graph.node if n.op_type == "Gemm"}
    assert set(gemms) == {"y", "z", "c", "d"}
    assert all(a.f == 1.0 for a in gemms["y"].attribute if a.name == "beta")
    inits = {t.name for t in out.graph.initializer}
    assert "C" in inits and gemms["y"].input[2] != "C"   # c and d still read C itself
    for n in (1, 4):
        f = {"x": rng.standard_normal((n, 8)).astype(np.float32),
             "r": rng.standard_normal((n, 9)).astype(np.float32)}
        for got, want in zip(run_ort(out, f)[:4], run_ort(m, f)[:4]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    again, rep2 = rewriter.rewrite(out, ["fuse-matmul-add"])
    assert not rep2.passes[0].changed
    onnx.checker.check_model(out, full_check=True)
