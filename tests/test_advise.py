"""Tests for `rewrite advise`: profiler CSV parsing, the decision tree, kernel-name advice.

The fixture CSVs are written here from the column lists in the profilers' documentation:
rocprofv3 (ROCprofiler-SDK docs, source/docs/data/*.csv and using-rocprofv3.rst) and legacy
rocprof v1 (rocprof --stats results.stats.csv; results.csv with counters as columns).
"""

from __future__ import annotations

import json

import onnx
import onnx.parser
import pytest

from rewriter.advise import Advice, advise, classify_kernel, clean_kernel_name, decide, main

V3_STATS = ["Name", "Calls", "TotalDurationNs", "AverageNs", "Percentage", "MinNs", "MaxNs",
            "StdDev"]
V3_TRACE = ["Kind", "Agent_Id", "Queue_Id", "Stream_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id",
            "Kernel_Name", "Correlation_Id", "Start_Timestamp", "End_Timestamp",
            "Private_Segment_Size", "Group_Segment_Size", "Workgroup_Size_X", "Workgroup_Size_Y",
            "Workgroup_Size_Z", "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"]
V3_COUNTERS = ["Correlation_Id", "Dispatch_Id", "Agent_Id", "Queue_Id", "Process_Id", "Thread_Id",
               "Grid_Size", "Kernel_Id", "Kernel_Name", "Workgroup_Size", "LDS_Block_Size",
               "Scratch_Size", "VGPR_Count", "Accum_VGPR_Count", "SGPR_Count", "Counter_Name",
               "Counter_Value", "Start_Timestamp", "End_Timestamp"]
V1_STATS = ["Name", "Calls", "TotalDurationNs", "AverageNs", "Percentage"]
V1_FIXED = ["Index", "KernelName", "gpu-id", "queue-id", "queue-index", "pid", "tid", "grd", "wgr",
            "lds", "scr", "arch_vgpr", "accum_vgpr", "sgpr", "wave_size", "sig", "obj"]
V1_TIMES = ["DispatchNs", "BeginNs", "EndNs", "CompleteNs"]


def _cell(v) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def write_csv(path, header, rows, blank_after_header=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(f'"{h}"' for h in header)]
    if blank_after_header:
        lines.append("")
    lines += [",".join(_cell(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def v3_stats(path, kernels):
    """kernels: {name: (calls, total_ns)}"""
    total = sum(ns for _, ns in kernels.values())
    rows = [[n, c, ns, ns / c, 100.0 * ns / total, ns // c, ns // c, 0.0]
            for n, (c, ns) in kernels.items()]
    return write_csv(path, V3_STATS, rows)


def v3_trace(path, dispatches):
    """dispatches: [(name, duration_ns)], back to back."""
    rows, t = [], 1_000_000
    for i, (name, dur) in enumerate(dispatches, 1):
        rows.append(["KERNEL_DISPATCH", 2, 1, 1, 21228, i, 10 + i, name, i, t, t + dur,
                     0, 0, 64, 1, 1, 1024, 1024, 1])
        t += dur + 500
    return write_csv(path, V3_TRACE, rows)


def v3_counters(path, dispatches):
    """dispatches: [(name, duration_ns, {counter: value})]; one row per counter, as rocprofv3."""
    rows, t = [], 5_000_000
    for i, (name, dur, counters) in enumerate(dispatches, 1):
        for cname, value in counters.items():
            rows.append([i, i, "Agent 1", 1, 15606, 15606, 1048576, 17, name, 64, 0, 0, 8, 0, 16,
                         cname, float(value), t, t + dur])
        t += dur + 1000
    return write_csv(path, V3_COUNTERS, rows)


def v1_results(path, counters, dispatches, blank_after_header=True):
    """dispatches: [(name, duration_ns, [counter values in `counters` order])]"""
    rows, t = [], 7_000_000
    for i, (name, dur, values) in enumerate(dispatches):
        rows.append([i, name, 0, 0, i, 3673711, 3673711, 65536, 256, 0, 0, 20, 4, 16, 64,
                     "0x0", "0x7f2b4d282500", *values, t - 100, t, t + dur, t + dur + 50])
        t += dur + 1000
    return write_csv(path, V1_FIXED + counters + V1_TIMES, rows, blank_after_header)


def run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc, err, *needles):
    assert rc == 2
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err


# ----------------------------------------------------------------------- formats


def test_rocprofv3_folder_with_stats_and_counters(tmp_path):
    v3_stats(tmp_path / "host/123_kernel_stats.csv", {
        "mlir_convolution_add_relu": (10, 6_000_000), "quantizelinear_kernel": (10, 3_000_000),
        "contiguous_kernel": (10, 1_000_000)})
    v3_counters(tmp_path / "host/pmc_1/123_counter_collection.csv", [
        ("mlir_convolution_add_relu", 3000, {"VALUBusy": 50.0}),
        ("quantizelinear_kernel", 1000, {"VALUBusy": 10.0})])
    adv = advise(tmp_path)
    assert adv.formats == ["rocprofv3"]
    assert sorted(f["kind"] for f in adv.files) == ["v3-counters", "v3-stats"]
    assert adv.time_source == "kernel stats"
    assert [k.name for k in adv.kernels] == [
        "mlir_convolution_add_relu", "quantizelinear_kernel", "contiguous_kernel"]
    assert [round(k.share, 1) for k in adv.kernels] == [60.0, 30.0, 10.0]
    # duration-weighted: (50*3000 + 10*1000) / 4000
    assert adv.metrics["valu_busy"] == pytest.approx(40.0)
    assert adv.verdict == "fusion"
    assert adv.reasons[0].startswith("VALU busy 40.0% < 60% threshold")
    assert adv.missing == []  # the fusion branch does not need SQ wait


def test_kernel_trace_only_names_missing_counters_with_rocprofv3_command(tmp_path):
    v3_trace(tmp_path / "run_kernel_trace.csv", [
        ("void mlir_dot_add(float*)", 3000), ("softmax_kernel", 1000), ("mlir_dot_add", 3000)])
    adv = advise(tmp_path)
    assert adv.time_source == "kernel trace"
    assert [(k.name, k.calls, round(k.share, 1)) for k in adv.kernels] == [
        ("mlir_dot_add", 2, 85.7), ("softmax_kernel", 1, 14.3)]
    assert adv.verdict == "undecided"
    cmds = {m["counter"]: m["command"] for m in adv.missing}
    assert cmds["VALUBusy"] == (f"rocprofv3 --pmc VALUBusy --output-format csv -d {tmp_path} "
                                "-o valu -- <your inference command>")
    assert cmds["SQ_WAIT_INST_ANY, SQ_WAVE_CYCLES"].startswith(
        "rocprofv3 --pmc SQ_WAIT_INST_ANY SQ_WAVE_CYCLES --output-format csv")


def test_legacy_rocprof_stats_and_results_with_counters(tmp_path):
    write_csv(tmp_path / "results.stats.csv", V1_STATS, [
        ["mlir_convolution_add_relu.kd", 2, 8000, 4000, 80.0],
        ["contiguous_kernel.kd", 2, 2000, 1000, 20.0]])
    v1_results(tmp_path / "results.csv", ["VALUBusy", "SQ_WAIT_INST_ANY", "SQ_WAVE_CYCLES"], [
        ("mlir_convolution_add_relu.kd", 4000, [80.0, 300, 1000]),
        ("contiguous_kernel.kd", 1000, [70.0, 500, 1000])])
    adv = advise(tmp_path)
    assert adv.formats == ["rocprof (legacy)"]
    assert sorted(f["kind"] for f in adv.files) == ["v1-dispatch", "v1-stats"]
    assert [k.name for k in adv.kernels] == ["mlir_convolution_add_relu", "contiguous_kernel"]
    assert adv.metrics["valu_busy"] == pytest.approx(78.0)  # (80*4000 + 70*1000) / 5000
    assert adv.metrics["sq_wait"] == pytest.approx(40.0)    # 100 * 800 / 2000
    assert adv.verdict == "memory"
    assert any(r.startswith("SQ wait 40.0% > 30% threshold") for r in adv.reasons)


def test_legacy_results_csv_alone_gives_times_from_timestamps(tmp_path):
    f = v1_results(tmp_path / "prof.csv", ["VALUBusy"], [
        ('bodyForce(Body*, float, int) [clone .kd]', 3000, [90.0])])
    adv = advise(f)  # a single file, not a folder
    assert adv.time_source == "kernel trace"
    assert adv.kernels[0].name == "bodyForce"
    assert adv.metrics["valu_busy"] == pytest.approx(90.0)
    assert adv.verdict == "undecided"  # VALU busy is fine, SQ wait was not collected
    assert [m["counter"] for m in adv.missing] == ["SQ_WAIT_INST_ANY, SQ_WAVE_CYCLES"]


def test_counters_from_separate_pmc_passes_are_merged(tmp_path):
    v3_counters(tmp_path / "pmc_1/1_counter_collection.csv",
                [("mlir_convolution_add_relu", 1000, {"VALUBusy": 75.0})])
    v3_counters(tmp_path / "pmc_2/2_counter_collection.csv",
                [("mlir_convolution_add_relu", 1000,
                  {"SQ_WAIT_INST_ANY": 100, "SQ_WAVE_CYCLES": 1000})])
    adv = advise(tmp_path)
    assert adv.metrics["sq_wait"] == pytest.approx(10.0)
    assert adv.verdict == "quantize"
    # no trace or stats: times fall back to the counter run, and the advice says so
    assert adv.time_source == "counter collection"
    assert any("serialises" in n for n in adv.notes)


def test_renamed_columns_are_accepted(tmp_path):
    write_csv(tmp_path / "a_kernel_stats.csv", ["KernelName", "Count", "Total_Duration_Ns"],
              [["add_relu_kernel", 4, 400]])
    write_csv(tmp_path / "b_kernel_trace.csv", ["Kernel-Name", "Begin_Ns", "End_Ns"],
              [["mlir_convolution", 0, 100]])
    adv = advise(tmp_path)
    assert [(k.name, k.calls, k.total_ns) for k in adv.kernels] == [("add_relu_kernel", 4, 400.0)]
    assert sorted(f["kind"] for f in adv.files) == ["v3-stats", "v3-trace"]


# ----------------------------------------------------------------------- bad input


def test_missing_column_is_one_clear_line(tmp_path, capsys):
    f = write_csv(tmp_path / "x_kernel_stats.csv", ["Name", "Calls", "AverageNs"],
                  [["k", 1, 5.0]])
    rc, _, err = run([f], capsys)
    assert_one_line_error(rc, err, "x_kernel_stats.csv", "no TotalDurationNs column")


def test_empty_file(tmp_path, capsys):
    f = tmp_path / "run_kernel_stats.csv"
    f.write_text("")
    rc, _, err = run([f], capsys)
    assert_one_line_error(rc, err, "file is empty")


def test_header_only_file(tmp_path, capsys):
    f = write_csv(tmp_path / "run_kernel_trace.csv", V3_TRACE, [])
    rc, _, err = run([f], capsys)
    assert_one_line_error(rc, err, "no data rows")


def test_truncated_last_row(tmp_path, capsys):
    f = v3_trace(tmp_path / "run_kernel_trace.csv", [("a_kernel", 10), ("b_kernel", 20)])
    text = f.read_text()
    f.write_text(text[: text.rindex('"b_kernel"') + 15])  # cut the file mid-row
    rc, _, err = run([tmp_path], capsys)
    assert_one_line_error(rc, err, "run_kernel_trace.csv", "truncated")


def test_truncated_inside_a_quoted_name(tmp_path, capsys):
    f = v3_trace(tmp_path / "run_kernel_trace.csv", [("a_kernel", 10), ("mlir_dot_add", 20)])
    text = f.read_text()
    f.write_text(text[: text.rindex('"mlir_dot') + 6])  # ends inside an open quote
    rc, _, err = run([f], capsys)
    assert_one_line_error(rc, err, "truncated")


def test_non_number_where_a_number_belongs(tmp_path, capsys):
    f = write_csv(tmp_path / "results.stats.csv", V1_STATS, [["k", 1, "n/a", 1, 100.0]])
    rc, _, err = run([f], capsys)
    assert_one_line_error(rc, err, "TotalDurationNs", "'n/a' is not a number")


def test_folder_without_csv_points_at_rocpd_convert(tmp_path, capsys):
    (tmp_path / "host").mkdir()
    (tmp_path / "host/42_results.db").write_bytes(b"SQLite format 3\x00")
    rc, _, err = run([tmp_path], capsys)
    assert_one_line_error(rc, err, "no rocprofv3", "rocpd convert -i", "--output-format csv")


def test_unrecognised_csv_given_directly(tmp_path, capsys):
    f = write_csv(tmp_path / "notes.csv", ["a", "b"], [[1, 2]])
    rc, _, err = run([f], capsys)
    assert_one_line_error(rc, err, "not a recognised profiler CSV")


def test_broken_unrelated_csv_in_folder_is_skipped_with_a_note(tmp_path):
    v3_stats(tmp_path / "r_kernel_stats.csv", {"mlir_dot_add": (1, 100)})
    (tmp_path / "my_notes.csv").write_text("")
    adv = advise(tmp_path)
    assert [k.name for k in adv.kernels] == ["mlir_dot_add"]
    assert any("my_notes.csv" in n and "empty" in n for n in adv.notes)


def test_missing_profile_path(tmp_path, capsys):
    rc, _, err = run([tmp_path / "nope"], capsys)
    assert_one_line_error(rc, err, "no such file or directory")


def test_verbose_shows_the_traceback(tmp_path, capsys):
    f = tmp_path / "run_kernel_stats.csv"
    f.write_text("")
    rc, _, err = run([f, "-v"], capsys)
    assert rc == 2 and "Traceback" in err and "ProfileError" in err


def test_bad_option_is_one_line(tmp_path, capsys):
    rc, _, err = run([tmp_path, "--no-such-option"], capsys)
    assert_one_line_error(rc, err, "unrecognized arguments: --no-such-option")


def test_help_returns_zero(capsys):
    rc, out, _ = run(["--help"], capsys)
    assert rc == 0 and "--valu-threshold" in out and "--wait-threshold" in out


@pytest.mark.parametrize("flag, value", [("--valu-threshold", "160"),
                                         ("--wait-threshold", "-1"),
                                         ("--valu-threshold", "nan")])
def test_threshold_must_be_a_percentage(tmp_path, capsys, flag, value):
    rc, _, err = run([tmp_path, flag, value], capsys)
    assert_one_line_error(rc, err, flag, "between 0 and 100")


def test_nan_counter_values_are_ignored_not_averaged(tmp_path):
    v3_counters(tmp_path / "c_counter_collection.csv", [
        ("mlir_dot_add", 1000, {"VALUBusy": 50.0}), ("mlir_dot_add", 1000, {"VALUBusy": "nan"})])
    adv = advise(tmp_path)
    assert adv.metrics["valu_busy"] == pytest.approx(50.0)
    json.dumps(adv.to_dict(), allow_nan=False)  # stays valid JSON


@pytest.mark.parametrize("calls, total", [(10, "inf"), (10, "nan"), ("1e400", 100),
                                          ("nan", 100)])
def test_a_duration_or_count_that_is_not_finite_is_one_line(tmp_path, capsys, calls, total):
    """A stats row's TotalDurationNs of inf gave shares of NaN ('nan%', JSON NaN), a Calls
    of 1e400 an OverflowError traceback: a profile's times and counts are finite (a
    derived counter's nan is not: it is ignored, above)."""
    write_csv(tmp_path / "r_kernel_stats.csv", V3_STATS,
              [["mlir_dot_add", calls, total, 1, 50.0, 1, 1, 0.0],
               ["quantizelinear_kernel", 10, 300, 30, 50.0, 1, 1, 0.0]])
    rc, _, err = run([tmp_path, "--json"], capsys)
    assert_one_line_error(rc, err, "r_kernel_stats.csv", "is not a finite number")


def test_bad_model_file(tmp_path, capsys):
    v3_stats(tmp_path / "r_kernel_stats.csv", {"mlir_dot_add": (1, 100)})
    bad = tmp_path / "m.onnx"
    bad.write_bytes(b"\xff\x00not a protobuf")
    rc, _, err = run([tmp_path, "--model", bad], capsys)
    assert_one_line_error(rc, err, "cannot read as ONNX")


# ----------------------------------------------------------------------- the tree


@pytest.mark.parametrize("valu, wait, verdict", [
    (59.9, None, "fusion"),      # wait is not needed on this branch
    (60.0, 10.0, "quantize"),    # 60 is not below 60
    (60.0, 30.0, "quantize"),    # 30 is not above 30
    (60.0, 30.1, "memory"),
    (95.0, 80.0, "memory"),
    (None, 50.0, "undecided"),   # never guess VALU busy
    (75.0, None, "undecided"),   # never guess SQ wait
])
def test_decision_tree_branches_and_boundaries(valu, wait, verdict):
    assert decide(valu, wait) == verdict


def test_decision_tree_custom_thresholds():
    assert decide(50.0, 20.0, valu_threshold=40.0, wait_threshold=10.0) == "memory"
    assert decide(50.0, 20.0, valu_threshold=40.0, wait_threshold=25.0) == "quantize"
    assert decide(50.0, 20.0, valu_threshold=55.0) == "fusion"


def test_cli_thresholds_change_the_verdict(tmp_path, capsys):
    v3_counters(tmp_path / "c_counter_collection.csv", [
        ("mlir_convolution_add_relu", 1000,
         {"VALUBusy": 50.0, "SQ_WAIT_INST_ANY": 200, "SQ_WAVE_CYCLES": 1000})])
    assert "Verdict: FUSION" in run([tmp_path], capsys)[1]
    assert "Verdict: QUANTIZE" in run([tmp_path, "--valu-threshold", "45"], capsys)[1]
    rc, out, _ = run([tmp_path, "--valu-threshold", "45", "--wait-threshold", "15"], capsys)
    assert rc == 0 and "Verdict: MEMORY" in out
    assert "SQ wait 20.0% > 15% threshold" in out


def test_json_output(tmp_path, capsys):
    v3_counters(tmp_path / "c_counter_collection.csv", [
        ("mlir_convolution_add_relu", 1000, {"VALUBusy": 30.0})])
    rc, out, _ = run([tmp_path, "--json"], capsys)
    d = json.loads(out)
    assert rc == 0
    assert d["verdict"] == "fusion"
    assert d["metrics"]["valu_busy"] == pytest.approx(30.0)
    assert d["thresholds"] == {"valu_busy": 60.0, "sq_wait": 30.0}
    assert d["kernels"][0]["kind"] == "mlir-conv"


# ----------------------------------------------------------------------- kernel names


@pytest.mark.parametrize("name, kind, precision, activation", [
    ("mlir_convolution_add_relu", "mlir-conv", "float", "Relu"),
    ("mlir_convolution", "mlir-conv", "float", None),
    ("mlir_quant_convolution_dequantizelinear_add_relu_quantizelinear", "mlir-conv", "int8",
     "Relu"),
    ("mlir_quant_dot_dequantizelinear_add", "mlir-dot", "int8", None),
    ("mlir_dot_add_mul_erf_add_mul", "mlir-dot", "float", "Gelu"),
    ("quantizelinear_kernel", "qdq", None, None),
    ("dequantizelinear_add_kernel", "qdq", None, None),
    ("dequantizelinear_add_mul_neg_exp_add_div_quantizelinear_kernel", "qdq", None, None),
    ("add_relu_kernel", "pointwise", None, "Relu"),
    ("channelwise_conv_add_relu_kernel", "jit-conv", "float", "Relu"),
    ("contiguous_kernel", "layout", None, None),
    ("convert_kernel", "convert", None, None),
    ("softmax_kernel", "pointwise", None, None),
    ("miopenSp3AsmConv_v21_1_3_gfx9_fp32_stride1", "miopen-conv", None, None),
    ("igemm_fwd_gtcx3_nhwc_fp16_bx0_ex1_bt128x128x32_wt32x32x8", "miopen-conv", None, None),
    ("MIOpenBatchNormFwdInferSpatialEst", "batchnorm", None, None),
    ("Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1", "blas-gemm", None, None),
    ("__amd_rocclr_fillBufferAligned", "other", None, None),
])
def test_classify_migraphx_kernel_names(name, kind, precision, activation):
    kc = classify_kernel(name)
    assert (kc.kind, kc.precision, kc.activation) == (kind, precision, activation)


@pytest.mark.parametrize("raw, clean", [
    ("mlir_convolution_add_relu.kd", "mlir_convolution_add_relu"),
    ("bodyForce(Body*, float, int) [clone .kd]", "bodyForce"),
    ("void addition_kernel<float>(float*, float const*, int)", "addition_kernel<float>"),
    ('"add_relu_kernel"', "add_relu_kernel"),
])
def test_clean_kernel_name(raw, clean):
    assert clean_kernel_name(raw) == clean


def test_standalone_qdq_kernels_advise_a_new_qdq_placement(tmp_path):
    v3_stats(tmp_path / "r_kernel_stats.csv", {
        "mlir_quant_convolution_dequantizelinear_add": (10, 5_000_000),
        "quantizelinear_kernel": (10, 2_000_000), "dequantizelinear_relu_kernel": (10, 1_000_000),
        "pooling_kernel": (1, 2_000_000)})
    v3_counters(tmp_path / "c_counter_collection.csv",
                [("quantizelinear_kernel", 100, {"VALUBusy": 20.0})])
    adv = advise(tmp_path)
    first = adv.steps[0]
    assert adv.verdict == "fusion" and first.area == "fusion"
    assert "take 30.0% of kernel time" in first.text
    assert "quantizelinear_kernel 20.0%" in first.text
    assert "rewrite plan model.onnx --calib DIR -o plan.yaml" in first.text
    assert "--plan plan.yaml --calib DIR" in first.text


def test_small_qdq_share_gives_no_qdq_step(tmp_path):
    v3_stats(tmp_path / "r_kernel_stats.csv", {
        "mlir_quant_convolution_dequantizelinear_add_relu": (10, 9_700_000),
        "quantizelinear_kernel": (10, 300_000)})
    adv = advise(tmp_path)
    assert not any("quantize/dequantize" in s.text for s in adv.steps)


def test_unfused_activation_and_batchnorm_advise_fuse_conv_bn(tmp_path):
    v3_stats(tmp_path / "r_kernel_stats.csv", {
        "igemm_fwd_gtcx3_nchw_fp32": (10, 6_000_000), "add_relu_kernel": (10, 2_000_000),
        "MIOpenBatchNormFwdInferSpatialEst": (10, 2_000_000)})
    text = " ".join(s.text for s in advise(tmp_path).steps if s.area == "fusion")
    assert "add_relu_kernel 20.0%" in text
    assert "BatchNorm kernels take 20.0%" in text
    assert "`fuse-conv-bn`" in text and "`fold-constants`" in text


def test_memory_verdict_puts_layout_step_first(tmp_path):
    v3_stats(tmp_path / "r_kernel_stats.csv", {
        "mlir_convolution_add_relu": (10, 8_000_000), "contiguous_kernel": (10, 2_000_000)})
    v3_counters(tmp_path / "c_counter_collection.csv", [("mlir_convolution_add_relu", 100, {
        "VALUBusy": 70.0, "SQ_WAIT_INST_ANY": 500, "SQ_WAVE_CYCLES": 1000})])
    adv = advise(tmp_path)
    assert adv.verdict == "memory"
    assert adv.steps[0].area == "memory" and "contiguous_kernel 20.0%" in adv.steps[0].text
    assert adv.steps[-1].area == "quantize"


def test_quantize_verdict_offers_the_planner_first(tmp_path):
    v3_stats(tmp_path / "r_kernel_stats.csv", {
        "mlir_convolution_add_relu": (10, 9_000_000), "Cijk_Ailk_Bljk_SB": (1, 1_000_000)})
    v3_counters(tmp_path / "c_counter_collection.csv", [("mlir_convolution_add_relu", 100, {
        "VALUBusy": 90.0, "SQ_WAIT_INST_ANY": 50, "SQ_WAVE_CYCLES": 1000})])
    adv = advise(tmp_path)
    assert adv.verdict == "quantize"
    assert adv.steps[0].area == "quantize"
    assert "100.0% of kernel time is in FP32/FP16" in adv.steps[0].text
    assert "rewrite plan" in adv.steps[0].text


def test_all_int8_profile_does_not_offer_quantisation_of_int8_kernels(tmp_path):
    v3_stats(tmp_path / "r_kernel_stats.csv", {
        "mlir_quant_convolution_dequantizelinear_add_relu": (10, 1_000_000)})
    assert not any("FP32/FP16" in s.text for s in advise(tmp_path).steps)


# ----------------------------------------------------------------------- with --model

MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
agraph (float[1,3,16,16] x) => (float[1,8,16,16] y) {
    a = Conv <pads = [1, 1, 1, 1]> (x, w0)
    ar = Relu (a)
    b = Conv <pads = [1, 1, 1, 1]> (ar, w1)
    bn = BatchNormalization (b, s, bias, mean, var)
    br = Relu (bn)
    c = Conv <pads = [1, 1, 1, 1]> (br, w2)
    y = Clip (c)
}
"""


def make_model(path):
    import numpy as np
    rng = np.random.default_rng(0)
    m = onnx.parser.parse_model(MODEL)
    shapes = {"w0": (8, 3, 3, 3), "w1": (8, 8, 3, 3), "w2": (8, 8, 3, 3), "s": (8,),
              "bias": (8,), "mean": (8,), "var": (8,)}
    for name, shape in shapes.items():
        value = rng.random(shape, dtype=np.float32) + (1.0 if name == "var" else 0.0)
        m.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    names = iter(["conv_a", "relu_a", "conv_b", "bn_b", "relu_b", "conv_c", "clip_c"])
    for node in m.graph.node:
        node.name = next(names)
    onnx.save(m, str(path))
    return path


def test_model_matches_kernels_to_nodes_and_makes_the_advice_concrete(tmp_path):
    model = make_model(tmp_path / "opt.onnx")
    v3_stats(tmp_path / "prof/r_kernel_stats.csv", {
        "mlir_convolution_add_relu": (20, 8_000_000), "mlir_convolution_clip": (10, 2_000_000)})
    adv = advise(tmp_path / "prof", model=model)
    nodes = {k.name: k.nodes for k in adv.kernels}
    assert nodes["mlir_convolution_add_relu"] == ["conv_a", "conv_b"]  # b: through BatchNorm
    assert nodes["mlir_convolution_clip"] == ["conv_c"]
    assert adv.model["ops"]["Conv"] == 3 and adv.model["ops"]["BatchNormalization"] == 1
    unaligned = [c["node"] for c in adv.model["convs"] if c["unaligned"]]
    assert unaligned == ["conv_a"]  # 3 input channels
    text = " ".join(s.text for s in adv.steps)
    assert "pad-channels --pad-multiple 4" in text and "conv_a (3->8)" in text
    assert "1 Conv are followed by BatchNormalization (conv_b)" in text
    assert f"rewrite plan {model} --calib DIR -o plan.yaml" in text
    # the collect commands name a real command for this model
    assert all(f"-- migraphx-driver perf {model}" in m["command"] for m in adv.missing)
    assert "-> conv_a, conv_b" in adv.render_text()


QDQ_MODEL = """
<ir_version: 8, opset_import: ["" : 17]>
agraph (float[1,8,8,8] x) => (float[1,8,8,8] y) {
    xq = QuantizeLinear (x, sx, zp)
    xd = DequantizeLinear (xq, sx, zp)
    wd = DequantizeLinear (wq, sw, zp)
    c = Conv <pads = [1, 1, 1, 1]> (xd, wd)
    cq = QuantizeLinear (c, sc, zp)
    cd = DequantizeLinear (cq, sc, zp)
    y = Relu (cd)
}
"""


def test_qdq_between_conv_and_activation_is_named(tmp_path):
    import numpy as np
    m = onnx.parser.parse_model(QDQ_MODEL)
    m.graph.initializer.extend([
        onnx.numpy_helper.from_array(np.full((8, 8, 3, 3), 3, np.int8), "wq"),
        onnx.numpy_helper.from_array(np.array(0.02, np.float32), "sx"),
        onnx.numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
        onnx.numpy_helper.from_array(np.array(0.05, np.float32), "sc"),
        onnx.numpy_helper.from_array(np.array(0, np.int8), "zp")])
    m.graph.node[3].name = "conv_q"
    onnx.save(m, str(tmp_path / "q.onnx"))
    v3_stats(tmp_path / "p/r_kernel_stats.csv", {
        "mlir_quant_convolution_dequantizelinear": (10, 6_000_000),
        "quantizelinear_dequantizelinear_relu_kernel": (10, 4_000_000)})
    adv = advise(tmp_path / "p", model=tmp_path / "q.onnx")
    conv = adv.model["convs"][0]
    assert conv["int8"] and conv["qdq_between_conv_and_activation"]
    assert (conv["in_channels"], conv["out_channels"]) == (8, 8)  # dims through the DQ
    qdq = next(k for k in adv.kernels if k.kind == "qdq")
    assert qdq.nodes == ["conv_q"]
    assert "1 Conv have a Q/DQ pair between them and their activation (conv_q)" in adv.steps[0].text


def test_text_report_lists_hot_kernels_verdict_and_missing(tmp_path):
    v3_trace(tmp_path / "t_kernel_trace.csv", [("mlir_dot_add", 900), ("softmax_kernel", 100)])
    adv = advise(tmp_path)
    assert isinstance(adv, Advice)
    text = adv.render_text(top=1)
    assert "90.0%  mlir_dot_add  x1  [mlir-dot, float]" in text
    assert "... 1 more kernels" in text
    assert "Verdict: UNDECIDED" in text
    assert "rocprofv3 --pmc VALUBusy" in text


def test_counter_repeated_for_one_dispatch_sums_raw_and_averages_percentages(tmp_path):
    rows = [[1, 1, "Agent 1", 1, 9, 9, 64, 3, "mlir_dot_add", 64, 0, 0, 8, 0, 16, c, v, 0, 100]
            for c, v in [("SQ_WAIT_INST_ANY", 30), ("SQ_WAIT_INST_ANY", 10),
                         ("SQ_WAVE_CYCLES", 100), ("VALUBusy", 70.0), ("VALUBusy", 90.0)]]
    write_csv(tmp_path / "x_counter_collection.csv", V3_COUNTERS, rows)
    adv = advise(tmp_path)
    assert adv.metrics["sq_wait"] == pytest.approx(40.0)
    assert adv.metrics["valu_busy"] == pytest.approx(80.0)
