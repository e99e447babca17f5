"""default-attributes: attributes an older MIGraphX parser refuses although they only state
their default value, dropped; exact (the op reads the same default without them).

PyTorch's dynamo exporter (torch.onnx.export(..., dynamo=True), opset 18+) writes every
Resize (F.interpolate: SegFormer's decode head, FPNs, U-Nets) with
``keep_aspect_ratio_policy="stretch"``, the default. MIGraphX 2.15 (ROCm 7.2.4) throws
"PARSE_RESIZE: keep_aspect_ratio_policy is not supported!" on the attribute's mere presence
when the Resize reads ``sizes`` (src/onnx/parse_resize.cpp), whatever its value; 2.16
accepts "stretch". Before -> after::

    Resize <keep_aspect_ratio_policy = "stretch"> (x, roi, scales, sizes)
        =>  Resize (x, roi, scales, sizes)

Any other policy (not_larger, not_smaller) changes the output size and stays; the static
check reports it.

A ConvTranspose's ``output_padding`` next to nonzero pads: MIGraphX 2.15 and 2.16 (ref)
compute the right shape with wrong values (torch's ConvTranspose2d(k=3, s=2, p=1,
output_padding=1), DeepFilterNet3's decoder: cosine 0.98). output_padding only uncovers
output positions that the end pad would have cropped, so where it is at most the end pad
it moves into it, exactly (onnxruntime: bit-identical, 1-3-d, groups, dilations)::

    ConvTranspose <pads = [0, 1, 0, 1], output_padding = [0, 1]> (x, w)
        =>  ConvTranspose <pads = [0, 1, 0, 0]> (x, w)

An output_padding past the end pad (zeros beyond the full output), an ``output_shape``
or an ``auto_pad`` stays, with a reason.

A Softplus: MIGraphX 2.15 and 2.16 (ref) compute it as log(1 + exp(x)), inf from x = 89 on
(onnxruntime: x), without an error; TorchScript writes torch's softplus so (a Mamba's time
steps), the dynamo exporter with torch's threshold. Past 20 a float32, float16 or bfloat16
Softplus is x (log1p(exp(-20)) = 2e-9, under half an ulp of 20), so that guard is exact::

    Softplus (x)  =>  Where (Greater (x, 20), x, Softplus (x))

A Softplus whose only reader is already such a Where (x past a threshold of at most 88, x,
Softplus(x)) stays, and so does a float64 one. In the default pipeline only when MIGraphX
is the target.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

# (op, attribute, its default per the ONNX schema)
DEFAULTS = [("Resize", "keep_aspect_ratio_policy", "stretch")]
# torch's softplus threshold; MIGraphX's log(1 + exp(x)) is finite in float32 up to 88
SOFTPLUS_LINEAR_FROM, SOFTPLUS_FINITE_TO = 20.0, 88.0


class DefaultAttributes(Pass):
    name = "default-attributes"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = ("attributes MIGraphX 2.15 refuses that only state their default "
               "(Resize keep_aspect_ratio_policy=stretch) dropped; a ConvTranspose's "
               "output_padding (MIGraphX gets it wrong next to pads) moved into its end pads; "
               "Softplus guarded past 20 (inf on MIGraphX from 89)")
    shape_ops = ("Softplus",)   # attributes, and a Softplus input's type

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in g.nodes:
                if node.op == "ConvTranspose" and node.domain in (None, "", "ai.onnx"):
                    fold_output_padding(node, res)
                if node.op == "Softplus" and node.domain in (None, "", "ai.onnx"):
                    guard_softplus(node, g, ctx, res)
                for op, attr, default in DEFAULTS:
                    if node.op != op or node.domain not in (None, "", "ai.onnx") \
                            or attr not in node.attrs:
                        continue
                    value = node.attrs[attr]
                    if isinstance(value, bytes):
                        value = value.decode()
                    if value == default:
                        del node.attrs[attr]
                        res.outcome(None, f"dropped-{attr.replace('_', '-')}")
                    else:
                        res.skip(f"{attr.replace('_', '-')}-{value}")
        return res


def fold_output_padding(node: gs.Node, res: PassResult) -> None:
    """A ConvTranspose's output_padding moved into its end pads, where that is exact."""
    opad = [int(v) for v in node.attrs.get("output_padding", [])]
    if not any(opad):
        return
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if "output_shape" in node.attrs or auto_pad != "NOTSET":
        res.skip("output-padding-with-output-shape-or-auto-pad")
        return
    pads = [int(v) for v in node.attrs.get("pads", [0] * (2 * len(opad)))]
    if len(pads) != 2 * len(opad):
        res.skip("output-padding-rank-unclear")
        return
    if not any(pads):
        return   # MIGraphX computes output_padding right without pads (measured)
    ends = pads[len(opad):]
    if any(o > e for o, e in zip(opad, ends)):
        res.skip("output-padding-past-end-pad")
        return
    node.attrs["pads"] = pads[:len(opad)] + [e - o for e, o in zip(ends, opad)]
    del node.attrs["output_padding"]
    res.outcome(None, "output-padding-to-pads")


def _guarded(node: gs.Node) -> bool:
    """Is the Softplus read only by Where(Greater(x, t <= 88), x, it)?"""
    x, y = node.inputs[0], node.outputs[0]
    if len(y.outputs) != 1:
        return False
    w = y.outputs[0]
    if w.op != "Where" or len(w.inputs) != 3 or w.inputs[1] is not x or w.inputs[2] is not y:
        return False
    c = w.inputs[0].inputs[0] if len(w.inputs[0].inputs) == 1 else None
    if c is None or c.op != "Greater" or c.inputs[0] is not x:
        return False
    t = c.inputs[1]
    if not isinstance(t, gs.Constant):   # a Constant node: this pass runs before folding
        k = t.inputs[0] if len(t.inputs) == 1 else None
        t = k.attrs.get("value") if k is not None and k.op == "Constant" else None
    t = np.asarray(t.values) if isinstance(t, gs.Constant) else None
    return t is not None and t.size == 1 and float(t.ravel()[0]) <= SOFTPLUS_FINITE_TO


def guard_softplus(node: gs.Node, g: gs.Graph, ctx: Context, res: PassResult) -> None:
    """Softplus(x) -> Where(Greater(x, 20), x, Softplus(x)) (exact: see the docstring)."""
    x, y = node.inputs[0], node.outputs[0]
    if _guarded(node):
        return
    if x.dtype is None or np.dtype(x.dtype) == np.float64:
        res.skip("softplus-float64" if x.dtype is not None else "softplus-unknown-type")
        return
    sp = gs.Variable(ctx.namer(f"{y.name}_unguarded"), dtype=y.dtype, shape=y.shape)
    past = gs.Variable(ctx.namer(f"{x.name}_past_{int(SOFTPLUS_LINEAR_FROM)}"), dtype=np.bool_,
                       shape=x.shape)
    node.outputs[0] = sp
    limit = gs.Constant(ctx.namer(f"{x.name}_softplus_threshold"),
                        np.array(SOFTPLUS_LINEAR_FROM, dtype=np.dtype(x.dtype)))
    g.nodes.append(gs.Node("Greater", ctx.namer(f"{node.name or y.name}_Past"),
                           inputs=[x, limit], outputs=[past]))
    g.nodes.append(gs.Node("Where", ctx.namer(f"{node.name or y.name}_Guard"),
                           inputs=[past, x, sp], outputs=[y]))
    res.outcome(None, "softplus-guarded")
