"""bound-loops: a Loop's trip count from the counters its condition tests, exactly; MIGraphX
2.15 and 2.16 size a loop's outputs for its trip count (65535 for tf2onnx's 2^63 - 1)."""

import numpy as np
import onnx
import pytest
from conftest import run_ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import rewriter
from rewriter.core.registry import default_pipeline

INF = 2**63 - 1


def map_loop(n=3, feat=50, m=INF, test="Less(Cast(c + 1), n)", seed=0, bound=None, step=1,
             c0=0, second=None):
    """tf2onnx's tf.map_fn over x [n, feat]: Loop(M, True, c0) { c' = c + step; cond' =
    a test of a counter; y_j = Gather(x, j) * w }, y [n, feat] when the test stops it there.
    ``second``: a second term of the condition, And-ed."""
    rng = np.random.default_rng(seed)
    bound = float(n) if bound is None else bound
    nodes = [h.make_node("Add", ["c", "step"], ["c2"]),
             h.make_node("Gather", ["x", "i"], ["row"], axis=0),
             h.make_node("Mul", ["row", "w"], ["y"])]
    inits = [numpy_helper.from_array(np.array(step, np.int64), "step"),
             numpy_helper.from_array(np.array(1, np.int64), "one")]
    if test == "Less(Cast(c + 1), n)":
        nodes += [h.make_node("Cast", ["c2"], ["c2f"], to=T.FLOAT),
                  h.make_node("Less", ["c2f", "nf"], ["go"])]
    elif test == "Greater(n, i + 1)":
        nodes += [h.make_node("Add", ["i", "one"], ["i2"]),
                  h.make_node("Greater", ["ni", "i2"], ["go"])]
    elif test == "Less(c, n)":
        nodes += [h.make_node("Less", ["c", "ni"], ["go"])]
    elif test == "Less(c * 1, n)":
        nodes += [h.make_node("Mul", ["c", "one"], ["cm"]), h.make_node("Less", ["cm", "ni"],
                                                                        ["go"])]
    elif test == "Less(c + 1, xs)":     # the bound is computed, not a constant
        nodes += [h.make_node("Shape", ["x"], ["sh"]),
                  h.make_node("Gather", ["sh", "zero"], ["xs"], axis=0),
                  h.make_node("Less", ["c2", "xs"], ["go"])]
        inits.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
    if second is not None:
        nodes[-1].output[0] = "go1"
        nodes += [h.make_node("Add", ["i", "one"], ["i3"]),
                  h.make_node("Less", ["i3", "n2"], ["go2"]),
                  h.make_node("And", ["go1", "go2"], ["go"])]
    vi = h.make_tensor_value_info
    body = h.make_graph(nodes, "body", [vi("i", T.INT64, []), vi("cin", T.BOOL, []),
                                        vi("c", T.INT64, [])],
                        [vi("go", T.BOOL, []), vi("c2", T.INT64, []), vi("y", T.FLOAT, [feat])],
                        inits)
    g = h.make_graph(
        [h.make_node("Loop", ["M", "t", "c0"], ["cN", "ys"], body=body)], "m",
        [vi("x", T.FLOAT, ["N", feat])], [vi("ys", T.FLOAT, [None, feat])],
        [numpy_helper.from_array(np.array(m, np.int64), "M"),
         numpy_helper.from_array(np.array(True), "t"),
         numpy_helper.from_array(np.array(c0, np.int64), "c0"),
         numpy_helper.from_array(np.array(bound, np.float32), "nf"),
         numpy_helper.from_array(np.array(int(bound), np.int64), "ni"),
         numpy_helper.from_array(np.array(second or 0, np.int64), "n2"),
         numpy_helper.from_array(rng.standard_normal(feat).astype(np.float32), "w")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def trip_count(model):
    loop = next(n for n in model.graph.node if n.op_type == "Loop")
    if not loop.input[0]:
        return None
    inits = {t.name: t for t in model.graph.initializer}
    return int(numpy_helper.to_array(inits[loop.input[0]]))


def feeds(rows=3, feat=50, seed=1):
    return {"x": np.random.default_rng(seed).standard_normal((rows, feat)).astype(np.float32)}


@pytest.mark.parametrize("test, kw, want", [
    ("Less(Cast(c + 1), n)", {}, 3),                      # tf2onnx's map_fn
    ("Less(Cast(c + 1), n)", {"bound": 2.5}, 3),          # a float bound: ceil
    ("Less(Cast(c + 1), n)", {"n": 1}, 1),
    ("Greater(n, i + 1)", {}, 3),                         # the iteration number
    ("Less(c, n)", {}, 4),                                # tested before the step: one more
    ("Less(Cast(c + 1), n)", {"n": 6, "step": 2}, 3),     # c = 0, 2, 4
    ("Less(Cast(c + 1), n)", {"n": 4, "c0": 2}, 2),       # c = 2, 3
    ("Less(Cast(c + 1), n)", {"n": 5, "second": 3}, 3),   # And: the smaller bound
    ("Less(Cast(c + 1), n)", {"m": 7}, 3),
])
def test_the_trip_count_becomes_the_iterations_the_condition_allows(test, kw, want):
    m = map_loop(test=test, **kw)
    out, rep = rewriter.rewrite(m, ["bound-loops"], verify=True, inputs=[feeds(6)])
    assert rep.passes[0].counts["bounded-trip-counts"] == 1
    assert trip_count(out) == want
    onnx.checker.check_model(out, full_check=True)
    for f in (feeds(6), feeds(8, seed=2)):
        for a, b in zip(run_ort(m, f), run_ort(out, f)):
            assert a.shape == b.shape and np.array_equal(a, b)
    again, rep2 = rewriter.rewrite(out, ["bound-loops"])
    assert trip_count(again) == want and not rep2.passes[0].changed


@pytest.mark.parametrize("why, test, kw", [
    ("condition-not-a-counter-bound", "Less(Cast(c + 1), n)", {"step": -1}),
    ("condition-not-a-counter-bound", "Less(c * 1, n)", {}),
    ("condition-not-a-counter-bound", "Less(c + 1, xs)", {}),
    ("trip-count-within-bound", "Less(Cast(c + 1), n)", {"m": 2}),
])
def test_a_loop_it_cannot_bound_is_left_alone(why, test, kw):
    m = map_loop(test=test, **kw)
    out, rep = rewriter.rewrite(m, ["bound-loops"])
    assert rep.passes[0].counts[f"skip:{why}"] == 1
    assert trip_count(out) == trip_count(m)


def test_a_computed_trip_count_is_left_alone():
    m = map_loop()
    loop = m.graph.node[0]
    m.graph.node.insert(0, h.make_node("Identity", ["M"], ["Mc"]))
    loop.input[0] = "Mc"
    out, rep = rewriter.rewrite(m, ["bound-loops"])
    assert rep.passes[0].counts["skip:trip-count-computed"] == 1


def test_a_missing_trip_count_gets_one_and_a_shared_one_is_copied():
    m = map_loop()
    m.graph.node[0].input[0] = ""
    out, _ = rewriter.rewrite(m, ["bound-loops"], verify=True, inputs=[feeds()])
    assert trip_count(out) == 3
    two = map_loop()
    loop2 = onnx.NodeProto()
    loop2.CopyFrom(two.graph.node[0])
    loop2.output[:] = ["cN2", "ys2"]
    loop2.input[2] = "seven"   # the same M, a counter from 7: no bound below INF
    two.graph.initializer.append(numpy_helper.from_array(np.array(7, np.int64), "seven"))
    two.graph.node.append(loop2)
    two.graph.output.append(h.make_tensor_value_info("ys2", T.FLOAT, [None, 50]))
    out, rep = rewriter.rewrite(two, ["bound-loops"], verify=True, inputs=[feeds()])
    assert rep.passes[0].counts["bounded-trip-counts"] == 2
    ms = {n.output[1]: n.input[0] for n in out.graph.node if n.op_type == "Loop"}
    inits = {t.name: int(numpy_helper.to_array(t)) for t in out.graph.initializer
             if t.name in ms.values()}
    assert inits[ms["ys"]] == 3 and inits[ms["ys2"]] == 1


def test_the_static_check_says_what_is_left_unbounded():
    from rewriter.migraphx.check import check_model

    def codes(model):
        return [f.code for f in check_model(model).findings]
    m = map_loop()
    assert codes(m).count("loop-trip-count-unbounded") == 1
    out, _ = rewriter.rewrite(m, target="migraphx")
    assert "loop-trip-count-unbounded" not in codes(out)
    left = map_loop(test="Less(c * 1, n)")        # a condition bound-loops cannot read
    out, _ = rewriter.rewrite(left, ["bound-loops"])
    assert codes(out).count("loop-trip-count-unbounded") == 1
    assert "loop-trip-count-unbounded" not in codes(map_loop(m=65534))


def test_in_the_migraphx_pipeline_only():
    assert "bound-loops" in default_pipeline("migraphx")
    assert "bound-loops" not in default_pipeline(None)


@pytest.mark.migraphx
def test_migraphx_gives_the_loops_rows_once_bounded(tmp_path, migraphx_version):
    """MIGraphX takes M = 2^63 - 1 as 65535 iterations: the map's output came out
    [65535, 50] where onnxruntime gives [3, 50]."""
    from rewriter.migraphx import backend

    m = map_loop(n=3)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    src, dst = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(m, src)
    f = feeds(3)
    before = backend.compile_and_run(src, f, None, target="ref")
    assert np.shape(before.outputs[0])[-2] == 65535    # [runs, iterations, 50]
    out, _ = rewriter.rewrite(m, target="migraphx")
    assert trip_count(out) == 3
    onnx.save(out, dst)
    run = backend.compile_and_run(dst, f, None, target="ref")
    want = run_ort(m, f)[0]
    np.testing.assert_allclose(np.reshape(run.outputs[0], want.shape), want, rtol=1e-6,
                               atol=1e-6)
    assert np.shape(run.outputs[0])[-2] == 3


def counted_loop(n=19, readable=True):
    """Loop(no M, True, acc = 0) { acc' = acc + 1; y_i = x * i; cond' = i < n } (readable)
    or (i * 1) < n (not read by bound-loops): n + 1 iterations."""
    vi = h.make_tensor_value_info
    test = [h.make_node("Less", ["i", "n"], ["go"])] if readable else [
        h.make_node("Mul", ["i", "one_i"], ["im"]), h.make_node("Less", ["im", "n"], ["go"])]
    body = h.make_graph(
        [h.make_node("Add", ["acc", "one"], ["acc2"]), h.make_node("Cast", ["i"], ["fi"],
                                                                   to=T.FLOAT),
         h.make_node("Mul", ["x", "fi"], ["y"])] + test, "body",
        [vi("i", T.INT64, []), vi("c", T.BOOL, []), vi("acc", T.FLOAT, [])],
        [vi("go", T.BOOL, []), vi("acc2", T.FLOAT, []), vi("y", T.FLOAT, [3])],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
         numpy_helper.from_array(np.array(1, np.int64), "one_i")])
    g = h.make_graph(
        [h.make_node("Loop", ["", "t", "a0"], ["accN", "ys"], body=body)], "m",
        [vi("x", T.FLOAT, [3])], [vi("accN", T.FLOAT, []), vi("ys", T.FLOAT, [None, 3])],
        [numpy_helper.from_array(np.array(n, np.int64), "n"),
         numpy_helper.from_array(np.array(True), "t"),
         numpy_helper.from_array(np.array(0.0, np.float32), "a0")])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def test_the_static_check_warns_of_a_loop_with_no_trip_count():
    """MIGraphX runs a Loop without M for max_loop_iterations (10): nothing said it."""
    from rewriter.migraphx.check import check_model

    def codes(model):
        return [f.code for f in check_model(model).findings]
    assert codes(counted_loop()).count("loop-trip-count-unbounded") == 1
    out, _ = rewriter.rewrite(counted_loop(), ["bound-loops"])
    assert trip_count(out) == 20 and "loop-trip-count-unbounded" not in codes(out)
    out, _ = rewriter.rewrite(counted_loop(readable=False), ["bound-loops"])
    assert codes(out).count("loop-trip-count-unbounded") == 1


@pytest.mark.migraphx
def test_migraphx_runs_a_loop_without_trip_count_ten_times(tmp_path, migraphx_version):
    from rewriter.migraphx import backend

    m, f = counted_loop(), {"x": np.array([1, 2, 3], np.float32)}
    onnx.save(m, tmp_path / "m.onnx")
    before = backend.compile_and_run(tmp_path / "m.onnx", f, None, target="ref")
    assert float(np.ravel(before.outputs[0])[0]) == 10 and run_ort(m, f)[0] == 20
    out, _ = rewriter.rewrite(m, target="migraphx")
    onnx.save(out, tmp_path / "out.onnx")
    run = backend.compile_and_run(tmp_path / "out.onnx", f, None, target="ref")
    for a, b in zip(run_ort(m, f), run.outputs):
        np.testing.assert_array_equal(np.reshape(b, a.shape), a)
