"""sink-transposes: Transposes move down through elementwise ops and cancel or merge; the
values stay bit for bit; graph outputs keep their names; what cannot move says why."""

import numpy as np
import onnx
from conftest import make_model, ops, run_ort

import rewriter

HEAD = '<ir_version: 8, opset_import: ["" : 17]>'
TO_NCHW, TO_NHWC = "[0, 3, 1, 2]", "[0, 2, 3, 1]"


def st(m, passes=("sink-transposes",), **kw):
    return rewriter.rewrite(m, list(passes), verify=True, **kw)


def same(m, out, shapes, names=("x",), seed=0, exact=True):
    """Equal outputs; ``shapes`` holds one shape per run, or per run a dict by input."""
    r = np.random.default_rng(seed)
    for shape in shapes:
        each = shape if isinstance(shape, dict) else {n: shape for n in names}
        f = {n: r.standard_normal(s).astype(np.float32) for n, s in each.items()}
        for a, b in zip(run_ort(m, f), run_ort(out, f)):
            if exact:
                np.testing.assert_array_equal(a, b)
            else:
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def nhwc_block(c_in=3, c=4):
    """A TensorFlow-converted conv pair: NHWC between NCHW convs, BN as Mul/Add on [C] and
    [1, 1, 1, C] constants, two sites sharing the bias vector."""
    return make_model(f"""
    {HEAD}
    g (float[N, 6, 6, {c_in}] x) => (float[N, 6, 6, {c}] y) {{
        a = Transpose <perm = {TO_NCHW}> (x)
        c1 = Conv <pads = [1, 1, 1, 1]> (a, W1)
        t1 = Transpose <perm = {TO_NHWC}> (c1)
        b1 = Add (t1, bias)
        s1 = Mul (b1, scale)
        r1 = Relu (s1)
        u = Transpose <perm = {TO_NCHW}> (r1)
        c2 = Conv <pads = [1, 1, 1, 1]> (u, W2)
        t2 = Transpose <perm = {TO_NHWC}> (c2)
        b2 = Add (t2, bias)
        y = Clip (b2, lo, hi)
    }}""", {"W1": (c, c_in, 3, 3), "W2": (c, c, 3, 3), "bias": (c,), "scale": (1, 1, 1, c),
            "lo": np.array(-0.5, np.float32), "hi": np.array(1.5, np.float32)})


def test_nhwc_between_convs_cancels_and_the_bn_folds():
    m = nhwc_block()
    out, rep = st(m)
    c = rep.passes[0].counts
    assert c["cancelled"] == 1 and c["moved"] >= 4, c
    assert ops(out).count("Transpose") == 2, ops(out)   # the model's own NHWC in and out
    same(m, out, [(1, 6, 6, 3), (2, 6, 6, 3)])
    # With the default pipeline the per-channel Mul/Add go into the convs.
    full, _ = rewriter.rewrite(m, verify=True)
    assert ops(full) == ["Transpose", "Conv", "Relu", "Conv", "Clip", "Transpose"], ops(full)
    same(m, full, [(1, 6, 6, 3), (3, 6, 6, 3)], exact=False)


def test_a_residual_add_of_two_transposed_branches_keeps_one_transpose():
    """ResNet in NHWC: the block output feeds the next conv (a Transpose that cancels) and
    the skip Add, whose other input is transposed the same way: one Transpose is left,
    after the Add."""
    m = make_model(f"""
    {HEAD}
    g (float[N, 4, 5, 5] x, float[N, 4, 5, 5] v) => (float[N, 5, 5, 4] y, float[N, 4, 5, 5] z) {{
        t = Transpose <perm = {TO_NHWC}> (x)
        r = Relu (t)
        back = Transpose <perm = {TO_NCHW}> (r)
        z = Conv (back, W)
        tv = Transpose <perm = {TO_NHWC}> (v)
        y = Add (r, tv)
    }}""", {"W": (4, 4, 1, 1)})
    out, rep = st(m)
    assert ops(out).count("Transpose") == 1, ops(out)
    t = [n for n in out.graph.node if n.op_type == "Transpose"][0]
    assert list(t.output) == ["y"]   # the graph output keeps its name, written by the Transpose
    same(m, out, [(1, 4, 5, 5), (2, 4, 5, 5)], names=("x", "v"))


def test_what_cannot_move_stays_and_says_why():
    """Another input neither constant nor transposed the same way; a constant of higher rank
    than the perm; a Transpose whose output is a graph output; a Transpose read twice."""
    m = make_model(f"""
    {HEAD}
    g (float[2, 3, 4] x, float[2, 4, 3] w, float[2, 4, 3] v) => (float[2, 4, 3] a,
                                                              float[1, 2, 4, 3] b,
                                                              float[2, 4, 3] o,
                                                              float[2, 4, 3] d,
                                                              float[2, 4, 3] e) {{
        t1 = Transpose <perm = [0, 2, 1]> (x)
        a = Add (t1, w)
        t2 = Transpose <perm = [0, 2, 1]> (x)
        b = Mul (t2, big)
        o = Transpose <perm = [0, 2, 1]> (x)
        t4 = Transpose <perm = [0, 2, 1]> (x)
        d = Relu (t4)
        e = Sigmoid (t4)
    }}""", {"big": (1, 2, 4, 3)})
    out, rep = st(m)
    c = rep.passes[0].counts
    assert c["skip:other-input-not-transposed"] == 1 and c["skip:constant-rank"] == 1, c
    assert not rep.passes[0].changed
    same(m, out, [{"x": (2, 3, 4), "w": (2, 4, 3), "v": (2, 4, 3)}])


def test_casts_clips_and_scalars_move_and_values_stay_bit_exact():
    m = make_model(f"""
    {HEAD}
    g (float[N, 2, 3, 4] x) => (float[N, 2, 3, 4] y) {{
        t = Transpose <perm = {TO_NHWC}> (x)
        h = Cast <to = 10> (t)
        f = Cast <to = 1> (h)
        s = Sub (k, f)
        d = Div (s, per)
        c = Clip (d, lo, hi)
        y = Transpose <perm = {TO_NCHW}> (c)
    }}""", {"k": np.array(0.25, np.float32), "per": (3, 1, 2),
           "lo": np.array(-1.0, np.float32), "hi": np.array(1.0, np.float32)})
    out, rep = st(m)
    assert "Transpose" not in ops(out), ops(out)
    same(m, out, [(1, 2, 3, 4), (3, 2, 3, 4)])
    # The constant laid out anew: [3, 1, 2] read as NHWC's [1, 3, 1, 2] is NCHW's [1, 2, 3, 1].
    shapes = {t.name: list(t.dims) for t in out.graph.initializer}
    assert [1, 2, 3, 1] in shapes.values(), shapes


def test_inside_an_if_body_and_idempotent():
    body = f"""
        t = Transpose <perm = [1, 0]> (x)
        r = Relu (t)
        o = Transpose <perm = [1, 0]> (r)"""
    m = onnx.parser.parse_model(f"""
    {HEAD}
    g (bool c, float[3, 4] x) => (float[3, 4] y) {{
        y = If (c) <then_branch = g1 () => (float[3, 4] o) {{ {body} }},
                    else_branch = g2 () => (float[3, 4] o) {{ o = Neg (x) }}>
    }}""")
    out, rep = st(m, inputs={"c": np.array(True), "x": np.ones((3, 4), np.float32)})
    assert rep.passes[0].counts["cancelled"] == 1
    then = out.graph.node[0].attribute[0].g
    assert [n.op_type for n in then.node] == ["Relu"]
    again, rep2 = st(out, inputs={"c": np.array(True), "x": np.ones((3, 4), np.float32)})
    assert not rep2.passes[0].changed


def test_a_transpose_read_only_inside_a_body_stays():
    """A body reads outer tensors through the same tensor objects: its one reader, a Relu
    in the then-branch, is not this graph's, and moving the Transpose past it would leave
    the body reading a tensor nobody writes."""
    m = onnx.parser.parse_model(f"""
    {HEAD}
    g (bool c, float[3, 4] x) => (float[4, 3] y) {{
        t = Transpose <perm = [1, 0]> (x)
        y = If (c) <then_branch = g1 () => (float[4, 3] o) {{ o = Relu (t) }},
                    else_branch = g2 () => (float[4, 3] o) {{ o = Constant <value = float[4, 3]
                        {{0,0,0,0,0,0,0,0,0,0,0,0}}> () }}>
    }}""")
    feeds = {"c": np.array(True), "x": np.arange(12, dtype=np.float32).reshape(3, 4) - 5}
    out, rep = st(m, inputs=feeds)
    assert not rep.passes[0].changed
    np.testing.assert_array_equal(run_ort(m, feeds)[0], run_ort(out, feeds)[0])


def test_a_large_shared_constant_is_not_copied():
    """Moving past a Mul by a constant as large as the tensor, which another node reads
    too, would store a transposed copy of it (65,792 values here): the Transpose stays,
    and says why."""
    m = make_model(f"""
    {HEAD}
    g (float[1, 256, 257] x) => (float[1, 256, 257] y, float[1, 257, 256] z) {{
        t = Transpose <perm = [0, 2, 1]> (x)
        s = Mul (t, big)
        y = Transpose <perm = [0, 2, 1]> (s)
        z = Add (big, big)
    }}""", {"big": (1, 257, 256)})
    out, rep = st(m)
    assert rep.passes[0].counts["skip:constant-too-large"] == 1
    assert ops(out) == ["Transpose", "Mul", "Transpose", "Add"]


def test_a_large_constant_read_once_is_laid_out_anew(rng):
    """tf2onnx's Keras PReLU with a slope per position: Relu(-x) in NCHW -> Transpose to
    NHWC -> Mul by alpha [H, W, C] -> Transpose back. alpha (65,792 values) is read by
    that Mul alone, so it is replaced by its NCHW layout, not copied: the pair cancels
    (megnet: 34 -> 3 Transposes), the model no bigger, the values bit-identical."""
    m = make_model(f"""
    {HEAD}
    g (float[N, 257, 16, 16] x) => (float[N, 257, 16, 16] y) {{
        n = Neg (x)
        r = Relu (n)
        t = Transpose <perm = [0, 2, 3, 1]> (r)
        s = Mul (t, alpha)
        b = Transpose <perm = [0, 3, 1, 2]> (s)
        y = Add (x, b)
    }}""", {"alpha": (16, 16, 257)})
    out, rep = st(m)
    assert rep.passes[0].counts.get("cancelled") == 1, rep.passes[0].counts
    assert ops(out) == ["Neg", "Relu", "Mul", "Add"]
    sizes = [t.dims for t in out.graph.initializer]
    assert sizes == [[1, 257, 16, 16]]                     # replaced, not added
    feeds = {"x": rng.standard_normal((2, 257, 16, 16)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(m, feeds)[0], run_ort(out, feeds)[0])


def madmom_block(opset: int):
    """madmom's converter: each conv of a [T, F] spectrogram between an Unsqueeze and a
    Squeeze of the batch, in NHWC, BN as Mul/Add, Elu, and a Pad before the next conv;
    axes as attributes before opset 13, as inputs after; pads as an input from opset 11."""
    axes = "" if opset >= 13 else "<axes = [0]> "
    ax_in = ", ax" if opset >= 13 else ""
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[T, F, 1] x) => (float[1, 4, Tp, Fp] y) {{
        u0 = Unsqueeze {axes}(x{ax_in})
        a = Transpose <perm = {TO_NCHW}> (u0)
        c1 = Conv (a, W1)
        t1 = Transpose <perm = {TO_NHWC}> (c1)
        s1 = Squeeze {axes}(t1{ax_in})
        m1 = Mul (s1, scale)
        b1 = Add (m1, bias)
        e1 = Elu (b1)
        p1 = Pad (e1, pads)
        u1 = Unsqueeze {axes}(p1{ax_in})
        t2 = Transpose <perm = {TO_NCHW}> (u1)
        y = Conv (t2, W2)
    }}""", {"W1": (4, 1, 3, 3), "W2": (4, 4, 3, 3), "scale": (4,), "bias": (1, 4),
            "pads": np.array([1, 0, 0, 1, 0, 0], np.int64), "ax": np.array([0], np.int64)})


def test_through_squeeze_pad_and_unsqueeze_as_madmom_writes_them():
    """madmom's key CNN: 24 Transposes, onnxruntime basic 2, we 24 (a Squeeze, Pad or
    Unsqueeze stopped them). They move through those now, axes and pads renumbered, and
    the pair around each conv's epilogue cancels: bit-exact, at opset 11 and 17."""
    for opset in (11, 17):
        m = madmom_block(opset)
        out, rep = st(m, input_shapes={"x": [5, 6, 1]})
        assert ops(out).count("Transpose") == 1, (opset, ops(out))   # only the input's
        assert rep.passes[0].counts["cancelled"] == 1, rep.passes[0].counts
        same(m, out, [(5, 6, 1), (9, 7, 1)])


def test_layout_moves_renumber_axes_and_pads():
    """Each move on its own, against onnxruntime: a Squeeze of two axes given negative, an
    Unsqueeze of two new axes, a Pad in reflect mode, with perms that are not NHWC."""
    m = make_model(f"""
    {HEAD}
    g (float[2, 1, 5, 1, 3] x) => (float[3, 1, 1, 7, 2] y) {{
        t = Transpose <perm = [3, 2, 4, 1, 0]> (x)
        s = Squeeze (t, sq)
        p = Pad <mode = "reflect"> (s, pads)
        u = Unsqueeze (p, us)
        y = Transpose <perm = [4, 0, 1, 3, 2]> (u)
    }}""", {"sq": np.array([-2, 0], np.int64), "pads": np.array([1, 0, 0, 1, 0, 0], np.int64),
            "us": np.array([1, 4], np.int64)})
    out, rep = st(m)
    assert rep.passes[0].counts["moved"] == 3, rep.passes[0].counts
    same(m, out, [(2, 1, 5, 1, 3)])


def test_a_squeeze_without_axes_and_a_pad_with_axes_stay():
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[1, 4, 1, 3] x) => (float[4, 3] y, float[3, 6, 1, 1] z) {
        t = Transpose <perm = [2, 3, 0, 1]> (x)
        y = Squeeze (t)
        t2 = Transpose <perm = [3, 1, 2, 0]> (x)
        z = Pad (t2, pads, zero, axes)
    }""", {"pads": np.array([1, 1], np.int64), "zero": np.array(0.0, np.float32),
           "axes": np.array([1], np.int64)})
    out, rep = st(m)
    c = rep.passes[0].counts
    assert c["skip:axes-not-constant"] == 1 and c["skip:pad-not-constant"] == 1, c
    assert ops(out).count("Transpose") == 2


def hswish_se(c=4, reduce_axes="axes = [1, 2]", keepdims=1):
    """tf2onnx's MobileNetV3 block on the NHWC view of a conv's output: HardSwish as
    x * relu6(x + 3) / 6 (the Transpose read twice), then squeeze-excite (ReduceMean over
    H, W -> NCHW conv -> HardSigmoid -> back to NHWC, Mul with the block's tensor: read
    twice again), at two sites with different weights; symbolic N."""
    gate = f"Transpose <perm = {TO_NHWC}>" if keepdims else "Unsqueeze"

    def site(k, x):
        return f"""
        c{k} = Conv <pads = [1, 1, 1, 1]> ({x}, W{k})
        t{k} = Transpose <perm = {TO_NHWC}> (c{k})
        a{k} = Add (t{k}, three)
        r{k} = Clip (a{k}, zero, six)
        d{k} = Mul (r{k}, sixth)
        h{k} = Mul (t{k}, d{k})
        m{k} = ReduceMean <{reduce_axes}, keepdims = {keepdims}> (h{k})
        mt{k} = Transpose <perm = {TO_NCHW if keepdims else "[0, 1]"}> (m{k})
        f{k} = {"Conv" if keepdims else "Gemm <transB = 1>"} (mt{k}, S{k})
        gt{k} = HardSigmoid (f{k})
        gn{k} = {gate} (gt{k}{"" if keepdims else ", hw"})
        o{k} = Mul (h{k}, gn{k})
        u{k} = Transpose <perm = {TO_NCHW}> (o{k})"""
    return make_model(f"""
    {HEAD}
    g (float[N, {c}, 6, 6] x) => (float[N, {c}, 6, 6] u2) {{{site(1, "x")}{site(2, "u1")}
    }}""", {"W1": (c, c, 3, 3), "W2": (c, c, 3, 3),
            **({"S1": (c, c, 1, 1), "S2": (c, c, 1, 1)} if keepdims else
               {"S1": (c, c), "S2": (c, c), "hw": np.array([1, 2], np.int64)}),
            "three": np.array(3, np.float32), "zero": np.array(0, np.float32),
            "six": np.array(6, np.float32), "sixth": np.array(1 / 6, np.float32)})


def test_a_transpose_read_by_several_elementwise_branches_is_split_and_cancels():
    """tf2onnx's MobileNetV3 kept 57 of its 108 Transposes (251 nodes, onnxruntime's
    basic optimizer 202): the HardSwish and squeeze-excite Transposes have two readers,
    and a Transpose moved past one reader only; ReduceMean did not take one at all. Each
    is now one per reader, they meet again at the join, and the SE pooling takes it with
    its axes renumbered: no Transpose is left."""
    m = hswish_se()
    out, rep = st(m)
    c = rep.passes[0].counts
    assert c.get("split", 0) >= 2 and "Transpose" not in ops(out), (c, ops(out))
    same(m, out, [(1, 4, 6, 6), (3, 4, 6, 6)], exact=False)   # the mean sums in NCHW order


def test_reductions_without_keepdims_take_the_transpose_as_a_squeeze_would():
    m = hswish_se(keepdims=0)
    out, rep = st(m)
    assert ops(out).count("Transpose") < ops(m).count("Transpose"), ops(out)
    same(m, out, [(1, 4, 6, 6), (2, 4, 6, 6)], exact=False)


def test_a_split_that_would_leave_more_nodes_is_not_kept():
    """A Transpose read by an Add whose output goes to a Reshape (no further) and by a
    Mul with an input that is not transposed: splitting it moves one copy past the Add and
    leaves both, a node more. Nothing changes."""
    m = make_model(f"""
    {HEAD}
    g (float[2, 4, 3, 3] x, float[2, 3, 3, 4] v) => (float[2, 36] y, float[2, 3, 3, 4] z) {{
        t = Transpose <perm = {TO_NHWC}> (x)
        a = Add (t, one)
        y = Reshape (a, s)
        z = Mul (t, v)
    }}""", {"one": np.array(1, np.float32), "s": np.array([2, 36], np.int64)})
    out, rep = st(m)
    assert rep.passes[0].counts.get("split") is None, rep.passes[0].counts
    assert sorted(ops(out)) == sorted(ops(m)), ops(out)
    same(m, out, [{"x": (2, 4, 3, 3), "v": (2, 3, 3, 4)}])


def test_a_reader_that_reads_the_transpose_twice_is_one_reader():
    """LayerNorm's variance, d * d on the NHWC view (tf2onnx's ConvNeXt): Mul(t, t) read
    the Transpose twice, so its copy had two readers and was split again, forever (the
    rewrite hung). One reader, which takes the Transpose with both its inputs."""
    m = make_model(f"""
    {HEAD}
    g (float[N, 4, 3, 3] x) => (float[N, 4, 3, 3] y) {{
        t = Transpose <perm = {TO_NHWC}> (x)
        s = Mul (t, t)
        a = Add (t, s)
        y = Transpose <perm = {TO_NCHW}> (a)
    }}""")
    out, rep = st(m)
    assert "Transpose" not in ops(out), ops(out)
    same(m, out, [(1, 4, 3, 3), (2, 4, 3, 3)])


def test_a_reduction_over_every_axis_takes_the_transpose_without_one_after():
    """ReduceMax over every axis without keepdims (a global max, a scalar): the Transpose
    left after it would have perm [], no attribute at all (the pass crashed writing it, an
    internal error). The reduction reads the input; no Transpose is left."""
    m = make_model(f"""
    {HEAD}
    g (float[N, 4, 3, 5] x) => (float y) {{
        t = Transpose <perm = {TO_NHWC}> (x)
        y = ReduceMax <axes = [0, 1, 2, 3], keepdims = 0> (t)
    }}""")
    out, rep = st(m)
    assert ops(out) == ["ReduceMax"], ops(out)
    same(m, out, [(1, 4, 3, 5), (2, 4, 3, 5)])


def test_a_transpose_sinks_through_a_long_chain_in_one_round(monkeypatch):
    """A Transpose moved past a node is a new one at the end of the node list, which the
    round's snapshot did not hold: sinking through n nodes took n rounds over the whole
    graph (quadratic: 1,000 HardSwish blocks, 5,000 nodes, 31 s where the same model
    took 0.3 s before the split, tried and then kept, had to carry the first Transpose
    to the last). The moved Transpose is taken in the same round: a few looks per node."""
    from rewriter.passes import sink_transposes as st_mod

    n = 300
    body = "\n".join(f"r{i} = {'Relu' if i % 2 else 'Neg'} (r{i - 1})" for i in range(1, n))
    m = make_model(f"""
    {HEAD}
    g (float[1, 4, 3, 3] x) => (float[1, 4, 3, 3] y) {{
        t = Transpose <perm = {TO_NHWC}> (x)
        r0 = Relu (t)
        {body}
        y = Transpose <perm = {TO_NCHW}> (r{n - 1})
    }}""")
    calls = []
    sink = st_mod._sink
    monkeypatch.setattr(st_mod, "_sink", lambda *a, **k: calls.append(1) or sink(*a, **k))
    out, rep = st(m)
    assert "Transpose" not in ops(out), ops(out)
    assert len(calls) < 10 * n, len(calls)   # n rounds over n nodes before: ~n * n / 2
    same(m, out, [(1, 4, 3, 3)])


def test_through_a_reshape_of_attention_heads_as_torchscript_writes_them():
    """ViT's keys from TorchScript: [T, 3N, 4] -> Transpose(1, 0, 2) -> Reshape([-1, 3, T, 4])
    -> Mul(scale) -> Transpose(0, 1, 3, 2): the Reshape acts on the input (its 3N split in
    place) and one Transpose is left. A Reshape whose group comes from dims out of order
    stays."""
    m = make_model(HEAD + """
    g (float[5, M, 4] x, float[2, 3, 4] u) => (float[N, 3, 4, 5] y, float[4, 6] v,
                                                  float[3, 8] w) {
        a = Reshape (x, s)
        b = Transpose <perm = [1, 0, 2]> (a)
        c = Reshape (b, heads)
        d = Mul (c, scale)
        y = Transpose <perm = [0, 1, 3, 2]> (d)
        e = Transpose <perm = [2, 0, 1]> (u)
        v = Reshape (e, s64)
        f = Transpose <perm = [1, 0, 2]> (u)
        w = Reshape (f, s38)
    }""", {"s": np.array([5, -1, 4]), "heads": np.array([-1, 3, 5, 4]),
           "scale": np.array([0.5], np.float32), "s64": np.array([4, 6]),
           "s38": np.array([3, 8])})
    r = np.random.default_rng(0)
    feeds = {"x": r.standard_normal((5, 6, 4)).astype(np.float32),
             "u": r.standard_normal((2, 3, 4)).astype(np.float32)}
    out, rep = st(m, passes=("sink-transposes", "collapse-chains"), inputs=feeds)
    assert rep.passes[0].counts["moved"] >= 3
    assert sorted(ops(out)) == ["Mul", "Reshape", "Reshape", "Reshape", "Transpose",
                                "Transpose", "Transpose"]
    perms = {n.output[0]: list(n.attribute[0].ints) for n in out.graph.node
             if n.op_type == "Transpose"}
    assert perms == {"y": [1, 2, 3, 0], "v": [1, 0], "f": [1, 0, 2]}
    same(m, out, [{"x": (5, 6, 4), "u": (2, 3, 4)}, {"x": (5, 12, 4), "u": (2, 3, 4)}])
