"""Calibration: loading folders and iterables, preprocessing images, collecting ranges."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys

import numpy as np
import onnx
import pytest
from conftest import make_model

from rewriter.core import ort
from rewriter.core.convert import export, is_stub, to_graph
from rewriter.core.errors import InputError
from rewriter.core.load import load_model
from rewriter.quant import data as D
from rewriter.quant import ranges as R

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")

MLP = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,4] x) => (float[N,3] y) {
  h = MatMul(x, w1)
  r = Relu(h)
  n = Neg(r)
  y = MatMul(r, w2)
}
"""

TWO_INPUTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,4] a, float[2,4] b) => (float[N,4] y) {
  s = ReduceSum<keepdims=1>(b)
  y = Add(a, s)
}
"""


def mlp():
    return make_model(MLP, {"w1": (4, 5), "w2": (5, 3)})


def image_model(dims, dtype="float"):
    shape = ",".join(str(d) for d in dims)
    return make_model(f"""
<ir_version: 8, opset_import: ["" : 17]>
g ({dtype}[{shape}] x) => ({dtype}[{shape}] y) {{
  y = Identity(x)
}}
""")


def feeds_list(n=6, rows=3, seed=0, dist="normal"):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_t(2, (rows, 4)) if dist == "t" else rng.standard_normal((rows, 4))
        out.append({"x": x.astype(np.float32)})
    return out


def reference_amax(model, tensors, feeds):
    """max |x| per tensor, with every tensor exposed at once (the naive way)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors if t not in have)
    sess = ort.session(m)
    amax = dict.fromkeys(tensors, 0.0)
    for f in feeds:
        outs = dict(zip(tensors, sess.run(tensors, f)))
        for t in tensors:
            amax[t] = max(amax[t], float(np.abs(outs[t]).max()))
    return amax


def all_tensors(model):
    return [i.name for i in model.graph.input] + [o for n in model.graph.node for o in n.output]


# --------------------------------------------------------------------------- folders


def test_npy_folder_sorted_lazy_reiterable(tmp_path):
    m = mlp()
    arrays = feeds_list(4)
    for i, f in reversed(list(enumerate(arrays))):  # written out of order
        np.save(tmp_path / f"b{i:02d}.npy", f["x"])
    (tmp_path / "manifest.json").write_text("{}")
    (tmp_path / ".hidden.npy").write_bytes(b"junk")
    data = D.load_calibration(tmp_path, m)
    assert data.kind == "npy" and len(data) == 4 and data.n_samples == 4
    assert data.names == ["x"]
    assert [p.name for p in data.files] == [f"b{i:02d}.npy" for i in range(4)]
    assert data.ignored == ["manifest.json"]
    for _ in range(2):  # re-iterable
        got = list(data)
        assert all(np.array_equal(g["x"], a["x"]) for g, a in zip(got, arrays))
    assert len(D.load_calibration(tmp_path, m, limit=3)) == 3


def test_a_labels_file_holds_one_label_per_sample(tmp_path):
    """A labels.txt of 5 lines beside 4 samples was taken (the first 4), so a stray line
    at the top shifted every label, silently (2026-12-07); fewer were refused already.
    Under a limit the file still holds the whole folder's."""
    for k in range(4):
        np.save(tmp_path / f"{k}.npy", np.zeros((1, 4), np.float32))
    for lines, fails in (("1 2 3 4", False), ("9 1 2 3 4", True), ("1 2 3", True)):
        (tmp_path / "labels.txt").write_text(lines.replace(" ", "\n"))
        if fails:
            with pytest.raises(InputError, match=f"labels.txt: {len(lines.split())} labels "
                                                 "for 4 samples"):
                D.load_calibration(tmp_path, mlp())
        else:
            assert list(D.load_calibration(tmp_path, mlp()).labels) == [1, 2, 3, 4]
            assert list(D.load_calibration(tmp_path, mlp(), limit=2).labels) == [1, 2]


def test_labels_are_class_indices_not_rounded_or_negative(tmp_path):
    """Labels of 1.5 were read as class 1 and -1 as a class no output picks (a sample
    judged wrong, unsaid), 1e30 was an OverflowError (exit 3); the given forms stay read:
    numpy int64/int32/uint8 arrays, a tuple, whole floats, a file with CRLF line ends and
    a trailing newline."""
    m = mlp()
    cal = [{"x": np.zeros((1, 4), np.float32)} for _ in range(3)]
    for ok in (np.array([1, 2, 3], np.int64), np.array([1, 2, 3], np.int32),
               np.array([1, 2, 3], np.uint8), (1, 2, 3), [1.0, 2.0, 3.0]):
        assert D.load_calibration(cal, m, labels=ok).labels.tolist() == [1, 2, 3]
    for bad, said in (([1.5, 2, 3], "label 0 is 1.5"), ([1, -1, 3], "label 1 is -1"),
                      ([1, 2, 1e30], "label 2 is 1e+30")):
        with pytest.raises(InputError, match=re.escape(f"integers >= 0; {said}")):
            D.load_calibration(cal, m, labels=bad)
    for k in range(3):
        np.save(tmp_path / f"{k}.npy", np.zeros((1, 4), np.float32))
    (tmp_path / "labels.txt").write_bytes(b"1\r\n2\r\n3\r\n")
    assert D.load_calibration(tmp_path, m).labels.tolist() == [1, 2, 3]
    (tmp_path / "labels.txt").unlink()
    np.save(tmp_path / "labels.npy", np.array([1.0, 2.5, 3.0]))
    with pytest.raises(InputError, match="labels.npy: class indices .* label 1 is 2.5"):
        D.load_calibration(tmp_path, m)


def test_npz_folder_multi_input(tmp_path):
    m = make_model(TWO_INPUTS)
    rng = np.random.default_rng(0)
    for i in range(3):
        np.savez(tmp_path / f"s{i}.npz", a=rng.standard_normal((i + 1, 4)).astype(np.float32),
                 b=rng.standard_normal((2, 4)).astype(np.float32), label=np.int64(i))
    data = D.load_calibration(tmp_path, m)
    assert data.kind == "npz" and data.names == ["a", "b"]
    feeds = list(data)
    assert [f["a"].shape for f in feeds] == [(1, 4), (2, 4), (3, 4)]
    assert set(feeds[0]) == {"a", "b"}  # extra keys ignored


def test_subfolders_and_single_file(tmp_path):
    m = mlp()
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    np.save(tmp_path / "b" / "0.npy", np.ones((1, 4), np.float32))
    np.save(tmp_path / "a" / "1.npy", np.zeros((1, 4), np.float32))
    data = D.load_calibration(tmp_path, m)
    assert [p.parent.name for p in data.files] == ["a", "b"]
    one = D.load_calibration(tmp_path / "a" / "1.npy", m)
    assert len(one) == 1


def test_batch_size_concatenates_samples(tmp_path):
    m = mlp()
    for i in range(5):
        np.save(tmp_path / f"{i}.npy", np.full((1, 4), i, np.float32))
    data = D.load_calibration(tmp_path, m, batch_size=2)
    assert len(data) == 3 and data.n_samples == 5
    got = [f["x"][:, 0].tolist() for f in data]
    assert got == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("setup, message", [
    ("empty", "no calibration files"),
    ("only-json", "it has notes.json"),
    ("missing", "no such calibration folder"),
    ("mixed", "mixes kinds"),
    ("shape", "expects [?, 4]"),
    ("rank", "batch dimension missing"),
    ("dtype", "dtype float64"),
    ("corrupt-npy", "not a readable .npy"),
    ("truncated-npy", "not a readable .npy"),
    ("corrupt-npz", "not a readable .npz"),
    ("npz-key", "missing input(s) ['x']"),
])
def test_bad_folders(tmp_path, setup, message):
    m = mlp()
    good = np.zeros((2, 4), np.float32)
    d = tmp_path / "calib"
    if setup != "missing":
        d.mkdir()
    if setup == "only-json":
        (d / "notes.json").write_text("{}")
    elif setup == "mixed":
        np.save(d / "a.npy", good)
        np.savez(d / "b.npz", x=good)
    elif setup == "shape":
        np.save(d / "a.npy", good)
        np.save(d / "bad.npy", np.zeros((2, 5), np.float32))
    elif setup == "rank":
        np.save(d / "bad.npy", np.zeros((4,), np.float32))
    elif setup == "dtype":
        np.save(d / "bad.npy", good.astype(np.float64))
    elif setup == "corrupt-npy":
        (d / "bad.npy").write_bytes(b"not numpy at all")
    elif setup == "truncated-npy":
        np.save(d / "bad.npy", np.zeros((200, 4), np.float32))
        raw = (d / "bad.npy").read_bytes()
        (d / "bad.npy").write_bytes(raw[: len(raw) // 2])
    elif setup == "corrupt-npz":
        (d / "bad.npz").write_bytes(b"PK\x03\x04 broken zip")
    elif setup == "npz-key":
        np.savez(d / "bad.npz", input=good)
    with pytest.raises(InputError) as e:
        # Header checks catch most problems up front; a truncated body shows on reading.
        list(D.load_calibration(d, m))
    msg = str(e.value)
    assert message in msg
    assert "\n" not in msg
    if setup in ("shape", "rank", "dtype", "corrupt-npy", "truncated-npy", "corrupt-npz",
                 "npz-key"):
        assert "bad.np" in msg  # names the file


def test_npy_needs_single_input(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((1, 4), np.float32))
    with pytest.raises(InputError, match="single-input"):
        D.load_calibration(tmp_path, make_model(TWO_INPUTS))


def test_batch_size_needs_symbolic_first_dim(tmp_path):
    with pytest.raises(InputError, match="static first dim"):
        D.load_calibration([{"a": np.zeros((1, 4), np.float32),
                             "b": np.zeros((2, 4), np.float32)}],
                           make_model(TWO_INPUTS), batch_size=2)


# --------------------------------------------------------------------------- API iterables


def test_api_list_generator_and_limit():
    m = mlp()
    feeds = feeds_list(5)
    data = D.load_calibration(feeds, m)
    assert len(data) == 5 and data.kind == "api"
    gen = D.load_calibration((f for f in feeds), m, limit=3)
    assert len(gen) == 3
    assert [np.array_equal(a["x"], b["x"]) for a, b in zip(gen, feeds)] == [True] * 3
    assert len(list(gen)) == 3  # a generator is read once, then re-iterable
    again = D.load_calibration(data, m, limit=2)
    assert len(again) == 2


@pytest.mark.parametrize("source, message", [
    ([], "gave no samples"),
    ([{"y": np.zeros((1, 4), np.float32)}], "missing input(s) ['x']"),
    ([{"x": np.zeros((1, 5), np.float32)}], "calibration sample 0: input 'x' has shape"),
    ([np.zeros((1, 4), np.float32)], "expected a dict"),
    ({"x": np.zeros((1, 4), np.float32)}, "wrap it in a list"),
    (42, "expected a folder path or an iterable"),
])
def test_api_bad(source, message):
    with pytest.raises(InputError) as e:
        D.load_calibration(source, mlp())
    assert message in str(e.value)


def test_split_evenly_spaced_and_deterministic():
    m = mlp()
    feeds = [{"x": np.full((1, 4), i, np.float32)} for i in range(10)]
    data = D.load_calibration(feeds, m)
    cal, held = data.split(3)
    ids = lambda d: [int(f["x"][0, 0]) for f in d]
    assert len(cal) == 7 and len(held) == 3
    assert sorted(ids(cal) + ids(held)) == list(range(10))
    assert ids(held) == [1, 5, 8]  # spread out, not the tail
    assert ids(data.split(3)[1]) == ids(held)
    assert len(data.split(0)[0]) == 10
    with pytest.raises(InputError, match="cannot hold out"):
        data.split(10)


# --------------------------------------------------------------------------- preprocess


def test_preprocess_from_dict_values():
    p = D.Preprocess.from_dict({"size": "32x48", "mean": [0.5, 0.4, 0.3], "std": 0.5,
                                "scale": "1/255", "layout": "nhwc", "channel_order": "bgr",
                                "resize": "center-crop", "interpolation": "NEAREST",
                                "dtype": "float16"})
    assert p.size == (32, 48) and p.mean == (0.5, 0.4, 0.3) and p.std == (0.5,)
    assert p.scale == pytest.approx(1 / 255) and p.layout == "NHWC"
    assert p.channel_order == "BGR" and p.resize == "center-crop"
    assert p.interpolation == "nearest" and p.dtype == "float16"
    assert D.Preprocess.from_dict({"size": 224}).size == (224, 224)
    assert D.Preprocess.from_dict(None) == D.Preprocess()
    assert D.Preprocess(dtype=np.float32).dtype == "float32"


@pytest.mark.parametrize("d, message", [
    ({"szie": [2, 2]}, "unknown key 'szie'; did you mean 'size'?"),
    ({"bogus": 1}, "unknown key 'bogus'; known: size"),
    ({"size": [1, 2, 3]}, "two positive ints"),
    ({"size": "big"}, "not [h, w]"),
    ({"std": [1, 0, 1]}, "std must be > 0"),
    ({"scale": "1/0"}, "not a number"),
    ({"scale": -1}, "scale must be > 0"),
    ({"mean": ["a"]}, "not a number"),
    ({"layout": "CHW"}, "not one of NCHW, NHWC"),
    ({"channel_order": "RGBA"}, "not one of RGB, BGR"),
    ({"resize": "squash"}, "not one of stretch, center-crop"),
    ({"dtype": "complex64"}, "not one of float32"),
    ({"mean": [123.7, 116.3, 103.5]}, "looks like 0..255 units"),
    ([1, 2], "expected a mapping"),
])
def test_preprocess_bad(d, message):
    with pytest.raises(InputError) as e:
        D.Preprocess.from_dict(d)
    assert message in str(e.value)


def test_plan_preprocess_section_checked_at_load():
    """plans.md: an unknown key is an error. A plan's misspelt preprocess key passed
    unsaid where the calibration folder held .npy files (the section unused there)."""
    from rewriter.quant.plan import from_dict

    with pytest.raises(InputError,
                       match="plan p.yaml: preprocess: unknown key 'szie'; did you mean"):
        from_dict({"version": 1, "preprocess": {"szie": [64, 64]}}, "p.yaml")
    assert from_dict({"preprocess": {"size": 64}}, "p.yaml").preprocess == {"size": 64}


def write_pngs(folder, colours, size=(20, 16)):
    Image = pytest.importorskip("PIL.Image")
    folder.mkdir(exist_ok=True)
    for i, c in enumerate(colours):
        Image.new("RGB", size, tuple(c)).save(folder / f"img{i}.png")


COLOURS = [(10, 20, 30), (40, 50, 60), (70, 80, 90)]


def test_image_folder_nchw_bgr_normalised(tmp_path):
    write_pngs(tmp_path / "imgs", COLOURS)
    m = image_model(["N", 3, 8, 10])
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 0.125)
    pre = {"mean": list(mean), "std": list(std), "channel_order": "BGR"}
    data = D.load_calibration(tmp_path / "imgs", m, preprocess=pre, batch_size=2)
    assert data.kind == "image" and len(data) == 2 and data.n_samples == 3
    batches = list(data)
    assert [b["x"].shape for b in batches] == [(2, 3, 8, 10), (1, 3, 8, 10)]
    x = np.concatenate([b["x"] for b in batches])
    assert x.dtype == np.float32
    for i, (r, g, b) in enumerate(COLOURS):
        for ch, v in enumerate((b, g, r)):  # BGR
            want = (np.float32(v) * np.float32(1 / 255) - np.float32(mean[ch])) / np.float32(std[ch])
            np.testing.assert_allclose(x[i, ch], want, rtol=1e-6)


def test_image_folder_nhwc_grey_static_batch_and_crop(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    write_pngs(tmp_path / "imgs", COLOURS)
    nhwc = D.load_calibration(tmp_path / "imgs", image_model([1, 8, 10, 3]))
    assert [b["x"].shape for b in nhwc] == [(1, 8, 10, 3)] * 3  # layout read from the dims
    grey = D.load_calibration(tmp_path / "imgs", image_model([2, 1, 8, 10]))
    assert len(grey) == 1  # a static batch of 2: the third image is left over
    assert next(iter(grey))["x"].shape == (2, 1, 8, 10)
    raw = D.load_calibration(tmp_path / "imgs", image_model(["N", 3, 8, 10], "uint8"),
                             preprocess={"scale": 1})
    assert next(iter(raw))["x"][0, :, 0, 0].tolist() == [10, 20, 30]
    # center-crop: a 40x16 picture, black left half, white right half, into 8x10
    half = np.zeros((16, 40, 3), np.uint8)
    half[:, 20:] = 255
    (tmp_path / "crop").mkdir()
    Image.fromarray(half).save(tmp_path / "crop" / "a.png")
    sym = image_model(["N", 3, "H", "W"])
    crop = next(iter(D.load_calibration(tmp_path / "crop", sym, preprocess={
        "size": [8, 10], "resize": "center-crop", "interpolation": "nearest"})))["x"]
    assert crop.shape == (1, 3, 8, 10)
    assert crop[0, 0, :, 0].max() == 0 and crop[0, 0, :, -1].min() == 1  # the centre
    stretch = next(iter(D.load_calibration(tmp_path / "crop", sym, preprocess={
        "size": [8, 10], "interpolation": "nearest"})))["x"]
    assert stretch[0, 0, 0, :5].max() == 0 and stretch[0, 0, 0, 5:].min() == 1


def test_image_folder_sized_by_the_input_shape_given(tmp_path):
    """A symbolic H and W and no preprocess size: --input-shape's H and W size the images
    (they were refused, 'set preprocess.size', with --input-shape images:1x3x320x320 given:
    nudenet's YOLOv8 detector), in either layout; a size in the preprocessing still wins."""
    write_pngs(tmp_path / "imgs", COLOURS)
    nchw, nhwc = image_model(["N", 3, "H", "W"]), image_model(["N", "H", "W", 3])
    for model, shapes, want in ((nchw, {"x": [1, 3, 8, 10]}, (1, 3, 8, 10)),
                                (nchw, {"": [1, 3, 6, 4]}, (1, 3, 6, 4)),
                                (nhwc, {"x": [1, 8, 10, 3]}, (1, 8, 10, 3))):
        data = D.load_calibration(tmp_path / "imgs", model, input_shapes=shapes)
        assert [b["x"].shape for b in data] == [want] * 3
    sized = D.load_calibration(tmp_path / "imgs", nchw, preprocess={"size": [5, 7]},
                               input_shapes={"x": [1, 3, 8, 10]})
    assert next(iter(sized))["x"].shape == (1, 3, 5, 7)


@pytest.mark.parametrize("dims, pre, message", [
    (["N", 3, "H", "W"], None, "give them, e.g. --input-shape x:1x3xHxW, or size: [h, w] in"),
    (["N", 3, 8, 10], {"size": [9, 10]}, "does not fit input"),
    (["N", 3, 8, 10], {"mean": [0.1, 0.2]}, "mean has 2 values"),
    (["N", 3, 8, 10], {"dtype": "float16"}, "differs from input"),
    (["N", 5, 8, 10], None, "has 5 channels"),
    ([4, 3, 8, 10], None, "needs 4"),
    (["N", 3, 8], None, "4-D image input"),
])
def test_image_folder_bad(tmp_path, dims, pre, message):
    write_pngs(tmp_path / "imgs", COLOURS)
    with pytest.raises(InputError) as e:
        D.load_calibration(tmp_path / "imgs", image_model(dims), preprocess=pre)
    assert message in str(e.value)


def test_integer_image_input_takes_raw_pixels_by_default(tmp_path):
    # A uint8 NHWC input with symbolic H, W (a model that normalises inside, like SSCD):
    # giving only the size must not trip over the float default scale of 1/255.
    write_pngs(tmp_path / "imgs", COLOURS)
    m = image_model(["N", "H", "W", 3], "uint8")
    for pre in ({"size": [8, 10]}, {"size": [8, 10], "scale": 1}):
        x = next(iter(D.load_calibration(tmp_path / "imgs", m, preprocess=pre)))["x"]
        assert x.dtype == np.uint8 and x[0, 0, 0].tolist() == [10, 20, 30]
    for pre in ({"size": [8, 10], "scale": "1/255"}, {"size": [8, 10], "mean": 0.5}):
        with pytest.raises(InputError, match="raw pixels only"):
            D.load_calibration(tmp_path / "imgs", m, preprocess=pre)
    assert D.Preprocess().pixel_scale == pytest.approx(1 / 255)  # float inputs: unchanged


def test_corrupt_image_names_file(tmp_path):
    write_pngs(tmp_path / "imgs", COLOURS[:1])
    (tmp_path / "imgs" / "zz.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    with pytest.raises(InputError, match="zz.jpg: not a readable image"):
        D.load_calibration(tmp_path / "imgs", image_model(["N", 3, 8, 10]))


def test_image_folder_without_pillow(tmp_path, monkeypatch):
    (tmp_path / "a.png").write_bytes(b"\x89PNG")
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(InputError) as e:
        D.load_calibration(tmp_path, image_model(["N", 3, 8, 10]))
    assert str(e.value) == "reading an image folder needs Pillow: pip install pillow"


# --------------------------------------------------------------------------- ranges


def test_minmax_equals_numpy_reference():
    m = mlp()
    feeds = feeds_list(7)
    tensors = all_tensors(m)
    got = R.collect_ranges(m, tensors, feeds, progress=False)
    assert got == reference_amax(m, tensors, feeds)
    assert list(got) == tensors


def test_a_model_path_and_one_tensor_name_as_a_new_user_gives_them(tmp_path):
    """calibration.md's calls with the model as a path and one tensor as a string
    (2026-12-07): an AttributeError ('str' object has no attribute 'graph'), and the name
    read as its letters ("tensor 'i' is not an input")."""
    path = os.path.join(MODELS, "mobilenet_mini.onnx")
    m = load_model(path)
    rng = np.random.default_rng(4)
    for k in range(3):
        np.save(tmp_path / f"{k}.npy", rng.standard_normal((1, 3, 64, 64)).astype(np.float32))
    data = D.load_calibration(tmp_path, path)
    assert data.n_samples == 3 and data.names == ["input"]
    want = R.collect_ranges(m, ["input"], tmp_path, progress=False)
    assert R.collect_ranges(path, "input", data, progress=False) == want
    with pytest.raises(InputError, match="model: a path or an onnx.ModelProto, got int"):
        D.load_calibration(tmp_path, 3)


def test_minmax_mobilenet_reference_and_chunking():
    m = load_model(os.path.join(MODELS, "mobilenet_mini.onnx"))
    rng = np.random.default_rng(3)
    feeds = [{"input": rng.standard_normal((2, 3, 64, 64)).astype(np.float32)}
             for _ in range(3)]
    tensors = all_tensors(m)
    before = m.SerializeToString()
    ref = reference_amax(m, tensors, feeds)
    for chunk in (1, 7, 64):
        assert R.collect_ranges(m, tensors, feeds, chunk=chunk, progress=False) == ref
    assert m.SerializeToString() == before  # the caller's model is left as it was


@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_chunking_and_determinism(method):
    m = mlp()
    feeds = feeds_list(6, rows=50, dist="t")
    tensors = all_tensors(m)
    kw = {"method": method, "num_bins": 512, "progress": False}
    one = R.collect_ranges(m, tensors, feeds, chunk=1, **kw)
    many = R.collect_ranges(m, tensors, feeds, chunk=64, **kw)
    again = R.collect_ranges(m, list(reversed(tensors)), feeds, chunk=2, **kw)
    assert one == many == again
    assert all(isinstance(v, float) and v >= 0 for v in one.values())


def test_percentile_below_max_and_monotone():
    m = mlp()
    feeds = feeds_list(8, rows=64, dist="t")
    tensors = ["x", "h", "r", "n"]
    mx = R.collect_ranges(m, tensors, feeds, progress=False)
    prev = None
    for p in (90.0, 99.0, 99.9, 99.999, 100.0):
        got = R.collect_ranges(m, tensors, feeds, method="percentile", percentile=p,
                               progress=False)
        for t in tensors:
            assert 0 < got[t] <= mx[t]
            if prev is not None:
                assert got[t] >= prev[t]
        prev = got
    # "n" is never positive: onnxruntime's own clip to the signed max would go negative.
    assert prev["n"] > 0 and prev["n"] == pytest.approx(mx["n"], rel=0.01)


def test_percentile_matches_onnxruntime_on_positive_data():
    from onnxruntime.quantization.calibrate import HistogramCollector

    m = mlp()
    feeds = feeds_list(5, rows=64, dist="t")
    ours = R.collect_ranges(m, ["x"], feeds, method="percentile", percentile=99.0,
                            num_bins=1000, progress=False)["x"]
    hc = HistogramCollector("percentile", True, 1000, 128, 99.0, "same")
    with contextlib.redirect_stdout(io.StringIO()):
        for f in feeds:
            hc.collect({"x": f["x"]})
        _lo, hi = hc.compute_collection_result()["x"][:2]
    # within a bin: the first histogram spans [0, max |x|] here, [min |x|, max |x|] there
    # (a tensor of nearly one magnitude had no room for its bins, tests/quant)
    width = max(float(np.abs(f["x"]).max()) for f in feeds) / 1000
    assert abs(ours - float(hi)) <= width


def test_entropy_clips_heavy_tails():
    m = mlp()
    feeds = feeds_list(8, rows=256, dist="t")
    mx = R.collect_ranges(m, ["x", "h"], feeds, progress=False)
    ent = R.collect_ranges(m, ["x", "h"], feeds, method="kl", progress=False)
    for t in ("x", "h"):
        assert 0 < ent[t] < 0.5 * mx[t]  # Student-t(2): the max is an outlier


def test_entropy_rebin_keeps_counts_and_zero_edge():
    rng = np.random.default_rng(0)
    m = mlp()
    # The first batch is narrow, the last wide: the collector's histogram grows ~50x.
    feeds = [{"x": (rng.standard_normal((64, 4)) * s).astype(np.float32)}
             for s in (0.1, 1.0, 5.0)]
    got = R.collect_ranges(m, ["x"], feeds, method="entropy", num_bins=256, progress=False)
    assert 0 < got["x"] <= R.collect_ranges(m, ["x"], feeds, progress=False)["x"]
    hist = np.arange(10, dtype=np.int64)
    edges = np.linspace(-5, 5, 11).astype(np.float32)
    h, e, _lo, _hi, t = R._rebin((hist, edges, -5.0, 5.0, 5.0), 4)
    assert h.sum() == hist.sum() and len(h) <= 4 and 0.0 in e.tolist()
    assert len(e) == len(h) + 1 and t == e[-1]


def test_screened_samples_only_find_inf_or_nan_never_move_a_range():
    """The held-out samples are screened for inf and NaN in the calibration's own sessions
    (a layer reading -inf on them alone stayed INT8): a non-finite value there makes the
    range inf, graph inputs and node outputs alike, over several chunks; finite ones,
    however large, change no range."""
    m = mlp()
    feeds, extra = feeds_list(4, seed=1), feeds_list(3, seed=2)
    plain = R.collect_ranges(m, ["x", "h", "r"], feeds, progress=False)
    for method in ("minmax", "mse"):
        big = [{"x": f["x"] * 1e3} for f in extra]
        assert R.collect_ranges(m, ["x", "h", "r"], feeds, method=method, progress=False,
                                screen=big) == R.collect_ranges(
            m, ["x", "h", "r"], feeds, method=method, progress=False)
    extra[1]["x"][0, 2] = np.inf   # x and h non-finite; r too (Relu of +-inf rows)
    got = R.collect_ranges(m, ["x", "h", "n"], feeds, chunk=1, screen=extra, progress=False)
    assert got["x"] == got["h"] == np.inf and got["n"] == np.inf
    extra[1]["x"][0, 2] = np.nan
    got = R.collect_ranges(m, ["h", "r"], feeds, screen=extra, progress=False)
    assert got["h"] == np.inf and got["r"] == np.inf
    assert plain["h"] < np.inf and plain["r"] < np.inf


def test_graph_inputs_exported_model_and_non_finite():
    m = mlp()
    feeds = feeds_list(4)
    feeds[1]["x"][0, 0] = np.inf
    plain = R.collect_ranges(m, ["x", "r"], feeds, progress=True)  # not a TTY: no bar
    finite = max(float(np.abs(f["x"][np.isfinite(f["x"])]).max()) for f in feeds)
    # int8 has no inf: the range says so (insert-qdq keeps such a layer float); float16
    # overflow is judged on the finite values (drop)
    assert plain["x"] == np.inf and plain["r"] == np.inf
    assert R.collect_ranges(m, ["x"], feeds, nonfinite="drop", progress=False)["x"] == finite
    for method in ("percentile", "mse"):
        assert R.collect_ranges(m, ["x"], feeds, method=method, progress=False)["x"] == np.inf
    feeds[1]["x"][0, 0] = np.nan
    assert R.collect_ranges(m, ["x"], feeds, progress=False)["x"] == np.inf
    with pytest.raises(InputError, match="nonfinite must be inf or drop"):
        R.collect_ranges(m, ["x"], feeds, nonfinite="keep", progress=False)
    # Weights as stubs: onnxruntime gets them as external initializers.
    ex = export(to_graph(mlp()), mlp())
    big = make_model(MLP, {"w1": (4, 300), "w2": (300, 3)})
    exb = export(to_graph(big), big)
    assert any(is_stub(t) for t in exb.model.graph.initializer)
    fin = feeds_list(4)
    for model, exported in ((m, ex), (big, exb)):
        assert (R.collect_ranges(exported, ["x", "h", "y"], fin, progress=False)
                == R.collect_ranges(model, ["x", "h", "y"], fin, progress=False))


def test_only_graph_inputs_and_empty():
    m = mlp()
    feeds = feeds_list(3)
    got = R.collect_ranges(m, ["x"], feeds, method="percentile", progress=False)
    assert 0 < got["x"]
    assert R.collect_ranges(m, [], feeds, progress=False) == {}


@pytest.mark.parametrize("kw, message", [
    ({"tensors": ["hh"]}, "did you mean 'h'"),
    ({"tensors": ["w1"]}, "is a weight"),
    ({"method": "median"}, "not one of minmax, percentile, entropy, mse"),
    ({"method": "percentile", "percentile": 0}, "percentile must be in (0, 100]"),
    ({"method": "entropy", "num_bins": 128}, "num_bins >= 256"),
    ({"method": "entropy", "num_bins": 1001}, "even num_bins"),
    ({"method": "percentile", "num_bins": 10 ** 12}, "num_bins must be at most 1048576"),
    ({"chunk": 0}, "chunk must be a positive integer"),
])
def test_collect_bad_arguments(kw, message):
    args = {"tensors": ["h"], "method": "minmax"}
    args.update(kw)
    with pytest.raises(InputError) as e:
        R.collect_ranges(mlp(), data=feeds_list(2), progress=False, **args)
    assert message in str(e.value)


def test_integer_tensor_refused():
    m = make_model("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,4] x) => (int64[2] s) {
  s = Shape(x)
}
""")
    with pytest.raises(InputError, match="is int64; only float"):
        R.collect_ranges(m, ["s"], feeds_list(2), progress=False)


def test_collect_from_folder(tmp_path):
    m = mlp()
    feeds = feeds_list(3)
    for i, f in enumerate(feeds):
        np.save(tmp_path / f"{i}.npy", f["x"])
    assert (R.collect_ranges(m, ["r"], str(tmp_path), progress=False)
            == R.collect_ranges(m, ["r"], feeds, progress=False))


# --------------------------------------------------------------------------- memory

BIG = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,8,96,96] x) => (float[N,16,96,96] y) {
  a = Conv<pads=[1,1,1,1]>(x, w1)
  r = Relu(a)
  y = Conv<pads=[1,1,1,1]>(r, w2)
}
"""


def _traced_peak(fn) -> int:
    """The most bytes Python and numpy held at once while ``fn`` ran, above what they held
    before (onnxruntime's own buffers are not traced: what this sees is ours)."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_calibration_memory_does_not_grow_with_the_samples():
    """Issue 13, goal 7: range collection, per-channel statistics and the GPTQ statistics
    reduce every batch as it comes, so what they hold is the same at 8 and at 32 samples
    (a reducer that kept each sample's values, or a list of them, would hold 4x)."""
    from rewriter.quant.hessian import ConvSpec, conv_hessians

    m = make_model(BIG, {"w1": (16, 8, 3, 3), "w2": (16, 16, 3, 3)})
    rng = np.random.default_rng(5)
    feeds = [{"x": rng.standard_normal((1, 8, 96, 96)).astype(np.float32)} for _ in range(32)]
    specs = [ConvSpec("c1", "x", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, 72),
             ConvSpec("c2", "r", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, 144)]
    runs = {
        "mse": lambda d: R.collect_ranges(m, ["x", "a", "r", "y"], d, method="mse",
                                          progress=False),
        "channels": lambda d: R.channel_stats(m, ["x", "a", "r", "y"], d, progress=False),
        "hessians": lambda d: conv_hessians(m, specs, d, progress=False),
    }
    sample = feeds[0]["x"].nbytes * 2         # one batch of r (16 channels)
    for what, run in runs.items():
        run(feeds[:8])     # first use: imports and onnxruntime's one-off allocations
        few, many = _traced_peak(lambda: run(feeds[:8])), _traced_peak(lambda: run(feeds))
        assert many < 1.25 * few + sample // 4, (what, few, many)


def test_gptq_statistics_hold_the_patches_kept_not_the_whole_im2col():
    """A 3x3 conv's im2col is 9x its input; at most 4096 columns are kept over all batches,
    so building the whole of it per batch (236 MB per 64-channel layer at 320x320) only to
    sample it was most of the statistics' memory and time: 24 MB held here for an input
    of 2.4 MB a batch, 1.4 MB since (the sums and the patches waiting to be added)."""
    from rewriter.quant.hessian import ConvSpec, conv_hessians

    m = make_model(BIG.replace("96,96", "192,192"), {"w1": (16, 8, 3, 3),
                                                     "w2": (16, 16, 3, 3)})
    rng = np.random.default_rng(6)
    feeds = [{"x": rng.standard_normal((1, 8, 192, 192)).astype(np.float32)}
             for _ in range(8)]
    spec = ConvSpec("c2", "r", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, 144)
    conv_hessians(m, [spec], feeds[:1], progress=False)
    peak = _traced_peak(lambda: conv_hessians(m, [spec], feeds, progress=False))
    assert peak < feeds[0]["x"].nbytes * 2, peak     # r: 16 channels, 2.4 MB a batch


def test_a_failure_is_blamed_on_the_original_when_onnxruntime_cannot_load_or_run_it():
    """The planner's onnxruntime error on Silero VAD variants was exit 3 (fuzz, seed
    61412): the original could not be loaded (an If branch onnxruntime refuses), or had
    two nodes of one name, which onnxruntime refuses but the rewrite renames, so the
    sample the original cannot run went unnamed."""
    from onnx import TensorProto as T
    from onnx import helper as h

    from rewriter.core.errors import InputError
    from rewriter.quant.data import load_calibration, sample_the_original_refuses
    g = h.make_graph(
        [h.make_node("Reshape", ["x", "shape"], ["r"], "same"),
         h.make_node("Relu", ["r"], ["y"], "same")],
        "g", [h.make_tensor_value_info("x", T.FLOAT, ["N", 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 2])],
        [onnx.numpy_helper.from_array(np.array([2, 2], np.int64), "shape")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    data = load_calibration([{"x": np.ones((1, 4), np.float32)},
                             {"x": np.ones((2, 4), np.float32)}], m)
    err = sample_the_original_refuses(data, m)
    assert isinstance(err, InputError), err       # named, not None
    assert "cannot run the original model on this sample" in str(err)
    assert "x [2, 4]" in str(err), str(err)
    # onnxruntime cannot load it at all (an op it does not implement): said as such
    bad = h.make_model(h.make_graph(
        [h.make_node("Gradient", ["x"], ["y"], domain="ai.onnx.preview.training",
                     xs=["x"], y="x")],
        "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4])],
        [h.make_tensor_value_info("y", T.FLOAT, [1, 4])]),
        opset_imports=[h.make_opsetid("", 17), h.make_opsetid("ai.onnx.preview.training", 1)])
    err = sample_the_original_refuses(load_calibration([{"x": np.ones((1, 4), np.float32)}],
                                                       bad), bad)
    assert isinstance(err, InputError)
    assert str(err).startswith("onnxruntime cannot load the original model"), str(err)
