"""Random inputs for --verify: lengths of a batch of signals get the signal's length."""

import numpy as np
import onnx
import pytest
from conftest import make_model, run_ort

from rewriter.verify.feeds import length_inputs, make_feeds

# onnx-asr's front-ends in small: samples past each row's length are masked to zero.
MASKED = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[B, N] waveforms, int64[B] waveforms_lens, int64[B] ids) => (float[B, N] y) {
    s = Shape (waveforms)
    one = Constant <value = int64 {1}> ()
    zero = Constant <value = int64 {0}> ()
    n = Gather <axis = 0> (s, one)
    t = Range (zero, n, one)
    l = Unsqueeze (waveforms_lens, one)
    mask = Less (t, l)
    f = Cast <to = 1> (ids)
    u = Unsqueeze (f, one)
    g = Add (waveforms, u)
    z = Constant <value = float {0.0}> ()
    y = Where (mask, g, z)
}"""


def test_a_length_input_gets_the_signals_length():
    m = make_model(MASKED)
    feeds = make_feeds(m, {"waveforms": [3, 400], "waveforms_lens": [3], "ids": [3]}, seed=5)
    lens = feeds["waveforms_lens"]
    assert lens.dtype == np.int64 and lens[0] == 400 and ((lens >= 200) & (lens <= 400)).all()
    assert ((feeds["ids"] >= 0) & (feeds["ids"] < 4)).all()   # not a length: as before
    # what --verify compares is not zeros past a few samples (lengths in [0, 4) left 1%)
    y, = run_ort(m, feeds)
    assert (y != 0).mean() >= 0.5
    # every other input keeps the values it had without the rule
    plain = onnx.ModelProto()
    plain.CopyFrom(m)
    plain.graph.input[1].name = "waveforms_l"
    before = make_feeds(plain, {"waveforms": [3, 400], "waveforms_l": [3], "ids": [3]}, seed=5)
    assert (before["waveforms_l"] < 4).all()
    np.testing.assert_array_equal(before["waveforms"], feeds["waveforms"])
    np.testing.assert_array_equal(before["ids"], feeds["ids"])
    # with no shape given, the size random inputs fill a symbolic dim with is the length
    assert make_feeds(m, fill=8)["waveforms_lens"].tolist() == [8]


def test_what_is_not_a_length_of_a_batch_keeps_small_values():
    m = make_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[B, N] x, int64[C] lens, int64 max_len, int64[B, 2] seq_len) => (float[B, N] y) {
        y = Identity (x)
    }""")
    feeds = make_feeds(m, {"x": [2, 64], "lens": [2], "seq_len": [2, 2]})
    assert not length_inputs(m, feeds)
    assert all((feeds[k] < 4).all() for k in ("lens", "max_len", "seq_len"))


def _kv_mask_model(mask_dim="past_sequence_length + sequence_length"):
    """A decoder step in small, as optimum exports it: the mask spans the cache and the new
    tokens, and its dim is declared as the sum of theirs."""
    h = onnx.helper
    f = onnx.TensorProto.FLOAT
    nodes = [h.make_node("Concat", ["past", "x"], ["kv"], axis=1),
             h.make_node("Concat", ["kv", "mask"], ["y"], axis=0)]
    g = h.make_graph(nodes, "g", [
        h.make_tensor_value_info("x", f, ["batch_size", "sequence_length"]),
        h.make_tensor_value_info("past", f, ["batch_size", "past_sequence_length"]),
        h.make_tensor_value_info("mask", f, ["batch_size", mask_dim])],
        [h.make_tensor_value_info("y", f, None)])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_a_dim_declared_as_a_sum_of_others_gets_their_sum():
    """With each symbolic dim 1 (or 8), a mask of 'past_sequence_length + sequence_length'
    got 1 (8) where the model needs 2 (16): no random input ran optimum's decoders with a
    KV cache, whatever size was tried."""
    m = _kv_mask_model()
    for fill in (None, 8):
        feeds = make_feeds(m, fill=fill)
        n = feeds["x"].shape[1] + feeds["past"].shape[1]
        assert feeds["mask"].shape == (1, n), feeds["mask"].shape
        run_ort(m, feeds)
    # the user's sizes: the mask follows them, or keeps the user's own
    feeds = make_feeds(m, {"x": [2, 3], "past": [2, 5]})
    assert feeds["mask"].shape == (1, 8)
    assert make_feeds(m, {"mask": [1, 4]})["mask"].shape == (1, 4)


def test_dim_expressions_read_only_arithmetic_of_known_dims():
    from rewriter.verify.feeds import dim_expression

    assert dim_expression("sequence_length") is None
    assert dim_expression("unk__12") is None
    e, names = dim_expression("2*S + N")          # S and N are names, not sympy's constants
    assert names == {"S", "N"} and e.subs({"S": 3, "N": 1}) == 7
    assert dim_expression("s0 + ") is None and dim_expression("a; import os") is None
    # 'batch-size' reads as a difference of two names no input has: left as a plain dim
    m = _kv_mask_model("batch-size")
    assert make_feeds(m, fill=8)["mask"].shape == (1, 8)


def test_a_sum_dim_with_a_name_of_its_own_is_tried_at_twice_the_size(tmp_path):
    """torch's exports of a decoder with a KV cache name the mask's length on its own
    ('total'; the dynamo exporter 's64'): no one size in every dim runs them, so --verify
    asked for --input-shape. Each named dim in turn at twice the others' size does."""
    import rewriter

    m = _kv_mask_model("total")
    out, rep = rewriter.rewrite(m, verify=True)
    said = [w for w in rep.warnings if "16 in 'total'" in w]
    assert said and "mask:1x16" in said[0], rep.warnings
    assert out.graph.input[2].name == "mask"
    # a dim no sum fixes still fails with the error that names --input-shape
    bad = _kv_mask_model("total")
    bad.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "other"
    bad.graph.node[0].input[:] = ["past", "x", "x"]   # kv is past + 2 new: 24, never 16
    with pytest.raises(rewriter.InputError, match="--input-shape"):
        rewriter.rewrite(bad, verify=True)
