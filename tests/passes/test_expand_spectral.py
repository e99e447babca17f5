"""expand-spectral: DFT and STFT become a MatMul or a Conv against constant cos/sin matrices,
computing what onnxruntime's own kernels compute (up to rounding)."""

import numpy as np
import onnx
import pytest
from conftest import make_model, run_ort

import rewriter
from rewriter.core.registry import default_pipeline

# Two sites with distinct attributes, a symbolic batch; the second reads the first.
DFTS = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[B, 12, 1] x) => (float[B, 7, 2] y, float[B, 12, 2] z) {
    y = DFT <onesided = 1> (x)
    l = Constant <value = int64 {12}> ()
    f = DFT <axis = 1> (x, l)
    z = DFT <inverse = 1> (f)
}"""


def _ops(model):
    return [n.op_type for n in model.graph.node]


def _feeds(model, rng, batch):
    out = {}
    for vi in model.graph.input:
        dims = [batch if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        out[vi.name] = rng.standard_normal(dims).astype(dt)
    return out


def _same(m, out, rng, tol=1e-5):
    """``out`` computes ``m``'s outputs on distinct random data, batches 1 and 3."""
    for batch in (1, 3):
        feeds = _feeds(m, rng, batch)
        ref, got = run_ort(m, feeds), run_ort(out, feeds)
        assert [r.shape for r in ref] == [g.shape for g in got]
        for a, b in zip(ref, got):
            scale = float(np.abs(a).max())
            np.testing.assert_allclose(b, a, rtol=tol, atol=tol * scale)


def _expand(m, verify=True):
    out, rep = rewriter.rewrite(m, ["expand-spectral"], verify=verify)
    return out, rep.passes[0].counts


def test_two_dfts_and_an_inverse_become_matmuls(rng):
    m = make_model(DFTS)
    out, counts = _expand(m)
    assert counts["expanded-DFT"] == 3 and "DFT" not in _ops(out)
    assert _ops(out).count("MatMul") == 3 and "Transpose" not in _ops(out)
    onnx.checker.check_model(out, full_check=True)
    _same(m, out, rng)
    # the round trip gives the signal back: the inverse's 1/N and signs are right
    x = rng.standard_normal((2, 12, 1)).astype(np.float32)
    z = run_ort(out, {"x": x})[1]
    np.testing.assert_allclose(z[..., 0], x[..., 0], atol=1e-5)
    np.testing.assert_allclose(z[..., 1], 0, atol=1e-5)
    assert not _expand(out)[1]   # a second run finds nothing


@pytest.mark.parametrize("opset, shape, attrs, extra, inits", [
    (17, "[B, 3, 10, 2]", "<axis = 2>", "", {}),                      # complex, no Transpose
    (17, "[B, 10, 3, 2]", "<axis = 1, inverse = 1>", "", {}),         # Transposes round it
    (17, "[B, 10, 3, 1]", "<axis = -3, onesided = 1>", "", {}),       # negative axis
    (17, "[B, 9, 2]", "", ", pad", {"pad": np.array(16, np.int64)}),  # zero padded
    (17, "[B, 9, 1]", "<onesided = 1>", ", cut", {"cut": np.array(6, np.int64)}),  # truncated
    (20, "[B, 5, 8, 1]", "<onesided = 1>", ", , ax", {"ax": np.array(1, np.int64)}),
    (20, "[B, 5, 8, 2]", "<inverse = 1>", ", pad, ax", {"pad": np.array(11, np.int64),
                                                         "ax": np.array(-2, np.int64)}),
    (20, "[B, 6, 8, 2]", "", "", {}),                                 # axis -2 by default
    (20, "[7, 4, 1]", "", ", , ax", {"ax": np.array(0, np.int64)}),   # the first axis
    # onesided inverses (complex to real): n bins, 2 * (n - 1) samples unless given
    (17, "[B, 6, 10, 2]", "<axis = 1, inverse = 1, onesided = 1>", "", {}),
    (20, "[B, 5, 3, 2]", "<inverse = 1, onesided = 1>", ", l, ax",
     {"l": np.array(8, np.int64), "ax": np.array(1, np.int64)}),
    (17, "[B, 3, 6, 2]", "<axis = 2, inverse = 1, onesided = 1>", ", l",  # odd length
     {"l": np.array(11, np.int64)}),
])
def test_dft_forms_compute_the_same(opset, shape, attrs, extra, inits, rng):
    m = make_model(f"""
    <ir_version: 10, opset_import: ["" : {opset}]>
    g (float{shape} x) => (float y) {{
        y = DFT {attrs} (x{extra})
    }}""", inits)
    out, counts = _expand(m)
    assert counts["expanded-DFT"] == 1 and "DFT" not in _ops(out)
    _same(m, out, rng)


def test_a_long_odd_length_is_numpys_fft_to_float_rounding(rng):
    """A 1000-point rfft: onnxruntime's own sum (no FFT for this length) is 2.7e-4 off
    numpy's float64 FFT, beyond --verify's 1e-4; the rewrite must stay at float rounding."""
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[B, 1000, 1] x) => (float[B, 501, 2] y) { y = DFT <onesided = 1> (x) }""")
    out, counts = _expand(m, verify=False)
    assert counts["expanded-DFT"] == 1
    x = rng.standard_normal((2, 1000, 1)).astype(np.float32)
    ref = np.fft.rfft(x[..., 0].astype(np.float64), axis=1)
    got = run_ort(out, {"x": x})[0]
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(got[..., 0], ref.real, atol=2e-6 * scale)
    np.testing.assert_allclose(got[..., 1], ref.imag, atol=2e-6 * scale)


# Whisper's front-end: a 400-point Hann STFT, hop 160, then log power: onnxruntime's
# float32 kernel sums without an FFT at 400 points.
WHISPER = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[B, 3200] x) => (float[B, 18, 201] p) {
    hop = Constant <value = int64 {160}> ()
    s = STFT <onesided = 1> (x, hop, w)
    two = Constant <value = float {2.0}> ()
    q = Pow (s, two)
    r = ReduceSum <keepdims = 0> (q, axes)
    e = Constant <value = float {1e-10}> ()
    t = Add (r, e)
    p = Log (t)
}"""


def _whisper():
    return make_model(WHISPER, {"w": np.hanning(401)[:-1].astype(np.float32),
                                "axes": np.array([-1], np.int64)})


def test_verify_judges_a_long_stft_by_the_exact_transform(monkeypatch):
    """onnxruntime's float32 STFT is off the exact transform by more than the FP32
    tolerance at 400 points (Whisper's, onnx-asr's trained whisper128 and GigaAM front-ends
    failed --verify with exit 1); the verifier runs DFT/STFT in float64 in the original and
    every candidate, so the rewrite, which is closer to the exact transform, passes."""
    from rewriter.verify import verifier

    m = _whisper()
    out, rep = rewriter.rewrite(m, ["expand-spectral"], verify=True)
    assert "STFT" not in _ops(out) and rep.verified
    assert rep.verified_with.endswith("DFT/STFT in float64"), rep.verified_with
    # Without it, onnxruntime's float32 kernel is the reference and the rewrite fails.
    monkeypatch.setattr(verifier, "spectral_in_double", lambda model: model)
    with pytest.raises(rewriter.VerificationError, match="drift beyond tolerance"):
        rewriter.rewrite(m, ["expand-spectral"], verify=True)


def test_the_float64_reference_is_the_exact_transform_and_still_catches_a_wrong_rewrite(rng):
    from rewriter.core.convert import Exported
    from rewriter.core.pass_base import Numerics
    from rewriter.verify.verifier import Verifier, spectral_in_double

    m = _whisper()
    x = rng.standard_normal((2, 3200)).astype(np.float32)
    frames = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), 400, axis=1)
    exact = np.log(np.abs(np.fft.rfft(frames[:, ::160] * np.hanning(401)[:-1], axis=-1)) ** 2
                   + 1e-10)
    wide, = run_ort(spectral_in_double(m), {"x": x})
    plain, = run_ort(m, {"x": x})
    assert "STFT" in _ops(m)   # the caller's model is not changed
    scale = float(np.abs(exact).max())
    assert np.abs(wide - exact).max() <= 1e-6 * scale
    assert np.abs(plain - exact).max() > 1e-4 * scale   # why it is needed
    out, _ = _expand(m, verify=False)
    v = Verifier(m, None, {"x": x})
    assert v.check(Exported(out, {}, None), Numerics.CLOSE)[0].ok
    # one cos/sin coefficient in a thousand off by 1e-3: judged against the exact reference
    k = next(t for t in out.graph.initializer if t.name not in ("w", "axes")
             and len(t.dims) == 3)
    vals = onnx.numpy_helper.to_array(k).copy()
    vals.flat[rng.choice(vals.size, vals.size // 1000, replace=False)] *= 1.001
    k.CopyFrom(onnx.numpy_helper.from_array(vals, k.name))
    assert not v.check(Exported(out, {}, None), Numerics.CLOSE)[0].ok


def test_a_double_dft_stays_double(rng):
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (double[B, 16, 2] x) => (double y) { y = DFT <inverse = 1> (x) }""")
    out, counts = _expand(m)
    assert counts["expanded-DFT"] == 1
    _same(m, out, rng, tol=1e-12)


# Two STFT sites: a real [B, len] signal (torch's form) with a Hann window and hop 4, and a
# complex one without window, frame_length 8, both sides.
STFTS = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[B, 64] x, float[B, 40, 2] c) => (float[B, 13, 9, 2] y, float[B, 6, 8, 2] z) {
    hop = Constant <value = int64 {4}> ()
    y = STFT (x, hop, w)
    z = STFT <onesided = 0> (c, six, , eight)
}"""


def test_two_stfts_become_convs(rng):
    m = make_model(STFTS, {"w": np.hanning(18)[1:-1].astype(np.float32),
                           "six": np.array(6, np.int64), "eight": np.array(8, np.int64)})
    out, counts = _expand(m)
    assert counts["expanded-STFT"] == 2 and "STFT" not in _ops(out)
    assert _ops(out).count("Conv") == 2 and "Mul" not in _ops(out)   # the window folded in
    onnx.checker.check_model(out, full_check=True)
    _same(m, out, rng)


@pytest.mark.parametrize("shape, attrs, args, inits", [
    ("[B, 50, 1]", "<onesided = 0>", "x, st, w", {"w": [12], "st": np.array(5, np.int64)}),
    ("[B, 50, 2]", "", "x, st, w, fl", {"w": [16], "st": np.array(3, np.int64),
                                        "fl": np.array(16, np.int64)}),
    ("[B, T, 1]", "", "x, st, , fl", {"st": np.array(2, np.int32),
                                      "fl": np.array(7, np.int32)}),   # odd, int32
])
def test_stft_forms_compute_the_same(shape, attrs, args, inits, rng):
    m = make_model(f"""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float{shape} x) => (float y) {{
        y = STFT {attrs} ({args})
    }}""", inits)
    out, counts = _expand(m)
    assert counts["expanded-STFT"] == 1 and "STFT" not in _ops(out)
    if "T" in shape:   # a symbolic signal length: the Conv counts the frames
        for n in (20, 33):
            x = rng.standard_normal((2, n, 1)).astype(np.float32)
            np.testing.assert_allclose(run_ort(out, {"x": x})[0], run_ort(m, {"x": x})[0],
                                       rtol=1e-5, atol=1e-5)
    else:
        _same(m, out, rng)


def test_a_computed_window_is_multiplied_in(rng):
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[B, 40, 1] x, float[10] w) => (float y) {
        y = STFT (x, st, w)
    }""", {"st": np.array(3, np.int64)})
    out, counts = _expand(m)
    assert counts["expanded-STFT"] == 1 and "Mul" in _ops(out)
    _same(m, out, rng)


# -- skips: each reason, on a model that would be rewritten (or crash) without it ----------

SKIPS = [
    ("non-constant-dft-length", "17", "float[B, 8, 1] x, int64 l", "y = DFT (x, l)", {}),
    ("non-constant-axis", "20", "float[B, 8, 1] x, int64 a", "y = DFT (x, , a)", {}),
    ("unknown-length", "17", "float[B, T, 1] x", "y = DFT (x)", {}),
    ("unknown-shape", "17", "float[B, 8, C] x", "y = DFT (x)", {}),
    ("half-type", "17", "float16[B, 8, 1] x", "y = DFT (x)", {}),
    ("matrix-too-large", "17", "float[1, 4096, 2] x", "y = DFT (x)", {}),
    # 6 bins are a spectrum of 10 or 11 samples, not 9 (nor 14): onnxruntime's output is
    # then not numpy's irfft
    ("irfft-length", "17", "float[B, 6, 2] x", "y = DFT <inverse = 1, onesided = 1> (x, l)",
     {"l": np.array(9, np.int64)}),
    ("irfft-length", "17", "float[B, 6, 2] x", "y = DFT <inverse = 1, onesided = 1> (x, l)",
     {"l": np.array(14, np.int64)}),
    ("non-constant-frame-step", "17", "float[B, 40, 1] x, int64 s", "y = STFT (x, s, w)",
     {"w": [8]}),
    ("non-constant-frame-length", "17", "float[B, 40, 1] x, int64 n", "y = STFT (x, s, , n)",
     {"s": np.array(2, np.int64)}),
    # a computed window of unknown length: with frame_length given, the frame length is
    # known and it is the window's that is not (a 1-sample window would broadcast in the
    # Mul, where onnxruntime refuses it); without, neither gives the frame length
    ("unknown-window-length", "17", "float[B, 40, 1] x, float[W] w", "y = STFT (x, s, w, n)",
     {"s": np.array(2, np.int64), "n": np.array(8, np.int64)}),
    ("unknown-frame-length", "17", "float[B, 40, 1] x, float[W] w", "y = STFT (x, s, w)",
     {"s": np.array(2, np.int64)}),
    ("unknown-shape", "17", "float[B, 40, C] x", "y = STFT (x, s, w)",
     {"s": np.array(2, np.int64), "w": [8]}),
    # onnxruntime has no double Conv: the rewrite would not run there
    ("double-stft", "17", "double[B, 40, 1] x", "y = STFT (x, s, w)",
     {"s": np.array(4, np.int64), "w": np.hanning(10)}),
    # 2 * 2049 bins * 4096 taps * 4 bytes: just over 64 MiB
    ("matrix-too-large", "17", "float[1, 4096, 1] x", "y = STFT (x, s, , n)",
     {"s": np.array(1, np.int64), "n": np.array(4096, np.int64)}),
]


@pytest.mark.parametrize("reason, opset, inputs, body, inits", SKIPS,
                         ids=[f"{s[0]}-{s[3].split()[2]}-{i}" for i, s in enumerate(SKIPS)])
def test_each_skip_reason_leaves_the_node(reason, opset, inputs, body, inits):
    m = make_model(f"""
    <ir_version: 10, opset_import: ["" : {opset}]>
    g ({inputs}) => ({inputs.split()[0].split("[")[0]} y) {{ {body} }}""", inits)
    op = body.split("=")[1].split()[0]
    out, counts = _expand(m, verify=False)   # nothing changed: nothing to verify
    assert counts == {f"skip:{reason}": 1} and _ops(out) == [op]


@pytest.mark.parametrize("reason, inputs, body", [
    ("invalid-axis", "float[B, 8, 1] x", "y = DFT <axis = 2> (x)"),
    ("not-real-or-complex", "float[B, 8, 3] x", "y = DFT (x)"),
    ("onesided-complex", "float[B, 8, 2] x", "y = DFT <onesided = 1> (x)"),
    ("onesided-inverse", "float[B, 8, 1] x", "y = DFT <onesided = 1, inverse = 1> (x)"),
    ("invalid-dft-length", "float[B, 8, 1] x", "y = DFT (x, zero)"),
    ("invalid-frame", "float[B, 40, 1] x", "y = STFT (x, zero, w)"),
    ("window-length", "float[B, 40, 1] x", "y = STFT (x, two, w, six)"),
    ("unknown-type", "float[B, 40, 1] x", "u = Custom (x)\n y = DFT (u)"),
    ("unknown-type", "int32[B, 8, 1] x", "y = DFT (x)"),
    ("unknown-type", "float[B, 40, 1] x", "y = STFT (x, two, wd)"),
    ("unknown-shape", "float[B, 40, 1, 1] x", "y = STFT (x, two, w)"),
    ("not-real-or-complex", "float[B, 40, 3] x", "y = STFT (x, two, w)"),
    ("unknown-frame-length", "float[B, 40, 1] x", "y = STFT (x, two)"),
])
def test_models_onnxruntime_refuses_are_left(reason, inputs, body):
    """Attributes onnx or onnxruntime refuse (and a type nothing knows): left as they are,
    the pass run directly on the graph (the model does not load through rewrite)."""
    import onnx_graphsurgeon as gs

    from rewriter.core.graph import Namer
    from rewriter.core.pass_base import Context
    from rewriter.passes.expand_spectral import ExpandSpectral
    m = make_model(f"""
    <ir_version: 10, opset_import: ["" : 17, "x" : 1]>
    g ({inputs}) => (float y) {{ {body} }}""".replace("Custom", "x.Custom"),
                   {"zero": np.array(0, np.int64), "two": np.array(2, np.int64),
                    "six": np.array(6, np.int64), "w": [8],
                    "wd": np.hanning(8)})
    g = gs.import_onnx(m)
    res = ExpandSpectral().run(g, Context(namer=Namer(g)))
    assert dict(res.counts) == {f"skip:{reason}": 1} and not res.changed


def test_in_the_default_pipeline_for_migraphx_only(rng):
    assert "expand-spectral" in default_pipeline("migraphx")
    assert "expand-spectral" not in default_pipeline(None)
    m = make_model(DFTS)
    out, _ = rewriter.rewrite(m, target="migraphx", verify=True)
    assert "DFT" not in _ops(out)
    _same(m, out, rng)
    out, _ = rewriter.rewrite(m)
    assert "DFT" in _ops(out)


def test_the_profile_says_migraphx_does_not_parse_them_and_the_check_names_the_pass():
    """The packaged profile lists DFT and STFT as not parsed (measured on 2.15 and 2.16),
    and the static check's finding names this pass."""
    import json

    from rewriter.migraphx.check import PROFILE_PATH, check_model
    profile = json.loads(PROFILE_PATH.read_text())
    assert {"DFT", "STFT"} <= set(profile["onnx_standard_ops_not_parsed"]["ops"])
    assert not {"DFT", "STFT"} & set(profile["onnx_ops"])
    m = make_model(STFTS, {"w": [16], "six": np.array(6, np.int64),
                           "eight": np.array(8, np.int64)})
    findings = [f for f in check_model(m).findings if f.code == "unsupported-op"]
    assert len(findings) == 2 and all("expand-spectral" in f.message for f in findings)


def test_the_check_says_when_the_pass_left_a_node_it_names():
    """A DFT whose dft_length is a graph input stays (skip:non-constant-dft-length); the
    check's unsupported-op hint says expand-spectral writes DFTs out, and now also that
    here it ran and left this one, and why."""
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[2, 64, 1] x, int64 l) => (float[2, N, 2] y) { y = DFT (x, l) }""")
    _, rep = rewriter.rewrite(m, target="migraphx")
    line = next(w for w in rep.warnings if "unsupported-op" in w)
    assert "the pass expand-spectral" in line
    assert line.endswith("[expand-spectral ran and left it (skip:non-constant-dft-length 1)]")
