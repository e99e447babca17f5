"""resize-inputs: a Resize's computed data input written by a Reshape to its own shape, for
MIGraphX 2.15; exact (a Reshape to the same shape moves no value).

MIGraphX 2.15 (ROCm 7.2.4) computes a Resize that reads a strided view as if the view were
standard: its parser derives the gather indices from the input's strides
(src/onnx/parse_resize.cpp, calc_neighbor_points; fixed after 2.15 by "Fix bug in
parse_resize with nonstandard input shapes", #4444). Measured on 2.15 `ref`, x NHWC ->
Transpose to NCHW (-> Relu) -> Resize, N(0, 1) values: max |error| 2.4-6.3 in every mode
tried (linear and nearest; half_pixel, asymmetric, align_corners; scales or sizes), no
error raised; 2.16 right. tf2onnx's BlazeFace (full range: an NHWC input transposed once,
three 2x linear upsamplings further down) came out at cosine 0.85. Other ops given the same
view (Pad, pools, Conv, ConvTranspose, Gather, Slice, Reshape, Softmax, reductions,
InstanceNormalization, Tile, Concat ...) were right. MIGraphX parses a Reshape of a view as
a copy into standard strides, so::

    Resize(x, roi, scales)  =>  Resize(Reshape(x, shape(x)), roi, scales)

Which producers give a view is MIGraphX's business (a Transpose, and the elementwise ops
and convolutions after one keep its layout), so every data input a node computes gets the
Reshape, as scan-states does for a Scan's states (on a standard tensor MIGraphX's reshape
is free). None for a graph input, a constant, or an input a Reshape already computes, also
through Casts (convert-fp16 puts one there when the Resize is FP16; a Cast keeps the
layout): idempotent, and collapse-chains leaves these Reshapes alone. One Reshape per
tensor, shared by the Resizes that read it. The shape is a constant where it is static,
else the input's own Shape. Nothing when the target is 2.16 or later
(``--migraphx-version``, or the installed build): each Resize is a
``skip:fixed-in-target-version``. In the default pipeline only when MIGraphX is the target,
after every pass that could drop the Reshapes.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, shape_of
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class ResizeInputs(Pass):
    name = "resize-inputs"
    phase = Phase.LAYOUT
    numerics = Numerics.EXACT
    summary = ("a Resize's computed data input through a Reshape to its own shape (MIGraphX "
               "2.15 reads a strided view as standard: wrong values)")

    shape_ops = ("Resize",)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        version = ctx.options.migraphx_version
        fixed = version is not None and tuple(version[:2]) >= (2, 16)
        for g in iter_graphs(graph):
            standard: dict[int, gs.Tensor] = {}     # one Reshape per tensor in this graph
            for node in list(g.nodes):
                if node.op != "Resize" or node.domain not in (None, "", "ai.onnx") \
                        or not node.inputs:
                    continue
                if fixed:
                    res.skip("fixed-in-target-version")
                    continue
                res.outcome(_reshape_input(node, g, standard, ctx.namer), "reshaped-inputs")
        return res


def _reshape_input(node: gs.Node, g: gs.Graph, standard: dict, namer) -> str | None:
    """The Resize's data input read through a Reshape to its own shape (PassResult.outcome:
    None when done, else a skip reason)."""
    x = node.inputs[0]
    if isinstance(x, gs.Constant) or not x.inputs:
        return "input-not-computed"          # a graph input, an initializer or outer value
    p = x.inputs[0]
    while p.op == "Cast" and p.inputs and p.inputs[0].inputs:   # convert-fp16's, after us:
        p = p.inputs[0].inputs[0]                                 # a Cast keeps the layout
    if p.op == "Reshape":
        return "input-already-reshaped"
    if x.shape is None:
        return "input-rank-unknown"
    if id(x) not in standard:
        y = gs.Variable(namer(f"{x.name}_standard"), dtype=x.dtype, shape=x.shape)
        g.nodes.append(gs.Node("Reshape", namer(f"{x.name}_Standard"),
                               inputs=[x, shape_of(x, g, namer)], outputs=[y]))
        standard[id(x)] = y
    node.inputs[0] = standard[id(x)]
    return None
