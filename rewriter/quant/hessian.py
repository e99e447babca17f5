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

import contextlib
import functools
import os
from dataclasses import dataclass

import numpy as np


# passes/insert_qdq.py's GPTQ_BLOCK and STACK_BYTES (quant does not import passes; a test
# holds them equal): groups this narrow are solved stacked, this many bytes at a time.
STACKED_DEPTH = 128
STACK_BYTES = 16 << 20


@dataclass(frozen=True)
class ConvSpec:
    """What im2col needs of one Conv (2-D, or 1-D as height 1; 3-D ones are skipped)."""

    id: str
    input: str
    kernel: tuple[int, int]
    strides: tuple[int, int]
    pads: tuple[int, int, int, int]      # top, left, bottom, right
    dilations: tuple[int, int]
    group: int
    depth: int = 0                       # (C/group)*kh*kw: H is [group, depth, depth]
    same: str = ""                       # SAME_UPPER/SAME_LOWER over sizes not known: the
                                         # pads each batch's (pads_at), ``pads`` unused

    def pads_at(self, h: int, w: int) -> tuple[int, int, int, int]:
        """The pads over an input of spatial size h x w."""
        if not self.same:
            return self.pads
        from rewriter.core.graph import same_pads
        return tuple(same_pads([h, w], self.kernel, self.strides, self.dilations,
                               self.same == "SAME_LOWER"))

    def bytes(self, copies: int = 1) -> int:
        """What ``copies`` H of this conv hold (float32: see HessianReducer)."""
        return self.group * self.depth * self.depth * 4 * copies

    def solve_bytes(self) -> int:
        """What rounding this conv's weights holds on top of its H, one group at a time:
        3.3 d x d float64 at the peak, measured with tracemalloc at d = 1024 and 2048 (the
        float64 H, LAPACK's copy of it, the Cholesky factor; passes/insert_qdq.py). Small
        groups (d <= STACKED_DEPTH) are solved stacked, up to STACK_BYTES at a time."""
        stacked = STACK_BYTES if self.group > 1 and self.depth <= STACKED_DEPTH else 0
        return max(int(3.5 * 8 * self.depth * self.depth), stacked)


def conv_spec(node, weight_shape) -> ConvSpec | None:
    """The spec of a gs Conv node with a 4-D weight, or a 3-D one (a 1-D conv is a 2-D conv
    of height 1: its input is read as [N, C, 1, L]); None for 3-D convs and an auto_pad
    ONNX does not know. An auto_pad SAME_* over an input whose size is not known (its pads
    depend on it) takes its pads from each batch (``same``)."""
    from rewriter.core.graph import auto_pad, conv_pads, node_id

    if len(weight_shape) not in (3, 4):
        return None
    one = len(weight_shape) == 3
    kh, kw = (1, int(weight_shape[2])) if one else (int(weight_shape[2]), int(weight_shape[3]))
    p = conv_pads(node, [int(k) for k in weight_shape[2:]])
    auto = auto_pad(node)
    same = auto if p is None and auto in ("SAME_UPPER", "SAME_LOWER") else ""
    if p is None and not same:
        return None
    p = p or [0] * (2 * len(weight_shape[2:]))
    s = node.attrs.get("strides", [1] if one else [1, 1])
    d = node.attrs.get("dilations", [1] if one else [1, 1])
    if one:
        s, d, p = [1, s[0]], [1, d[0]], [0, p[0], 0, p[1]]
    return ConvSpec(node_id(node), node.inputs[0].name, (kh, kw), (int(s[0]), int(s[1])),
                    (int(p[0]), int(p[1]), int(p[2]), int(p[3])), (int(d[0]), int(d[1])),
                    int(node.attrs.get("group", 1)), int(weight_shape[1]) * kh * kw, same)


def conv_specs(nodes: list) -> list[ConvSpec]:
    """The specs of the Convs among ``nodes`` whose weight GPTQ can round: a constant of
    known shape (a weight the model stores as int8, kept as stored, is no constant)."""
    import onnx_graphsurgeon as gs

    specs = (conv_spec(n, n.inputs[1].shape) for n in nodes
             if n.op == "Conv" and isinstance(n.inputs[1], gs.Constant)
             and n.inputs[1].shape is not None)
    return [sp for sp in specs if sp]


# The H held at once, all convs (and folds) together: a 1024-channel 3x3 conv's H is 340 MB
# in float32, and a 2.5 GB model of them asked for 22 GB. Convs beyond it keep nearest
# rounding (the cheapest first are kept, so as many layers as fit get GPTQ).
HESSIAN_BUDGET = 4 << 30


def within_budget(specs: list[ConvSpec], copies: int = 1, budget: int | None = None
                  ) -> tuple[list[ConvSpec], list[ConvSpec]]:
    """(kept, left out): the specs whose H fit ``budget`` bytes, cheapest first, with the
    largest solve among them on top (solves run one at a time, while every H is held: an
    EEG net's 11392-wide conv held 2.6 GB of H and its float64 solve took 4 GB more)."""
    budget = HESSIAN_BUDGET if budget is None else budget
    kept, left, used, solve = [], [], 0, 0
    for sp in sorted(specs, key=lambda x: x.bytes()):
        if used + sp.bytes(copies) + max(solve, sp.solve_bytes()) <= budget:
            kept.append(sp)
            used += sp.bytes(copies)
            solve = max(solve, sp.solve_bytes())
        else:
            left.append(sp)
    order = {sp.id: i for i, sp in enumerate(specs)}
    return sorted(kept, key=lambda x: order[x.id]), sorted(left, key=lambda x: order[x.id])


def _out_size(size: int, spec: ConvSpec, axis: int, pads) -> int:
    """The conv's output size along spatial ``axis`` (0: height, 1: width), ``pads``
    :meth:`ConvSpec.pads_at` the input's size."""
    pad = pads[axis] + pads[axis + 2]
    span = (spec.kernel[axis] - 1) * spec.dilations[axis] + 1
    return (size + pad - span) // spec.strides[axis] + 1


def patches_at(x: np.ndarray, spec: ConvSpec, cols: np.ndarray | None) -> np.ndarray:
    """Columns ``cols`` of the im2col of one batch, [group, (C/group)*kh*kw, len(cols)]
    (column index: (n * H' + i) * W' + j; all of them when ``cols`` is None). Only those
    are gathered: the whole im2col of a 64-channel 3x3 conv at 320x320 is 236 MB, built
    per batch to keep 4096 columns or fewer in all (U2-Net-p's statistics)."""
    n, c, h, w = x.shape
    pads = spec.pads_at(h, w)
    t, l = pads[:2]
    kh, kw = spec.kernel
    dh, dw = spec.dilations
    sh, sw = spec.strides
    oh, ow = _out_size(h, spec, 0, pads), _out_size(w, spec, 1, pads)
    if cols is None:
        cols = np.arange(n * oh * ow)
    bi, rest = np.divmod(np.asarray(cols, np.int64), oh * ow)
    oi, oj = np.divmod(rest, ow)
    # [K, kh] rows and [K, kw] columns of the input each patch reads; outside is padding
    rows = (oi * sh - t)[:, None] + np.arange(kh) * dh
    cl = (oj * sw - l)[:, None] + np.arange(kw) * dw
    inside = ((rows >= 0) & (rows < h)).T[:, None, :] & ((cl >= 0) & (cl < w)).T[None, :, :]
    # [kh, kw, K] positions in the flattened maps, taken from each channel's row at once
    # (C outermost, as H's rows are): indexing [K, kh, kw, C] out of NCHW and transposing
    # took 9 ms a batch for a 384-channel 7x7 depthwise conv at 14x14 (ConvNeXt-T), 5 s
    # of its --plan default
    at = ((bi * h)[None, None, :] + np.clip(rows, 0, h - 1).T[:, None, :]) * w \
        + np.clip(cl, 0, w - 1).T[None, :, :]
    flat = x.reshape(c, h * w) if n == 1 else x.transpose(1, 0, 2, 3).reshape(c, n * h * w)
    got = np.take(flat, at, axis=1)                           # [C, kh, kw, K]
    if not inside.all():
        got[:, ~inside] = 0
    return got.reshape(spec.group, (c // spec.group) * kh * kw, len(bi))


# Patches gathered before one x x^T product is added to a conv's sums (see _flush).
FLUSH_PATCHES = 1024


class HessianReducer:
    """Streams batches of conv inputs into H = sum x x^T / count per conv and group; with
    ``groups`` (the group of each item, in the order the data streams) the sums are kept per
    group too, so that each group's complement comes out of the same single pass.

    Sums and results are float32: half the memory of float64 (five copies of a 4608-wide H
    under k-fold planning), and a relative error near 1e-6 on sums of a few thousand
    products, far below GPTQ's 1% damping; the rounding solves in float64."""

    def __init__(self, specs: list[ConvSpec], max_patches: int = 4096, seed: int = 0,
                 groups: list[int] | None = None):
        self.by_input: dict[str, list[ConvSpec]] = {}
        for s in specs:
            self.by_input.setdefault(s.input, []).append(s)
        self.max_patches, self.rng = max_patches, np.random.default_rng(seed)
        self.groups = groups
        self.seen: dict[str, int] = {}                     # items streamed, per tensor
        self.h: dict[str, dict] = {}                       # conv id -> group -> sum x x^T
        self.count: dict[str, dict] = {}
        self.batches = 1
        self.result: dict[str, np.ndarray] = {}
        self.without: dict[int, dict[str, np.ndarray]] = {}  # group -> H of the others
        self.pending: dict[tuple, list] = {}               # (conv id, group) -> patches

    def update(self, name: str, a: np.ndarray) -> None:
        item = self.seen.get(name, 0)
        self.seen[name] = item + 1
        key = self.groups[item] if self.groups is not None else 0
        a = np.asarray(a, np.float32)
        if a.ndim == 3:   # a 1-D conv's input, as a 2-D conv of height 1 reads it
            a = a[:, :, None, :]
        for spec in self.by_input.get(name, []):
            keep = max(1, self.max_patches // max(1, self.batches))
            pads = spec.pads_at(a.shape[2], a.shape[3])
            total = a.shape[0] * _out_size(a.shape[2], spec, 0, pads) * _out_size(
                a.shape[3], spec, 1, pads)
            # the draw the whole im2col was sampled with: the same columns, the same H
            cols = self.rng.choice(total, keep, replace=False) if total > keep else None
            x = patches_at(a, spec, cols)
            if not np.isfinite(x).all():   # such a layer stays float (activation-not-finite)
                x = np.where(np.isfinite(x), x, np.float32(0))
            pending = self.pending.setdefault((spec.id, key), [])
            pending.append(x)
            if sum(p.shape[2] for p in pending) >= FLUSH_PATCHES:
                self._flush(spec.id, key)

    def _flush(self, sid: str, key: int) -> None:
        """Add the pending patches' x x^T to the sums: one product over many patches, as
        a product over a few dozen writes the whole D x D result for little work (a
        9216-wide conv: 48 batches of 85 patches took 27 s, 4 products of 1024 take 4)."""
        pending = self.pending.pop((sid, key), None)
        if not pending:
            return
        x = np.concatenate(pending, axis=2) if len(pending) > 1 else pending[0]
        hs, cs = self.h.setdefault(sid, {}), self.count.setdefault(sid, {})
        cs[key] = cs.get(key, 0) + x.shape[2]
        live = x[0].any(axis=1) if x.shape[0] == 1 else None
        if live is not None and 2 * int(live.sum()) <= len(live):
            # Most rows zero in every patch (taps dilated past the map: DeepLabV3's ASPP
            # at rates 24 and 36 on 16x16, 960 live rows of 8640): their sums stay 0, so
            # the product is taken over the live rows alone, 1/81 of the work there. Not
            # where few rows are zero: a smaller product rounds its sums differently.
            idx = np.flatnonzero(live)
            h = _gram(np.ascontiguousarray(x[:, idx]))
            if key not in hs:
                hs[key] = np.zeros((1, len(live), len(live)), np.float32)
            hs[key][0][np.ix_(idx, idx)] += h[0]
            return
        h = _gram(x)
        if key in hs:
            hs[key] += h
        else:
            hs[key] = h

    def finish(self, names: list[str], progress: bool) -> None:
        for name in names:
            for spec in self.by_input.get(name, []):
                for sid, key in [k for k in self.pending if k[0] == spec.id]:
                    self._flush(sid, key)
                if spec.id not in self.h:
                    continue
                hs, cs = self.h.pop(spec.id), self.count.pop(spec.id)
                total, n = sum(hs.values()), sum(cs.values())
                self.result[spec.id] = total / max(1, n)
                if self.groups is not None:
                    for g in set(self.groups):
                        rest = n - cs.get(g, 0)
                        if rest > 0:
                            self.without.setdefault(g, {})[spec.id] = \
                                (total - hs[g]) / rest if g in hs else total / rest


def _gram(x: np.ndarray) -> np.ndarray:
    """x x^T per group of ``x`` [groups, D, patches]. Many groups (a depthwise conv's, D
    9-49) run on one BLAS thread: numpy makes one BLAS call per group, and OpenBLAS's
    threads on each call of that size only wait for each other (960 groups of 25 x 4096:
    3.0-5.1 s on 2 threads under load, 0.14 s on one); one thread also makes these sums
    the same on every core count (D = 49 rounded otherwise on 1 and 2)."""
    if x.shape[0] == 1:
        return x @ x.transpose(0, 2, 1)
    with one_blas_thread():
        return x @ x.transpose(0, 2, 1)


def one_blas_thread():
    """A context holding numpy's BLAS to one thread (threadpoolctl, as scikit-learn does:
    OpenBLAS, MKL and BLIS have no common setting, and an environment variable is read
    only at numpy's import); nothing where threadpoolctl is missing or fails."""
    c = _blas_controller()
    return contextlib.nullcontext() if c is None else c.limit(limits=1, user_api="blas")


@functools.lru_cache(maxsize=None)
def _blas_controller():
    """threadpoolctl's controller, found once (a scan of the loaded libraries), or None."""
    # Its import sets KMP_DUPLICATE_LIB_OK=True in os.environ: the caller's environment
    # (and its children's) changed by a call of rewriter.rewrite with a plan. Undone.
    had = os.environ.get("KMP_DUPLICATE_LIB_OK")
    try:
        from threadpoolctl import ThreadpoolController
        return ThreadpoolController()
    except Exception:  # noqa: BLE001 - not installed, or an unknown library layout
        return None
    finally:
        if had is None:
            os.environ.pop("KMP_DUPLICATE_LIB_OK", None)


def budget_note(left: list[ConvSpec]) -> str:
    """The report's line for convs that kept nearest rounding for memory."""
    return (f"GPTQ rounding skipped on {len(left)} INT8 conv(s) (e.g. {left[0].id}): their "
            f"input statistics and their solve would pass {HESSIAN_BUDGET >> 30} GB of "
            "memory; nearest "
            "rounding there")


def conv_hessians(model, specs: list[ConvSpec], data, base_dir=None, initializers=None,
                  max_patches: int = 4096, progress: bool = True,
                  folds: list[list[int]] | None = None):
    """conv id -> H [group, D, D] over the calibration data (see the module docstring).
    With ``folds`` (item indices per fold), also, for each fold f, the H of the other folds'
    items: ``(H, [H without fold 0, H without fold 1, ...])``, from one pass. Only convs
    within :data:`HESSIAN_BUDGET` (all copies counted) get an H."""
    from rewriter.quant.ranges import _stream

    reducer, tensors = hessian_reducer(specs, data, max_patches, folds)
    _stream(model, tensors, data, reducer, 64, base_dir, initializers, progress,
            "weight rounding statistics")
    if folds is None:
        return reducer.result
    return reducer.result, [reducer.without.get(f, {}) for f in range(len(folds))]


def hessian_reducer(specs: list[ConvSpec], data, max_patches: int = 4096,
                    folds: list[list[int]] | None = None) -> tuple[HessianReducer, list[str]]:
    """The reducer :func:`conv_hessians` streams ``data`` into and the tensors it reads,
    for a stream shared with range collection (ranges.collect_ranges' ``also``); its
    ``result`` is conv_hessians' once streamed."""
    specs = within_budget(specs, 1 + len(folds) if folds is not None else 1)[0]
    groups = None
    if folds is not None:
        groups = [0] * len(data)
        for f, idx in enumerate(folds):
            for j in idx:
                groups[j] = f
    reducer = HessianReducer(specs, max_patches, groups=groups)
    reducer.batches = max(1, len(data))
    return reducer, sorted({s.input for s in specs})
