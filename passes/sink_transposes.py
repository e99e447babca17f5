"""sink-transposes: Transposes move down through elementwise ops until they cancel or merge.

A model converted from TensorFlow keeps its NHWC layout between NCHW convs::

    Transpose(NHWC->NCHW) -> Conv -> Transpose(NCHW->NHWC) -> Add(b[C]) -> Relu
        -> Transpose(NHWC->NCHW) -> Conv ...

Before -> after::

    Transpose(p) -> E(., c) -> y        =>  E(., c') -> Transpose(p) -> y
        (E elementwise; c a constant, c' = c laid out before the Transpose)
    E(Transpose(p, a), Transpose(p, b)) =>  Transpose(p, E(a, b))
    Transpose(p) -> Transpose(q), q undoing p  =>  nothing (the readers read the input)

so the chain above becomes Conv -> Add(b[1, C, 1, 1]) -> Relu -> Conv, and fuse-conv-bn
can fold the per-channel Add and Mul into the conv. Each move keeps the number of
Transposes or lowers it (a Transpose is moved only past the one node that reads it, and a
second transposed input of that node must have the same perm); a pair that cancels goes.
The elementwise ops compute the same values on permuted data: bit-exact (Numerics.EXACT).

A Transpose read by several nodes that could all take it (tf2onnx's HardSwish,
x * relu6(x + 3) / 6 on the NHWC view, reads it twice; so does squeeze-excite's pooling
and gate) becomes one Transpose per reader; the copies move down each branch and merge
again where the branches join (E(Transpose(p, a), Transpose(p, b)) above). Copies that
cannot get that far would be a Transpose more each, so the split is tried on a copy of
the graph first and kept only where it leaves fewer nodes in the whole graph (one split
that adds a node can ride along with others that save more) (tf2onnx's MobileNetV3-small:
251 -> 192 nodes; onnxruntime's basic optimizer 202). Reductions over constant axes
(ReduceMean, ReduceSum, ...) pass a Transpose like Squeeze (keepdims=0) or with the perm
unchanged (keepdims=1), their axes renumbered: the same values up to the order of the sum.

A Reshape that keeps the static dims at both ends and splits or merges the ones between,
where those come from consecutive input dims of the Transpose in order, passes it too: it
then reshapes the input, and a Transpose of the groups follows (TorchScript's multi-head
attention: [197, 12N, 64] -> Transpose(1, 0, 2) -> Reshape([-1, 12, 197, 64]) is
Reshape([197, -1, 12, 64]) -> Transpose(1, 2, 0, 3), which merges with the Reshape before
and the key's Transpose after: ViT-B/16 482 -> 434 nodes from TorchScript, 431 -> 395 from
dynamo). Its dims come from shape inference; without them it stays.

Squeeze, Unsqueeze and Pad (LAYOUT) pass a Transpose too, with constant axes or pads
renumbered and the perm changed with the rank, as onnxruntime's transpose optimizer does
(madmom's Conv -> Transpose -> Squeeze -> Mul/Add/Elu -> Pad -> Unsqueeze -> Transpose then
cancels; skipped without constant axes or pads: axes-not-constant, pad-not-constant).

Elementwise here: unary activations and math (SAME_SHAPE_OPS) and the broadcasting binary and
variadic ops (BROADCAST_OPS), whose other inputs are constants of rank at most the Transpose's
(laid out anew: c' = reshape(c, rank r) transposed by the inverse perm, a copy of at most
65,536 elements; a constant that op alone reads is replaced rather than copied, so it moves
at any size up to ``fold_max_bytes``: tf2onnx's Keras PReLU with one slope per position,
[120, 120, 25], between a Transpose pair) or outputs of Transposes with the same perm.
Skipped with a reason: another input that is neither (other-input-not-transposed), a
constant of higher rank (constant-rank) or a larger one (constant-too-large). A Transpose whose
output is a graph output stays where it is; the output keeps its name wherever the
Transpose moves (the moved Transpose writes it). If/Loop/Scan bodies are processed too.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import BROADCAST_OPS, SAME_SHAPE_OPS, bypass, const_ints, iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

# Ops that move axes around without reading them as channels: a Transpose passes them
# with the axes (or pads) renumbered, and its perm changes with the rank (_sink_layout).
LAYOUT = {"Squeeze", "Unsqueeze", "Pad"}
# Reductions over constant axes: a Transpose passes them with the axes renumbered (keepdims=0
# changes the rank, as a Squeeze does). The sum runs in another order: equal up to rounding.
REDUCE = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
          "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
# Constants re-laid for a moved Transpose are copies: per-channel vectors and small tables
# only.
MAX_LAID_ELEMS = 1 << 16
# A bound on moves per graph: each move takes a Transpose one node further down.
MAX_MOVES_PER_NODE = 4


class SinkTransposes(Pass):
    name = "sink-transposes"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = "move Transposes down through elementwise ops until they cancel or merge"

    # ranks come from the perms, constants from their values; only a Reshape's dims are read
    shape_ops = ("Reshape",)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        _sweep(graph, ctx, res, split=False)
        if _splittable(graph):
            # A Transpose read by several sinkable nodes (tf2onnx's HardSwish: x*relu6(x+3)/6
            # on the NHWC view; squeeze-excite's ReduceMean and Mul) moves once it is one per
            # reader, and the copies meet again where the branches join. Whether they do is
            # known only after the moves: tried on a copy first, kept where it leaves fewer
            # nodes (copies that stay put would be a Transpose more each).
            trial = graph.copy()
            _sweep(trial, ctx, PassResult(), split=True)
            if _node_count(trial) < _node_count(graph):
                split = PassResult()
                _sweep(graph, ctx, split, split=True)
                res.changed = True
                for k, v in split.counts.items():
                    res.count(k, v)
        return res


def _sweep(graph: gs.Graph, ctx: Context, res: PassResult, split: bool) -> None:
    """Cancel and sink Transposes in ``graph`` and its bodies until nothing moves; with
    ``split``, a Transpose whose readers can all take it is first made one per reader."""
    for g in iter_graphs(graph):
        outs = {id(t) for t in g.outputs}
        budget = MAX_MOVES_PER_NODE * max(len(g.nodes), 1)
        moved = True
        while moved and budget > 0:
            moved, skips = False, []
            members = {id(n) for n in g.nodes}   # a body's reader of ours is not ours
            # The Transposes a move or split appends are taken in the same round (one that
            # sinks through n nodes would otherwise take n rounds over the whole graph).
            i, known = 0, len(g.nodes)
            while i < len(g.nodes) and budget > 0:
                node, i = g.nodes[i], i + 1
                if known < len(g.nodes):
                    members.update(id(n) for n in g.nodes[known:])
                    known = len(g.nodes)
                if not _is_transpose(node):
                    continue
                n = _cancel(node, g, outs, members)
                if n:
                    res.count("cancelled", n)
                    res.changed = moved = True
                if not node.outputs:
                    continue
                if split and _split(node, g, outs, members, ctx):
                    res.count("split")
                    res.changed = moved = True
                    budget -= 1
                    members.update(id(n) for n in g.nodes[known:])
                    known = len(g.nodes)
                reason = _sink(node, g, outs, ctx, members)
                if reason is None:
                    res.count("moved")
                    res.changed = moved = True
                    budget -= 1
                elif reason:
                    skips.append(reason)
        for reason in skips:   # where the Transposes stopped, once each
            res.skip(reason)


def _takes_transpose(e: gs.Node) -> bool:
    """Could a Transpose move past (or cancel at) reader ``e``?"""
    return e.domain in (None, "", "ai.onnx") and (
        _is_transpose(e) or (len(e.outputs) == 1 and (
            e.op in SAME_SHAPE_OPS or e.op in BROADCAST_OPS or e.op in LAYOUT or e.op in REDUCE)))


def _readers(y: gs.Tensor) -> list:
    """The distinct nodes reading ``y`` (Mul(y, y) reads it twice: one reader)."""
    return list({id(e): e for e in y.outputs}.values())


def _readers_take_it(t: gs.Node, outs: set[int], members: set[int]) -> bool:
    y = t.outputs[0]
    readers = _readers(y)
    return (len(readers) > 1 and id(y) not in outs
            and all(id(e) in members and _takes_transpose(e) for e in readers))


def _splittable(graph: gs.Graph) -> bool:
    for g in iter_graphs(graph):
        outs, members = {id(t) for t in g.outputs}, {id(n) for n in g.nodes}
        if any(_is_transpose(n) and _readers_take_it(n, outs, members) for n in g.nodes):
            return True
    return False


def _split(t: gs.Node, g: gs.Graph, outs: set[int], members: set[int], ctx: Context) -> bool:
    """One copy of ``t`` per reader after the first, when every reader could take it."""
    if not _readers_take_it(t, outs, members):
        return False
    y = t.outputs[0]
    for e in _readers(y)[1:]:
        z = gs.Variable(ctx.namer(f"{y.name}_split"), dtype=y.dtype, shape=y.shape)
        for i, inp in enumerate(e.inputs):
            if inp is y:
                e.inputs[i] = z
        g.nodes.append(gs.Node("Transpose", name=ctx.namer(f"{t.name}_split"),
                               attrs=dict(t.attrs), inputs=[t.inputs[0]], outputs=[z]))
    return True


def _node_count(graph: gs.Graph) -> int:
    graph.cleanup()
    return sum(len(g.nodes) for g in iter_graphs(graph))


def _is_transpose(node: gs.Node) -> bool:
    return (node.op == "Transpose" and node.domain in (None, "", "ai.onnx") and bool(node.outputs)
            and node.attrs.get("perm") is not None and len(node.inputs) == 1)


def _perm(node: gs.Node) -> list[int]:
    return [int(p) for p in node.attrs["perm"]]


def _cancel(t: gs.Node, g: gs.Graph, outs: set[int], members: set[int]) -> int:
    """Readers of ``t`` in its graph that are Transposes undoing it read ``t``'s input
    instead."""
    y, x, p = t.outputs[0], t.inputs[0], _perm(t)
    n = 0
    for reader in list(y.outputs):
        if not _is_transpose(reader) or reader.inputs[0] is not y or id(reader) not in members:
            continue
        q = _perm(reader)
        if len(q) != len(p) or [p[i] for i in q] != list(range(len(p))):
            continue
        reader.inputs[0] = x
        if not y.outputs and id(y) not in outs:   # t is dead: gone first, so that x's
            t.inputs.clear()                      # producer can write a graph output
            t.outputs.clear()
        if bypass(reader, g, outs) is not None:   # its output is a graph output by name
            reader.op, reader.attrs = "Identity", {}
        n += 1
        if not t.outputs:
            break
    return n


def _sink(t: gs.Node, g: gs.Graph, outs: set[int], ctx: Context, members: set[int]
          ) -> str | None:
    """Move ``t`` past the one node that reads it, in its graph (a body reading ``t``'s
    output from outside reads it through the same tensor, which would be left without a
    producer). None if moved, a skip reason, or "" when the pattern does not apply."""
    y, p = t.outputs[0], _perm(t)
    if id(y) in outs or len(_readers(y)) != 1 or id(y.outputs[0]) not in members:
        return ""
    e = y.outputs[0]
    if e.domain not in (None, "", "ai.onnx") or len(e.outputs) != 1 or (
            e.op not in SAME_SHAPE_OPS and e.op not in BROADCAST_OPS and e.op not in LAYOUT
            and e.op not in REDUCE and e.op != "Reshape"):
        return ""
    if e.op == "Reshape":
        return _sink_reshape(t, e, p, g, ctx)
    r = len(p)
    inv = [0] * r
    for i, a in enumerate(p):
        inv[a] = i
    if e.op in LAYOUT or e.op in REDUCE:
        return _sink_layout(t, e, p, g, ctx)
    new_inputs = []
    for inp in e.inputs:
        if inp is y:
            new_inputs.append(t.inputs[0])
        elif inp.name == "":
            new_inputs.append(inp)
        elif isinstance(inp, gs.Constant):
            shape = list(inp.shape)   # before reading: a big weight stays on disk
            if len(shape) > r:
                return "constant-rank"
            size = np.prod(shape, dtype=float)
            sole = len(_readers(inp)) == 1 and id(inp) not in outs   # replaced, not copied
            if size > MAX_LAID_ELEMS and not (
                    sole and size * np.dtype(inp.dtype).itemsize <= ctx.options.fold_max_bytes):
                return "constant-too-large"   # a copy: vectors, not weights a reader shares
            v = np.asarray(inp.values)
            if v.size == 1 and v.ndim <= 1:
                new_inputs.append(inp)
                continue
            laid = v.reshape([1] * (r - v.ndim) + list(v.shape)).transpose(inv)
            new_inputs.append(gs.Constant(ctx.namer(f"{inp.name}_t"),
                                          np.ascontiguousarray(laid)))
        elif (inp.inputs and _is_transpose(inp.inputs[0]) and _perm(inp.inputs[0]) == p
              and id(inp) not in outs):
            new_inputs.append(inp.inputs[0].inputs[0])
        else:
            return "other-input-not-transposed"
    _place(t, e, new_inputs, p, g, ctx)
    return None


def _place(t: gs.Node, e: gs.Node, new_inputs: list, perm: list[int], g: gs.Graph,
           ctx: Context) -> None:
    """``e`` reads ``new_inputs`` and writes a new tensor, which a Transpose(``perm``)
    named after ``t`` turns into ``e``'s old output (its name and readers kept)."""
    z = e.outputs[0]
    inv = [0] * len(perm)
    for i, a in enumerate(perm):
        inv[a] = i
    before = gs.Variable(ctx.namer(f"{z.name}_pre"), dtype=z.dtype,
                         shape=None if z.shape is None or len(z.shape) != len(perm)
                         else [z.shape[a] for a in inv])
    while e.inputs:
        e.inputs.pop()
    e.inputs.extend(new_inputs)
    e.outputs[0] = before
    g.nodes.append(gs.Node("Transpose", name=ctx.namer(f"{t.name}_sunk"),
                           attrs={"perm": perm}, inputs=[before], outputs=[z]))


def _sink_layout(t: gs.Node, e: gs.Node, p: list[int], g: gs.Graph, ctx: Context
                 ) -> str | None:
    """Move ``t`` (perm ``p``) past ``e``, a Squeeze, Unsqueeze or Pad, as onnxruntime's
    transpose optimizer does:

    * Squeeze(Transpose(x, p), A) = Transpose(Squeeze(x, p[A]), p'), p' the rest of p
      renumbered;
    * Unsqueeze(Transpose(x, p), A) = Transpose(Unsqueeze(x, A), q), q keeping the new
      axes in place and mapping the others as p does (madmom's Conv -> Transpose ->
      Squeeze -> Mul/Add/Elu -> Pad -> Unsqueeze -> Transpose then cancels);
    * Pad(Transpose(x, p), pads) = Transpose(Pad(x, pads'), p), each axis' pads moved to
      the axis it comes from."""
    r = len(p)
    if e.op == "Pad":
        pads = const_ints(e, 1, "pads")
        if pads is None or len(pads) != 2 * r or (len(e.inputs) > 3 and e.inputs[3].name):
            return "pad-not-constant"
        laid = [0] * (2 * r)
        for j in range(r):
            laid[p[j]], laid[r + p[j]] = pads[j], pads[r + j]
        after = p
        new_attrs = dict(e.attrs)
        if len(e.inputs) > 1 and e.inputs[1].name:
            new_in = [t.inputs[0], gs.Constant(ctx.namer(f"{e.inputs[1].name}_t"),
                                               np.array(laid, np.int64))] + list(e.inputs[2:])
        else:
            new_in, new_attrs["pads"] = [t.inputs[0]], laid
    else:
        axes = const_ints(e, 1, "axes")
        computed = axes is None and len(e.inputs) > 1 and e.inputs[1].name
        if e.op in REDUCE and not axes and not computed:
            return "reduce-over-all-axes"   # no axes: all of them, or none (noop_with_empty_axes)
        rank = r + len(axes or []) if e.op == "Unsqueeze" else r
        if axes is None or any(not -rank <= a < rank for a in axes):
            return "axes-not-constant"
        axes = sorted({a % rank for a in axes})
        if e.op in REDUCE and int(e.attrs.get("keepdims", 1)):
            after, new_axes = p, sorted(p[a] for a in axes)
        elif e.op == "Squeeze" or e.op in REDUCE:
            gone = {p[a] for a in axes}
            keep = sorted(set(range(r)) - gone)
            after = [keep.index(p[j]) for j in range(r) if j not in axes]
            new_axes = sorted(gone)
        else:
            rest = [j for j in range(rank) if j not in axes]
            after = [j if j in axes else rest[p[rest.index(j)]] for j in range(rank)]
            new_axes = axes
        new_attrs = {k: v for k, v in e.attrs.items() if k != "axes"}
        if len(e.inputs) > 1 and e.inputs[1].name:
            new_in = [t.inputs[0], gs.Constant(ctx.namer(f"{e.inputs[1].name}_t"),
                                               np.array(new_axes, np.int64))]
        else:
            new_in, new_attrs["axes"] = [t.inputs[0]], new_axes
    e.attrs = new_attrs
    if not after:
        # A reduction over every axis without keepdims (a scalar): nothing is left to
        # permute, and a perm of [] is no attribute at all: the op reads the input.
        while e.inputs:
            e.inputs.pop()
        e.inputs.extend(new_in)
        return None
    _place(t, e, new_in, after, g, ctx)
    return None


def _sink_reshape(t: gs.Node, e: gs.Node, p: list[int], g: gs.Graph, ctx: Context
                  ) -> str | None:
    """Move ``t`` (perm ``p``) past ``e``, a Reshape that keeps the static dims at both ends
    and splits or merges only the dims between, when those come from consecutive dims of
    ``t``'s input in order: the Reshape then acts on the input, and a Transpose of the
    groups follows. TorchScript's multi-head attention, [197, 12N, 64] -> Transpose(1, 0, 2)
    -> Reshape([-1, 12, 197, 64]), is Reshape([197, -1, 12, 64]) -> Transpose(1, 2, 0, 3):
    the Reshape then merges with the one before it, the Transpose with the next one (the
    dynamo export's form for the keys). "" when the pattern does not apply."""
    x, y, z = t.inputs[0], t.outputs[0], e.outputs[0]
    s = const_ints(e, 1, "shape")
    if s is None or len(e.inputs) < 2 or y.shape is None or z.shape is None \
            or len(z.shape) != len(s) or len(y.shape) != len(p) or 0 in s:
        return ""
    src, dst = list(y.shape), list(z.shape)

    def same(a, b):
        return isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)) \
            and a == b and a > 0

    a = 0
    while a < min(len(src), len(dst)) and same(src[a], dst[a]):
        a += 1
    b = 0
    while b < min(len(src), len(dst)) - a and same(src[-1 - b], dst[-1 - b]):
        b += 1
    mid_src, n_dst = list(range(a, len(src) - b)), len(dst) - a - b
    if not mid_src or not n_dst or any(p[j + 1] != p[j] + 1 for j in mid_src[:-1]):
        return ""
    first, where = p[mid_src[0]], {k: j for j, k in enumerate(p)}
    shape, start = [], {}
    for k in range(len(p)):            # the input's dims in order, the group once
        if k == first:
            start[k] = len(shape)
            shape += s[a:a + n_dst]
        elif not first < k < first + len(mid_src):
            start[k] = len(shape)
            shape.append(int(src[where[k]]))
    perm = []
    for j in range(len(src)):          # the output's order: the group where it was
        if j == a:
            perm += range(start[first], start[first] + n_dst)
        elif j not in mid_src:
            perm.append(start[p[j]])
    new_in = [x, gs.Constant(ctx.namer(f"{e.inputs[1].name}_t"), np.array(shape, np.int64))]
    _place(t, e, new_in, perm, g, ctx)
    return None
