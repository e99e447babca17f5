"""layer_divergence: the first layer whose values leave the budget, named after a lossy plan
failed. It runs both models one feed set at a time and sums each layer's cosine as it goes,
so it holds one feed set's values, not all of them (U2-Net-p's failed plan: 3.4 GB)."""

import numpy as np
import onnx
from conftest import make_model

from rewriter.core import ort
from rewriter.core.convert import export, to_graph
from rewriter.verify import layer_divergence
from rewriter.verify.metrics import CosineSums, cosine

CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,8,{s},{s}] x) => (float[N,8,{s},{s}] y) {{
  a = Conv<pads=[1,1,1,1]>(x, w1)
  r = Relu(a)
  b = Conv<pads=[1,1,1,1]>(r, w2)
  y = Relu(b)
}}
"""


def _pair(size=24, noise=0.3):
    """(reference, candidate): the candidate's second conv has noisy weights."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    w2 = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    text = CHAIN.format(s=size)
    ref = make_model(text, {"w1": w1, "w2": w2})
    w2n = (w2 + noise * rng.standard_normal(w2.shape)).astype(np.float32)
    new = make_model(text, {"w1": w1, "w2": w2n})
    feeds = [{"x": rng.standard_normal((1, 8, size, size)).astype(np.float32)}
             for _ in range(8)]
    return ref, new, feeds


def _values(model, name, feeds):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.add().name = name
    sess = ort.session(probe)
    return np.concatenate([ort.run(sess, f, [name])[0].ravel() for f in feeds])


def test_names_the_first_layer_below_the_budget_with_its_cosine():
    ref, new, feeds = _pair()
    want = cosine(_values(ref, "b", feeds), _values(new, "b", feeds))
    assert abs(cosine(_values(ref, "a", feeds), _values(new, "a", feeds)) - 1) < 1e-12
    got = layer_divergence(export(to_graph(ref), ref), export(to_graph(new), new),
                           ["a", "b"], feeds, want + 1e-3, {"b": "Conv_b"}, chunk=1)
    assert got == f"Conv_b (cosine {want:.5f})"
    assert layer_divergence(export(to_graph(ref), ref), export(to_graph(new), new),
                            ["a", "b"], feeds, want - 1e-3) is None


def test_cosine_sums_equal_the_cosine_of_the_joined_arrays():
    rng = np.random.default_rng(4)
    parts = [(rng.standard_normal(n), rng.standard_normal(n)) for n in (5, 300, 7)]
    s = CosineSums()
    for a, b in parts:
        s.add(a.astype(np.float32), b.astype(np.float32))
    joined = cosine(np.concatenate([a.astype(np.float32) for a, _ in parts]),
                    np.concatenate([b.astype(np.float32) for _, b in parts]))
    assert abs(s.value() - joined) < 1e-12
    z = CosineSums()
    z.add(np.zeros(3), np.zeros(3))
    assert z.value() == 1.0
    z.add(np.zeros(3), np.ones(3))
    assert z.value() == 0.0


def test_memory_does_not_grow_with_the_feed_sets():
    """Every feed set's values of a chunk, in float64, for both models, was held at once:
    8 feed sets held 4x what 2 did."""
    import gc
    import tracemalloc

    ref, new, feeds = _pair(size=128)
    a, b = export(to_graph(ref), ref), export(to_graph(new), new)

    def peak(n):
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            layer_divergence(a, b, ["a", "r", "b", "y"], feeds[:n], 0.0)
            return tracemalloc.get_traced_memory()[1] - base
        finally:
            tracemalloc.stop()

    peak(1)
    few, many = peak(2), peak(8)
    assert many < 1.25 * few, (few, many)
