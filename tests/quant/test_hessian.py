"""GPTQ statistics per fold: the planner rounds fold f's weights with the other folds'
Hessians, computed in one pass; they must equal a pass over those folds alone."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rewriter.quant.hessian import ConvSpec, conv_hessians


def _model():
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
        [onnx.numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _im2col(x, spec):
    """The whole im2col of one batch by sliding windows, [group, (C/group)*kh*kw, N*H'*W']:
    what hessian.patches_at gathers columns of."""
    n, c, h, w = x.shape
    t, l, b, r = spec.pads
    xp = np.pad(x, ((0, 0), (0, 0), (t, b), (l, r)))
    kh, kw = spec.kernel
    dh, dw = spec.dilations
    sh, sw = spec.strides
    eh, ew = (kh - 1) * dh + 1, (kw - 1) * dw + 1
    win = np.lib.stride_tricks.sliding_window_view(xp, (eh, ew), axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]                    # [N, C, H', W', kh, kw]
    g = spec.group
    win = win.reshape(n, g, c // g, win.shape[2], win.shape[3], kh, kw)
    return np.ascontiguousarray(win.transpose(1, 2, 5, 6, 0, 3, 4)).reshape(
        g, (c // g) * kh * kw, -1)


def test_fold_complements_equal_a_pass_over_the_other_folds():
    rng = np.random.default_rng(1)
    data = [{"x": (rng.standard_normal((1, 3, 6, 6)) * (1 + i)).astype(np.float32)}
            for i in range(8)]
    spec = ConvSpec("conv", "x", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    folds = [list(range(f, 8, 4)) for f in range(4)]
    total, without = conv_hessians(_model(), [spec], data, progress=False, folds=folds)
    # Stored float32 (half the memory); sums of float32 products agree to about 1e-6 of
    # the largest entry, whichever order they are added in.
    assert total["conv"].dtype == np.float32 and without[0]["conv"].dtype == np.float32
    tol = {"rtol": 1e-5, "atol": 1e-6 * float(np.abs(total["conv"]).max())}
    np.testing.assert_allclose(total["conv"], conv_hessians(_model(), [spec], data,
                                                            progress=False)["conv"], **tol)
    for f in range(4):
        rest = [data[j] for g in range(4) if g != f for j in folds[g]]
        direct = conv_hessians(_model(), [spec], rest, progress=False)["conv"]
        np.testing.assert_allclose(without[f]["conv"], direct, **tol)
        assert not np.allclose(without[f]["conv"], total["conv"])


def test_the_memory_budget_keeps_the_cheapest_convs():
    from rewriter.quant.hessian import within_budget

    def spec(i, depth, group=1):
        return ConvSpec(f"c{i}", f"x{i}", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), group, depth)

    # 9216 = 1024 channels x 3 x 3: 340 MB of float32 each.
    specs = [spec(0, 9216), spec(1, 288), spec(2, 9216), spec(3, 9216, group=2), spec(4, 576)]
    assert specs[0].bytes() == 9216 * 9216 * 4 and specs[3].bytes(3) == 3 * 2 * specs[0].bytes()
    # the largest solve counts on top of every H held (3.3 d x d float64 measured): with
    # room for one 9216-wide H and its solve, the second H no longer fits
    one = specs[0].bytes() + specs[0].solve_bytes() + 10**7
    kept, left = within_budget(specs, budget=one)
    assert [s.id for s in kept] == ["c0", "c1", "c4"] and [s.id for s in left] == ["c2", "c3"]
    kept, left = within_budget(specs, budget=one + specs[0].bytes())
    assert [s.id for s in kept] == ["c0", "c1", "c2", "c4"]
    # H alone would fit twice over; its solve does not
    kept, left = within_budget(specs, budget=2 * specs[0].bytes() + 10**6)
    assert [s.id for s in kept] == ["c1", "c4"]
    kept, left = within_budget(specs, copies=5, budget=one)
    assert [s.id for s in kept] == ["c1", "c4"]


def test_blocked_gptq_is_the_column_by_column_arithmetic():
    """GPTQ's lazy block updates (GPTQ_BLOCK columns at a time) from H's factor round
    exactly as the column-by-column loop over H^-1's factor, across block boundaries
    (129 to 640 columns), with dead columns and more rows than columns."""
    from rewriter.passes.insert_qdq import QMAX, _gptq_block

    def by_column(w, s, h, damp):
        d = w.shape[1]
        h, w = h.copy(), w.copy()
        dead = np.diag(h) <= 0                  # unit columns, weights zero
        h[dead], h[:, dead], w[:, dead] = 0, 0, 0
        h[dead, dead] = 1
        order = np.argsort(-np.where(dead, 1, np.diag(h)))
        w, h = w[:, order], h[np.ix_(order, order)]
        h[np.diag_indices(d)] += damp * float(np.mean(np.diag(h))) + 1e-12
        hinv = np.linalg.cholesky(np.linalg.inv(h)).T
        q = np.empty_like(w)
        for i in range(d):
            q[:, i] = np.clip(np.rint(w[:, i] / s), -QMAX, QMAX)
            err = (w[:, i] - q[:, i] * s) / hinv[i, i]
            w[:, i + 1:] -= np.outer(err, hinv[i, i + 1:])
        return q[:, np.argsort(order)].astype(np.int8)

    rng = np.random.default_rng(0)
    for rows, d, dead in ((48, 300, 0), (300, 129, 0), (7, 576, 40), (1, 640, 0)):
        x = rng.standard_normal((d, d + 600)) * rng.uniform(0.1, 2, (d, 1))
        x[rng.permutation(d)[:dead]] = 0   # inputs that never fire: H's zero columns
        h = x @ x.T / (d + 600)
        w = rng.standard_normal((rows, d)) * rng.uniform(0.02, 0.2, (rows, 1))
        s = np.abs(w).max(axis=1) / QMAX
        q = _gptq_block(w, s, h, 0.01)
        assert np.array_equal(q, by_column(w, s, h, 0.01)), (rows, d)
        assert not np.array_equal(q, np.clip(np.rint(w / s[:, None]), -QMAX, QMAX))


def test_depthwise_gptq_in_one_go_rounds_as_group_by_group():
    """gptq_round solves a grouped conv's small groups stacked (_gptq_groups): the same
    int8 values as _gptq_block per group, dead input columns and a group whose Hessian
    does not factor (then every group alone, that one by nearest rounding) included."""
    from rewriter.passes.insert_qdq import QMAX, _gptq_block, _gptq_groups, gptq_round

    rng = np.random.default_rng(7)
    for g, rows, d, dead in ((48, 1, 9, False), (32, 2, 25, True), (6, 3, 4, True)):
        x = rng.standard_normal((g, d, 80)) * rng.uniform(0.01, 3, (g, d, 1))
        h = (x @ x.transpose(0, 2, 1) / 80).astype(np.float32)
        if dead:
            gone = rng.random((g, d)) < 0.3
            h[gone[:, :, None] | gone[:, None, :]] = 0
        w = rng.standard_normal((g * rows, 1, d)).astype(np.float32)
        s = np.abs(w).reshape(g * rows, -1).max(axis=1) / QMAX
        want = np.concatenate([
            _gptq_block(w[k * rows:(k + 1) * rows, 0].astype(np.float64),
                        s[k * rows:(k + 1) * rows], h[k], 0.01) for k in range(g)])
        got = gptq_round(w, s, h, g)
        assert np.array_equal(got.reshape(g * rows, d), want)
        assert not np.array_equal(got.reshape(g * rows, d),
                                  np.clip(np.rint(w[:, 0] / s[:, None]), -QMAX, QMAX))
    h[2] = 3 * np.eye(d, dtype=np.float32) - 2   # indefinite: no Cholesky factor
    with pytest.raises(np.linalg.LinAlgError):
        _gptq_groups(w.reshape(6, 3, d).astype(np.float64), s.reshape(6, 3), h, 0.01)
    want = np.concatenate([_gptq_block(w[k * 3:(k + 1) * 3, 0].astype(np.float64),
                                       s[k * 3:(k + 1) * 3], h[k], 0.01) for k in range(6)])
    assert np.array_equal(gptq_round(w, s, h, 6).reshape(18, d), want)


def test_stacked_gptq_holds_a_bounded_stack(monkeypatch):
    """The stacked solve held ~34 d^2 bytes a group all at once (131 MiB for 256 groups of
    d = 126, not in hessian.within_budget's count): stacks of STACK_BYTES, the same int8."""
    import tracemalloc

    from rewriter.passes import insert_qdq
    from rewriter.quant.hessian import ConvSpec

    rng = np.random.default_rng(11)
    g, d = 64, 72
    x = rng.standard_normal((g, d, 96)) * rng.uniform(0.1, 2, (g, d, 1))
    h = (x @ x.transpose(0, 2, 1) / 96).astype(np.float32)
    w = rng.standard_normal((2 * g, 8, 3, 3)).astype(np.float32)
    s = np.abs(w).reshape(2 * g, -1).max(axis=1) / insert_qdq.QMAX
    whole = insert_qdq.gptq_round(w, s, h, g)
    stack = insert_qdq.STACK_BYTES
    monkeypatch.setattr(insert_qdq, "STACK_BYTES", 1 << 20)
    tracemalloc.start()
    got = insert_qdq.gptq_round(w, s, h, g)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(got, whole) and peak < 3 << 20, peak   # all at once: ~12 MiB
    from rewriter.quant import hessian

    assert (hessian.STACK_BYTES, hessian.STACKED_DEPTH) == (stack, insert_qdq.GPTQ_BLOCK)
    assert ConvSpec("c", "x", (3, 3), (1, 1), (0,) * 4, (1, 1), g, d).solve_bytes() == stack


def test_gptq_on_an_h_holding_inf_rounds_to_nearest():
    """Activations beyond float32's square root (a fuzzed ResNet's BN variance) put inf in
    H: its factor's inverse raised 'Singular matrix' out of insert-qdq (exit 3) or had
    zeros on its diagonal (a division by zero, NaN rounded to int8). Nearest rounding."""
    import warnings

    from rewriter.passes.insert_qdq import QMAX, gptq_round

    rng = np.random.default_rng(61212)
    x = rng.standard_normal((144, 200)) * rng.uniform(0.1, 2, (144, 1))
    h = (x @ x.T / 200).astype(np.float32)
    big = [3, 40, 99]
    with np.errstate(over="ignore"):
        h[big, :] *= 1e20
        h[:, big] *= 1e20
    h[np.ix_(big, big)] = np.inf
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    s = np.abs(w).reshape(16, -1).max(axis=1) / QMAX
    nearest = np.clip(np.rint(w / s[:, None, None, None]), -QMAX, QMAX).astype(np.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(gptq_round(w, s, h[None], 1), nearest)
        stacked = np.stack([h[10:19, 10:19]] * 16)   # and stacked: every group alone
        stacked[4, 2, 2] = np.inf
        w1 = w[:, :1]
        got = gptq_round(w1, s, stacked, 16)
    near = np.clip(np.rint(w1 / s[:, None, None, None]), -QMAX, QMAX).astype(np.int8)
    assert np.array_equal(got[4], near[4]) and not np.array_equal(got, near)


def test_sums_flushed_in_between_equal_one_product(monkeypatch):
    """Patches are gathered and added to H in products of FLUSH_PATCHES (a product of a few
    dozen patches wrote a whole 9216 x 9216 result each batch): flushing every few
    batches gives the H of one product over all patches."""
    from rewriter.quant import hessian
    rng = np.random.default_rng(2)
    data = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(8)]
    spec = ConvSpec("conv", "x", (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    once = conv_hessians(_model(), [spec], data, progress=False)["conv"]
    monkeypatch.setattr(hessian, "FLUSH_PATCHES", 50)   # 36 patches a sample: 4 flushes
    flushed = conv_hessians(_model(), [spec], data, progress=False)["conv"]
    x = np.concatenate([_im2col(d["x"], spec) for d in data], axis=2)
    np.testing.assert_allclose(once, x @ x.transpose(0, 2, 1) / x.shape[2], rtol=1e-5,
                               atol=1e-6 * float(np.abs(once).max()))
    np.testing.assert_allclose(flushed, once, rtol=1e-5, atol=1e-6 * float(np.abs(once).max()))


def test_gptq_factor_is_upper_and_factors_h():
    """GPTQ reads its updates from V, upper, with V V^T = H: the reversed Cholesky factor
    of the reversed H (no inverse formed), at sizes that span GPTQ's blocks unevenly."""
    from rewriter.passes.insert_qdq import _damped_factor
    rng = np.random.default_rng(3)
    for n in (5, 129, 257, 600):
        x = rng.standard_normal((n, n + 50))
        h = x @ x.T / (n + 50)
        v = _damped_factor(h, np.arange(n), np.ones(n, bool), 0.0)[::-1, ::-1]
        assert np.array_equal(v, np.triu(v)) and (np.diag(v) > 0).all()
        np.testing.assert_allclose(v @ v.T, h, atol=1e-9)


def test_gathered_patches_are_the_im2col_columns():
    """HessianReducer builds only the patches it keeps (patches_at); they must be the same
    columns of the whole im2col (which it built before), bit for bit, at any stride, dilation, padding and group,
    with non-finite values where the input has them and zeros where the padding is."""
    import itertools

    from rewriter.quant.hessian import patches_at

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 4, 9, 11)).astype(np.float32)
    x[0, 1, 2, 3], x[1, 3, 8, 10] = np.nan, np.inf
    done = 0
    for k, s, d, p, g in itertools.product([(1, 1), (3, 3), (3, 1), (5, 5)],
                                          [(1, 1), (2, 2), (2, 1)], [(1, 1), (2, 2)],
                                          [(0, 0, 0, 0), (1, 1, 1, 1), (2, 0, 1, 3)], [1, 2]):
        if (k[0] - 1) * d[0] + 1 > 9 + p[0] + p[2]:
            continue
        spec = ConvSpec("c", "x", k, s, p, d, g, (4 // g) * k[0] * k[1])
        full = _im2col(x, spec)
        cols = rng.choice(full.shape[2], min(13, full.shape[2]), replace=False)
        got = patches_at(x, spec, cols)
        assert got.shape == full[:, :, cols].shape and got.flags.c_contiguous
        assert np.array_equal(got, full[:, :, cols], equal_nan=True), (k, s, d, p, g)
        assert np.array_equal(patches_at(x, spec, None), full, equal_nan=True)
        done += 1
    assert done == 144


def test_statistics_and_ranges_from_one_stream_equal_their_own_passes():
    """GPTQ's statistics, the INT8 ranges and the FP16 ranges share one pass over the data
    (collect_ranges' ``also``): each equals its own pass bit for bit, at a chunk size that
    splits them, with tensors only one of them reads. GPTQ's patches are drawn in stream
    order, so its tensors chunk as on their own: chunked with the others, H differs."""
    from conftest import make_model

    from rewriter.quant import ranges
    from rewriter.quant.hessian import conv_specs, hessian_reducer

    m = make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 3, 6, 6] x) => (float[1, 12] y) {
        c1 = Conv <pads = [1, 1, 1, 1]> (x, W1)
        r1 = Relu (c1)
        c2 = Conv <pads = [1, 1, 1, 1]> (r1, W2)
        r2 = Relu (c2)
        c3 = Conv <pads = [0, 0, 0, 0]> (r2, W3)
        r3 = Relu (c3)
        c4 = Conv <pads = [1, 1, 1, 1], group = 2> (r3, W4)
        f = Flatten (c4)
        y = MatMul (f, WM)
    }""", {"W1": (4, 3, 3, 3), "W2": (6, 4, 3, 3), "W3": (4, 6, 1, 1), "W4": (4, 2, 3, 3),
           "WM": (144, 12)})
    import onnx_graphsurgeon as gs
    specs = conv_specs(gs.import_onnx(m).nodes)
    rng = np.random.default_rng(5)
    data = [{"x": (rng.standard_normal((1, 3, 6, 6)) * (1 + i)).astype(np.float32)}
            for i in range(6)]
    int8, fp16 = ["r1", "r2", "r3", "f"], ["c2", "c4", "f", "y"]
    kw = dict(method="percentile", num_bins=64, chunk=2, progress=False)

    alone, tensors = hessian_reducer(specs, data, max_patches=40)
    ranges._stream(m, tensors, data, alone, 2, None, None, False, "h")
    want = ranges.collect_ranges(m, int8, data, **kw)
    want16 = ranges.collect_ranges(m, fp16, data, method="minmax", chunk=2, progress=False,
                                   nonfinite="drop")
    shared, tensors = hessian_reducer(specs, data, max_patches=40)
    r16 = ranges.range_reducer()
    got = ranges.collect_ranges(m, int8, data, also=[(shared, tensors), (r16, fp16)], **kw)
    assert got == want and r16.ranges(fp16, "drop") == want16
    assert sorted(shared.result) == sorted(alone.result) == sorted(s.id for s in specs)
    for k in alone.result:
        assert np.array_equal(shared.result[k], alone.result[k]), k
    mixed, tensors = hessian_reducer(specs, data, max_patches=40)   # no lead: other draws
    parts = [(mixed, tensors), (ranges.range_reducer(), int8)]
    every = list(dict.fromkeys(tensors + int8 + fp16))
    ranges._stream(m, every, data, ranges._Fanout(parts, parts[1][0]), 2, None, None,
                   False, "h")
    assert any(not np.array_equal(mixed.result[k], alone.result[k]) for k in alone.result)


def test_gptq_factors_only_the_live_columns(monkeypatch):
    """Dead columns (no input energy: DeepLabV3's ASPP taps dilated past its 16x16 map,
    7680 of 8640) are no part of the float64 factor, which they made 8640 wide: the
    factor is the live columns' alone, and the int8 values are those of the whole solve
    (column by column above, dead columns unit) with the dead weights 0."""
    from rewriter.passes import insert_qdq

    rng = np.random.default_rng(5)
    d, rows = 300, 6
    x = rng.standard_normal((d, 500)) * rng.uniform(0.1, 2, (d, 1))
    x[np.arange(d) % 3 != 1] = 0          # two taps of three read only padding
    h = (x @ x.T / 500).astype(np.float32)
    w = rng.standard_normal((rows, d)) * 0.1
    s = np.abs(w).max(axis=1) / insert_qdq.QMAX
    sizes = []
    real = np.linalg.cholesky
    monkeypatch.setattr(np.linalg, "cholesky", lambda a: sizes.append(a.shape) or real(a))
    q = insert_qdq._gptq_block(w, s, h, 0.01)
    assert sizes == [(100, 100)]
    assert not q[:, np.arange(d) % 3 != 1].any()
    # against the whole solve: every column factored, the dead ones unit
    dead = np.diag(h) <= 0
    full = h.astype(np.float64)
    full[np.diag_indices(d)] = np.where(dead, 1.0, np.diag(full))
    order = np.argsort(-np.diag(full))
    full = full[np.ix_(order, order)]
    full[np.diag_indices(d)] += 0.01 * float(np.mean(np.diag(full))) + 1e-12
    v = real(full[::-1, ::-1])[::-1, ::-1]
    wt, acc = np.where(dead, 0.0, w)[:, order], np.zeros((rows, d))
    want = np.empty((rows, d))
    for k in range(d):
        want[:, k] = np.clip(np.rint((wt[:, k] + acc[:, k] / v[k, k]) / s), -127, 127)
        acc[:, k + 1:] += np.outer(wt[:, k] - want[:, k] * s, v[k, k + 1:])
    assert np.array_equal(q, want[:, np.argsort(order)].astype(np.int8))


def test_rows_zero_in_every_patch_stay_out_of_the_product(monkeypatch):
    """Taps dilated past the map read only padding (DeepLabV3's ASPP at rates 24 and 36
    on 16x16: 7680 rows of 8640): H's product is taken over the live rows alone, the
    dead rows' sums are 0, and H is the whole im2col's."""
    from rewriter.quant import hessian

    rng = np.random.default_rng(4)
    data = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(8)]
    spec = ConvSpec("conv", "x", (3, 3), (1, 1), (6, 6, 6, 6), (6, 6), 1)
    shapes = []
    real = hessian._gram
    monkeypatch.setattr(hessian, "_gram", lambda x: shapes.append(x.shape) or real(x))
    got = conv_hessians(_model(), [spec], data, progress=False)["conv"]
    assert shapes == [(1, 3, 8 * 36)]          # the centre tap of each channel
    x = np.concatenate([_im2col(d["x"], spec) for d in data], axis=2)
    np.testing.assert_allclose(got, x @ x.transpose(0, 2, 1) / x.shape[2], rtol=1e-5,
                               atol=1e-6 * float(np.abs(got).max()))
    assert not got[0][np.arange(27) % 9 != 4].any()
    # per fold too (the planner's k-fold statistics): each complement is a pass over the
    # other folds' samples
    folds = [list(range(f, 8, 4)) for f in range(4)]
    total, without = conv_hessians(_model(), [spec], data, progress=False, folds=folds)
    tol = {"rtol": 1e-5, "atol": 1e-6 * float(np.abs(got).max())}
    np.testing.assert_allclose(total["conv"], got, **tol)
    for f in range(4):
        rest = [data[j] for g in range(4) if g != f for j in folds[g]]
        np.testing.assert_allclose(without[f]["conv"], conv_hessians(
            _model(), [spec], rest, progress=False)["conv"], **tol)
        assert not without[f]["conv"][0][np.arange(27) % 9 != 4].any()


def test_grouped_sums_are_the_same_on_any_blas_thread_count():
    """A depthwise conv's statistics are one BLAS call per group: on OpenBLAS's 2 threads
    those of 49 x 4096 rounded otherwise than on one (the written int8 then depended on the
    core count), and the threads only waited on each other (960 groups: 3-5 s vs 0.14 s
    under load). They run on one thread, whatever the process's setting."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from rewriter.quant.hessian import _gram
    blas = threadpoolctl.threadpool_info()
    if not any(i["user_api"] == "blas" and i["num_threads"] >= 2 for i in blas):
        pytest.skip("BLAS runs on one thread here: nothing to compare")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((120, 49, 4096)).astype(np.float32)
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        one = _gram(x)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        two = _gram(x)
    assert np.array_equal(one, two)


def test_same_pads_are_each_batchs_where_the_size_is_not_known():
    """A SAME_* conv over an input of unknown size (a symbolic H and W) kept nearest
    rounding (skip:gptq-conv-auto-pad) though each batch the statistics read has a size:
    its pads are each batch's now, the patches those of the conv with that batch's pads
    written out (core.graph.conv_pads), at odd and even sizes, strides and kernels."""
    import itertools

    import onnx_graphsurgeon as gs

    from rewriter.core.graph import conv_pads
    from rewriter.quant.hessian import conv_spec, patches_at

    rng = np.random.default_rng(3)
    done = 0
    for auto, k, s, (h, w) in itertools.product(("SAME_UPPER", "SAME_LOWER"),
                                                [(3, 3), (2, 4), (1, 5)], [(1, 1), (2, 2), (3, 2)],
                                                [(9, 11), (8, 8), (5, 12)]):
        node = gs.Node("Conv", attrs={"auto_pad": auto, "strides": list(s)},
                       inputs=[gs.Variable("x", np.float32, ["N", 4, "H", "W"]),
                               gs.Constant("w", np.zeros((6, 4) + k, np.float32))])
        spec = conv_spec(node, (6, 4) + k)
        assert spec is not None and spec.same == auto
        node.inputs[0].shape = [1, 4, h, w]
        pads = conv_pads(node, list(k))
        assert list(spec.pads_at(h, w)) == pads
        x = rng.standard_normal((2, 4, h, w)).astype(np.float32)
        fixed = ConvSpec("c", "x", k, s, tuple(pads), (1, 1), 1, 4 * k[0] * k[1])
        assert np.array_equal(patches_at(x, spec, None), _im2col(x, fixed))
        done += 1
    assert done == 54
