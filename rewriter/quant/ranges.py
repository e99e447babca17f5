"""Range collection: calibration data in, one symmetric activation range (amax) per tensor out.

:func:`collect_ranges` runs the model over a :class:`rewriter.quant.data.CalibrationData`
stream and reduces each requested tensor to ``amax``, the symmetric range; ``scale = amax /
127`` is the quantiser's business. Histograms and the KL search are onnxruntime's, reached
through one adapter (rewriter.quant.ort_calibration).

Methods (see docs/calibration.md for what each costs):

``minmax``
    ``amax = max |x|`` over every batch. Exact, cheapest, sensitive to outliers.
``percentile``
    a histogram of ``|x|`` (onnxruntime's ``HistogramCollector``, ``symmetric=True``) and
    the left edge of the bin where the cumulative share reaches ``percentile``; never above
    ``max |x|``.
``entropy`` (alias ``kl``)
    a signed histogram (``HistogramCollector``, method "entropy") and onnxruntime's KL
    search over thresholds with 128 quantized bins (TensorRT's algorithm). The search tries
    every bin from ``num_bins/2 - 64`` outward, so ``num_bins`` must be well above 128:
    through ``quantize_static`` onnxruntime's own default of 128 bins leaves a single
    candidate and "entropy" silently equals minmax (FACTS.md). Default here: 2048.

Memory bound: activations are never all exposed at once. Tensors are split into chunks of
at most ``chunk``; for each chunk ONE augmented model (the original graph with the chunk's
tensors as extra outputs) is built and every calibration batch is streamed through it,
reducing each output before the next batch. Peak memory is the model's weights in
onnxruntime plus one batch's activations for ``chunk`` tensors plus a histogram of
``num_bins`` int64 counts per tensor of the chunk. Time is ``ceil(tensors / chunk)`` full
inference passes over the data (onnxruntime runs the whole graph even when the requested
outputs need only a prefix of it), plus, for entropy, onnxruntime's KL search: about 1 s
per tensor at 2048 bins (it is quadratic in bins, so histograms that grew are merged back to
at most ``num_bins`` first).

Measured on models/mobilenet_mini.onnx, all 38 float tensors (one chunk), 200 photo crops
at 64x64 read from .npy files one at a time, 2 cores (2026-12): minmax 1.1 s, percentile
4.5 s, entropy 45 s (44 s of it the KL search); peak RSS of the whole process 87, 100 and
101 MB (53 MB before the call: Python, numpy, onnx). minmax with chunk=4 (10 passes): 4.1 s.

Determinism: files are read in sorted order, reductions run in batch order, and a tensor's
result does not depend on which chunk it is in, so the same data gives identical floats
(and chunk=1 equals chunk=64).
"""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from rewriter.core.errors import InputError
from rewriter.core.progress import progress_bar
from rewriter.quant import MAX_BINS, METHODS
from rewriter.quant.data import CalibrationData, _describe, _proto, load_calibration
from rewriter.quant.ort_calibration import Histograms

# onnxruntime's default for the KL search (int8: 128 levels on each side of a signed
# histogram would be 256; onnxruntime uses 128 and so do we, to match its results).
NUM_QUANTIZED_BINS = 128
# Below this the KL search has too few candidates to mean anything (128 bins: one).
MIN_ENTROPY_BINS = 256


def collect_ranges(model, tensors: list[str], data, method: str = "minmax",
                   percentile: float = 99.999, num_bins: int = 2048, chunk: int = 64,
                   base_dir=None, initializers=None, progress: bool = True,
                   nonfinite: str = "inf", screen=None, also=(),
                   desc: str | None = None) -> dict[str, float]:
    """The symmetric range ``amax`` (>= 0) of each tensor over the calibration data.

    ``model`` is a ModelProto, a path, or a :class:`rewriter.core.convert.Exported` (weights
    as stubs; its ``ort_initializers()`` and ``source_dir`` are used unless ``initializers``
    / ``base_dir`` are given). ``tensors`` names graph inputs or outputs of main-graph nodes;
    they must be float. ``data`` is a :class:`CalibrationData` or anything
    :func:`load_calibration` takes.

    ``method``: ``minmax``, ``percentile`` (``percentile`` in (0, 100]) or ``entropy``
    (``kl``); ``num_bins`` is the histogram size of the last two (entropy needs an even
    number >= 256). A tensor that held inf or NaN on any sample gets ``inf`` (int8 has
    neither: insert-qdq keeps its layers float, ``activation-not-finite``), or with
    ``nonfinite="drop"`` the range of its finite values (what float16 overflow is judged
    on: float16 holds inf and NaN as they are). A tensor that is zero everywhere gets 0.0,
    which the quantiser must not turn into a zero scale. ``screen``: more samples (a list of
    feeds), run in the same sessions only to find inf or NaN, never read for a range: the
    held-out ones, where a layer reading -inf on them alone stayed INT8 (only --verify saw
    it).

    Memory: at most ``chunk`` tensors are exposed per augmented model, and each batch is
    reduced before the next one runs (see the module docstring for the bound and for
    measured time and memory). Results are identical for any ``chunk``.

    ``also``: more ``(reducer, tensors)`` pairs fed from the same onnxruntime runs (a
    :func:`range_reducer`, GPTQ's statistics), where each ran its own passes over the
    data (a full inference per chunk and batch: 5 s each on a 1024x1024 segmenter). The
    first pair's tensors are chunked as they would be alone and the others fill in after
    them: GPTQ's statistics draw their patches in stream order, so they stay the same.
    """
    reducer = range_reducer(method, percentile, num_bins)
    if not isinstance(chunk, int) or chunk < 1:
        raise InputError(f"chunk must be a positive integer, got {chunk!r}")
    if nonfinite not in ("inf", "drop"):
        raise InputError(f"nonfinite must be inf or drop, got {nonfinite!r}")
    # one name, not its letters ("tensor 'i' is not an input")
    tensors = list(dict.fromkeys([tensors] if isinstance(tensors, str) else tensors))
    desc = desc or f"calibrate ({reducer.method})"
    if not also:
        _stream(model, tensors, data, reducer, chunk, base_dir, initializers, progress,
                desc, screen)
    else:
        parts = [(r, list(dict.fromkeys(t))) for r, t in also] + [(reducer, tensors)]
        every = list(dict.fromkeys(t for _, ts in parts for t in ts))
        _stream(model, every, data, _Fanout(parts, reducer), chunk, base_dir, initializers,
                progress, desc, screen, lead=parts[0][1])
    return reducer.ranges(tensors, nonfinite)


def expose_bodies(proto: onnx.ModelProto, tensors: list[str]):
    """``(model, stream, fold)``: the tensors among ``tensors`` made inside If/Loop/Scan
    bodies (a node's output or a body's input) reduced there to their max |x| and carried
    out to main-graph outputs, since onnxruntime returns no tensor of a body. ``stream``
    names what to measure (the main graph's own tensors as they are, a scalar per body
    one); ``fold(ranges)`` maps its ranges back to ``tensors`` (the largest where sibling
    bodies share a name). ``model`` is ``proto`` itself when no tensor sits in a body, else
    a copy: a Loop or Scan carries the scalar out per iteration (its max taken outside,
    with a 0 for no iteration), an If's other branch gives 0. Silero VAD's FP16 layers in
    If branches were measured nowhere, and a float16 overflow there failed --verify."""
    from onnx import helper as h

    from rewriter.core.graph import graph_protos

    g0 = proto.graph
    main = {i.name for i in g0.input} | {o for n in g0.node for o in n.output}
    inner = {t for t in tensors if t not in main}
    if not inner:
        return proto, list(tensors), lambda r: r
    model = onnx.ModelProto()
    model.CopyFrom(proto)
    used = {v for g in graph_protos(model.graph) for v in
            [i.name for i in g.input] + [o for n in g.node for o in n.output]}
    count = [0]

    def fresh(kind: str) -> str:
        while f"range_{kind}_{count[0]}" in used:
            count[0] += 1
        used.add(name := f"range_{kind}_{count[0]}")
        return name

    def const(g, values) -> str:
        out = fresh("const")
        g.node.append(h.make_node("Constant", [], [out], value=onnx.numpy_helper.from_array(
            np.asarray(values), out)))
        return out

    def scalar(t: str) -> onnx.ValueInfoProto:
        return h.make_tensor_value_info(t, onnx.TensorProto.FLOAT, [])

    def expose(g, top: bool) -> list[tuple[str, str]]:
        found = []   # (a scalar in g, the tensor it measures)
        for n in list(g.node):
            if n.op_type not in ("If", "Loop", "Scan") or n.domain not in ("", "ai.onnx"):
                continue
            bodies = {a.name: a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH}
            for key, body in bodies.items():
                for t, orig in expose(body, False):
                    body.output.append(scalar(t))
                    out = fresh("out")
                    n.output.append(out)
                    if n.op_type == "If":   # the other branch: 0, output for output
                        other = bodies["else_branch" if key == "then_branch" else "then_branch"]
                        other.output.append(scalar(const(other, np.float32(0))))
                        found.append((out, orig))
                        continue
                    for a in n.attribute:   # a Scan's per-output attributes, one more
                        if a.name in ("scan_output_axes", "scan_output_directions"):
                            a.ints.append(0)
                    flat = fresh("flat")
                    g.node.append(h.make_node("Reshape", [out, const(g, np.array([-1]))],
                                              [flat]))
                    cat = fresh("cat")
                    g.node.append(h.make_node("Concat", [flat, const(
                        g, np.zeros(1, np.float32))], [cat], axis=0))
                    found.append((fresh("max"), orig))
                    g.node.append(h.make_node("ReduceMax", [cat], [found[-1][0]], keepdims=0))
        if not top:
            own = [i.name for i in g.input] + [o for n in g.node for o in n.output]
            for t in dict.fromkeys(t for t in own if t in inner):
                a, m = fresh("abs"), fresh("max")
                g.node.extend([h.make_node("Abs", [t], [a]),
                               h.make_node("ReduceMax", [a], [m], keepdims=0)])
                found.append((m, t))
        return found

    carried = expose(model.graph, True)
    stream = [t for t in tensors if t in main] + [t for t, _ in carried]

    def fold(ranges: dict) -> dict:
        out = {t: ranges[t] for t in tensors if t in main}
        for t, orig in carried:
            out[orig] = max(out.get(orig, 0.0), ranges[t])
        return out
    return model, stream, fold


def range_reducer(method: str = "minmax", percentile: float = 99.999,
                  num_bins: int = 2048) -> "_Reducer":
    """The reducer :func:`collect_ranges` streams into (its arguments checked), for its
    ``also``; ``.ranges(tensors, nonfinite)`` reads the result after the stream."""
    method = {"kl": "entropy", "max": "minmax"}.get(str(method).lower(), str(method).lower())
    if method not in METHODS:
        raise InputError(f"calibration method '{method}' is not one of {', '.join(METHODS)} "
                         "(or kl)")
    if method == "percentile" and not 0 < percentile <= 100:
        raise InputError(f"percentile must be in (0, 100], got {percentile}")
    if method != "minmax":
        if not isinstance(num_bins, int) or num_bins < 2:
            raise InputError(f"num_bins must be an integer >= 2, got {num_bins!r}")
        if num_bins > MAX_BINS:
            raise InputError(f"num_bins must be at most {MAX_BINS} (its histograms take "
                             f"num_bins x 8 bytes a tensor), got {num_bins}")
        if method == "entropy" and (num_bins < MIN_ENTROPY_BINS or num_bins % 2):
            raise InputError(f"entropy calibration needs an even num_bins >= "
                             f"{MIN_ENTROPY_BINS} (with 128 the KL search has one candidate "
                             f"and equals minmax), got {num_bins}")
    return _Reducer(method, percentile, num_bins)


class _Fanout:
    """Several reducers on one stream, each handed its own tensors; only ``screened``
    sees the screening samples (the others never asked for them)."""

    def __init__(self, parts: list, screened):
        self.parts = [(r, set(ts)) for r, ts in parts]
        self.screened = screened

    def update(self, name: str, a: np.ndarray) -> None:
        for r, own in self.parts:
            if name in own:
                r.update(name, a)

    def screen(self, name: str, a: np.ndarray) -> None:
        self.screened.screen(name, a)

    def finish(self, names: list[str], progress: bool) -> None:
        for r, own in self.parts:
            r.finish([n for n in names if n in own], progress)


@dataclass
class ChannelStats:
    """Per-channel statistics of one activation tensor (channel = axis 1)."""

    absmax: np.ndarray    # max |x| per channel
    mean: np.ndarray      # mean x per channel


def channel_stats(model, tensors: list[str], data, chunk: int = 64, base_dir=None,
                  initializers=None, progress: bool = True) -> dict[str, ChannelStats]:
    """Per-channel max |x| and mean of each tensor over the calibration data (axis 1 is the
    channel; a tensor of rank < 2 counts as one channel). Streams like
    :func:`collect_ranges`: bounded memory, identical results for any ``chunk``."""
    reducer = _ChannelReducer()
    tensors = list(dict.fromkeys(tensors))
    _stream(model, tensors, data, reducer, chunk, base_dir, initializers, progress,
            "channel statistics")
    return {t: reducer.result[t] for t in tensors}


def stat_tensors(convs) -> list[str]:
    """The tensors whose per-channel statistics equalize-channels reads for these convs:
    their inputs, and the tensor before a Relu that produces one (its growth by 1/s)."""
    from rewriter.core.graph import pre_activation

    xs = [n.inputs[0] for n in convs if n.op == "Conv"]
    pre = [pre_activation(x) for x in xs]
    return sorted({t.name for t in xs + [y for y in pre if y is not None]})


def _stream(model, tensors: list[str], data, reducer, chunk: int, base_dir, initializers,
            progress: bool, desc: str, screen=None, lead: list[str] | None = None) -> None:
    """Run the model over ``data`` with ``tensors`` exposed, ``chunk`` at a time, and hand
    every batch's values to ``reducer.update(name, array)``; ``reducer.finish(names,
    progress)`` after each chunk. ``screen``'s feeds go to ``reducer.screen`` in the same
    sessions. With ``lead`` (some of ``tensors``, first in it), those are chunked and
    streamed in the order they would be on their own, the others after them."""
    from rewriter.core.convert import Exported

    if isinstance(model, Exported):
        if initializers is None:
            initializers = model.ort_initializers()
        if base_dir is None:
            base_dir = model.source_dir
    if isinstance(model, (str, os.PathLike)) and base_dir is None:
        base_dir = Path(model).parent   # its external data, as rewrite() resolves it
    proto = _proto(model)
    if not isinstance(data, CalibrationData):
        data = load_calibration(data, proto)
    if len(data) == 0:
        raise InputError("calibration data holds no complete batch")
    graph_inputs, produced = _classify_tensors(proto, tensors)
    if not tensors:
        return
    # Node order is topological: chunks of neighbouring tensors.
    order = {n: i for i, n in enumerate(produced)}
    inner = sorted((t for t in tensors if t not in graph_inputs), key=order.__getitem__)
    leading = set(lead if lead is not None else inner)
    first = [t for t in inner if t in leading]
    rest = [t for t in inner if t not in leading]   # empty without lead
    chunks = [first[i:i + chunk] for i in range(0, len(first), chunk)] or [[]]
    if rest:
        room = chunk - len(chunks[-1])
        chunks[-1] = chunks[-1] + rest[:room]
        chunks += [rest[i:i + chunk] for i in range(room, len(rest), chunk)]
    bar = progress_bar(progress, total=len(chunks) * len(data), desc=desc, unit="batch")
    try:
        for k, names in enumerate(chunks):
            bar.set_postfix_str(f"chunk {k + 1}/{len(chunks)}, {len(names)} tensors")
            sess = _augmented_session(proto, names, base_dir, initializers) if names else None
            first = k == 0
            for feeds in data:
                outs = sess.run(names, feeds) if sess is not None else []
                for n, a in zip(names, outs):
                    reducer.update(n, a)
                # Released before the next batch runs, not once it has returned: a
                # chunk's outputs (up to 64 activations) were held twice.
                outs = a = None
                if first:  # graph-input tensors ride along with the first pass
                    for n in graph_inputs:
                        reducer.update(n, feeds[n])
                bar.update(1)
            for feeds in screen or ():
                outs = sess.run(names, feeds) if sess is not None else []
                for n, a in zip(names, outs):
                    reducer.screen(n, a)
                for n in graph_inputs if first else ():
                    reducer.screen(n, feeds[n])
                outs = a = None
            del sess
            # Finishing each chunk here frees its histograms before the next chunk runs.
            reducer.finish(names + (graph_inputs if first else []), progress)
    finally:
        bar.close()


class _ChannelReducer:
    def __init__(self):
        self.absmax: dict[str, np.ndarray] = {}
        self.total: dict[str, np.ndarray] = {}
        self.count: dict[str, int] = {}
        self.result: dict[str, ChannelStats] = {}

    def update(self, name: str, a: np.ndarray) -> None:
        # In the tensor's own dtype, summed into float64: a float64 copy of every tensor
        # took 0.18 s per 26 MB one (U2-Net-p's full-size layers, once per batch), 12x
        # the reduction; max |x| is exact in any float type.
        a = np.asarray(a)
        if a.size == 0:
            return
        a = a.reshape(a.shape[0], a.shape[1], -1) if a.ndim >= 2 else a.reshape(1, 1, -1)
        for _ in range(2):
            with np.errstate(invalid="ignore", over="ignore"):   # inf - inf: checked below
                s = a.sum(axis=(0, 2), dtype=np.float64)
            hi, lo = a.max(axis=(0, 2)), a.min(axis=(0, 2))
            # an inf or a nan anywhere leaves one of the three non-finite
            if np.isfinite(s).all() and np.isfinite(hi).all() and np.isfinite(lo).all():
                break
            a = np.where(np.isfinite(a), a, 0)
        m = np.maximum(hi, -lo).astype(np.float64)
        if name in self.absmax:
            self.absmax[name] = np.maximum(self.absmax[name], m)
            self.total[name] += s
        else:
            self.absmax[name], self.total[name] = m, s
            self.count[name] = 0
        self.count[name] += a.shape[0] * a.shape[2]

    def finish(self, names: list[str], progress: bool) -> None:
        for n in names:
            if n in self.absmax:
                self.result[n] = ChannelStats(self.absmax.pop(n),
                                              self.total.pop(n) / max(1, self.count.pop(n)))


def _classify_tensors(proto: onnx.ModelProto, tensors: list[str]) -> tuple[list[str], list[str]]:
    """(requested graph inputs, every main-graph node output in node order); InputError on
    names that are weights, unknown, or only inside subgraphs, and on non-float types."""
    from rewriter.core.convert import shape_info
    from rewriter.verify import real_inputs

    inputs = [i.name for i in real_inputs(proto)]
    produced = [o for node in proto.graph.node for o in node.output if o]
    known = set(inputs) | set(produced)
    weights = {t.name for t in proto.graph.initializer}
    for t in tensors:
        if t in known:
            continue
        if t in weights:
            raise InputError(f"tensor '{t}' is a weight; weights are quantised from their "
                             "values, not calibrated")
        near = difflib.get_close_matches(t, sorted(known), n=1)
        hint = f"; did you mean '{near[0]}'?" if near else ""
        raise InputError(f"tensor '{t}' is not an input or a node output of the main graph"
                         f"{hint}")
    infos = shape_info(proto)
    for t in tensors:
        vi = infos.get(t)
        if vi is not None and vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
            if dt.kind != "f":
                raise InputError(f"tensor '{t}' is {dt}; only float tensors have "
                                 "quantisation ranges")
    return [t for t in tensors if t in set(inputs)], produced


def _augmented_session(proto: onnx.ModelProto, names: list[str], base_dir, initializers):
    """An onnxruntime session of ``proto`` with ``names`` as extra graph outputs.

    The outputs are appended to the caller's proto only for as long as it takes to
    serialise it, and removed again: no copy of the model is made (its weights may be
    large when it is not an Exported), and the caller sees it unchanged.
    """
    from rewriter.core import ort

    g = proto.graph
    have = {o.name for o in g.output}
    extra = [onnx.ValueInfoProto(name=n) for n in names if n not in have]
    n_before = len(g.output)
    g.output.extend(extra)
    try:
        blob = proto.SerializeToString()
    finally:
        del g.output[n_before:]
    try:
        return ort.session(blob, base_dir=base_dir, initializers=initializers)
    except Exception as e:  # noqa: BLE001 - onnxruntime refuses the model: say where and why
        raise InputError(f"onnxruntime cannot load the model for calibration: "
                         f"{_describe(e)}") from None


class _Reducer:
    """Per-tensor streaming reduction: running max |x|, or onnxruntime's histograms."""

    def __init__(self, method: str, percentile: float, num_bins: int):
        self.method, self.percentile, self.num_bins = method, percentile, num_bins
        self.amax: dict[str, float] = {}
        self.result: dict[str, float] = {}
        self.nonfinite: set[str] = set()   # tensors that held inf or NaN
        self.collector = None

    def update(self, name: str, a: np.ndarray) -> None:
        a = np.asarray(a)
        if a.dtype.kind != "f":
            raise InputError(f"tensor '{name}' is {a.dtype}; only float tensors have "
                             "quantisation ranges")
        if a.size == 0:
            return
        # onnxruntime's collector refuses float64 and float16 edges drift: reduce in float32.
        a = a.astype(np.float32, copy=False).ravel()
        m = float(np.max(np.abs(a)))
        if not math.isfinite(m):
            self.nonfinite.add(name)
            a = a[np.isfinite(a)]
            if a.size == 0:
                return
            m = float(np.max(np.abs(a)))
        self.amax[name] = max(self.amax.get(name, 0.0), m)
        if self.method == "minmax":
            return
        if self.collector is None:
            # mse searches a histogram of |x|, the one percentile builds
            kind = "entropy" if self.method == "entropy" else "percentile"
            self.collector = Histograms(kind, self.num_bins, self.percentile,
                                        NUM_QUANTIZED_BINS)
        self.collector.add(name, a)

    def screen(self, name: str, a: np.ndarray) -> None:
        if not np.isfinite(a).all():
            self.nonfinite.add(name)

    def ranges(self, tensors: list[str], nonfinite: str = "inf") -> dict[str, float]:
        """amax per tensor once streamed: ``inf`` where a value was not finite, or with
        ``nonfinite="drop"`` the range of the finite ones (see collect_ranges)."""
        if nonfinite == "inf":
            return {t: math.inf if t in self.nonfinite else self.result[t] for t in tensors}
        return {t: self.result[t] for t in tensors}

    def finish(self, names: list[str], progress: bool) -> None:
        todo = names if self.collector is not None else []
        bar = progress_bar(progress and self.method == "entropy", total=len(todo),
                   desc="entropy search", unit="tensor")
        for n in names:
            amax = self.amax.get(n, 0.0)
            hist = self.collector.pop(n) if self.collector is not None else None
            if self.method == "minmax" or hist is None or amax == 0.0:
                self.result[n] = amax
            elif self.method == "percentile":
                self.result[n] = min(_percentile_edge(hist, self.percentile), amax)
            elif self.method == "mse":
                self.result[n] = min(_mse_threshold(hist), amax)
            else:
                lo, hi = self.collector.entropy_threshold(_rebin(hist, self.num_bins))
                self.result[n] = min(max(abs(lo), abs(hi)), amax)
                bar.update(1)
        bar.close()


def _mse_threshold(histogram: tuple, levels: int = 127) -> float:
    """The clip value t minimising the expected squared error of symmetric int8
    quantisation, from a histogram of |x|: values below t round (error s^2/12 each,
    s = t/levels), values above clip to t (error (|x| - t)^2 each). Candidates are the
    bin edges from 1/3 of the range up (a smaller clip is never the optimum on
    activations that matter); ties go to the larger t."""
    hist, edges = np.asarray(histogram[0], np.float64), np.asarray(histogram[1], np.float64)
    centers = (edges[:-1] + edges[1:]) / 2
    total = hist.sum()
    if total == 0:
        return float(edges[-1])
    cand = edges[max(1, len(edges) // 3):]
    best, best_t = np.inf, float(edges[-1])
    # cumulative sums give both error terms for every candidate in one pass
    c_hist = np.cumsum(hist)
    c_x = np.cumsum(hist * centers)
    c_xx = np.cumsum(hist * centers * centers)
    idx = np.searchsorted(centers, cand)          # bins with centre < t round, others clip
    for t, k in zip(cand, idx):
        below = c_hist[k - 1] if k > 0 else 0.0
        n_above = total - below
        s_x = c_x[-1] - (c_x[k - 1] if k > 0 else 0.0)
        s_xx = c_xx[-1] - (c_xx[k - 1] if k > 0 else 0.0)
        clip = s_xx - 2 * t * s_x + t * t * n_above
        err = below * (t / levels) ** 2 / 12 + clip
        if err <= best:
            best, best_t = err, float(t)
    return best_t


def _percentile_edge(histogram: tuple, percentile: float) -> float:
    """onnxruntime's symmetric percentile threshold (compute_percentile) from a histogram
    of |x|: the left edge of the bin where the cumulative share reaches ``percentile``.

    Not called through onnxruntime because it then clips the threshold to the *signed*
    maximum, which for a tensor that is never positive gives a negative range; the caller
    clips to max |x| instead.
    """
    hist, edges = histogram[0], histogram[1]
    cdf = np.cumsum(hist / hist.sum())
    idx = int(np.searchsorted(cdf, percentile / 100.0))
    return float(edges[min(idx, len(edges) - 1)])


def _rebin(histogram: tuple, num_bins: int) -> tuple:
    """Merge a signed histogram that grew past ``num_bins`` back to at most ``num_bins``.

    onnxruntime's collector keeps the first batch's bin width and adds bins when a later
    batch reaches further, so a dark first image can leave 10x the bins, and the KL search
    is quadratic in bins. Bins are merged ``k`` at a time outward from zero (both halves
    padded with empty bins to a multiple of ``k``), so zero stays a bin edge.
    """
    hist, edges, lo, hi = histogram[:4]
    n = len(hist)
    if n <= num_bins:
        return histogram
    k = -(-n // num_bins)
    half = n // 2
    pad = (-half) % k
    width = edges[1] - edges[0]
    steps = np.arange(1, pad + 1, dtype=edges.dtype) * width
    edges = np.concatenate([edges[0] - steps[::-1], edges, edges[-1] + steps]).astype(edges.dtype)
    hist = np.concatenate([np.zeros(pad, hist.dtype), hist, np.zeros(pad, hist.dtype)])
    hist = hist.reshape(-1, k).sum(axis=1)
    edges = edges[::k]
    return (hist, edges, lo, hi, edges[-1])
