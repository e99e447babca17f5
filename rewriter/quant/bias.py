"""Bias correction's measuring: the INT8 layers' per-channel output means on the calibration
data, one group of layers (a level) after another, each run only from where the groups
before it left off.

The API corrects the groups in order: group k is measured on the model with groups 0..k-1
corrected, then corrected. Measuring each group on the whole upstream model again ran the
first layers once per level (U2-Net-p, 114 levels deep: not done after 30 minutes). Here a
tensor is *final* at step k when every INT8 layer upstream of it is in a group before k: its
value no longer changes, so it is fetched once, kept per calibration batch, and the later
steps start from it::

    step k runs   [final tensors kept from steps < k] -> ... -> group k's layers
    and keeps     the final tensors it computed that a later step reads

Only the group-(k-1) layers and what follows them up to group k run again (they changed
when group k-1 was corrected), so the data passes through the model at most about twice in
all, not once per level (U2-Net-p: 585 node runs a batch over 112 levels, for a model of
1078 nodes; from the inputs each time, 238 s against 13 s of measuring on 8 batches).
The values are the ones the whole-model run gives: the same nodes run on the same inputs
in onnxruntime with graph optimisations off.

Memory: a kept tensor is dropped as soon as no later step reads it (walking up from the
later groups' layers, stopping at kept tensors, does not reach it), so what is held is the
boundary between the corrected and the uncorrected part of the model, times the batches
(at most 6.2 MiB a batch on YuNet at 320x320, 25 MiB on U2-Net-p). Past ``memory_bytes``
(default 1 GiB: U2-Net-p's 38 batches fit) further batches are written to .npy files in a
temporary folder and read back, the same bytes, at the disk's speed (U2-Net-p with 256 MiB
wrote 8.6 GB over its 112 levels). A node with a body (If/Loop/Scan) reads what its node
lists and the outer names its bodies read (core.graph.node_reads): both count as its
inputs, here and in the cut sub-models (Faster R-CNN's RPN If, before its INT8 box head,
reads three tensors from outside). A body only after the layers (a detector's NMS
post-processing: SSDlite's one If) is never run by a step. Anything unexpected (a layer
inside a body, nodes out of order) is measured the old way: the model cut to the group's
ancestors, run from the inputs.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

from rewriter.core.errors import InputError
from rewriter.core.graph import cut_model, node_reads
from rewriter.core.progress import progress_bar

MEMORY_BYTES = 1 << 30


class LevelMeasure:
    """Measure ``groups`` (lists of INT8 layer output names) one after another: call
    :meth:`step` with k = 0, 1, ... and the model as corrected so far; each returns the
    per-channel means of group k's tensors. Use as a context manager (the spill folder is
    removed on exit). ``stats`` counts what ran, for reports and tests."""

    def __init__(self, groups: list[list[str]], data, progress: bool = False,
                 memory_bytes: int | None = None):
        self.groups = [list(g) for g in groups]
        self.group_of = {t: k for k, g in enumerate(self.groups) for t in g}
        self.data, self.progress = data, progress
        self.store = _Store(MEMORY_BYTES if memory_bytes is None else memory_bytes)
        self.stats = {"steps": 0, "whole": 0, "nodes_run": 0, "peak_bytes": 0,
                      "spilled_bytes": 0}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.store.close()

    def step(self, exported, k: int) -> dict[str, np.ndarray]:
        """Per-channel means of group k's tensors on ``exported`` (an Exported: groups
        before k corrected, the ones from k on not yet)."""
        from rewriter.quant.data import CalibrationData, load_calibration

        proto = exported.model
        if not isinstance(self.data, CalibrationData):
            self.data = load_calibration(self.data, proto)
        self.stats["steps"] += 1
        plan = _plan(proto, self.groups, self.group_of, k, self.store)
        if plan is None:
            self.store.clear()   # nothing kept can be trusted past an unusual model
            return self._whole(exported, k)
        nodes, feeds_kept, feeds_data, keep, drop = plan
        self.stats["nodes_run"] += len(nodes) * len(self.data)
        fetch = [n for n in keep if n not in feeds_data]
        names = self.groups[k] + fetch
        sub = cut_model(proto, names, {n: self.store.dtype[n] for n in feeds_kept})
        held = {t.name for t in sub.graph.initializer}
        inits = ([n for n in sorted(exported.weights) if n in held],)
        inits += ([np.ascontiguousarray(exported.array(n)) for n in inits[0]],)
        from rewriter.quant.ranges import _augmented_session, _ChannelReducer
        sess = _augmented_session(sub, [], exported.source_dir, inits)
        reducer = _ChannelReducer()
        gone = [n for n in feeds_kept if n in drop]
        stream = iter(self.data) if feeds_data else None
        bar = progress_bar(self.progress, total=len(self.data),
                           desc=f"bias correction {k + 1}/{len(self.groups)}", unit="batch")
        try:
            for i in range(len(self.data)):
                feeds = {n: self.store.get(n, i) for n in feeds_kept}
                for n in gone:   # read for the last time: freed before the next batch
                    self.store.drop(n, i)
                if stream is not None:
                    given = next(stream)
                    feeds.update({n: given[n] for n in feeds_data})
                    for n in keep:   # graph inputs a later step reads, as they were fed
                        if n in feeds_data:
                            self.store.put(n, i, given[n])
                outs = sess.run(names, feeds)
                for n, a in zip(names, outs):
                    if n in self.group_of and self.group_of[n] == k:
                        reducer.update(n, a)
                    else:
                        self.store.put(n, i, a)
                bar.update(1)
        finally:
            bar.close()
        del sess
        for n in drop:
            self.store.drop(n)
        self.stats["peak_bytes"] = max(self.stats["peak_bytes"], self.store.peak)
        self.stats["spilled_bytes"] = self.store.spilled
        reducer.finish(self.groups[k], False)
        return {n: reducer.result[n].mean for n in self.groups[k]}

    def _whole(self, exported, k: int) -> dict[str, np.ndarray]:
        """The old way: the model cut to group k's ancestors, run from the inputs."""
        from rewriter.core.graph import keep_only_upstream
        from rewriter.quant.ranges import channel_stats

        self.stats["whole"] += 1
        part = self.groups[k]
        keep_only_upstream(exported.model, part)
        got = channel_stats(exported.model, part, self.data, base_dir=exported.source_dir,
                            initializers=exported.ort_initializers(), progress=self.progress)
        return {n: got[n].mean for n in part}


def _plan(proto, groups, group_of, k: int, store):
    """What step k runs: (nodes in order, kept tensors it reads, graph inputs it reads,
    tensors to fetch and keep, kept tensors to drop after it); None when the model is
    not one this handles (a layer not produced at the top level, nodes out of order)."""
    g = proto.graph
    producer: dict[str, int] = {}
    reads = [node_reads(n) for n in g.node]   # a body's outer reads count as its node's
    for i, n in enumerate(g.node):
        for o in n.output:
            if o:
                producer[o] = i
    inputs = {i.name for i in g.input} - {t.name for t in g.initializer}
    # depth[t]: 1 + the last group with a layer upstream of t (t included), 0 for none.
    # t is final at step k when depth[t] <= k. Needs nodes in topological order.
    # live: computed from the graph inputs. Constant-only tensors (weights in Constant
    # nodes, PicoDet's) are recomputed where needed, never kept once per batch.
    depth: dict[str, int] = {}
    live = set(inputs)
    for i, n in enumerate(g.node):
        up = 0
        for x in reads[i]:
            if x in producer and producer[x] >= i:
                return None
            up = max(up, depth.get(x, 0))
        on = any(x in live for x in reads[i])
        for o in n.output:
            depth[o] = max(up, group_of[o] + 1) if o in group_of else up
            if on:
                live.add(o)
    if any(t not in producer for grp in groups[k:] for t in grp):
        return None
    for name in list(store.names()):
        if depth.get(name, 0) > store.depth[name] or (name not in producer
                                                      and name not in inputs):
            store.drop(name)   # the model changed above it: not the value kept

    def walk(starts, stop):
        """Nodes (indices) that compute ``starts`` from ``stop`` and the graph inputs,
        and the tensors of ``stop`` reached."""
        seen, reached, todo = set(), set(), list(starts)
        while todo:
            t = todo.pop()
            if t in stop:
                reached.add(t)
                continue
            i = producer.get(t)
            if i is None or i in seen:
                if t in inputs:
                    reached.add(t)
                continue
            seen.add(i)
            todo.extend(x for x in reads[i] if x)
        return sorted(seen), reached

    kept = set(store.names())
    nodes, reached = walk(groups[k], kept)
    feeds_kept = sorted(reached & kept)
    feeds_data = sorted(reached - kept)
    final = {o for i in nodes for o in g.node[i].output if o in live and depth[o] <= k}
    later = [t for grp in groups[k + 1:] for t in grp]
    _, future = walk(later, kept | final | set(feeds_data))
    keep = sorted((final | set(feeds_data)) & future)
    drop = sorted(kept - future)
    for t in keep:
        store.depth[t] = depth.get(t, 0)
    return nodes, feeds_kept, feeds_data, keep, drop


class _Store:
    """Arrays by (tensor name, batch index): in memory up to ``budget`` bytes in all, then
    in .npy files in a temporary folder. ``peak`` is the most bytes held in memory."""

    def __init__(self, budget: int):
        self.budget, self.mem, self.files = budget, {}, {}
        self.dtype: dict[str, np.dtype] = {}
        self.depth: dict[str, int] = {}
        self.used = self.peak = self.spilled = self.written = 0
        self.dir: Path | None = None

    def names(self):
        return self.dtype.keys()

    def put(self, name: str, i: int, a: np.ndarray) -> None:
        # A copy: onnxruntime's outputs live in its session's arena, which a kept output
        # pins, arena and all (YuNet: peak RSS 806 MiB for 237 MiB kept).
        a = np.array(a, copy=True)
        self.dtype.setdefault(name, a.dtype)
        if self.used + a.nbytes <= self.budget:
            self.mem[name, i] = a
            self.used += a.nbytes
            self.peak = max(self.peak, self.used)
            return
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix="rewrite-bias-"))
        self.written += 1   # not len(files): names freed by drop() would be reused
        path = self.dir / f"{self.written}.npy"
        np.save(path, a, allow_pickle=False)
        self.files[name, i] = path
        self.spilled += a.nbytes

    def get(self, name: str, i: int) -> np.ndarray:
        if (name, i) in self.mem:
            return self.mem[name, i]
        try:
            return np.load(self.files[name, i], allow_pickle=False)
        except KeyError:
            raise InputError(f"bias correction: no kept value of '{name}' for batch {i} "
                             "(the calibration data changed length?)") from None

    def drop(self, name: str, i: int | None = None) -> None:
        """Forget ``name`` (at batch ``i`` only, when given)."""
        if i is not None:
            keys = [(name, i)]
        else:
            keys = [key for key in [*self.mem, *self.files] if key[0] == name]
            self.dtype.pop(name, None)
            self.depth.pop(name, None)
        for key in keys:
            if key in self.mem:
                self.used -= self.mem.pop(key).nbytes
            elif key in self.files:
                self.files.pop(key).unlink(missing_ok=True)

    def clear(self) -> None:
        for name in list(self.dtype):
            self.drop(name)

    def close(self) -> None:
        self.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

