"""resize-inputs: a Resize's computed data input written by a Reshape to its own shape,
exactly; MIGraphX 2.15 computes a Resize that reads a strided view (a Transpose and what
keeps its layout) as if it were standard, wrong values and no error (BlazeFace: cosine 0.85)."""

import numpy as np
import onnx
import pytest
from conftest import make_model, run_ort

import rewriter
from rewriter.core.registry import default_pipeline

V15 = {"migraphx_version": "2.15"}


def nhwc_model(batch="N", seed=0):
    """x NHWC -> Transpose -> Conv -> Relu -> two Resizes (linear 2x, nearest by sizes) of
    that one tensor; a third Resize of the graph input y; distinct weights per conv."""
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[{batch}, 6, 5, 3] x, float[{batch}, 2, 3, 4] y)
      => (float[{batch}, 4, 12, 10] up, float[{batch}, 4, 9, 7] near, float[{batch}, 2, 6, 8] yu) {{
        t = Transpose <perm = [0, 3, 1, 2]> (x)
        c = Conv <pads = [1, 1, 1, 1]> (t, w, b)
        r = Relu (c)
        up = Resize <mode = "linear", coordinate_transformation_mode = "half_pixel"> (r, roi, s2)
        near = Resize <mode = "nearest"> (r, , , sz)
        yu = Resize <mode = "linear"> (y, roi, s2)
      }}""", {"w": (4, 3, 3, 3), "b": (4,), "roi": np.zeros(0, np.float32),
              "s2": np.array([1, 1, 2, 2], np.float32),
              "sz": np.array([1, 4, 9, 7], np.int64)}, seed=seed)


def _feeds(rng, n=2):
    return {"x": rng.standard_normal((n, 6, 5, 3)).astype(np.float32),
            "y": rng.standard_normal((n, 2, 3, 4)).astype(np.float32)}


def _resize_inputs(model):
    prod = {o: n.op_type for n in model.graph.node for o in n.output}
    return sorted(prod.get(n.input[0], "input") for n in model.graph.node
                  if n.op_type == "Resize")


def test_computed_inputs_reshaped_exactly_one_reshape_per_tensor(rng):
    m = nhwc_model()
    out, rep = rewriter.rewrite(m, ["resize-inputs"], verify=True, options=V15)
    counts = rep.passes[0].counts
    assert counts.get("reshaped-inputs") == 2 and counts.get("skip:input-not-computed") == 1
    assert _resize_inputs(out) == ["Reshape", "Reshape", "input"]
    assert [n.op_type for n in out.graph.node].count("Reshape") == 1      # shared
    assert any(n.op_type == "Shape" for n in out.graph.node)     # a symbolic batch
    onnx.checker.check_model(out, full_check=True)
    feeds = _feeds(rng)
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_static_shape_is_a_constant(rng):
    out, rep = rewriter.rewrite(nhwc_model(batch=1), ["resize-inputs"], options=V15)
    assert rep.passes[0].counts.get("reshaped-inputs") == 2
    assert not any(n.op_type == "Shape" for n in out.graph.node)
    feeds = _feeds(rng, 1)
    for a, b in zip(run_ort(nhwc_model(batch=1), feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_nothing_for_216_and_later():
    m = nhwc_model()
    for version in ("2.16", (2, 17)):
        out, rep = rewriter.rewrite(m, ["resize-inputs"], options={"migraphx_version": version})
        assert not rep.passes[0].changed
        assert rep.passes[0].counts.get("skip:fixed-in-target-version") == 3
        assert _resize_inputs(out) == ["Relu", "Relu", "input"]


def test_kept_through_the_pipeline_and_idempotent(rng):
    m = nhwc_model(seed=3)
    out, rep = rewriter.rewrite(m, target="migraphx", options=V15, verify=True,
                                inputs=_feeds(rng))
    assert rep.ok and rep.verified
    assert _resize_inputs(out) == ["Reshape", "Reshape", "input"]
    assert not any("still changed" in w for w in rep.warnings), rep.warnings
    again, rep2 = rewriter.rewrite(out, ["resize-inputs"], options=V15)
    assert not rep2.passes[0].changed
    assert rep2.passes[0].counts.get("skip:input-already-reshaped") == 2
    assert again.SerializeToString() == out.SerializeToString()


def test_in_the_default_pipeline_for_migraphx_only():
    pipeline = default_pipeline("migraphx")
    assert pipeline.index("resize-inputs") > pipeline.index("collapse-chains")
    assert pipeline.index("resize-inputs") > pipeline.index("merge-duplicates")
    assert "resize-inputs" not in default_pipeline(None)


@pytest.mark.migraphx
def test_migraphx_computes_the_rewrite_right(rng, tmp_path, migraphx_version):
    """On 2.15 `ref` the original is off (max |error| 2.4-6.3 measured), the rewrite equal to
    onnxruntime; on 2.16 both are right and the pass writes nothing."""
    from rewriter.migraphx import backend
    from rewriter.migraphx.check import check_model

    m = nhwc_model(batch=1, seed=5)
    feeds = _feeds(rng, 1)
    want = run_ort(m, feeds)
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(m, src)
    out, rep = rewriter.rewrite(m, target="migraphx")      # the installed version
    onnx.save(out, dst)
    got = backend.compile_and_run(dst, feeds, None, target="ref").outputs
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.reshape(g, w.shape), w, rtol=1e-5, atol=1e-5)
    off = tuple(migraphx_version[:2]) < (2, 16)
    if off:
        orig = backend.compile_and_run(src, feeds, None, target="ref").outputs
        assert np.abs(np.reshape(orig[0], want[0].shape) - want[0]).max() > 0.1
    said = {f.node for f in check_model(m, version=migraphx_version).findings
            if f.code == "resize-strided-input"}
    assert len(said) == (2 if off else 0)        # the two Resizes of the Relu, not of y
    assert not any(f.code == "resize-strided-input"
                   for f in check_model(out, version=migraphx_version).findings)


def test_a_cast_after_the_reshape_counts_as_reshaped(rng):
    """convert-fp16 puts a Cast between our Reshape and an FP16 Resize: a Cast keeps the
    standard layout, so no second Reshape (a plan's output rewritten again is unchanged),
    and the static check says nothing."""
    from rewriter.migraphx.check import check_model

    m = make_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[1, 6, 5, 3] x) => (float[1, 3, 12, 10] y) {
        t = Transpose <perm = [0, 3, 1, 2]> (x)
        r = Reshape (t, own)
        h = Cast <to = 10> (r)
        u = Resize <mode = "linear"> (h, roi, s2)
        y = Cast <to = 1> (u)
    }""", {"own": np.array([1, 3, 6, 5], np.int64), "roi": np.zeros(0, np.float32),
           "s2": np.array([1, 1, 2, 2], np.float32)})
    out, rep = rewriter.rewrite(m, ["resize-inputs"], options=V15)
    assert not rep.passes[0].changed
    assert rep.passes[0].counts.get("skip:input-already-reshaped") == 1
    assert not any(f.code == "resize-strided-input"
                   for f in check_model(m, version=(2, 15)).findings)
    kept, rep = rewriter.rewrite(m, target="migraphx", options=V15)   # collapse-chains too
    assert [n.op_type for n in kept.graph.node] == [n.op_type for n in m.graph.node]
    assert not any("still changed" in w for w in rep.warnings), rep.warnings
    again, _ = rewriter.rewrite(kept, target="migraphx", options=V15)
    assert again.SerializeToString() == kept.SerializeToString()
