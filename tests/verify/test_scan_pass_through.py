"""onnxruntime computes a Scan state that the body returns unchanged (body output = body
input) wrongly: zeros or stale memory, where onnx's reference evaluator and MIGraphX carry
the value. Every session this project makes computes it right (an Identity in a copy), so
--verify neither fails a correct rewrite nor passes a wrong one on garbage."""

import numpy as np
import onnx
import onnx.reference
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import rewriter
from rewriter.core import ort


def carried_model(rng):
    """Two states: the first an initializer the body returns unchanged, the second an
    Expand (a view MIGraphX refuses: scan-states) that the body adds each frame to."""
    vi = h.make_tensor_value_info
    body = h.make_graph(
        [h.make_node("Add", ["b_s1", "b_f"], ["b_n1"]), h.make_node("Mul", ["b_f", "b_f"],
                                                                     ["b_y"])],
        "body", [vi("b_s0", T.FLOAT, [1, 8]), vi("b_s1", T.FLOAT, [1, 8]),
                 vi("b_f", T.FLOAT, [1, 8])],
        [vi("b_s0", T.FLOAT, [1, 8]), vi("b_n1", T.FLOAT, [1, 8]), vi("b_y", T.FLOAT, [1, 8])])
    g = h.make_graph(
        [h.make_node("Expand", ["e", "shape"], ["s1"]),
         h.make_node("Scan", ["s0", "s1", "fr"], ["so0", "so1", "ys"], body=body,
                     num_scan_inputs=1)], "g",
        [vi("e", T.FLOAT, [1, 1]), vi("fr", T.FLOAT, [4, 1, 8])],
        [vi("so0", T.FLOAT, [1, 8]), vi("so1", T.FLOAT, [1, 8]), vi("ys", T.FLOAT, [4, 1, 8])],
        [numpy_helper.from_array(rng.standard_normal((1, 8)).astype(np.float32), "s0"),
         numpy_helper.from_array(np.array([1, 8], np.int64), "shape")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _feeds(rng):
    return {"e": rng.standard_normal((1, 1)).astype(np.float32),
            "fr": rng.standard_normal((4, 1, 8)).astype(np.float32)}


def test_sessions_carry_a_state_the_body_returns_unchanged(rng):
    m = carried_model(rng)
    assert ort.scan_pass_through(m) == ["so0: b_s0"]
    feeds = _feeds(rng)
    want = onnx.reference.ReferenceEvaluator(m).run(None, feeds)
    for a, b in zip(ort.run(ort.session(m), feeds), want):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    fixed = ort.scan_states_computed(m)
    assert fixed is not m and ort.scan_pass_through(fixed) == []
    assert ort.scan_pass_through(m) == ["so0: b_s0"]        # the model itself unchanged


def test_verify_of_such_a_model_is_right_and_says_why(rng):
    m = carried_model(rng)
    out, rep = rewriter.rewrite(m, target="migraphx", verify=True, inputs=_feeds(rng))
    assert rep.ok and rep.verified
    assert any(w.startswith("onnxruntime computes a Scan state that its body returns")
               and "so0: b_s0" in w for w in rep.warnings), rep.warnings
    assert ort.scan_pass_through(out) == ["so0: b_s0"]     # written as it was
