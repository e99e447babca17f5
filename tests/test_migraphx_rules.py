"""Each QDQ rule of the static check, run on the real MIGraphX (migraphx-driver, the GPU
target's passes up to simplify_qdq) and shown right.

One small model per form. For each, the lowering is measured on the installed MIGraphX
(``quant``: the conv/dot became quant_convolution/quant_dot; ``float``: it did not;
``throws``: parsing or simplify_qdq raised), compared with what was measured on the shared
2.15 and 2.16 builds (so a new build that behaves differently fails here), and the static
check for that version must say the same thing: an error where MIGraphX throws,
plan-int8-stays-float where the layer stays float, neither where it lowers.
CI runs this file once per shared build.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

import rewriter
from rewriter.migraphx import lowering
from rewriter.migraphx.check import check_model

pytestmark = pytest.mark.migraphx
R = np.random.default_rng(0)
BASE = dict(xs=np.float32(0.05), xz=np.int8(0), wz=np.int8(0), ws=np.float32(0.01))
W = R.integers(-127, 128, (8, 4, 3, 3), dtype=np.int8)


def conv(pre: str = "wd = DequantizeLinear(w, ws, wz)", q: str = "QuantizeLinear(x, xs, xz)",
         group: int = 1, c_out: int = 8, x_type: str = "float", tail: str = "") -> str:
    return f"""
    g ({x_type}[1,4,8,8] x) => ({x_type}[1,{c_out},8,8] y) {{
        xq = {q}
        xd = DequantizeLinear(xq, xs, xz)
        {pre}
        y = Conv <pads=[1,1,1,1], group={group}> (xd, wd)
        {tail}
    }}"""


def gemm(attrs: str = "", op: str = "Gemm", dq_attrs: str = "") -> str:
    call = f"Gemm <{attrs}> (xd, wd, b)" if op == "Gemm" else "MatMul(xd, wd)"
    return f"""
    g (float[2,16] x) => (float[2,8] y) {{
        xq = QuantizeLinear(x, xs, xz)
        xd = DequantizeLinear(xq, xs, xz)
        wd = DequantizeLinear {dq_attrs} (w, ws, wz)
        y = {call}
    }}"""


GW = dict(BASE, w=R.integers(-127, 128, (16, 8), dtype=np.int8),
          b=R.standard_normal(8).astype(np.float32))
PER_K = dict(ws=R.uniform(0.005, 0.02, 8).astype(np.float32), wz=np.zeros(8, np.int8))

# name: (text, initializers, opset, {version: outcome}, the check's code where it is not quant)
CASES = {
    "int8-form": (conv(), dict(BASE, w=W), 17, {"2.15": "quant", "2.16": "quant"}, None),
    "per-axis-weight": (conv("wd = DequantizeLinear <axis=0> (w, ws, wz)"),
                        dict(BASE, w=W, **PER_K), 17, {"2.15": "quant", "2.16": "throws"},
                        "qdq-per-channel-weight"),
    "per-axis-depthwise": (conv("wd = DequantizeLinear <axis=0> (w, ws, wz)", group=4, c_out=4),
                           dict(BASE, w=W[:4, :1], ws=PER_K["ws"][:4], wz=PER_K["wz"][:4]), 17,
                           {"2.15": "quant", "2.16": "throws"}, "qdq-per-channel-weight"),
    "per-column-matmul": (gemm(op="MatMul", dq_attrs="<axis=1>"), dict(GW, **PER_K), 17,
                          {"2.15": "quant", "2.16": "throws"}, "qdq-per-channel-weight"),
    "scale-after-layer": (conv("wd = DequantizeLinear(w, one, wz)", tail="""
                               m = Mul(y, cs)"""), dict(BASE, w=W, one=np.float32(1.0),
                          cs=R.uniform(0.005, 0.02, (1, 8, 1, 1)).astype(np.float32)), 17,
                          {"2.15": "quant", "2.16": "quant"}, None),
    "weight-scale-shape-1": (conv(), dict(BASE, w=W, ws=np.array([0.01], np.float32),
                                          wz=np.array([0], np.int8)), 17,
                             {"2.15": "throws", "2.16": "throws"}, "qdq-scale-shape-1"),
    "activation-scale-shape-1": (conv(), dict(BASE, w=W, xs=np.array([0.05], np.float32),
                                              xz=np.array([0], np.int8)), 17,
                                 {"2.15": "throws", "2.16": "throws"}, "qdq-scale-shape-1"),
    "zero-point-shape-1": (conv(), dict(BASE, w=W, wz=np.array([0], np.int8)), 17,
                           {"2.15": "throws", "2.16": "throws"}, "qdq-scale-shape-1"),
    "zero-weight-scale": (conv(), dict(BASE, w=W, ws=np.float32(0.0)), 17,
                          {"2.15": "quant", "2.16": "float"}, "qdq-scale-not-positive"),
    "zero-activation-scale": (conv(), dict(BASE, w=W, xs=np.float32(0.0)), 17,
                              {"2.15": "quant", "2.16": "float"}, "qdq-scale-not-positive"),
    "negative-scale": (conv(), dict(BASE, w=W, xs=np.float32(-0.05)), 17,
                       {"2.15": "quant", "2.16": "quant"}, None),
    "dq-without-zero-point": (conv("wd = DequantizeLinear(w, ws)"), dict(BASE, w=W), 17,
                              {"2.15": "float", "2.16": "float"}, "qdq-no-zero-point"),
    "q-without-zero-point-int8": (conv(q="QuantizeLinear <output_dtype=3> (x, xs)"),
                                  dict(BASE, w=W), 21, {"2.15": "quant", "2.16": "quant"}, None),
    "uint8": (conv(), dict(BASE, w=W, xz=np.uint8(128)), 17,
              {"2.15": "float", "2.16": "float"}, "qdq-uint8"),
    "fp8-e4m3fnuz": (conv(), None, 19, {"2.15": "quant", "2.16": "quant"}, None),
    "through-transpose": (conv("w0 = DequantizeLinear(w, ws, wz)\n"
                               "wd = Transpose <perm=[1,0,2,3]> (w0)"),
                          dict(BASE, w=np.ascontiguousarray(W.transpose(1, 0, 2, 3))), 17,
                          {"2.15": "quant", "2.16": "quant"}, None),
    "through-reshape": (conv("w0 = DequantizeLinear(w, ws, wz)\nwd = Reshape(w0, shp)"),
                        dict(BASE, w=W.reshape(8, 36), shp=np.array([8, 4, 3, 3], np.int64)),
                        17, {"2.15": "quant", "2.16": "quant"}, None),
    "through-identity": (conv("w0 = DequantizeLinear(w, ws, wz)\nwd = Identity(w0)"),
                         dict(BASE, w=W), 17, {"2.15": "quant", "2.16": "quant"}, None),
    "through-expand": (conv("w0 = DequantizeLinear(w, ws, wz)\nwd = Expand(w0, shp)"),
                       dict(BASE, w=W[:1], shp=np.array([8, 4, 3, 3], np.int64)), 17,
                       {"2.15": "quant", "2.16": "quant"}, None),
    "through-squeeze": (conv("w0 = DequantizeLinear(w, ws, wz)\nwd = Squeeze(w0, ax)"),
                        dict(BASE, w=W[:, :, None], ax=np.array([2], np.int64)), 17,
                        {"2.15": "float", "2.16": "float"}, "qdq-not-looked-through"),
    "through-noop-cast": (conv("w0 = DequantizeLinear(w, ws, wz)\nwd = Cast <to=1> (w0)"),
                          dict(BASE, w=W), 17, {"2.15": "throws", "2.16": "throws"},
                          "qdq-noop-cast"),
    "through-cast-to-fp16": (conv("w0 = DequantizeLinear(w, ws, wz)\nwd = Cast <to=10> (w0)",
                                  tail="", x_type="float16").replace(
                                      "xq = QuantizeLinear(x, xs, xz)",
                                      "x32 = Cast <to=1> (x)\n xq = QuantizeLinear(x32, xs, xz)"
                                  ).replace("xd = DequantizeLinear(xq, xs, xz)",
                                            "x0 = DequantizeLinear(xq, xs, xz)\n"
                                            "xd = Cast <to=10> (x0)"),
                             dict(BASE, w=W), 17, {"2.15": "quant", "2.16": "quant"}, None),
    "gemm": (gemm("transB=0"), GW, 17, {"2.15": "quant", "2.16": "quant"}, None),
    "gemm-alpha": (gemm("alpha=0.5"), GW, 17, {"2.15": "float", "2.16": "float"},
                   "qdq-gemm-alpha"),
    "gemm-transA": (gemm("transA=1").replace("float[2,16] x", "float[16,2] x"), GW, 17,
                    {"2.15": "quant", "2.16": "quant"}, None),
    "fp16-input-fp32-scale-opset19": (conv(x_type="float16").replace(
        "y = Conv", "wd16 = Cast <to=10> (wd)\n xd16 = Cast <to=10> (xd)\n y = Conv").replace(
        "(xd, wd)", "(xd16, wd16)"), dict(BASE, w=W), 19,
        {"2.15": "throws", "2.16": "throws"}, "qdq-scale-type"),
    "dq-zero-point-type": (conv(), dict(BASE, w=W, wz=np.uint8(0)), 17,
                           {"2.15": "throws", "2.16": "throws"}, "qdq-zero-point-type"),
    # Fourteenth round: onnxruntime's 4-bit quantizer writes blockwise weight DQs (one block
    # where K <= block_size), and weight-only layers leave the activation float.
    "blockwise-weight": (gemm(op="MatMul", dq_attrs="<axis=0, block_size=8>"),
                         dict(GW, ws=R.uniform(0.005, 0.02, (2, 8)).astype(np.float32),
                              wz=np.zeros((2, 8), np.int8)), 21,
                         {"2.15": "float", "2.16": "float"}, "qdq-blockwise-weight"),
    "blockwise-one-block": (gemm(op="MatMul", dq_attrs="<axis=0, block_size=16>"),
                            dict(GW, ws=R.uniform(0.005, 0.02, (1, 8)).astype(np.float32),
                                 wz=np.zeros((1, 8), np.int8)), 21,
                            {"2.15": "throws", "2.16": "throws"}, "qdq-blockwise-one-block"),
    "weight-only-per-column": (gemm(op="MatMul", dq_attrs="<axis=1>").replace(
        "xq = QuantizeLinear(x, xs, xz)\n        xd = DequantizeLinear(xq, xs, xz)",
        "xd = Identity(x)"), dict(GW, **PER_K), 17, {"2.15": "float", "2.16": "float"},
        "qdq-half-quantized"),
}


def _fp8_inits():
    import ml_dtypes

    f8 = ml_dtypes.float8_e4m3fnuz
    return dict(BASE, w=R.standard_normal((8, 4, 3, 3)).astype(f8), xz=np.zeros((), f8),
                wz=np.zeros((), f8))


def build(name: str, tmp_path) -> tuple[str, onnx.ModelProto]:
    text, inits, opset, _, _ = CASES[name]
    model = onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : {opset}]>\n{text}')
    for k, v in (inits if inits is not None else _fp8_inits()).items():
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(v), k))
    for n in model.graph.node:
        n.name = f"{n.output[0]}_node"
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)   # some forms are invalid ONNX on purpose (what MIGraphX refuses)
    return path, model


def layer(model) -> str:
    return next(n.name for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul"))


@pytest.mark.parametrize("name", list(CASES))
def test_rule_matches_what_migraphx_does(name, tmp_path, migraphx_version, migraphx_driver):
    path, model = build(name, tmp_path)
    node = layer(model)
    dims = {"x": [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]}
    check = check_model(model, plan_int8_nodes=[node], version=migraphx_version)
    low = lowering.lower_int8(path, dims, [node], model=model, findings=check.findings,
                              driver=migraphx_driver)
    measured = ("throws" if low.status == "failed" else
                "quant" if low.lowered == 1 else "float")
    shown = ".".join(map(str, migraphx_version[:2]))
    expected = CASES[name][3].get(shown)
    if expected is not None:
        assert measured == expected, (name, shown, low.error)
    code = CASES[name][4]
    errors = {f.code for f in check.findings if f.severity == "error"}
    stays = [f for f in check.findings if f.code == "plan-int8-stays-float"]
    if measured == "throws":
        assert code in errors, (name, [(f.code, f.severity) for f in check.findings])
        # One line that names the form MIGraphX choked on, and the layer that has it.
        assert "\n" not in low.error and "caused by" in low.error, low.error
    elif measured == "float":
        assert not errors and code in {f.code for f in check.findings}
        assert [f.node for f in stays] == [node]
        assert low.float_layers()[0].why_float  # the reason reaches the lowering line
    else:
        assert not errors and not stays, [(f.code, f.severity) for f in check.findings]


def test_every_case_was_measured_on_both_builds():
    assert all(set(c[3]) == {"2.15", "2.16"} for c in CASES.values())


# -- MatMulInteger / ConvInteger zero points ---------------------------------------------------

ZP = {np.uint8: (None, 0, 7, 128), np.int8: (None, 0, -5, 3)}


def _full_range(t, shape) -> np.ndarray:
    """Random values of ``t`` with its two extremes in them: MIGraphX's errors on some forms
    are overflows that only values near the ends show (int8 A with zero point 3 is right on
    data above -125)."""
    x = R.integers(np.iinfo(t).min, int(np.iinfo(t).max) + 1, shape).astype(t)
    x.flat[0], x.flat[-1] = np.iinfo(t).min, np.iinfo(t).max
    return x


def _integer_model(op: str, at, bt, azp, bzp):
    from onnx import TensorProto, helper
    a_shape, b_shape, y_shape = (([4, 16], [16, 8], [4, 8]) if op.startswith("MatMul") else
                                 ([1, 4, 6, 6], [3, 4, 3, 3], [1, 3, 4, 4]))
    b = _full_range(bt, b_shape)
    inits = [numpy_helper.from_array(b, "b")]
    ins = ["a", "b"]
    to_float = op == "MatMulIntegerToFloat"
    if to_float:   # com.microsoft: (A, B, a_scale, b_scale, a_zero_point, b_zero_point)
        inits += [numpy_helper.from_array(np.array(0.02, np.float32), "as"),
                  numpy_helper.from_array(np.full(8, 0.01, np.float32), "bs")]
        ins += ["as", "bs"]
    for name, t, zp in (("az", at, azp), ("bz", bt, bzp)):
        if zp is not None:
            inits.append(numpy_helper.from_array(np.array(zp, t), name))
    if azp is not None or bzp is not None:
        ins += ["az" if azp is not None else "", "bz" if bzp is not None else ""]
    while ins[-1] == "":
        ins.pop()
    elem = {np.uint8: TensorProto.UINT8, np.int8: TensorProto.INT8}
    g = helper.make_graph(
        [helper.make_node(op, ins, ["y"], name="y_node",
                          domain="com.microsoft" if to_float else "")], "g",
        [helper.make_tensor_value_info("a", elem[at], a_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT if to_float else TensorProto.INT32,
                                       y_shape)], inits)
    opsets = [helper.make_opsetid("", 17)] + (
        [helper.make_opsetid("com.microsoft", 1)] if to_float else [])
    return helper.make_model(g, opset_imports=opsets, ir_version=8)


@pytest.mark.parametrize("op", ["MatMulInteger", "ConvInteger", "MatMulIntegerToFloat"])
def test_integer_op_zero_points_match_what_migraphx_computes(op, tmp_path, migraphx_version):
    """Every dtype pair and zero-point form (left out, 0, another value, the symmetric one) of
    MatMulInteger, ConvInteger and com.microsoft MatMulIntegerToFloat, run on MIGraphX's ref
    target against onnxruntime's exact int32 (float, to rounding): the static check flags
    ``integer-zero-point`` exactly where MIGraphX throws or gives other numbers
    (onnxruntime's dynamic quantization is one such form), and expand-contrib with
    integer-zero-points turns every flagged form with a constant B into one it computes
    right (measured on 2.15 and 2.16: the same table)."""
    import migraphx

    from rewriter.core.integer_ops import integer_op_wrong
    from rewriter.verify.verifier import OriginalRunError

    def on_migraphx(model, a):
        path = str(tmp_path / "m.onnx")
        onnx.save(model, path)
        try:
            prog = migraphx.parse_onnx(path)
            prog.compile(migraphx.get_target("ref"))
            return np.array(prog.run({"a": migraphx.argument(a)})[0])
        except Exception:   # noqa: BLE001 - what MIGraphX throws is the measurement
            return None

    from conftest import run_ort

    def same(x, y):   # int32 exactly; MatMulIntegerToFloat's float to rounding
        return np.array_equal(x, y) if y.dtype == np.int32 else np.allclose(x, y, 1e-5, 1e-4)

    seen = {"right": 0, "wrong": 0, "throws": 0}
    for at in (np.uint8, np.int8):
        for bt in (np.uint8, np.int8):
            for azp in ZP[at]:
                for bzp in ZP[bt]:
                    model = _integer_model(op, at, bt, azp, bzp)
                    a = _full_range(at, [d.dim_value for d in
                                         model.graph.input[0].type.tensor_type.shape.dim])
                    try:
                        ref = run_ort(model, {"a": a})[0]
                    except Exception:   # noqa: BLE001 - onnxruntime has no such kernel
                        continue        # (MatMulIntegerToFloat, int8 A with uint8 B)
                    got = on_migraphx(model, a)
                    measured = "throws" if got is None else (
                        "right" if same(got.reshape(ref.shape), ref) else "wrong")
                    seen[measured] += 1
                    form = (op, np.dtype(at).name, np.dtype(bt).name, azp, bzp, measured)
                    flagged = any(f.code == "integer-zero-point" and f.severity == "error"
                                  for f in check_model(model).findings)
                    assert flagged == (measured != "right"), form
                    assert integer_op_wrong(op, np.dtype(at), np.dtype(bt), azp, bzp) == flagged
                    if not flagged:
                        continue
                    try:
                        out, _ = rewriter.rewrite(model, ["expand-contrib", "integer-zero-points"],
                                                  verify=True)
                    except OriginalRunError:
                        continue   # a form onnxruntime refuses too
                    if any(f.code == "integer-zero-point" for f in check_model(out).findings):
                        continue   # skipped with a reason (B - b_zp outside int8)
                    fixed = on_migraphx(out, a)
                    assert fixed is not None and same(fixed.reshape(ref.shape), ref), form
    assert seen["right"] and seen["wrong"], seen


def test_int4_shapes_migraphx_refuses_and_the_one_it_dies_on_is_never_parsed(tmp_path,
                                                                          migraphx_version):
    """An int4 tensor with an odd last dim: MIGraphX's parser throws, as the static check
    says. A 0-d one: the parser segfaults (a child process dies), so the backend refuses to
    parse it and `rewrite` exits 2 with one line instead of dying (exit 139 before)."""
    import subprocess
    import sys

    import ml_dtypes
    from onnx import helper

    from rewriter.migraphx import backend

    def model(q_shape, z_shape):
        inits = [numpy_helper.from_array(np.zeros(q_shape, ml_dtypes.int4), "q"),
                 numpy_helper.from_array(np.ones((), np.float32), "s"),
                 numpy_helper.from_array(np.zeros(z_shape, ml_dtypes.int4), "z")]
        g = helper.make_graph(
            [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
             helper.make_node("Add", ["x", "d"], ["y"])], "g",
            [helper.make_tensor_value_info("x", 1, list(q_shape))],
            [helper.make_tensor_value_info("y", 1, list(q_shape))], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])

    for shape, refused in (((4, 3), True), ((3, 4), False)):
        m = model(shape, ())
        del m.graph.initializer[2:]          # no 0-d zero point: only the shape of q
        m.graph.node[0].input.pop()
        onnx.save(m, tmp_path / "q.onnx")
        err = backend.refuses(tmp_path / "q.onnx", {"x": list(shape)})
        assert (err is not None and "even-sized packed" in err.message) == refused, shape
        assert ("int4-tensor-shape" in check_model(m).codes("error")) == refused, shape

    scalar = tmp_path / "scalar.onnx"
    onnx.save(model((8,), ()), scalar)
    child = subprocess.run([sys.executable, "-c", "import sys, migraphx; "
                            "migraphx.parse_onnx(sys.argv[1], map_input_dims={'x': [8]})",
                            str(scalar)], capture_output=True)
    assert child.returncode < 0              # killed by a signal: the segfault
    err = backend.refuses(scalar, {"x": [8]})
    assert err is not None and "crashes MIGraphX's parser" in err.message
    from rewriter.cli import main
    # The pipeline's qdq-forms stores the 0-d int4 as int8: the rewrite compiles (exit 0);
    # without it, the original is never handed over: one line, exit 2, not a dead process.
    assert main([str(scalar), "-o", str(tmp_path / "out.onnx"), "--migraphx-target", "ref",
                 "-q"]) == 0
    assert main([str(scalar), "-o", str(tmp_path / "out2.onnx"), "--migraphx-target", "ref",
                 "--passes", "fold-constants", "-q"]) == 2


@pytest.mark.parametrize("op", ["Attention", "RotaryEmbedding"])
def test_opset_23_attention_and_rotary_embedding_are_refused(op, tmp_path, migraphx_version):
    """The ONNX opset-23 forms: MIGraphX reads them as onnxruntime's contrib ops (num_heads;
    position_ids as input 1) and refuses them, as the static check says."""
    from test_check import _opset23_op

    from rewriter.migraphx import backend

    model = _opset23_op(op)
    onnx.save(model, tmp_path / "m.onnx")
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim]
            for i in model.graph.input}
    assert backend.refuses(tmp_path / "m.onnx", dims) is not None
    assert "standard-op-read-as-contrib" in check_model(model).codes("error")
# -- outputs whose size depends on the data ---------------------------------------------------

def test_nonzero_and_nms_outputs_are_padded_as_the_check_says(tmp_path, migraphx_version):
    """MIGraphX (Python parse_onnx, no dynamic output) gives NonZero a [rank, elements] output
    and NonMaxSuppression a fixed number of rows: the true result, then zeros that read as
    index 0 (found on a YOLO + NMS and a U-Net + NonZero export, fifteenth round). The static
    check says ``output-padded`` for both; a constant NonZero is folded to its real size."""
    import migraphx
    from conftest import run_ort
    from test_check import _padded_outputs_model

    model = _padded_outputs_model()
    feeds = {"x": np.array([[0.1, 0.9, 0.7], [0.2, 0.3, 0.8]], np.float32),
             "b": np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 5, 5],
                             [50, 50, 60, 60], [21, 21, 31, 31]]], np.float32),
             "s": np.array([[[.9, .8, .7, .2, .6, .1], [.1, .2, .95, .4, .05, .5]]], np.float32)}
    ref = run_ort(model, feeds)
    path = str(tmp_path / "m.onnx")
    onnx.save(model, path)
    prog = migraphx.parse_onnx(path)
    prog.compile(migraphx.get_target("ref"))
    got = [np.array(o) for o in prog.run({k: migraphx.argument(v) for k, v in feeds.items()})]
    for r, g, axis in zip(ref[:2], got[:2], (1, 0)):
        n = r.shape[axis]
        assert g.shape[axis] > n and np.array_equal(np.take(g, range(n), axis), r)
        assert not np.take(g, range(n, g.shape[axis]), axis).any()   # zeros: index 0
    assert np.array_equal(got[2], ref[2])
    flagged = [f.node for f in check_model(model, version=migraphx_version).findings
               if f.code == "output-padded" and f.severity == "error"]
    assert sorted(flagged) == ["nz_node", "sel_node"]


def test_cubic_resize_as_the_check_says(migraphx_version):
    """Resize mode=cubic on MIGraphX against onnxruntime, every coordinate mode, two
    cubic_coeff_a, up- and downscaling: 2.15 throws on every one, 2.16 agrees on every one
    (thirty-sixth round); the check refuses it where MIGraphX throws."""
    import migraphx
    from conftest import run_ort

    r = np.random.default_rng(0)
    seen = set()
    for ctm in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"):
        for a in (-0.75, -0.5):
            for sc in ("1, 1, 2, 2", "1, 1, 0.5, 0.5", "1, 1, 1.5, 0.75"):
                model = onnx.parser.parse_model(f"""
                <ir_version: 9, opset_import: ["" : 18]>
                g (float[1,2,8,8] x) => (float[1,2,?,?] y) <float[4] s = {{{sc}}}> {{
                    y = Resize <mode="cubic", coordinate_transformation_mode="{ctm}",
                                cubic_coeff_a={a}> (x, , s)
                }}""")
                x = r.standard_normal((1, 2, 8, 8)).astype(np.float32)
                want = run_ort(model, {"x": x})[0]
                try:
                    prog = migraphx.parse_onnx_buffer(model.SerializeToString())
                    prog.compile(migraphx.get_target("ref"))
                    got = np.array(prog.run({"x": migraphx.argument(x)})[0])
                except Exception:   # noqa: BLE001 - what MIGraphX throws is measured
                    seen.add("throws")
                    continue
                seen.add("right" if np.allclose(got.reshape(want.shape), want, atol=1e-5)
                         else "wrong")
    flagged = any(f.code == "resize-mode-refused" and f.severity == "error"
                  for f in check_model(model, version=migraphx_version).findings)
    assert len(seen) == 1 and seen != {"wrong"}, seen
    assert flagged == (seen == {"throws"})


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_modes_as_the_check_says(mode, migraphx_version):
    """GridSample on MIGraphX against onnxruntime, every padding mode and align_corners:
    linear and nearest agree; cubic throws for more than one channel ("Reshape: Wrong
    number of elements") and, on one channel, gets border and reflection padding wrong
    (measured on 2.15 and 2.16, fifteenth round). The check refuses cubic only."""
    import migraphx
    import tempfile
    from conftest import run_ort

    r = np.random.default_rng(0)
    seen = set()
    for c in (1, 3):
        for pad in ("zeros", "border", "reflection"):
            for ac in (0, 1):
                model = onnx.parser.parse_model(f"""
                <ir_version: 9, opset_import: ["" : 20]>
                g (float[1,{c},6,7] x, float[1,5,4,2] gr) => (float[1,{c},5,4] y) {{
                    y = GridSample <mode="{mode}", padding_mode="{pad}", align_corners={ac}>
                                   (x, gr)
                }}""")
                feeds = {"x": r.standard_normal((1, c, 6, 7)).astype(np.float32),
                         "gr": r.uniform(-1.2, 1.2, (1, 5, 4, 2)).astype(np.float32)}
                with tempfile.TemporaryDirectory() as tmp:
                    path = f"{tmp}/gs.onnx"
                    onnx.save(model, path)
                    try:
                        prog = migraphx.parse_onnx(path)
                        prog.compile(migraphx.get_target("ref"))
                        got = np.array(prog.run(feeds)[0])
                    except Exception:   # noqa: BLE001 - what MIGraphX throws is measured
                        seen.add("throws")
                        continue
                right = np.allclose(got, run_ort(model, feeds)[0], atol=1e-5)
                seen.add("right" if right else "wrong")
    flagged = any(f.code == "gridsample-mode-refused" and f.severity == "error"
                  for f in check_model(model, version=migraphx_version).findings)
    assert seen == ({"right", "wrong", "throws"} if mode == "cubic" else {"right"}), seen
    assert flagged == (mode == "cubic")


@pytest.mark.parametrize("where", ["top", "if", "loop", "scan"])
def test_slice_with_computed_bounds_in_bodies_as_the_check_says(where, migraphx_version):
    """A Slice with run-time starts and ends: MIGraphX compiles it at the top level and in
    an If branch (and gets onnxruntime's values), and throws 'lens() called on a dynamic
    shape' inside a Loop's or Scan's body (2.15 and 2.16: TorchScript's EmbeddingBag
    export, thirty-ninth round); the check's error is there and only there."""
    import migraphx
    from conftest import run_ort
    from test_check import _slice_in_body

    model = _slice_in_body(where)
    feeds = {"x": np.arange(40, dtype=np.float32).reshape(10, 4), "s": np.array([2]),
             "e": np.array([5])}
    want = run_ort(model, feeds)[-1]
    try:
        prog = migraphx.parse_onnx_buffer(model.SerializeToString())
        prog.compile(migraphx.get_target("ref"))
        got = np.array(prog.run({k: migraphx.argument(v) for k, v in feeds.items()})[-1])
        outcome = "right" if np.allclose(got.reshape(want.shape), want) else "wrong"
    except Exception as e:   # noqa: BLE001 - what MIGraphX throws is measured
        assert "dynamic shape" in str(e)
        outcome = "throws"
    assert outcome == ("throws" if where in ("loop", "scan") else "right")
    errors = {f.node for f in check_model(model, version=migraphx_version).findings
              if f.code == "input-not-constant" and f.severity == "error"}
    assert errors == ({"sl_node"} if outcome == "throws" else set())   # starts and ends
