"""The seeded fuzz harness (tools/fuzz.py), bounded for CI: 200 cases, seed 0.

Every case must end verified or as one clean error line with exit 2; the counts are
printed so a CI log shows them. The long run is `python tools/fuzz.py --cases 5000`.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]


def _fuzz():
    return load_script("tools/fuzz.py")


@pytest.mark.timeout(300)
def test_fuzz_200_seeded_cases_no_crash():
    r = _fuzz().fuzz(200, seed=0, timeout=60, recheck_every=10)
    print(f"\nfuzz 200 cases seed 0: rewritten-and-verified {r['verified']} / clean error "
          f"{r['clean_error']} / crash {r['crash']} ({r['seconds']} s)")
    assert r["verified"] + r["clean_error"] + r["crash"] == 200
    assert r["crash"] == 0, r["crashes"][:5]
    # The harness exercises both outcomes, and every mutation ran.
    assert r["verified"] >= 20 and r["clean_error"] >= 50
    assert set(r["by_mutation"]) == set(_fuzz().MUTATIONS)


def test_cases_are_reproducible_from_seed_and_index(tmp_path):
    fz = _fuzz()
    seeds = fz.seed_models()
    for i in range(30):
        a = fz.make_case(seeds, 5, i, tmp_path / f"a{i}")
        b = fz.make_case(seeds, 5, i, tmp_path / f"b{i}")
        assert a == b
        assert (tmp_path / f"a{i}" / "model.onnx").read_bytes() == \
            (tmp_path / f"b{i}" / "model.onnx").read_bytes()


def test_seed_models_are_valid():
    for s in _fuzz().seed_models():
        if s.name == "custom_function_sequence":
            continue  # a custom domain: the checker cannot know its ops
        onnx.checker.check_model(s.model)


def test_classifier_flags_what_is_not_clean(tmp_path):
    fz = _fuzz()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (tmp_path / "model.onnx").write_bytes(b"x")
    before = fz._snapshot(tmp_path)

    def verdict(code, err, stdout="", raised=None, output=False):
        (tmp_path / "stderr.txt").write_text(err)
        (tmp_path / "stdout.txt").write_text(stdout)
        o = out_dir / "out.onnx"
        if output:
            o.write_bytes(b"m")
        elif o.exists():
            o.unlink()
        return fz.classify({"code": code, "raised": raised}, tmp_path, o, before)[0]

    assert verdict(2, "rewrite: error: bad\n") == "clean_error"
    assert verdict(0, "", output=True) == "verified"
    assert verdict(2, "rewrite: error: bad\nmore\n") == "crash"
    assert verdict(2, "Traceback (most recent call last):\nrewrite: error: x\n") == "crash"
    assert verdict(3, "rewrite: error: internal error: x\n") == "crash"
    assert verdict(1, "rewrite: error: drift\n") == "crash"
    assert verdict(0, "") == "crash"  # exit 0 without an output
    assert verdict(0, "", stdout="noise", output=True) == "crash"
    assert verdict(None, "", raised="timeout after 30 s") == "crash"
    assert verdict(2, "rewrite: error: bad\n", output=True) == "crash"
