"""Numeric equivalence: inputs, reference outputs, error metrics and tolerances.

The reference is the *original* model in onnxruntime with graph optimisations disabled,
run once; every candidate (after each pass that changed the graph, and the final model) runs
on the same inputs. Per output we report:

* ``max_abs``: max |ref - out|
* ``max_rel``: max_abs / max |ref|, the error relative to the output's range (an
  element-wise relative error explodes near zero and says nothing useful)
* ``cosine``: cosine similarity of the flattened outputs
* ``mismatch``: share of differing elements, for integer and bool outputs

Tolerances depend on the pass's :class:`Numerics`: EXACT and CLOSE differ only by float
re-association, so ``max_rel`` must stay at float32 rounding level (1e-5 and 1e-4 times a
depth allowance) and cosine near 1; an output whose values are all below 1e-3 (a saturated
sigmoid tail) is judged by absolute error instead (1e-6). LOSSY passes are judged by the
plan's thresholds: cosine, SQNR and top-1 agreement.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import numpy as np
import onnx

from . import ir
from .errors import InputError
from .pass_base import Numerics

TOLERANCE = {Numerics.EXACT: 1e-5, Numerics.CLOSE: 1e-4}
MIN_COSINE = {Numerics.EXACT: 0.99999, Numerics.CLOSE: 0.9999}


@dataclass
class OutputMetrics:
    name: str
    shape_ok: bool
    max_abs: float
    max_rel: float
    cosine: float
    mismatch: float
    ok: bool = True
    integer: bool = False
    sqnr_db: float = float("inf")
    top1: float | None = None  # argmax agreement over the last axis, for classifier outputs
    ref_max: float = 0.0       # max |reference|, the scale max_rel is relative to

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------- inputs


def parse_shape_args(items: list[str] | None) -> dict[str, list[int]]:
    """``name:1x3x224x224`` (repeatable) -> {name: [1, 3, 224, 224]}; bare ``1x3x..`` means
    the first input, stored under the key ``''``."""
    out: dict[str, list[int]] = {}
    for item in items or []:
        name, _, dims = item.rpartition(":")
        try:
            shape = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise InputError(f"--input-shape '{item}': expected name:1x3x224x224") from None
        if any(d <= 0 for d in shape):
            raise InputError(f"--input-shape '{item}': dims must be positive")
        out[name] = shape
    return out


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (old IR lists weights as inputs too)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def input_shape(vi: onnx.ValueInfoProto, shapes: dict[str, list[int]], default: int = 1
                ) -> list[int]:
    tt = vi.type.tensor_type
    if vi.name in shapes:
        return shapes[vi.name]
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in tt.shape.dim]
    # A user's bare `1x3x224x224` applies to a single input.
    if "" in shapes and len(shapes[""]) == len(dims):
        return shapes[""]
    return [d if d is not None else default for d in dims]


# Random inputs beyond this (all inputs together) are refused: a declared batch of 10^6
# makes a verification run that takes minutes and gigabytes (found by tools/fuzz.py).
# Users with such inputs pass --input-shape or their own --inputs (not limited).
MAX_FEED_BYTES = 64 << 20


def make_feeds(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None,
               seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs: N(0,1) floats, small non-negative integers, random bools.

    Integer inputs are often indices or lengths, so they get values in [0, 4).
    """
    rng = np.random.default_rng(seed)
    shapes = shapes or {}
    unknown = set(shapes) - {i.name for i in real_inputs(model)} - {""}
    if unknown:
        names = ", ".join(i.name for i in real_inputs(model))
        raise InputError(f"--input-shape names unknown input(s) {sorted(unknown)}; inputs: {names}")
    feeds = {}
    total = 0.0
    for vi in real_inputs(model):
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input '{vi.name}' is not a tensor; pass it with --inputs")
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = input_shape(vi, shapes)
        # Declared dims can be absurd (2^40): refuse before numpy tries to allocate them.
        total += float(np.prod([float(d) for d in shape])) * np.dtype(dtype).itemsize
        if total > MAX_FEED_BYTES:
            raise InputError(f"input '{vi.name}' of shape {shape} is too large for random "
                             f"inputs (all inputs over {MAX_FEED_BYTES >> 20} MB); set smaller "
                             "dims with --input-shape or pass --inputs")
        if np.issubdtype(dtype, np.floating):
            x = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            x = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            x = rng.integers(0, 4, size=shape).astype(dtype)
        else:
            raise InputError(f"input '{vi.name}' has dtype {dtype}; pass it with --inputs")
        feeds[vi.name] = x
    return feeds


def load_inputs(path: str | os.PathLike, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Inputs from an .npz (keys = input names) or an .npy (single-input models)."""
    names = [i.name for i in real_inputs(model)]
    try:
        if str(path).endswith(".npy"):
            if len(names) != 1:
                raise InputError(f"{path}: an .npy file needs a single-input model; inputs: {names}")
            return {names[0]: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            feeds = {k: z[k] for k in z.files}
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"{path}: cannot read inputs ({type(e).__name__}: {e})") from None
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"{path}: missing input(s) {missing}; has {sorted(feeds)}")
    return {n: feeds[n] for n in names}


# --------------------------------------------------------------------------- metrics


def compare(name: str, ref: np.ndarray, out: np.ndarray) -> OutputMetrics:
    ref, out = np.asarray(ref), np.asarray(out)
    if ref.shape != out.shape or ref.dtype != out.dtype:
        return OutputMetrics(name, False, float("inf"), float("inf"), 0.0, 1.0, ok=False)
    if ref.size == 0:
        return OutputMetrics(name, True, 0.0, 0.0, 1.0, 0.0)
    if not np.issubdtype(ref.dtype, np.floating):
        mism = float(np.mean(ref != out))
        return OutputMetrics(name, True, float(mism > 0), float(mism > 0), 1.0 - mism, mism,
                             integer=True)
    r, o = ref.astype(np.float64).ravel(), out.astype(np.float64).ravel()
    nan_r, nan_o = np.isnan(r), np.isnan(o)
    if (nan_r != nan_o).any():
        return OutputMetrics(name, True, float("inf"), float("inf"), 0.0,
                             float(np.mean(nan_r != nan_o)), ok=False)
    fin = ~nan_r
    r, o = r[fin], o[fin]
    # Infinities must agree exactly; compare the finite rest.
    inf_r = np.isinf(r)
    if (r[inf_r] != o[inf_r]).any() or np.isinf(o[~inf_r]).any():
        return OutputMetrics(name, True, float("inf"), float("inf"), 0.0, 0.0, ok=False)
    r, o = r[~inf_r], o[~inf_r]
    if r.size == 0:
        return OutputMetrics(name, True, 0.0, 0.0, 1.0, 0.0)
    diff = np.abs(r - o)
    max_abs = float(diff.max())
    scale = float(np.abs(r).max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    nr, no = float(np.linalg.norm(r)), float(np.linalg.norm(o))
    if nr == 0 and no == 0:
        cos = 1.0
    elif nr == 0 or no == 0:
        cos = 0.0
    else:
        cos = float(np.dot(r, o) / (nr * no))
    noise = float(np.sum((r - o) ** 2))
    sqnr = float("inf") if noise == 0 else 10.0 * np.log10(max(float(np.sum(r * r)), 1e-300) / noise)
    top1 = None
    if ref.ndim >= 2 and ref.shape[-1] > 1 and np.isfinite(ref).all() and np.isfinite(out).all():
        top1 = float(np.mean(np.argmax(ref, axis=-1) == np.argmax(out, axis=-1)))
    return OutputMetrics(name, True, max_abs, max_rel, cos, float(np.mean(diff > 0)),
                         sqnr_db=sqnr, top1=top1, ref_max=scale)


TINY_OUTPUT = 1e-3
ABS_FLOOR = 1e-6
LOSSY_DEFAULT = {"min_cosine": 0.99, "min_top1": 0.99, "min_sqnr_db": 15.0}


def judge(m: OutputMetrics, numerics: Numerics, depth: int = 1,
          lossy: dict | None = None) -> bool:
    """Within tolerance for a chain of ``depth`` rewrites of this kind?

    LOSSY (reduced precision) is judged by the plan's thresholds: cosine, SQNR and, for
    classifier-shaped outputs, top-1 agreement.
    """
    if not m.shape_ok:
        return False
    if numerics is Numerics.LOSSY:
        t = dict(LOSSY_DEFAULT, **(lossy or {}))
        if m.integer:
            return 1.0 - m.mismatch >= t["min_top1"]
        ok = m.cosine >= t["min_cosine"] and m.sqnr_db >= t["min_sqnr_db"]
        return ok and (m.top1 is None or m.top1 >= t["min_top1"])
    tol = TOLERANCE[numerics] * max(1, depth) ** 0.5
    if m.ref_max < TINY_OUTPUT:
        # All values tiny (a saturated sigmoid/softmax tail, e^-x): rounding-level changes
        # before the last nonlinearity show up as large *relative* errors here, so such an
        # output is judged by absolute error, a few float32 ulps of 1.0.
        return m.max_abs <= ABS_FLOOR * max(1, depth) ** 0.5
    if m.integer:
        # Integer outputs (ArgMax, TopK indices): a few flips are float ties going the
        # other way after re-association.
        return m.mismatch <= 0.01
    return m.max_rel <= tol and m.cosine >= MIN_COSINE[numerics]


# --------------------------------------------------------------------------- verifier


class Verifier:
    """Runs the original once, then compares candidates against it, output by output.

    ``feeds`` is one input dict or a list of them (e.g. held-out calibration samples);
    outputs of several sets are concatenated along the batch axis before comparing.
    """

    def __init__(self, original: onnx.ModelProto, base_dir, feeds,
                 path: str | None = None, lossy: dict | None = None):
        from .backends import ort as backend

        self.backend = backend
        self.feed_sets = feeds if isinstance(feeds, list) else [feeds]
        self.lossy = lossy
        self.output_names = [o.name for o in original.graph.output]
        if ir.duplicate_node_names(original):
            # onnxruntime refuses two nodes of one name; the rewrite renames them (the
            # output loads), so the reference runs a renamed copy.
            renamed = onnx.ModelProto()
            renamed.CopyFrom(original)
            ir.unique_node_names(renamed)
            original, path = renamed, None
        try:
            # From the file when there is one: onnxruntime reads it without a protobuf copy.
            sess = backend.session(path) if path else backend.session(original, base_dir)
        except Exception as e:
            raise InputError(f"onnxruntime cannot load the original model: {_line(e)}") from None
        try:
            self.reference = _stack([backend.run(sess, f) for f in self.feed_sets])
        except Exception as e:
            raise InputError(f"onnxruntime cannot run the original model on these inputs: "
                             f"{_line(e)} (set shapes with --input-shape or pass --inputs)") from None

    def check(self, exported, numerics: Numerics, depth: int = 1) -> list[OutputMetrics]:
        """Compare an :class:`rewriter.ir.Exported` model with the reference."""
        model = exported.model
        sess = self.backend.session(model, exported.source_dir,
                                    initializers=exported.ort_initializers())
        names = [o.name for o in model.graph.output]
        if names != self.output_names:
            return [OutputMetrics(n, False, float("inf"), float("inf"), 0.0, 1.0, ok=False)
                    for n in self.output_names]
        outs = _stack([self.backend.run(sess, f) for f in self.feed_sets])
        metrics = []
        for name, r, o in zip(names, self.reference, outs):
            m = compare(name, r, o)
            m.ok = m.ok and judge(m, numerics, depth, self.lossy)
            metrics.append(m)
        return metrics


def _stack(runs: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Per output, the runs concatenated on axis 0 (flattened if shapes disagree)."""
    if len(runs) == 1:
        return runs[0]
    out = []
    for arrays in zip(*runs):
        try:
            out.append(np.concatenate([np.asarray(a) for a in arrays], axis=0))
        except ValueError:
            out.append(np.concatenate([np.asarray(a).ravel() for a in arrays]))
    return out


def _line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def layer_divergence(ref_exp, new_exp, names: list[str], feed_sets: list[dict],
                     min_cosine: float, labels: dict[str, str] | None = None,
                     chunk: int = 32) -> str | None:
    """First of ``names`` (in order) whose values in ``new_exp`` fall below ``min_cosine``
    against ``ref_exp``; compared ``chunk`` tensors at a time, so two full copies of every
    activation are never held. Returns the layer label and its cosine, or None."""
    from .backends import ort

    def augmented(exp, chunk_names):
        m = onnx.ModelProto()
        m.CopyFrom(exp.model)
        have = {o.name for o in m.graph.output}
        produced = {o for n in m.graph.node for o in n.output}
        for n in chunk_names:
            if n not in have and n in produced:
                m.graph.output.append(onnx.ValueInfoProto(name=n))
        return m

    for i in range(0, len(names), chunk):
        part = names[i:i + chunk]
        results = []
        for exp in (ref_exp, new_exp):
            m = augmented(exp, part)
            outs = [o.name for o in m.graph.output]
            sess = ort.session(m, exp.source_dir, initializers=exp.ort_initializers())
            want = [n for n in part if n in outs]
            vals = {n: [] for n in want}
            for f in feed_sets:
                for n, v in zip(want, ort.run(sess, f, want)):
                    vals[n].append(np.asarray(v, np.float64).ravel())
            results.append(vals)
        for n in part:
            if n in results[0] and n in results[1]:
                a, b = np.concatenate(results[0][n]), np.concatenate(results[1][n])
                if a.shape != b.shape:
                    continue
                na, nb = np.linalg.norm(a), np.linalg.norm(b)
                cos = float(a @ b / (na * nb)) if na > 0 and nb > 0 else float(na == nb)
                if cos < min_cosine:
                    return f"{(labels or {}).get(n, n)} (cosine {cos:.5f})"
    return None
