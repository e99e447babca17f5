"""rewriter.lowering: reading migraphx-driver's output and naming layers (everywhere), and the
layer mapping proven on the real MIGraphX (migraphx-marked)."""

from __future__ import annotations

import os
import subprocess

import numpy as np
import onnx
import pytest
from conftest import make_model, seconds_to_interrupt

import rewriter
from rewriter.migraphx import lowering
from rewriter.migraphx.check import Finding

# stderr of migraphx-driver 2.16 (f729a52) on a per-axis weight DQ, as printed.
STDERR_216 = """\
2026-12-03 09:25:48.117350 [ERROR] [<migraphx-source>/src/pass_manager.cpp:185] Error simplify_qdq: <migraphx-source>/src/include/migraphx/op/broadcast.hpp:86: build_output: BROADCAST: (broadcast ndims - axis) is less than s0 ndims
2026-12-03 09:25:48.117491 [ERROR] [<migraphx-source>/src/pass_manager.cpp:195] Dump: "/tmp/migraphx/simplify_qdq3592650875852.mxr"
terminate called after throwing an instance of 'migraphx::version_2_16_0::exception'
  what():  <migraphx-source>/src/include/migraphx/op/broadcast.hpp:86: build_output: BROADCAST: (broadcast ndims - axis) is less than s0 ndims
"""


def test_parse_version():
    assert lowering.parse_version("2.16.0.dev+20250912-17-470-gf729a52faf") == (2, 16, 0)
    assert lowering.parse_version("MIGraphX Version: 2.15.0.20250912-17-221") == (2, 15, 0)
    assert lowering.parse_version("2.16") == (2, 16)
    assert lowering.parse_version("develop") is None and lowering.parse_version(None) is None


def test_what_is_one_line_without_source_paths():
    assert lowering.what(STDERR_216) == (
        "build_output: BROADCAST: (broadcast ndims - axis) is less than s0 ndims")
    assert lowering.what("") == "no message"


def test_explain_names_the_form_and_the_layers():
    findings = [Finding("error", "qdq-per-channel-weight", f"conv{i}", "Conv", "m")
                for i in range(6)] + [Finding("warning", "qdq-uint8", "q", "QuantizeLinear", "m")]
    line = lowering.explain(lowering.what(STDERR_216), findings)
    assert "per-axis (per-channel) weight DequantizeLinear" in line
    assert "conv0, conv1, conv2, conv3 and 2 more" in line and "weight_form: mul" in line
    assert lowering.explain("something new", findings) == "something new"


TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, 8, 8] x) => (float[N, 5] z) {
    a = Conv <pads = [1, 1, 1, 1]> (x, W1)
    b = Conv <pads = [1, 1, 1, 1]> (a, W2)
    c = Conv <pads = [1, 1, 1, 1]> (b, W3)
    p = GlobalAveragePool (c)
    f = Flatten (p)
    z = Gemm <transB = 1> (f, G)
}"""
INITS = {"W1": (8, 4, 3, 3), "W2": (8, 8, 3, 3), "W3": (8, 8, 3, 3), "G": (5, 8)}


# migraphx-driver 2.16's program (2.15's alike) after simplify_qdq, trimmed: one Conv whose
# activation (zero point 5) and weight (zero point 2) are both asymmetric. Its layer is
# @10; @17, @19 and @21 are the zero points' terms, added into the DequantizeLinear's zero
# point.
ASYMMETRIC_216 = """\
module: "main"
@0 = @literal{0} -> int32_type, {1}, {0}
x = @param:x -> float_type, {1, 4, 8, 8}, {256, 64, 8, 1}
@2 = @literal{2} -> int8_type, {1}, {0}
@4 = @literal{ ... } -> int8_type, {4, 4, 3, 3}, {36, 9, 3, 1}
@5 = @literal{5} -> int8_type, {1}, {0}
@9 = quantizelinear[out_type=nullopt](x,@7,@8) -> int8_type, {1, 4, 8, 8}, {256, 64, 8, 1}
@10 = quant_convolution[padding={1, 1, 1, 1},group=1](@9,@4) -> int32_type, {1, 4, 8, 8}
@13 = mul(@11,@12) -> float_type, {1, 4, 8, 8}, {256, 64, 8, 1}
@14 = multibroadcast[out_lens={1, 4, 8, 8},out_dyn_dims={}](@0) -> int32_type, {1, 4, 8, 8}
@15 = multibroadcast[out_lens={1, 4, 8, 8},out_dyn_dims={}](@5) -> int8_type, {1, 4, 8, 8}
@16 = multibroadcast[out_lens={4, 4, 3, 3},out_dyn_dims={}](@2) -> int8_type, {4, 4, 3, 3}
@17 = quant_convolution[padding={1, 1, 1, 1},group=1](@15,@4) -> int32_type, {1, 4, 8, 8}
@18 = add(@14,@17) -> int32_type, {1, 4, 8, 8}, {1, 1, 32, 4}
@19 = quant_convolution[padding={1, 1, 1, 1},group=1](@9,@16) -> int32_type, {1, 4, 8, 8}
@20 = add(@18,@19) -> int32_type, {1, 4, 8, 8}, {256, 64, 8, 1}
@21 = quant_convolution[padding={1, 1, 1, 1},group=1](@15,@16) -> int32_type, {1, 4, 8, 8}
@22 = sub(@20,@21) -> int32_type, {1, 4, 8, 8}, {256, 64, 8, 1}
@23 = dequantizelinear(@10,@13,@22) -> float_type, {1, 4, 8, 8}, {256, 64, 8, 1}
@24 = convolution[padding={1, 1, 1, 1},group=1](@23,@25) -> float_type, {1, 4, 8, 8}
@26 = @return(@24)
"""


def test_zero_point_terms_are_not_layers():
    """simplify_qdq computes a nonzero zero point's term with int8 kernels of its own, added
    into the DequantizeLinear's zero point: they were counted as layers, so a model whose
    asymmetric Conv lowers and whose other planned Conv stays float read '2 of 2 lower'
    (by count), and its quantize_fp16 count '2 of 2' where one of two lowers."""
    assert lowering.main_kernels(ASYMMETRIC_216) == ["quant_convolution", "convolution"]
    m = make_model(TEXT, INITS)
    layers, named = lowering.map_layers(m, ["a", "b"], lowering.main_kernels(
        ASYMMETRIC_216.replace("@26 = @return", "@27 = convolution(@24,@28)\n@26 = @return")))
    assert named and [x.kernel for x in layers if x.planned_int8] == [
        "quant_convolution", "convolution"]


def test_map_layers_by_order_and_refuses_when_counts_differ():
    m = make_model(TEXT, INITS)
    kernels = ["convolution", "quant_convolution", "convolution", "quant_dot"]
    layers, named = lowering.map_layers(m, ["b", "z"], kernels)
    assert named
    assert {x.name: x.kernel for x in layers} == {
        "a": "convolution", "b": "quant_convolution", "c": "convolution", "z": "quant_dot"}
    # An LSTM adds dots of its own: the dots cannot be paired, the convs still can.
    layers, named = lowering.map_layers(m, ["b", "z"], kernels + ["dot", "dot"])
    assert not named and {x.name: x.kernel for x in layers}["z"] is None
    assert {x.name: x.kernel for x in layers}["b"] == "quant_convolution"
    # Counted, not paired: no layer is named as staying float (every unpaired one showed
    # as 'stays float: no reason known' under '72 of 72 lower', ninth round).
    low = lowering.Lowering("ok", "test", planned=2, lowered=2, named=False, layers=layers)
    assert low.float_layers() == [] and low.to_dict()["stays_float"] == {}
    assert "by count" in low.render() and "stays float" not in low.render()


def test_skipped_without_a_driver(tmp_path, monkeypatch):
    m = make_model(TEXT, INITS)
    onnx.save(m, tmp_path / "m.onnx")
    monkeypatch.setattr(lowering, "find_driver", lambda: None)
    low = lowering.lower_int8(tmp_path / "m.onnx", {"x": [1, 4, 8, 8]}, ["b"])
    assert low.status == "skipped" and "migraphx-driver not found" in low.headline()


def test_the_fp16_warning_only_when_int8_kernels_are_lost():
    low = lowering.Lowering("ok", "driver", "2.16.0", planned=3, lowered=3)
    assert low.fp16_line() is None and "quantize_fp16" not in low.render()   # not measured
    low.fp16_lowered = 3   # a MIGraphX whose quantize_fp16 keeps them: nothing to say
    assert low.fp16_line() is None and low.to_dict()["fp16_warning"] is None
    low.fp16_lowered = 1
    assert "1 of these 3 lower to int8 kernels" in low.fp16_line()
    assert low.fp16_line() in low.render() and low.to_dict()["fp16_warning"] == low.fp16_line()


def _fake_driver(tmp_path, body: str) -> str:
    path = tmp_path / "migraphx-driver"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_the_driver_run_is_read_whole_and_bounded(tmp_path):
    driver = _fake_driver(tmp_path, 'echo "$@"; echo oops >&2; exit 3')
    rc, out, err = lowering.run_driver(driver, "m.onnx", {"x": [1, 4]}, passes=["p1"])
    assert (rc, out, err) == (3, "read m.onnx --onnx --input-dim @x 1 4 -p p1 --brief\n", "oops\n")
    slow = _fake_driver(tmp_path, "exec sleep 30")
    with pytest.raises(subprocess.TimeoutExpired):
        lowering.run_driver(slow, "m.onnx", {}, timeout=0.6)


def test_an_interrupt_without_a_signal_stops_the_driver_at_once(tmp_path):
    """The driver ran under subprocess.run's wait, which sees an interrupt that sends this
    thread no signal (``_thread.interrupt_main``: a toolchain cancelling a call from another
    thread) only when the driver ends (h106: a plan's lowering on a large model). Now
    within a step of 0.25 s, and the driver is killed."""
    slow = _fake_driver(tmp_path, f"echo $$ > {tmp_path / 'pid'}; exec sleep 30")
    started = tmp_path / "pid"
    assert seconds_to_interrupt(lowering.run_driver, slow, "m.onnx", {},
                                ready=lambda: started.exists() and started.read_text()) < 10
    pid = started.read_text().strip()
    assert not os.path.exists(f"/proc/{pid}")   # killed and reaped


def test_an_interrupt_while_the_driver_starts_leaves_no_driver(tmp_path, monkeypatch):
    """An interrupt that lands inside subprocess.Popen() after its fork (Popen waits there
    for the exec) left the driver running, with no handle to kill it by (likely why the
    interrupt test above failed once in a full test run under load: its driver was left).
    The interrupt is held while the driver starts, then the driver is killed and the
    interrupt raised."""
    import _thread
    import signal
    import subprocess
    import time

    slow = _fake_driver(tmp_path, f"echo $$ > {tmp_path / 'pid'}; exec sleep 30")
    started = subprocess.Popen._execute_child

    def interrupted_after_the_fork(self, *a, **k):
        started(self, *a, **k)
        _thread.interrupt_main()   # lands here, before Popen() returns the process
        for _ in range(100):
            time.sleep(0.001)
    monkeypatch.setattr(subprocess.Popen, "_execute_child", interrupted_after_the_fork)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            lowering.run_driver(slow, "m.onnx", {})
    finally:
        signal.signal(signal.SIGINT, before)
    for _ in range(50):   # the shell writes its pid as it starts
        if (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip():
            break
        time.sleep(0.1)
    pid = (tmp_path / "pid").read_text().strip()
    assert not os.path.exists(f"/proc/{pid}")   # killed and reaped


def test_a_sigint_handler_set_outside_python_is_left_alone(tmp_path, monkeypatch):
    """A host whose SIGINT handler was set in C (signal.getsignal says None) cannot have
    it put back by signal.signal (a TypeError): the driver starts without holding."""
    import signal

    monkeypatch.setattr(signal, "getsignal", lambda signum: None)
    def refuse(*a):
        raise AssertionError("signal.signal called")
    monkeypatch.setattr(signal, "signal", refuse)
    driver = _fake_driver(tmp_path, "echo ok")
    assert lowering.run_driver(driver, "m.onnx", {}, passes=[])[:2] == (0, "ok\n")


def test_a_driver_started_where_sigint_is_ignored_ignores_it_too(tmp_path):
    """A caller that ignores SIGINT (a script's background job, nohup, a toolchain leaving
    ^C to its foreground tool) had its driver start with the interrupt held by a handler,
    which exec resets to the default: the driver, no longer ignoring SIGINT as a child of
    such a caller does, was killed by a ^C that the caller itself ignored. Nothing can
    interrupt such a caller (``interrupt_main`` does nothing either), so nothing is held."""
    import signal

    driver = _fake_driver(tmp_path, "grep SigIgn /proc/$$/status")
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for _ in range(2):   # two drivers, one after the other
            rc, out, _ = lowering.run_driver(driver, "m.onnx", {}, passes=[])
            assert rc == 0 and int(out.split()[1], 16) & (1 << signal.SIGINT - 1), out
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.migraphx
def test_layers_are_named_right_on_migraphx(tmp_path, migraphx_version, migraphx_driver):
    """A plan that puts every other layer in INT8, and one INT8 layer that cannot lower (its
    weight passes a Squeeze): the per-layer result must match the plan exactly, which it
    cannot if the kernel-to-layer mapping were off by one."""
    text = TEXT.replace("c = Conv <pads = [1, 1, 1, 1]> (b, W3)",
                        "c = Conv <pads = [1, 1, 1, 1]> (b, W3)\n    d = Conv (c, W4)").replace(
        "GlobalAveragePool (c)", "GlobalAveragePool (d)")
    m = make_model(text, dict(INITS, W4=(8, 8, 1, 1)))
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(8)]
    plan = {"overrides": {"a": "int8", "b": "fp32", "c": "int8", "d": "fp32", "z": "int8"}}
    out = tmp_path / "q.onnx"
    _, report = rewriter.rewrite(m, output=out, plan=plan, calib=calib, target="migraphx",
                                 migraphx={"device": "auto"},
                                 input_shapes={"x": [1, 4, 8, 8]})
    low = report.extra["compile"]["lowering"]
    assert low["status"] == "ok" and low["named"]
    assert {x["name"]: x["kernel"] for x in low["layers"]} == {
        "a": "quant_convolution", "c": "quant_convolution", "z": "quant_dot"}
    assert low["headline"] == "3 of 3 planned INT8 layers lower to quant_convolution/quant_dot"
    # MIGraphX's own quantize_fp16 (the driver's --fp16) drops the Q/DQ zero points that
    # simplify_qdq matches: none would lower (2.15, 2.16), and the summary says so
    assert low["fp16_lowered"] == 0, low
    assert "0 of these 3 lower to int8 kernels" in low["fp16_warning"]
    from rewriter.migraphx.target import render
    assert low["fp16_warning"] in render(report.extra["compile"])


@pytest.mark.migraphx
def test_an_opset_9_model_lowers_after_its_conversion(tmp_path, migraphx_version,
                                                       migraphx_driver):
    """An opset-9 model is converted for its Q/DQ: to opset 10 where weight scales go in a
    Mul after the layer (its INT8 Gemm keeps the C input Gemm-9 requires, zero, the bias
    moving after the scale), to 13 for per-axis DQs; every planned layer still lowers to an
    int8 kernel."""
    text = TEXT.replace('"" : 17', '"" : 9').replace("ir_version: 8", "ir_version: 4")
    m = make_model(text.replace("(f, G)", "(f, G, GB)"), dict(INITS, GB=(5,)))
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float32)} for _ in range(8)]
    plan = {"overrides": {"a": "int8", "b": "int8", "c": "int8", "z": "int8"}}
    _, report = rewriter.rewrite(m, output=tmp_path / "q.onnx", plan=plan, calib=calib,
                                 target="migraphx", migraphx={"device": "auto"},
                                 input_shapes={"x": [1, 4, 8, 8]})
    assert any("model converted to opset 1" in w for w in report.warnings)
    low = report.extra["compile"]["lowering"]
    assert low["headline"] == "4 of 4 planned INT8 layers lower to quant_convolution/quant_dot"


def _qdq_convs(zero_points) -> onnx.ModelProto:
    """A chain of Convs, each a tuple (activation zero point, weight zero point) with int8
    Q/DQ of its own, or None: a float Conv."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, zps in enumerate(zero_points):
        w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
        if zps is None:
            inits.append(nh.from_array(w, f"w{i}"))
        else:
            za, zw = zps
            inits += [nh.from_array(np.float32(0.05), f"s{i}"),
                      nh.from_array(np.int8(za), f"z{i}"),
                      nh.from_array(np.clip(np.round(w * 40) + zw, -128, 127).astype(np.int8),
                                    f"wq{i}"),
                      nh.from_array(np.float32(1 / 40), f"ws{i}"),
                      nh.from_array(np.int8(zw), f"wz{i}")]
            nodes += [h.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
                      h.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
                      h.make_node("DequantizeLinear", [f"wq{i}", f"ws{i}", f"wz{i}"], [f"w{i}"])]
            x = f"d{i}"
        nodes.append(h.make_node("Conv", [x, f"w{i}"], [f"y{i}"], f"conv{i}", pads=[1] * 4))
        x = f"y{i}"
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 8, 8])],
                     [h.make_tensor_value_info(x, T.FLOAT, [1, 4, 8, 8])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


@pytest.mark.migraphx
@pytest.mark.parametrize("zero_points, lowered, fp16_lowered", [
    ([(5, 2), (0, 0)], 2, 1),   # only the symmetric Conv loses its zero points to fp16
    ([(5, 0), None], 1, 0),     # an asymmetric Conv lowers, the float one does not
    ([(5, 2)], 1, 1),           # nothing to lose: no warning
])
def test_asymmetric_layers_are_counted_once(tmp_path, migraphx_version, migraphx_driver,
                                            zero_points, lowered, fp16_lowered):
    """A nonzero zero point's int8 kernels (its term in the DequantizeLinear's zero point)
    were counted as layers: '2 of 2' for one lowered asymmetric Conv and a float one (by
    count), and after quantize_fp16 '2 of 2' where the symmetric one of two lost its int8
    kernel, so no warning (2.15 and 2.16)."""
    path = tmp_path / "m.onnx"
    onnx.save(_qdq_convs(zero_points), path)
    planned = [f"conv{i}" for i in range(len(zero_points))]
    low = lowering.lower_int8(path, {"x": [1, 4, 8, 8]}, planned, driver=migraphx_driver)
    assert (low.status, low.named, low.lowered, low.fp16_lowered) == (
        "ok", True, lowered, fp16_lowered), low
    assert (low.fp16_line() is None) == (fp16_lowered == lowered)
