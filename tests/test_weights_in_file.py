"""Big inline weights left in the input file (load_model(weights_in_file=True)).

The loader scans the protobuf wire format and parses everything but the raw data of big
top-level initializers, which become external data at their own bytes in the model file.
What must hold: the same model as a full parse (the stripped tensors' bytes are exactly
their raw data), the same output file byte for byte, an inline output and an inline
materialized ModelProto, and a fall back to the full parse for whatever is unusual.
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewriter
from rewriter.core import load as load_mod
from rewriter.core import ort
from rewriter.core.errors import InputError


def _model(seed: int = 0, big_channels: int = 128) -> onnx.ModelProto:
    """Conv+BN+Relu, then Conv+BN twice on one shared big weight (fusion gives all three
    new weights), a Reshape whose shape is an initializer, a Gemm whose big weight no pass
    touches (written back from the input file), one with a big weight in float_data (a
    typed field: never stripped) and small inline tensors."""
    r = np.random.default_rng(seed)
    c = big_channels
    w1 = r.standard_normal((c, 3, 7, 7)).astype(np.float32) * 0.1   # 75 KB
    w2 = r.standard_normal((c, c, 3, 3)).astype(np.float32) * 0.05   # 590 KB

    def bn(p):
        return [numpy_helper.from_array(a.astype(np.float32), f"{p}_{k}") for k, a in (
            ("s", r.uniform(0.5, 1.5, c)), ("b", r.standard_normal(c) * 0.1),
            ("m", r.standard_normal(c) * 0.1), ("v", r.uniform(0.5, 2.0, c)))]

    g = r.standard_normal((c, 160)).astype(np.float32) * 0.1   # 82 KB, no pass touches it
    gemm_w = numpy_helper.from_array(g, "G")
    typed = helper.make_tensor("T", TensorProto.FLOAT, g.shape, g.ravel().tolist())
    inits = [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
             *bn("bn1"), *bn("bn2"), *bn("bn3"), gemm_w,
             numpy_helper.from_array(np.array([0, -1], np.int64), "shape"),
             numpy_helper.from_array(r.standard_normal(160).astype(np.float32), "GB"), typed]
    inits[1].doc_string = "a doc string beside the raw data"
    nodes = [
        helper.make_node("Conv", ["x", "W1"], ["c1"], pads=[3, 3, 3, 3]),
        helper.make_node("BatchNormalization", ["c1", "bn1_s", "bn1_b", "bn1_m", "bn1_v"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["r1"]),
        helper.make_node("Conv", ["r1", "W2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "bn2_s", "bn2_b", "bn2_m", "bn2_v"], ["b2"]),
        helper.make_node("Relu", ["b2"], ["r2"]),
        helper.make_node("Conv", ["r2", "W2"], ["c3"], pads=[1, 1, 1, 1]),   # shared weight
        helper.make_node("BatchNormalization", ["c3", "bn3_s", "bn3_b", "bn3_m", "bn3_v"], ["b3"]),
        helper.make_node("GlobalAveragePool", ["b3"], ["p"]),
        helper.make_node("Reshape", ["p", "shape"], ["f"]),
        helper.make_node("Gemm", ["f", "G", "GB"], ["y0"]),
        helper.make_node("Gemm", ["f", "T"], ["y1"]),
        helper.make_node("Add", ["y0", "y1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 160])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.fixture
def leave_all(monkeypatch):
    """Every file is big enough for the scan."""
    monkeypatch.setattr(load_mod, "LEAVE_MIN_FILE", 0)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _feeds(seed=1):
    return {"x": np.random.default_rng(seed).standard_normal((2, 3, 8, 8)).astype(np.float32)}


def test_scan_matches_a_full_parse(tmp_path, leave_all):
    p = tmp_path / "m.onnx"
    onnx.save(_model(), p)
    full = onnx.load(p)
    left = load_mod.load_model(p, weights_in_file=True)
    data = p.read_bytes()
    stripped = {t.name for t in left.graph.initializer
                if t.data_location == TensorProto.EXTERNAL}
    # big raw-data tensors only: not the typed-field Gemm weight, not the small ones
    assert stripped == {"W1", "W2", "G"}
    for a, b in zip(full.graph.initializer, left.graph.initializer):
        if b.name in stripped:
            info = {e.key: e.value for e in b.external_data}
            assert info["location"] == "m.onnx"
            off, n = int(info["offset"]), int(info["length"])
            assert data[off:off + n] == a.raw_data
            b = onnx.TensorProto.FromString(b.SerializeToString())
            b.ClearField("external_data")
            b.ClearField("data_location")
            b.raw_data = a.raw_data
        assert a == b
    a, b = onnx.ModelProto(), onnx.ModelProto()
    a.CopyFrom(full)
    b.CopyFrom(left)
    a.graph.ClearField("initializer")
    b.graph.ClearField("initializer")
    assert a == b


def test_output_identical_inline_and_input_untouched(tmp_path, monkeypatch):
    p = tmp_path / "m.onnx"
    onnx.save(_model(), p)
    before = _sha(p)
    plain, _ = rewriter.rewrite(p, output=tmp_path / "plain.onnx")
    monkeypatch.setattr(load_mod, "LEAVE_MIN_FILE", 0)
    left, rep = rewriter.rewrite(p, output=tmp_path / "left.onnx", verify=True)
    assert load_mod.is_inline_source(os.path.realpath(p))
    assert (tmp_path / "left.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()
    assert not (tmp_path / "left.onnx.data").exists()
    assert left == plain   # the materialized ModelProto: every weight inline
    assert all(t.data_location != TensorProto.EXTERNAL for t in left.graph.initializer)
    assert rep.ops_after.get("BatchNormalization", 0) == 0
    assert _sha(p) == before
    ref = ort.run(ort.session(str(p)), _feeds())
    got = ort.run(ort.session(str(tmp_path / "left.onnx")), _feeds())
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-4, atol=1e-5)


def test_not_materialized_model_has_stubs_not_references_into_the_input(tmp_path, leave_all):
    p = tmp_path / "m.onnx"
    onnx.save(_model(), p)
    out, _ = rewriter.rewrite(p, materialize=False)
    for t in out.graph.initializer:
        for e in t.external_data:
            assert e.value != "m.onnx"


@pytest.mark.parametrize("name", ["a:b.onnx", "sp ace.onnx"])
def test_unusual_file_names(tmp_path, leave_all, name):
    p = tmp_path / name
    onnx.save(_model(), p)
    out, _ = rewriter.rewrite(p, output=tmp_path / "o.onnx", verify=True)
    assert all(t.data_location != TensorProto.EXTERNAL for t in out.graph.initializer)


def test_symlinked_input_from_another_folder(tmp_path, leave_all):
    real = tmp_path / "real"
    real.mkdir()
    onnx.save(_model(), real / "m.onnx")
    (tmp_path / "link").mkdir()
    link = tmp_path / "link" / "l.onnx"
    link.symlink_to(real / "m.onnx")
    m = load_mod.load_model(link, weights_in_file=True)
    # "l.onnx" resolves outside link/: the full parse is taken, nothing is external
    assert all(t.data_location != TensorProto.EXTERNAL for t in m.graph.initializer)
    out, _ = rewriter.rewrite(link, output=tmp_path / "o.onnx", verify=True)
    assert rewriter.rewrite(real / "m.onnx")[0] == out


def test_wrong_raw_data_size_reported_as_without_the_scan(tmp_path, monkeypatch):
    m = _model()
    w = m.graph.initializer[1]
    w.raw_data = w.raw_data[:-4]
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    assert "bytes of data" in _same_error_with_the_scan(p, monkeypatch)


def test_graph_field_twice_is_merged_as_protobuf_does(tmp_path, leave_all):
    """Two graph fields in one file: protobuf merges them; the scan steps aside."""
    m = _model()
    extra = onnx.ModelProto()
    extra.graph.doc_string = "second graph field"
    p = tmp_path / "m.onnx"
    p.write_bytes(m.SerializeToString() + extra.SerializeToString())
    got = load_mod.load_model(p, weights_in_file=True)
    assert got.graph.doc_string == "second graph field"
    assert all(t.data_location != TensorProto.EXTERNAL for t in got.graph.initializer)
    assert len(got.graph.node) == len(m.graph.node)


def test_truncated_file_reported_as_without_the_scan(tmp_path, monkeypatch):
    p = tmp_path / "m.onnx"
    data = _model().SerializeToString()
    p.write_bytes(data[: len(data) // 2])
    assert "not a readable ONNX model" in _same_error_with_the_scan(p, monkeypatch)


def _same_error_with_the_scan(p: Path, monkeypatch) -> str:
    """The InputError loading ``p`` gives without the scan, and that it is the same with it."""
    with pytest.raises(InputError) as plain:
        load_mod.load_model(p, weights_in_file=True)
    monkeypatch.setattr(load_mod, "LEAVE_MIN_FILE", 0)
    with pytest.raises(InputError) as left:
        load_mod.load_model(p, weights_in_file=True)
    assert str(left.value) == str(plain.value)
    return str(left.value)


def test_external_data_input_keeps_its_data_file(tmp_path, leave_all):
    """A model whose weights are external already: nothing to strip; the Gemm weight no
    pass touches stays in a data file beside the output."""
    folder = tmp_path / "ext"
    folder.mkdir()
    m = _model()
    onnx.save_model(m, folder / "m.onnx", save_as_external_data=True,
                    all_tensors_to_one_file=True, location="m.onnx.data", size_threshold=1024)
    rewriter.rewrite(folder / "m.onnx", output=tmp_path / "o.onnx")
    assert (tmp_path / "o.onnx.data").exists()


def test_every_strip_rule():
    """_strip_raw_data on hand-made tensors: only big, raw-data-only, top-level, once."""
    big = np.arange(20000, dtype=np.float32)
    plain = numpy_helper.from_array(big, "plain")
    typed = helper.make_tensor("typed", TensorProto.FLOAT, big.shape, big.tolist())
    small = numpy_helper.from_array(big[:10], "small")
    ext = numpy_helper.from_array(big, "ext")
    ext.data_location = TensorProto.EXTERNAL   # odd but possible: kept as it is
    seg = numpy_helper.from_array(big, "seg")
    seg.segment.begin = 0
    body = helper.make_graph([helper.make_node("Identity", ["inner"], ["o"])], "b", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
                             [numpy_helper.from_array(big, "inner")])
    node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [plain, typed, small, ext, seg])
    data = helper.make_model(g).SerializeToString()
    stripped, refs = load_mod._strip_raw_data(memoryview(data), 64 << 10)
    assert [k for k, _, _ in refs] == [0]
    k, off, n = refs[0]
    assert data[off:off + n] == big.tobytes()
    m = onnx.ModelProto.FromString(stripped)
    assert not m.graph.initializer[0].HasField("raw_data")
    assert [t.name for t in m.graph.initializer] == ["plain", "typed", "small", "ext", "seg"]
    assert m.graph.node[0].attribute[0].g.initializer[0].raw_data == big.tobytes()


@pytest.mark.parametrize("after", [0, 1])
def test_writer_falls_back_to_read_and_write(tmp_path, monkeypatch, after):
    """copy_file_range refused (EXDEV, ENOSYS ...) at once, or after a partial copy: the
    rest is read and written, and the file is the same."""
    p = tmp_path / "m.onnx"
    onnx.save(_model(), p)
    rewriter.rewrite(p, output=tmp_path / "plain.onnx")
    monkeypatch.setattr(load_mod, "LEAVE_MIN_FILE", 0)
    real, calls = os.copy_file_range, []

    def flaky(src, dst, count, offset_src=None, *a):
        calls.append(count)
        if len(calls) > after:
            raise OSError(18, "Invalid cross-device link")
        return real(src, dst, min(count, 1000), offset_src, *a)

    monkeypatch.setattr(os, "copy_file_range", flaky)
    rewriter.rewrite(p, output=tmp_path / "left.onnx")
    assert calls
    assert (tmp_path / "left.onnx").read_bytes() == (tmp_path / "plain.onnx").read_bytes()


def test_a_view_of_the_file_kept_alive_elsewhere_does_not_fail_the_load(tmp_path, leave_all,
                                                                          monkeypatch):
    """A view into the memory map still alive when the load ends (a profiler sampling the
    scan's frame kept its slices: "not a readable ONNX model (BufferError: cannot close
    exported pointers exist)" for a valid model). The model loads; the map closes later."""
    p = tmp_path / "m.onnx"
    onnx.save(_model(), p)
    kept = []
    scan = load_mod._weights_left_in_file

    def keeping(buf, path):
        kept.append(buf[:16])
        return scan(buf, path)

    monkeypatch.setattr(load_mod, "_weights_left_in_file", keeping)
    m = load_mod.load_model(p, weights_in_file=True)
    assert len(m.graph.initializer) == len(_model().graph.initializer)
    assert bytes(kept[0]) == p.read_bytes()[:16]


def _maps_of(p: Path) -> int:
    real = os.path.realpath(p)
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(real))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
@pytest.mark.parametrize("map_min", [0, 1 << 20])
def test_weights_read_again_and_again_share_one_map_of_the_file(tmp_path, leave_all,
                                                                 monkeypatch, map_min):
    """Each read of a weight mapped the file anew: the planner (~50 models built and judged)
    held 960 maps of a 69 MB MiniLM, RSS 5 GB, until the garbage collector freed the graphs.
    Every read of a weight shares one map (one copy, for a small one) while any array from
    it lives; the values are the file's; a file rewritten in place is read anew."""
    monkeypatch.setattr(load_mod, "MAP_MIN_BYTES", map_min)
    p = tmp_path / "m.onnx"
    full = _model(seed=3)
    onnx.save(full, p)
    left = load_mod.load_model(p, weights_in_file=True)
    want = {t.name: numpy_helper.to_array(t) for t in full.graph.initializer}
    held = []
    for _ in range(20):
        for t in left.graph.initializer:
            if t.data_location == TensorProto.EXTERNAL:
                v = load_mod.ExternalValues(t, *load_mod.resolve_external(t, tmp_path)).load()
                np.testing.assert_array_equal(v, want[t.name])
                held.append(v)
    assert len(held) == 60 and _maps_of(p) == (3 if map_min == 0 else 0)
    assert len({id(v.base) for v in held}) == 3   # one map or copy per weight, not per read
    del held, v
    other = _model(seed=4)
    onnx.save(other, p)
    left = load_mod.load_model(p, weights_in_file=True)
    t = next(t for t in left.graph.initializer if t.name == "W2")
    v = load_mod.ExternalValues(t, *load_mod.resolve_external(t, tmp_path)).load()
    np.testing.assert_array_equal(v, numpy_helper.to_array(other.graph.initializer[1]))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_a_weights_map_goes_with_its_last_array(tmp_path, leave_all, monkeypatch):
    """One map of the whole file, kept while any weight of it lived, kept every page ever read
    mapped: the 2.3 GB model's FP32 rewrite peaked at 4.5 GB RSS, its fused weights and all
    of the original's, where a fused weight's original should go once it is replaced. A
    weight's map is its own region and goes with its last array."""
    monkeypatch.setattr(load_mod, "MAP_MIN_BYTES", 0)
    p = tmp_path / "m.onnx"
    onnx.save(_model(seed=5), p)
    left = load_mod.load_model(p, weights_in_file=True)
    ext = {t.name: t for t in left.graph.initializer if t.data_location == TensorProto.EXTERNAL}

    def read(name):
        t = ext[name]
        return load_mod.ExternalValues(t, *load_mod.resolve_external(t, tmp_path)).load()

    w1, w2 = read("W1"), read("W2")
    assert _maps_of(p) == 2
    del w2
    assert _maps_of(p) == 1
    real = os.path.realpath(p)
    with open("/proc/self/maps") as f:
        spans = [line.split()[0].split("-") for line in f if line.rstrip().endswith(real)]
    mapped = sum(int(b, 16) - int(a, 16) for a, b in spans)
    assert mapped < w1.nbytes + 2 * mmap.PAGESIZE < p.stat().st_size
    del w1
    assert _maps_of(p) == 0


def test_the_planner_leaves_a_big_files_weights_in_it(tmp_path, leave_all):
    """`rewrite plan` parsed every inline weight (rewrite() leaves them in the file): 1.11 GB
    peak RSS on a 69 MB MiniLM against 0.54 GB, for the same plan."""
    from rewriter.quant import planner
    p = tmp_path / "m.onnx"
    onnx.save(_model(seed=6), p)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(8):
        np.save(calib / f"{i}.npy", _feeds(i)["x"])
    _, original, _, _ = planner._prepare(p, calib, None, planner._settings(None), None, False)
    left = {t.name for t in original.graph.initializer
            if t.data_location == TensorProto.EXTERNAL}
    assert left == {"W1", "W2", "G"}
