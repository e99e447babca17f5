"""fuse-space-to-depth: the "Focus" stem (b*b strided Slices + Concat) becomes SpaceToDepth.

Before -> after (b = 2)::

    x -> Slice(x[..., 0::2, 0::2]) \\
    x -> Slice(x[..., 1::2, 0::2])  >- Concat(axis=1) -> Conv(W)   =>  x -> SpaceToDepth(2)
    x -> Slice(x[..., 0::2, 1::2])  |                                     -> Conv(W[:, perm])
    x -> Slice(x[..., 1::2, 1::2]) /

YOLOv5-style detectors start this way. SpaceToDepth puts block (i, j) of channel c at
output channel (i*b + j)*C + c; the Concat's order is any permutation of the blocks, so the
Concat's channel k*C + c is SpaceToDepth's channel (i_k*b + j_k)*C + c. When every reader
of the Concat is a Conv with a constant weight, the weight's input channels are permuted
to match (a copy when the weight is shared with another conv); otherwise a Gather on axis
1 restores the order (the form onnxruntime writes).

Preconditions (else the stem stays):

* exactly b*b Slices of one 4-D tensor, each on axes (2, 3) only, steps (b, b), starts
  (i, j) with every 0 <= i, j < b present once, ends past the end;
* the Concat is on axis 1, reads exactly those Slices, and is not a graph output.
The Concat of the slices only works when H and W are multiples of b (otherwise the slices
differ in size and the original model fails), so SpaceToDepth's divisibility requirement
holds wherever the original runs. The Conv sums its input channels in another order:
equal to rounding (Numerics.CLOSE).
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, own_constant
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class FuseSpaceToDepth(Pass):
    name = "fuse-space-to-depth"
    phase = Phase.FUSE
    numerics = Numerics.CLOSE
    summary = "strided-Slice + Concat 'Focus' stems -> SpaceToDepth (conv weight permuted)"

    def needs_shapes(self, model) -> bool:
        return any(n.op_type == "Concat" for n in model.graph.node) and any(
            n.op_type == "Slice" for n in model.graph.node)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            for node in list(g.nodes):
                if node.op != "Concat" or not node.outputs or g.opset < 10:
                    continue
                found = _match(node, outs)
                if found is None:
                    continue
                b, blocks = found
                _rewrite(node, g, b, blocks, ctx.namer)
                res.count("fused")
                res.changed = True
        return res


def _ints(t):
    if t is None or not isinstance(t, gs.Constant):
        return None
    try:
        return [int(v) for v in np.ravel(t.values)]
    except Exception:  # noqa: BLE001
        return None


def _match(concat: gs.Node, outs: set[int]):
    if int(concat.attrs.get("axis", 0)) not in (1, -3) or id(concat.outputs[0]) in outs:
        return None
    slices = concat.inputs
    b = int(round(len(slices) ** 0.5))
    if b < 2 or b * b != len(slices):
        return None
    x, blocks = None, []
    for t in slices:
        if len(t.inputs) != 1 or t.inputs[0].op != "Slice" or len(t.outputs) != 1:
            return None
        s = t.inputs[0]
        if x is None:
            x = s.inputs[0]
        if s.inputs[0] is not x or len(s.inputs) < 5:
            return None
        starts, ends, axes, steps = (_ints(s.inputs[i]) for i in range(1, 5))
        if None in (starts, ends, axes, steps) or len(axes) != 2:
            return None
        if x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[1], int):
            return None
        order = [a % 4 for a in axes]
        if sorted(order) != [2, 3] or steps != [b, b]:
            return None
        start = dict(zip(order, starts))
        end = dict(zip(order, ends))
        if any(end[a] < (1 << 31) - 1 and not (isinstance(x.shape[a], int) and end[a] >= x.shape[a])
               for a in (2, 3)):
            return None
        i, j = start[2], start[3]
        if not (0 <= i < b and 0 <= j < b):
            return None
        blocks.append((i, j))
    if len(set(blocks)) != b * b:
        return None
    return b, blocks


def _rewrite(concat: gs.Node, g: gs.Graph, b: int, blocks, namer) -> None:
    x = concat.inputs[0].inputs[0].inputs[0]
    c = int(x.shape[1])
    y = concat.outputs[0]
    readers = list(y.outputs)
    convs_ok = bool(readers) and all(
        r.op == "Conv" and r.inputs[0] is y and isinstance(r.inputs[1], gs.Constant)
        and int(r.attrs.get("group", 1)) == 1 and all(t is not y for t in r.inputs[1:])
        for r in readers)
    # Concat channel k*C + ch  ==  SpaceToDepth channel (i_k*b + j_k)*C + ch
    idx = np.array([(i * b + j) * c + ch for (i, j) in blocks for ch in range(c)], np.int64)
    concat.op, concat.attrs = "SpaceToDepth", {"blocksize": b}
    concat.inputs.clear()
    concat.inputs.append(x)
    if convs_ok:
        for r in readers:
            w = np.asarray(r.inputs[1].values)
            new = np.empty_like(w)
            new[:, idx] = w
            own_constant(r, 1, new, namer, "s2d")
        return
    s2d = gs.Variable(namer(f"{y.name}_space_to_depth"), dtype=y.dtype, shape=None)
    concat.outputs[0] = s2d
    g.nodes.append(gs.Node("Gather", name=namer(f"{concat.name or y.name}_order"),
                           attrs={"axis": 1},
                           inputs=[s2d, gs.Constant(namer(f"{y.name}_s2d_order"), idx)],
                           outputs=[y]))
