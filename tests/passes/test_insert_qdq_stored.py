"""insert-qdq on weights the model stores as int8 and dequantises in the graph (weight-only
quantized, ``Cast(q) -> Mul(c)`` or ``DequantizeLinear(q, s, 0)``): INT8 candidates whose
int8 values are kept bit for bit, only the activation calibrated (PP-OCRv6's tiny
recogniser, 27 such convs, twenty-second round)."""

import numpy as np
import onnx
import pytest
from conftest import make_model, ops, run_ort

import rewriter
from rewriter.core.convert import to_graph
from rewriter.core.graph import StoredInt8, node_id, stored_int8_weight
from rewriter.quant import plan as plan_mod

# Two convs on x (a per-channel Cast -> Mul weight, a per-tensor DQ one), a MatMul on v
# (per-column Cast -> Mul) and a Gemm on v (transB, per-row DQ); symbolic dims.
SITES = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, H, W] x, float[N, 6] v) => (float[N, 8, H, W] y, float[N, 5] z, float[N, 3] u) {
    f1 = Cast <to = 1> (q1)
    w1 = Mul (f1, c1)
    a = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    w2 = DequantizeLinear (q2, s2, z2)
    b = Conv <pads = [1, 1, 1, 1]> (x, w2)
    y = Add (a, b)
    f3 = Cast <to = 1> (q3)
    w3 = Mul (c3, f3)
    z = MatMul (v, w3)
    w4 = DequantizeLinear <axis = 0> (q4, s4, z4)
    u = Gemm <transB = 1> (v, w4, g4)
}"""


def _q(rng, shape):
    q = rng.integers(-127, 128, shape).astype(np.int8)
    q.flat[0] = -128            # the full int8 range: exact, and MIGraphX takes it
    return q


def sites_inits(seed=0):
    rng = np.random.default_rng(seed)
    c1 = rng.uniform(0.005, 0.02, (8, 1, 1, 1)).astype(np.float32)
    c1[3] = -c1[3]              # a negative channel scale (a BN with a negative gamma)
    return {"q1": _q(rng, (8, 4, 3, 3)), "c1": c1,
            "b1": rng.standard_normal(8).astype(np.float32),
            "q2": _q(rng, (8, 4, 3, 3)), "s2": np.array(0.011, np.float32),
            "z2": np.array(0, np.int8),
            "q3": _q(rng, (6, 5)), "c3": rng.uniform(0.01, 0.03, (1, 5)).astype(np.float32),
            "q4": _q(rng, (3, 6)), "s4": rng.uniform(0.01, 0.03, 3).astype(np.float32),
            "z4": np.zeros(3, np.int8), "g4": rng.standard_normal(3).astype(np.float32)}


INT8 = {"rules": [{"match": {"op": ["Conv", "MatMul", "Gemm"]}, "precision": "int8"}]}


def quantize(m, plan, ranges, version=None):
    p = plan_mod.load(plan)
    g = to_graph(m)
    a = plan_mod.resolve(p, list(g.nodes))
    options = {"migraphx_version": version} if version else None
    return rewriter.rewrite(m, ["insert-qdq"], options=options,
                            data={"plan": p, "assignment": a, "ranges": ranges})


def on_grid(rng, shape):
    """Integers within [-127, 127]: with amax 127 (scale 1) their Q/DQ is the identity, so
    the only difference left is the weight's, which must be none."""
    return rng.integers(-127, 128, shape).astype(np.float32)


def int8_inits(m):
    return {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer
            if t.data_type == onnx.TensorProto.INT8}


@pytest.mark.parametrize("version", [None, "2.15", "2.16"])
def test_stored_weights_are_kept_bit_for_bit_and_the_layers_go_int8(version):
    m = make_model(SITES, sites_inits())
    out, rep = quantize(m, INT8, {"x": 127.0, "v": 127.0}, version)
    counts = rep.passes[0].counts
    assert counts["stored-int8-weights-kept"] == 4 and counts.get("weights-quantized", 0) == 0
    assert counts["int8-conv"] == 2 and counts["int8-matmul"] == 1 and counts["int8-gemm"] == 1
    prod = {o: n for n in out.graph.node for o in n.output}
    stored, kept = int8_inits(m), int8_inits(out)
    for layer in (n for n in out.graph.node if n.op_type in ("Conv", "MatMul", "Gemm")):
        x, w = (prod[t] for t in layer.input[:2])
        assert x.op_type == w.op_type == "DequantizeLinear"
        assert w.input[0] in ("q1", "q2", "q3", "q4")
        assert kept[w.input[0]].tobytes() == stored[w.input[0]].tobytes()
        assert len(w.input) == 3 and kept[w.input[2]].dtype == np.int8
    assert not {"Cast", "Mul"} & {n.op_type for n in out.graph.node if n.output[0] in
                                  ("w1", "w3", "f1", "f3")}
    per_axis = [n for n in out.graph.node if n.op_type == "DequantizeLinear"
                and any(a.name == "axis" for a in n.attribute)]
    # 2.15 lowers per-axis weight DQs; 2.16 (and an unknown version) takes the Mul after
    assert len(per_axis) == (3 if version == "2.15" else 0)
    assert ops(out).count("Mul") == (0 if version == "2.15" else 3)
    onnx.checker.check_model(out, full_check=True)
    rng = np.random.default_rng(5)
    for n, h, w in [(1, 5, 7), (3, 8, 8)]:
        feeds = {"x": on_grid(rng, (n, 4, h, w)), "v": on_grid(rng, (n, 6))}
        for ref, got in zip(run_ort(m, feeds), run_ort(out, feeds)):
            np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6 * np.abs(ref).max())


def test_off_the_grid_the_error_is_the_activations_alone(rng):
    """Against the original with its activations rounded the same way (a Q/DQ on x and v
    in the original itself): the same function to float rounding."""
    m = make_model(SITES, sites_inits(1))
    out, _ = quantize(m, INT8, {"x": 3.0, "v": 2.0})
    ref_m = onnx.ModelProto()
    ref_m.CopyFrom(m)
    g = ref_m.graph
    for name, amax in (("x", 3.0), ("v", 2.0)):
        g.initializer.extend([onnx.numpy_helper.from_array(np.array(amax / 127, np.float32),
                                                           f"{name}_s"),
                              onnx.numpy_helper.from_array(np.array(0, np.int8), f"{name}_z")])
        for n in g.node:
            n.input[:] = [f"{name}_dq" if i == name else i for i in n.input]
        g.node.insert(0, onnx.helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s",
                                                                    f"{name}_z"], [f"{name}_dq"]))
        g.node.insert(0, onnx.helper.make_node("QuantizeLinear", [name, f"{name}_s",
                                                                  f"{name}_z"], [f"{name}_q"]))
    feeds = {"x": rng.standard_normal((2, 4, 6, 6)).astype(np.float32),
             "v": rng.standard_normal((2, 6)).astype(np.float32)}
    for ref, got in zip(run_ort(ref_m, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


SHARED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, 6, 6] x) => (float[N, 8, 6, 6] y) {
    f = Cast <to = 1> (q)
    w = Mul (f, c)
    a = Conv <pads = [1, 1, 1, 1]> (x, w)
    r = Relu (x)
    b = Conv <pads = [1, 1, 1, 1]> (r, w)
    y = Add (a, b)
}"""


def shared_inits():
    rng = np.random.default_rng(2)
    return {"q": _q(rng, (8, 4, 3, 3)), "c": rng.uniform(0.01, 0.02, 8).astype(np.float32)
            .reshape(8, 1, 1, 1)}


def test_a_shared_stored_weight_is_read_once_by_both_int8_layers(rng):
    m = make_model(SHARED, shared_inits())
    out, rep = quantize(m, INT8, {"x": 127.0, "r": 127.0}, "2.15")
    assert rep.passes[0].counts["stored-int8-weights-kept"] == 1
    assert ops(out).count("DequantizeLinear") == 3 and "Cast" not in ops(out)
    feeds = {"x": on_grid(rng, (2, 4, 6, 6))}
    ref = run_ort(m, feeds)[0]
    np.testing.assert_allclose(run_ort(out, feeds)[0], ref, rtol=0,
                               atol=2e-6 * np.abs(ref).max())


def test_a_shared_stored_weight_stays_dequantised_for_the_float_layer(rng):
    m = make_model(SHARED, shared_inits())
    plan = {"rules": [{"match": {"name": "a"}, "precision": "int8"}]}
    out, rep = quantize(m, plan, {"x": 127.0}, "2.16")
    assert rep.passes[0].counts["stored-int8-weights-kept"] == 1
    assert ops(out).count("Cast") == 1      # the chain, for b
    b = next(n for n in out.graph.node if n.op_type == "Conv" and n.input[0] == "r")
    assert b.input[1] == "w"
    feeds = {"x": on_grid(rng, (2, 4, 6, 6))}
    ref = run_ort(m, feeds)[0]
    np.testing.assert_allclose(run_ort(out, feeds)[0], ref, rtol=0,
                               atol=2e-6 * np.abs(ref).max())


def _one_conv(weight: str, inits: dict, outputs="float[N, 16, 6, 6] y", extra=""):
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8, 6, 6] x) => ({outputs}) {{
        {weight}
        y = Conv <pads = [1, 1, 1, 1]> (x, w)
        {extra}
    }}""", inits)


BAD = {
    "stored-weight-zero-point": ("w = DequantizeLinear (q, s, zp)",
                                 {"s": np.array(0.01, np.float32),
                                  "zp": np.array(3, np.int8)}),
    "stored-weight-not-int8": ("f = Cast <to = 1> (qu)\n w = Mul (f, c)",
                               {"qu": np.arange(1152).reshape(16, 8, 3, 3).astype(np.uint8),
                                "c": np.full((16, 1, 1, 1), 0.01, np.float32)}),
    "stored-scale-not-per-channel": ("f = Cast <to = 1> (q)\n w = Mul (f, c)",
                                     {"c": np.linspace(0.01, 0.02, 8, dtype=np.float32)
                                      .reshape(1, 8, 1, 1)}),
    "stored-scale-zero-or-not-finite": ("f = Cast <to = 1> (q)\n w = Mul (f, c)",
                                        {"c": np.zeros((16, 1, 1, 1), np.float32)}),
}


@pytest.mark.parametrize("reason", sorted(BAD) + ["cast-sub-mul", "stored-weight-read-elsewhere"])
def test_what_cannot_be_kept_as_it_is_stays_fp32_with_its_reason(reason, rng):
    q = _q(rng, (16, 8, 3, 3))
    if reason == "cast-sub-mul":      # a zero point written by hand: Cast -> Sub -> Mul
        m = _one_conv("f = Cast <to = 1> (q)\n d = Sub (f, zf)\n w = Mul (d, c)",
                      {"q": q, "zf": np.array(2.0, np.float32),
                       "c": np.full((16, 1, 1, 1), 0.01, np.float32)})
        reason = "stored-weight-zero-point"
    elif reason == "stored-weight-read-elsewhere":   # a non-layer reads the weight too
        m = _one_conv("f = Cast <to = 1> (q)\n w = Mul (f, c)",
                      {"q": q, "c": np.full((16, 1, 1, 1), 0.01, np.float32)},
                      outputs="float[N, 16, 6, 6] y, float[1, 1, 1, 1] e",
                      extra="e = ReduceMax (w)")
    else:
        weight, inits = BAD[reason]
        m = _one_conv(weight, {"q": q, **inits})
    g = to_graph(m)
    conv = next(n for n in g.nodes if n.op == "Conv")
    assert stored_int8_weight(conv) == reason
    calib = [{"x": rng.standard_normal((1, 8, 6, 6)).astype(np.float32)} for _ in range(4)]
    out, rep = rewriter.rewrite(m, plan=INT8, calib=calib, target="none")
    layer = rep.extra["plan"]["layers"]["y"]
    assert layer["precision"] == "fp32" and "computed weight" in layer["why"]
    said = [w for w in rep.warnings if "weight the graph dequantises" in w]
    assert len(said) == 1 and reason in said[0] and said[0].endswith("kept fp32 as they are: y")
    assert "QuantizeLinear" not in ops(out)


def test_a_qdq_layer_is_quantized_already_not_a_stored_weight(rng):
    """Activation from a DequantizeLinear too: a model quantized elsewhere, kept as it is."""
    m = _one_conv("xq = QuantizeLinear (x, sx, zx)\n xd = DequantizeLinear (xq, sx, zx)\n"
                  " w = DequantizeLinear (q, s, zx)",
                  {"q": _q(rng, (16, 8, 3, 3)), "s": np.array(0.01, np.float32),
                   "sx": np.array(0.02, np.float32), "zx": np.array(0, np.int8)})
    m.graph.node[3].input[0] = "xd"
    g = to_graph(m)
    assert stored_int8_weight(next(n for n in g.nodes if n.op == "Conv")) is None


def test_a_float16_weight_cast_to_float_is_not_a_stored_integer(rng):
    m = _one_conv("w = Cast <to = 1> (h)",
                  {"h": rng.standard_normal((16, 8, 3, 3)).astype(np.float16)})
    g = to_graph(m)
    assert stored_int8_weight(next(n for n in g.nodes if n.op == "Conv")) is None
    assert plan_mod.computed_weight(next(n for n in g.nodes if n.op == "Conv"))


def _two_stored_and_a_float_conv(rng):
    q1 = _q(rng, (16, 8, 3, 3))
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 11]>
    g (float[N, 8, H, W] x) => (float[N, 16, H, W] y) {
        f1 = Cast <to = 1> (q1)
        w1 = Mul (f1, c1)
        a = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
        r = Relu (a)
        b = Conv <pads = [1, 1, 1, 1]> (r, W2, b2)
        s = Relu (b)
        y = Conv <pads = [1, 1, 1, 1]> (s, w1)
    }""", {"q1": q1, "c1": rng.uniform(0.01, 0.05, (16, 1, 1, 1)).astype(np.float32),
           "b1": (16,), "W2": (16, 16, 3, 3), "b2": (16,)})
    # y reads 16 channels with w1's 8: a second stored conv needs its own q
    q3 = _q(rng, (16, 16, 3, 3))
    m.graph.node[-1].input[1] = "w3"
    m.graph.initializer.extend([onnx.numpy_helper.from_array(q3, "q3"),
                                onnx.numpy_helper.from_array(
                                    rng.uniform(0.01, 0.05, (16, 1, 1, 1)).astype(np.float32),
                                    "c3")])
    m.graph.node.insert(0, onnx.helper.make_node("Mul", ["f3", "c3"], ["w3"]))
    m.graph.node.insert(0, onnx.helper.make_node("Cast", ["q3"], ["f3"], to=1))
    calib = [{"x": rng.standard_normal((1, 8, 8, 8)).astype(np.float32)} for _ in range(16)]
    return m, calib, q1, q3


def test_the_whole_recipe_keeps_them_and_says_what_it_skipped(rng, tmp_path):
    """The recipe with int8.stored_weights: keep, end to end (equalization, GPTQ, bias
    correction on): the stored convs are calibrated and bias-corrected, never equalized
    nor re-rounded; a float conv beside them gets everything; the stored values leave
    bit for bit."""
    m, calib, q1, q3 = _two_stored_and_a_float_conv(rng)
    plan = {"version": 1, "default": "int8", "int8": {"stored_weights": "keep"}}
    out, rep = rewriter.rewrite(m, plan=plan, calib=calib, target="none")
    passes = {p.name: p.counts for p in rep.passes}
    assert passes["insert-qdq"]["stored-int8-weights-kept"] == 2
    assert passes["insert-qdq"]["weights-gptq-rounded"] == 1      # W2 alone
    assert passes["equalize-channels"]["skip:stored-int8-weight"] == 2
    assert passes["equalize-channels"]["equalized-tensors"] == 1   # r, before W2
    assert passes["correct-bias"]["corrected-layers"] == 3
    assert all(v["precision"] == "int8" for v in rep.extra["plan"]["layers"].values())
    kept = int8_inits(out)
    assert kept["q1"].tobytes() == q1.tobytes() and kept["q3"].tobytes() == q3.tobytes()
    x = rng.standard_normal((2, 8, 5, 9)).astype(np.float32)
    ref, got = run_ort(m, {"x": x})[0], run_ort(out, {"x": x})[0]
    assert np.dot(ref.ravel(), got.ravel()) / np.linalg.norm(ref) / np.linalg.norm(got) > 0.99


def test_the_planner_counts_them_as_int8_candidates():
    m = make_model(SITES, sites_inits())
    g = to_graph(m)
    layers = [n for n in g.nodes if n.op in ("Conv", "MatMul", "Gemm")]
    assert all(isinstance(stored_int8_weight(n), StoredInt8) for n in layers)
    assert all(plan_mod.int8_capable(n) for n in layers)
    a = plan_mod.resolve(plan_mod.load("int8"), list(g.nodes))
    assert {a.precision[node_id(n)] for n in layers} == {"int8"} and not a.notes


def test_by_default_they_are_quantised_again_from_their_float_values(rng):
    """The default (int8.stored_weights: requantize): the stored weights become float
    constants (q times the scale, the values the graph computed) before equalization, so
    every technique applies (PP-OCRv6's tiny recogniser: 92 of 100 fresh lines decode the
    same with them, 66 with the stored weights kept), and a warning says so."""
    m, calib, q1, q3 = _two_stored_and_a_float_conv(rng)
    out, rep = rewriter.rewrite(m, plan="int8", calib=calib, target="none")
    passes = {p.name: p.counts for p in rep.passes}
    assert "stored-int8-weights-kept" not in passes["insert-qdq"]
    assert passes["insert-qdq"]["weights-gptq-rounded"] == 3
    assert "skip:stored-int8-weight" not in passes["equalize-channels"]
    assert any("2 INT8 layers have weights the model stores as int8" in w
               for w in rep.warnings)
    assert not any(n.op_type == "Cast" for n in out.graph.node)   # the old chains went
    x = rng.standard_normal((2, 8, 5, 9)).astype(np.float32)
    ref, got = run_ort(m, {"x": x})[0], run_ort(out, {"x": x})[0]
    assert np.dot(ref.ravel(), got.ravel()) / np.linalg.norm(ref) / np.linalg.norm(got) > 0.99
    from rewriter.core.graph import dequantize_stored, Namer
    g = to_graph(m)
    convs = [n for n in g.nodes if n.op == "Conv"]
    assert dequantize_stored(convs, Namer(g)) == 2
    c1 = onnx.numpy_helper.to_array(next(t for t in m.graph.initializer if t.name == "c1"))
    assert np.array_equal(convs[0].inputs[1].values, q1.astype(np.float32) * c1)
    assert convs[2].inputs[1] is not convs[0].inputs[1]


@pytest.mark.parametrize("stored", ["requantize", "keep"])
def test_a_scale_of_more_axes_than_q_is_not_dropped(stored, rng):
    """``Mul(Cast(q [K, N]), c [1, 1, 1])`` is a [1, K, N] weight: the MatMul's output is
    3-D. Read as q times c, it was [K, N] and the written model's output lost its first
    axis (2-D where the original's is 3-D), kept or quantised again alike."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 48] v) => (float[1, N, 40] y) {
        f = Cast <to = 1> (q)
        w = Mul (f, c)
        y = MatMul (v, w)
    }""", {"q": _q(rng, (48, 40)), "c": np.array([[[0.013]]], np.float32)})
    g = to_graph(m)
    assert stored_int8_weight(next(n for n in g.nodes if n.op == "MatMul")) == (
        "stored-weight-rank")
    calib = [{"v": rng.standard_normal((1, 48)).astype(np.float32)} for _ in range(4)]
    plan = {"version": 1, "default": "int8", "int8": {"stored_weights": stored}}
    out, rep = rewriter.rewrite(m, plan=plan, calib=calib, target="none")
    assert any("stored-weight-rank" in w for w in rep.warnings)
    v = rng.standard_normal((3, 48)).astype(np.float32)
    ref, got = run_ort(m, {"v": v})[0], run_ort(out, {"v": v})[0]
    assert got.shape == ref.shape == (1, 3, 40)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
