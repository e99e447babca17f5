"""expand-functions: standard ops MIGraphX does not parse become their ONNX function bodies,
computing what onnxruntime's own kernels compute (up to rounding)."""

import numpy as np
import onnx
import pytest
from conftest import make_model, run_ort

import rewriter
from rewriter.core.registry import default_pipeline

# Two sites each (one with a shared weight), symbolic batch and sequence.
NORMS = """
<ir_version: 10, opset_import: ["" : {opset}]>
g (float[B, T, 16] x) => (float[B, T, 16] y, float[B, T, 16] z) {{
    a = RMSNormalization <epsilon = 1e-3> (x, s1)
    b = Swish <alpha = 1.7> (a)
    c = RMSNormalization <axis = -1> (b, s1)
    d = Mish (c)
    y = Swish (d)
    z = RMSNormalization <axis = 1, stash_type = 1> (x, s2)
}}"""

ATTENTION = """
<ir_version: 10, opset_import: ["" : {opset}]>
g (float[B, 6, 32] q, float[B, 6, 16] k, float[B, 6, 16] v, float[B, 2, 4, 8] pk,
   float[B, 2, 4, 8] pv) => (float[B, 6, 32] y, float[B, 2, 10, 8] ck) {{
    y, ck, cv = Attention <q_num_heads = 4, kv_num_heads = 2, is_causal = 1, scale = 0.3>
        (q, k, v, , pk, pv)
}}"""


def _feeds(model, rng, batch=2):
    out = {}
    for vi in model.graph.input:
        dims = [batch if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def _ops(model):
    return {n.op_type for n in model.graph.node}


@pytest.mark.parametrize("opset", [23, 24])
def test_norms_and_activations_expand_and_compute_the_same(opset, rng):
    m = make_model(NORMS.format(opset=opset) if opset == 24 else
                   NORMS.format(opset=opset).replace("Swish <alpha = 1.7> (a)", "Sigmoid (a)")
                   .replace("y = Swish (d)", "y = Relu (d)"),
                   {"s1": [16], "s2": [16]})
    out, rep = rewriter.rewrite(m, ["expand-functions"], verify=True)
    counts = rep.passes[0].counts
    assert counts["expanded-RMSNormalization"] == 3 and counts["expanded-Mish"] == 1
    assert counts.get("expanded-Swish", 0) == (2 if opset == 24 else 0)
    assert not _ops(out) & {"RMSNormalization", "Swish", "Mish"}
    onnx.checker.check_model(out, full_check=True)
    for batch, seq in ((1, 3), (3, 7)):   # the symbolic dims stay symbolic
        feeds = {"x": rng.standard_normal((batch, seq, 16)).astype(np.float32) * 3}
        for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
            np.testing.assert_allclose(b, a, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("opset", [23, 24])
def test_attention_with_a_kv_cache_expands_and_computes_the_same(opset, rng):
    m = make_model(ATTENTION.format(opset=opset))
    out, rep = rewriter.rewrite(m, ["expand-functions"], verify=True)
    assert rep.passes[0].counts["expanded-Attention"] == 1 and "Attention" not in _ops(out)
    feeds = _feeds(m, rng, batch=3)
    ref, got = run_ort(m, feeds), run_ort(out, feeds)
    assert [r.shape for r in ref] == [g.shape for g in got]
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_rotary_embedding_expands_inside_an_if_body(rng):
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 23]>
    g (float[1, 8, 32] x, int64[1, 8] p, bool c) => (float[1, 8, 32] y) {
        y = If (c) <
            then_branch = t () => (float[1, 8, 32] yt) {
                yt = RotaryEmbedding <num_heads = 4, rotary_embedding_dim = 8> (x, cs, sn, p)
            },
            else_branch = e () => (float[1, 8, 32] ye) { ye = Identity (x) }>
    }""", {"cs": [16, 4], "sn": [16, 4]})
    out, rep = rewriter.rewrite(m, ["expand-functions"], verify=True)
    assert rep.passes[0].counts["expanded-RotaryEmbedding"] == 1
    body = out.graph.node[0].attribute[0].g
    assert "RotaryEmbedding" not in {n.op_type for n in body.node}
    feeds = {"x": rng.standard_normal((1, 8, 32)).astype(np.float32),
             "p": rng.integers(0, 16, (1, 8)).astype(np.int64), "c": np.array(True)}
    np.testing.assert_allclose(run_ort(out, feeds)[0], run_ort(m, feeds)[0], atol=1e-6)


def test_ops_migraphx_parses_are_left_alone():
    """LayerNormalization and Gelu have function bodies too, but MIGraphX parses them."""
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 23]>
    g (float[2, 16] x) => (float[2, 16] y) {
        a = LayerNormalization (x, s, b)
        y = Gelu (a)
    }""", {"s": [16], "b": [16]})
    out, rep = rewriter.rewrite(m, ["expand-functions"])
    assert not rep.passes[0].changed and _ops(out) == {"LayerNormalization", "Gelu"}


def test_in_the_default_pipeline_for_migraphx_only():
    assert "expand-functions" in default_pipeline("migraphx")
    assert "expand-functions" not in default_pipeline(None)
    m = make_model(NORMS.format(opset=24), {"s1": [16], "s2": [16]})
    out, _ = rewriter.rewrite(m, target="migraphx", verify=True)
    assert not _ops(out) & {"RMSNormalization", "Swish", "Mish"}
    out, _ = rewriter.rewrite(m)
    assert {"RMSNormalization", "Swish", "Mish"} <= _ops(out)


def test_the_ops_expanded_are_the_profiles():
    """The pass's lists against the MIGraphX profile the static check reads: every op it
    says the builds do not parse that has a function body is expanded (but Bernoulli,
    random, SequenceMap, over sequences, and AffineGrid, whose body fails for a batch of
    1: test_affine_grid_is_not_expanded), and the ones read as contrib ops."""
    import json

    from rewriter.core.graph import has_function_body
    from rewriter.migraphx.check import PROFILE_PATH
    from rewriter.passes.expand_functions import NOT_PARSED, READ_AS_CONTRIB
    profile = json.loads(PROFILE_PATH.read_text())
    with_body = {op for op in profile["onnx_standard_ops_not_parsed"]["ops"]
                 if has_function_body(op, 99)}
    assert with_body - {"Bernoulli", "SequenceMap", "AffineGrid"} == NOT_PARSED
    assert not NOT_PARSED & set(profile["onnx_ops"])
    assert set(profile["contrib_named_ops"]["ops"]) == READ_AS_CONTRIB



def test_affine_grid_is_not_expanded(rng):
    """onnx 1.23's AffineGrid body Squeezes theta without axes: for a batch of 1 it drops
    the batch too and its Split fails, so the pass leaves AffineGrid alone."""
    from rewriter.passes.expand_functions import _function
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 20]>
    g (float[1, 2, 3] theta) => (float[1, 5, 6, 2] y) {
        size = Constant <value = int64[4] {1, 1, 5, 6}> ()
        y = AffineGrid <align_corners = 1> (theta, size)
    }""")
    out, rep = rewriter.rewrite(m, ["expand-functions"], verify=True)
    assert not rep.passes[0].changed and "AffineGrid" in _ops(out)
    import onnx_graphsurgeon as gs
    node = gs.import_onnx(m).nodes[-1]
    f = _function(node, 20)
    body = onnx.printer.to_text(f)
    assert "Squeeze (r1)" in body   # the cause; when onnx fixes it, the pass may take it


def test_an_attention_whose_qk_output_is_read_is_left():
    """onnxruntime's kernel writes the causal mask's positions in qk_matmul_output as
    float's lowest (-3.4e38), the ONNX body as -inf: verification failed (the review, 2026-12-06).
    Y is the same either way; where that output is read, the node stays."""
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 23]>
    g (float[1, 6, 32] q, float[1, 6, 32] k, float[1, 6, 32] v) => (float[1, 6, 32] y,
                                                                     float[1, 4, 6, 6] s) {
        y, , , s = Attention <q_num_heads = 4, kv_num_heads = 4, is_causal = 1,
                              qk_matmul_output_mode = 1> (q, k, v)
    }""")
    out, rep = rewriter.rewrite(m, ["expand-functions"], verify=True)
    assert rep.passes[0].counts["skip:qk-output-read"] == 1 and "Attention" in _ops(out)


def test_the_bodys_casts_to_the_type_they_have_go(rng):
    """RMSNormalization's body casts X to its stash type and back: on a float input both are
    no-ops. The body's tensors are typed, so the pipeline removes them (they stayed at opset
    23, where no version conversion typed them: 2321 nodes for 200 norms instead of 1000)."""
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 23]>
    g (float[B, T, 16] x) => (float[B, T, 16] y) {
        a = RMSNormalization (x, s)
        y = RMSNormalization (a, s)
    }""", {"s": [16]})
    out, _ = rewriter.rewrite(m, target="migraphx", verify=True)
    assert "Cast" not in _ops(out) and len(out.graph.node) == 12, _ops(out)
