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
