"""sink-transposes: Transposes move down through elementwise ops until they cancel or merge.

A model converted from TensorFlow keeps its NHWC layout between NCHW convs::

    Transpose(NHWC->NCHW) -> Conv -> Transpose(NCHW->NHWC) -> Add(b[C]) -> Relu
        -> Transpose(NHWC->NCHW) -> Conv ...

Before -> after::

    Transpose(p) -> E(., c) -> y        =>  E(., c') -> Transpose(p) -> y
        (E elementwise; c a constant, c' = c laid out before the Transpose)
    E(Transpose(p, a), Transpose(p, b)) =>  Transpose(p, E(a, b))
    Transpose(p) -> Transpose(q), q undoing p  =>  nothing (the readers read the input)

so the chain above becomes Conv -> Add(b[1, C, 1, 1]) -> Relu -> Conv, and fuse-conv-bn
can fold the per-channel Add and Mul into the conv. Each move keeps the number of
Transposes or lowers it (a Transpose is moved only past the one node that reads it, and a
second transposed input of that node must have the same perm); a pair that cancels goes.
The elementwise ops compute the same values on permuted data: bit-exact (Numerics.EXACT).

Elementwise here: unary activations and math (SAME_SHAPE) and the broadcasting binary and
variadic ops (BROADCAST), whose other inputs are constants of rank at most the Transpose's
(laid out anew: c' = reshape(c, rank r) transposed by the inverse perm, a copy of at most
65,536 elements) or outputs of Transposes with the same perm. Skipped with a reason: another
input that is neither (other-input-not-transposed), a constant of higher rank
(constant-rank) or a larger one (constant-too-large). A Transpose whose
output is a graph output stays where it is; the output keeps its name wherever the
Transpose moves (the moved Transpose writes it). If/Loop/Scan bodies are processed too.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import bypass, iter_graphs
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

SAME_SHAPE = {"Relu", "LeakyRelu", "Sigmoid", "Tanh", "Elu", "Selu", "Celu", "HardSigmoid",
              "HardSwish", "Softplus", "Softsign", "Mish", "Abs", "Neg", "Exp", "Log", "Sqrt",
              "Reciprocal", "Erf", "Floor", "Ceil", "Round", "Sign", "Not", "Cast", "Identity",
              "Clip", "Sin", "Cos", "IsNaN", "Gelu"}
# Clip's min/max are scalars: they broadcast like any other input, so it is BROADCAST-safe.
BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Clip",
             "Where", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or",
             "Xor", "BitShift", "Mod"}
# Constants re-laid for a moved Transpose are copies: per-channel vectors and small tables
# only.
MAX_LAID_ELEMS = 1 << 16
# A bound on moves per graph: each move takes a Transpose one node further down.
MAX_MOVES_PER_NODE = 4


class SinkTransposes(Pass):
    name = "sink-transposes"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = "move Transposes down through elementwise ops until they cancel or merge"

    def needs_shapes(self, model) -> bool:
        return False   # ranks come from the perms, constants from their values

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            budget = MAX_MOVES_PER_NODE * max(len(g.nodes), 1)
            moved = True
            while moved and budget > 0:
                moved, skips = False, []
                members = {id(n) for n in g.nodes}   # a body's reader of ours is not ours
                for node in list(g.nodes):
                    if not _is_transpose(node):
                        continue
                    n = _cancel(node, g, outs, members)
                    if n:
                        res.count("cancelled", n)
                        res.changed = moved = True
                    if not node.outputs:
                        continue
                    reason = _sink(node, g, outs, ctx, members)
                    if reason is None:
                        res.count("moved")
                        res.changed = moved = True
                        budget -= 1
                    elif reason:
                        skips.append(reason)
            for reason in skips:   # where the Transposes stopped, once each
                res.skip(reason)
        return res


def _is_transpose(node: gs.Node) -> bool:
    return (node.op == "Transpose" and node.domain in (None, "", "ai.onnx") and bool(node.outputs)
            and node.attrs.get("perm") is not None and len(node.inputs) == 1)


def _perm(node: gs.Node) -> list[int]:
    return [int(p) for p in node.attrs["perm"]]


def _cancel(t: gs.Node, g: gs.Graph, outs: set[int], members: set[int]) -> int:
    """Readers of ``t`` in its graph that are Transposes undoing it read ``t``'s input
    instead."""
    y, x, p = t.outputs[0], t.inputs[0], _perm(t)
    n = 0
    for reader in list(y.outputs):
        if not _is_transpose(reader) or reader.inputs[0] is not y or id(reader) not in members:
            continue
        q = _perm(reader)
        if len(q) != len(p) or [p[i] for i in q] != list(range(len(p))):
            continue
        reader.inputs[0] = x
        if not y.outputs and id(y) not in outs:   # t is dead: gone first, so that x's
            t.inputs.clear()                      # producer can write a graph output
            t.outputs.clear()
        if bypass(reader, g, outs) is not None:   # its output is a graph output by name
            reader.op, reader.attrs = "Identity", {}
        n += 1
        if not t.outputs:
            break
    return n


def _sink(t: gs.Node, g: gs.Graph, outs: set[int], ctx: Context, members: set[int]
          ) -> str | None:
    """Move ``t`` past the one node that reads it, in its graph (a body reading ``t``'s
    output from outside reads it through the same tensor, which would be left without a
    producer). None if moved, a skip reason, or "" when the pattern does not apply."""
    y, p = t.outputs[0], _perm(t)
    if id(y) in outs or len(y.outputs) != 1 or id(y.outputs[0]) not in members:
        return ""
    e = y.outputs[0]
    if e.domain not in (None, "", "ai.onnx") or len(e.outputs) != 1 or (
            e.op not in SAME_SHAPE and e.op not in BROADCAST):
        return ""
    r = len(p)
    inv = [0] * r
    for i, a in enumerate(p):
        inv[a] = i
    new_inputs = []
    for inp in e.inputs:
        if inp is y:
            new_inputs.append(t.inputs[0])
        elif inp.name == "":
            new_inputs.append(inp)
        elif isinstance(inp, gs.Constant):
            shape = list(inp.shape)   # before reading: a big weight stays on disk
            if len(shape) > r:
                return "constant-rank"
            if np.prod(shape, dtype=float) > MAX_LAID_ELEMS:   # a copy laid out anew:
                return "constant-too-large"   # vectors, not weights a reader shares
            v = np.asarray(inp.values)
            if v.size == 1 and v.ndim <= 1:
                new_inputs.append(inp)
                continue
            laid = v.reshape([1] * (r - v.ndim) + list(v.shape)).transpose(inv)
            new_inputs.append(gs.Constant(ctx.namer(f"{inp.name}_t"),
                                          np.ascontiguousarray(laid)))
        elif (inp.inputs and _is_transpose(inp.inputs[0]) and _perm(inp.inputs[0]) == p
              and id(inp) not in outs):
            new_inputs.append(inp.inputs[0].inputs[0])
        else:
            return "other-input-not-transposed"
    z = e.outputs[0]
    before = gs.Variable(ctx.namer(f"{z.name}_pre"), dtype=z.dtype,
                         shape=None if z.shape is None or len(z.shape) != r
                         else [z.shape[a] for a in inv])
    while e.inputs:
        e.inputs.pop()
    e.inputs.extend(new_inputs)
    e.outputs[0] = before
    g.nodes.append(gs.Node("Transpose", name=ctx.namer(f"{t.name}_sunk"), attrs={"perm": p},
                           inputs=[before], outputs=[z]))
    return None
