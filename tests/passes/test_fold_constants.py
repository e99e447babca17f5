"""fold-constants: what folds, what never folds (Q/DQ, random, custom ops), dead code."""

import numpy as np
import onnx
import pytest
from conftest import make_model, ops, run_ort

import rewriter


def rw(m, **kw):
    return rewriter.rewrite(m, ["fold-constants"], **kw)


def test_constant_of_shape_weight_and_shape_arithmetic_fold():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 4, 6, 6] x) => (float[2, 144] y) {
        ws = Constant <value = int64[4] {8, 4, 3, 3}> ()
        W = ConstantOfShape <value = float[1] {0.25}> (ws)
        c = Conv (x, W)
        s = Shape (c)
        n = Gather <axis = 0> (s, zero)
        nu = Unsqueeze (n, zero1)
        shp = Concat <axis = 0> (nu, minus1)
        y = Reshape (c, shp)
    }"""
    m = make_model(text, {"zero": np.array(0, np.int64), "zero1": np.array([0], np.int64),
                          "minus1": np.array([-1], np.int64)})
    out, rep = rw(m, verify=True)
    assert ops(out) == ["Conv", "Reshape"]
    assert rep.passes[0].counts["folded"] == 6  # Constant, ConstantOfShape, Shape, Gather, Unsqueeze, Concat
    shape = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    assert shape["shp"].tolist() == [2, -1]
    f = {"x": np.random.default_rng(0).standard_normal((2, 4, 6, 6)).astype(np.float32)}
    assert np.array_equal(run_ort(m, f)[0], run_ort(out, f)[0])


def test_shape_of_symbolic_dim_is_not_folded():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 4] x) => (int64[2] y) {
        y = Shape (x)
    }"""
    out, rep = rw(make_model(text))
    assert ops(out) == ["Shape"] and not rep.passes[0].changed


def test_dequantize_linear_is_never_folded_but_its_producers_are():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 4, 5, 5] x) => (float y) {
        wt = Transpose <perm = [1, 0, 2, 3]> (Wq)
        w = DequantizeLinear (wt, s, zp)
        xq = QuantizeLinear (x, sx, zp)
        xd = DequantizeLinear (xq, sx, zp)
        y = Conv (xd, w)
    }"""
    wq = np.random.default_rng(0).integers(-127, 127, (4, 8, 3, 3)).astype(np.int8)
    m = make_model(text, {"Wq": wq, "s": np.array(0.02, np.float32),
                          "zp": np.array(0, np.int8), "sx": np.array(0.05, np.float32)})
    out, rep = rw(m, verify=True)
    assert ops(out) == ["DequantizeLinear", "QuantizeLinear", "DequantizeLinear", "Conv"]
    assert rep.passes[0].counts["folded"] == 1
    w = [t for t in out.graph.initializer if t.name == "wt"][0]
    assert w.data_type == onnx.TensorProto.INT8 and list(w.dims) == [8, 4, 3, 3]


def test_a_weight_dequantized_by_cast_and_mul_stays_int8():
    """Weight-only int8 as some exports write it (an int8 MiniLM): Cast(int8 W) -> Mul(scale)
    -> MatMul. Folded, every such weight would be stored 4x larger (22.9 MB -> 34.1 MB);
    it stays, two sites of it (one weight shared by both), while a small int8 constant and
    an int64 one cast to float still fold."""
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 64] x) => (float[N, 32] y, float[N, 32] z) {
        wf = Cast <to = 1> (Wq)
        w = Mul (wf, s)
        a = MatMul (x, w)
        b = MatMul (x, w)
        cf = Cast <to = 1> (small)
        kf = Cast <to = 1> (k64)
        c = Add (a, cf)
        y = Add (c, kf)
        z = Relu (b)
    }"""
    r = np.random.default_rng(3)
    m = make_model(text, {"Wq": r.integers(-127, 128, (64, 32)).astype(np.int8),
                          "s": (r.random((1, 32)) * 0.01 + 0.001).astype(np.float32),
                          "small": r.integers(-5, 5, (32,)).astype(np.int8),
                          "k64": np.arange(32 * 40, dtype=np.int64).reshape(40, 32)[:1]})
    out, rep = rw(m, verify=True)
    c = rep.passes[0].counts
    assert c["skip:weight-dequantization"] == 1 and c["folded"] == 2, c
    assert ops(out) == ["Cast", "Mul", "MatMul", "MatMul", "Add", "Add", "Relu"]
    kinds = {t.name: t.data_type for t in out.graph.initializer}
    assert kinds["Wq"] == onnx.TensorProto.INT8
    f = {"x": r.standard_normal((3, 64)).astype(np.float32)}
    for a, b in zip(run_ort(m, f), run_ort(out, f)):
        np.testing.assert_array_equal(a, b)


def test_size_guard_keeps_growth_nodes_unless_they_are_weights():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 512, 32, 32] x) => (float y, float z) {
        big = ConstantOfShape <value = float[1] {1.0}> (shp)
        y = Add (x, big)
        W = ConstantOfShape <value = float[1] {0.01}> (wshape)
        z = Conv (x, W)
    }"""
    m = make_model(text, {"shp": np.array([1, 512, 32, 32], np.int64),
                          "wshape": np.array([256, 512, 3, 3], np.int64)})
    out, rep = rw(m)
    c = rep.passes[0].counts
    assert c["skip:size-guard"] == 1 and c["folded"] == 1
    assert ops(out) == ["ConstantOfShape", "Add", "Conv"]
    # A larger limit lets it fold.
    out2, _ = rewriter.rewrite(m, ["fold-constants"], options={"fold_size_limit": 8 << 20})
    assert ops(out2) == ["Add", "Conv"]


def test_identity_and_dropout_removed_graph_output_name_kept():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3] x, float[2, 3] unused) => (float[2, 3] y, float[2, 3] k) {
        a = Relu (x)
        b = Identity (a)
        d = Dropout (b)
        e = Sigmoid (d)
        y = Identity (e)
        k = Identity (x)
    }"""
    m = make_model(text)
    out, rep = rw(m, verify=True)
    assert ops(out) == ["Relu", "Sigmoid", "Identity"]
    assert [o.name for o in out.graph.output] == ["y", "k"]
    # Graph inputs are the interface: the unused one stays.
    assert [i.name for i in out.graph.input] == ["x", "unused"]
    c = rep.passes[0].counts
    assert c["removed-identity"] == 2 and c["removed-dropout"] == 1
    assert c["skip:identity-between-graph-io"] == 1


def test_dropout_mask_used_is_kept():
    text = """
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[2, 3] x) => (float[2, 3] y, bool[2, 3] mk) {
        y, mk = Dropout (x)
    }"""
    out, rep = rw(make_model(text))
    assert ops(out) == ["Dropout"]
    assert rep.passes[0].counts["skip:dropout-mask-used"] == 1


def test_random_and_custom_domain_ops_are_not_evaluated():
    text = """
    <ir_version: 8, opset_import: ["" : 17, "com.example" : 1]>
    g (float[2, 3] x) => (float[2, 3] y, float z) {
        r = RandomNormal <shape = [2, 3]> ()
        y = Add (x, r)
        z = com.example.Mystery (c)
    }"""
    m = make_model(text, {"c": (2, 3)})
    out, rep = rw(m)
    assert ops(out) == ["RandomNormal", "Add", "Mystery"]
    assert not rep.passes[0].changed


def test_if_subgraph_folds_inside_with_outer_scope_constants():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (bool cond, float[3] x) => (float[3] y) {
        y = If (cond) <
            then_branch = t () => (float[3] ty) {
                k = Mul (C, C)
                ty = Add (x, k)
            },
            else_branch = e () => (float[3] ey) {
                i = Identity (x)
                ey = Neg (i)
            }>
    }"""
    m = make_model(text, {"C": (3,)})
    out, rep = rw(m)
    assert rep.passes[0].counts["folded"] == 1 and rep.passes[0].counts["removed-identity"] == 1
    then_g = out.graph.node[0].attribute[0].g
    assert [n.op_type for n in then_g.node] == ["Add"]
    for cond in (True, False):
        f = {"cond": np.array(cond), "x": np.arange(3, dtype=np.float32)}
        assert np.allclose(run_ort(m, f)[0], run_ort(out, f)[0])


def test_unused_initializers_removed_and_idempotent():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[2, 3] x) => (float[2, 3] y) {
        y = Add (x, A)
    }"""
    m = make_model(text, {"A": (2, 3), "Unused": (4, 4)})
    out, rep = rw(m)
    assert [t.name for t in out.graph.initializer] == ["A"]
    again, rep2 = rw(out)
    assert not rep2.passes[0].changed
    assert again.graph.SerializeToString() == out.graph.SerializeToString()


def test_folded_values_keep_declared_dtype():
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    g (float16[2, 3] x) => (float16[2, 3] y) {
        h = Cast <to = 10> (A)
        y = Add (x, h)
    }"""
    out, _ = rw(make_model(text, {"A": (2, 3)}))
    (h,) = [t for t in out.graph.initializer if t.name == "h"]
    assert h.data_type == onnx.TensorProto.FLOAT16


@pytest.mark.parametrize("opset", [7, 11, 13, 17, 21])
def test_opsets(opset):
    text = f"""
    <ir_version: 8, opset_import: ["" : {opset}]>
    g (float[2, 3] x) => (float[2, 3] y) {{
        t = Transpose <perm = [1, 0]> (A)
        u = Transpose <perm = [1, 0]> (t)
        y = Add (x, u)
    }}"""
    m = make_model(text, {"A": (2, 3)})
    out, rep = rw(m, verify=True)
    assert ops(out) == ["Add"] and rep.passes[0].counts["folded"] == 2


@pytest.mark.parametrize("kind", ["int4", "uint4", "float8_e4m3fn"])
def test_an_int4_or_float8_weight_dequantized_by_cast_stays(kind):
    """Cast(int4 W) -> Mul(scale) -> MatMul: int4 is not a numpy integer (ml_dtypes), so the
    weight was folded into float32, 8x its size (fourteenth round); a small one still folds."""
    import ml_dtypes

    r = np.random.default_rng(4)
    np_type = getattr(ml_dtypes, kind)
    text = """
    <ir_version: 10, opset_import: ["" : 21]>
    g (float[N, 64] x) => (float[N, 32] y) {
        wf = Cast <to = 1> (Wq)
        w = Mul (wf, s)
        a = MatMul (x, w)
        cf = Cast <to = 1> (small)
        y = Add (a, cf)
    }"""
    m = make_model(text, {"Wq": r.integers(0, 8, (64, 32)).astype(np_type),
                          "s": (r.random((1, 32)) * 0.01 + 0.001).astype(np.float32),
                          "small": r.integers(0, 5, (32,)).astype(np_type)})
    out, rep = rw(m, verify=True)
    c = rep.passes[0].counts
    assert c["skip:weight-dequantization"] == 1 and c["folded"] == 1, c
    kinds = {t.name: t.data_type for t in out.graph.initializer}
    assert kinds["Wq"] == onnx.helper.np_dtype_to_tensor_dtype(np.dtype(np_type))
    f = {"x": r.standard_normal((3, 64)).astype(np.float32)}
    np.testing.assert_array_equal(run_ort(m, f)[0], run_ort(out, f)[0])
