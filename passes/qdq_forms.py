"""qdq-forms: constant Q/DQ inputs in forms MIGraphX refuses or dies on, written in forms it
parses, exactly.

Two forms onnxruntime's quantizers write (fourteenth round), measured on the shared builds:

* **A blockwise DequantizeLinear with one block along its axis** (block_size at least the
  axis' length: onnxruntime's 4-bit quantizer for a MatMul whose K is at most the block).
  MIGraphX refuses it at parse ("must have size > 1 along provided axis for block
  granularity" on 2.16, "Block size must be within range" on 2.15). One block is the same
  scale all along that axis, which is per-axis quantization over the other dim::

      DequantizeLinear <axis=0, block_size=32> (w[16, 64], s[1, 64], z[1, 64])
          =>  DequantizeLinear <axis=1> (w, s'[64], z'[64])

  (a scale with no dim above 1 becomes per-tensor, one with two is left: blockwise-2d).
* **An int4/uint4 constant that is 0-d or has an odd last dim** (quantize_static's
  per-tensor int4 zero point). MIGraphX 2.15 and 2.16 segfault on the first and refuse the
  second ("Int4: currently supports only even-sized packed tensors"). The DequantizeLinear's
  int4 inputs (data and zero point, which must have one type) become int8 (uint4: uint8)
  with the same values: twice the bytes of those tensors, the same numbers.

Only constants are rewritten: a Q/DQ pair on activations is left (activation-not-constant).
In the default pipeline only when MIGraphX is the target.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, np_dtype, packed, peek_values
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

QDQ = ("QuantizeLinear", "DequantizeLinear")
# onnxruntime's quantizers write int4/int16 Q/DQ as com.microsoft ops below opset 21; MIGraphX
# parses those by op_type as the standard ones (its parser ignores the domain).
DOMAINS = (None, "", "ai.onnx", "com.microsoft")


class QdqForms(Pass):
    name = "qdq-forms"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = ("Q/DQ MIGraphX refuses or crashes on (one-block blockwise scales, 0-d or "
               "odd-sized int4) written per axis or in int8, exactly")
    shape_ops = ()

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in g.nodes:
                if node.op not in QDQ or node.domain not in DOMAINS:
                    continue
                if int(node.attrs.get("block_size", 0) or 0) > 0:
                    res.outcome(_one_block(node, ctx), "blockwise-one-block-per-axis")
                if node.op == "DequantizeLinear" and _odd_packed(node):
                    res.outcome(_widen(node, ctx), "int4-widened")
        return res


def _const(t) -> np.ndarray | None:
    # peek_values: a memory-mapped weight stays on disk (t.values would load it for good)
    return np.asarray(peek_values(t)) if isinstance(t, gs.Constant) else None


def _one_block(node: gs.Node, ctx: Context) -> str | None:
    scale = _const(node.inputs[1]) if len(node.inputs) > 1 else None
    zp = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2].name else None
    if scale is None or (zp is not None and _const(zp) is None):
        return "activation-not-constant"
    axis = int(node.attrs.get("axis", 1)) % max(scale.ndim, 1)
    if scale.ndim == 0 or scale.shape[axis] != 1:
        return ""   # several blocks: a form MIGraphX parses
    rest = [j for j, d in enumerate(scale.shape) if d != 1]
    if len(rest) > 1:
        return "blockwise-2d"
    base = node.name or node.outputs[0].name
    shape = [scale.shape[rest[0]]] if rest else []
    node.inputs[1] = gs.Constant(ctx.namer(f"{base}_scale"), scale.reshape(shape))
    if zp is not None:
        node.inputs[2] = gs.Constant(ctx.namer(f"{base}_zero_point"), _const(zp).reshape(shape))
    attrs = {k: v for k, v in node.attrs.items() if k not in ("block_size", "axis")}
    if rest:
        attrs["axis"] = rest[0]
    node.attrs = attrs
    return None


def _odd_packed(node: gs.Node) -> bool:
    """An int4/uint4 input MIGraphX cannot parse: 0-d or with an odd last dim (read from
    the tensor's type and shape, not its values)."""
    return any(t.name and t.dtype is not None and t.shape is not None
               and packed(np_dtype(t.dtype)) and (not t.shape or t.shape[-1] % 2)
               for t in node.inputs[:3:2])


def _widen(node: gs.Node, ctx: Context) -> str | None:
    """The DequantizeLinear's data and zero point (one type) in int8/uint8."""
    at = [i for i in (0, 2) if i < len(node.inputs) and node.inputs[i].name]
    values = {i: _const(node.inputs[i]) for i in at}
    if any(v is None for v in values.values()):
        return "activation-not-constant"
    code = onnx.helper.np_dtype_to_tensor_dtype(values[0].dtype)
    wide = {onnx.TensorProto.INT4: np.int8, onnx.TensorProto.UINT4: np.uint8}.get(code)
    if wide is None or any(v.dtype != values[0].dtype for v in values.values()):
        return "not-int4"
    base = node.name or node.outputs[0].name
    for i, v in values.items():
        node.inputs[i] = gs.Constant(ctx.namer(f"{base}_{'zero_point' if i else 'data'}"),
                                     v.astype(wide))
    return None
