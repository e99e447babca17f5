"""Why a planner's stated top-1 bound is above what fresh samples show, on one task.

    python tools/quant_bound_check.py --task orient-photo [--n-eval 1000 --eval-seed 2]
    python tools/quant_bound_check.py --models orient-photo=fp16.onnx cls-lines=q.onnx ...

For a task of tools/quant_eval.py: ``--plan auto`` on the 64 calibration samples (its
stated bound: the k-fold flip-risk bound), the final model judged on the fresh samples,
and three checks of where an overstatement comes from:

* draws: the same bound computed on random 64-sample draws of the fresh samples, against
  the other samples' agreement (is the bound's arithmetic optimistic on a random draw?);
* holdout: the plan rebuilt from 3/4 of the calibration samples and judged on the other
  1/4, which set nothing (a leak from fitting shows as small drops on the fitted part
  only);
* tails: quantiles of the drop of the FP32 top class's lead (between log-probabilities) on
  the calibration samples and on the fresh ones.

``--cosine ORIGINAL REWRITTEN DATA``: the per-sample cosine of every output of a rewritten
model on every sample of DATA (a folder, as ``--calib`` takes; ``--preprocess`` as the
plan's), then on ``--draws`` random draws of ``--n`` samples (with replacement) how often
the stated lower bound of the mean cosine is above the mean of all of them: the bound as
it is now (:func:`rewriter.verify.certify.mean_lower`) and the percentile bootstrap it
replaced. DATA's samples stand for the inputs the model will meet; a 95% bound should be
above their mean in about 2.5% of draws.

``--max-abs ORIGINAL REWRITTEN DATA``: the largest error of every sample of DATA, per
float output, then, at tolerances from its 97th percentile to twice its largest, on
``--draws`` draws of ``--n`` samples (without replacement) how often the bound of the
share of inputs outside the tolerance (:func:`rewriter.verify.certify.exceed_bounds`) is
below the share of all DATA's samples, how often it certifies 0.99 within, and the same
for a log-normal fit of the errors (bootstrapped), the model it was chosen over.

``--models TASK=PATH ...``: only the draws, for rewritten models already on disk: on
``--draws`` random 64-sample draws of the fresh samples, how often the flip-risk bound
is above the other samples' agreement, its median, and how often it passes 0.99; next to
it the bound as it was before ``margin_cdf_upper`` (the margins' plain empirical CDF,
bootstrapped), for comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import quant_eval as qe  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", choices=list(qe.TASKS))
    p.add_argument("--models", nargs="+", metavar="TASK=PATH",
                   help="only the draws, on these rewritten models")
    p.add_argument("--cosine", nargs=3, metavar=("ORIGINAL", "REWRITTEN", "DATA"),
                   help="how often the mean-cosine bound is above the mean of DATA's samples")
    p.add_argument("--max-abs", nargs=3, metavar=("ORIGINAL", "REWRITTEN", "DATA"),
                   help="how often the max_abs share bound is below the share of DATA")
    p.add_argument("--preprocess", help="with --cosine: a YAML file of the plan's preprocess")
    p.add_argument("--n", type=int, nargs="+", default=None,
                   help="with --cosine / --max-abs: samples per draw (18 56 / 24 64)")
    p.add_argument("--n-eval", type=int, default=1000)
    p.add_argument("--eval-seed", type=int, default=2)
    p.add_argument("--draws", type=int, default=100)
    p.add_argument("--work", default="/tmp/quant_bound_check")
    a = p.parse_args()
    if a.cosine:
        a.n = a.n or [18, 56]
        return cosine_draws(a)
    if a.max_abs:
        a.n = a.n or [24, 64]
        return abs_draws(a)
    if a.models:
        return draws_only(a)
    if not a.task:
        p.error("--task or --models is needed")

    import rewriter
    from rewriter.quant.planner import plan_auto
    from rewriter.verify.certify import _log_probs, judge_lossy, margins_and_leads

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = str(qe.CACHE / qe.TASKS[a.task][0])
    xc, _ = qe.task_data(a.task, 64, 0)
    xe, _ = qe.task_data(a.task, a.n_eval, a.eval_seed)
    calib = [{"x": xc[i:i + 1]} for i in range(len(xc))]
    plan, rep = plan_auto(model, calib, progress=False)
    stated = rep.measured["top1_lower"]
    rc, re_ = qe.outputs(model, xc), qe.outputs(model, xe)

    def build(idx, name):
        out = work / f"{a.task}.{name}.onnx"
        rewriter.rewrite(model, output=out, plan=plan, calib=[calib[i] for i in idx],
                         materialize=False)
        return qe.outputs(str(out), xc), qe.outputs(str(out), xe)

    def drops(r, o):
        return margins_and_leads(_log_probs(r), _log_probs(o))[1]

    def line(name, r, o):
        d = drops(r, o)
        j = judge_lossy("y", r, o, {})
        return (f"  {name:34s} n {len(r):4d}  lead drop q50/q90/q99 {np.quantile(d, .5):.3f}/"
                f"{np.quantile(d, .9):.3f}/{np.quantile(d, .99):.3f}  flip risk "
                f"{j.flip_risk:.4f}  top-1 {j.top1:.3f}")

    oc, oe = build(range(64), "all")
    agree = re_.argmax(1) == oe.argmax(1)
    j = judge_lossy("y", re_, oe, {})
    n8 = sum(r.choice == "int8" for r in rep.layers if r.op == "Conv")
    print(f"{a.task}: --plan auto, {n8} convs INT8; stated bound {stated:.4f}; fresh top-1 "
          f"{agree.mean():.4f} [{j.top1_ci[0]:.4f}, {j.top1_ci[1]:.4f}] on {len(agree)}")
    rng = np.random.default_rng(0)
    bounds, above = [], 0
    for _ in range(a.draws):
        idx = rng.permutation(len(xe))
        d, rest = idx[:64], idx[64:]
        b = judge_lossy("y", re_[d], oe[d], {"min_top1": 0.99}).top1_lower
        bounds.append(b)
        above += b > agree[rest].mean()
    print(f"draws: on {a.draws} random 64-sample draws of the fresh samples the bound is above "
          f"the other samples' agreement {above} times (median {np.median(bounds):.4f}, "
          f"highest {max(bounds):.4f})")
    held = list(range(0, 64, 4))
    fit = [i for i in range(64) if i not in held]
    hc, he = build(fit, "holdout")
    print("holdout and tails (the final model unless said):")
    print(line("calibration samples (fitted)", rc, oc))
    print(line("fresh samples", re_, oe))
    print(line("built from 48: the 48 (fitted)", rc[fit], hc[fit]))
    print(line("built from 48: the other 16", rc[held], hc[held]))
    print(line("built from 48: fresh samples", re_, he))
    return 0


def draws_only(a) -> int:
    from rewriter.verify.certify import _log_probs, flip_risk, judge_lossy, margins_and_leads

    for spec in a.models:
        task, path = spec.split("=", 1)
        xe, _ = qe.task_data(task, a.n_eval, a.eval_seed)
        r, o = qe.outputs(str(qe.CACHE / qe.TASKS[task][0]), xe), qe.outputs(path, xe)
        m, d = margins_and_leads(_log_probs(r), _log_probs(o))
        agree = r.argmax(1) == o.argmax(1)
        rng = np.random.default_rng(0)
        rows = []
        for k in range(a.draws):
            idx = rng.permutation(len(r))
            s, rest = idx[:64], idx[64:]
            band = judge_lossy("y", r[s], o[s], {}, seed=k).top1_lower
            boots = rng.integers(0, 64, (1000, 64))
            plain = 1 - np.percentile([flip_risk(m[s][b], d[s][b]) for b in boots], 95)
            rows.append((agree[rest].mean(), band, plain))
        t, band, plain = (np.array(c) for c in zip(*rows))
        print(f"{task:12s} {path}: fresh top-1 {agree.mean():.4f} on {len(r)}; "
              f"{a.draws} draws of 64")
        for name, b in (("band (now)", band), ("plain ECDF (before)", plain)):
            print(f"  {name:20s} median bound {np.median(b):.4f}, above the other samples' "
                  f"agreement in {np.mean(b > t) * 100:.1f}% of draws, >= 0.99 in "
                  f"{np.mean(b >= 0.99) * 100:.0f}%", flush=True)
    return 0


def cosine_draws(a) -> int:
    import onnx
    import yaml

    from rewriter.core import ort
    from rewriter.quant.data import load_calibration
    from rewriter.verify.certify import mean_lower

    orig, new, data = a.cosine
    pre = yaml.safe_load(Path(a.preprocess).read_text()) if a.preprocess else None
    samples = load_calibration(data, onnx.load(orig, load_external_data=False),
                               preprocess=pre)
    sa, sb = ort.session(orig), ort.session(new)
    names = [o.name for o in sa.get_outputs()]
    cos, size = {k: [] for k in names}, {}
    for feed in samples:
        for k, x, y in zip(names, sa.run(None, feed), sb.run(names, feed)):
            x, y = np.ravel(x).astype(np.float64), np.ravel(y).astype(np.float64)
            size[k] = x.size
            nx, ny = np.linalg.norm(x), np.linalg.norm(y)
            cos[k].append(x @ y / (nx * ny) if nx > 0 and ny > 0 else float(nx == ny))
    print(f"{new}: {len(cos[names[0]])} samples, {a.draws} draws each, share of draws whose "
          "95% lower bound of the mean cosine is above the mean of all samples")
    for k, c in cos.items():
        c = np.array(c)
        if len(c) < 2 or size[k] < 2:
            continue     # one value per sample is judged over the samples, not as a mean
        rng = np.random.default_rng(0)
        for n in a.n:
            now = before = 0
            for r in range(a.draws):
                x = c[rng.integers(0, len(c), n)]
                b = x[rng.integers(0, n, (1000, n))].mean(axis=1)
                before += np.percentile(b, 2.5) > c.mean()
                now += mean_lower(x, 0.025, 1000, r) > c.mean()
            print(f"  {k:24s} mean {c.mean():.6f} worst {c.min():.5f}  n {n:3d}: now "
                  f"{now / a.draws * 100:5.1f}%, percentile bootstrap "
                  f"{before / a.draws * 100:5.1f}%", flush=True)
    return 0


def _lognormal_upper(e: np.ndarray, tol: float, reps: int = 1000, seed: int = 0) -> float:
    """The model exceed_bounds was chosen over: log-errors normal, bootstrapped."""
    from statistics import NormalDist
    x = np.log(np.maximum(e, tol * 1e-12))
    s = x[np.random.default_rng(seed).integers(0, len(x), (reps, len(x)))]
    z = (np.log(tol) - s.mean(axis=1)) / np.maximum(s.std(axis=1, ddof=1), 1e-12)
    p = 1 - np.array([NormalDist().cdf(v) for v in z])
    return max(float(np.percentile(p, 95)), float(np.mean(e > tol)))


def abs_draws(a) -> int:
    import onnx

    from rewriter.core import ort
    from rewriter.quant.data import load_calibration
    from rewriter.verify.certify import exceed_bounds, sample_abs_errors

    orig, new, data = a.max_abs
    samples = load_calibration(data, onnx.load(orig, load_external_data=False),
                               limit=10 ** 6)
    sa, sb = ort.session(orig), ort.session(new)
    names = [o.name for o in sa.get_outputs()]
    errs = {k: [] for k in names}
    for feed in samples:
        for k, x, y in zip(names, sa.run(None, feed), sb.run(names, feed)):
            if np.issubdtype(np.asarray(x).dtype, np.floating):
                errs[k].append(float(sample_abs_errors(np.ravel(x)[None],
                                                       np.ravel(y)[None])[0]))
    print(f"{new}: {len(samples)} samples, {a.draws} draws each: share of draws whose bound "
          "of the share outside max_abs is below that of all samples (under), median "
          "bound of the share within, share of draws certifying 0.99")
    for k, e in errs.items():
        e = np.array(e)
        if len(e) < 2:
            continue
        for q, mult in ((97, 1), (99, 1), (99.5, 1), (99.9, 1), (100, 1), (100, 1.5),
                        (100, 2)):
            tol = float(np.percentile(e, q)) * mult
            if not tol > 0:
                continue
            truth = float(np.mean(e > tol))
            for n in a.n:
                rng = np.random.default_rng(1)
                now, old = [], []
                for r in range(a.draws):
                    x = e[rng.choice(len(e), min(n, len(e)), replace=False)]
                    now.append(exceed_bounds(x, tol, seed=r)[1])
                    old.append(_lognormal_upper(x, tol, seed=r))
                now, old = np.array(now), np.array(old)
                print(f"  {k:16s} q{q:<5g}x{mult:<4g} tol {tol:.4g} outside {truth:.4f} n {n:3d}:"
                      f" under {np.mean(now < truth) * 100:5.1f}% within>= "
                      f"{1 - np.median(now):.3f} 0.99 in {np.mean(now <= 0.01) * 100:5.1f}%;"
                      f" log-normal under {np.mean(old < truth) * 100:5.1f}%", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
