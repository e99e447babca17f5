"""Mixed precision on real trained classifiers, with real inputs (slow).

Calibration and evaluation use different seeds: the evaluation set (200 samples) is never
seen by calibration or by the planner. Skipped when the models are not fetched or Pillow /
scikit-image are missing.
"""

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

import rewriter
from rewriter.core import ort

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("REWRITE_MODELS", Path.home() / ".cache" / "rewrite" / "models"))
CLS = CACHE / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def _text_batches(n, seed):
    pytest.importorskip("PIL")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import calib_images
    finally:
        sys.path.pop(0)
    return [{"x": ((x - 0.5) / 0.5)[None].astype(np.float32)}
            for x, _ in calib_images.text_crops(n, seed=seed)]


def _agreement(fp32, quant, feeds):
    s0, s1 = ort.session(str(fp32)), ort.session(str(quant))
    a = np.concatenate([ort.run(s0, f)[0] for f in feeds])
    b = np.concatenate([ort.run(s1, f)[0] for f in feeds])
    top1 = float(np.mean(a.argmax(1) == b.argmax(1)))
    cos = float(np.sum(a * b) / np.linalg.norm(a) / np.linalg.norm(b))
    return top1, cos


def _producers(m):
    return {o: n for n in m.graph.node for o in n.output}


@pytest.fixture(scope="module")
def cls_data():
    if not CLS.exists():
        pytest.skip("ch_ppocr_mobile_v2.0_cls_infer not fetched (python tools/fetch_models.py)")
    return _text_batches(200, seed=11), _text_batches(200, seed=22)


@pytest.mark.slow
def test_default_plan_has_the_recipe_structure(cls_data, tmp_path):
    calib, evalset = cls_data
    out = tmp_path / "default.onnx"
    _, report = rewriter.rewrite(CLS, output=out, plan="default", calib=calib, materialize=False)
    m = onnx.load(out)
    prod = _producers(m)
    init = {t.name: t for t in m.graph.initializer}
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    mats = [n for n in m.graph.node if n.op_type in ("MatMul", "Gemm")]

    def is_int8(n):
        return all(i in prod and prod[i].op_type == "DequantizeLinear" for i in n.input[:2])

    def is_fp16(n):
        w = n.input[1]
        return w in init and init[w].data_type == onnx.TensorProto.FLOAT16

    assert is_fp16(convs[0]) and is_fp16(convs[-1]) and is_fp16(mats[-1])
    assert all(is_int8(c) for c in convs[1:-1])
    for c in convs[1:-1]:  # MIGraphX's form: int8 weights, explicit int8 zero points
        wdq = prod[c.input[1]]
        assert init[wdq.input[0]].data_type == onnx.TensorProto.INT8
        assert len(wdq.input) == 3
        xq = prod[prod[c.input[0]].input[0]]
        assert xq.op_type == "QuantizeLinear" and len(xq.input) == 3
        assert onnx.numpy_helper.to_array(init[xq.input[1]]).shape == ()
    top1, cos = _agreement(CLS, out, evalset)
    print(f"default plan: top-1 agreement {top1:.3f}, cosine {cos:.5f}")
    # In-domain text, 200 fresh samples: the recipe keeps the FP32 decisions (0.995
    # measured; 0.97 is about the 95% lower bound of that on 200 samples). A 2-class
    # model agrees half the time by chance, so "> 0.5" would prove nothing.
    assert top1 >= 0.97 and cos >= 0.99


@pytest.mark.slow
def test_auto_plan_keeps_accuracy_with_half_the_convs_in_int8(cls_data, tmp_path):
    calib, evalset = cls_data
    out = tmp_path / "auto.onnx"
    _, report = rewriter.rewrite(CLS, output=out, plan="auto", calib=calib, materialize=False)
    layers = report.extra["plan"]["layers"]
    convs = [v for v in layers.values() if v["op"] == "Conv"]
    share = sum(v["precision"] == "int8" for v in convs) / len(convs)
    top1, cos = _agreement(CLS, out, evalset)
    print(f"auto plan: {share:.0%} of convs INT8, top-1 agreement {top1:.3f}, cosine {cos:.5f}")
    assert share >= 0.5
    assert top1 >= 0.99 and cos >= 0.995
