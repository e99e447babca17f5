"""expand-contrib: every handled com.microsoft op against onnxruntime's own kernel (graph
optimisations off), the skip reasons, subgraphs, idempotence, and models that onnxruntime's
extended optimiser wrote itself."""

import numpy as np
import onnx
import pytest
from conftest import ROOT, make_model, ops, run_ort
from rewriter.passes.expand_contrib import ExpandContrib

import rewriter
from rewriter.core.convert import to_graph, to_model
from rewriter.core.graph import Namer, graph_protos
from rewriter.core.manager import cleanup
from rewriter.core.pass_base import Context, Options

TOL = 1e-5
# MIGraphX before 2.10 parses none of the contrib ops: everything handled is expanded. The
# default (2.15/2.16, or no version) keeps the ones it parses: test_kept_where_migraphx_parses.
OLD_MIGRAPHX = {"migraphx_version": (2, 9)}


def rewrite(m, passes, **kw):
    kw["options"] = {**OLD_MIGRAPHX, **kw.get("options", {})}
    return rewriter.rewrite(m, passes, **kw)


def head(opset=17):
    return f'<ir_version: 8, opset_import: ["" : {opset}, "com.microsoft" : 1]>'


def expand(m, **kw):
    return rewrite(m, ["expand-contrib"], verify=True, **kw)


def contrib_nodes(m):
    return [n.op_type for g in graph_protos(m.graph) for n in g.node if n.domain]


def feeds(seed=0, **shapes):
    rng = np.random.default_rng(seed)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def check(m, out, f, tol=TOL):
    """Expanded == onnxruntime's contrib kernels, output by output; structure is clean."""
    assert not contrib_nodes(out), contrib_nodes(out)
    onnx.checker.check_model(out, full_check=True)
    assert [o.name for o in out.graph.output] == [o.name for o in m.graph.output]
    for r, o in zip(run_ort(m, f), run_ort(out, f)):
        assert r.shape == o.shape
        np.testing.assert_allclose(o, r, rtol=tol, atol=tol)


ACTS = [("Relu", ""), ("Tanh", ""), ("Sigmoid", ""),
        ("LeakyRelu", ", activation_params = [0.2]"),
        ("Clip", ", activation_params = [-0.5, 0.7]"),
        ("HardSigmoid", ", activation_params = [0.3, 0.4]")]


@pytest.mark.parametrize("act,params", ACTS)
def test_fused_conv_activations_sum_input_and_shared_weight(act, params):
    # Two sites read one W; the second adds the first's output as Z (before the activation).
    attrs = f'activation = "{act}"{params}, pads = [1, 1, 1, 1]'
    m = make_model(f"""
    {head()}
    g (float[N, 4, 8, 8] x) => (float[N, 4, 8, 8] y1, float[N, 4, 8, 8] y2) {{
        y1 = com.microsoft.FusedConv <{attrs}> (x, W, B)
        y2 = com.microsoft.FusedConv <{attrs}> (x, W, B2, y1)
    }}""", {"W": (4, 4, 3, 3), "B": (4,), "B2": (4,)})
    out, rep = expand(m)
    assert ops(out) == ["Conv", act, "Conv", "Add", act]
    assert rep.passes[0].counts["expanded:FusedConv"] == 2
    assert out.graph.node[0].input[1] == out.graph.node[2].input[1] == "W"
    check(m, out, feeds(x=(2, 4, 8, 8)))


def test_fused_conv_silu_against_numpy():
    # Newer onnxruntime kernels take Silu (MLAS x * sigmoid(x)); 1.32's CPU FusedConv refuses
    # it, so the reference is the plain FusedConv and numpy.
    text = f"""
    {head()}
    g (float[N, 4, 8, 8] x) => (float[N, 4, 8, 8] y) {{
        y = com.microsoft.FusedConv <activation = "Silu", pads = [1, 1, 1, 1]> (x, W, B)
    }}"""
    m = make_model(text, {"W": (4, 4, 3, 3), "B": (4,)})
    out, _ = rewrite(m, ["expand-contrib"])
    assert ops(out) == ["Conv", "Sigmoid", "Mul"]
    f = feeds(x=(2, 4, 8, 8))
    c = run_ort(make_model(text.replace('activation = "Silu", ', ""),
                           {"W": (4, 4, 3, 3), "B": (4,)}), f)[0]
    np.testing.assert_allclose(run_ort(out, f)[0], c / (1 + np.exp(-c)), rtol=TOL, atol=TOL)


def test_fused_conv_plain_keeps_name_and_clip_below_opset_11():
    m = make_model(f"""
    {head(10)}
    g (float[N, 3, 6, 6] x) => (float[N, 4, 6, 6] y, float[N, 4, 4, 4] z) {{
        y = com.microsoft.FusedConv <pads = [1, 1, 1, 1]> (x, W)
        z = com.microsoft.FusedConv <activation = "Clip", activation_params = [0.0, 6.0]> (x, W2)
    }}""", {"W": (4, 3, 3, 3), "W2": (4, 3, 3, 3)})
    m.graph.node[0].name = "stem"
    out, _ = expand(m)
    assert ops(out) == ["Conv", "Conv", "Clip"]
    assert out.graph.node[0].name == "stem" and out.graph.node[0].output == ["y"]
    clip = out.graph.node[2]
    assert len(clip.input) == 1 and {a.name for a in clip.attribute} == {"min", "max"}
    check(m, out, feeds(x=(2, 3, 6, 6)))


@pytest.mark.parametrize("act,attrs", [
    ("Relu", ""), ("LeakyRelu", ", activation_alpha = 0.15"),
    ("HardSigmoid", ", activation_alpha = 0.3, activation_beta = 0.45"),
    ("Elu", ", activation_alpha = 0.7"), ("Softplus", "")])
def test_fused_gemm(act, attrs):
    # (onnxruntime's FusedGemm kernel refuses an empty activation: always one here.)
    attrs = f'activation = "{act}"{attrs}, alpha = 0.5, beta = 2.0, transB = 1'
    m = make_model(f"""
    {head()}
    g (float[N, 8] a) => (float[N, 6] y) {{
        y = com.microsoft.FusedGemm <{attrs}> (a, W, C)
    }}""", {"W": (6, 8), "C": (6,)})
    out, _ = expand(m)
    assert ops(out) == ["Gemm", act]
    check(m, out, feeds(a=(3, 8)))


def test_fused_gemm_without_c_below_opset_11_gets_a_zero_c():
    m = make_model(f"""
    {head(9)}
    g (float[N, 8] a) => (float[N, 6] y) {{
        y = com.microsoft.FusedGemm <activation = "Tanh"> (a, W)
    }}""", {"W": (8, 6)})
    out, _ = expand(m)
    assert ops(out) == ["Gemm", "Tanh"] and len(out.graph.node[0].input) == 3
    check(m, out, feeds(a=(3, 8)))


def _perm(r, trans, batch):
    p = list(range(1, r - 1)) + [0, r - 1] if batch else list(range(r))
    if trans:
        p[-2], p[-1] = p[-1], p[-2]
    return p


@pytest.mark.parametrize("ta,tb,tba,tbb,alpha", [
    (0, 0, 0, 0, 1.0), (0, 1, 0, 0, 0.125), (1, 0, 0, 0, 2.0), (0, 0, 1, 0, 1.0),
    (1, 1, 1, 1, 0.5), (0, 1, 0, 1, 3.0)])
def test_fused_matmul_transposes_and_alpha(ta, tb, tba, tbb, alpha):
    # Logical shapes A [2, 3, 4, 5] @ B [2, 3, 5, 6]; stored as the attributes say.
    a_shape = tuple(np.array([2, 3, 4, 5])[np.argsort(_perm(4, ta, tba))])
    b_shape = tuple(int(d) for d in np.array([2, 3, 5, 6])[np.argsort(_perm(4, tb, tbb))])
    # The symbolic batch dim N only where the stored first axis is a batch axis.
    dims = ", ".join([str(a_shape[0]) if tba else "N"] + [str(d) for d in a_shape[1:]])
    attrs = (f"transA = {ta}, transB = {tb}, transBatchA = {tba}, transBatchB = {tbb}, "
             f"alpha = {alpha}")
    b_dims = ", ".join(map(str, b_shape))
    m = make_model(f"""
    {head()}
    g (float[{dims}] a, float[{b_dims}] v) => (float[N, 3, 4, 6] y, float[N, 3, 4, 6] z) {{
        y = com.microsoft.FusedMatMul <{attrs}> (a, W)
        z = com.microsoft.FusedMatMul <{attrs}> (a, v)
    }}""", {"W": b_shape})
    out, rep = expand(m)
    assert rep.passes[0].counts["expanded:FusedMatMul"] == 2
    assert ops(out).count("MatMul") == 2 and ops(out).count("Mul") == (alpha != 1.0) * 2
    # The constant B is transposed once, at rewrite time; the variable one gets a node.
    assert ops(out).count("Transpose") == (ta or tba) * 2 + (tb or tbb)
    f = feeds(a=a_shape, v=b_shape)
    check(m, out, f)


def test_gelu_family_chained_dtype_found_through_contrib_producers():
    # Shape inference stops at the first contrib op: every later dtype is found by walking up.
    m = make_model(f"""
    {head()}
    g (float[N, 4, 16] x) => (float[N, 4, 16] y, float[N, 4, 16] q) {{
        h = MatMul (x, M)
        a = com.microsoft.BiasGelu (h, b)
        c = com.microsoft.FastGelu (a, b2)
        d = com.microsoft.FastGelu (c)
        e = Add (d, x)
        f = com.microsoft.Gelu (e)
        y = com.microsoft.QuickGelu (f)
        q = com.microsoft.QuickGelu <alpha = 1.0> (f)
    }}""", {"M": (16, 16), "b": (16,), "b2": (16,)})
    out, rep = expand(m)
    c = rep.passes[0].counts
    assert (c["expanded:BiasGelu"], c["expanded:FastGelu"], c["expanded:Gelu"],
            c["expanded:QuickGelu"]) == (1, 2, 1, 2)
    assert "Erf" in ops(out) and "Tanh" in ops(out)
    check(m, out, feeds(x=(2, 4, 16)))


KEPT = f"""
    {head()}
    g (float[N, 4, 16] x, float[4, 16] s, float[N, 4, 16] t) => (float[N, 4, 16] y,
                                                                 float[N, 4, 16] z,
                                                                 float[N, 4, 16] w) {{
        h = MatMul (x, M)
        a = com.microsoft.BiasGelu (h, b)
        c = com.microsoft.FastGelu (a, b2)
        d = com.microsoft.Gelu (c)
        e = com.microsoft.QuickGelu (d)
        y = com.microsoft.SkipLayerNormalization <epsilon = 0.001> (e, s, G, Bt, b)
        z = com.microsoft.SkipSimplifiedLayerNormalization <epsilon = 0.001> (d, t, G)
        w = com.microsoft.SkipSimplifiedLayerNormalization <epsilon = 0.001> (d, s, G)
    }}"""
KEPT_INITS = {"M": (16, 16), "b": (16,), "b2": (16,), "G": ("pos", (16,)), "Bt": (16,)}


def test_kept_where_migraphx_parses():
    """MIGraphX 2.15/2.16 parse the GELUs and both skip layer norms (and compute them within
    FP32 tolerances: tests/test_migraphx_models.py): by default they stay, exact, each
    counted with the reason. Expanded: QuickGelu (MIGraphX needs its alpha) and a
    simplified norm whose skip is 2-D (its parser wants the input's rank). A target MIGraphX
    that predates an op gets it expanded: 2.12 has all but SkipLayerNormalization."""
    m = make_model(KEPT, KEPT_INITS)
    every = {"BiasGelu": 1, "FastGelu": 1, "Gelu": 1, "SkipLayerNormalization": 1,
             "SkipSimplifiedLayerNormalization": 1}
    for options, expanded in ((None, {}), ({"migraphx_version": (2, 16)}, {}),
                              ({"migraphx_version": (2, 12)}, {"SkipLayerNormalization": 1})):
        out, rep = rewriter.rewrite(m, ["expand-contrib"], verify=True, options=options)
        c = rep.passes[0].counts
        assert {k.split(":")[1]: v for k, v in c.items() if k.startswith("expanded:")} == {
            "QuickGelu": 1, "SkipSimplifiedLayerNormalization": 1, **expanded}, c
        kept = {k: v for k, v in every.items() if k not in expanded}
        assert {k.split(":")[2]: v for k, v in c.items() if "parsed-by-migraphx" in k} == kept
        assert sorted(contrib_nodes(out)) == sorted(kept)
        f = feeds(x=(2, 4, 16), s=(4, 16), t=(2, 4, 16))
        for a, b in zip(run_ort(m, f), run_ort(out, f)):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("beta,bias,sum_out", [(True, True, True), (False, False, False),
                                               (True, False, True), (False, True, False)])
def test_skip_layer_norm(opset, beta, bias, sum_out):
    ins = "x, s, G" + (", Bt" if beta else (", " if bias else "")) + (", Bs" if bias else "")
    outs = "y, , , t" if sum_out else "y"   # output 3: input + skip + bias
    extra = ", float[N, 4, 16] t" if sum_out else ""
    m = make_model(f"""
    {head(opset)}
    g (float[N, 4, 16] x, float[4, 16] s) => (float[N, 4, 16] y{extra}) {{
        {outs} = com.microsoft.SkipLayerNormalization <epsilon = 0.001> ({ins})
    }}""", {"G": ("pos", (16,)), "Bt": (16,), "Bs": (16,)})
    out, _ = expand(m)
    assert ("LayerNormalization" in ops(out)) == (opset >= 17)
    if opset < 17:
        assert ops(out).count("ReduceMean") == 2 and "Pow" in ops(out)
    check(m, out, feeds(x=(2, 4, 16), s=(4, 16)))


@pytest.mark.parametrize("opset", [13, 18])
def test_skip_simplified_layer_norm_two_sites_share_gamma(opset):
    m = make_model(f"""
    {head(opset)}
    g (float[N, 4, 16] x, float[N, 4, 16] s) => (float[N, 4, 16] y, float[N, 4, 16] z) {{
        y = com.microsoft.SkipSimplifiedLayerNormalization <epsilon = 0.0001> (x, s, G)
        z = com.microsoft.SkipSimplifiedLayerNormalization <epsilon = 0.0001> (y, s, G, Bs)
    }}""", {"G": ("pos", (16,)), "Bs": (16,)})
    out, _ = expand(m)
    assert "ReduceMean" in ops(out) and "Sub" not in ops(out)
    check(m, out, feeds(x=(2, 4, 16), s=(2, 4, 16)))


def run_pass(m):
    """The pass on its own: a default-domain LayerNormalization below opset 17 is
    onnxruntime's private schema, which onnx.checker refuses (loading checks it as a custom
    op: tests/test_ort_tool_forms.py)."""
    graph = to_graph(m)
    res = ExpandContrib().run(graph, Context(namer=Namer(graph), options=Options(**OLD_MIGRAPHX)))
    cleanup(graph)
    return to_model(graph, m), res


@pytest.mark.parametrize("op,axis", [("LayerNormalization", -1), ("LayerNormalization", 1),
                                     ("SimplifiedLayerNormalization", -1)])
def test_onnxruntime_schema_layer_norm_below_opset_17(op, axis):
    bias = ", Bt" if op == "LayerNormalization" else ""
    shape = "4, 16" if axis == 1 else "16"
    m = onnx.parser.parse_model(f"""
    {head(13)}
    g (float[N, 4, 16] x) => (float[N, 4, 16] y) {{
        y = {op} <axis = {axis}, epsilon = 0.001> (x, G{bias})
    }}""")
    rng = np.random.default_rng(3)
    for name in ("G", "Bt"):
        dims = [int(d) for d in shape.split(", ")]
        m.graph.initializer.append(onnx.numpy_helper.from_array(
            rng.standard_normal(dims).astype(np.float32), name))
    out, res = run_pass(m)
    assert res.counts[f"expanded:{op}"] == 1 and op not in ops(out)
    onnx.checker.check_model(out, full_check=True)
    f = feeds(x=(2, 4, 16))
    np.testing.assert_allclose(run_ort(out, f)[0], run_ort(m, f)[0], rtol=TOL, atol=TOL)


def test_layer_norm_in_the_microsoft_domain():
    # onnxruntime has no com.microsoft LayerNormalization kernel: the reference is its
    # default-domain twin.
    text = f"""
    {head()}
    g (float[N, 4, 16] x) => (float[N, 4, 16] y) {{
        y = com.microsoft.LayerNormalization <epsilon = 0.001> (x, G, Bt)
    }}"""
    m = make_model(text, {"G": (16,), "Bt": (16,)})
    out, _ = rewrite(m, ["expand-contrib"])
    assert ops(out) == ["LayerNormalization"] and not contrib_nodes(out)
    twin = make_model(text.replace("com.microsoft.", ""), {"G": (16,), "Bt": (16,)})
    f = feeds(x=(2, 4, 16))
    np.testing.assert_array_equal(run_ort(out, f)[0], run_ort(twin, f)[0])


def test_bias_add_against_numpy():
    # onnxruntime has BiasAdd on CUDA only: the spec's (x + bias) + skip, in numpy.
    m = make_model(f"""
    {head()}
    g (float[N, 4, 16] x, float[N, 4, 16] s) => (float[N, 4, 16] y) {{
        y = com.microsoft.BiasAdd (x, B, s)
    }}""", {"B": (16,)})
    out, _ = rewrite(m, ["expand-contrib"])
    assert ops(out) == ["Add", "Add"]
    f = feeds(x=(2, 4, 16), s=(2, 4, 16))
    b = onnx.numpy_helper.to_array(m.graph.initializer[0])
    np.testing.assert_array_equal(run_ort(out, f)[0], (f["x"] + b) + f["s"])


def test_nhwc_max_pool_uint8():
    m = make_model(f"""
    {head(13)}
    g (uint8[N, 9, 9, 3] x) => (uint8[N, 4, 4, 3] y) {{
        y = com.microsoft.NhwcMaxPool <kernel_shape = [3, 3], strides = [2, 2]> (x)
    }}""")
    out, _ = expand(m, inputs={"x": np.random.default_rng(0).integers(0, 255, (2, 9, 9, 3),
                                                                      dtype=np.uint8)})
    assert ops(out) == ["Transpose", "MaxPool", "Transpose"]
    f = {"x": np.random.default_rng(1).integers(0, 255, (2, 9, 9, 3), dtype=np.uint8)}
    np.testing.assert_array_equal(run_ort(out, f)[0], run_ort(m, f)[0])


SKIPS = [
    ("unsupported-contrib:Inverse", "y = com.microsoft.Inverse (x)", 17),
    ("unknown-rank:FusedMatMul",
     "i = com.microsoft.Inverse (x)\ny = com.microsoft.FusedMatMul <transA = 1> (i, x)", 17),
    ("unknown-dtype:Gelu",
     "i = com.microsoft.Inverse (x)\nj = com.microsoft.Gelu (i)\ny = Identity (j)", 17),
    ("transpose-below-rank-2:FusedMatMul",
     ("r = ReduceMean <axes = [0], keepdims = 0> (x)\n"
      "y = com.microsoft.FusedMatMul <transB = 1> (x, r)"), 17),
    ("op-needs-higher-opset:Gelu", "y = com.microsoft.Gelu (x)", 8),
    ("unsupported-activation:FusedConv",
     'y = com.microsoft.FusedConv <activation = "Mish"> (x, W)', 17),
    ("activation-params-count:FusedConv",
     'y = com.microsoft.FusedConv <activation = "LeakyRelu"> (x, W)', 17),
    ("clip-without-bounds:FusedGemm",
     'y = com.microsoft.FusedGemm <activation = "Clip", activation_min = 0.0> (x, W)', 17),
    ("layernorm-statistics-used:SkipLayerNormalization",
     "y, m = com.microsoft.SkipLayerNormalization (x, x, G)", 17),
    ("float16-layernorm-below-opset-17:SkipLayerNormalization",
     ("h = Cast <to = 10> (x)\nk = com.microsoft.SkipLayerNormalization (h, h, H)\n"
      "y = Cast <to = 1> (k)"), 13),
]


@pytest.mark.parametrize("reason,body,opset", SKIPS, ids=[s[0] for s in SKIPS])
def test_skip_reasons(reason, body, opset):
    outs = "float y, float m" if "y, m" in body else "float y"
    m = make_model(f"""
    {head(opset)}
    g (float[2, 2] x) => ({outs}) {{
        {body}
    }}""", {"W": (2, 2), "G": (2,), "H": np.ones(2, np.float16)})
    out, rep = rewrite(m, ["expand-contrib"])
    counts = rep.passes[0].counts
    assert counts.get(f"skip:{reason}") == 1, counts
    assert contrib_nodes(out), "the skipped node stays"


def test_nchwc_domain_op_is_named_with_its_domain():
    m = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("ReorderInput", ["x"], ["y"], domain="com.microsoft.nchwc")], "g",
        [onnx.helper.make_tensor_value_info("x", 1, [1, 8, 4, 4])],
        [onnx.helper.make_tensor_value_info("y", 1, [1, 8, 4, 4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17),
                       onnx.helper.make_opsetid("com.microsoft.nchwc", 1)])
    _, rep = rewrite(m, ["expand-contrib"])
    assert rep.passes[0].counts == {"skip:unsupported-contrib:com.microsoft.nchwc:ReorderInput": 1}


def test_inside_an_if_body():
    then = onnx.helper.make_graph(
        [onnx.helper.make_node("QuickGelu", ["x"], ["o1"], domain="com.microsoft"),],
        "then", [], [onnx.helper.make_tensor_value_info("o1", 1, [2, 3])])
    other = onnx.helper.make_graph(
        [onnx.helper.make_node("Gelu", ["x"], ["o2"], domain="com.microsoft")], "else", [],
        [onnx.helper.make_tensor_value_info("o2", 1, [2, 3])])
    g = onnx.helper.make_graph(
        [onnx.helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "m",
        [onnx.helper.make_tensor_value_info("x", 1, [2, 3]),
         onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("y", 1, [2, 3])])
    m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17),
                                                 onnx.helper.make_opsetid("com.microsoft", 1)])
    x = feeds(x=(2, 3))["x"]
    out, rep = expand(m, inputs={"x": x, "c": np.array(True)})
    assert rep.passes[0].counts["expanded:QuickGelu"] == 1
    assert rep.passes[0].counts["expanded:Gelu"] == 1
    for c in (True, False):
        f = {"x": x, "c": np.array(c)}
        check(m, out, f)


def test_idempotent():
    m = make_model(f"""
    {head()}
    g (float[N, 4, 8, 8] x) => (float[N, 4, 8, 8] y) {{
        c = com.microsoft.FusedConv <activation = "Relu", pads = [1, 1, 1, 1]> (x, W, B)
        y = com.microsoft.Gelu (c)
    }}""", {"W": (4, 4, 3, 3), "B": (4,)})
    once, _ = expand(m)
    twice, rep = expand(once)
    assert not rep.passes[0].changed and ops(once) == ops(twice)


# -- models onnxruntime's extended optimiser wrote -------------------------------------------

CNN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 3, 8, 8] x) => (float[N, 16] y, float[N, 16] q) {
    c1 = Conv <pads = [1, 1, 1, 1]> (x, W1, B1)
    r1 = Relu (c1)
    c3 = Conv <pads = [1, 1, 1, 1]> (r1, W3)
    r3 = LeakyRelu <alpha = 0.2> (c3)
    p = GlobalAveragePool (r3)
    f = Flatten (p)
    m1 = MatMul (f, M1)
    a1 = Add (m1, b1)
    d = Div (a1, sq2)
    e = Erf (d)
    e1 = Add (e, one)
    g1 = Mul (a1, e1)
    gl = Mul (g1, half)
    ms = Mul (f, s3)
    mm = MatMul (ms, M2)
    gm = Gemm (mm, G, GB)
    sg = Mul (gm, k)
    sgs = Sigmoid (sg)
    q = Mul (gm, sgs)
    y = Add (gl, gm)
}"""

BERT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4, 16] x) => (float[N, 4, 16] y) {
    m1 = MatMul (x, M1)
    a1 = Add (m1, b1)
    d = Div (a1, sq2)
    e = Erf (d)
    e1 = Add (e, one)
    g1 = Mul (a1, e1)
    gl = Mul (g1, half)
    m2 = MatMul (gl, M2)
    res = Add (m2, x)
    mean = ReduceMean <axes = [-1]> (res)
    sub = Sub (res, mean)
    pw = Pow (sub, two)
    var = ReduceMean <axes = [-1]> (pw)
    ve = Add (var, eps)
    sd = Sqrt (ve)
    nrm = Div (sub, sd)
    sc = Mul (nrm, gam)
    y = Add (sc, bet)
}"""

SCALARS = {"sq2": np.array(np.sqrt(2), np.float32), "one": np.array(1, np.float32),
           "half": np.array(0.5, np.float32), "two": np.array(2, np.float32),
           "eps": np.array(1e-5, np.float32), "s3": np.array(3, np.float32),
           "k": np.array(1.702, np.float32)}


def _ort_optimized(m, path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(path)
    so.log_severity_level = 3
    ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return onnx.load(str(path))


@pytest.mark.parametrize("which", ["cnn", "bert", "resnet_mini"])
def test_onnxruntime_extended_output_expands(which, tmp_path):
    if which == "cnn":
        m = make_model(CNN, {"W1": (8, 3, 3, 3), "B1": (8,), "W3": (8, 8, 3, 3), "M1": (8, 16),
                             "b1": (16,), "M2": (8, 16), "G": (16, 16), "GB": (16,), **SCALARS})
        f = feeds(x=(2, 3, 8, 8))
    elif which == "bert":
        m = make_model(BERT, {"M1": (16, 32), "b1": (32,), "M2": (32, 16), "gam": (16,),
                              "bet": (16,), **SCALARS})
        f = feeds(x=(2, 4, 16))
    else:
        m = onnx.load(str(ROOT / "models" / "resnet_mini.onnx"))
        f = feeds(input=(2, 3, 64, 64))
    opt = _ort_optimized(m, tmp_path / "opt.onnx")
    before = set(contrib_nodes(opt))
    out, rep = rewrite(tmp_path / "opt.onnx", ["expand-contrib"], verify=True)
    assert not contrib_nodes(out)
    assert {k.split(":")[1] for k in rep.passes[0].counts} == before
    check(opt, out, f)
    # Against the model as written, before onnxruntime fused it: its own fusions re-round
    # (MatMulScaleFusion moves a scalar Mul past a MatMul), seen up to 2e-7 relative to the
    # largest output (the CNN's random weights give outputs up to ~700).
    for r, o in zip(run_ort(m, f), run_ort(out, f)):
        np.testing.assert_allclose(o, r, rtol=0, atol=TOL * max(1.0, float(np.abs(r).max())))
    assert before == {"cnn": {"FusedConv", "FusedMatMul", "Gelu", "QuickGelu"},
                      "bert": {"BiasGelu", "SkipLayerNormalization"},
                      "resnet_mini": {"FusedConv"}}[which]


def test_dynamic_quantize_matmul_and_matmul_integer_to_float(rng):
    """onnxruntime's extended optimiser fuses quantize_dynamic's graph into
    DynamicQuantizeMatMul, which MIGraphX does not parse; MatMulIntegerToFloat it parses and
    computes wrongly for a uint8 zero point of 128. Both become DynamicQuantizeLinear /
    MatMulInteger / Cast / Mul / Add, in the kernels' order: bit-exact here. Per-column b
    scale and zero point, a shared weight, with and without bias."""
    w = rng.integers(-128, 128, (16, 8)).astype(np.int8)
    wu = rng.integers(0, 256, (16, 8)).astype(np.uint8)
    m = make_model(head() + """
    g (float[N, 16] x, uint8[N, 16] a) => (float[N, 8] y, float[N, 8] z, float[N, 8] u) {
        y = com.microsoft.DynamicQuantizeMatMul(x, w, bs, , bias)
        z = com.microsoft.DynamicQuantizeMatMul(x, wu, bsc, bzc)
        u = com.microsoft.MatMulIntegerToFloat(a, wu, as, bsc, az, bzc, bias)
    }""", {"w": w, "wu": wu, "bs": np.array(0.02, np.float32),
           "bsc": rng.uniform(0.01, 0.03, 8).astype(np.float32),
           "bzc": rng.integers(100, 150, 8).astype(np.uint8),
           "bias": rng.standard_normal(8).astype(np.float32),
           "as": np.array(0.05, np.float32), "az": np.array(128, np.uint8)})
    out, rep = expand(m)
    assert rep.passes[0].counts["expanded:DynamicQuantizeMatMul"] == 2
    assert rep.passes[0].counts["expanded:MatMulIntegerToFloat"] == 1
    assert ops(out).count("MatMulInteger") == 3
    for n in (1, 3):
        f = {"x": (rng.standard_normal((n, 16)) * 2).astype(np.float32),
             "a": rng.integers(0, 256, (n, 16)).astype(np.uint8)}
        for r, o in zip(run_ort(m, f), run_ort(out, f)):
            np.testing.assert_array_equal(r, o)


def _nbits_model(rng, symmetric: bool) -> onnx.ModelProto:
    """A two-MatMul MLP through onnxruntime's own 4-bit quantizer (MatMulNBits, block 16)."""
    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    m = make_model("""
    <ir_version: 10, opset_import: ["" : 21]>
    g (float[N, 64] x) => (float[N, 16] y) {
        h = MatMul (x, w1)
        r = Relu (h)
        y = MatMul (r, w2)
    }""", {"w1": (64, 32), "w2": (32, 16)})
    cfg = mnq.DefaultWeightOnlyQuantConfig(block_size=16, is_symmetric=symmetric,
                                           quant_format=mnq.QuantFormat.QOperator)
    q = mnq.MatMulNBitsQuantizer(m, algo_config=cfg)
    q.process()
    return q.model.model


def test_matmulnbits_zero_points_flattened_to_the_spec_form(rng):
    """onnxruntime's quantizer writes asymmetric MatMulNBits zero points [N, n]; MIGraphX
    refuses all but the spec's 1-D form (test_migraphx_models.py). Same bytes, exact."""
    m = _nbits_model(rng, symmetric=False)
    assert ops(m) == ["MatMulNBits", "Relu", "MatMulNBits"]
    out, rep = rewriter.rewrite(m, ["expand-contrib"], verify=True)
    assert rep.passes[0].counts["flattened-zero-points:MatMulNBits"] == 2
    zps = {n.input[3] for n in out.graph.node if n.op_type == "MatMulNBits"}
    assert sorted(len(t.dims) for t in out.graph.initializer if t.name in zps) == [1, 1]
    x = {"x": rng.standard_normal((3, 64)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(out, x)[0], run_ort(m, x)[0])
    again, rep2 = rewriter.rewrite(out, ["expand-contrib"])
    assert not rep2.passes[0].changed
    sym, rep3 = rewriter.rewrite(_nbits_model(rng, symmetric=True), ["expand-contrib"])
    assert not rep3.passes[0].changed      # no zero points: nothing to do


@pytest.mark.parametrize("signed", [False, True])
def test_qgemm_bit_exact(rng, signed):
    """QGemm, what onnxruntime's QOperator quantizer writes for every Gemm, and which
    MIGraphX does not parse (the whole model refused): MatMulInteger + the int32 bias, then
    float(acc) * ((alpha * as) * bs / ys) rounded by a QuantizeLinear of scale 1, the
    kernel's order, so bit-exact. Per-column and per-tensor B, transA and transB, alpha,
    a requantized and a float output, A of unknown type (behind a contrib op)."""
    at = np.int8 if signed else np.uint8
    tn = "int8" if signed else "uint8"
    lo, hi = (-128, 128) if signed else (0, 256)
    m = make_model(head() + f"""
    g ({tn}[4, 16] a, {tn}[16, 4] at) => ({tn}[4, 8] y, float[4, 8] z, {tn}[4, 8] u) {{
        y = com.microsoft.QGemm <transB = 1> (a, as, az, w, bsc, bzc, c, ys, yz)
        z = com.microsoft.QGemm <transA = 1, alpha = 0.75> (at, as, az, wk, bs, bz, c)
        p = com.microsoft.QLinearSigmoid(a, as, az, as, az)
        u = com.microsoft.QGemm <transB = 1, alpha = 1.5> (p, as, az, w, bsc, bzc, , ys, yz)
    }}""", {"w": rng.integers(-128, 128, (8, 16)).astype(np.int8),
            "wk": rng.integers(-128, 128, (16, 8)).astype(np.int8),
            "bsc": rng.uniform(0.01, 0.03, 8).astype(np.float32),
            "bzc": np.zeros(8, np.int8), "bs": np.array(0.02, np.float32),
            "bz": np.array(0, np.int8),
            "c": rng.integers(-3000, 3000, 8).astype(np.int32),
            "as": np.array(0.05, np.float32), "az": np.array(3 if signed else 131, at),
            "ys": np.array([0.37], np.float32), "yz": np.array([-5 if signed else 120], at)})
    out, rep = expand(m)
    assert rep.passes[0].counts["expanded:QGemm"] == 3
    assert ops(out).count("MatMulInteger") == 3
    assert contrib_nodes(out) == ["QLinearSigmoid"]
    f = {"a": rng.integers(lo, hi, (4, 16)).astype(at),
         "at": rng.integers(lo, hi, (16, 4)).astype(at)}
    for r, o in zip(run_ort(m, f), run_ort(out, f)):
        assert r.dtype == o.dtype
        np.testing.assert_array_equal(r, o)


@pytest.mark.parametrize("xt,wt,per_channel,group", [
    (np.int8, np.int8, True, 1), (np.uint8, np.int8, True, 4), (np.uint8, np.uint8, False, 1),
    (np.int8, np.int8, False, 2)])
def test_qlinear_conv_with_bias_bit_exact(rng, xt, wt, per_channel, group):
    """A standard QLinearConv with its int32 bias (onnxruntime's QOperator Conv): MIGraphX
    2.15 computes it wrongly and 2.16 refuses a per-tensor weight scale. ConvInteger + bias,
    float(acc) * (xs * ws / ys), a QuantizeLinear of scale 1: qlinearconv.cc's order,
    bit-exact, depthwise and grouped too. One without a bias is left on int8 input (both
    builds exact, int8 kernels) and written out on uint8 input (MIGraphX runs its uint8
    Q/DQ in float; ConvInteger is an int8 kernel)."""
    info_x, info_w = np.iinfo(xt), np.iinfo(wt)
    m_out, c_in = 8, 4
    w = rng.integers(info_w.min, info_w.max + 1, (m_out, c_in // group, 3, 3)).astype(wt)
    ws = rng.uniform(0.002, 0.01, m_out if per_channel else 1).astype(np.float32)
    wz = np.full(ws.shape, 0 if wt == np.int8 else 128, wt)
    tx = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(xt))
    tn = {onnx.TensorProto.INT8: "int8", onnx.TensorProto.UINT8: "uint8"}[tx]
    m = make_model(head() + f"""
    g ({tn}[N, 4, 9, 9] x) => ({tn}[N, 8, 5, 5] y, {tn}[N, 8, 5, 5] y2) {{
        y = QLinearConv <pads = [1, 1, 1, 1], strides = [2, 2], group = {group}>
            (x, xs, xz, w, ws, wz, ys, yz, b)
        y2 = QLinearConv <pads = [1, 1, 1, 1], strides = [2, 2], group = {group}>
            (x, xs, xz, w, ws, wz, ys, yz)
    }}""", {"w": w, "ws": ws, "wz": wz, "xs": np.array(0.05, np.float32),
            "xz": np.array(7 if xt == np.int8 else 131, xt),
            "ys": np.array([0.09], np.float32), "yz": np.array([-4 if xt == np.int8 else 120], xt),
            "b": rng.integers(-2000, 2000, m_out).astype(np.int32)})
    out, rep = expand(m)
    n = 1 if xt == np.int8 else 2
    assert rep.passes[0].counts["expanded:QLinearConv"] == n, rep.passes[0].counts
    assert ops(out).count("ConvInteger") == n and ops(out).count("QLinearConv") == 2 - n
    for n in (1, 2):
        f = {"x": rng.integers(info_x.min, info_x.max + 1, (n, 4, 9, 9)).astype(xt)}
        for r, o in zip(run_ort(m, f), run_ort(out, f)):
            assert r.dtype == o.dtype
            np.testing.assert_array_equal(r, o)
