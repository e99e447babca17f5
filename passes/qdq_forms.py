"""qdq-forms: Q/DQ in forms MIGraphX refuses, dies on or runs in float, written in the forms it
parses and lowers, exactly.

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

Three forms MIGraphX parses but runs in float, or throws on when lowering (the check's
``qdq-uint8``, ``qdq-no-zero-point``, ``qdq-scale-shape-1``; onnxruntime's quantize_static
with QUInt8, its long-time default, writes the first: 0 of a ResNet's 14 layers lowered):

* **uint8 Q/DQ** (uint8-to-int8): a uint8 QuantizeLinear and the DequantizeLinear nodes
  reading it, or a uint8 constant and its DQs, in int8 with every zero point moved by 128
  (u - 128 is the same number: below). Left where anything but a DQ reads the uint8
  tensor (uint8-read-elsewhere: a graph output, another op) or a zero point is computed.
* **An int8 DQ without a zero point** (zero-point-written): one of 0, shaped as its scale.
* **A per-tensor scale or zero point stored as [1]** (per-tensor-scale-0d): 0-d.

All three are bit-exact. And one form MIGraphX 2.16 throws on (exit 1 on a MobileNet):

* **A QuantizeLinear of a float weight** (weight-quantized; onnxruntime's AddQDQPairToWeight
  writes it): its int8/uint8 output computed here as onnxruntime does, the DQs reading that
  constant, which weight-scales-after then takes. Left where anything but a DQ reads it.

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
    summary = ("Q/DQ MIGraphX refuses, crashes on or runs in float (one-block blockwise "
               "scales, 0-d or odd-sized int4, uint8, no zero point, [1] scales) written in "
               "the forms it lowers, exactly")
    shape_ops = ()

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        if not any(n.op in QDQ and n.domain in DOMAINS for g in iter_graphs(graph)
                   for n in g.nodes):
            return res   # no Q/DQ: no reader maps to build (0.06 s at 8,000 nodes)
        for g in iter_graphs(graph):
            for node in g.nodes:
                if node.op not in QDQ or node.domain not in DOMAINS:
                    continue
                if int(node.attrs.get("block_size", 0) or 0) > 0:
                    res.outcome(_one_block(node, ctx), "blockwise-one-block-per-axis")
                if node.op == "DequantizeLinear" and _odd_packed(node):
                    res.outcome(_widen(node, ctx), "int4-widened")
        readers, kept = _readers(graph)
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.op == "QuantizeLinear" and node.domain in DOMAINS \
                        and isinstance(node.inputs[0], gs.Constant):
                    res.outcome(_quantized_weight(g, node, readers, kept, ctx),
                                "weight-quantized")
        readers, kept = _readers(graph)
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.domain not in DOMAINS:
                    continue
                if node.op == "QuantizeLinear" and _q_type(node) == np.uint8:
                    res.outcome(_signed_q(node, readers, kept, ctx), "uint8-to-int8")
                elif node.op == "DequantizeLinear" and isinstance(node.inputs[0], gs.Constant) \
                        and _type(node.inputs[0]) == np.uint8:
                    res.outcome(_signed_data(node, readers, kept, ctx), "uint8-to-int8")
        for g in iter_graphs(graph):
            for node in g.nodes:
                if node.op in QDQ and node.domain in DOMAINS:
                    if node.op == "DequantizeLinear" and _type(node.inputs[0]) == np.int8:
                        res.outcome(_zero_point_written(node, ctx), "zero-point-written")
                    res.outcome(_scalar_scale(node, ctx), "per-tensor-scale-0d")
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
    the tensor's type and shape, not its values), or maybe so: a last dim not known (a
    symbolic or unknown one was taken modulo 2, exit 3; such an activation is no
    constant, and _widen counts it as skipped)."""
    return any(t.name and t.dtype is not None and t.shape is not None
               and packed(np_dtype(t.dtype)) and (
                   not t.shape or not isinstance(t.shape[-1], (int, np.integer))
                   or t.shape[-1] % 2)
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


# -- uint8 and implicit zero points: what MIGraphX runs in float ---------------------------
#
# simplify_qdq matches int8 Q/DQ only (uint8 ones are stripped and the layer runs in float,
# #2704) and reads a DQ's zero point input (without one the layer stays float,
# dq_helpers.hpp:42-44). uint8 u and int8 u - 128 with the zero point moved by 128 are the
# same numbers: Q: clamp(round(x/s) + z, 0, 255) - 128 = clamp(round(x/s) + z - 128, -128,
# 127); DQ: ((u - 128) - (z - 128)) * s = (u - z) * s. A per-tensor scale stored as [1]
# throws in simplify_qdq ("succeeding sizes must match") where a 0-d one lowers.


def _type(t) -> np.dtype | None:
    # np_dtype: graphsurgeon keeps the ONNX type number where numpy has none (float8: 17)
    return None if t is None or t.dtype is None else np_dtype(t.dtype)


def _q_type(q: gs.Node) -> np.dtype | None:
    """A QuantizeLinear's output type: its zero point's, else output_dtype's, else uint8
    (the default without a zero point)."""
    if len(q.inputs) > 2 and q.inputs[2].name:
        return _type(q.inputs[2])
    if q.attrs.get("output_dtype"):
        return np_dtype(int(q.attrs["output_dtype"]))
    return np.dtype(np.uint8)


def _readers(graph: gs.Graph) -> tuple[dict[str, list], set[str]]:
    """({tensor: every node reading it, in any graph}, the tensors some graph outputs)."""
    readers: dict[str, list] = {}
    kept: set[str] = set()
    for g in iter_graphs(graph):
        kept.update(t.name for t in g.outputs)
        for n in g.nodes:
            for t in n.inputs:
                readers.setdefault(t.name, []).append(n)
    return readers, kept


def _shifted(values: np.ndarray) -> np.ndarray:
    return np.asarray(np.asarray(values).astype(np.int16) - 128, np.int8)


def _dq_zero_points(dqs: list) -> list[np.ndarray] | None:
    """Each DQ's uint8 zero point (0 where it has none), shaped as its scale; None where
    one is computed or not uint8."""
    out = []
    for dq in dqs:
        scale = _const(dq.inputs[1]) if len(dq.inputs) > 1 else None
        zp = dq.inputs[2] if len(dq.inputs) > 2 and dq.inputs[2].name else None
        v = np.zeros(np.shape(scale), np.uint8) if zp is None else _const(zp)
        if scale is None or v is None or v.dtype != np.uint8:
            return None
        out.append(v)
    return out


def _uint8_readers(name: str, readers: dict, kept: set) -> list | None:
    """The DequantizeLinear nodes reading ``name``, or None where anything else reads it
    (a graph output, another op): its type must stay."""
    dqs = readers.get(name, [])
    if name in kept or not dqs or any(
            n.op != "DequantizeLinear" or n.domain not in DOMAINS or n.inputs[0].name != name
            or any(t.name == name for t in n.inputs[1:]) for n in dqs):
        return None
    return dqs


def _signed_q(q: gs.Node, readers: dict, kept: set, ctx: Context) -> str | None:
    """A uint8 QuantizeLinear and the DQs reading it, in int8 (zero points moved by 128)."""
    if q.attrs.get("output_dtype") or q.attrs.get("saturate") is not None:
        return "output-dtype-attribute"
    dqs = _uint8_readers(q.outputs[0].name, readers, kept)
    if dqs is None:
        return "uint8-read-elsewhere"
    zps = _dq_zero_points([q] + dqs)
    if zps is None:
        return "zero-point-not-constant"
    for node, zp in zip([q] + dqs, zps):
        _set_zero_point(node, _shifted(zp), ctx)
    q.outputs[0].dtype = np.int8
    return None


def _signed_data(dq: gs.Node, readers: dict, kept: set, ctx: Context) -> str | None:
    """A uint8 constant's DequantizeLinear readers (all of them) in int8."""
    data = dq.inputs[0]
    dqs = _uint8_readers(data.name, readers, kept)
    if dqs is None:
        return "uint8-read-elsewhere"
    zps = _dq_zero_points(dqs)
    values = _const(data)
    if zps is None or values is None:
        return "zero-point-not-constant"
    signed = gs.Constant(ctx.namer(f"{data.name}_int8"), _shifted(values))
    for node, zp in zip(dqs, zps):
        node.inputs[0] = signed
        _set_zero_point(node, _shifted(zp), ctx)
    return None


def _quantized_weight(g: gs.Graph, q: gs.Node, readers: dict, kept: set,
                      ctx: Context) -> str | None:
    """A QuantizeLinear of a float32 constant (a weight; onnxruntime's AddQDQPairToWeight
    writes it) read by DQs only: its int8/uint8 output as the constant, computed as
    onnxruntime does (x / scale in float32, rounded half to even, + zero point, saturated).
    MIGraphX 2.16 throws on a per-axis Q of a weight as on a per-axis int8 weight DQ; a
    constant weight DQ is what weight-scales-after (and the uint8 step) then rewrite."""
    if q.attrs.get("output_dtype") or int(q.attrs.get("block_size", 0) or 0) > 0:
        return "output-dtype-attribute"
    x, scale = q.inputs[0], _const(q.inputs[1]) if len(q.inputs) > 1 else None
    zp_t = q.inputs[2] if len(q.inputs) > 2 and q.inputs[2].name else None
    zp = np.zeros(np.shape(scale), np.uint8) if zp_t is None else _const(zp_t)
    if _type(x) != np.float32 or (scale is not None and scale.dtype != np.float32):
        return "not-float32"
    if scale is None or zp is None:
        return "zero-point-not-constant"
    if zp.dtype not in (np.int8, np.uint8) or zp.shape != scale.shape or scale.ndim > 1:
        return "not-int8"
    name = q.outputs[0].name
    dqs = readers.get(name, [])
    if name in kept or not dqs or any(
            n.op != "DequantizeLinear" or n.domain not in DOMAINS or n.inputs[0].name != name
            or any(t.name == name for t in n.inputs[1:]) for n in dqs):
        return "quantized-weight-read-elsewhere"
    v = _const(x)
    if scale.size > 1 or scale.ndim == 1:   # per axis, or per tensor stored as [1]
        axis = int(q.attrs.get("axis", 1)) % max(v.ndim, 1)
        shape = [1] * v.ndim
        shape[axis] = scale.size
        if v.ndim == 0 or v.shape[axis] != scale.size and scale.size > 1:
            return "axis-mismatch"
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    r = np.rint(np.divide(v, scale, dtype=np.float32)).astype(np.float64)
    if not np.all(np.isfinite(r)):
        return "not-finite"
    info = np.iinfo(zp.dtype)
    out = np.asarray(np.clip(r + zp.astype(np.float64), info.min, info.max), zp.dtype)
    t = gs.Constant(ctx.namer(f"{x.name}_quantized"), out)
    for dq in dqs:
        dq.inputs[0] = t
    q.outputs.clear()
    q.inputs.clear()
    g.nodes.remove(q)
    return None


def _set_zero_point(node: gs.Node, zp: np.ndarray, ctx: Context) -> None:
    base = node.name or node.outputs[0].name
    t = gs.Constant(ctx.namer(f"{base}_zero_point"), zp)
    if len(node.inputs) > 2:
        node.inputs[2] = t
    else:
        node.inputs.append(t)


def _zero_point_written(dq: gs.Node, ctx: Context) -> str | None:
    """An int8 DequantizeLinear without a zero point gets one of 0, shaped as its scale."""
    if len(dq.inputs) > 2 and dq.inputs[2].name:
        return ""
    scale = dq.inputs[1]   # its shape only: a weight's scale may be memory-mapped
    if not isinstance(scale, gs.Constant) or scale.shape is None:
        return "scale-not-constant"
    _set_zero_point(dq, np.zeros(tuple(scale.shape), np.int8), ctx)
    return None


def _scalar_scale(node: gs.Node, ctx: Context) -> str | None:
    """A per-tensor scale (and zero point) stored as [1], as 0-d."""
    at = [i for i in (1, 2) if i < len(node.inputs) and node.inputs[i].name]
    shapes = [tuple(node.inputs[i].shape) if isinstance(node.inputs[i], gs.Constant)
              and node.inputs[i].shape is not None else None
              for i in at]   # read from the type: values only when rewritten
    if any(sh not in ((1,), ()) for sh in shapes) or all(sh == () for sh in shapes):
        return ""
    values = {i: _const(node.inputs[i]) for i in at}
    if int(node.attrs.get("block_size", 0) or 0) > 0:
        return ""
    base = node.name or node.outputs[0].name
    for i, v in values.items():
        if v.shape == (1,):
            node.inputs[i] = gs.Constant(
                ctx.namer(f"{base}_{'zero_point' if i == 2 else 'scale'}"),
                np.asarray(v.reshape(())))
    return None
