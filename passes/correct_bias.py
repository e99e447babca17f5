"""correct-bias: remove the mean shift INT8 rounding leaves in each INT8 conv's output.

Rounding weights (and activations) to int8 errs by a small amount that does not average out
per output channel: E[(W_q - W) x] != 0 when E[x] != 0, which is every conv after a Relu or
HardSwish. The shift adds up layer after layer (Nagel et al. 2019, bias correction). Here it
is measured, not modelled: the per-channel mean of each INT8 conv's output over the
calibration data, quantised model minus FP32 model (``ctx.bias_shift``: output tensor name
-> shift per channel, computed by the API before this pass), and subtracted from the bias::

    Conv(W_q) -> Mul(s_w) -> Add(b)      =>   ... -> Add(b - shift)        (weight form mul)
    Conv(W_q) -> Mul(s_w)                =>   ... -> Mul(s_w) -> Add(-shift)
    Conv(W_q, b)                         =>   Conv(W_q, b - shift)          (axis/per-tensor)

The tensor keeps its name and consumers; the bias stays a float add after the int8 kernel,
which MIGraphX fuses into it. Skips: an int32 bias behind a DequantizeLinear (its shift
would need requantising), a bias that is not constant, a layer not found.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import own_constant
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class CorrectBias(Pass):
    name = "correct-bias"
    phase = Phase.QUANTIZE
    numerics = Numerics.LOSSY
    summary = "subtract the measured mean shift of each INT8 conv's output from its bias"

    shape_ops = ()

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        tensors = graph.tensors()
        for name, shift in ctx.bias_shift.items():
            t = tensors.get(name)
            reason = self._correct(graph, t, np.asarray(shift, np.float64), ctx) \
                if t is not None and t.inputs else "layer-not-found"
            res.outcome(reason, "corrected-layers")
        return res

    def _correct(self, graph, t, shift, ctx) -> str | None:
        if t.dtype is not None and np.dtype(t.dtype) != np.float32:
            return "not-fp32"    # a float16 layer insert-qdq left alone (ISNet's): not INT8
        node = t.inputs[0]
        k = len(shift)
        if node.op == "Add" and isinstance(node.inputs[1], gs.Constant) \
                and node.inputs[1].values.size == k:
            b = node.inputs[1].values
            own_constant(node, 1, (b.astype(np.float64) - shift.reshape(b.shape)).astype(
                b.dtype), ctx.namer, "corrected")
            return None
        if node.op == "Mul":
            # the output's rank, else the per-channel scale's ([1, C, 1] for a Conv1d; a
            # [1, C] correction went along a Conv1d's last axis where the rank was unknown)
            scale = next((x for x in node.inputs if isinstance(x, gs.Constant)), None)
            rank = len(t.shape) if t.shape else (
                scale.values.ndim if scale is not None and scale.values.ndim >= 2 else 4)
            raw = gs.Variable(ctx.namer(f"{t.name}_uncorrected"), dtype=t.dtype, shape=t.shape)
            node.outputs[0] = raw
            b = gs.Constant(ctx.namer(f"{t.name}_bias_correction"), (-shift).reshape(
                (1, k) + (1,) * (rank - 2)).astype(np.float32))
            graph.nodes.append(gs.Node("Add", ctx.namer(f"{t.name}_CorrectBias"),
                                       inputs=[raw, b], outputs=[t]))
            return None
        if node.op == "Conv":
            if len(node.inputs) > 2:
                b = node.inputs[2]
                if not isinstance(b, gs.Constant):
                    return "bias-not-constant"
                own_constant(node, 2, (b.values.astype(np.float64) - shift).astype(
                    b.values.dtype), ctx.namer, "corrected")
            else:
                node.inputs.append(gs.Constant(ctx.namer(f"{t.name}_bias_correction"),
                                               (-shift).astype(np.float32)))
            return None
        return "unexpected-epilogue"
