"""fold-shapes: shape arithmetic over partially symbolic shapes; If on a known condition.

Before -> after (x: float[1, 1, 64, W], W symbolic)::

    Shape(x) -> Gather(2) -> Unsqueeze -> Concat(.., [32]) =>  [64, 32] (initializer)
    Shape(x) -> Gather(3) -> Mul(2) -> Div(2) -> Equal(Shape(x)[3]) => True (initializer)
    If(known condition) { then: A } else { B }               =>  A's nodes, inlined

Every small integer or boolean tensor (at most 1,024 elements) gets a value whose elements
are integers or sympy expressions in the symbolic dims: a dim_param is a symbol (the same
name is the same value, as ONNX's shape inference also assumes), an unnamed unknown dim is a
fresh symbol per tensor and axis, and all are non-negative integers. Values flow through
Shape, Size, Gather, Slice, Concat, Unsqueeze, Squeeze, Reshape, Flatten, Transpose,
ConstantOfShape (integer values), Identity, Cast (between integer/bool types), Add, Sub,
Mul, Neg, Abs, Div (truncating; symbolic only for a non-negative dividend and a positive
constant divisor), Max, Min, Equal, Less, Greater,
LessOrEqual, GreaterOrEqual, Not, And, Or, Where and Constant. A node whose outputs all come
out as plain numbers becomes constants: that folds every value that does not depend on a
symbolic dim; what does depend keeps its nodes. A comparison sympy cannot decide, or any
op outside that list, makes the value unknown: nothing is guessed.

An If whose condition is known is replaced by the branch it takes (its nodes move to the
enclosing graph; its outputs take the If's output names), then values are propagated again,
up to four rounds. A Reshape whose target shape is symbolic only where it repeats its
input's dims at the same positions gets those entries as 0 ("copy") and a constant shape:
Reshape(x, Concat(Shape(x)[0:1], [-1])) is Reshape(x, [0, -1]). Where they are x's dims in
the same order at other positions, an Unsqueeze (or a Squeeze of static 1s) moves them
there first: [N, 64, A] -> [N, 4, 16, A] is Reshape(Unsqueeze(x, [2]), [0, 4, 16, 0]), and a
Reshape that only adds or drops unit dims becomes that Unsqueeze or Squeeze. A -1 for a
symbolic entry only when every other entry is a positive integer ([N*H, 192] is
[-1, 192]): then it always equals the entry; next to a 0 it does not (onnxruntime's
[0, 4, 16, -1] fails on an empty batch).
A branch tensor named like one of the enclosing graph's is renamed (a fresh name); a branch
output named like the If's output at its place simply becomes it.

Shapes come from ONNX shape inference (data propagation on), run once before the pipeline,
If/Loop/Scan bodies included; bodies are processed like the top level. Where a round folded
anything (a Reshape's output shape inference did not find, an inlined branch, a Pad's pads:
TensorFlow's SAME padding) and a Shape or Size of a not fully static tensor is left,
inference runs again on the graph as it is (:func:`rewriter.core.convert.refresh_shapes`;
its fresh unknown dims are renamed per run, so they never alias a dim of another run) and
the next round sees what became static downstream, through ops this pass does not
evaluate (an LSTM, a Transpose).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from rewriter.core.convert import refresh_shapes
from rewriter.core.graph import dead_code, iter_graphs, toposort
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

MAX_ELEMS = 1024
# Where this pass has work: shape values start at Shape/Size, an If may become known, and
# a Reshape may copy dims. Without any of them the integer arithmetic left is constant
# folding's.
SEEDS = frozenset({"Shape", "Size", "If", "Reshape"})
# Rounds of folding and shape inference: each can make one more layer's shapes static
# (LORE's 8-layer table transformer needs 8; a round that folds nothing ends the loop).
ROUNDS = 16
INT_KINDS = "iub"   # signed, unsigned, bool
I64 = (-(1 << 63), (1 << 63) - 1)


class FoldShapes(Pass):
    name = "fold-shapes"
    phase = Phase.FOLD
    numerics = Numerics.EXACT
    summary = "fold shape arithmetic that does not depend on symbolic dims; inline known Ifs"

    shape_ops = ("Shape", "Size", "If")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        if not any(n.op in SEEDS for g in iter_graphs(graph) for n in g.nodes):
            return res   # no shape values and no Reshape: fold-constants does the rest
        for round_ in range(ROUNDS):
            toposort(graph)
            values: dict[int, _V] = {}
            folded = inlined = 0
            for g in iter_graphs(graph):   # outermost first: outer values reach bodies
                outs = {id(t) for t in g.outputs}
                for node in list(g.nodes):
                    if not node.outputs:
                        continue
                    _propagate(node, values)
                    if node.op == "If":
                        cond = values.get(id(node.inputs[0]))
                        if cond is not None and cond.concrete() and cond.arr.size == 1:
                            reason = _inline_if(node, g, bool(cond.arr.ravel()[0]), outs,
                                                ctx.namer)
                            if reason:
                                res.skip(reason)
                            else:
                                inlined += 1
                        continue
                    kind = _copy_dims(node, values, ctx.namer, g) if node.op == "Reshape" else None
                    if kind:
                        res.count(kind)
                        folded += 1
                        continue
                    if _foldable(node, values, outs):
                        for t in node.outputs:
                            v = values[id(t)]
                            t.to_constant(np.array(v.arr.astype(v.dtype), order="C"))
                        node.outputs.clear()
                        node.inputs.clear()
                        folded += 1
            shaped = 0   # Reshape outputs whose shape is known now, not to the first inference
            for g in iter_graphs(graph):
                for node in g.nodes:
                    if node.op == "Reshape" and node.outputs:
                        shaped += _reshape_out_shape(node)
            res.count("folded", folded)
            res.count("inlined-if", inlined)
            if not (folded or inlined):
                break
            res.changed = True
            dead_code(graph)
            if round_ + 1 < ROUNDS and _shapes_left(graph):
                # What this round made known (a Reshape's output shape, an inlined branch,
                # a Pad's folded pads) can make more static downstream, through ops this
                # pass does not evaluate (an LSTM's output, a Transpose, a Conv after the
                # Pad): onnx infers the graph again.
                res.count("shapes-refreshed", int(refresh_shapes(graph, f"r{round_}_") > 0))
        return res


def _shapes_left(graph: gs.Graph) -> bool:
    """Is there a Shape or Size of a tensor whose dims are not all static?"""
    return any(n.op in ("Shape", "Size") and n.inputs and (
        n.inputs[0].shape is None or not all(isinstance(d, (int, np.integer)) and d >= 0
                                             for d in n.inputs[0].shape))
        for g in iter_graphs(graph) for n in g.nodes)


# --- values -------------------------------------------------------------------------------

class _V:
    """A small integer/bool tensor's value: an object array of ints/bools/sympy exprs."""

    __slots__ = ("arr", "dtype")

    def __init__(self, arr, dtype):
        self.arr = np.asarray(arr, dtype=object)
        self.dtype = np.dtype(dtype)

    def concrete(self) -> bool:
        return all(isinstance(x, (int, bool, np.integer, np.bool_)) for x in self.arr.ravel())


def _sym(name: str):
    import sympy

    return sympy.Symbol(name, integer=True, nonnegative=True)


def _norm(x):
    """sympy Integer/Boolean -> int/bool; anything else stays as it is."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    import sympy   # only once a value is symbolic: importing sympy costs ~0.2 s

    if x is sympy.true or x is sympy.false:
        return bool(x)
    if isinstance(x, sympy.Basic) and x.is_Integer:
        return int(x)
    return x


def _known(values, t) -> _V | None:
    if isinstance(t, gs.Constant):
        if not _small_int(t):
            return None   # never load a weight (lazy, memory-mapped) to look at it
        try:
            a = np.asarray(t.values)
        except Exception:  # noqa: BLE001 - unreadable lazy values
            return None
        if a.dtype.kind in INT_KINDS and a.size <= MAX_ELEMS:
            v = _V(a.astype(object), a.dtype)
            values[id(t)] = v
            return v
        return None
    return values.get(id(t))


def _small_int(t: gs.Constant) -> bool:
    try:
        return (np.dtype(t.dtype).kind in INT_KINDS
                and int(np.prod(t.shape, dtype=np.int64)) <= MAX_ELEMS)
    except Exception:  # noqa: BLE001 - dtype/shape unknown: do not look
        return False


def _propagate(node: gs.Node, values: dict) -> None:
    try:
        out = _eval(node, values)
    except Exception:  # noqa: BLE001 - an op we cannot reason about leaves values unknown
        return
    if out is None:
        return
    for t, v in zip(node.outputs, out):
        if v is None:
            continue
        flat = [_norm(e) for e in v.arr.ravel().tolist()]
        v.arr = np.array(flat + [None], dtype=object)[:-1].reshape(v.arr.shape)
        if v.arr.size > MAX_ELEMS:
            continue
        if any(isinstance(x, int) and not isinstance(x, bool) and not I64[0] <= x <= I64[1]
               for x in v.arr.ravel()):
            continue
        values[id(t)] = v


def _dims(t: gs.Tensor) -> list | None:
    if isinstance(t, gs.Constant):
        try:
            return list(t.shape)
        except Exception:  # noqa: BLE001
            return None
    if t.shape is None:
        return None
    out = []
    for i, d in enumerate(t.shape):
        if isinstance(d, (int, np.integer)) and d >= 0:
            out.append(int(d))
        elif isinstance(d, str) and d:
            out.append(_sym(d))
        else:
            out.append(_sym(f"{t.name}[{i}]"))
    return out


def _attr_or_input(node, attr, idx, values):
    if attr in node.attrs:
        return np.asarray(node.attrs[attr])
    if len(node.inputs) > idx and node.inputs[idx].name:
        v = _known(values, node.inputs[idx])
        if v is None or not v.concrete():
            raise ValueError("unknown")
        return v.arr.astype(np.int64)
    return None


def _eval(node: gs.Node, values: dict):  # noqa: C901 - one branch per op, flat on purpose
    op = node.op
    if node.domain not in (None, "", "ai.onnx"):
        return None
    if op == "Constant":
        v = node.attrs.get("value")
        if isinstance(v, gs.Constant):
            a = np.asarray(v.values)
        elif "value_int" in node.attrs:
            a = np.array(node.attrs["value_int"], np.int64)
        elif "value_ints" in node.attrs:
            a = np.array(node.attrs["value_ints"], np.int64)
        else:
            return None
        if a.dtype.kind not in INT_KINDS or a.size > MAX_ELEMS:
            return None
        return [_V(a.astype(object), a.dtype)]
    if op in ("Shape", "Size"):
        dims = _dims(node.inputs[0])
        if dims is None:
            return None
        if op == "Size":
            p = 1
            for d in dims:
                p = p * d
            return [_V(np.array(p, dtype=object), np.int64)]
        start = int(node.attrs.get("start", 0))
        end = node.attrs.get("end")
        sl = dims[start:] if end is None else dims[start:int(end)]
        return [_V(np.array(sl, dtype=object).reshape(len(sl)), np.int64)]
    ins = [_known(values, t) if t.name else None for t in node.inputs]
    x = ins[0] if ins else None
    if op == "Identity":
        return [x]
    if op == "ConstantOfShape":   # TF's SAME pads start from zeros of a known count
        value = node.attrs.get("value")
        a = np.asarray(value.values).ravel() if isinstance(value, gs.Constant) else \
            np.zeros(1, np.float32)
        if x is None or not x.concrete() or a.dtype.kind not in INT_KINDS:
            return None
        shape = [int(d) for d in x.arr.ravel()]
        if any(d < 0 for d in shape) or np.prod(shape, dtype=float) > MAX_ELEMS:
            return None
        return [_V(np.full(shape, a[0].item(), dtype=object), a.dtype)]
    if x is None:
        return None
    if op == "Gather":
        idx = ins[1] if len(ins) > 1 else None
        if idx is None or not idx.concrete():
            return None
        axis = int(node.attrs.get("axis", 0))
        return [_V(np.take(x.arr, idx.arr.astype(np.int64), axis=axis), x.dtype)]
    if op == "Slice":
        if "starts" in node.attrs:   # opset < 10
            starts, ends = node.attrs["starts"], node.attrs["ends"]
            axes = node.attrs.get("axes")
            steps = None
        else:
            starts = _attr_or_input(node, "-", 1, values)
            ends = _attr_or_input(node, "-", 2, values)
            axes = _attr_or_input(node, "-", 3, values)
            steps = _attr_or_input(node, "-", 4, values)
        starts, ends = list(np.ravel(starts)), list(np.ravel(ends))
        axes = list(np.ravel(axes)) if axes is not None else list(range(len(starts)))
        steps = list(np.ravel(steps)) if steps is not None else [1] * len(starts)
        sl = [slice(None)] * x.arr.ndim
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = int(a) % x.arr.ndim
            n = x.arr.shape[a]
            s, e, st = int(s), int(e), int(st)
            if st == 0:
                return None
            s = max(min(s + n if s < 0 else s, n if st > 0 else n - 1), 0 if st > 0 else -1)
            e = max(min(e + n if e < 0 else e, n if st > 0 else n - 1), 0 if st > 0 else -1)
            sl[a] = slice(s, e if e >= 0 else None, st)
        return [_V(x.arr[tuple(sl)], x.dtype)]
    if op == "Concat":
        if any(v is None for v in ins):
            return None
        axis = int(node.attrs["axis"])
        return [_V(np.concatenate([v.arr for v in ins], axis=axis), x.dtype)]
    if op in ("Unsqueeze", "Squeeze"):
        axes = _attr_or_input(node, "axes", 1, values)
        a = x.arr
        if op == "Squeeze":
            if axes is None:
                a = a.reshape([d for d in a.shape if d != 1])
            else:
                a = np.squeeze(a, axis=tuple(int(i) % a.ndim for i in np.ravel(axes)))
        else:
            r = a.ndim + len(np.ravel(axes))
            shape = list(a.shape)
            for i in sorted(int(i) % r for i in np.ravel(axes)):
                shape.insert(i, 1)
            a = a.reshape(shape)
        return [_V(a, x.dtype)]
    if op == "Reshape":
        shape = _attr_or_input(node, "shape", 1, values)
        if shape is None:
            return None
        shape = [int(s) for s in np.ravel(shape)]
        if not int(node.attrs.get("allowzero", 0)):
            shape = [x.arr.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return [_V(x.arr.reshape(shape), x.dtype)]
    if op == "Transpose":   # TF's SAME pads: a [4, 2] table transposed, then flattened
        perm = node.attrs.get("perm")
        return [_V(np.transpose(x.arr, None if perm is None else [int(p) for p in perm]),
                   x.dtype)]
    if op == "Flatten":
        axis = int(node.attrs.get("axis", 1)) % max(x.arr.ndim, 1)
        lead = int(np.prod(x.arr.shape[:axis]))
        return [_V(x.arr.reshape(lead, -1), x.dtype)]
    if op == "Cast":
        to = onnx.helper.tensor_dtype_to_np_dtype(int(node.attrs["to"]))
        if to.kind not in INT_KINDS:
            return None
        if x.concrete():
            return [_V(x.arr.astype(x.dtype).astype(to).astype(object), to)]
        if to.kind == "b" or x.dtype.kind == "b":
            return None
        return [_V(x.arr, to)]   # integer -> integer: symbolic dims fit any int type
    if op in ("Neg", "Abs", "Not"):
        if op == "Not":
            return [_V(np.vectorize(lambda a: not a if isinstance(a, bool) else None,
                                    otypes=[object])(x.arr), np.bool_)] if x.concrete() else None
        f = (lambda a: -a) if op == "Neg" else _abs
        return [_V(np.vectorize(f, otypes=[object])(x.arr), x.dtype)]
    if op in _BINARY:
        y = ins[1] if len(ins) > 1 else None
        if y is None:
            return None
        f, out_dtype = _BINARY[op]
        a, b = np.broadcast_arrays(x.arr, y.arr)
        r = np.empty(a.shape, dtype=object)
        for i in np.ndindex(a.shape):
            v = f(a[i], b[i])
            if v is None:
                return None
            r[i] = v
        return [_V(r, out_dtype or x.dtype)]
    if op == "Where":
        if len(ins) < 3 or any(v is None for v in ins) or not x.concrete():
            return None
        c, a, b = np.broadcast_arrays(x.arr, ins[1].arr, ins[2].arr)
        return [_V(np.where(c.astype(bool), a, b), ins[1].dtype)]
    if op in ("Max", "Min") and all(v is not None for v in ins):
        r = ins[0].arr
        for v in ins[1:]:
            a, b = np.broadcast_arrays(r, v.arr)
            r = np.empty(a.shape, dtype=object)
            for i in np.ndindex(a.shape):
                m = _max(a[i], b[i]) if op == "Max" else _min(a[i], b[i])
                if m is None:
                    return None
                r[i] = m
        return [_V(r, x.dtype)]
    return None


def _abs(a):
    if isinstance(a, int):
        return abs(a)
    return a if getattr(a, "is_nonnegative", False) else None


def _div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q
    if isinstance(b, int) and b > 0 and getattr(a, "is_nonnegative", False):
        import sympy

        return sympy.floor(a / b)
    return None


def _decide(rel):
    """A sympy relation -> bool, or None when sympy cannot decide it."""
    import sympy

    if isinstance(rel, bool):
        return rel
    if rel is sympy.true or rel is sympy.false:
        return bool(rel)
    return None


@functools.lru_cache(maxsize=4096)
def _simplify(d):
    """sympy.simplify, remembered: a channel shuffle compares the same dims again and again
    (TorchScript's ShuffleNet V2: 1134 calls, 235 distinct, 5.5 of 6.8 s in fold-shapes)."""
    import sympy

    return sympy.simplify(d)


def _cmp(kind):
    def f(a, b):
        import sympy

        if isinstance(a, (int, bool)) and isinstance(b, (int, bool)):
            return {"eq": a == b, "lt": a < b, "gt": a > b, "le": a <= b, "ge": a >= b}[kind]
        if kind == "eq":
            d = sympy.expand(a - b)
            if d != 0 and not d.is_number and not d.is_polynomial():
                d = _simplify(d)   # a polynomial, expanded, is 0 or not: nothing to simplify
            return True if d == 0 else (False if d.is_nonzero else None)
        rel = {"lt": sympy.Lt, "gt": sympy.Gt, "le": sympy.Le, "ge": sympy.Ge}[kind](a, b)
        return _decide(rel)
    return f


def _logic(kind):
    def f(a, b):
        if isinstance(a, bool) and isinstance(b, bool):
            return (a and b) if kind == "and" else (a or b)
        return None
    return f


def _max(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    ge = _cmp("ge")(a, b)
    return None if ge is None else (a if ge else b)


def _min(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    le = _cmp("le")(a, b)
    return None if le is None else (a if le else b)


def _arith(f):
    def g(a, b):
        if isinstance(a, bool) or isinstance(b, bool):
            return None
        return f(a, b)
    return g


_BINARY = {
    "Add": (_arith(lambda a, b: a + b), None),
    "Sub": (_arith(lambda a, b: a - b), None),
    "Mul": (_arith(lambda a, b: a * b), None),
    "Div": (_arith(_div), None),
    "Equal": (_cmp("eq"), np.bool_),
    "Less": (_cmp("lt"), np.bool_),
    "Greater": (_cmp("gt"), np.bool_),
    "LessOrEqual": (_cmp("le"), np.bool_),
    "GreaterOrEqual": (_cmp("ge"), np.bool_),
    "And": (_logic("and"), np.bool_),
    "Or": (_logic("or"), np.bool_),
}


def _foldable(node: gs.Node, values: dict, graph_outputs: set[int]) -> bool:
    if any(id(t) in graph_outputs for t in node.outputs):
        return False
    for t in node.outputs:
        v = values.get(id(t))
        if v is None or not v.concrete():
            return False
    return True


def _copy_dims(node: gs.Node, values: dict, namer, g: gs.Graph | None = None) -> str | None:
    """Reshape(x, shape) whose symbolic entries are x's own dims at the same positions:
    those entries become 0 ("copy the input's dim"), and the shape a constant. Where they
    are x's dims at other positions, in order, :func:`_realign` moves them first. The kind
    of rewrite, or None."""
    if len(node.inputs) < 2 or isinstance(node.inputs[1], gs.Constant):
        return None
    v = values.get(id(node.inputs[1]))
    if v is None or v.concrete() or v.arr.ndim != 1:
        return None
    entries = [_norm(e) for e in v.arr.tolist()]   # numpy or sympy integers -> int
    dims = _dims(node.inputs[0])
    if dims is None or int(node.attrs.get("allowzero", 0)):   # allowzero: 0 is a zero
        return _infer_one(node, entries, namer)
    new = []
    for i, e in enumerate(entries):
        if isinstance(e, int):
            new.append(e)
        elif i < len(dims) and _cmp("eq")(e, dims[i]) is True:
            new.append(0)
        else:
            kind = _realign(node, entries, dims, namer, g) if g is not None else None
            return kind or _infer_one(node, entries, namer)
    name = namer(f"{node.inputs[1].name}_copydims") if namer else node.inputs[1].name + "_c"
    node.inputs[1] = gs.Constant(name, np.array(new, np.int64))
    return "reshape-dims-copied"


def _infer_one(node: gs.Node, entries: list, namer) -> str | None:
    """Reshape(x, shape) whose target has one symbolic entry and positive integers
    everywhere else: that entry becomes -1, and the shape a constant. Wherever the original
    Reshape runs, -1 gives that entry's value: the element count divided by the other
    entries' product, which is never 0 (a 0 or -1 the entry takes at run time means "copy"
    or "infer" there, and comes out the same; with allowzero a 0 is a zero, and the count
    is 0 then). Not with a 0 or -1 among the other entries: [0, 4, 16, -1] fails on an
    empty tensor. A literal -1 beside the symbolic entry is first the size shape inference
    gave that axis of the output ([N, -1, 1024] -> [N, 192, 1024] -> [-1, 192, 1024], torch's
    dynamo exports of attention blocks): the same count divided by the same product."""
    sym = [i for i, e in enumerate(entries) if not isinstance(e, int)]
    inferred = [i for i, e in enumerate(entries) if isinstance(e, int) and e == -1]
    out = node.outputs[0].shape
    if len(sym) == 1 and len(inferred) == 1 and out is not None and len(out) == len(entries):
        k = out[inferred[0]]
        if isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k > 0:
            entries = list(entries)
            entries[inferred[0]] = int(k)
    if len(sym) != 1 or any(isinstance(e, int) and e <= 0 for e in entries):
        return None
    new = [-1 if i == sym[0] else e for i, e in enumerate(entries)]
    name = namer(f"{node.inputs[1].name}_inferred") if namer else node.inputs[1].name + "_i"
    node.inputs[1] = gs.Constant(name, np.array(new, np.int64))
    return "reshape-dim-inferred"


def _realign(node: gs.Node, entries: list, dims: list, namer, g: gs.Graph) -> str | None:
    """Reshape(x, shape) whose symbolic entries are x's symbolic dims in the same order but
    at other positions, e.g. [N, 64, A] -> [N, 4, 16, A]: an Unsqueeze (or a Squeeze of
    static 1s) first puts each at its output position, then the Reshape copies it (0):
    Reshape(Unsqueeze(x, [2]), [0, 4, 16, 0]). onnxruntime writes [0, 4, 16, -1], which
    fails on an empty tensor (N = 0: -1 cannot be inferred); a 0 never does. When the
    moved tensor is the output already (a Reshape that only adds or drops unit dims), the
    Unsqueeze or Squeeze replaces the Reshape."""
    if any(isinstance(e, int) and e <= 0 for e in entries):
        return None   # -1 or a literal copy: left as it is
    eq = _cmp("eq")
    sym = [(q, e) for q, e in enumerate(entries) if not isinstance(e, int)]
    pos = []
    for _, e in sym:
        at = [p for p, d in enumerate(dims) if not isinstance(d, int) and eq(e, d) is True]
        if len(at) != 1:
            return None
        pos.append(at[0])
    if any(a >= b for a, b in zip(pos, pos[1:])):
        return None
    shift = [q - p for (q, _), p in zip(sym, pos)]
    axes: list[int] = []
    x = node.inputs[0]
    shape = list(x.shape)
    if all(s >= 0 for s in shift) and shift == sorted(shift):
        op, before = "Unsqueeze", 0
        for (q, _), s in zip(sym, shift):
            axes += range(q - (s - before), q)   # output positions of the new unit axes
            before = s
        for a in axes:
            shape.insert(a, 1)
            dims = dims[:a] + [1] + dims[a:]
    elif all(s <= 0 for s in shift) and shift == sorted(shift, reverse=True):
        op, before, lo = "Squeeze", 0, 0
        for p, s in zip(pos, shift):
            ones = [i for i in range(lo, p) if dims[i] == 1 and i not in axes]
            if len(ones) < before - s:
                return None
            axes += ones[:before - s]
            before, lo = s, p + 1
        shape = [d for i, d in enumerate(shape) if i not in axes]
        dims = [d for i, d in enumerate(dims) if i not in axes]
    else:
        return None
    out = node.outputs[0]
    exact = len(dims) == len(entries) and all(
        (a == b) if isinstance(b, int) else (not isinstance(a, int) and eq(a, b) is True)
        for a, b in zip(dims, entries))
    axes_t = gs.Constant(namer(f"{node.name or out.name}_axes") if namer else out.name + "_axes",
                         np.array(sorted(axes), np.int64))
    if exact:   # the Reshape itself becomes the Unsqueeze/Squeeze
        node.op, node.attrs = op, {}
        _set_axes(node, axes_t, g.opset)
        return f"reshape-as-{op.lower()}"
    moved = gs.Variable(namer(f"{x.name}_{op.lower()}") if namer else x.name + "_m",
                        dtype=x.dtype, shape=shape)
    extra = gs.Node(op, name=namer(f"{node.name or out.name}_{op.lower()}") if namer else "",
                    inputs=[x], outputs=[moved])
    _set_axes(extra, axes_t, g.opset)
    g.nodes.append(extra)
    node.inputs[0] = moved
    new = [0 if not isinstance(e, int) else e for e in entries]
    name = namer(f"{node.inputs[1].name}_copydims") if namer else node.inputs[1].name + "_c"
    node.inputs[1] = gs.Constant(name, np.array(new, np.int64))
    return f"reshape-dims-{op.lower()}d"


def _set_axes(node: gs.Node, axes: gs.Constant, opset: int) -> None:
    """Unsqueeze/Squeeze axes: an input from opset 13, an attribute before."""
    while len(node.inputs) > 1:
        node.inputs.pop()
    if opset >= 13:
        node.inputs.append(axes)
    else:
        node.attrs["axes"] = [int(a) for a in axes.values]


def _reshape_out_shape(node: gs.Node) -> bool:
    """Shape inference ran before the target shape was known: fill in the output's shape
    from the now-constant target, so passes after this one (MatMul + Add -> Gemm needs the
    rank) see it. Only where the output's shape was unknown; True if it was filled."""
    y = node.outputs[0]
    if y.shape is not None or len(node.inputs) < 2 or not isinstance(node.inputs[1], gs.Constant):
        return False
    x = node.inputs[0]
    target = [int(v) for v in np.ravel(node.inputs[1].values)]
    allow = int(node.attrs.get("allowzero", 0))
    out = []
    for i, v in enumerate(target):
        if v == 0 and not allow:
            out.append(x.shape[i] if x.shape is not None and i < len(x.shape) else None)
        else:
            out.append(None if v < 0 else v)
    y.shape = out
    return True


# --- If with a known condition ------------------------------------------------------------

def _inline_if(node: gs.Node, g: gs.Graph, cond: bool, graph_outputs: set[int],
               namer) -> str | None:
    branch = node.attrs.get("then_branch" if cond else "else_branch")
    if not isinstance(branch, gs.Graph) or len(branch.outputs) != len(node.outputs):
        return "if-malformed"
    if any(t.name == "" for t in branch.outputs):
        return "if-malformed"
    outer = g.tensors()
    # A branch output named as the If's output at its place becomes that output (optimum's
    # merged decoders name them so); any other name the enclosing graph has is renamed.
    clash = [t for name, t in branch.tensors().items()
             if name in outer and outer[name] is not t and not any(
                 t is bo and io.name == name for bo, io in zip(branch.outputs, node.outputs))]
    for t in clash:
        t.name = namer(t.name)
    own = {id(n) for n in branch.nodes}
    outs = list(node.outputs)
    node.outputs.clear()
    node.inputs.clear()
    done: dict[int, gs.Tensor] = {}
    for bo, io in zip(branch.outputs, outs):
        producer = bo.inputs[0] if bo.inputs else None
        if id(bo) in done:
            src = done[id(bo)]
        elif producer is not None and id(producer) in own:
            # The branch's producer now writes the If's output name directly.
            for consumer in list(bo.outputs):
                for i, t in enumerate(consumer.inputs):
                    if t is bo:
                        consumer.inputs[i] = io
            k = next(i for i, t in enumerate(producer.outputs) if t is bo)
            producer.outputs[k] = io
            done[id(bo)] = io
            continue
        else:
            src = bo   # an outer tensor or a constant passes straight through
        if id(io) in graph_outputs:
            g.nodes.append(gs.Node("Identity", inputs=[src], outputs=[io]))
        else:
            for consumer in list(io.outputs):
                for i, t in enumerate(consumer.inputs):
                    if t is io:
                        consumer.inputs[i] = src
    pos = next((i for i, n in enumerate(g.nodes) if n is node), len(g.nodes))
    g.nodes[pos:pos] = list(branch.nodes)
    branch.nodes.clear()
    return None
