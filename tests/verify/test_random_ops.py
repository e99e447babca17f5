"""Random ops (VITS draws its durations' and its prior's noise with RandomNormalLike): an
unseeded one draws anew in every onnxruntime session, so the original itself differs from
run to run and every rewrite failed --verify, blamed on the first pass that changed it.
The verifier seeds them alike in the reference and every candidate, says so, and a wrong
rewrite still fails."""

import numpy as np
import onnx
import pytest
from conftest import make_model

import rewriter
from rewriter.core.errors import VerificationError
from rewriter.verify.verifier import exact_kernels, unseeded_random

# The noise's shape follows the input's, as VITS's follows its durations; c is what
# fold-constants folds.
TEXT = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 8] x) => (float[N, 8] y) {
    n = RandomNormalLike (x)
    u = RandomUniformLike <high = 2.0> (x)
    s = Mul (n, u)
    c = Add (a, b)
    t = Mul (s, c)
    y = Add (x, t)
}
"""


def model():
    rng = np.random.default_rng(0)
    return make_model(TEXT, {k: rng.standard_normal(8).astype(np.float32) for k in "ab"})


def test_unseeded_random_ops_verify_with_the_same_draws_and_say_so():
    _, rep = rewriter.rewrite(model(), ["fold-constants"], verify=True)
    assert rep.passes[0].changed and rep.verified, rep.verification
    assert rep.verification[0]["max_abs"] == 0, rep.verification
    assert "RandomNormalLike/RandomUniformLike seeded alike" in rep.verified_with


def test_a_wrong_rewrite_of_a_model_with_random_ops_still_fails(monkeypatch):
    from rewriter.passes import fold_constants
    real = fold_constants.FoldConstants.run

    def wrong(self, graph, ctx):
        res = real(self, graph, ctx)
        if res.changed:   # the folded Add has no outputs left: the last one
            next(n for n in graph.nodes if n.op == "Add" and n.outputs).op = "Sub"
        return res

    monkeypatch.setattr(fold_constants.FoldConstants, "run", wrong)
    with pytest.raises(VerificationError):
        rewriter.rewrite(model(), ["fold-constants"], verify=True)


def test_seeds_only_in_the_verifiers_copy_and_never_over_the_models_own():
    m = model()
    seeded = exact_kernels(m)
    assert unseeded_random(m) and not unseeded_random(seeded)
    assert not any(a.name == "seed" for n in m.graph.node for a in n.attribute)
    own = onnx.helper.make_attribute("seed", 7.0)
    m.graph.node[0].attribute.append(own)
    again = exact_kernels(m)
    assert [a for a in again.graph.node[0].attribute if a.name == "seed"][0].f == 7.0
    assert len(unseeded_random(m)) == 1


def test_the_rewritten_model_keeps_its_random_ops_unseeded(tmp_path):
    out, _ = rewriter.rewrite(model(), verify=True)
    assert [n.op_type for n in out.graph.node].count("RandomNormalLike") == 1
    assert unseeded_random(out) and "Add" in [n.op_type for n in out.graph.node]


def test_random_outputs_are_those_computed_from_random_ops():
    from rewriter.verify.verifier import random_outputs
    m = model()
    m.graph.output.append(onnx.helper.make_tensor_value_info("c", onnx.TensorProto.FLOAT, [8]))
    assert random_outputs(m) == {"y": "RandomNormalLike/RandomUniformLike"}
