"""default-attributes: a Resize's keep_aspect_ratio_policy="stretch" (torch's dynamo exporter
writes it on every Resize) is dropped, exactly; MIGraphX 2.15 refuses to parse it."""

import numpy as np
import onnx
import pytest
from conftest import make_model, run_ort

import rewriter
from rewriter.core.registry import default_pipeline


def resize_model(policy: str):
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[1, 2, 4, 4] x) => (float[1, 2, 8, 8] y) {{
        sizes = Constant <value = int64[4] {{1, 2, 8, 8}}> ()
        y = Resize <mode = "linear", keep_aspect_ratio_policy = "{policy}"> (x, , , sizes)
    }}""")


def _policies(model):
    return [a.s.decode() for n in model.graph.node if n.op_type == "Resize"
            for a in n.attribute if a.name == "keep_aspect_ratio_policy"]


@pytest.mark.parametrize("domain_field", ["set", "unset"])
def test_stretch_is_dropped_exactly(rng, domain_field):
    m = resize_model("stretch")
    if domain_field == "unset":   # torch's dynamo exporter leaves NodeProto.domain unset
        for n in m.graph.node:
            n.ClearField("domain")
    out, rep = rewriter.rewrite(m, ["default-attributes"], verify=True)
    assert _policies(out) == []
    assert rep.passes[0].counts.get("dropped-keep-aspect-ratio-policy") == 1
    onnx.checker.check_model(out)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    np.testing.assert_array_equal(run_ort(m, {"x": x})[0], run_ort(out, {"x": x})[0])


def test_other_policies_stay():
    m = resize_model("not_larger")
    out, rep = rewriter.rewrite(m, ["default-attributes"])
    assert _policies(out) == ["not_larger"]
    assert rep.passes[0].counts.get("skip:keep-aspect-ratio-policy-not_larger") == 1


def test_in_the_default_pipeline_for_migraphx_only():
    assert "default-attributes" in default_pipeline("migraphx")
    assert "default-attributes" not in default_pipeline(None)
    out, _ = rewriter.rewrite(resize_model("stretch"), target="migraphx")
    assert _policies(out) == []


# What the shared builds' parsers do with a Resize's keep_aspect_ratio_policy, measured
# (src/onnx/parse_resize.cpp): with a sizes input 2.15 refuses the attribute whatever its
# value, 2.16 takes stretch only; with scales both ignore it.
PARSES = {("sizes", "stretch"): {"2.15": False, "2.16": True},
          ("sizes", "not_larger"): {"2.15": False, "2.16": False},
          ("sizes", None): {"2.15": True, "2.16": True},
          ("scales", "stretch"): {"2.15": True, "2.16": True},
          ("scales", "not_larger"): {"2.15": True, "2.16": True}}


def policy_model(given: str, policy):
    attr = f', keep_aspect_ratio_policy = "{policy}"' if policy else ""
    call = "(x, , , sz)" if given == "sizes" else "(x, , sc)"
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 18]>
    g (float[1, 2, 4, 4] x) => (float[1, 2, 8, 8] y) {{
        sz = Constant <value = int64[4] {{1, 2, 8, 8}}> ()
        sc = Constant <value = float[4] {{1.0, 1.0, 2.0, 2.0}}> ()
        y = Resize <mode = "nearest"{attr}> {call}
    }}""")


@pytest.mark.migraphx
@pytest.mark.parametrize("given,policy", list(PARSES))
def test_policy_parses_as_measured_and_the_check_says_so(given, policy, tmp_path,
                                                        migraphx_version):
    """On the installed MIGraphX: the parser does what was measured on the shared builds,
    the static check for that version agrees, and the rewrite for MIGraphX parses wherever
    the policy is the default."""
    import migraphx

    from rewriter.migraphx.check import check_model

    m = policy_model(given, policy)
    version = ".".join(map(str, migraphx_version[:2]))
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    try:
        migraphx.parse_onnx(str(path))
        parses = True
    except Exception as e:  # noqa: BLE001 - MIGraphX raises RuntimeError
        assert "keep_aspect_ratio_policy" in str(e), e
        parses = False
    if version in PARSES[(given, policy)]:
        assert parses == PARSES[(given, policy)][version]
    refused = [f for f in check_model(m, version=migraphx_version[:2]).errors
               if f.code == "resize-mode-refused"]
    assert len(refused) == (0 if parses else 1), refused   # one finding, not one per rule
    out, _ = rewriter.rewrite(m, target="migraphx")
    onnx.save(out, path)
    if policy in (None, "stretch"):
        migraphx.parse_onnx(str(path))
    assert not check_model(out, version=migraphx_version[:2]).errors or policy == "not_larger"


def conv_transpose_model(rng, pads, output_padding, *, extra="", strides=(1, 2),
                         kernel=(1, 3), group=2, dilations=(1, 1), shape=(1, 4, 3, 5)):
    """One ConvTranspose with distinct random weights and bias (onnx.helper, not text:
    the attributes vary)."""
    from onnx import TensorProto, helper, numpy_helper
    c = shape[1]
    w = rng.standard_normal((c, c // group, *kernel)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    attrs = dict(pads=list(pads), strides=list(strides), kernel_shape=list(kernel),
                 group=group, dilations=list(dilations))
    if output_padding is not None:
        attrs["output_padding"] = list(output_padding)
    if extra == "output_shape":
        attrs["output_shape"] = [shape[2] * strides[0], shape[3] * strides[1]]
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, list(shape))], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w"),
                                             numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _ct_attrs(model):
    n = next(n for n in model.graph.node if n.op_type == "ConvTranspose")
    return {a.name: list(onnx.helper.get_attribute_value(a)) for a in n.attribute
            if a.name in ("pads", "output_padding")}


# (pads, output_padding, strides, kernel, dilations): torch's ConvTranspose2d(k=3, s=2,
# p=1, output_padding=1), DeepFilterNet3's frequency upsampler, a dilated one, one where
# output_padding is smaller than the end pad
FOLDS = [((1, 1, 1, 1), (1, 1), (2, 2), (3, 3), (1, 1)),
         ((0, 1, 0, 1), (0, 1), (1, 2), (1, 3), (1, 1)),
         ((2, 1, 2, 2), (1, 1), (3, 2), (3, 3), (2, 2)),
         ((0, 0, 0, 2), (0, 1), (1, 3), (1, 4), (1, 1))]


@pytest.mark.parametrize("pads,opad,strides,kernel,dil", FOLDS)
def test_output_padding_moves_into_the_end_pads_exactly(rng, pads, opad, strides, kernel, dil):
    m = conv_transpose_model(rng, pads, opad, strides=strides, kernel=kernel, dilations=dil)
    out, rep = rewriter.rewrite(m, ["default-attributes"], verify=True)
    half = len(pads) // 2
    assert _ct_attrs(out) == {"pads": list(pads[:half]) + [
        e - o for e, o in zip(pads[half:], opad)]}
    assert rep.passes[0].counts.get("output-padding-to-pads") == 1
    x = rng.standard_normal((1, 4, 3, 5)).astype(np.float32)
    a, b = run_ort(m, {"x": x})[0], run_ort(out, {"x": x})[0]
    assert a.shape == b.shape
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("pads,opad,extra,reason", [
    ((0, 0, 0, 0), (0, 1), "", None),                       # no pads: MIGraphX is right
    ((0, 1, 0, 0), (0, 1), "", "skip:output-padding-past-end-pad"),
    ((0, 1, 0, 1), (0, 1), "output_shape",
     "skip:output-padding-with-output-shape-or-auto-pad"),
    ((0, 1, 0, 1), None, "", None)])
def test_output_padding_stays_where_moving_it_is_not_exact(rng, pads, opad, extra, reason):
    m = conv_transpose_model(rng, pads, opad, extra=extra)
    out, rep = rewriter.rewrite(m, ["default-attributes"], verify=True)
    assert _ct_attrs(out) == _ct_attrs(m)
    counts = rep.passes[0].counts
    assert "output-padding-to-pads" not in counts
    assert (reason is None and not counts) or counts.get(reason) == 1


def on_migraphx(model, x, like, tmp_path):
    """The model's last output on MIGraphX's ref target for input x, shaped as like."""
    import migraphx
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    p = migraphx.parse_onnx(str(path))
    p.compile(migraphx.get_target("ref"))
    return np.array(p.run({"x": migraphx.argument(x)})[-1]).reshape(like.shape)


@pytest.mark.migraphx
def test_migraphx_computes_output_padding_next_to_pads_wrong_and_the_rewrite_right(
        rng, tmp_path, migraphx_version):
    """Measured on 2.15 and 2.16 (ref): right shape, wrong values (max abs error ~1 on
    unit-normal data); after the rewrite equal to onnxruntime. Should a build fix it, the
    first assert says the rewrite is no longer needed, never that it is wrong."""
    m = conv_transpose_model(rng, (1, 1, 1, 1), (1, 1), strides=(2, 2), kernel=(3, 3))
    out, _ = rewriter.rewrite(m, target="migraphx")
    x = rng.standard_normal((1, 4, 3, 5)).astype(np.float32)
    want = run_ort(m, {"x": x})[0]

    assert np.abs(on_migraphx(m, x, want, tmp_path) - want).max() > 0.1
    np.testing.assert_allclose(on_migraphx(out, x, want, tmp_path), want, rtol=1e-5, atol=1e-5)


def test_the_check_flags_output_padding_next_to_pads_until_it_is_moved(rng):
    """`rewrite check` on the original says MIGraphX computes it wrongly (it said nothing:
    a user who only ran the check did not hear of it); after the rewrite it is gone; a
    ConvTranspose with output_padding and no pads (right on MIGraphX) is not flagged."""
    from rewriter.migraphx.check import check_model

    def codes(model):
        return [f.code for f in check_model(model).findings]
    m = conv_transpose_model(rng, (1, 1, 1, 1), (1, 1), strides=(2, 2), kernel=(3, 3))
    assert codes(m).count("convtranspose-output-padding") == 1
    out, _ = rewriter.rewrite(m, target="migraphx")
    assert "convtranspose-output-padding" not in codes(out)
    bare = conv_transpose_model(rng, (0, 0, 0, 0), (1, 1), strides=(2, 2), kernel=(3, 3))
    assert "convtranspose-output-padding" not in codes(bare)
    past = conv_transpose_model(rng, (0, 1, 0, 0), (0, 1))   # left by the pass: still flagged
    out, _ = rewriter.rewrite(past, target="migraphx")
    assert codes(out).count("convtranspose-output-padding") == 1


# Softplus around and past the threshold, and past where log(1 + exp(x)) overflows float32
SOFTPLUS_X = [-100.0, -1.0, 0.0, 10.0, 19.99, 20.0, 20.001, 30.0, 88.0, 88.8, 89.0, 1e3, 3e38]


def softplus_model(dtype="float", guard=None):
    """x -> Linear -> Softplus (Mamba's time steps); ``guard``: the dynamo exporter's
    Where(x > guard, x, Softplus(x)) around it."""
    body = ("""
        c = Greater (h, t)
        s = Softplus (h)
        y = Where (c, h, s)""" if guard is not None else """
        y = Softplus (h)""")
    np_dtype = {"float": np.float32, "float16": np.float16, "double": np.float64}[dtype]
    inits = {"one": np.array(1.0, np_dtype), "t": np.array(guard or 0.0, np_dtype)}
    if guard is None:
        del inits["t"]
    return make_model(f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g ({dtype}[1, 13] x) => ({dtype}[1, 13] y) {{
        h = Mul (x, one)
        {body}
    }}""", inits)


def test_softplus_is_guarded_past_20_exactly():
    """(onnxruntime has no float16 Softplus kernel: float32 only.)"""
    m = softplus_model()
    out, rep = rewriter.rewrite(m, ["default-attributes"], verify=True)
    assert rep.passes[0].counts.get("softplus-guarded") == 1
    assert [n.op_type for n in out.graph.node] == ["Mul", "Softplus", "Greater", "Where"]
    x = np.array(SOFTPLUS_X, np.float32)[None]
    np.testing.assert_array_equal(run_ort(m, {"x": x})[0], run_ort(out, {"x": x})[0])
    again, rep2 = rewriter.rewrite(out, ["default-attributes"])
    assert again.SerializeToString() == out.SerializeToString() and not rep2.passes[0].counts


@pytest.mark.parametrize("guard,dtype,kept", [(20.0, "float", "guarded"),
                                              (88.0, "float", "guarded"),
                                              (100.0, "float", "guarded again"),
                                              (None, "double", "float64")])
def test_a_guarded_or_float64_softplus_stays(guard, dtype, kept):
    m = softplus_model(dtype, guard)   # (onnxruntime has no float64 Softplus: not verified)
    out, rep = rewriter.rewrite(m, ["default-attributes"], verify=dtype == "float")
    counts = rep.passes[0].counts
    if kept == "guarded again":   # past 88 the guard leaves an inf in: guarded at 20 too
        assert counts.get("softplus-guarded") == 1
        return
    assert [n.op_type for n in out.graph.node] == [n.op_type for n in m.graph.node]
    assert counts == ({"skip:softplus-float64": 1} if kept == "float64" else {}), counts


@pytest.mark.migraphx
def test_migraphx_overflows_softplus_and_the_guard_keeps_it_finite(tmp_path, migraphx_version):
    """Measured on 2.15 and 2.16 (ref): Softplus(89) and past is inf (log(1 + exp(x)));
    guarded, every value is onnxruntime's within float rounding. Should a build fix it,
    the first assert says the guard is no longer needed, never that it is wrong."""
    m = softplus_model()
    out, _ = rewriter.rewrite(m, target="migraphx")
    x = np.array(SOFTPLUS_X, np.float32)[None]
    want = run_ort(m, {"x": x})[0]

    assert not np.isfinite(on_migraphx(m, x, want, tmp_path)).all()
    np.testing.assert_allclose(on_migraphx(out, x, want, tmp_path), want, rtol=1e-6, atol=1e-6)
