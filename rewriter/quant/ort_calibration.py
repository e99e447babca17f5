"""The one door to onnxruntime's calibration internals.

Range collection uses onnxruntime's histogram code (``HistogramCollector`` in
``onnxruntime.quantization.calibrate``) rather than a copy of it: the same histograms and
the same KL threshold search that ``quantize_static`` uses. Those are not a public API, so
everything that touches them is here, and tests/quant/test_ort_calibration.py pins what
they do (bin edges, merging across batches, the entropy threshold of a known
distribution), so an onnxruntime release that changes them fails a test instead of
silently moving every calibrated scale.

Used as-is: ``collect_absolute_value`` / ``collect_value`` (what the public ``collect()``
dispatches to; it prints on every call), ``histogram_dict`` (name -> (hist, edges, min,
max[, threshold])), ``get_entropy_threshold(histogram, num_quantized_bins)``.
"""

from __future__ import annotations

import numpy as np

# Bins a histogram may grow to: onnxruntime adds bins of the first batch's width until a
# wider batch fits, 770 million (5.7 GiB) for a resnet whose weights an overwritten byte
# run made huge (fuzz seed 61302 case 481, killed); past this the old bins merge k by k.
MAX_BINS = 1 << 17


class Histograms:
    """Per-tensor histograms of |x| (``percentile``) or of signed x (``entropy``)."""

    def __init__(self, method: str, num_bins: int, percentile: float,
                 num_quantized_bins: int):
        from onnxruntime.quantization.calibrate import HistogramCollector

        if method not in ("percentile", "entropy"):
            raise ValueError(f"no histogram for method {method!r}")
        self.method, self.num_quantized_bins = method, num_quantized_bins
        self._c = HistogramCollector(method=method, symmetric=True, num_bins=num_bins,
                                     num_quantized_bins=num_quantized_bins,
                                     percentile=percentile, scenario="same")

    def add(self, name: str, values: np.ndarray) -> None:
        """Fold float32 ``values`` (finite, non-empty) into ``name``'s histogram."""
        amax = float(np.max(np.abs(values)))
        self._coarsen(name, amax)
        if self.method == "percentile":
            if name not in self._c.histogram_dict and amax > 0:
                # the first batch's bins span [0, max |x|] here, where onnxruntime's span
                # [min |x|, max |x|]: a tensor of nearly one magnitude (1/6 everywhere, a
                # pooled softmax) had no room for 2048 float32 bins (ValueError, exit 3),
                # or bins so narrow that a later, wider batch added millions of them
                hist, edges = np.histogram(np.abs(values), bins=self._c.num_bins,
                                           range=(0.0, amax))
                self._c.histogram_dict[name] = (hist, edges.astype(values.dtype),
                                                np.min(values), np.max(values))
            else:
                self._c.collect_absolute_value({name: values})
        else:
            self._c.collect_value({name: values})

    def _coarsen(self, name: str, amax: float) -> None:
        """Merge ``name``'s bins k by k where a batch reaching ``amax`` would need more than
        MAX_BINS of their width: the edges keep their start (0 or min |x| for |x|, the
        symmetric threshold, padded with empty bins to a multiple of k, for signed x)."""
        old = self._c.histogram_dict.get(name)
        if old is None:
            return
        hist, edges = old[0], old[1]
        width = float(edges[1]) - float(edges[0])
        signed = self.method == "entropy"
        need = (2 * amax if signed else amax - float(edges[0])) / width if width > 0 else 0
        if not need > MAX_BINS:
            return
        # To half the cap: room for later batches. k may pass every bin there is (a batch
        # 1e30 times wider: fuzz seed 61713 case 2 asked numpy for 31 TiB of padding), and
        # then each side of the start merges into one bin, without padding.
        k = int(np.ceil(2 * need / MAX_BINS))
        if signed:
            half = len(hist) // 2
            p = (-half) % k
            if k >= half:
                hist = np.array([hist[:half].sum(), hist[half:].sum()], dtype=hist.dtype)
            else:
                hist = np.pad(hist, (p, p)).reshape(-1, k).sum(1)
            t = float(old[4]) + float(p) * width
            edges = np.linspace(-t, t, len(hist) + 1)
            rest = (old[2], old[3], np.array(t, dtype=old[4].dtype))
        else:
            if k >= len(hist):
                hist = np.array([hist.sum()], dtype=hist.dtype)
            else:
                hist = np.pad(hist, (0, (-len(hist)) % k)).reshape(-1, k).sum(1)
            edges = float(edges[0]) + width * float(k) * np.arange(len(hist) + 1)
            rest = old[2:]
        self._c.histogram_dict[name] = (hist, edges.astype(old[1].dtype), *rest)

    def pop(self, name: str):
        """(hist, edges, ...) of ``name``, removed (frees its memory); None if it has none."""
        return self._c.histogram_dict.pop(name, None)

    def entropy_threshold(self, histogram: tuple) -> tuple[float, float]:
        """onnxruntime's KL search over a signed histogram: (low, high) clip values."""
        lo, hi = self._c.get_entropy_threshold(histogram, self.num_quantized_bins)
        return float(lo), float(hi)
