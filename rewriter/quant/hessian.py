"""Second moments of INT8 convs' inputs, for error-compensating weight rounding (GPTQ).

Rounding each weight to its nearest int8 level ignores that the errors of weights reading
correlated inputs add up. With H = E[x x^T] over the conv's input patches (im2col), the
output error of a row w is (w - q)^T H (w - q); GPTQ (Frantar et al. 2022, after Optimal
Brain Quantization) rounds one input column at a time and moves the error into the columns
not yet rounded, in the direction H says they can absorb it. This module estimates H per
conv and per group from the calibration data (streamed, patches subsampled to at most
``max_patches`` per conv so a large layer costs a bounded time); the rounding itself is in
passes/insert_qdq.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ConvSpec:
    """What im2col needs of one Conv (2-D only; others are skipped)."""

    id: str
    input: str
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]      # top, left, bottom, right
    dilations: tuple[int, int]
    group: int


def conv_spec(node, weight_shape) -> ConvSpec | None:
    """The spec of a gs Conv node with a 4-D weight, or None (1-D/3-D, auto_pad)."""
    from rewriter.core.graph import node_id

    if len(weight_shape) != 4 or node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET",
                                                                             b"NOTSET"):
        return None
    kh, kw = int(weight_shape[2]), int(weight_shape[3])
    s = node.attrs.get("strides", [1, 1])
    d = node.attrs.get("dilations", [1, 1])
    p = node.attrs.get("pads", [0, 0, 0, 0])
    return ConvSpec(node_id(node), node.inputs[0].name, (kh, kw), (int(s[0]), int(s[1])),
                    (int(p[0]), int(p[1]), int(p[2]), int(p[3])), (int(d[0]), int(d[1])),
                    int(node.attrs.get("group", 1)))


def patches(x: np.ndarray, spec: ConvSpec) -> np.ndarray:
    """im2col of one batch: [group, (C/group)*kh*kw, N*H'*W']."""
    n, c, h, w = x.shape
    t, l, b, r = spec.pads
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    kh, kw = spec.kernel
    dh, dw = spec.dilations
    sh, sw = spec.strides
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]                    # [N, C, H', W', kh, kw]
    g = spec.group
    win = win.reshape(n, g, c // g, win.shape[2], win.shape[3], kh, kw)
    return np.ascontiguousarray(win.transpose(1, 2, 5, 6, 0, 3, 4)).reshape(
        g, (c // g) * kh * kw, -1)


class HessianReducer:
    """Streams batches of conv inputs into H = sum x x^T / count per conv and group."""

    def __init__(self, specs: list[ConvSpec], max_patches: int = 4096, seed: int = 0):
        self.by_input: dict[str, list[ConvSpec]] = {}
        for s in specs:
            self.by_input.setdefault(s.input, []).append(s)
        self.max_patches, self.rng = max_patches, np.random.default_rng(seed)
        self.h: dict[str, np.ndarray] = {}
        self.count: dict[str, int] = {}
        self.batches = 1
        self.result: dict[str, np.ndarray] = {}

    def update(self, name: str, a: np.ndarray) -> None:
        for spec in self.by_input.get(name, []):
            x = patches(np.asarray(a, np.float32), spec)
            keep = max(1, self.max_patches // max(1, self.batches))
            if x.shape[2] > keep:
                x = x[:, :, self.rng.choice(x.shape[2], keep, replace=False)]
            x = x.astype(np.float64)
            h = x @ x.transpose(0, 2, 1)
            if spec.id in self.h:
                self.h[spec.id] += h
                self.count[spec.id] += x.shape[2]
            else:
                self.h[spec.id], self.count[spec.id] = h, x.shape[2]

    def finish(self, names: list[str], progress: bool) -> None:
        for name in names:
            for spec in self.by_input.get(name, []):
                if spec.id in self.h:
                    self.result[spec.id] = self.h.pop(spec.id) / max(1, self.count.pop(spec.id))


def conv_hessians(model, specs: list[ConvSpec], data, base_dir=None, initializers=None,
                  max_patches: int = 4096, progress: bool = True) -> dict[str, np.ndarray]:
    """conv id -> H [group, D, D] over the calibration data (see the module docstring)."""
    from rewriter.quant.ranges import _stream

    reducer = HessianReducer(specs, max_patches)
    reducer.batches = max(1, len(data))
    tensors = sorted({s.input for s in specs})
    _stream(model, tensors, data, reducer, 64, base_dir, initializers, progress,
            "weight rounding statistics")
    return reducer.result
