"""merge-duplicates: common-subexpression elimination, constants and nodes.

Before -> after::

    W1 = W2 (equal values) -> two initializers        =>   one initializer, both readers
    a = Mul(x, s); b = Mul(x, s)                        =>   a = Mul(x, s); b's readers read a
    c1 = Conv(x, W); c2 = Conv(x, W)   (parallel convs) =>   one Conv

Constants are equal when dtype, shape and bytes are (sampled, hashed, then compared). Nodes are equal
when op, domain, attributes and inputs (after earlier merges, so chains collapse in one
topological sweep) are, and they have the same number of outputs. Every graph is done,
If/Loop/Scan bodies included.

Never merged: random ops (each draws anew), nodes with subgraphs, two nodes whose outputs
are both graph outputs (the interface keeps its tensors; with one, that node stays and
the other's readers read it), constants that are graph outputs, constants above 256 MiB
(hashing them would cost more than they save).
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, peek_values
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

RANDOM = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
          "Multinomial", "Bernoulli", "Dropout"}
MAX_HASH_BYTES = 256 << 20


class MergeDuplicates(Pass):
    name = "merge-duplicates"
    phase = Phase.CLEANUP      # runs anywhere in a pipeline; the default puts it last
    numerics = Numerics.EXACT
    summary = "merge equal constants and identical nodes on identical inputs (CSE)"

    shape_ops = ()

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            outs = {id(t) for t in g.outputs}
            n = _merge_constants(g, outs)
            m = _merge_nodes(g, outs)
            res.count("merged-constants", n)
            res.count("merged-nodes", m)
            res.changed = res.changed or bool(n or m)
        return res


def _rewire(old: gs.Tensor, new: gs.Tensor) -> None:
    """Every reader of ``old`` reads ``new`` (subgraph readers included: gs keeps one
    tensor object per name across scopes)."""
    for node in list(old.outputs):
        for i, t in enumerate(node.inputs):
            if t is old:
                node.inputs[i] = new


def _merge_constants(g: gs.Graph, outs: set[int]) -> int:
    # Candidates share dtype and shape (known without reading); only those are read, and
    # through peek_values, so that a memory-mapped weight stays on disk.
    groups: dict[tuple, list[gs.Constant]] = {}
    for t in g.tensors().values():
        if not isinstance(t, gs.Constant) or id(t) in outs or not t.outputs:
            continue
        try:
            key = (np.dtype(t.dtype), tuple(int(d) for d in t.shape))
        except (TypeError, ValueError):
            continue
        groups.setdefault(key, []).append(t)
    merged = 0
    for (dtype, shape), ts in groups.items():
        if len(ts) < 2 or np.dtype(dtype).kind in "OSU" or (
                int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize > MAX_HASH_BYTES):
            continue
        # A fingerprint of 33 evenly spaced elements sorts them; only constants sharing one
        # are hashed (one weight in memory at a time), and equal hashes are compared.
        buckets: dict[bytes, list] = {}   # fingerprint -> [first constant, {sha1: rep}]
        for t in ts:
            try:
                v = np.ascontiguousarray(peek_values(t))
            except Exception:  # noqa: BLE001 - unreadable lazy values: leave them
                continue
            flat = v.reshape(-1)
            fp = flat[::max(1, flat.size // 32)].tobytes()
            entry = buckets.get(fp)
            if entry is None:
                buckets[fp] = [t, None]
                continue
            if entry[1] is None:
                first = np.ascontiguousarray(peek_values(entry[0]))
                entry[1] = {hashlib.sha1(first.tobytes()).digest(): entry[0]}
            h = hashlib.sha1(v.tobytes()).digest()
            rep = entry[1].get(h)
            if rep is None:
                entry[1][h] = t
            elif rep is not t and np.array_equal(np.ascontiguousarray(peek_values(rep)), v):
                # (both through ascontiguousarray: it makes a 0-d array 1-d)
                _rewire(t, rep)
                merged += 1
    return merged


def _attr_key(v):
    if isinstance(v, gs.Constant):
        a = v.values
        return ("tensor", str(a.dtype), a.shape, hashlib.sha1(a.tobytes()).digest())
    if isinstance(v, list) and v and all(type(x) is float for x in v):
        return ("floats", np.asarray(v, np.float32).tobytes())   # one key, not one per item
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, np.ndarray):
        return ("array", str(v.dtype), v.shape, v.tobytes())
    if isinstance(v, float):
        return ("f", np.float32(v).tobytes())
    return v


def _attrs_key(node) -> tuple | None:
    """A node's attributes as one hashable key; None when one cannot be keyed."""
    try:
        attrs = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
        hash(attrs)
    except TypeError:
        return None
    return attrs


def _merge_nodes(g: gs.Graph, outs: set[int]) -> int:
    # Nodes are grouped by op and inputs first; attributes are keyed only when a second
    # node joins a group (a 194 MB TreeEnsemble's attributes took 17 s to key, tenth
    # round, with no other node to compare them with).
    seen: dict[tuple, list[list]] = {}
    merged = 0
    for node in list(g.nodes):
        if node.op in RANDOM or not node.outputs or any(
                isinstance(v, gs.Graph) or (isinstance(v, list) and v and
                                            isinstance(v[0], gs.Graph))
                for v in node.attrs.values()):
            continue
        key = (node.op, node.domain or "", tuple(id(t) for t in node.inputs),
               len(node.outputs))
        group = seen.get(key)
        if group is None:
            seen[key] = [[node, None]]
            continue
        attrs = _attrs_key(node)
        if attrs is None:
            continue
        entry = None
        for e in group:
            if e[1] is None:
                k = _attrs_key(e[0])
                e[1] = object() if k is None else k   # unhashable: equal to nothing
            if e[1] == attrs:
                entry = e
                break
        if entry is None:
            group.append([node, attrs])
            continue
        rep = entry[0]
        if any(id(t) in outs for t in node.outputs):
            if any(id(t) in outs for t in rep.outputs):
                continue   # both are the interface's
            # The graph output's node stays, and the earlier one's readers read it.
            entry[0], node, rep = node, rep, node
        for old, new in zip(node.outputs, rep.outputs):
            _rewire(old, new)
        node.inputs.clear()
        node.outputs.clear()
        merged += 1
    return merged
