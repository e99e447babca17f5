"""The Python API against the CLI, second round (2026-12-07): a value the CLI refuses in one
line is refused by ``rewriter.rewrite`` as an InputError with the same words (never read by
nothing, nor run as something else), and a call leaves the caller's process as it was."""

import os
import pickle
import threading
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

import rewriter
from rewriter.cli import main
from rewriter.core.errors import InputError, PassError
from rewriter.core.pass_base import Numerics, Pass, Phase

RESNET = ROOT / "models" / "resnet_mini.onnx"
MOBILENET = ROOT / "models" / "mobilenet_mini.onnx"


@pytest.fixture
def calib(tmp_path):
    folder = tmp_path / "calib"
    folder.mkdir()
    rng = np.random.default_rng(3)
    for i in range(4):
        np.save(folder / f"s{i}.npy", rng.standard_normal((1, 3, 64, 64)).astype(np.float32))
    return folder


def _cli_error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    return capsys.readouterr().err.strip().splitlines()[-1].removeprefix("rewrite: error: ")


def test_what_the_cli_refuses_before_work_the_api_refuses_in_its_words(tmp_path, calib,
                                                                       capsys):
    """calib= without a plan and a preprocess without calib= were read by nothing: the
    rewrite ran and said nothing, where the CLI refuses both in one line."""
    out = str(tmp_path / "o.onnx")
    pre = tmp_path / "pre.yaml"
    pre.write_text("size: 64\n")
    for argv, kwargs in (
            (["--calib", str(calib)], {"calib": calib}),
            (["--plan", "fp16", "--preprocess", str(pre)],
             {"plan": "fp16", "options": {"planner": {"preprocess": {"size": 64}}}}),
            (["--plan", "fp16", "--calib", str(calib), "--preprocess", str(pre)],
             {"plan": "fp16", "calib": calib,
              "options": {"planner": {"preprocess": {"size": 64}}}})):
        said = _cli_error([str(RESNET), "-o", out, "--target", "none"] + argv, capsys)
        with pytest.raises(InputError) as e:
            rewriter.rewrite(RESNET, output=out, **kwargs)
        assert str(e.value).startswith(said + " [Python API: ")
    assert not os.path.exists(out)


@pytest.mark.parametrize("kwargs, match", [
    # taken for per-tensor, silently: Plan.per_channel is weights == "per-channel"
    ({"options": {"planner": {"weights": "per-row"}}}, r"--weights 'per-row': per-channel or"),
    ({"options": {"planner": {"samples": 2.5}}}, r"--samples 2\.5: a whole number"),
    ({"target": "migraphx", "migraphx": {"device": "cpu"}},
     r"--migraphx-target 'cpu': one of auto, gpu, ref \[Python API: --migraphx-target is "),
    ({"target": "migraphx", "migraphx": {"backend": "rocm"}},
     r"--backend 'rocm': one of migraphx, ort-migraphx \[Python API: --backend is migraphx="),
])
def test_values_the_cli_parser_refuses_are_refused(kwargs, match, calib):
    if "options" in kwargs:
        kwargs = dict(kwargs, plan="default", calib=calib)
    with pytest.raises(InputError, match=match):
        rewriter.rewrite(RESNET, **kwargs)


def test_save_mxr_never_replaces_the_output_or_the_input(tmp_path, capsys):
    """migraphx={"save_mxr": <the output>} (or the input model) was taken: the compiled
    program would have replaced the model just written. The CLI refuses both."""
    out = tmp_path / "o.onnx"
    said = _cli_error([str(RESNET), "-o", str(out), "--save-mxr", str(out)], capsys)
    for path, model in ((out, RESNET), (RESNET, RESNET), (out, RESNET.read_bytes())):
        with pytest.raises(InputError, match="--save-mxr .*: would overwrite") as e:
            rewriter.rewrite(model, output=out, target="migraphx",
                             migraphx={"save_mxr": path})
        if path == out and model == RESNET:
            assert str(e.value).startswith(said)


def test_a_plan_leaves_the_callers_environment_as_it_was():
    """threadpoolctl's import (GPTQ holds BLAS to one thread) set KMP_DUPLICATE_LIB_OK in
    os.environ: every later child of the caller's process inherited it. A fresh process,
    since the import happens once."""
    code = (
        "import os, numpy as np, rewriter\n"
        "calib = [{'input': np.random.default_rng(i).standard_normal((1, 3, 64, 64))"
        ".astype(np.float32)} for i in range(4)]\n"
        "before = dict(os.environ)\n"
        f"rewriter.rewrite({str(MOBILENET)!r}, plan='default', calib=calib)\n"
        "print(sorted(set(os.environ.items()) ^ set(before.items())))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("KMP_DUPLICATE_LIB_OK", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]"


class _Crash(Pass):
    name, phase, numerics = "crash", Phase.FUSE, Numerics.EXACT

    def run(self, graph, ctx):
        raise RuntimeError("boom")


def test_a_pass_error_crosses_a_process_pool():
    """A process pool (concurrent.futures) re-raises a worker's error in the caller by
    pickling it: PassError, rebuilt from its message alone, was a TypeError there."""
    with pytest.raises(PassError) as e:
        rewriter.rewrite(RESNET, ["fold-constants", _Crash()])
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is PassError and str(back) == str(e.value)
    assert (back.pass_name, back.before, repr(back.cause)) == (
        "crash", ["fold-constants"], "RuntimeError('boom')")


class _Unpicklable(Exception):
    def __init__(self):
        super().__init__("held a lock")
        self.lock = threading.Lock()


def test_a_pass_error_whose_cause_does_not_pickle_still_crosses():
    """A cause holding what pickle refuses (a lock, a session) made the PassError itself
    unpicklable: a process pool's caller got "cannot pickle '_thread.lock' object" in its
    place. The cause goes as its type and words then; the message is kept."""
    e = PassError("crash", ["fold-constants"], _Unpicklable())
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is PassError and str(back) == str(e) and back.pass_name == "crash"
    assert repr(back.cause) == "RuntimeError('_Unpicklable: held a lock')"


class _TwoArguments(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def test_a_pass_error_whose_cause_does_not_unpickle_still_crosses():
    """A cause that pickles but is not rebuilt from its args (an exception whose __init__
    takes more than the message it passes on: a common pattern) passed the check, which
    only pickled it, and the caller's unpickling raised "missing 1 required positional
    argument" in the PassError's place. The round trip is checked now."""
    e = PassError("crash", ["fold-constants"], _TwoArguments("bad code", 7))
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is PassError and str(back) == str(e) and back.pass_name == "crash"
    assert repr(back.cause) == "RuntimeError('_TwoArguments: bad code')"
    kept = pickle.loads(pickle.dumps(PassError("crash", [], ValueError("v"))))
    assert repr(kept.cause) == "ValueError('v')"   # a cause that crosses goes as itself


def test_report_ok_says_the_migraphx_step_failed():
    """report.ok (and verified, and "ok" in the JSON) stayed True when the MIGraphX step
    refused or missed, where the CLI exits 1 or 2: an integrator gating on them shipped
    a model MIGraphX does not compile."""
    from rewriter.core.report import Report
    for info, ok in (({"status": "failed", "ok": False}, False),
                     ({"status": "skipped", "ok": True}, True), (None, True)):
        r = Report(input="m", verification=[{"name": "y", "ok": True}],
                   extra={} if info is None else {"compile": info})
        assert (r.ok, r.verified, r.to_dict()["ok"]) == (ok, ok, ok)


@pytest.mark.migraphx
def test_a_model_migraphx_refuses_is_not_ok_through_the_api(tmp_path, capsys):
    pytest.importorskip("migraphx", reason="MIGraphX is not installed (not on PyPI/Debian)")
    import onnx.parser
    m = onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 18]>
        g (float[2, 3, 3] x) => (float[2] y) { y = Det(x) }""")
    _, rep = rewriter.rewrite(m, target="migraphx", migraphx={"device": "ref"}, verify=True)
    assert rep.extra["compile"]["status"] == "failed" and not rep.ok and not rep.verified
    path = tmp_path / "det.onnx"
    onnx.save(m, path)
    assert main([str(path), "-o", str(tmp_path / "o.onnx"), "--migraphx-target", "ref",
                 "-q"]) == 2


def test_every_cli_option_has_its_api_argument():
    """A message that names a flag the API calls otherwise ends with the API's name for it
    (errors.API_NAMES); --backend and --fold-size-limit had none, so an API caller read
    "--backend 'rocm'" with nothing to say it is migraphx={"backend": ...}. Only what
    the API has no use for is left out (the report file, printing, the pass list)."""
    from rewriter.cli import build_parser
    from rewriter.core.errors import API_NAMES
    flags = [s for a in build_parser()._actions for s in a.option_strings if s.startswith("--")]
    no_api = {"--help", "--output", "--report", "--quiet", "--verbose", "--list-passes"}
    assert [f for f in flags if f not in API_NAMES and f not in no_api] == []


def test_inputs_take_a_file_or_folder_as_the_cli_does(tmp_path, capsys):
    """--inputs FILE|DIR had no API form: inputs="samples/" was refused as not a dict, so
    a toolchain loaded the files itself, another way than the CLI."""
    rng = np.random.default_rng(5)
    (tmp_path / "s").mkdir()
    for i in range(2):
        np.savez(tmp_path / "s" / f"{i}.npz",
                 input=rng.standard_normal((1, 3, 64, 64)).astype(np.float32))
    np.save(tmp_path / "one.npy", rng.standard_normal((1, 3, 64, 64)).astype(np.float32))
    for given in (tmp_path / "s", str(tmp_path / "one.npy")):
        _, rep = rewriter.rewrite(RESNET, inputs=given)
        assert rep.verified and "input" in rep.verified_with
        assert main([str(RESNET), "-o", str(tmp_path / "o.onnx"), "--target", "none",
                     "--inputs", str(given), "--report", str(tmp_path / "r.json")]) == 0
        cli = __import__("json").loads((tmp_path / "r.json").read_text())
        assert cli["verified_with"] == rep.verified_with
        assert [m["max_abs"] for m in cli["verification"]] == [
            m["max_abs"] for m in rep.verification]
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="a folder without .npz or .npy inputs"):
        rewriter.rewrite(RESNET, inputs=tmp_path / "empty")


def test_labels_are_those_of_the_samples_given(tmp_path, calib):
    """labels= with a folder was dropped for the folder's own file (none here: the plan
    was judged without them, silently); 12 labels for a list of 8 samples passed."""
    with pytest.raises(InputError, match="labels are given for .*, a folder: its labels"):
        rewriter.rewrite(MOBILENET, plan="default", calib=calib, labels=[1] * 4)
    samples = [{"input": np.random.default_rng(i).standard_normal((1, 3, 64, 64))
                .astype(np.float32)} for i in range(8)]
    for n in (5, 12):
        with pytest.raises(InputError, match=f"{n} labels for 8 calibration samples"):
            rewriter.rewrite(MOBILENET, plan="default", calib=samples, labels=[1] * n)
    # a limit reads fewer samples than the list holds: its labels still count whole
    _, rep = rewriter.rewrite(MOBILENET, plan="default", calib=samples, labels=[1] * 8,
                              options={"planner": {"samples": 6}})
    assert rep.passes


def test_the_json_report_is_standard_json(tmp_path):
    """Identical outputs have an SQNR of inf, written as ``Infinity`` in --report's JSON:
    JSON.parse and Go's and Rust's readers refuse the file. The largest float now (an
    order kept: a max_rel of inf is still above any bound), a NaN null."""
    import json
    _, rep = rewriter.rewrite(RESNET, [], verify=True)
    assert rep.verification[0]["sqnr_db"] == float("inf")

    def refuse(constant):
        raise ValueError(f"not JSON: {constant}")
    back = json.loads(rep.to_json(), parse_constant=refuse)
    assert back["verification"][0]["sqnr_db"] == sys.float_info.max and back["verified"]
    rep.extra["x"] = [float("nan"), float("-inf")]
    assert json.loads(rep.to_json())["x"] == [None, -sys.float_info.max]


def test_a_zero_dim_is_refused_as_the_cli_refuses_it():
    """input_shapes={"input": [0, 3, 64, 64]} ran on empty tensors and said verified=True
    with nothing compared; --input-shape input:0x3x64x64 is refused."""
    with pytest.raises(InputError, match=r"input_shapes\['input'\] = \[0, 3, 64, 64\]: dims"):
        rewriter.rewrite(RESNET, verify=True, input_shapes={"input": [0, 3, 64, 64]})
