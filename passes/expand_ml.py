"""expand-ml: ai.onnx.ml's Scaler, which MIGraphX does not parse, as standard ONNX, exactly.

scikit-learn pipelines exported by skl2onnx start with a StandardScaler as Scaler; MIGraphX
has no ai.onnx.ml operator ("Unknown operator: Scaler"), so an MLP behind it could not
compile. Before -> after, by the input's type::

    Scaler(x; offset, scale) -> y float
        float           =>  Mul(Sub(x, offset), scale)
        double          =>  Cast<float>(Mul(Sub(x, offset), scale)), offset and scale double
        int32 / int64   =>  Mul(Sub(Cast<float>(x), offset), scale)

onnxruntime's kernel (providers/cpu/ml/scaler.cc) computes
``float((x[i] - offset[i % F]) * scale[i % F])`` with float offset and scale, in C++'s usual
arithmetic: double for a double x, float for an integer x (converted first). The expansion
does the same operations in the same types, so it is bit-exact. F is dim 1 (dim 0 for a 1-D
input): for ranks 1 and 2 that is broadcasting over the last axis; above rank 2 the kernel
takes the flat index modulo dim 1, which no broadcast is, so those are skipped
(``rank-above-2``) unless offset and scale have one element; an unknown rank or type is
skipped too. In the default pipeline only when MIGraphX is the target: elsewhere one
Scaler is fewer nodes than its expansion.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

ML = "ai.onnx.ml"


class ExpandMl(Pass):
    name = "expand-ml"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = "ai.onnx.ml's Scaler (MIGraphX parses no ai.onnx.ml op) as Sub and Mul"
    shape_ops = ("Scaler",)   # its input's dtype and rank

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.domain == ML and node.op == "Scaler":
                    res.outcome(_scaler(node, g, ctx.namer), "expanded-scaler")
        return res


def _scaler(node: gs.Node, g: gs.Graph, namer) -> str | None:
    x, y = node.inputs[0], node.outputs[0]
    offset = np.asarray(node.attrs.get("offset", []), np.float32)
    scale = np.asarray(node.attrs.get("scale", []), np.float32)
    if scale.size == 0 or offset.size != scale.size:
        return "offset-scale-mismatch"       # onnxruntime refuses these
    dtype = np.dtype(x.dtype) if x.dtype is not None else None
    if dtype not in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32),
                     np.dtype(np.int64)):
        return "unknown-dtype"
    if scale.size > 1 and (x.shape is None or len(x.shape) > 2):
        return "rank-above-2" if x.shape is not None else "unknown-rank"
    base = node.name or y.name

    def new(op, inputs, dt, out=None, **attrs):
        out = out or gs.Variable(namer(f"{base}_{op.lower()}"), dtype=dt, shape=x.shape)
        g.nodes.append(gs.Node(op, namer(f"{base}_{op.lower()}"), attrs, inputs, [out]))
        return out

    work = np.float64 if dtype == np.float64 else np.float32
    if dtype.kind == "i":
        x = new("Cast", [x], np.float32, to=1)
    off = gs.Constant(namer(f"{base}_offset"), offset.astype(work))
    sc = gs.Constant(namer(f"{base}_scale"), scale.astype(work))
    node.outputs.clear()
    node.inputs.clear()
    y.dtype = np.float32
    if work == np.float64:
        new("Cast", [new("Mul", [new("Sub", [x, off], work), sc], work)], np.float32, out=y,
            to=1)
    else:
        new("Mul", [new("Sub", [x, off], work), sc], work, out=y)
    return None
