"""Each pass is checked on the first QUICK_FEEDS inputs, the result on all of them."""

from pathlib import Path

import numpy as np
import pytest

import rewriter
from rewriter.passes.fuse_conv_bn import FuseConvBn
from rewriter.verify import verifier as vmod

MODEL = str(Path(__file__).resolve().parents[2] / "models" / "resnet_mini.onnx")


def inputs(n, big_at=()):
    rng = np.random.default_rng(0)
    feeds = [{"input": rng.standard_normal((1, 3, 64, 64)).astype(np.float32)}
             for _ in range(n)]
    for k in big_at:
        feeds[k]["input"][0, 0, 0, 0] = 50.0
    return feeds


def sizes_checked(monkeypatch) -> list:
    seen = []
    check = vmod.Verifier.check

    def counted(self, exported, numerics, depth=1):
        seen.append(len(self.feed_sets))
        return check(self, exported, numerics, depth)
    monkeypatch.setattr(vmod.Verifier, "check", counted)
    return seen


def test_passes_are_checked_on_the_first_inputs_and_the_result_on_all(monkeypatch):
    """128 inputs and 4 passes that changed the graph ran the model 512 times (339 s of a
    420 s run, thirtieth round): now 16 per pass and all 40 once, at the end."""
    seen = sizes_checked(monkeypatch)
    _, rep = rewriter.rewrite(MODEL, verify=True, inputs=inputs(40), materialize=False)
    q = vmod.QUICK_FEEDS
    assert len(seen) >= 2 and seen[:-1] == [q] * (len(seen) - 1) and seen[-1] == 40
    assert f"each pass checked on the first {q}, the result on all" in rep.verified_with
    assert rep.ok
    seen.clear()
    rewriter.rewrite(MODEL, verify=True, inputs=inputs(q), materialize=False)
    assert seen and set(seen) == {q}   # no more than QUICK_FEEDS: no final re-run


def test_a_miss_beyond_the_first_inputs_is_still_caught(monkeypatch):
    """A pass that changes outputs only where an input value is large, on an input after
    the first QUICK_FEEDS: its own check passes, the final check on all inputs fails."""
    run = FuseConvBn.run

    def broken(self, graph, ctx):
        res = run(self, graph, ctx)
        conv = next(n for n in graph.nodes if n.op == "Conv")
        x = conv.inputs[0]
        import onnx_graphsurgeon as gs
        big = gs.Variable(ctx.namer("big"), dtype=np.bool_)
        lim = gs.Constant(ctx.namer("lim"), np.array(10.0, np.float32))
        half = gs.Constant(ctx.namer("half"), np.array(0.5, np.float32))
        scaled = gs.Variable(ctx.namer("scaled"), dtype=np.float32)
        moved = gs.Variable(ctx.namer("moved"), dtype=np.float32)
        graph.nodes += [gs.Node("Greater", inputs=[x, lim], outputs=[big]),
                        gs.Node("Mul", inputs=[x, half], outputs=[scaled]),
                        gs.Node("Where", inputs=[big, scaled, x], outputs=[moved])]
        conv.inputs[0] = moved
        return res
    monkeypatch.setattr(FuseConvBn, "run", broken)
    q = vmod.QUICK_FEEDS
    with pytest.raises(rewriter.VerificationError, match="drift beyond tolerance") as e:
        rewriter.rewrite(MODEL, verify=True, inputs=inputs(q + 8, big_at=[q + 3]),
                         materialize=False)
    assert e.value.report.failed_pass == "(final model)"
    # on the first inputs, the pass itself is blamed, as before
    with pytest.raises(rewriter.VerificationError, match="after pass 'fuse-conv-bn'"):
        rewriter.rewrite(MODEL, verify=True, inputs=inputs(q + 8, big_at=[2]),
                         materialize=False)


def test_the_first_inputs_keep_the_class_outputs_found_on_all(tmp_path):
    """Conv -> GlobalAveragePool -> Flatten has classes only where its argmax is decisive,
    decided on the samples: on 40 held-out samples with labels it was, on the first 16
    (small inputs) not, and the per-pass check raised "labels judge a classifier's [N,
    classes] output ... this model has none" after the full check had accepted them."""
    from conftest import gap_head
    model = gap_head()
    rng = np.random.default_rng(0)
    q = vmod.QUICK_FEEDS
    feeds = [{"x": (rng.standard_normal((1, 3, 8, 8)) * (0.01 if k < q else 0) +
                    rng.standard_normal((1, 3, 1, 1)) * (0 if k < q else 20)
                    ).astype(np.float32)} for k in range(40)]
    v = vmod.Verifier(model, None, feeds, labels=np.arange(40) % 4)
    assert v.classes == [True]
    assert v.quick().classes == [True] and len(v.quick().feed_sets) == q
