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
                 before: list[str] | None = None) -> list[PassRecord]:
    """Run ``passes`` in order; ``before`` names passes that already ran (for errors)."""
    check_order(passes)
    records: list[PassRecord] = []
    before = list(before or [])
    for i, p in enumerate(passes):
        nodes_before = count_nodes(graph)
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
        rec = PassRecord(p.name, time.perf_counter() - t0, nodes_before, count_nodes(graph),
                         result.changed, dict(result.counts), list(result.notes),
                         list(result.rows))
        records.append(rec)
        if result.changed and after_change is not None:
            after_change(p, rec, records)
    return records
