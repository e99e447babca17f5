"""fuse-space-to-depth: the Focus stem becomes SpaceToDepth (+ permuted conv weight or a
Gather); incomplete or irregular stems stay."""

import numpy as np
import onnx
from conftest import make_model, ops, run_ort

import rewriter

BIG = 9223372036854775807


def focus(order, reader: str, extra_out: str = "") -> onnx.ModelProto:
    lines = []
    names = []
    for k, (i, j) in enumerate(order):
        lines.append(f"s{k} = Slice (x, st{i}{j}, en, ax, sp)")
        names.append(f"s{k}")
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, H, W] x) => (float[N, 8, H2, W2] y{extra_out}) {{
        {chr(10).join(lines)}
        c = Concat <axis = 1> ({", ".join(names)})
        {reader}
    }}"""
    inits = {f"st{i}{j}": np.array([i, j], np.int64) for i in range(2) for j in range(2)}
    inits.update({"en": np.array([BIG, BIG], np.int64), "ax": np.array([2, 3], np.int64),
                  "sp": np.array([2, 2], np.int64), "W": (8, 12, 3, 3), "W2": (8, 12, 1, 1)})
    return make_model(text, inits)


def check(m, out, rng):
    for shape in ((1, 3, 8, 8), (2, 3, 12, 6)):
        f = {"x": rng.standard_normal(shape).astype(np.float32)}
        for a, b in zip(run_ort(m, f), run_ort(out, f)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)


def test_yolo_focus_stem_becomes_space_to_depth_with_the_conv_weight_permuted(rng):
    m = focus([(0, 0), (1, 0), (0, 1), (1, 1)], "y = Conv <pads = [1, 1, 1, 1]> (c, W)")
    out, rep = rewriter.rewrite(m, ["fuse-space-to-depth"], verify=True,
                                input_shapes={"x": [1, 3, 8, 8]})
    assert ops(out) == ["SpaceToDepth", "Conv"] and rep.passes[0].counts["fused"] == 1
    check(m, out, rng)


def test_other_readers_get_a_gather_that_restores_the_order(rng):
    m = focus([(1, 1), (0, 0), (1, 0), (0, 1)], "y = Conv <pads = [1, 1, 1, 1]> (c, W)\n"
              "        z = Relu (c)", extra_out=", float[N, 12, H2, W2] z")
    out, rep = rewriter.rewrite(m, ["fuse-space-to-depth"], verify=True,
                                input_shapes={"x": [1, 3, 8, 8]})
    assert sorted(ops(out)) == ["Conv", "Gather", "Relu", "SpaceToDepth"]
    check(m, out, rng)
    onnx.checker.check_model(out, full_check=True)


def test_missing_or_repeated_blocks_stay(rng):
    m = focus([(0, 0), (1, 0), (0, 1), (0, 1)], "y = Conv <pads = [1, 1, 1, 1]> (c, W)")
    out, rep = rewriter.rewrite(m, ["fuse-space-to-depth"])
    assert "SpaceToDepth" not in ops(out) and ops(out).count("Slice") == 4


def test_torchscripts_chained_focus_becomes_space_to_depth_in_the_default_pipeline(rng):
    """TorchScript writes x[..., ::2, ::2] as Slice(H) -> Slice(W), the H slices shared:
    collapse-chains makes them four Slices of x, which this pass then fuses (a YOLOv5
    export kept all six, fifteenth round)."""
    lines = []
    for i in range(2):
        lines.append(f"h{i} = Slice (x, i{i}, en, ax2, sp)")
        lines += [f"s{i}{j} = Slice (h{i}, i{j}, en, ax3, sp)" for j in range(2)]
    m = make_model(f"""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 3, H, W] x) => (float[N, 8, H2, W2] y) {{
        {chr(10).join(lines)}
        c = Concat <axis = 1> (s00, s10, s01, s11)
        y = Conv <pads = [1, 1, 1, 1]> (c, W)
    }}""", {"i0": np.array([0], np.int64), "i1": np.array([1], np.int64),
            "en": np.array([BIG], np.int64), "ax2": np.array([2], np.int64),
            "ax3": np.array([3], np.int64), "sp": np.array([2], np.int64), "W": (8, 12, 3, 3)})
    out, rep = rewriter.rewrite(m, verify=True, target="none")
    assert ops(out) == ["SpaceToDepth", "Conv"], ops(out)
    check(m, out, rng)
