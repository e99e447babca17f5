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
check reports it. In the default pipeline only when MIGraphX is the target.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

# (op, attribute, its default per the ONNX schema)
DEFAULTS = [("Resize", "keep_aspect_ratio_policy", "stretch")]


class DefaultAttributes(Pass):
    name = "default-attributes"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = ("attributes MIGraphX 2.15 refuses that only state their default "
               "(Resize keep_aspect_ratio_policy=stretch) dropped")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in g.nodes:
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
