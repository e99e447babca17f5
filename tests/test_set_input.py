"""--set-input / set_inputs=: an input becomes a constant of the value given and leaves the
output's interface; the rewrite is verified against the original fed that value. The
model here has the form of optimum's merged decoders: an If on a boolean input whose two
branches return caches of different lengths (MIGraphX refuses such an If; with the
condition set, fold-shapes keeps one branch)."""

import os

import numpy as np
import onnx
import pytest
from conftest import make_model, ops, run_ort
from test_cli import assert_one_line, run

import rewriter
from rewriter.core.errors import InputError


def _merged(flag_dims: str) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 1, 4] x, float[N, P, 4] past, bool[{flag_dims}] use_cache) =>
      (float[N, L, 4] logits, float[N, L, 4] present) {{
        flag = Squeeze (use_cache)
        present = If (flag) <
            then_branch = t () => (float[N, L, 4] present) {{
                h = Mul (x, w_cache)
                present = Concat <axis = 1> (past, h)
            }},
            else_branch = e () => (float[N, L, 4] present) {{
                h = Add (x, w_cache)
                present = Identity (h)
            }}
        >
        logits = MatMul (present, w)
    }}""", {"w_cache": rng.standard_normal((1, 1, 4)).astype(np.float32),
            "w": rng.standard_normal((4, 4)).astype(np.float32)})


def feeds(flag: bool, past: int = 5, batch: int = 2) -> dict:
    rng = np.random.default_rng(past)
    return {"x": rng.standard_normal((batch, 1, 4)).astype(np.float32),
            "past": rng.standard_normal((batch, past, 4)).astype(np.float32),
            "use_cache": np.array([flag])}


@pytest.mark.parametrize("flag", [True, False])
def test_a_set_condition_keeps_one_branch_and_leaves_the_interface(flag):
    m = _merged("1")
    out, rep = rewriter.rewrite(m, verify=True, set_inputs={"use_cache": flag})
    assert "If" not in ops(out) and ("Concat" in ops(out)) == flag
    assert [i.name for i in out.graph.input] == ["x", "past"]
    assert [o.name for o in out.graph.output] == ["logits", "present"]
    assert any(w.startswith(f"--set-input: use_cache = {flag}") for w in rep.warnings)
    onnx.checker.check_model(out, full_check=True)
    for past in (1, 5):
        f = feeds(flag, past)
        want = run_ort(m, f)
        got = run_ort(out, {k: v for k, v in f.items() if k != "use_cache"})
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)


def test_user_inputs_may_carry_the_same_value_and_are_not_changed():
    m = _merged("1")
    given = [feeds(True, 3), feeds(True, 6)]
    out, rep = rewriter.rewrite(m, inputs=given, set_inputs={"use_cache": np.array([True])})
    assert all("use_cache" in f for f in given)   # the caller's feeds are theirs
    assert "If" not in ops(out)
    with pytest.raises(InputError, match="another value than --set-input use_cache"):
        rewriter.rewrite(m, inputs=feeds(False), set_inputs={"use_cache": True})


def test_cli_sets_an_input_and_says_so(tmp_path, capfd):
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(_merged("1"), src)
    code, out, err = run(capfd, src, "-o", dst, "--set-input", "use_cache=true", "--verify",
                         "--target", "none")
    assert code == 0, err
    assert "warning: --set-input: use_cache = True: no longer input" in out
    assert [i.name for i in onnx.load(dst).graph.input] == ["x", "past"]


def test_calibration_samples_must_carry_the_value_set(tmp_path, capfd):
    # Samples of the other branch are ones the written model never runs: calibrating on
    # them was silent (the key was ignored as an extra one).
    m = _merged("1")
    good = [feeds(True, p) for p in (2, 3, 4)]
    out, _ = rewriter.rewrite(m, plan="default", calib=good, set_inputs={"use_cache": True})
    assert "If" not in ops(out)
    with pytest.raises(InputError, match="calibration sample|--calib sample 2 gives use_cache"):
        rewriter.rewrite(m, plan="default", calib=good[:2] + [feeds(False)],
                         set_inputs={"use_cache": True})
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(m, src)
    calib.mkdir()
    for j, f in enumerate(good + [feeds(False, 6)]):
        np.savez(calib / f"s{j}.npz", **f)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "default", "--calib",
                       calib, "--set-input", "use_cache=1", "--target", "none")
    assert code == 2
    assert_one_line(err, "s3.npz gives use_cache another value than --set-input use_cache",
                    "(False, not True)")
    assert not (tmp_path / "o.onnx").exists()
    (calib / "s3.npz").unlink()
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--plan", "default", "--calib",
                       calib, "--set-input", "use_cache=1", "--target", "none")
    assert code == 0, err


@pytest.mark.parametrize("argv, fragments", [
    (["--set-input", "nope=1"], ["'nope', which is not a graph input", "use_cache"]),
    (["--set-input", "use_cache=2"], ["use_cache=2: not a bool value"]),
    (["--set-input", "use_cache=yes"], ["use_cache=yes: a number, true or false"]),
    (["--set-input", "use_cache"], ["expected NAME=VALUE"]),
    (["--set-input", "use_cache=1", "--set-input", "use_cache=0"], ["use_cache twice"]),
])
def test_bad_set_input_is_a_one_line_error(tmp_path, capfd, argv, fragments):
    src = tmp_path / "m.onnx"
    onnx.save(_merged("1"), src)
    code, _, err = run(capfd, src, "-o", tmp_path / "o.onnx", "--target", "none", *argv)
    assert code == 2
    assert_one_line(err, *fragments)
    assert not (tmp_path / "o.onnx").exists()


def test_symbolic_dims_need_input_shape(tmp_path):
    m = _merged("B")
    with pytest.raises(InputError, match=r"dims are not all fixed \(B\): add --input-shape "
                                         r"use_cache:DIMS"):
        rewriter.rewrite(m, set_inputs={"use_cache": True})
    out, _ = rewriter.rewrite(m, verify=True, set_inputs={"use_cache": True},
                              input_shapes={"use_cache": [1]})
    assert "If" not in ops(out) and [i.name for i in out.graph.input] == ["x", "past"]


def test_integer_and_float_values_are_checked_against_the_type():
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] x, int64[1] k, float[1] s) => (float[2, 3] y) {
        a = Mul (x, s)
        kf = Cast <to = 1> (k)
        y = Add (a, kf)
    }""")
    out, _ = rewriter.rewrite(m, verify=True, set_inputs={"k": "7", "s": "0.5"})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(run_ort(out, {"x": x})[0], x * 0.5 + 7)
    with pytest.raises(InputError, match="k=2.5: not a int64 value"):
        rewriter.rewrite(m, set_inputs={"k": "2.5"})
    with pytest.raises(InputError, match="a value of shape \\[2\\] does not fit its dims"):
        rewriter.rewrite(m, set_inputs={"k": [1, 2]})


@pytest.mark.migraphx
@pytest.mark.parametrize("flag, on_file", [(True, True), (False, False)])
def test_merged_form_compiles_on_migraphx_once_its_condition_is_set(tmp_path, flag, on_file):
    # In memory too: the original is tried on MIGraphX from a file of its own (it was not
    # tried at all, and a refusal of both was put on the rewrite).
    pytest.importorskip("migraphx", reason="MIGraphX is not installed (not on PyPI/Debian)")
    m = _merged("1")
    if on_file:
        onnx.save(m, tmp_path / "m.onnx")
        m = tmp_path / "m.onnx"
    _, rep = rewriter.rewrite(m, output=tmp_path / "o.onnx", target="migraphx",
                              migraphx={"device": "ref"}, input_shapes={"past": [1, 5, 4]})
    info = rep.extra["compile"]   # the If's branches return other shapes: refused
    assert info["status"] == "failed" and "PARSE_IF" in info["original_refused"]
    assert "--set-input use_cache=true (or false) keeps one branch" in info["error"]
    _, rep = rewriter.rewrite(m, output=tmp_path / "o.onnx", target="migraphx",
                              migraphx={"device": "ref"}, set_inputs={"use_cache": flag})
    info = rep.extra["compile"]
    assert info["status"] == "compiled" and info["ok"], info.get("error")
    assert [x["name"] for x in info["metrics"]] == ["logits", "present"]


@pytest.mark.migraphx
def test_an_in_memory_original_is_written_only_where_migraphx_refuses(tmp_path,
                                                                      monkeypatch):
    # The original is tried on MIGraphX only on a refusal or a miss: a compile that passes
    # does not write it (a toolchain's 2 GB ModelProto, each call).
    pytest.importorskip("migraphx", reason="MIGraphX is not installed (not on PyPI/Debian)")
    import rewriter.api as api

    written = []
    real = api.save_model
    monkeypatch.setattr(api, "save_model",
                        lambda exp, path, **kw: written.append(path) or real(exp, path, **kw))
    _, rep = rewriter.rewrite(_merged("1"), target="migraphx", migraphx={"device": "ref"},
                              set_inputs={"use_cache": True})
    assert rep.extra["compile"]["status"] == "compiled" and not written
    _, rep = rewriter.rewrite(_merged("1"), target="migraphx", migraphx={"device": "ref"},
                              input_shapes={"past": [1, 5, 4]})
    assert "PARSE_IF" in rep.extra["compile"]["original_refused"]
    assert [os.path.basename(p) for p in written].count("original.onnx") == 1
