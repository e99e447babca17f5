"""fuse-pad: zero Pad -> Conv/AveragePool pads; MaxPool, non-zero and channel pads stay."""

import numpy as np
import onnx
from conftest import make_model, ops, run_ort

import rewriter


def pads(*p):
    return np.array(p, np.int64)


def test_pad_into_two_convs_and_an_average_pool(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 9, 9] x) => (float[N, 4, 9, 9] y, float[N, 4, 9, 9] z, float[N, 3, 9, 9] u) {
        p = Pad (x, P)
        y = Conv <pads = [0, 1, 0, 1]> (p, W1)
        z = Conv (p, W2)
        q = Pad (x, Q)
        u = AveragePool <kernel_shape = [3, 3]> (q)
    }""", {"P": pads(0, 0, 1, 0, 0, 0, 1, 0), "Q": pads(0, 0, 1, 1, 0, 0, 1, 1),
           "W1": (4, 3, 3, 1), "W2": (4, 3, 3, 1)})
    m.graph.output[1].type.tensor_type.shape.dim[3].dim_value = 11
    onnx.checker.check_model(m)
    out, rep = rewriter.rewrite(m, ["fuse-pad"], verify=True, input_shapes={"x": [2, 3, 9, 9]})
    assert "Pad" not in ops(out) and rep.passes[0].counts["fused"] == 2
    conv = [n for n in out.graph.node if n.op_type == "Conv"]
    assert [list(a.ints) for n in conv for a in n.attribute if a.name == "pads"] == [
        [1, 1, 1, 1], [1, 0, 1, 0]]
    for n in (1, 2):
        f = {"x": rng.standard_normal((n, 3, 9, 9)).astype(np.float32)}
        for a, b in zip(run_ort(m, f), run_ort(out, f)):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)


def test_maxpool_nonzero_value_channel_pads_and_negative_pads_stay(rng):
    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N, 3, 8, 8] x) => (float[N, 3, 10, 10] a, float[N, 4, 8, 8] b, float[N, 4, 8, 8] c, float[N, 4, 4, 4] d) {
        p = Pad (x, P)
        a = MaxPool <kernel_shape = [1, 1]> (p)
        p2 = Pad (x, P, v)
        b = Conv (p2, W)
        p3 = Pad (x, C)
        c = Conv (p3, W4)
        p4 = Pad (x, Neg)
        d = Conv (p4, W)
    }""", {"P": pads(0, 0, 1, 1, 0, 0, 1, 1), "v": np.array(1.0, np.float32),
           "C": pads(0, 1, 1, 1, 0, 0, 1, 1), "Neg": pads(0, 0, -1, -1, 0, 0, -1, -1),
           "W": (4, 3, 3, 3), "W4": (4, 4, 3, 3)})
    out, rep = rewriter.rewrite(m, ["fuse-pad"])
    assert ops(out).count("Pad") == 4 and not rep.passes[0].changed
