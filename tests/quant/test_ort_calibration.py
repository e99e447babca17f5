"""Pins what onnxruntime's private calibration code does for us (quant/ort_calibration.py).

The histograms and the KL search are onnxruntime's, reached through one adapter because
they are not a public API. An onnxruntime release that changes them changes every
percentile/entropy scale this tool writes; these figures (measured with onnxruntime 1.32)
make such a release fail here instead of passing silently. Update them deliberately, with
the calibration benchmark re-run.
"""

import numpy as np
import pytest

from rewriter.quant.ort_calibration import Histograms

X = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)


def test_percentile_histogram_is_of_absolute_values_and_grows_with_the_range():
    h = Histograms("percentile", 2048, 99.99, 128)
    h.add("t", X)
    h.add("t", 2 * X)       # a later batch that reaches twice as far
    hist, edges, lo, hi = h.pop("t")[:4]
    assert hist.sum() == 2 * X.size                      # every value, both batches
    width = edges[1] - edges[0]
    assert edges[0] == 0                                 # |x|: from zero (ours, below)
    assert 0 <= edges[-1] - 2 * np.abs(X).max() <= 2 * width   # bins added whole
    assert len(hist) == 4096                             # bins were added, width kept
    assert (float(lo), float(hi)) == pytest.approx((2 * X.min(), 2 * X.max()), rel=1e-6)
    assert h.pop("t") is None                            # popped: memory freed


@pytest.mark.parametrize("band", [3e-8, 1e-4, 1e-3])
def test_a_tensor_of_nearly_one_magnitude_gets_bins_from_zero(band):
    """onnxruntime spans the first batch from min |x| to max |x|: 1/6 everywhere (a pooled
    softmax) was numpy's 'Too many bins for data range' (exit 3), and a band of 1e-3 then a
    batch reaching 10 grew 18.9 million bins (657 MB)."""
    h = Histograms("percentile", 2048, 99.99, 128)
    a = (1 / 6 + np.random.default_rng(1).uniform(0, band, 1000)).astype(np.float32)
    h.add("t", a)
    h.add("t", np.array([10.0], np.float32))
    hist, edges = h.pop("t")[:2]
    assert hist.sum() >= 1000 and edges[0] == 0 and len(hist) <= 2048 * 61


def test_entropy_histogram_is_signed_and_the_kl_threshold_is_pinned():
    h = Histograms("entropy", 2048, 99.99, 128)
    h.add("t", X)
    hist = h.pop("t")
    assert len(hist[0]) == 2048 and hist[0].sum() == X.size
    assert np.isclose(hist[1][0], -np.abs(X).max()) and np.isclose(hist[1][-1], np.abs(X).max())
    lo, hi = h.entropy_threshold(hist)
    # N(0, 1), 2048 bins, 128 quantized bins: onnxruntime 1.32 clips at about 3.85 sigma.
    assert (lo, hi) == pytest.approx((-3.8539579, 3.8585792), abs=1e-5)


def test_entropy_histogram_merges_a_wider_batch_symmetrically():
    h = Histograms("entropy", 2048, 99.99, 128)
    h.add("u", X)
    h.add("u", 3 * X)
    hist, edges = h.pop("u")[:2]
    assert hist.sum() == 2 * X.size and len(hist) == 6144
    assert np.isclose(edges[0], -edges[-1]) and np.isclose(edges[-1], 3 * np.abs(X).max(),
                                                           rtol=1e-4)


def test_entropy_at_128_bins_is_minmax():
    """docs/calibration.md: with quantize_static's 128 bins the KL search has one candidate,
    and entropy's range is max |x|, minmax's (why num_bins is passed through here)."""
    h = Histograms("entropy", 128, 99.99, 128)
    h.add("t", X)
    lo, hi = h.entropy_threshold(h.pop("t"))
    assert max(abs(lo), abs(hi)) == pytest.approx(float(np.abs(X).max()), rel=1e-6)


def test_refuses_minmax():
    with pytest.raises(ValueError):
        Histograms("minmax", 2048, 99.99, 128)


@pytest.mark.parametrize("factor", [1000.0, 1e30])
@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_a_batch_far_wider_than_the_first_merges_bins_instead_of_adding_millions(method,
                                                                                 factor):
    """Fuzz seed 61302 case 481 (--plan int8, weights made huge by an overwritten byte run):
    a later batch 3.8e5 times wider than the first asked onnxruntime for 770 million bins
    (5.7 GiB): the process was killed. Here 1000x: 2 million bins without the merge. And
    fuzz seed 61713 case 2 (--plan auto, weights of 1e25-1e38): 1e30x, the merge factor
    past every bin there is, and padding to a multiple of it asked numpy for 31 TiB."""
    from rewriter.quant.ort_calibration import MAX_BINS

    h = Histograms(method, 2048, 99.99, 128)
    h.add("t", X)
    h.add("t", factor * X)
    h.add("t", X)
    hist, edges = h.pop("t")[:2]
    assert hist.sum() == 3 * X.size and len(hist) <= MAX_BINS and len(edges) == len(hist) + 1
    far = factor * float(np.abs(X).max())
    assert far <= edges[-1] <= far * 1.01 and np.all(np.diff(edges) > 0)
    assert np.isclose(edges[0], -edges[-1]) if method == "entropy" else edges[0] == 0
