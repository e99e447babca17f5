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

A Gemm followed by such an Add takes it into its C (C' = beta * C + c, beta 1; no C: c):
PointNet's T-Net adds the identity to its last Linear's output so (``folded-into-gemm``).

The Add's output tensor keeps its name (it becomes the Gemm's). Gemm adds the bias in a
different order than MatMul then Add, so results agree to rounding, not bit for bit
(Numerics.CLOSE). If/Loop/Scan bodies are processed too.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, own_constant
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class FuseMatmulAdd(Pass):
    name = "fuse-matmul-add"
    phase = Phase.FUSE
    numerics = Numerics.CLOSE
    summary = "MatMul + bias Add -> Gemm; a constant Add after a Gemm into its C (2-D)"

    shape_ops = ("MatMul", "Gemm")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            for node in list(g.nodes):
                if node.domain not in (None, "", "ai.onnx") or not node.outputs:
                    continue
                if node.op == "MatMul":
                    res.outcome(_fuse(node, outs), "fused")
                elif node.op == "Gemm":
                    res.outcome(_fold_add(node, outs, ctx), "folded-into-gemm")
        return res


def _fuse(mm: gs.Node, outs: set[int]) -> str | None:
    found = _bias_add(mm, outs)
    if isinstance(found, str):
        return found
    add, c = found
    a, b = mm.inputs
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return "not-2d"
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


def _bias_add(mm: gs.Node, outs: set[int]) -> tuple[gs.Node, gs.Tensor] | str:
    """The Add after ``mm`` that only it feeds, and the Add's other input; "" otherwise."""
    y = mm.outputs[0]
    if len(y.outputs) != 1 or id(y) in outs or y.outputs[0].op != "Add":
        return ""
    add = y.outputs[0]
    if add.domain not in (None, "", "ai.onnx") or len(add.inputs) != 2:
        return ""
    c = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if c is y or not isinstance(c, gs.Constant):
        return "bias-not-constant"
    if y.dtype is None or np.dtype(y.dtype).kind != "f" and str(y.dtype) != "bfloat16":
        return "not-float"
    return add, c


def _fold_add(gemm: gs.Node, outs: set[int], ctx: Context) -> str | None:
    found = _bias_add(gemm, outs)
    if isinstance(found, str):
        return "" if found == "bias-not-constant" else found   # a residual Add: no site
    add, c = found
    a, b = gemm.inputs[0], gemm.inputs[1]
    if a.shape is None or b.shape is None or len(a.shape) != 2 or len(b.shape) != 2:
        return "not-2d"
    m = a.shape[1 if gemm.attrs.get("transA", 0) else 0]
    n = b.shape[0 if gemm.attrs.get("transB", 0) else 1]
    if len(c.shape) > 2 or not _fits(list(c.shape), m, n):
        return "bias-shape"
    old = gemm.inputs[2] if len(gemm.inputs) > 2 and gemm.inputs[2].name else None
    if old is not None and not isinstance(old, gs.Constant):
        return "bias-not-constant"
    if old is None and len(gemm.inputs) == 2:
        gemm.inputs.append(c)
    elif old is None:   # an empty name: no C
        gemm.inputs[2] = c
    else:
        beta = float(gemm.attrs.get("beta", 1.0))
        cv = beta * old.values.astype(np.float64) + c.values.astype(np.float64)
        own_constant(gemm, 2, cv.astype(c.values.dtype), ctx.namer, "plus")
    gemm.attrs["beta"] = 1.0
    out = add.outputs[0]
    add.inputs.clear()
    add.outputs.clear()
    gemm.outputs[0] = out
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
