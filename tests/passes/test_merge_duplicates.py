"""merge-duplicates: equal constants and identical nodes merge; nothing else does."""

import numpy as np
import onnx
from conftest import make_model, ops, run_ort

import rewriter


def cse(m, **kw):
    return rewriter.rewrite(m, ["merge-duplicates"], verify=True, **kw)


def test_parallel_identical_convs_and_chains_merge(rng):
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1)
        b = Conv <pads = [1, 1, 1, 1]> (x, W2)
        ra = Relu (a)
        rb = Relu (b)
        y = Add (ra, rb)
    }""", {"W1": w, "W2": w.copy()})
    out, rep = cse(m)
    assert ops(out) == ["Conv", "Relu", "Add"]       # W1 == W2: the branches are one
    c = rep.passes[0].counts
    assert c["merged-constants"] == 1 and c["merged-nodes"] == 2
    assert len(out.graph.initializer) == 1
    onnx.checker.check_model(out, full_check=True)


def test_equal_scalar_constants_merge(rng):
    """Two Gathers of one shape, each with its own 0-d index 2: the indices were never
    merged (a 0-d array compared with its 1-d copy), so neither were the Gathers after."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, H] x) => (float y) {
        s = Shape (x)
        g1 = Gather (s, i1)
        g2 = Gather (s, i2)
        c1 = Cast <to = 1> (g1)
        c2 = Cast <to = 1> (g2)
        y = Add (c1, c2)
    }""", {"i1": np.array(2, np.int64), "i2": np.array(2, np.int64)})
    out, rep = cse(m, input_shapes={"x": [2, 3, 5]})
    assert ops(out) == ["Shape", "Gather", "Cast", "Add"], ops(out)
    assert rep.passes[0].counts["merged-constants"] == 1


def test_different_weights_attributes_and_random_ops_stay(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y, float[N, 4, 8, 8] z, float[2] r, float[2] s) {
        y = Conv <pads = [1, 1, 1, 1]> (x, W1)
        z = Conv <pads = [1, 1, 1, 1]> (x, W2)
        r = RandomUniform <shape = [2]> ()
        s = RandomUniform <shape = [2]> ()
    }""", {"W1": (4, 3, 3, 3), "W2": (4, 3, 3, 3)})
    out = rewriter.rewrite(m, ["merge-duplicates"])[0]
    assert ops(out).count("Conv") == 2 and ops(out).count("RandomUniform") == 2


def test_graph_outputs_keep_their_tensors(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
        y = Relu (x)
        z = Relu (x)
    }""")
    out, rep = cse(m)
    assert [o.name for o in out.graph.output] == ["y", "z"] and ops(out).count("Relu") == 2
    # One of the two a graph output: that node stays, the other's readers read it (the
    # earlier node was kept and the later one skipped, so neither merged).
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
        a = Relu (x)
        y = Neg (a)
        z = Relu (x)
    }""")
    out, rep = cse(m)
    assert ops(out) == ["Relu", "Neg"] and rep.passes[0].counts["merged-nodes"] == 1
    assert [o.name for o in out.graph.output] == ["y", "z"]
    assert [n.input[0] for n in out.graph.node if n.op_type == "Neg"] == ["z"]
    onnx.checker.check_model(out, full_check=True)


def test_inside_an_if_body(rng):
    then = onnx.helper.make_graph(
        [onnx.helper.make_node("Mul", ["x", "k1"], ["a"]),
         onnx.helper.make_node("Mul", ["x", "k2"], ["b"]),
         onnx.helper.make_node("Add", ["a", "b"], ["o1"])], "then", [],
        [onnx.helper.make_tensor_value_info("o1", 1, [2])],
        [onnx.numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "k1"),
         onnx.numpy_helper.from_array(np.array([2.0, 3.0], np.float32), "k2")])
    other = onnx.helper.make_graph([onnx.helper.make_node("Neg", ["x"], ["o2"])], "else", [],
                                   [onnx.helper.make_tensor_value_info("o2", 1, [2])])
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "m",
        [onnx.helper.make_tensor_value_info("x", 1, [2]),
         onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("y", 1, [2])])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    out, rep = cse(m, inputs={"x": np.array([1.0, -2.0], np.float32), "c": np.array(True)})
    body = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in body.node] == ["Mul", "Add"]
    for c in (True, False):
        f = {"x": np.array([1.0, -2.0], np.float32), "c": np.array(c)}
        np.testing.assert_array_equal(run_ort(out, f)[0], run_ort(m, f)[0])


def test_idempotent(rng):
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 4, 8, 8] y) {
        a = Conv (x, W1)
        b = Conv (x, W2)
        y = Add (a, b)
    }""", {"W1": w, "W2": w.copy()})
    once, _ = cse(m)
    twice, rep = cse(once)
    assert not rep.passes[0].changed and ops(once) == ops(twice)
