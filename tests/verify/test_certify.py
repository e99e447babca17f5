"""verify.certify: what a lossy judgement claims, and that it claims no more."""

import numpy as np
import pytest

from rewriter.verify.certify import flip_risk, judge_lossy, margins_and_leads, samples_needed, wilson

BUDGET = {"min_top1": 0.99, "min_cosine": 0.995}


def logits(n, c=4, seed=0):
    return np.random.default_rng(seed).standard_normal((n, c)) * 3


def test_wilson_and_samples_needed():
    lo, hi = wilson(64, 64)
    assert lo == pytest.approx(64 / (64 + 1.959963984540054 ** 2), rel=1e-9) and hi == 1.0
    assert wilson(0, 0) == (0.0, 1.0)
    n = samples_needed(0.99)
    assert wilson(n, n)[0] >= 0.99 > wilson(n - 1, n - 1)[0]


def test_margins_and_leads_and_flip_risk():
    ref = np.array([[0.6, 0.3, 0.1], [0.5, 0.45, 0.05]])
    out = np.array([[0.55, 0.35, 0.1], [0.4, 0.55, 0.05]])    # second one flips
    m, d = margins_and_leads(ref, out)
    np.testing.assert_allclose(m, [0.3, 0.05])
    np.testing.assert_allclose(d, [0.1, 0.2])
    assert flip_risk(m, np.zeros(2)) == 0.0
    assert flip_risk(m, np.array([1.0, 1.0])) == 1.0
    assert 0 < flip_risk(m, d) < 1


def test_identical_outputs_meet_but_64_samples_cannot_certify_0_99():
    ref = logits(64)
    j = judge_lossy("y", ref, ref.copy(), BUDGET)
    assert j.top1 == 1.0 and j.flip_risk == 0.0 and j.cosine == pytest.approx(1.0)
    assert j.met and not j.certifiable and "381 needed" in j.why
    big = logits(400, seed=1)
    j = judge_lossy("y", big, big.copy(), BUDGET)
    assert j.met and j.certifiable


def test_perturbed_outputs_fail_by_their_bounds_not_their_points():
    ref = logits(64, seed=2)
    out = ref + np.random.default_rng(3).standard_normal(ref.shape) * 0.5
    j = judge_lossy("y", ref, out, BUDGET)
    assert not j.met
    assert j.top1_lower < j.top1      # the bound is below the point estimate
    assert j.cosine_ci[0] <= j.cosine <= j.cosine_ci[1]


def test_labels_give_the_accuracy_change():
    ref = logits(100, c=2, seed=4)
    labels = ref.argmax(1).copy()
    labels[:10] = 1 - labels[:10]                     # FP32 wrong on 10 of 100
    out = ref.copy()
    out[10:15] = out[10:15][:, ::-1]                  # 5 correct ones flip
    j = judge_lossy("y", ref, out, {"max_accuracy_drop": 1.0}, labels=labels)
    assert j.accuracy_fp32 == pytest.approx(0.9) and j.accuracy == pytest.approx(0.85)
    assert j.accuracy_drop == pytest.approx(5.0) and j.accuracy_drop_ci[0] > 0
    assert not j.met


def test_outputs_without_classes_are_judged_by_cosine_only():
    ref = np.random.default_rng(5).standard_normal((8, 1, 16, 16))
    j = judge_lossy("mask", ref, ref * 1.001, BUDGET)
    assert j.top1 is None and not j.classes and j.met and j.certifiable


def test_flip_risk_bound_is_not_above_fresh_agreement():
    """Logits perturbed by the same noise at any confidence (as quantisation does): the
    bound from 64 samples stays at or below the agreement of 5,000 fresh ones in at least
    36 of 40 draws (a 95% bound may miss 2 in 40). Between probabilities instead of
    log-probabilities, confident samples' saturated drops were set against ambiguous
    samples' margins and the bound came out above the truth in most draws."""
    rng = np.random.default_rng(7)

    def draw(n):
        ref = rng.normal(0, 2.0, (n, 4)) * rng.uniform(0.2, 3.0, (n, 1))
        return ref, ref + rng.normal(0, 0.5, (n, 4))

    fresh_ref, fresh_out = draw(5000)
    truth = float(np.mean(fresh_ref.argmax(1) == fresh_out.argmax(1)))
    above = 0
    for k in range(40):
        ref, out = draw(64)
        j = judge_lossy("y", ref, out, {"min_top1": 0.9}, seed=k)
        above += j.top1_lower > truth
    assert 0.8 < truth < 0.99
    assert above <= 4, (above, truth)


def test_a_smaller_alpha_widens_every_decision_bound():
    """The planner's correction for comparing plans: at alpha 0.05/30 the flip-risk bound,
    the cosine bound and the accuracy-loss bound are all more conservative than at 0.05,
    and the default is the plain 95% judgement."""
    rng = np.random.default_rng(55)
    ref = logits(64, seed=5)
    out = ref + rng.normal(0, 1.0, ref.shape)
    labels = ref.argmax(1)
    a = judge_lossy("y", ref, out, BUDGET, labels=labels)
    b = judge_lossy("y", ref, out, BUDGET, labels=labels, alpha=0.05 / 30)
    assert a.alpha == 0.05 and b.alpha == pytest.approx(0.05 / 30)
    assert b.top1_lower < a.top1_lower
    assert b.cosine_ci[0] < a.cosine_ci[0] and b.cosine_ci[1] > a.cosine_ci[1]
    assert b.accuracy_drop_ci[1] > a.accuracy_drop_ci[1]
