"""Tests for the static MIGraphX check (rewriter/migraphx/check.py) and its profile data.

One small model per problem kind, written in ONNX text syntax with seeded, distinct
initializer values; each test asserts the finding's code and the node it names. The clean
QDQ model in MIGraphX's form must produce no QDQ findings, and the light model-zoo models
shipped in the onnx wheel must parse (no unsupported op).
"""

from __future__ import annotations

import copy
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import TensorProto, helper, numpy_helper

from rewriter.migraphx.check import CheckResult, Finding, load_profile, render_text
from rewriter.migraphx.check import check_model as _check_model

REPO = Path(__file__).resolve().parents[1]
OPS_TXT = Path("/work/shared/migraphx/onnx_ops.txt")
HEAD = '<ir_version: 10, opset_import: ["" : 21]>'
RNG = np.random.default_rng(0)
# The packaged profile, not an installed MIGraphX's op list: these tests pin its data.
PROFILE = load_profile(use_installed=False)


def check_model(model, **kw) -> CheckResult:
    kw.setdefault("profile", PROFILE)
    return _check_model(model, **kw)


def build(text: str, head: str = HEAD, **inits: np.ndarray) -> onnx.ModelProto:
    """Parse a model, add initializers, name every node '<first output>_node', validate."""
    model = onnx.parser.parse_model(f"{head}\n{text}")
    for name, value in inits.items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    for node in model.graph.node:
        node.name = node.name or f"{node.output[0]}_node"
    onnx.checker.check_model(model, full_check=True)
    return model


def codes(result: CheckResult, severity: str | None = None) -> set[str]:
    return set(result.codes(severity))


def named(result: CheckResult, code: str) -> list[str]:
    return [f.node for f in result.findings if f.code == code]


def qdq_conv(*, w_scale=None, w_zp=np.int8(0), x_scale=np.float32(0.05), x_zp=np.int8(0),
             group=1, c_in=4, c_out=8, w_axis=0) -> onnx.ModelProto:
    """x -> Q -> DQ -> Conv <- DQ <- int8 weight: MIGraphX's int8 form unless overridden."""
    w = RNG.integers(-127, 128, size=(c_out, c_in // group, 3, 3), dtype=np.int8)
    if w_scale is None:
        w_scale = np.float32(0.01)
    inits = dict(w=w, ws=np.asarray(w_scale, np.float32), xs=np.asarray(x_scale, np.float32))
    xz = ", xz" if x_zp is not None else ""
    wz = ", wz" if w_zp is not None else ""
    if x_zp is not None:
        inits["xz"] = np.asarray(x_zp)
    if w_zp is not None:
        inits["wz"] = np.asarray(w_zp)
    text = f"""
    g (float[1,{c_in},8,8] x) => (float[1,{c_out},8,8] y) {{
        xq = QuantizeLinear(x, xs{xz})
        xd = DequantizeLinear(xq, xs{xz})
        wd = DequantizeLinear <axis={w_axis}> (w, ws{wz})
        y = Conv <pads=[1,1,1,1], group={group}> (xd, wd)
    }}"""
    return build(text, **inits)


# -- the clean form ------------------------------------------------------------------------------


def test_arguments_as_the_cli_takes_them():
    """docs/migraphx.md's call with the CLI's spellings (2026-12-07): version "2.16" was
    read as 2...1.6 (the rules of no version), a node name as its letters (a finding per
    letter), a list of dims was an AttributeError."""
    from rewriter.core.errors import InputError

    model = qdq_conv()
    want = check_model(model, plan_int8_nodes=["y_node"], version=(2, 16)).to_dict()
    assert check_model(model, plan_int8_nodes="y_node", version="2.16").to_dict() == want
    assert check_model(model, plan_int8_nodes=b"y_node", version="2.16").to_dict() == want
    with pytest.raises(InputError, match="plan_int8_nodes: node names"):
        check_model(model, plan_int8_nodes=[3], version="2.16")
    with pytest.raises(InputError, match="version 'new': 'X.Y'"):
        check_model(model, version="new")
    with pytest.raises(InputError, match="input_shapes: a dict of input name -> dims"):
        check_model(model, input_shapes=[1, 4, 8, 8])
    # a float was a TypeError (exit 3) and cannot tell 2.1 from 2.10; numpy ints are ints
    with pytest.raises(InputError, match="version 2.16: 'X.Y'"):
        check_model(model, version=2.16)
    assert check_model(model, plan_int8_nodes=["y_node"],
                       version=(np.int64(2), np.int64(16))).to_dict() == want


def test_clean_qdq_conv_has_no_qdq_findings_and_runs_in_onnxruntime():
    import onnxruntime as ort

    model = qdq_conv()
    result = check_model(model, plan_int8_nodes=["y_node"])
    assert result.ok
    assert not [f for f in result.findings if f.code.startswith(("qdq-", "plan-"))], \
        result.render()
    # The model is a real, runnable QDQ model, not just something the checker likes.
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": RNG.standard_normal((1, 4, 8, 8)).astype(np.float32)})
    assert y.shape == (1, 8, 8, 8) and np.isfinite(y).all()


def test_dq_feeding_non_conv_ops_is_fine():
    model = build("""
    g (float[1,4] x) => (float[1,4] y) {
        xq = QuantizeLinear(x, s, z)
        xd = DequantizeLinear(xq, s, z)
        r = Relu(xd)
        y = Add(r, b)
    }""", s=np.float32(0.1), z=np.int8(0), b=RNG.standard_normal((1, 4)).astype(np.float32))
    assert check_model(model).findings == []


# -- unsupported ops ------------------------------------------------------------------------------


def test_unsupported_op_is_named():
    model = build("""
    g (float[1,4] x) => (float[1,4] y) {
        m = Mish(x)
        y = Relu(m)
    }""")
    result = check_model(model)
    assert not result.ok
    (f,) = result.errors
    assert (f.code, f.node, f.op_type) == ("unsupported-op", "m_node", "Mish")
    assert "Tanh(Softplus(x))" in f.message          # the profile's hint


def test_unsupported_op_in_if_branch_is_found():
    model = build("""
    g (bool c, float[2] x) => (float[2] y) {
        y = If (c) <
            then_branch = t () => (float[2] a) { a = Mish(x) },
            else_branch = e () => (float[2] b) { b = Relu(x) }
        >
    }""")
    result = check_model(model)
    (f,) = [f for f in result.findings if f.code == "unsupported-op"]
    assert f.op_type == "Mish" and f.node == "a" and f.graph == "y_node/then_branch"


def test_unnamed_node_is_named_by_its_output():
    model = build("""
    g (float[1,4] x) => (float[1,4] y) { y = Mish(x) }""")
    model.graph.node[0].name = ""
    assert named(check_model(model), "unsupported-op") == ["y"]


def test_light_model_zoo_models_have_no_unsupported_op():
    paths = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__),
                                          "backend/test/data/light/*.onnx")))
    assert paths, "onnx wheel ships no light models"
    for path in paths:
        result = check_model(onnx.load(path, load_external_data=False))
        assert "unsupported-op" not in codes(result), (path, result.render())
        assert result.ok, (path, result.render())


# -- partial support ------------------------------------------------------------------------------


def test_pad_wrap_refused_reflect_accepted():
    text = """
    g (float[1,1,4,4] x) => (float[1,1,6,6] y, float[1,1,6,6] z) {
        y = Pad <mode="wrap"> (x, p)
        z = Pad <mode="reflect"> (x, p)
    }"""
    result = check_model(build(text, p=np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)))
    assert named(result, "pad-mode-refused") == ["y_node"]
    assert [f.severity for f in result.findings] == ["error"]


def test_resize_modes_refused():
    text = """
    g (float[1,1,4,4] x) => (float[1,1,8,8] a, float[1,1,8,8] b, float[1,1,8,8] c,
                             float[1,1,8,8] d) {
        a = Resize <mode="cubic"> (x, , s)
        b = Resize <mode="linear", coordinate_transformation_mode="tf_crop_and_resize">
                   (x, roi, s)
        c = Resize <mode="linear", exclude_outside=1> (x, , s)
        d = Resize <mode="linear"> (x, , s)
    }"""
    model = build(text, s=np.array([1, 1, 2, 2], np.float32),
                  roi=np.array([0, 0, 0, 0, 1, 1, 1, 1], np.float32))
    result = check_model(model)
    assert sorted(named(result, "resize-mode-refused")) == ["a_node", "b_node", "c_node"]


def test_cubic_resize_refused_on_2_15_only():
    """2.15's Resize parser throws on mode=cubic; 2.16 parses it and matches onnxruntime
    (tests/test_migraphx_rules.py): YOLOS's and DINOv2's interpolated position embeddings
    were called refused on 2.16, where they compile (thirty-sixth round)."""
    model = build("""
    g (float[1,1,4,4] x) => (float[1,1,8,8] a) {
        a = Resize <mode="cubic"> (x, , s)
    }""", s=np.array([1, 1, 2, 2], np.float32))
    for version, refused in (((2, 15, 0), True), (None, True), ((2, 16, 0), False)):
        assert bool(named(check_model(model, version=version), "resize-mode-refused")) \
            == refused, version


def test_cubic_grid_sample_refused_linear_and_nearest_accepted():
    """MIGraphX's cubic GridSample throws for more than one channel and computes border and
    reflection padding wrongly (tests/test_migraphx_rules.py, both builds)."""
    text = """
    g (float[1,3,8,8] x, float[1,4,4,2] gr) => (float[1,3,4,4] a, float[1,3,4,4] b,
                                               float[1,3,4,4] c) {
        a = GridSample <mode="cubic"> (x, gr)
        b = GridSample <mode="linear", padding_mode="reflection"> (x, gr)
        c = GridSample <mode="nearest", padding_mode="border", align_corners=1> (x, gr)
    }"""
    result = check_model(build(text))
    assert named(result, "gridsample-mode-refused") == ["a_node"]
    old = build(text.replace('"cubic"', '"bicubic"').replace('"linear"', '"bilinear"'),
                head='<ir_version: 8, opset_import: ["" : 16]>')
    assert named(check_model(old), "gridsample-mode-refused") == ["a_node"]


def test_shape_inputs_constant_through_chains_and_computed_ones_found():
    text = """
    g (float[2,3,4] x, int64[2] shp, int64[3] reps) => (float[2,12] a, float[2,12] b,
                                                          float[4,9,8] c, int64[5] r) {
        sx = Shape(x)
        n = Gather <axis=0> (sx, zero)
        n1 = Unsqueeze(n, zero1)
        s2 = Concat <axis=0> (n1, minus1)
        a = Reshape(x, s2)
        b = Reshape(x, shp)
        c = Tile(x, reps)
        lim = Add(four, one)
        r = Range(zs, lim, one)
    }"""
    model = build(text, zero=np.array(0, np.int64), zero1=np.array([0], np.int64),
                  minus1=np.array([-1], np.int64), four=np.array(4, np.int64),
                  one=np.array(1, np.int64), zs=np.array(0, np.int64))
    result = check_model(model)
    found = {f.node: f.severity for f in result.findings if f.code == "input-not-constant"}
    # Shape -> Gather -> Unsqueeze -> Concat is constant for MIGraphX (static shapes);
    # so is Add of two constants. Only the inputs fed by graph inputs are reported.
    assert found == {"b_node": "warning", "c_node": "error"}


def test_constant_nodes_count_as_constant():
    model = build("""
    g (float[4] x, int64[1] kin) => (float[2] y, float[2] y2) {
        k = Constant <value = int64[1] {2}> ()
        y, i = TopK(x, k)
        y2, i2 = TopK(x, kin)
    }""")
    assert named(check_model(model), "input-not-constant") == ["y2_node"]


def test_sequence_and_optional_values_found():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2])))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    nodes = [helper.make_node("SequenceAt", ["s", "i"], ["a"], name="at"),
             helper.make_node("OptionalGetElement", ["o"], ["b"], name="get"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "g", [seq, opt], [y],
                              [numpy_helper.from_array(np.array(0, np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    result = check_model(model)
    assert sorted(named(result, "unsupported-value-type")) == ["o", "s"]
    assert sorted(named(result, "unsupported-op")) == ["at", "get"]


def test_ocp_fp8_refused_fnuz_accepted():
    w8 = helper.make_tensor("w8", TensorProto.FLOAT8E4M3FN, [2], [1.0, 2.0])
    wz = helper.make_tensor("wz", TensorProto.FLOAT8E4M3FNUZ, [2], [1.0, 2.0])
    nodes = [helper.make_node("Cast", ["w8"], ["a"], to=TensorProto.FLOAT, name="c1"),
             helper.make_node("Cast", ["wz"], ["b"], to=TensorProto.FLOAT, name="c2"),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT8E5M2, name="c3")]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT8E5M2, [2])], [w8, wz])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    result = check_model(model)
    found = sorted(named(result, "unsupported-dtype"))
    assert "w8" in found and "c3" in found
    assert "wz" not in found and "c2" not in found


# -- QDQ that would run in float ------------------------------------------------------------------


def test_uint8_qdq_found_and_plan_warned():
    model = qdq_conv(x_zp=np.uint8(128))
    result = check_model(model, plan_int8_nodes=["y_node"])
    assert set(named(result, "qdq-uint8")) == {"xq_node", "xd_node"}
    (f,) = [f for f in result.findings if f.code == "plan-int8-stays-float"]
    assert f.node == "y_node" and "uint8" in f.message and "quant_convolution" in f.message


def test_missing_zero_point_found():
    result = check_model(qdq_conv(w_zp=None), plan_int8_nodes=["y_node"])
    assert named(result, "qdq-no-zero-point") == ["wd_node"]
    assert named(result, "plan-int8-stays-float") == ["y_node"]


def test_computed_scale_found():
    model = build("""
    g (float[1,4] x, float s) => (float[1,4] y) {
        xq = QuantizeLinear(x, s, z)
        y = DequantizeLinear(xq, s, z)
    }""", z=np.int8(0))
    assert set(named(check_model(model), "qdq-scale-not-constant")) == {"xq_node", "y_node"}


@pytest.mark.parametrize("bad", [0.0, -0.5, float("nan")])
def test_zero_or_negative_scale_is_warned_per_version(bad):
    for version, says in ((None, "2.16 runs the layer in float, 2.15 lowers"),
                          ((2, 16), "run in float"), ((2, 15), "2.15 lowers the layer")):
        if bad != 0:
            says = "nothing in MIGraphX rejects a negative or non-finite scale"
        result = check_model(qdq_conv(x_scale=np.float32(bad)), version=version)
        assert set(named(result, "qdq-scale-not-positive")) == {"xq_node", "xd_node"}
        found = [f for f in result.findings if f.code == "qdq-scale-not-positive"]
        assert {f.severity for f in found} == {"warning"}
        assert all(says in f.message for f in found), (version, found[0].message)


def test_per_channel_activation_scale_found():
    model = build("""
    g (float[1,4,2,2] x) => (float[1,4,2,2] y) {
        xq = QuantizeLinear <axis=1> (x, s, z)
        y = DequantizeLinear <axis=1> (xq, s, z)
    }""", s=np.array([0.1, 0.2, 0.3, 0.4], np.float32), z=np.zeros(4, np.int8))
    assert set(named(check_model(model), "qdq-per-channel-activation")) == {"xq_node", "y_node"}


def folded_weight_conv(c_in: int = 4, c_out: int = 8) -> onnx.ModelProto:
    """A dequantized activation into a conv whose weight is a float constant."""
    return build(f"""
    g (float[1,{c_in},8,8] x) => (float[1,{c_out},8,8] y) {{
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        y = Conv <pads=[1,1,1,1]> (xd, w)
    }}""", w=RNG.standard_normal((c_out, c_in, 3, 3)).astype(np.float32),
                 xs=np.float32(0.05), xz=np.int8(0))


def test_folded_weight_found_and_plan_names_the_conv():
    model = folded_weight_conv()
    result = check_model(model, plan_int8_nodes=["y_node"])
    assert named(result, "qdq-weight-folded") == ["y_node"]
    (f,) = [f for f in result.findings if f.code == "plan-int8-stays-float"]
    assert f.node == "y_node" and "input 1 'w' is not dequantized" in f.message


def test_only_weight_dequantized_found():
    model = build("""
    g (float[2,4] a) => (float[2,3] y) {
        bd = DequantizeLinear(b, bs, bz)
        y = MatMul(a, bd)
    }""", b=RNG.integers(-127, 128, (4, 3), dtype=np.int8), bs=np.float32(0.02), bz=np.int8(0))
    result = check_model(model, plan_int8_nodes=["y_node"])
    assert named(result, "qdq-half-quantized") == ["y_node"]
    assert "quant_dot" in [f for f in result.findings if f.node == "y_node"][-1].message


def test_scale_shape_one_on_a_conv_input_is_an_error_elsewhere_a_warning():
    result = check_model(qdq_conv(x_scale=np.array([0.05], np.float32)))
    assert set(named(result, "qdq-scale-shape-1")) == {"xq_node", "xd_node"}
    assert {f.severity for f in result.findings if f.code == "qdq-scale-shape-1"} == {"error"}
    assert not result.ok
    model = build("""
    g (float[1,4] x) => (float[1,4] y) {
        xq = QuantizeLinear(x, s, z)
        y = DequantizeLinear(xq, s, z)
    }""", s=np.array([0.1], np.float32), z=np.array([0], np.int8))
    other = check_model(model)
    assert {f.severity for f in other.findings if f.code == "qdq-scale-shape-1"} == {"warning"}


def test_per_channel_weights_by_version_and_wrong_axis_warned():
    scales = (np.arange(8, dtype=np.float32) + 1) / 100
    for version, severity in (((2, 16), "error"), ((2, 15), "info"), (None, "warning"),
                              ((3, 1), "error")):
        for group, c_in in ((4, 4), (1, 4)):  # depthwise-like and plain: the same rule
            r = check_model(qdq_conv(w_scale=scales, w_zp=np.zeros(8, np.int8), group=group,
                                     c_in=c_in), version=version)
            (f,) = [f for f in r.findings if f.code == "qdq-per-channel-weight"]
            assert (f.node, f.severity) == ("y_node", severity), version
            assert "qdq-weight-axis" not in codes(r)
    wrong = check_model(qdq_conv(w_scale=scales[:4], w_zp=np.zeros(4, np.int8), w_axis=1))
    assert named(wrong, "qdq-weight-axis") == ["y_node"]


def test_nonzero_zero_point_is_info():
    result = check_model(qdq_conv(x_zp=np.int8(3)))
    assert {f.severity for f in result.findings} == {"info"}
    assert set(named(result, "qdq-nonzero-zero-point")) == {"xq_node", "xd_node"}


def _padded_outputs_model() -> onnx.ModelProto:
    """NonZero and NMS on computed inputs, and a NonZero of a constant (also
    tests/test_migraphx_rules.py)."""
    return build("""
    g (float[2, 3] x, float[1, 6, 4] b, float[1, 2, 6] s) => (int64[2, N] nz, int64[M, 3] sel,
                                                               int64[2, K] cz) {
        m = Greater (x, t)
        nz = NonZero (m)
        sel = NonMaxSuppression (b, s, mo, iou, thr)
        cz = NonZero (c)
    }""", t=np.float32(0.5), mo=np.array([3], np.int64), iou=np.array([0.5], np.float32),
        thr=np.array([0.3], np.float32), c=np.array([[1, 0, 2], [0, 3, 0]], np.float32))


def test_nonzero_and_nms_on_computed_inputs_are_padded_outputs():
    """MIGraphX pads NonZero's and NonMaxSuppression's outputs to a fixed size with zeros
    that read as valid indices (measured in tests/test_migraphx_rules.py): an error on
    computed inputs; a constant NonZero is evaluated at parse time, to its real size."""
    result = check_model(_padded_outputs_model())
    assert sorted(named(result, "output-padded")) == ["nz_node", "sel_node"]
    assert {f.severity for f in result.findings if f.code == "output-padded"} == {"error"}


def test_fp16_input_with_fp32_scale_is_an_error():
    # Valid ONNX only from opset 23 (before, x and y_scale share one type); MIGraphX refuses it.
    model = build("""
    g (float16[1,4] x) => (float16[1,4] y) {
        xq = QuantizeLinear(x, s, z)
        xd = DequantizeLinear(xq, s, z)
        y = Cast <to=10> (xd)
    }""", head='<ir_version: 10, opset_import: ["" : 23]>', s=np.float32(0.1), z=np.int8(0))
    assert named(check_model(model), "qdq-scale-type") == ["xq_node"]


def test_external_scale_not_checked(tmp_path):
    model = qdq_conv()
    onnx.save(model, tmp_path / "m.onnx", save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.data", size_threshold=0)
    loaded = onnx.load(tmp_path / "m.onnx", load_external_data=False)
    result = check_model(loaded)
    assert "qdq-scale-not-checked" in codes(result, "info")
    assert "qdq-scale-not-positive" not in codes(result)


# -- inputs, channels, plans ----------------------------------------------------------------------


def test_input_shape_advice_puts_the_size_a_weight_fixes():
    # optimum's image exports declare pixel_values [batch_size, num_channels, height, width]:
    # the advice said 1x{num_channels}x{height}x{width}, where the first conv's weight says 3.
    model = build("""
    g (float[N, C, H, W] x) => (float[N, 4, H2, W2] y) { y = Conv <pads = [1, 1, 1, 1]> (x, w) }""",
                  w=np.ones((4, 3, 3, 3), np.float32))
    (f,) = [f for f in check_model(model).findings if f.code == "dynamic-input-dim"]
    assert "--input-shape x:1x3x{H}x{W} " in f.message, f.message


def test_dynamic_dims_need_input_shape():
    model = build("""
    g (float[N,3,H,8] x) => (float[N,3,H,8] y) { y = Relu(x) }""")
    (f,) = check_model(model).findings
    assert (f.code, f.node, f.severity) == ("dynamic-input-dim", "x", "warning")
    assert "[0, 2]" in f.message and "--input-shape" in f.message
    # Without sizes known to run, the batch is 1 and the other symbolic dims are named for
    # the user to replace: 1 there (x:1x3x1x8) is what MIGraphX silently uses, and a guess
    # --input-shape accepted would compile at that guess. Pasted as is, it says so.
    from rewriter.core.errors import InputError
    from rewriter.verify import parse_shape_args
    hint = f.message.split("--input-shape ")[1].split()[0]
    assert hint == "x:1x3x{H}x8"
    with pytest.raises(InputError, match=r"replace \{H\} with your size$"):
        parse_shape_args([hint])
    odd = build("""
    g (float[N, 3, image_height, width_x, 8] x) => (float[N, 3, image_height, width_x, 8] y)
    { y = Relu(x) }""")
    (f,) = check_model(odd).findings
    assert "--input-shape x:1x3x{image_height}x{d3}x8 " in f.message   # an 'x' would split
    # With sizes known to run (what verification used: 1 may not, as in MTCNN's P-Net),
    # the suggestion is those; an example that contradicts the declared dims is ignored.
    (f,) = check_model(model, examples={"x": [1, 3, 32, 8]}).findings
    assert "--input-shape x:1x3x32x8 " in f.message
    (f,) = check_model(model, examples={"x": [1, 4, 32, 8]}).findings
    assert "--input-shape x:1x3x{H}x8 " in f.message
    assert check_model(model, input_shapes={"x": [2, 3, 5, 8]}).findings == []
    other = check_model(model, input_shapes={"x": [2, 3, 5, 8], "z": [1]})
    assert named(other, "input-shape-unknown-input") == ["z"]
    wrong = check_model(model, input_shapes={"x": [2, 4, 5, 8]})
    assert named(wrong, "input-shape-mismatch") == ["x"]
    # A shape without a name (--input-shape 2x3x5x8, as the help allows) is the input of
    # its rank's, as the feeds read it: it warned that x was symbolic, suggesting the very
    # shape given, and that '' was no graph input.
    assert check_model(model, input_shapes={"": [2, 3, 5, 8]}).findings == []
    assert named(check_model(model, input_shapes={"": [2, 4, 5, 8]}),
                 "input-shape-mismatch") == ["x"]
    (f,) = check_model(model, input_shapes={"": [2, 3, 5]}).findings[1:]
    assert f.code == "input-shape-unknown-input" and "fits no graph input" in f.message
    scalar = build("""
    g (float[N, 3, H, 8] x, float s) => (float[N, 3, H, 8] y) { y = Mul(x, s) }""")
    assert check_model(scalar, input_shapes={"x": [2, 3, 5, 8]}).findings == []


def test_conv_channels_not_multiple_is_info():
    def conv(c_in, c_out):
        w = RNG.standard_normal((c_out, c_in, 1, 1)).astype(np.float32)
        return build(f"""
        g (float[1,{c_in},4,4] x) => (float[1,{c_out},4,4] y) {{ y = Conv(x, w) }}""", w=w)

    (f,) = check_model(conv(3, 6)).findings
    assert (f.code, f.node, f.severity) == ("conv-channels-not-multiple", "y_node", "info")
    assert "C_in per group 3" in f.message and "C_out 6" in f.message
    assert check_model(conv(8, 16)).findings == []
    # Depthwise: C_in per group is 1, only C_out matters.
    assert check_model(qdq_conv(group=4, c_in=4, c_out=4)).findings == []


def test_plan_names_unknown_and_non_conv_nodes():
    model = build("""
    g (float[1,4] x) => (float[1,4] y) { y = Relu(x) }""")
    result = check_model(model, plan_int8_nodes=["nope", "y_node"])
    assert named(result, "plan-node-not-found") == ["nope"]
    assert named(result, "plan-int8-stays-float") == ["y_node"]


# -- profile as data, reporting -------------------------------------------------------------------


def test_profile_is_data(tmp_path):
    profile = load_profile(use_installed=False)
    assert len(profile["onnx_ops"]) == 185 and "Conv" in profile["onnx_ops"]
    assert "Mish" not in profile["onnx_ops"]
    assert profile["source"]["ops_commit"].startswith("f729a52")
    # A MIGraphX that parses Mish and refuses 'reflect' padding is a data change only.
    newer = copy.deepcopy(profile)
    newer["onnx_ops"].append("Mish")
    newer["attribute_rules"][0]["refused"].append("reflect")
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(newer))
    model = build("""
    g (float[1,1,4,4] x) => (float[1,1,6,6] y) {
        m = Mish(x)
        y = Pad <mode="reflect"> (m, p)
    }""", p=np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    assert codes(check_model(model, profile=load_profile(use_installed=False))) == {
        "unsupported-op"}
    assert codes(check_model(model, profile=load_profile(path, use_installed=False))) == {
        "pad-mode-refused"}


def test_bad_profile_schema_is_refused(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(ValueError, match="schema_version"):
        load_profile(path)


def test_render_and_to_dict():
    result = check_model(qdq_conv(x_zp=np.uint8(128)), plan_int8_nodes=["y_node"])
    text = render_text(result)
    lines = text.splitlines()
    assert lines[0].startswith("MIGraphX check: 0 error(s), 3 warning(s)")
    # One line per rule: count, nodes, what the rule says once.
    (uint8,) = [x for x in lines if x.startswith("warning qdq-uint8 (2): ")]
    assert "xq_node, xd_node" in uint8 and uint8.count("uint8 QDQ is rejected") == 1
    assert len(lines) == 3
    detailed = render_text(result, details=True).splitlines()
    assert any(x.startswith("  warning plan-int8-stays-float: y_node [Conv]: ") for x in detailed)
    d = json.loads(json.dumps(result.to_dict()))
    assert d["ok"] is True and d["counts"]["warning"] == 3
    assert d["profile"]["migraphx_version"] == "2.16.0"
    assert Finding(**d["findings"][0]) == result.findings[0]


def test_check_model_accepts_a_path(tmp_path):
    onnx.save(qdq_conv(), tmp_path / "m.onnx")
    assert check_model(str(tmp_path / "m.onnx")).findings == []


@pytest.mark.skipif(not OPS_TXT.exists(), reason="shared/migraphx/onnx_ops.txt not present")
def test_packaged_op_list_is_reproducible_from_onnx_ops_txt():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "make_migraphx_profile.py"),
                           str(OPS_TXT), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.migraphx
def test_foreign_domain_is_parsed_as_the_standard_op_by_migraphx(migraphx_version):
    """MIGraphX looks ops up by name only (src/onnx/onnx_parser.cpp:620): a Relu in a
    custom domain compiles as a plain Relu; the check must call that out."""
    import migraphx

    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"], name="r", domain="com.example")], "g",
        [onnx.helper.make_tensor_value_info("x", 1, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", 1, [2, 3])]),
        opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.example", 1)])
    prog = migraphx.parse_onnx_buffer(model.SerializeToString())
    assert "relu" in str(prog)                # parsed, domain ignored
    (f,) = [f for f in check_model(model).findings if f.code == "foreign-domain"]
    assert f.node == "r" and f.severity == "error"


def test_summary_line_never_shows_a_common_ending_cut_inside_a_word():
    """Two inputs' messages that end alike only inside a token (':1x1 with your sizes...')
    once printed as 'src, src_mask: :1x1 with your sizes ...'. A reason shared from a ': '
    on is shown once; otherwise the first node's own message, said to be an example."""
    def finding(node, msg):
        return Finding("warning", "dynamic-input-dim", node, "input", msg)

    odd = CheckResult([finding("src", "dims batchxsrc_len: pass --input-shape src:1x1 with "
                                      "your sizes at position(s) [0, 1]"),
                       finding("mask", "dims batchxlen: pass --input-shape mask:1x1 with "
                                       "your sizes at position(s) [0, 1]")])
    assert odd.summary_lines() == [
        "warning dynamic-input-dim (2): src, mask: e.g. src: dims batchxsrc_len: pass "
        "--input-shape src:1x1 with your sizes at position(s) [0, 1]"]
    alike = CheckResult([finding("a", "a: the same reason, at some length"),
                         finding("b", "b: the same reason, at some length")])
    assert alike.summary_lines() == [
        "warning dynamic-input-dim (2): a, b: the same reason, at some length"]
    # The same message for every node (two DynamicQuantizeLSTMs) is shown whole: its start
    # names the op, which cutting at the first ': ' dropped.
    same = "DynamicQuantizeLSTM (domain 'com.microsoft'): parsing throws 'Unknown operator'"
    twins = CheckResult([Finding("error", "unsupported-op", n, "input", same)
                         for n in ("l1", "l2")])
    assert twins.summary_lines() == [f"error unsupported-op (2): l1, l2: {same}"]


def test_rewrite_checks_with_the_gates_inferred_copy_as_on_its_own(tmp_path):
    """The rewriter hands the check the exit gate's shape-inferred copy, whose float
    weights are graph inputs: every finding must be the one the check makes by itself on
    the written model (weights still count as constants, declared types still count)."""
    from rewriter.api import rewrite

    # 64x64x3x3 float32 = 144 KB: above SMALL_TENSOR, a stub in the check's copy.
    folded, big = folded_weight_conv(), folded_weight_conv(64, 64)
    models = {"folded": folded, "big-weight": big, "qdq": qdq_conv(w_axis=0),
              "uint8": qdq_conv(x_zp=np.uint8(128)),
              "dynamic": onnx.load(REPO / "models" / "resnet_mini.onnx")}
    for name, model in models.items():
        out = tmp_path / f"{name}.onnx"
        _, report = rewrite(model, output=out, target="migraphx")
        version = report.extra["migraphx_check"]["profile"]["target_version"]
        alone = _check_model(onnx.load(out), version=tuple(map(int, version.split(".")))
                             if version else None).to_dict()
        assert report.extra["migraphx_check"] == alone, name
        found = {f["code"] for f in alone["findings"]}
        assert ("qdq-weight-folded" in found) == (name in ("folded", "big-weight")), name


def _int4_model(shape: tuple, zp_shape: tuple | None = None, in_constant: bool = False):
    """x + DequantizeLinear(int4 q, scale, int4 zero point): int4 tensors of given shapes."""
    import ml_dtypes

    q = numpy_helper.from_array(np.zeros(shape, ml_dtypes.int4), "q")
    inits = [q, numpy_helper.from_array(np.ones(zp_shape or (), np.float32), "s")]
    nodes = []
    if zp_shape is not None:
        inits.append(numpy_helper.from_array(np.zeros(zp_shape, ml_dtypes.int4), "z"))
    if in_constant:
        nodes.append(helper.make_node("Constant", [], ["q"], name="qc", value=inits.pop(0)))
    nodes += [helper.make_node("DequantizeLinear", ["q", "s"] + ["z"] * (zp_shape is not None),
                               ["d"], name="dq", axis=0),
              helper.make_node("Add", ["x", "d"], ["y"], name="add")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, list(shape))],
                          [helper.make_tensor_value_info("y", 1, list(shape))], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_int4_tensors_migraphx_refuses_or_crashes_on_are_errors():
    """MIGraphX's parser throws on an int4 tensor with an odd last dim and segfaults on a
    0-d one (onnxruntime's quantize_static writes one as a per-tensor zero point;
    fourteenth round): both measured on 2.15 and 2.16 (test_migraphx_rules.py)."""
    odd = check_model(_int4_model((4, 3)))
    (f,) = [f for f in odd.findings if f.code == "int4-tensor-shape"]
    assert (f.node, f.severity) == ("q", "error") and "odd" in f.message
    scalar = check_model(_int4_model((8,), zp_shape=()))
    (f,) = [f for f in scalar.findings if f.code == "int4-tensor-shape"]
    assert f.node == "z" and "segfault" in f.message
    assert named(check_model(_int4_model((4, 3), in_constant=True)),
                 "int4-tensor-shape") == ["qc"]
    assert "int4-tensor-shape" not in codes(check_model(_int4_model((3, 4))))
    assert "int4-tensor-shape" not in codes(check_model(_int4_model((4, 4), zp_shape=(4,))))


def test_scale_of_shape_1_beside_a_0d_zero_point_off_kernels_is_no_error():
    """onnxruntime's quantize_static (QInt16) writes bias DQs with scale [1] and a 0-d zero
    point; MIGraphX 2.15 and 2.16 parse and compile them (fourteenth round): no error."""
    model = build("""
    g (float[2,16] x) => (float[2,16] y) {
        bd = DequantizeLinear(b, s, z)
        y = Add(x, bd)
    }""", b=RNG.integers(-9, 9, 16).astype(np.int16), s=np.array([0.1], np.float32),
        z=np.int16(0))
    assert not codes(check_model(model), "error")


def _opset23_op(op: str) -> onnx.ModelProto:
    cs = np.ones((16, 4), np.float32)
    if op == "RotaryEmbedding":
        return build("""
        g (float[1,8,32] x, int64[1,8] p) => (float[1,8,32] y) {
            y = RotaryEmbedding <num_heads=4, rotary_embedding_dim=8> (x, c, s, p)
        }""", head='<ir_version: 10, opset_import: ["" : 23]>', c=cs, s=cs)
    return build("""
    g (float[1,8,32] q, float[1,8,32] k, float[1,8,32] v) => (float[1,8,32] y) {
        y = Attention <q_num_heads=4, kv_num_heads=4> (q, k, v)
    }""", head='<ir_version: 10, opset_import: ["" : 23]>')


@pytest.mark.parametrize("op", ["Attention", "RotaryEmbedding"])
def test_opset_23_attention_and_rotary_embedding_are_read_as_contrib_ops(op):
    """MIGraphX parses them by name as com.microsoft's, whose inputs and attributes differ:
    refused on 2.15 and 2.16 (test_migraphx_rules.py), unpredicted before."""
    (f,) = [f for f in check_model(_opset23_op(op)).findings
            if f.code == "standard-op-read-as-contrib"]
    assert (f.node, f.severity) == ("y_node", "error")


def test_an_nms_output_migraphx_would_overflow_is_found_in_its_program():
    """MIGraphX 2.15 sizes NonMaxSuppression's output batches x boxes rows, not x classes:
    more selected indices than that write past the buffer and abort the process (measured:
    2 classes, 6 boxes, 4 per class; 'free(): invalid next size'). Read from the compiled
    program's text (2.15's, and 2.16's with the classes counted)."""
    from rewriter.migraphx.backend import nms_overflow
    text = """
    @4 = @literal{4} -> int64_type, {1}, {1}
    @8 = ref::reshape[dims={1, 6, 4}](@7) -> float_type, {1, 6, 4}, {24, 4, 1}
    @11 = ref::sigmoid(@10) -> float_type, {1, 2, 6}, {12, 6, 1}
    @12 = ref::nonmaxsuppression(@8,@11,@4,@3,@2) -> int64_type, {ROWS, 3}, {3, 1}"""
    said = nms_overflow(text.replace("ROWS", "6"))
    assert said and "holds 6 rows but can select 8 (1 batch x 2 classes x 4)" in said, said
    assert nms_overflow(text.replace("ROWS", "12")) is None              # 2.16's size
    assert nms_overflow(text.replace("ROWS", "6").replace("{4}", "{3}")) is None   # 2 x 3


def test_a_float_conv_after_an_int8_conv_scaled_after_it_is_no_hidden_dequantize():
    """PP-OCRv6 rec tiny's --plan default: INT8 Conv -> Mul(s_w) -> Add(b) -> float Conv (a
    layer the plan kept): the check walked up through the INT8 conv to its input's DQ and
    said the float conv's DequantizeLinear was hidden behind Add, Mul and Conv (4 layers
    flagged; migraphx-driver lowered 9 of 9 INT8 layers, as planned)."""
    w = RNG.integers(-127, 128, size=(8, 4, 3, 3), dtype=np.int8)
    m = build("""
    g (float[1, 4, 8, 8] x) => (float[1, 8, 8, 8] z) {
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        wd = DequantizeLinear(w, one, xz)
        y = Conv <pads = [1, 1, 1, 1]> (xd, wd)
        m = Mul(y, cs)
        a = Add(m, b)
        z = Conv <pads = [1, 1, 1, 1]> (a, v)
    }""", w=w, xs=np.float32(0.05), xz=np.int8(0), one=np.float32(1.0),
        cs=RNG.uniform(0.005, 0.02, (1, 8, 1, 1)).astype(np.float32),
        b=RNG.standard_normal((1, 8, 1, 1)).astype(np.float32),
        v=RNG.standard_normal((8, 8, 3, 3)).astype(np.float32))
    assert "qdq-not-looked-through" not in codes(check_model(m))
    hidden = build("""
    g (float[1, 4, 8, 8] x) => (float[1, 8, 8, 8] z) {
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        wd = DequantizeLinear(w, one, xz)
        ws = Squeeze(wd, ax)
        z = Conv <pads = [1, 1, 1, 1]> (xd, ws)
    }""", w=w[:, :, None], xs=np.float32(0.05), xz=np.int8(0), one=np.float32(1.0),
        ax=np.array([2], np.int64))
    assert named(check_model(hidden), "qdq-not-looked-through") == ["z_node"]


def test_resize_reading_a_computed_tensor_is_a_warning_for_215_and_unknown():
    """MIGraphX 2.15 computes a Resize that reads a strided view as if it were standard
    (resize-inputs' docstring); a Resize of a graph input, or of the Reshape resize-inputs
    writes, reads standard strides."""
    model = onnx.parser.parse_model(f"""
    {HEAD}
    g (float[1, 5, 7, 3] x, float[1, 3, 4, 4] z)
      => (float[1, 3, 10, 14] y, float[1, 3, 8, 8] w, float[1, 3, 10, 14] v) {{
        t = Transpose <perm = [0, 3, 1, 2]> (x)
        y = Resize <mode = "linear"> (t, roi, s2)
        w = Resize <mode = "linear"> (z, roi, s2)
        r = Reshape (t, shp)
        v = Resize <mode = "nearest"> (r, roi, s2)
    }}""")
    model.graph.initializer.extend([
        numpy_helper.from_array(np.zeros(0, np.float32), "roi"),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s2"),
        numpy_helper.from_array(np.array([1, 3, 5, 7], np.int64), "shp")])
    for i, n in enumerate(model.graph.node):
        n.name = f"n{i}"
    for version, want in (((2, 15), ["n1"]), (None, ["n1"]), ((2, 16), [])):
        found = [f for f in check_model(model, version=version).findings
                 if f.code == "resize-strided-input"]
        assert [f.node for f in found] == want, version
        assert all(f.severity == "warning" and "computed by Transpose" in f.message
                   for f in found)


def test_rewriter_imported_from_a_zip_reads_its_profile(tmp_path):
    """rewriter.core and rewriter.migraphx were namespace packages: from a zip they were
    found in another install (the editable one here), and the packaged profile was read
    through a Path into the zip ("Not a directory"). The child process of MIGraphX's
    backend takes the zip's path too."""
    import zipfile

    from conftest import ROOT
    zipped = tmp_path / "rewriter.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        for top, name in ((ROOT / "rewriter", "rewriter"), (ROOT / "passes", "rewriter/passes")):
            for f in sorted(top.rglob("*")):
                rel = f.relative_to(top)
                if f.is_file() and "__pycache__" not in rel.parts and \
                        not (name == "rewriter" and rel.parts[0] == "passes"):
                    z.write(f, f"{name}/{rel.as_posix()}")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from rewriter.migraphx import check, backend\n"
            "print(check.__file__.startswith(sys.argv[1]), len(check.load_profile()) > 0,\n"
            "      sys.argv[1] in backend._child_path())")
    p = subprocess.run([sys.executable, "-c", code, str(zipped)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert p.stdout.split() == ["True", "True", "True"], p.stderr[-2000:]


def test_an_if_chosen_by_an_input_names_the_set_input():
    # optimum's merged decoders (If on use_cache_branch) and Silero VAD (If on Equal(sr,
    # 16000)) pass the static check, then MIGraphX refuses them at parse; the finding names
    # the flag that folds the If. An If on a computed condition says nothing.
    from rewriter.migraphx.check import check_model as check

    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x, int64 sr, bool c) => (float[2] y, float[2] z) {
        k = Constant <value = int64 {16000}> ()
        e = Equal (sr, k)
        y = If (e) <then_branch = t () => (float[2] a) { a = Relu (x) },
                    else_branch = f () => (float[2] b) { b = Neg (x) }>
        s = ReduceSum (x)
        zero = Constant <value = float {0.0}> ()
        p = Greater (s, zero)
        z = If (p) <then_branch = t2 () => (float[2] a2) { a2 = Relu (x) },
                    else_branch = f2 () => (float[2] b2) { b2 = Neg (x) }>
    }"""
    found = [f for f in check(onnx.parser.parse_model(text)).findings
             if f.code == "if-chosen-by-input"]
    assert [f.severity for f in found] == ["info"]
    assert "--set-input sr=16000 makes it a constant" in found[0].message
    text = text.replace("e = Equal (sr, k)", "e = Identity (c)")
    found = [f for f in check(onnx.parser.parse_model(text)).findings
             if f.code == "if-chosen-by-input"]
    assert len(found) == 1 and "--set-input c=true (or false)" in found[0].message


def test_a_bare_softplus_is_named_and_the_guarded_form_is_not():
    """MIGraphX computes Softplus as log(1 + exp(x)): inf from x = 89 (h104's Mamba, both
    builds; the real-build test is test_default_attributes'). The pipeline guards it;
    `rewrite check` on an original named nothing (thirty-eighth round). The guard the
    pipeline writes, and a float64 Softplus, are not named."""
    bare = build("g (float[2, 8] x) => (float[2, 8] y) { y = Softplus (x) }")
    assert named(check_model(bare), "softplus-overflow") == ["y_node"]
    guarded = build("""
    g (float[2, 8] x) => (float[2, 8] y) {
        s = Softplus (x)
        c = Greater (x, t)
        y = Where (c, x, s)
    }""", t=np.float32(20))
    assert "softplus-overflow" not in codes(check_model(guarded))
    loose = build("""
    g (float[2, 8] x) => (float[2, 8] y) {
        s = Softplus (x)
        c = Greater (x, t)
        y = Where (c, x, s)
    }""", t=np.float32(100))   # past 88: inf between 89 and 100
    assert named(check_model(loose), "softplus-overflow") == ["s_node"]
    wide = build("g (double[2, 8] x) => (double[2, 8] y) { y = Softplus (x) }")
    assert "softplus-overflow" not in codes(check_model(wide))
    import rewriter
    out, _ = rewriter.rewrite(bare, target="migraphx", migraphx={"device": "ref"})
    assert "softplus-overflow" not in codes(check_model(out))


def _slice_in_body(where: str) -> onnx.ModelProto:
    """x[s:e] summed, s and e graph inputs, inside a Loop or Scan body, an If branch or at
    the top level (TorchScript's EmbeddingBag: a Loop slicing the indices bag by bag; also
    tests/test_migraphx_rules.py)."""
    z = helper.make_tensor("z", TensorProto.INT64, [1], [0])
    sl = [helper.make_node("Slice", ["x", "s", "e", "z"], ["sl"], name="sl_node"),
          helper.make_node("ReduceSum", ["sl", "z"], ["r"], keepdims=0, name="r_node")]
    vi = helper.make_tensor_value_info
    r4 = vi("r", TensorProto.FLOAT, [4])
    inits = [z]
    if where == "top":
        nodes, out = [sl[0], helper.make_node("ReduceSum", ["sl", "z"], ["y"], keepdims=0,
                                              name="y_node")], [4]
    elif where == "loop":
        body = helper.make_graph(sl + [helper.make_node("Identity", ["c"], ["co"])], "body",
                                 [vi("i", TensorProto.INT64, []), vi("c", TensorProto.BOOL, [])],
                                 [vi("co", TensorProto.BOOL, []), r4])
        nodes, out = [helper.make_node("Loop", ["n", "t"], ["y"], body=body, name="y_node")], [3, 4]
        inits += [helper.make_tensor("t", TensorProto.BOOL, [], [True]),
                  helper.make_tensor("n", TensorProto.INT64, [], [3])]
    elif where == "scan":
        body = helper.make_graph(sl + [helper.make_node("Add", ["st", "r"], ["st2"]),
                                       helper.make_node("Identity", ["st2"], ["so"])], "body",
                                 [vi("st", TensorProto.FLOAT, [4]),
                                  vi("xi", TensorProto.FLOAT, [4])],
                                 [vi("st2", TensorProto.FLOAT, [4]),
                                  vi("so", TensorProto.FLOAT, [4])])
        nodes = [helper.make_node("Scan", ["init", "x"], ["fin", "y"], body=body,
                                  num_scan_inputs=1, name="y_node")]
        out = [10, 4]
        inits.append(helper.make_tensor("init", TensorProto.FLOAT, [4], [0] * 4))
    else:
        branch = [helper.make_graph(sl, b, [], [r4]) for b in ("then", "else")]
        nodes = [helper.make_node("ReduceSum", ["x"], ["sx"], keepdims=0),
                 helper.make_node("Greater", ["sx", "zf"], ["cond"]),
                 helper.make_node("If", ["cond"], ["y"], then_branch=branch[0],
                                  else_branch=branch[1], name="y_node")]
        out = [4]
        inits.append(helper.make_tensor("zf", TensorProto.FLOAT, [], [0.0]))
    graph = helper.make_graph(nodes, where, [vi("x", TensorProto.FLOAT, [10, 4]),
                                             vi("s", TensorProto.INT64, [1]),
                                             vi("e", TensorProto.INT64, [1])],
                              [vi("y", TensorProto.FLOAT, out)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("where,severity", [("top", "warning"), ("if", "warning"),
                                            ("loop", "error"), ("scan", "error")])
def test_slice_with_computed_bounds_in_a_loop_body_is_an_error(where, severity):
    """MIGraphX parses a Loop's or Scan's body at fixed shapes: a Slice there whose starts
    and ends are computed throws 'lens() called on a dynamic shape' on 2.15 and 2.16; at the
    top level or in an If branch it compiles (tests/test_migraphx_rules.py runs each)."""
    found = {f.severity for f in check_model(_slice_in_body(where)).findings
             if f.code == "input-not-constant" and f.node == "sl_node"}
    assert found == {severity}
