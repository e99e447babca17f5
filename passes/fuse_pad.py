"""fuse-pad: a zero Pad in front of convolutions and average pools becomes their padding.

Before -> after::

    x -> Pad(0, [0,0,1,1, 0,0,1,1]) -> Conv(pads=[0,0,0,0]) -> y    =>  x -> Conv(pads=[1,1,1,1])
    x -> Pad(0, ...) -> AveragePool(count_include_pad=0)          =>  x -> AveragePool(pads,
                                                                           count_include_pad=1)

Exporters write an explicit Pad for TensorFlow-style "SAME" padding and for asymmetric
padding. Folding it into the op's own ``pads`` saves the node and a copy of the activation,
and sidesteps MIGraphX's eliminate_pad pass (src/eliminate_pad.cpp), which replaces a conv's
padding with the Pad's and drops pads on the channel axis (shared/migraphx/PROFILE.md).

Preconditions (else skipped with a reason):

* mode "constant" with value 0 (or no value); pads and axes are constants; no padding on
  the batch or channel axes; no negative pads (a crop is not padding) - skip:pad-form;
* every reader of the Pad's output is a Conv, or an AveragePool with ceil_mode 0 whose own
  pads are 0 or already count padding (count_include_pad=1); none has auto_pad set; the
  output is not a graph output - skip:readers.
A zero padded before an average pool counts in the mean, which is exactly
``count_include_pad=1``. MaxPool pads with -inf, not 0: it is never fused.
If/Loop/Scan bodies are processed too.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class FusePad(Pass):
    name = "fuse-pad"
    phase = Phase.FUSE
    numerics = Numerics.CLOSE     # the same sums; a backend may order them differently
    summary = "fold a zero Pad into the pads of the Conv/AveragePool after it"

    shape_ops = ("Pad",)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            for node in list(g.nodes):
                if node.op != "Pad" or node.domain not in (None, "", "ai.onnx") or not node.outputs:
                    continue
                res.outcome(_fuse(node, outs, g.opset), "fused")
        return res


def _const(node, i):
    if len(node.inputs) > i and node.inputs[i].name:
        t = node.inputs[i]
        return np.asarray(t.values).ravel() if isinstance(t, gs.Constant) else False
    return None


def _spatial_pads(pad: gs.Node, opset: int) -> list[int] | None:
    """[x1_begin, .., xk_begin, x1_end, .., xk_end] over the spatial axes, or None."""
    x = pad.inputs[0]
    if pad.attrs.get("mode", "constant") != "constant":
        return None
    if opset < 11:
        pads, value, axes = pad.attrs.get("pads"), pad.attrs.get("value", 0.0), None
    else:
        pads, value, axes = _const(pad, 1), _const(pad, 2), _const(pad, 3)
    if pads is None or pads is False or value is False or axes is False:
        return None
    if value is not None and np.size(value) and float(np.ravel(value)[0]) != 0.0:
        return None
    pads = [int(p) for p in np.ravel(pads)]
    rank = len(x.shape) if x.shape is not None else (len(pads) // 2 if axes is None else None)
    if rank is None or rank < 3:
        return None
    full = [0] * (2 * rank)
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    if len(pads) != 2 * len(axes):
        return None
    for k, a in enumerate(axes):
        full[a], full[a + rank] = pads[k], pads[k + len(axes)]
    if any(p < 0 for p in full) or full[0] or full[1] or full[rank] or full[rank + 1]:
        return None
    return full[2:rank] + full[rank + 2:]


def _fuse(pad: gs.Node, outs: set[int], opset: int) -> str | None:
    sp = _spatial_pads(pad, opset)
    if sp is None:
        return "pad-form"
    y = pad.outputs[0]
    if id(y) in outs or not y.outputs:
        return "readers"
    k = len(sp) // 2
    for r in y.outputs:
        if r.inputs[0] is not y or any(t is y for t in r.inputs[1:]):
            return "readers"
        if r.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
            return "readers"
        if len(r.attrs.get("pads", [0] * (2 * k))) != 2 * k:
            return "readers"
        if r.op == "Conv":
            continue
        if r.op == "AveragePool" and not int(r.attrs.get("ceil_mode", 0)) and (
                int(r.attrs.get("count_include_pad", 0)) or not any(r.attrs.get("pads", []))):
            continue
        return "readers"
    for r in list(y.outputs):
        old = list(r.attrs.get("pads", [0] * (2 * k)))
        r.attrs["pads"] = [a + b for a, b in zip(old, sp)]
        if r.op == "AveragePool":
            r.attrs["count_include_pad"] = 1
        r.inputs[0] = pad.inputs[0]
    return None
