"""pad-channels: pad conv channel counts to a multiple of N with exact zeros.

Before -> after (N = 4)::

    x[N,3,H,W] -> Conv(W[64,3,k,k])            =>  x -> Pad(c: 3->4) -> Conv(W[64,4,k,k])
    .. -> Conv(W[10,C]) -> BN -> Relu -> Conv(V[16,10])
                        =>  .. -> Conv(W[12,C]) -> BN' -> Relu -> Conv(V[16,12])
    .. -> Conv(W[10,C]) -> Flatten -> Gemm
                        =>  .. -> Conv(W[12,C]) -> Slice(c: 0..10) -> Flatten -> Gemm

Input side: a conv whose C_in is not a multiple of N gets zero weight columns. If its
input already carries padded channels (the producer was padded), the columns go where the
padding is; otherwise a Pad on the channel axis (zeros) sits right before it. A graph
input is padded inside the graph: the interface keeps its names, shapes and dtypes.

Output side: a conv whose C_out is not a multiple of N gets zero filters and zero bias.
The extra channels then travel forward, tensor by tensor, through ops that act on each
channel on its own or line channels up one to one (see "What carries padding"), until a
consumer absorbs them: a Conv (zero input columns at the padded positions) or a Slice /
Gather back to the true channels, inserted before anything that is shape- or
channel-sensitive (Reshape, Flatten, Gemm, MatMul, Transpose, Softmax over channels, Split,
Shape, graph outputs, ops not listed below). A graph output keeps its name: the padded
tensor gets a fresh name and the Slice writes the original one.

The dataflow state of a tensor is its layout: the padded count P, the position of each true
channel in 0..P-1 (a prefix for a padded conv; blocks per group for grouped convs; offsets
for Concat of padded inputs) and whether the padded positions hold exact zeros.

The invariant (what makes the outputs equal to float rounding):

1. The values at true positions are exactly the original values: every op that carries
   padding computes each true channel from the same true channels as before, and every
   absorbing Conv multiplies padded positions by exact-zero weight columns.
2. The values at padded positions are finite. They are exact zeros wherever something
   needs zeros: LRN (sums squares over neighbouring positions), Concat followed by an
   LRN, and the bookkeeping for Mul/Add chains. Ops with f(0) != 0 (Sigmoid,
   HardSigmoid, Clip(min>0), Add of a scalar) make padded positions nonzero but finite;
   that is harmless because every consumer is a zero-column Conv (0 * finite = 0) or a
   Slice. Ops that could turn padding into inf/NaN (Log, Reciprocal, Div by a padded
   tensor, Exp/Softplus/Sqrt/Cast of nonzero padding) end the padded region instead.
3. Per-channel constants are padded with values that keep zeros zero: Add/Sub/Mul 0, Div
   denominator 1, PRelu slope 0, BatchNormalization scale 0, bias 0, mean 0, var 1
   (0 * (x - 0) / sqrt(1 + eps) + 0 = 0, for any finite x), InstanceNormalization scale 0,
   bias 0. A padded conv's filters and bias are zero, so its padded outputs are 0.
4. Two padded tensors meeting in Add/Sub/Mul/Max/Min/Sum/Mean/Concat(non-channel axis)
   must share one layout; an unpadded partner is padded to it (Pad, or Pad+Gather for a
   non-prefix layout); different layouts are both sliced back.

Finite activations are assumed: a non-finite value in a true channel would already reach
the outputs of the original model at the same place.

What carries padding: unary activations (Relu, LeakyRelu, PRelu with constant slope, Clip,
Tanh, Sigmoid, HardSigmoid, HardSwish, Elu, Selu, Celu, Softsign, Abs, Neg, Erf, Gelu,
Identity, Dropout in inference ...), BatchNormalization, InstanceNormalization,
Max/Average/Lp pools and their Global forms, Reduce* over spatial axes, Resize/Upsample
with channel scale 1, spatial Pad, Softmax/LogSoftmax over a spatial axis, LRN (prefix layout
with zero padding only), depthwise Conv (the padded channels become extra groups with zero
filters), Concat (on the channel axis the layouts are concatenated with their offsets; a
conv after it gets its zero columns at those offsets) and the elementwise ops of point 4.

Grouped convs (1 < group < C_in) are padded per group: each group's filters are padded to
the same count Og' (with group * Og' a multiple of N), so the output layout is one block per
group. A grouped conv absorbs a padded input only if every group's true channels sit in that
group's block (a producer conv whose output feeds a grouped conv chooses that blocked
layout); otherwise its input is sliced back. An unpadded grouped input cannot be padded per
group with one Pad: skip:grouped-input-needs-per-group-padding. ConvTranspose is not padded
(skip:conv-transpose).

Options (Context.option):

* ``pad_multiple`` N: 4 (default), 8, 16 or 32.
* ``pad_sides``: "in" (Pad before convs with misaligned inputs only), "out" (pad conv
  outputs and carry them; consumers absorb them), "both" (default).
* ``pad_max_overhead``: cost guard, default 0.5. A conv whose FLOPs or weight bytes would
  grow by more than this share is not padded (skip:cost-guard): first the output side is
  judged alone, then input and output together. If together they are over the limit, the
  input side gives way (a planned Pad is dropped, padding from a producer is sliced back)
  and, when the input side alone would have passed, the output side too: a second run sees
  padded counts as true ones, and this keeps the pass idempotent. 0.5 lets the RGB stem conv through
  (3 -> 4 channels, +33%), which is the case channel padding exists for, and stops the
  cases where the padded kernel would have to be more than 1.5x faster just to break even
  (1 -> 4 channels is +300%; at N = 32, 3 -> 32 is +967%). MIGraphX itself no longer pads
  (PR #2373), so padding is only worth it where a backend's aligned kernels are measurably
  faster; see docs/pad-channels.md and docs/benchmarks_pad.md.

Report: one note per conv that was padded or skipped (channels, FLOPs per sample and weight
bytes, before -> after), a totals note, and counts: padded-convs, aligned-already,
skip:<reason>, inserted-pad, inserted-slice, ...

Quantisation after this pass (it runs after fuse-conv-bn and before QDQ insertion): a padded
filter is all zeros, so per-channel weight quantisation must give such a channel a safe
scale (e.g. 1.0), never a zero or denormal one (MIGraphX fails to compile a zero scale,
PROFILE.md rule 7). The quantiser handles it; padded input columns are zeros inside real
filters and need nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.errors import InputError
from rewriter.core.gs_io import export_model
from rewriter.core.graph import Namer, iter_graphs, own_constant
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

MULTIPLES = (4, 8, 16, 32)
SIDES = ("in", "out", "both")

# op -> (f(0) == 0, accepts nonzero padding without risking inf/NaN)
UNARY = {
    "Relu": (True, True), "LeakyRelu": (True, True), "Tanh": (True, True),
    "Elu": (True, True), "Selu": (True, True), "Celu": (True, True),
    "HardSwish": (True, True), "Softsign": (True, True), "Abs": (True, True),
    "Neg": (True, True), "Identity": (True, True), "Erf": (True, True),
    "Gelu": (True, True), "Sin": (True, True), "Sign": (True, True),
    "Floor": (True, True), "Ceil": (True, True), "Round": (True, True),
    "ThresholdedRelu": (True, True), "Dropout": (True, True),
    "Sigmoid": (False, True), "HardSigmoid": (False, True), "Cos": (False, True),
    # Could overflow or go NaN on arbitrary padding: only when the padding is zero.
    "Sqrt": (True, False), "Cast": (True, False), "Exp": (False, False),
    "Softplus": (False, False),
}
ELEMENTWISE = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean")
POOLS = ("MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
         "GlobalLpPool")
REDUCE = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceL1", "ReduceL2",
          "ReduceSumSquare")


@dataclass(frozen=True)
class Layout:
    """Padded channel layout of a tensor: true channel j sits at position pos[j] of size."""

    size: int
    pos: tuple[int, ...]
    rank: int
    zero: bool

    @property
    def true(self) -> int:
        return len(self.pos)

    @property
    def prefix(self) -> bool:
        return self.pos == tuple(range(len(self.pos)))

    def same(self, o: Layout) -> bool:
        return self.size == o.size and self.pos == o.pos and self.rank == o.rank

    def with_zero(self, zero: bool) -> Layout:
        return Layout(self.size, self.pos, self.rank, zero)


@dataclass
class ConvRow:
    """One line of the report: a conv before -> after."""

    name: str
    group: int
    cin: int
    cout: int
    pin: int
    pout: int
    flops: int
    flops_after: int
    wbytes: int
    wbytes_after: int
    status: str            # "padded", "aligned" (already) or "skip:<reason>"
    per_pixel: bool = False  # spatial dims symbolic: FLOPs counted per output pixel
    guarded: str = ""      # what the cost guard refused, and why

    def line(self) -> str:
        unit = " per output pixel" if self.per_pixel else ""
        return (f"{self.name}: {self.status}; in {self.cin}->{self.pin}, out {self.cout}->"
                f"{self.pout}, group {self.group}; FLOPs {_si(self.flops)}->"
                f"{_si(self.flops_after)}{unit}; weights {_si(self.wbytes)}B->"
                f"{_si(self.wbytes_after)}B" + (f"; {self.guarded}" if self.guarded else ""))


def round_up(c: int, n: int) -> int:
    return -(-c // n) * n


class PadChannels(Pass):
    name = "pad-channels"
    phase = Phase.LAYOUT
    numerics = Numerics.EXACT
    summary = "pad conv channels to a multiple of N with zero filters/columns (cost-guarded)"

    def requires(self, graph: gs.Graph, ctx: Context) -> None:
        _options(ctx)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        n, sides, max_over = _options(ctx)
        res = PassResult()
        namer = ctx.namer or Namer(graph)
        _fill_missing_shapes(graph, res)
        for g in iter_graphs(graph):
            _GraphPadder(g, n, sides, max_over, namer, res, res.rows).run()
        _summarise(res.rows, res, n)
        return res


def _options(ctx: Context) -> tuple[int, str, float]:
    try:
        n = int(ctx.options.pad_multiple)
    except (TypeError, ValueError):
        raise InputError(f"pad_multiple must be one of {MULTIPLES}") from None
    if n not in MULTIPLES:
        raise InputError(f"pad_multiple must be one of {MULTIPLES}, got {n}")
    sides = str(ctx.options.pad_sides)
    if sides not in SIDES:
        raise InputError(f"pad_sides must be one of {SIDES}, got '{sides}'")
    try:
        over = float(ctx.options.pad_max_overhead)
    except (TypeError, ValueError):
        raise InputError("pad_max_overhead must be a number (a share, e.g. 0.5)") from None
    if not over >= 0:
        raise InputError(f"pad_max_overhead must be >= 0, got {over}")
    return n, sides, over


# --------------------------------------------------------------------------- analysis


class _GraphPadder:
    """Forward dataflow over one graph: decide, then apply."""

    def __init__(self, g, n, sides, max_over, namer, res, rows):
        self.g, self.n, self.sides, self.max_over = g, n, sides, max_over
        self.namer, self.res, self.rows = namer, res, rows
        self.local = {id(nd) for nd in g.nodes}
        self.lay: dict[int, Layout] = {}
        self.tensors: dict[int, gs.Tensor] = {}
        # decisions, applied after the walk
        self.slices: dict[int, list[tuple[gs.Node, int]]] = {}
        self.padups: list[tuple[gs.Node, int, Layout, int]] = []   # node, input, layout, axis
        self.consts: list[tuple[gs.Node, int, np.ndarray]] = []
        self.convs: list[tuple[gs.Node, np.ndarray, np.ndarray | None, int]] = []
        self.attrs: list[tuple[gs.Node, str, object]] = []
        # (cin, pin, cout, pout, depthwise) the cost guard refused for the conv at hand
        self.refused: tuple | None = None

    # ------------------------------------------------------------------ walk
    def run(self) -> None:
        self.g.toposort(recurse_subgraphs=False)
        for node in list(self.g.nodes):
            if node.op in ("Conv", "ConvTranspose"):
                self._conv(node)
                continue
            padded = [i for i, t in enumerate(node.inputs) if id(t) in self.lay]
            if not padded:
                continue
            out = self._transfer(node)
            if out is None:
                for i in padded:
                    self._slice(node, i)
            else:
                self._set(node.outputs[0], out)
        # Consumers outside this graph (subgraph bodies) cannot carry padding.
        for tid, t in list(self.tensors.items()):
            for c in list(t.outputs):
                if id(c) not in self.local:
                    for i, x in enumerate(c.inputs):
                        if x is t:
                            self._slice(c, i)
        if self.slices or self.padups or self.consts or self.convs:
            self._apply()
            self.res.changed = True

    def _set(self, t, layout: Layout) -> None:
        self.lay[id(t)] = layout
        self.tensors[id(t)] = t

    def _slice(self, node, i) -> None:
        lst = self.slices.setdefault(id(node.inputs[i]), [])
        if (node, i) not in [(a, b) for a, b in lst]:
            lst.append((node, i))

    # ------------------------------------------------------------------ convs
    def _conv(self, node) -> None:
        """Decide a conv's input and output layouts, then queue its padded weights."""
        self.refused = None
        # A padded tensor used as dynamic weights or bias is never carried.
        for i in range(1, len(node.inputs)):
            if id(node.inputs[i]) in self.lay:
                self._slice(node, i)
        x = node.inputs[0] if node.inputs else None
        lx = self.lay.get(id(x)) if x is not None else None
        info, reason = _conv_info(node)
        if not reason and lx is not None and lx.true != info[3]:
            reason = "channel-mismatch"    # the channel count disagrees with the weights
        if reason:
            if lx is not None:
                self._slice(node, 0)
            self._row_skip(node, info, reason)
            return
        w, b, group, cin, cout = info
        depthwise = group > 1 and group == cin and w.shape[1] == 1
        reasons: list[str] = []
        in_layout, pad_in = self._input_side(node, x, lx, w, group, cin, depthwise, reasons)
        out_layout = self._output_side(node, in_layout, w, group, cin, cout, depthwise, reasons)
        in_layout, pad_in, out_layout = self._cost_guard(node, in_layout, pad_in, out_layout,
                                                         cin, cout, depthwise, reasons)
        pin = in_layout.size if in_layout is not None else cin
        pout = out_layout.size if out_layout is not None else cout
        if in_layout is None and out_layout is None:
            self._row(node, info, cin, cout, cin, cout, group,
                      "aligned" if cin % self.n == 0 and cout % self.n == 0
                      else "skip:" + (reasons[0] if reasons else "not-aligned"))
            return
        new_w, new_b, new_g = _padded_weights(w.values, b.values if b is not None else None,
                                              group, cin, cout, pin, pout, depthwise,
                                              in_layout, out_layout)
        self.convs.append((node, new_w, new_b, new_g))
        if pad_in:
            self.padups.append((node, 0, in_layout, 1))
        if out_layout is not None:
            self._set(node.outputs[0], out_layout)
        status = "padded"
        if pin % self.n or pout % self.n:
            status = "skip:" + (reasons[0] if reasons else "not-aligned")
        self._row(node, info, cin, cout, pin, pout, new_g, status)

    def _input_side(self, node, x, lx, w, group, cin, depthwise, reasons):
        """(input layout, whether a Pad must make it): the carried one, or a new one."""
        grouped = group > 1 and not depthwise
        if lx is not None:
            if grouped and not _blocked_ok(lx, group, cin):
                self._slice(node, 0)
                reasons.append("grouped-input-layout")
            elif lx.rank != len(w.shape):
                self._slice(node, 0)
                reasons.append("rank-mismatch")
            else:
                return lx, False
        if cin % self.n == 0:
            return None, False
        if self.sides == "out":
            reasons.append("depthwise-input-not-padded" if depthwise else "in-side-disabled")
        elif grouped:
            reasons.append("grouped-input-needs-per-group-padding")
        elif x is None or x.shape is None or len(x.shape) != len(w.shape):
            reasons.append("input-rank-unknown")
        else:
            return Layout(round_up(cin, self.n), tuple(range(cin)), len(w.shape), True), True
        return None, False

    def _output_side(self, node, in_layout, w, group, cin, cout, depthwise, reasons):
        """The output layout: a depthwise conv follows its input; others pad to N."""
        if depthwise:
            if in_layout is None:
                return None
            m = cout // cin
            pos = tuple(p * m + r for p in in_layout.pos for r in range(m))
            return Layout(in_layout.size * m, pos, len(w.shape), True)
        if cout % self.n == 0:
            return None
        if self.sides == "in":
            reasons.append("out-side-disabled")
            return None
        out_layout = self._out_layout(node, cout, group, len(w.shape))
        if out_layout.size / cout - 1 > self.max_over + 1e-9:
            reasons.append("cost-guard")
            self._guarded(cin, in_layout.size if in_layout is not None else cin, cout,
                          out_layout.size)
            return None
        return out_layout

    def _cost_guard(self, node, in_layout, pad_in, out_layout, cin, cout, depthwise, reasons):
        """Drop the input side (and, when needed, the output side) of a conv whose FLOPs
        would grow past --pad-max-overhead."""
        if in_layout is None:
            return in_layout, pad_in, out_layout
        pin = in_layout.size
        pout = out_layout.size if out_layout is not None else cout
        ratio = pin / cin if depthwise else (pin / cin) * (pout / cout)
        if ratio - 1 <= self.max_over + 1e-9:
            return in_layout, pad_in, out_layout
        reasons.append("cost-guard")
        self._guarded(cin, pin, cout, pout, depthwise)
        if not pad_in:
            self._slice(node, 0)
        # A second run sees padded counts as true ones. If the input side alone would pass,
        # keeping the output padded would let that run pad the input too: leave both sides
        # as they are, so the decision is a fixpoint.
        if depthwise or round_up(cin, self.n) / cin - 1 <= self.max_over + 1e-9:
            out_layout = None
        return None, False, out_layout

    def _guarded(self, cin, pin, cout, pout, depthwise=False) -> None:
        """Keep what the cost guard refused (both sides, when both were), for the note."""
        if self.refused is not None:
            pin, pout = max(pin, self.refused[1]), max(pout, self.refused[3])
        self.refused = (cin, pin, cout, pout, depthwise)

    def _guard_note(self) -> str:
        """What the cost guard refused and why: the note's counts are what was done."""
        if self.refused is None:
            return ""
        cin, pin, cout, pout, depthwise = self.refused
        ratio = pin / cin if depthwise else (pin / cin) * (pout / cout)
        return (f"cost guard: padding in {cin}->{pin}, out {cout}->{pout} would add "
                f"{ratio - 1:+.0%} FLOPs and weights, over --pad-max-overhead "
                f"{self.max_over:g}")

    def _out_layout(self, node, cout, group, rank) -> Layout:
        n = self.n
        blocks = group if group > 1 else _grouped_consumer(node.outputs[0], cout, self.local)
        if blocks > 1:
            og = cout // blocks
            pg = og
            while (blocks * pg) % n:
                pg += 1
            pos = tuple(k * pg + r for k in range(blocks) for r in range(og))
            return Layout(blocks * pg, pos, rank, True)
        return Layout(round_up(cout, n), tuple(range(cout)), rank, True)

    def _row_skip(self, node, info, reason) -> None:
        if info is None:
            w = node.inputs[1] if len(node.inputs) > 1 else None
            shape = getattr(w, "shape", None)
            group = int(node.attrs.get("group", 1))
            if not shape or len(shape) < 2 or not all(isinstance(d, int) for d in shape[:2]):
                self.rows.append(ConvRow(node.name or node.outputs[0].name, group, 0, 0, 0, 0,
                                         0, 0, 0, 0, "skip:" + reason))
                return
            if node.op == "ConvTranspose":
                cin, cout = shape[0], shape[1] * group
            else:
                cin, cout = shape[1] * group, shape[0]
            if cin % self.n == 0 and cout % self.n == 0:
                reason = None
            self._row(node, None, cin, cout, cin, cout, group,
                      "aligned" if reason is None else "skip:" + reason)
            return
        _, _, group, cin, cout = info
        self._row(node, info, cin, cout, cin, cout, group, "skip:" + reason)

    def _row(self, node, info, cin, cout, pin, pout, new_g, status) -> None:
        w = node.inputs[1] if len(node.inputs) > 1 else None
        wshape = list(getattr(w, "shape", None) or [])
        kprod = int(np.prod([d for d in wshape[2:] if isinstance(d, int)] or [1]))
        group = int(node.attrs.get("group", 1))
        y = node.outputs[0]
        spatial, per_pixel = 1, False
        if y.shape is not None and len(y.shape) > 2:
            for d in y.shape[2:]:
                if isinstance(d, int) and d > 0:
                    spatial *= d
                else:
                    per_pixel = True
        else:
            per_pixel = True
        itemsize = np.dtype(getattr(w, "dtype", np.float32) or np.float32).itemsize
        flops = 2 * spatial * cout * (cin // max(group, 1)) * kprod
        flops_after = 2 * spatial * pout * (pin // max(new_g, 1)) * kprod
        has_b = len(node.inputs) > 2 and node.inputs[2].name
        wbytes = itemsize * (cout * (cin // max(group, 1)) * kprod + (cout if has_b else 0))
        wbytes_after = itemsize * (pout * (pin // max(new_g, 1)) * kprod + (pout if has_b else 0))
        self.rows.append(ConvRow(node.name or y.name, group, cin, cout, pin, pout, flops,
                                 flops_after, wbytes, wbytes_after, status, per_pixel,
                                 self._guard_note()))

    # ------------------------------------------------------------------ other ops
    def _transfer(self, node) -> Layout | None:
        """Layout of the first output if ``node`` carries its padded inputs, else None.

        Side decisions (padded constants, Pad of an unpadded partner, new attributes) are
        recorded only when the node carries the padding.
        """
        op = node.op
        x = node.inputs[0]
        lx = self.lay.get(id(x))
        extra_used = any(o.outputs or o in self.g.outputs for o in node.outputs[1:])
        if op in UNARY:
            zero_to_zero, any_ok = UNARY[op]
            if lx is None or extra_used or any(id(t) in self.lay for t in node.inputs[1:]):
                return None
            if not lx.zero and not any_ok:
                return None
            if op == "Dropout" and len(node.inputs) > 2 and node.inputs[2].name:
                tm = node.inputs[2]
                if not isinstance(tm, gs.Constant) or bool(np.any(tm.values)):
                    return None
            if op == "Cast" and np.dtype(_np_dtype(node.attrs.get("to"))).kind not in "fiub":
                return None
            return lx.with_zero(lx.zero and zero_to_zero)
        if op == "Clip":
            return self._clip(node, lx)
        if op == "PRelu":
            return self._elementwise(node, fill=0.0)
        if op in ELEMENTWISE:
            return self._elementwise(node)
        if op == "BatchNormalization":
            return self._norm(node, lx, (0.0, 0.0, 0.0, 1.0), extra_used)
        if op == "InstanceNormalization":
            return self._norm(node, lx, (0.0, 0.0), extra_used)
        if op in POOLS:
            if lx is None or extra_used or lx.rank < 3:
                return None
            return lx
        if op in REDUCE:
            return self._reduce(node, lx)
        if op in ("Resize", "Upsample"):
            return self._resize(node, lx)
        if op == "Concat":
            return self._concat(node)
        if op == "LRN":
            if lx is not None and lx.prefix and lx.zero:
                return lx
            return None
        if op in ("Softmax", "LogSoftmax"):
            if lx is None:
                return None
            default = -1 if self.g.opset >= 13 else 1
            axis = int(node.attrs.get("axis", default))
            axis = axis + lx.rank if axis < 0 else axis
            return lx.with_zero(False) if axis >= 2 else None
        if op == "Pad":
            return self._spatial_pad(node, lx)
        return None

    def _clip(self, node, lx):
        if lx is None or any(id(t) in self.lay for t in node.inputs[1:]):
            return None
        lo, hi = node.attrs.get("min", -math.inf), node.attrs.get("max", math.inf)
        known = True
        for i, name in ((1, "lo"), (2, "hi")):
            if len(node.inputs) > i and node.inputs[i].name:
                t = node.inputs[i]
                if isinstance(t, gs.Constant):
                    v = float(np.asarray(t.values).reshape(-1)[0])
                    lo, hi = (v, hi) if name == "lo" else (lo, v)
                else:
                    known = False
        return lx.with_zero(lx.zero and known and lo <= 0.0 <= hi)

    def _norm(self, node, lx, fills, extra_used):
        if lx is None or extra_used or int(node.attrs.get("training_mode", 0)):
            return None
        if node.op == "BatchNormalization" and (int(node.attrs.get("spatial", 1)) != 1
                                                or int(node.attrs.get("is_test", 1)) == 0):
            return None
        params = node.inputs[1:1 + len(fills)]
        if len(params) != len(fills) or any(id(p) in self.lay for p in params):
            return None
        if not all(isinstance(p, gs.Constant) and p.values.ndim == 1
                   and p.values.shape[0] == lx.true for p in params):
            return None
        for i, (p, fill) in enumerate(zip(params, fills)):
            self.consts.append((node, i + 1, _scatter(p.values, lx, 0, fill)))
        return lx.with_zero(True)

    def _elementwise(self, node, fill=None) -> Layout | None:
        """Add/Sub/Mul/Div/Max/Min/Sum/Mean/PRelu: padded inputs share one layout."""
        op = node.op
        ins = list(node.inputs)
        lays = [self.lay.get(id(t)) for t in ins]
        ref = next(lay for lay in lays if lay is not None)
        if any(lay is not None and not lay.same(ref) for lay in lays):
            return None
        ranks = []
        for t, lay in zip(ins, lays):
            if lay is not None:
                ranks.append(lay.rank)
            else:
                s = _shape(t)
                if s is None:
                    return None
                ranks.append(len(s))
        rank = max(ranks)
        if ref.rank != rank:
            return None
        consts, padups = [], []
        kinds = []  # per input: "zero", "nonzero" (padding of unknown value), "bcast"
        for i, (t, lay) in enumerate(zip(ins, lays)):
            denom = op == "Div" and i == 1
            if lay is not None:
                if denom:
                    return None   # x / 0 in the padding
                kinds.append("zero" if lay.zero else "nonzero")
                continue
            s = _shape(t)
            ax = 1 - (rank - len(s))
            d = s[ax] if ax >= 0 else 1
            if d == 1:
                if denom and (not isinstance(t, gs.Constant) or np.any(t.values == 0)):
                    return None
                kinds.append("bcast")
                continue
            if d != ref.true:
                return None   # unknown or different channel count
            f = 1.0 if denom else (fill if fill is not None else 0.0)
            if isinstance(t, gs.Constant):
                consts.append((node, i, _scatter(t.values, ref, ax, f)))
                kinds.append("zero" if f == 0.0 else "one")
            else:
                if denom:
                    return None
                padups.append((node, i, ref, ax))
                kinds.append("zero")
        if op == "PRelu":
            zero = kinds[0] == "zero"
        elif op == "Mul":
            zero = "zero" in kinds
        elif op == "Div":
            zero = kinds[0] == "zero"
        else:
            zero = all(k == "zero" for k in kinds)
        self.consts.extend(consts)
        self.padups.extend(padups)
        return ref.with_zero(zero)

    def _reduce(self, node, lx):
        if lx is None or any(id(t) in self.lay for t in node.inputs[1:]):
            return None
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1 and node.inputs[1].name:
            if not isinstance(node.inputs[1], gs.Constant):
                return None
            axes = [int(a) for a in np.asarray(node.inputs[1].values).reshape(-1)]
        if not axes:
            return None   # all axes (or a no-op we do not need to reason about)
        axes = [a + lx.rank if a < 0 else a for a in axes]
        if any(a < 2 for a in axes):
            return None
        keep = int(node.attrs.get("keepdims", 1))
        return Layout(lx.size, lx.pos, lx.rank if keep else lx.rank - len(set(axes)), lx.zero)

    def _resize(self, node, lx):
        if lx is None or any(id(t) in self.lay for t in node.inputs[1:]):
            return None
        if node.attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
            return None
        axes = node.attrs.get("axes")
        axes = None if axes is None else [a + lx.rank if a < 0 else a for a in axes]
        if axes is not None and 1 not in axes:
            return lx
        cidx = 1 if axes is None else axes.index(1)
        if "scales" in node.attrs:   # Upsample-7
            return lx if float(node.attrs["scales"][cidx]) == 1.0 else None
        if node.op == "Upsample":
            sc = node.inputs[1] if len(node.inputs) > 1 else None
            if isinstance(sc, gs.Constant) and float(np.asarray(sc.values)[cidx]) == 1.0:
                return lx
            return None
        # Resize: (X, roi, scales, sizes) from opset 11; (X, scales) in opset 10.
        scales_i = 2 if self.g.opset >= 11 else 1
        sc = node.inputs[scales_i] if len(node.inputs) > scales_i else None
        sz = node.inputs[3] if len(node.inputs) > 3 and self.g.opset >= 11 else None
        if sz is not None and sz.name:
            if not isinstance(sz, gs.Constant):
                return None
            v = np.asarray(sz.values).copy()
            if int(v[cidx]) != lx.true:
                return None
            v[cidx] = lx.size
            self.consts.append((node, 3, v))
            return lx
        if sc is not None and sc.name:
            if isinstance(sc, gs.Constant) and float(np.asarray(sc.values)[cidx]) == 1.0:
                return lx
            return None
        return None

    def _concat(self, node):
        lays = [self.lay.get(id(t)) for t in node.inputs]
        ref = next(lay for lay in lays if lay is not None)
        axis = int(node.attrs.get("axis", 1))
        axis = axis + ref.rank if axis < 0 else axis
        if axis != 1:
            return self._elementwise_same(node, lays, ref)
        size, pos, zero, padups, consts = 0, [], True, [], []
        for i, (t, lay) in enumerate(zip(node.inputs, lays)):
            if lay is None:
                s = _shape(t)
                if s is None or len(s) != ref.rank or not isinstance(s[1], int):
                    return None
                c = s[1]
                # An unaligned unpadded segment would leave the consumer unaligned: pad it
                # too (zeros), so every segment, and so the total, is a multiple of N.
                lay = Layout(round_up(c, self.n), tuple(range(c)), ref.rank, True)
                if lay.size != c:
                    if isinstance(t, gs.Constant):
                        consts.append((node, i, _scatter(t.values, lay, 1, 0.0)))
                    else:
                        padups.append((node, i, lay, 1))
            if lay.rank != ref.rank:
                return None
            pos.extend(size + p for p in lay.pos)
            size += lay.size
            zero = zero and lay.zero
        self.padups.extend(padups)
        self.consts.extend(consts)
        return Layout(size, tuple(pos), ref.rank, zero)

    def _elementwise_same(self, node, lays, ref):
        """Concat on a non-channel axis: every input in one layout."""
        if any(lay is not None and not lay.same(ref) for lay in lays):
            return None
        padups, consts = [], []
        for i, (t, lay) in enumerate(zip(node.inputs, lays)):
            if lay is not None:
                continue
            s = _shape(t)
            if s is None or len(s) != ref.rank or s[1] != ref.true:
                return None
            if isinstance(t, gs.Constant):
                consts.append((node, i, _scatter(t.values, ref, 1, 0.0)))
            else:
                padups.append((node, i, ref, 1))
        self.padups.extend(padups)
        self.consts.extend(consts)
        return ref.with_zero(all(lay is None or lay.zero for lay in lays))

    def _spatial_pad(self, node, lx):
        if lx is None or any(id(t) in self.lay for t in node.inputs[1:]):
            return None
        if "pads" in node.attrs:
            pads = list(node.attrs["pads"])
            value = float(node.attrs.get("value", 0.0))
        else:
            p = node.inputs[1] if len(node.inputs) > 1 else None
            if not isinstance(p, gs.Constant):
                return None
            pads = [int(v) for v in np.asarray(p.values).reshape(-1)]
            value = 0.0
            if len(node.inputs) > 2 and node.inputs[2].name:
                cv = node.inputs[2]
                if not isinstance(cv, gs.Constant):
                    return None
                value = float(np.asarray(cv.values).reshape(-1)[0]) if cv.values.size else 0.0
            if len(node.inputs) > 3 and node.inputs[3].name:
                return None   # axes input: keep it simple
        r = lx.rank
        if len(pads) != 2 * r or pads[1] != 0 or pads[1 + r] != 0:
            return None
        mode = node.attrs.get("mode", "constant")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        return lx.with_zero(lx.zero and (mode != "constant" or value == 0.0))

    # ------------------------------------------------------------------ apply
    def _apply(self) -> None:
        g, namer, res = self.g, self.namer, self.res
        opset = g.opset
        # conv weights
        for node, w, b, group in self.convs:
            own_constant(node, 1, w, namer, "padded")
            if b is not None:
                own_constant(node, 2, b, namer, "padded")
            if int(node.attrs.get("group", 1)) != group:
                node.attrs["group"] = group
        for node, i, v in self.consts:
            own_constant(node, i, v.astype(np.asarray(node.inputs[i].values).dtype),
                           namer, "padded")
        # shapes of every tensor that now carries padding
        originals = {}
        for tid, t in self.tensors.items():
            lay = self.lay[tid]
            originals[tid] = list(t.shape) if t.shape is not None else None
            if t.shape is not None and len(t.shape) == lay.rank:
                s = list(t.shape)
                s[1] = lay.size
                t.shape = s
        # Pad (or Pad + Gather) of unpadded partners, one per (tensor, layout, axis)
        made: dict[tuple, gs.Variable] = {}
        for node, i, lay, ax in self.padups:
            t = node.inputs[i]
            key = (id(t), lay.size, lay.pos, ax)
            if key not in made:
                made[key] = self._pad_tensor(t, lay, ax, opset)
                res.count("inserted-pad")
            node.inputs[i] = made[key]
        # Slice (or Gather) back to the true channels
        gouts = {id(t): k for k, t in enumerate(g.outputs)}
        for tid, users in self.slices.items():
            t = self.tensors[tid] if tid in self.tensors else users[0][0].inputs[users[0][1]]
            lay = self.lay[tid]
            true_shape = originals.get(tid)
            if true_shape is None and t.shape is not None:
                true_shape = list(t.shape)
                true_shape[1] = lay.true
            if tid in gouts or t in g.outputs:
                self._slice_graph_output(t, lay, true_shape, opset)
            else:
                out = gs.Variable(namer(f"{t.name}_unpadded"), dtype=t.dtype, shape=true_shape)
                self._emit_unpad(t, out, lay, opset)
                for node, i in users:
                    node.inputs[i] = out
            res.count("inserted-slice")
        # graph outputs that carry padding but had no barrier consumer recorded
        for t in list(g.outputs):
            if id(t) in self.lay and id(t) not in self.slices:
                self._slice_graph_output(t, self.lay[id(t)], originals.get(id(t)), opset)
                res.count("inserted-slice")

    def _slice_graph_output(self, t, lay, true_shape, opset) -> None:
        """Keep the graph output's name and shape: padded data moves to a fresh tensor."""
        if getattr(t, "_pad_sliced", False):
            return
        padded_shape = list(t.shape) if t.shape is not None else None
        p = gs.Variable(self.namer(f"{t.name}_padded"), dtype=t.dtype, shape=padded_shape)
        for prod in list(t.inputs):
            for k, o in enumerate(prod.outputs):
                if o is t:
                    prod.outputs[k] = p
        barrier = {(id(nd), i) for nd, i in self.slices.get(id(t), [])}
        for c in list(t.outputs):
            for i, x in enumerate(c.inputs):
                if x is t and (id(c), i) not in barrier:
                    c.inputs[i] = p
        t.shape = true_shape
        self._emit_unpad(p, t, lay, self.g.opset)
        t._pad_sliced = True

    def _emit_unpad(self, src, dst, lay, opset) -> None:
        name = self.namer(f"{dst.name}_unpad")
        if lay.prefix:
            self.g.nodes.append(_slice_node(name, src, dst, lay.true, opset, self.namer))
        else:
            idx = gs.Constant(self.namer(f"{dst.name}_channels"),
                              np.asarray(lay.pos, dtype=np.int64))
            self.g.nodes.append(gs.Node("Gather", name, attrs={"axis": 1},
                                        inputs=[src, idx], outputs=[dst]))

    def _pad_tensor(self, t, lay, ax, opset) -> gs.Variable:
        shape = _shape(t)
        rank = len(shape)
        out_shape = list(shape)
        out_shape[ax] = lay.size
        out = gs.Variable(self.namer(f"{t.name}_padded"), dtype=_dtype(t), shape=out_shape)
        # Never a Pad straight into the conv, even for a prefix layout: MIGraphX's
        # eliminate_pad folds a zero Pad into the following convolution's spatial padding
        # and drops its channel pads (src/eliminate_pad.cpp:40-64 at f729a52 and
        # rocm-7.2.4), so the conv would see the unpadded channels ("mismatched channel
        # numbers", run on 2.15 and 2.16). The Gather between them keeps the Pad apart.
        # Append one zero channel, then gather it into every padded slot.
        mid_shape = list(shape)
        mid_shape[ax] = lay.true + 1
        mid = gs.Variable(self.namer(f"{t.name}_zero1"), dtype=_dtype(t), shape=mid_shape)
        pads = [0] * (2 * rank)
        pads[rank + ax] = 1
        self.g.nodes.append(_pad_node(self.namer(f"{t.name}_pad"), t, mid, pads, opset,
                                      self.namer))
        idx = np.full(lay.size, lay.true, dtype=np.int64)
        idx[list(lay.pos)] = np.arange(lay.true)
        ic = gs.Constant(self.namer(f"{t.name}_scatter"), idx)
        self.g.nodes.append(gs.Node("Gather", self.namer(f"{t.name}_place"), attrs={"axis": ax},
                                    inputs=[mid, ic], outputs=[out]))
        return out


def _padded_weights(wv, bv, group, cin, cout, pin, pout, depthwise, in_layout, out_layout):
    """(weights, bias, group) of the padded conv: the original values at their new
    positions, exact zeros everywhere else."""
    if depthwise:
        m = cout // cin
        rows = np.asarray(out_layout.pos)
        new_w = np.zeros((pin * m,) + wv.shape[1:], dtype=wv.dtype)
        new_w[rows] = wv
        new_b = None
        if bv is not None:
            new_b = np.zeros(pin * m, dtype=bv.dtype)
            new_b[rows] = bv
        return new_w, new_b, pin
    ipos = np.asarray(in_layout.pos if in_layout is not None else range(cin))
    opos = np.asarray(out_layout.pos if out_layout is not None else range(cout))
    cg, og, pg_in = cin // group, cout // group, pin // group
    new_w = np.zeros((pout, pg_in) + wv.shape[2:], dtype=wv.dtype)
    for k in range(group):
        rows = opos[k * og:(k + 1) * og]
        cols = ipos[k * cg:(k + 1) * cg] - k * pg_in
        new_w[np.ix_(rows, cols)] = wv[k * og:(k + 1) * og]
    new_b = None
    if bv is not None:
        new_b = np.zeros(pout, dtype=bv.dtype)
        new_b[opos] = bv
    return new_w, new_b, group


# --------------------------------------------------------------------------- helpers


def _conv_info(node):
    """((W, b, group, C_in, C_out), None) for a conv this pass can pad, or (None, reason)."""
    if node.op == "ConvTranspose":
        return None, "conv-transpose"
    if len(node.inputs) < 2:
        return None, "no-weights"
    w = node.inputs[1]
    if not isinstance(w, gs.Constant):
        return None, "weights-not-constant"
    b = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
    if b is not None and not isinstance(b, gs.Constant):
        return None, "bias-not-constant"
    if w.values.dtype.kind != "f":
        return None, "unsupported-dtype"
    if w.values.ndim < 3:
        return None, "weight-rank"
    group = int(node.attrs.get("group", 1))
    cout, cg = w.values.shape[:2]
    if group < 1 or cout % group:
        return None, "bad-group"
    if any(o.outputs for o in node.outputs[1:]):
        return None, "extra-outputs"
    return (w, b, group, int(cg) * group, int(cout)), None


def _blocked_ok(lay: Layout, group: int, cin: int) -> bool:
    """Every group's true channels lie in that group's block of the padded tensor."""
    if lay.size % group:
        return False
    pg, cg = lay.size // group, cin // group
    return all(p // pg == j // cg for j, p in enumerate(lay.pos))


def _grouped_consumer(y, cout: int, local: set[int], depth: int = 16) -> int:
    """Group count of a grouped conv reached through channel-local unary ops, else 1."""
    seen, todo, found = set(), [(y, 0)], set()
    while todo:
        t, d = todo.pop()
        if id(t) in seen or d > depth:
            continue
        seen.add(id(t))
        for c in t.outputs:
            if id(c) not in local or not c.inputs or c.inputs[0] is not t:
                continue
            if c.op == "Conv":
                g = int(c.attrs.get("group", 1))
                w = c.inputs[1] if len(c.inputs) > 1 else None
                if g > 1 and isinstance(w, gs.Constant) and w.values.shape[1] > 1 \
                        and cout % g == 0:
                    found.add(g)
            elif c.op in UNARY or c.op in POOLS or c.op in ("BatchNormalization", "Clip",
                                                             "InstanceNormalization"):
                todo.append((c.outputs[0], d + 1))
    return found.pop() if len(found) == 1 else 1


def _shape(t):
    if isinstance(t, gs.Constant):
        return list(t.values.shape)
    return list(t.shape) if t.shape is not None else None


def _dtype(t):
    return t.values.dtype if isinstance(t, gs.Constant) else t.dtype


def _np_dtype(to):
    import onnx
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(int(to))
    except Exception:  # noqa: BLE001 - unknown dtype code: treat as not numeric
        return np.dtype(object)


def _scatter(values: np.ndarray, lay: Layout, ax: int, fill: float) -> np.ndarray:
    """``values`` padded along ``ax`` to ``lay.size`` with ``fill`` at padded positions."""
    v = np.asarray(values)
    shape = list(v.shape)
    shape[ax] = lay.size
    out = np.full(shape, fill, dtype=v.dtype)
    idx = [slice(None)] * v.ndim
    idx[ax] = np.asarray(lay.pos)
    out[tuple(idx)] = v
    return out


def _i64(namer, base, vals) -> gs.Constant:
    return gs.Constant(namer(base), np.asarray(vals, dtype=np.int64))


def _slice_node(name, src, dst, count, opset, namer) -> gs.Node:
    if opset < 10:
        return gs.Node("Slice", name, attrs={"starts": [0], "ends": [count], "axes": [1]},
                       inputs=[src], outputs=[dst])
    return gs.Node("Slice", name, inputs=[
        src, _i64(namer, f"{dst.name}_starts", [0]), _i64(namer, f"{dst.name}_ends", [count]),
        _i64(namer, f"{dst.name}_axes", [1])], outputs=[dst])


def _pad_node(name, src, dst, pads, opset, namer) -> gs.Node:
    if opset < 11:
        return gs.Node("Pad", name, attrs={"pads": pads, "mode": "constant"},
                       inputs=[src], outputs=[dst])
    return gs.Node("Pad", name, inputs=[src, _i64(namer, f"{dst.name}_pads", pads)],
                   outputs=[dst])


def _fill_missing_shapes(graph: gs.Graph, res: PassResult) -> None:
    """Fill shapes onnx's inference left unknown, with onnxruntime's sympy-based inference.

    Only needed when a tensor that the analysis reads has no shape (e.g. after ops whose
    output shape onnx cannot infer with symbolic dims); failures leave shapes as they are.
    """
    missing = [t for t in graph.tensors().values()
               if isinstance(t, gs.Variable) and t.name and t.shape is None and t.inputs]
    if not missing:
        return
    try:
        import onnx
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        model = export_model(graph)
        inferred = SymbolicShapeInference.infer_shapes(model, auto_merge=True,
                                                       guess_output_rank=True)
    except Exception:  # noqa: BLE001 - best effort: the analysis treats unknown as barrier
        return
    if inferred is None:
        return
    infos = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}
    filled = 0
    for t in missing:
        vi = infos.get(t.name)
        if vi is None or not vi.type.HasField("tensor_type"):
            continue
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        t.shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                   for d in tt.shape.dim]
        if t.dtype is None and tt.elem_type:
            t.dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        filled += 1
    if filled:
        res.count("shapes-from-symbolic-inference", filled)


def _summarise(rows: list[ConvRow], res: PassResult, n: int) -> None:
    for r in rows:
        if r.status == "padded":
            res.count("padded-convs")
        elif r.status == "aligned":
            res.count("aligned-already")
        else:
            res.skip(r.status[5:])
        if r.status != "aligned":
            res.notes.append(r.line())
    if rows:
        f0, f1 = sum(r.flops for r in rows), sum(r.flops_after for r in rows)
        b0, b1 = sum(r.wbytes for r in rows), sum(r.wbytes_after for r in rows)
        share = (f1 / f0 - 1) * 100 if f0 else 0.0
        ok = sum(r.pin % n == 0 and r.pout % n == 0 for r in rows)
        res.notes.append(f"total: {ok}/{len(rows)} convs aligned to {n}; conv FLOPs "
                         f"{_si(f0)}->{_si(f1)} (+{share:.2f}%); conv weights {_si(b0)}B->"
                         f"{_si(b1)}B")


def _si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.2f}{unit}"
    return f"{int(x)}"
