"""The forms onnxruntime's own tools write for transformer models (onnxruntime-genai's model
builder, onnxruntime.transformers' optimizer), small and by hand: loading, the FP32 pipeline
against onnxruntime's kernels, fixed points, and the MIGraphX target's choices."""

import numpy as np
import onnx
import onnx.parser

import rewriter
from conftest import run_ort


def parse(text: str, inits: dict, seed: int = 0) -> onnx.ModelProto:
    """ONNX text with distinct seeded initializers, not checked (onnx.checker refuses the
    default-domain schemas onnxruntime registers, which is what these tests are about)."""
    m = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    for name, shape in inits.items():
        v = (rng.standard_normal(shape) * 0.3 + (1.0 if name.startswith("G") else 0.0))
        m.graph.initializer.append(onnx.numpy_helper.from_array(v.astype(np.float32), name))
    return m


def genai_norms(opset: int = 21) -> onnx.ModelProto:
    """The model builder's RMSNorms: onnxruntime's default-domain SimplifiedLayerNormalization
    (its own schema, in "" at every opset) and the contrib SkipSimplifiedLayerNormalization,
    whose third output, input + skip, feeds the next block."""
    return parse(f"""
    <ir_version: 10, opset_import: ["" : {opset}, "com.microsoft" : 1]>
    g (float[N, S, 16] x) => (float[N, S, 16] y) {{
        n = SimplifiedLayerNormalization <axis = -1, epsilon = 0.00001> (x, G1)
        h = MatMul (n, W)
        z, m1, m2, s = com.microsoft.SkipSimplifiedLayerNormalization <epsilon = 0.00001>
            (h, x, G2)
        y = Add (z, s)
    }}""", {"G1": (16,), "W": (16, 16), "G2": (16,)})


def test_onnxruntime_default_domain_norm_loads_and_verifies():
    # onnx.checker has no SimplifiedLayerNormalization schema: every model the genai builder
    # writes was refused at load (exit 2, "No Op registered for SimplifiedLayerNormalization")
    m = genai_norms()
    before = m.SerializeToString()
    out, report = rewriter.rewrite(m, verify=True)
    assert report.verified and m.SerializeToString() == before
    ops = [n.op_type for n in out.graph.node]
    assert "SimplifiedLayerNormalization" not in ops   # written as valid ONNX
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    np.testing.assert_allclose(run_ort(out, {"x": x})[0], run_ort(m, {"x": x})[0],
                               rtol=1e-5, atol=1e-5)
