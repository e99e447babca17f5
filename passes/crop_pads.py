"""crop-pads: a Pad's negative pads (a crop) written as a Slice in front of it; exact (the
same elements, moved, in onnxruntime's order: crop, then pad).

MIGraphX 2.15 (ROCm 7.2.4) mishandles negative pads in every mode (measured, `ref`,
src/onnx/parse_pad.cpp at rocm-7.2.4):

* edge: the parser writes an edge pad as a Concat of the input with ``rcount`` copies of its
  last slice, counting them in a ``size_t`` (line 160): a negative end pad converts to
  2^64 - 1 and the parse pushes instructions until std::bad_alloc (70-200 s and all the
  memory there is: onnx-asr's Kaldi and WeSpeaker front-ends, whose pre-emphasis is
  ``Pad(x, [0, 1, 0, -1], mode="edge")``, x[t-1] with the first sample repeated). A
  negative begin pad counts in an ``int64_t`` (line 147): no copies, the crop is dropped,
  and the output is silently one element longer per crop;
* reflect: ``std::vector<int>(lcount)`` with a negative count (lines 85-86): "cannot create
  std::vector larger than max_size()";
* constant: the ``pad`` op takes the negative pads and compiling or running it aborts the
  process ("free(): invalid size").

2.16 (develop since #4481) parses every mode as one ``pad`` op that crops right. So::

    y = Pad(x, [0, 1, 0, -1], mode)   =>   c = Slice(x, starts=[0], ends=[-1], axes=[1])
                                           y = Pad(c, [0, 1, 0, 0], mode)

and a Pad whose pads are all <= 0 becomes the Slice alone. onnxruntime crops first (a
reflect pad wider than what the crop leaves is refused there), which is also what makes the
rewrite exact for edge and reflect: the pad reads the cropped tensor. The Pad's ``axes``
(opset 18) name the axes the pads are for; the Slice gets the same ones. Skipped: pads or
axes computed at run time (MIGraphX needs them constant anyway) - skip:pads-not-constant;
a crop wider than its axis (onnxruntime then pads as if from a tensor of negative length,
dim + begin + end) - skip:crop-past-axis, where the axis is static: a symbolic one is
rewritten, on the assumption that the crop fits.
A Pad's constant ``axes`` are then written out as pads over every axis (0 on the others),
where the input's rank is known: 2.15 and 2.16 refuse an edge or reflect Pad with axes
("number of elements of pads should be equal to 2 * input rank").
In the default pipeline only when MIGraphX is the target; If/Loop/Scan bodies too.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import const_ints, iter_graphs, own_constant
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

_END = np.iinfo(np.int64).max


class CropPads(Pass):
    name = "crop-pads"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = ("a Pad's negative pads written as a Slice before it (MIGraphX 2.15 runs out "
               "of memory parsing an edge Pad that crops, and gets other modes wrong), its "
               "axes as pads over every axis (an edge/reflect Pad with axes is refused)")

    shape_ops = ("Pad",)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.op == "Pad" and node.domain in (None, "", "ai.onnx") and node.outputs:
                    shape = node.inputs[0].shape          # the cropped tensor has none
                    res.outcome(_crop(node, g, ctx.namer), "cropped")
                    if node.outputs and _axes_written_out(node, shape, ctx.namer):
                        res.count("axes-written-out")
                        res.changed = True
        return res


def _axes_written_out(pad: gs.Node, shape, namer) -> bool:
    """A Pad's constant ``axes`` (opset 18) written out as pads over every axis, 0 on the
    others: MIGraphX 2.15 and 2.16 refuse an edge or reflect Pad with axes ("number of
    elements of pads should be equal to 2 * input rank", measured on both `ref` builds).
    Needs the input's rank (``shape``, the Pad input's before any crop)."""
    if len(pad.inputs) < 4 or not pad.inputs[3].name:
        return False
    pads, axes = const_ints(pad, 1, "pads"), const_ints(pad, 3, "axes")
    if pads is None or axes is None or shape is None or 2 * len(axes) != len(pads):
        return False
    r, k = len(shape), len(axes)
    if any(not -r <= a < r for a in axes) or len({a % r for a in axes}) != k:
        return False
    full = [0] * (2 * r)
    for i, a in enumerate(axes):
        full[a % r], full[a % r + r] = pads[i], pads[i + k]
    own_constant(pad, 1, np.array(full, np.int64), namer, "all_axes")
    pad.inputs.pop()                                  # the axes
    while len(pad.inputs) > 2 and not pad.inputs[-1].name:
        pad.inputs.pop()
    return True


def _crop(pad: gs.Node, g: gs.Graph, namer) -> str | None:
    pads = const_ints(pad, 1, "pads")
    axes = const_ints(pad, 3, "axes")
    if pads is None or (axes is None and len(pad.inputs) > 3 and pad.inputs[3].name):
        return "pads-not-constant"
    if not any(p < 0 for p in pads):
        return ""
    k = len(pads) // 2
    axes = list(range(k)) if axes is None else axes
    if len(axes) != k or 2 * k != len(pads):
        return "pads-not-constant"          # malformed: left for the checker to name
    cut = [i for i in range(k) if pads[i] < 0 or pads[i + k] < 0]
    x = pad.inputs[0]
    for i in cut:
        dim = x.shape[axes[i]] if x.shape is not None and -len(x.shape) <= axes[i] < len(
            x.shape) else None
        if isinstance(dim, int) and -min(pads[i], 0) - min(pads[i + k], 0) > dim:
            return "crop-past-axis"
    starts = [max(-pads[i], 0) for i in cut]
    ends = [pads[i + k] if pads[i + k] < 0 else _END for i in cut]
    y = gs.Variable(namer(f"{x.name}_cropped"), dtype=x.dtype)
    kept = [max(p, 0) for p in pads]
    name = namer(f"{x.name}_Crop")
    if not any(kept):                        # the Slice alone computes the Pad's output
        y, name = pad.outputs[0], pad.name or name
        pad.outputs.clear()
        pad.inputs.clear()
    g.nodes.append(_slice(x, y, starts, ends, [axes[i] for i in cut], g.opset, name, namer))
    if any(kept):
        pad.inputs[0] = y
        if "pads" in pad.attrs:
            pad.attrs["pads"] = kept
        else:
            own_constant(pad, 1, np.array(kept, np.int64), namer, "cropped")
    return None


def _slice(x, y, starts, ends, axes, opset: int, name: str, namer) -> gs.Node:
    """Slice(x) -> y along ``axes``: inputs from opset 10, attributes before."""
    if (opset or 0) < 10:
        return gs.Node("Slice", name, attrs={"starts": starts, "ends": ends, "axes": axes},
                       inputs=[x], outputs=[y])
    ints = [gs.Constant(namer(f"{x.name}_crop_{n}"), np.array(v, np.int64))
            for n, v in (("starts", starts), ("ends", ends), ("axes", axes))]
    return gs.Node("Slice", name, inputs=[x, *ints], outputs=[y])
