"""expand-ml: ai.onnx.ml's Scaler as Sub/Mul, bit-exact against onnxruntime's kernel for each
input type it takes, two sites with their own constants, the skips."""

import numpy as np
import pytest
from conftest import make_model, ops, run_ort

import rewriter

HEAD = '<ir_version: 8, opset_import: ["" : 17, "ai.onnx.ml" : 1]>'


def scaler_model(dtype: str, shape: str, offset, scale):
    # Two sites, different constants, on one input: each keeps its own.
    return make_model(f"""
    {HEAD}
    g ({dtype}{shape} x) => (float{shape} y, float{shape} z) {{
        y = ai.onnx.ml.Scaler <offset = {offset}, scale = {scale}> (x)
        z = ai.onnx.ml.Scaler <offset = [0.25], scale = [-3.0]> (x)
    }}""")


@pytest.mark.parametrize("dtype", ["float", "double", "int64", "int32"])
def test_scaler_is_sub_mul_and_bit_exact(rng, dtype):
    m = scaler_model(dtype, "[N, 3]", "[0.1, -2.5, 7.3]", "[1.7, 0.33, -4.1]")
    np_type = {"float": np.float32, "double": np.float64, "int64": np.int64,
               "int32": np.int32}[dtype]
    x = (rng.standard_normal((5, 3)) * 1e3).astype(np_type) if dtype in ("float", "double") \
        else rng.integers(-2**20, 2**20, (5, 3)).astype(np_type)
    out, rep = rewriter.rewrite(m, ["expand-ml"], verify=True)
    assert "Scaler" not in ops(out)
    assert (rep.passes[0].counts or {}).get("expanded-scaler") == 2
    for a, b in zip(run_ort(m, {"x": x}), run_ort(out, {"x": x})):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_array_equal(a, b)


def test_what_a_broadcast_cannot_say_is_skipped():
    # Above rank 2 onnxruntime takes the flat index modulo dim 1: no broadcast; a single
    # offset and scale still go (the second site).
    m = scaler_model("float", "[2, 3, 4]", "[0.1, -2.5, 7.3]", "[1.7, 0.33, -4.1]")
    out, rep = rewriter.rewrite(m, ["expand-ml"], verify=True)
    assert ops(out).count("Scaler") == 1
    assert rep.passes[0].counts.get("skip:rank-above-2") == 1


def test_in_the_default_pipeline_for_migraphx_only(rng):
    m = make_model(f"""
    {HEAD}
    g (double[N, 2] x) => (float[N, 3] y) {{
        s = ai.onnx.ml.Scaler <offset = [0.5, -1.0], scale = [2.0, 0.25]> (x)
        c = Cast <to = 1> (s)
        y = MatMul (c, w)
    }}""", {"w": rng.standard_normal((2, 3)).astype(np.float32)})
    out, _ = rewriter.rewrite(m, verify=True)
    assert ops(out) == ["Scaler", "MatMul"]         # --target none: fewer nodes as it is
    from rewriter.core.registry import default_pipeline
    out, _ = rewriter.rewrite(m, default_pipeline("migraphx"), verify=True)
    assert ops(out) == ["Sub", "Mul", "Cast", "MatMul"]   # in double; the model's Cast goes
