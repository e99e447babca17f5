"""Real inputs: the onnx wheel's own backend test models with stored reference outputs.

Every model onnxruntime can run is rewritten with the default pipeline and must reproduce
its stored outputs (test_data_set_*) as closely as the original does. The light model-zoo
architectures must lose every BatchNormalization and ConstantOfShape and pass --verify.
"""

import glob
import os

import numpy as np
import onnx
import pytest
from conftest import ONNX_DATA

import rewriter
from rewriter.core import ort
from rewriter.verify import compare

SUITES = ("pytorch-converted", "pytorch-operator", "simple")
CASES = sorted(d for s in SUITES for d in glob.glob(os.path.join(ONNX_DATA, s, "*"))
               if os.path.exists(os.path.join(d, "model.onnx")))
LIGHT = sorted(glob.glob(os.path.join(ONNX_DATA, "light", "*.onnx")))


def _load_set(case_dir, model):
    sets = sorted(glob.glob(os.path.join(case_dir, "test_data_set_*")))
    if not sets:
        return None, None
    d = sets[0]
    ins = [onnx.numpy_helper.to_array(onnx.load_tensor(f))
           for f in sorted(glob.glob(os.path.join(d, "input_*.pb")))]
    outs = [onnx.numpy_helper.to_array(onnx.load_tensor(f))
            for f in sorted(glob.glob(os.path.join(d, "output_*.pb")))]
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    return dict(zip(names, ins)), outs


def _err(ref, out):
    """Distance to the stored reference (NaN-aware; exact for strings and integers)."""
    ref, out = np.asarray(ref), np.asarray(out)
    if ref.dtype.kind not in "fc":
        return float(np.mean(ref != out)) if ref.size else 0.0
    m = compare("out", ref.astype(out.dtype), out)
    return m.max_abs / max(1.0, float(np.nanmax(np.abs(ref))) if ref.size else 1.0)


@pytest.mark.parametrize("case", CASES, ids=lambda p: os.path.basename(p))
def test_backend_case_reproduces_reference(case):
    path = os.path.join(case, "model.onnx")
    model = onnx.load(path)
    feeds, expected = _load_set(case, model)
    if feeds is None:
        pytest.skip("no test data set")
    try:
        original_out = ort.run(ort.session(model), feeds)
    except Exception as e:  # what onnxruntime cannot run is not ours to judge
        pytest.skip(f"onnxruntime cannot run the original: {str(e).splitlines()[0][:120]}")
    out_model, report = rewriter.rewrite(path)
    new_out = ort.run(ort.session(out_model, base_dir=case), feeds)
    for exp, o, n in zip(expected, original_out, new_out):
        assert n.shape == exp.shape and n.dtype == o.dtype
        assert _err(exp, n) <= _err(exp, o) + 1e-5, (report.render())


@pytest.mark.parametrize("path", LIGHT, ids=lambda p: os.path.basename(p)[6:-5])
def test_light_model_zoo(path):
    model, report = rewriter.rewrite(path, verify=True)
    ops = report.ops_after
    assert ops.get("BatchNormalization", 0) == 0
    assert ops.get("ConstantOfShape", 0) == 0
    assert report.ok
    for m in report.verification:
        assert m["max_rel"] < 1e-4 and m["cosine"] > 0.9999
    # Interface unchanged: real inputs (not the IR-3 weight inputs) and outputs.
    src = onnx.load(path, load_external_data=False)
    inits = {t.name for t in src.graph.initializer}
    assert [i.name for i in model.graph.input] == [i.name for i in src.graph.input
                                                   if i.name not in inits]
    assert [o.name for o in model.graph.output] == [o.name for o in src.graph.output]
    onnx.checker.check_model(model)
