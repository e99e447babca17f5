"""fuse-matmul-add: MatMul followed by a bias Add becomes one Gemm.

Before -> after::

    A[M, K] -> MatMul(B[K, N]) -> Add(C) -> y       =>   A -> Gemm(B, C) -> y

Gemm is what ONNX (and MIGraphX's parser, which maps it to dot + add) calls a linear layer
with a bias; exporters write MatMul + Add for nn.Linear on 2-D inputs.

Preconditions (else skipped with a reason):

* A has rank 2 and B rank 2 (Gemm is 2-D only; a batched MatMul stays) - skip:not-2d;
* C is a constant that broadcasts one way to [M, N]: a scalar, [N], [1, N], [M, 1] or
  [M, N] (with M static where C spans it) - skip:bias-shape;
* a float dtype (float, double, float16, bfloat16);
* the MatMul's output is read by this Add only and is not a graph output.

The Add's output tensor keeps its name (it becomes the Gemm's). Gemm adds the bias in a
different order than MatMul then Add, so results agree to rounding, not bit for bit
(Numerics.CLOSE). If/Loop/Scan bodies are processed too.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class FuseMatmulAdd(Pass):
    name = "fuse-matmul-add"
    phase = Phase.FUSE
    numerics = Numerics.CLOSE
    summary = "MatMul + bias Add -> Gemm (2-D inputs, constant bias)"

    shape_ops = ("MatMul",)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            for node in list(g.nodes):
                if node.op != "MatMul" or node.domain not in (None, "", "ai.onnx") or not node.outputs:
                    continue
                res.outcome(_fuse(node, outs), "fused")
        return res


def _fuse(mm: gs.Node, outs: set[int]) -> str | None:
    y = mm.outputs[0]
    if len(y.outputs) != 1 or id(y) in outs or y.outputs[0].op != "Add":
        return ""
    add = y.outputs[0]
    if add.domain not in (None, "", "ai.onnx") or len(add.inputs) != 2:
        return ""
    c = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if c is y or not isinstance(c, gs.Constant):
        return "bias-not-constant"
    a, b = mm.inputs
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return "not-2d"
    if y.dtype is None or np.dtype(y.dtype).kind != "f" and str(y.dtype) != "bfloat16":
        return "not-float"
    m, n = a.shape[0], b.shape[1]
    cs = list(c.shape)
    if len(cs) > 2 or not _fits(cs, m, n):
        return "bias-shape"
    out = add.outputs[0]
    add.inputs.clear()
    add.outputs.clear()
    mm.op = "Gemm"
    mm.inputs.append(c)
    mm.outputs[0] = out
    return None


def _fits(cs: list, m, n) -> bool:
    """Does a constant of shape ``cs`` broadcast one way to [m, n]?"""
    cs = [1] * (2 - len(cs)) + [int(d) for d in cs]
    for d, full in zip(cs, (m, n)):
        if d == 1:
            continue
        if not isinstance(full, (int, np.integer)) or int(full) != d:
            return False
    return True
