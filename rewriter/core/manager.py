"""Run a pipeline of passes: phase-order check, run, cleanup, structural check, record.

After every pass that changed the graph: dead nodes are removed, nodes are sorted
topologically (subgraphs too) and tensor names are checked for duplicates. If a callback is
given (verification), it runs too, so a numeric break is blamed on the pass that caused it.
A pass that raises becomes a PassError naming it and the passes before it.
"""

from __future__ import annotations

import time
from typing import Callable

import onnx_graphsurgeon as gs

from rewriter.core.errors import PassError, PreconditionError, RewriteError
from rewriter.core.graph import dead_code, iter_graphs, toposort
from rewriter.core.pass_base import Context, Pass, Phase
from rewriter.core.report import PassRecord


def count_nodes(graph: gs.Graph) -> int:
    return sum(len(g.nodes) for g in iter_graphs(graph))


def check_order(passes: list[Pass]) -> None:
    """Refuse pipelines that go backwards in phase (e.g. fusing after QDQ insertion)."""
    last = None
    for p in passes:
        if p.phase is Phase.CLEANUP:
            continue
        if last is not None and p.phase < last.phase:
            raise PreconditionError(
                f"pass '{p.name}' ({p.phase.name.lower()}) cannot run after "
                f"'{last.name}' ({last.phase.name.lower()}): the pipeline must not go backwards")
        last = p


def cleanup(graph: gs.Graph) -> None:
    dead_code(graph)
    toposort(graph)
    for g in iter_graphs(graph):
        g.tensors(check_duplicates=True)


def run_pipeline(graph: gs.Graph, passes: list[Pass], ctx: Context,
                 after_change: Callable[[Pass, PassRecord, list[PassRecord]], None] | None = None,
                 before: list[str] | None = None, idle: set[int] | None = None
                 ) -> list[PassRecord]:
    """Run ``passes`` in order; ``before`` names passes that already ran (for errors).
    ``idle`` (run_rounds'): the indices of the passes whose last run changed nothing and
    after which nothing changed: each is skipped, kept up to date here."""
    check_order(passes)
    records: list[PassRecord] = []
    before = list(before or [])
    # Counted again only after a pass that changed the graph: each count walks every node
    # (76 counts, 0.1 s of a chain of 4,000 Conv+BN+Relu's two rounds).
    nodes = count_nodes(graph)
    for i, p in enumerate(passes):
        if idle is not None and i in idle:
            continue
        nodes_before = nodes
        t0 = time.perf_counter()
        try:
            p.requires(graph, ctx)
            result = p.run(graph, ctx)
            if result.changed:
                cleanup(graph)
        except RewriteError:
            raise
        except Exception as e:  # a bug in the pass, not the user's fault
            raise PassError(p.name, before + [q.name for q in passes[:i]], e) from e
        seconds = time.perf_counter() - t0
        if result.changed:
            nodes = count_nodes(graph)
        rec = PassRecord(p.name, seconds, nodes_before, nodes, result.changed,
                         dict(result.counts), list(result.notes), list(result.rows))
        records.append(rec)
        if idle is not None:
            if result.changed:
                idle.clear()   # every other pass now reads a graph it has not seen
            else:
                idle.add(i)
        if result.changed and after_change is not None:
            after_change(p, rec, records)
    return records


# Rounds of a pipeline at most (run_rounds). Most models need 2; Swin needed 5 (each round
# unlocks the next stage's shape folding: 630 nodes after 4 rounds, 588 after 5, eleventh
# round). A round that changes nothing ends it, so the cap costs nothing where unused.
ROUNDS = 16


def run_rounds(graph: gs.Graph, passes: list[Pass], ctx: Context,
               after_change: Callable[[Pass, PassRecord, list[PassRecord]], None] | None = None,
               refresh: Callable[[int], None] | None = None) -> list[PassRecord]:
    """:func:`run_pipeline` again while a round changes the graph, at most ROUNDS in all:
    what one round made static (an inlined If, a folded Reshape) lets the next remove
    more, so a rewritten model rewritten again is unchanged. ``refresh(k)`` runs before
    round k > 1 (shape inference again). The records are the first round's and the
    later rounds' passes that changed the graph, marked with their round;
    ``after_change`` sees them all.

    A later round skips a pass whose last run changed nothing when no pass changed the
    graph since: it would read the graph it found nothing in. On the 4,000-block chain,
    where only fuse-conv-bn changes, the second round's 0.16-0.18 s ran all 21 passes
    again. With ``refresh`` (shapes inferred again) every pass runs: new shapes are news."""
    idle: set[int] = set()
    records = run_pipeline(graph, passes, ctx, after_change, idle=idle)
    last = records
    for k in range(2, ROUNDS + 1):
        if not any(r.changed for r in last):
            break
        if refresh is not None:
            refresh(k)
            idle.clear()
        done = list(records)
        after = None if after_change is None else \
            (lambda p, rec, recs: after_change(p, rec, done + recs))
        last = run_pipeline(graph, passes, ctx, after, before=[r.name for r in done],
                            idle=idle)
        for r in last:
            r.round = k
        records = done + [r for r in last if r.changed]
    return records
