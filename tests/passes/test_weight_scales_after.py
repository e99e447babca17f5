"""weight-scales-after: a Q/DQ model's per-channel weight scales move after the layer
(MIGraphX 2.16 throws on per-axis weight DequantizeLinear); the same numbers up to float
rounding, the same names, only where the form is right."""

import numpy as np
import onnx
from conftest import make_model, ops, run_ort

import rewriter

QDQ = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, 8, 8] x, float[N, 6] v) => (float[N, 5, 8, 8] y, float[N, 3] z, float[N, 3] u) {
    xq = QuantizeLinear (x, sx, zx)
    xd = DequantizeLinear (xq, sx, zx)
    wd = DequantizeLinear <axis = 0> (wq, sw, zw)
    bd = DequantizeLinear <axis = 0> (bq, sb, zb)
    c = Conv <pads = [1, 1, 1, 1]> (xd, wd, bd)
    y = Relu (c)
    vq = QuantizeLinear (v, sv, zx)
    vd = DequantizeLinear (vq, sv, zx)
    md = DequantizeLinear <axis = 1> (mq, sm, zm)
    z = MatMul (vd, md)
    gd = DequantizeLinear <axis = 0> (gq, sg, zg)
    u = Gemm <transB = 1, beta = 0.5> (vd, gd, cg)
}
"""


def qdq_model(rng, zw=None):
    s_x, s_v = np.float32(0.03), np.float32(0.02)
    sw = rng.uniform(0.005, 0.05, 5).astype(np.float32)
    return make_model(QDQ, {
        "sx": np.array(s_x), "zx": np.array(0, np.int8), "sv": np.array(s_v),
        "wq": rng.integers(-127, 128, (5, 4, 3, 3)).astype(np.int8), "sw": sw,
        "zw": np.zeros(5, np.int8) if zw is None else zw,
        "bq": rng.integers(-2000, 2000, 5).astype(np.int32), "sb": (s_x * sw).astype(np.float32),
        "zb": np.zeros(5, np.int32),
        "mq": rng.integers(-127, 128, (6, 3)).astype(np.int8),
        "sm": rng.uniform(0.01, 0.1, 3).astype(np.float32), "zm": np.zeros(3, np.int8),
        "gq": rng.integers(-127, 128, (3, 6)).astype(np.int8),
        "sg": rng.uniform(0.01, 0.1, 3).astype(np.float32), "zg": np.zeros(3, np.int8),
        "cg": rng.standard_normal(3).astype(np.float32)})


def feeds(rng, n=2):
    return {"x": rng.standard_normal((n, 4, 8, 8)).astype(np.float32),
            "v": rng.standard_normal((n, 6)).astype(np.float32)}


def wsa(m, **kw):
    return rewriter.rewrite(m, ["weight-scales-after"], verify=True, **kw)


def test_conv_matmul_gemm_scales_move_after_the_layer(rng):
    m = qdq_model(rng)
    out, rep = wsa(m, input_shapes={"x": [2, 4, 8, 8], "v": [2, 6]})
    assert rep.passes[0].counts["weight-scales-moved"] == 3
    # Every weight DQ now has a 0-d scale of 1.0 and no axis; the scales are Muls after.
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    for n in out.graph.node:
        if n.op_type == "DequantizeLinear" and inits.get(n.input[0], np.zeros(1)).dtype == \
                np.int8 and inits[n.input[0]].ndim >= 2:
            assert inits[n.input[1]].shape == () and inits[n.input[1]] == 1.0
            assert not any(a.name == "axis" for a in n.attribute)
    assert ops(out).count("Mul") == 3 and ops(out).count("Add") == 2   # conv and Gemm biases
    assert [o.name for o in out.graph.output] == ["y", "z", "u"]
    layers = {n.name: n.op_type for n in out.graph.node if n.op_type in ("Conv", "MatMul", "Gemm")}
    assert sorted(layers.values()) == ["Conv", "Gemm", "MatMul"]
    f = feeds(rng, 3)
    for a, b in zip(run_ort(m, f), run_ort(out, f)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


def test_left_alone_where_the_form_is_not_the_one(rng):
    """A weight zero point not all zero, a weight DQ two layers read, MIGraphX 2.15 (which
    lowers per-axis weights) and a per-tensor weight DQ: nothing changes."""
    zw = np.zeros(5, np.int8)
    zw[2] = 3
    out, rep = wsa(qdq_model(rng, zw=zw))
    assert rep.passes[0].counts["skip:weight-zero-point"] == 1
    assert rep.passes[0].counts["weight-scales-moved"] == 2       # MatMul and Gemm still
    out, rep = wsa(qdq_model(rng), options={"migraphx_version": (2, 15)})
    assert not rep.passes[0].changed and ops(out).count("Mul") == 0
    shared = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 6] v) => (float[N, 3] z, float[N, 3] t) {
        md = DequantizeLinear <axis = 1> (mq, sm, zm)
        z = MatMul (v, md)
        t = MatMul (v, md)
        pd = DequantizeLinear (mq, s1, z1)
        w = MatMul (v, pd)
    }""", {"mq": rng.integers(-127, 128, (6, 3)).astype(np.int8),
           "sm": np.full(3, 0.1, np.float32), "zm": np.zeros(3, np.int8),
           "s1": np.array(0.1, np.float32), "z1": np.array(0, np.int8)})
    out, rep = wsa(shared)
    assert rep.passes[0].counts["skip:shared-weight"] == 2 and not rep.passes[0].changed


def test_only_in_the_migraphx_pipeline(rng):
    from rewriter.core.registry import default_pipeline
    m = qdq_model(rng)
    _, rep = rewriter.rewrite(m, target=None)
    assert "weight-scales-after" not in [p.name for p in rep.passes]
    _, rep = rewriter.rewrite(m, default_pipeline("migraphx"), verify=True,
                              options={"migraphx_version": (2, 16)})
    moved = next(p for p in rep.passes if p.name == "weight-scales-after")
    assert moved.counts["weight-scales-moved"] == 3


def test_int4_weights_and_onnxruntimes_contrib_dqs_move_too(rng):
    """onnxruntime's quantize_static with QInt4 per-channel weights writes com.microsoft
    Q/DQ (int4 needs opset 21 in the standard domain). MIGraphX reads them by op type, and
    2.16 throws on their per-axis weights as on int8 ones: the pass left them (domain), and
    an int4 weight was left anyway (int8 only). The weight is now written in int8, the same
    values, and its scales moved; the DQ written is a standard int8 one."""
    import ml_dtypes
    text = QDQ.replace('opset_import: ["" : 17]', 'opset_import: ["" : 17, "com.microsoft" : 1]')
    text = text.replace("md = DequantizeLinear <axis = 1> (mq, sm, zm)",
                        "md = com.microsoft.DequantizeLinear <axis = 1> (mq, sm, zm)")
    base = qdq_model(rng)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in base.graph.initializer}
    inits["mq"] = rng.integers(-8, 8, (6, 4)).astype(ml_dtypes.int4)
    inits["zm"] = np.zeros(4, ml_dtypes.int4)
    inits["sm"] = rng.uniform(0.01, 0.1, 4).astype(np.float32)
    text = text.replace("float[N, 3] z", "float[N, 4] z")
    m = make_model(text, inits)
    out, rep = wsa(m, input_shapes={"x": [2, 4, 8, 8], "v": [2, 6]})
    assert rep.passes[0].counts["weight-scales-moved"] == 3, rep.passes[0].counts
    mm = next(n for n in out.graph.node if n.op_type == "MatMul")
    dq = next(n for n in out.graph.node if mm.input[1] in n.output)
    w = next(t for t in out.graph.initializer if t.name == dq.input[0])
    assert dq.domain == "" and w.data_type == onnx.TensorProto.INT8, (dq, w.data_type)
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(w),
                                  inits["mq"].astype(np.int8))
    f = feeds(rng, 3)
    for a, b in zip(run_ort(m, f), run_ort(out, f)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * float(np.abs(a).max()))


def test_a_memory_mapped_weight_stays_on_disk(rng, tmp_path):
    """The weight was read through ``values``, which loads a memory-mapped weight for good
    (the writer then inlines what it would stream): the new DQ reads it as it is, mapped."""
    from rewriter.core.convert import to_graph
    from rewriter.core.graph import Namer
    from rewriter.core.load import ExternalValues, load_model
    from rewriter.core.pass_base import Context
    from rewriter.passes.weight_scales_after import WeightScalesAfter
    m = qdq_model(rng)
    onnx.save(onnx.ModelProto.FromString(m.SerializeToString()), tmp_path / "m.onnx",
              save_as_external_data=True, location="m.bin", size_threshold=0)
    g = to_graph(load_model(tmp_path / "m.onnx"), base_dir=tmp_path)
    w = g.tensors()["wq"]
    assert isinstance(w._values, ExternalValues)
    assert WeightScalesAfter().run(g, Context(namer=Namer(g))).changed
    assert isinstance(w._values, ExternalValues)
    out, _ = rewriter.rewrite(tmp_path / "m.onnx", ["weight-scales-after"])
    x = {"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32),
         "v": rng.standard_normal((2, 6)).astype(np.float32)}
    for a, b in zip(run_ort(m, x), run_ort(out, x)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=0.1)
