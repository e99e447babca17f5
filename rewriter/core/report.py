"""The one report: what changed, what was skipped and why, how long, how close.

``Report.to_dict()`` is the JSON written by ``--report``; ``Report.render()`` is the
terminal summary (an OnnxSlim-style before/after op table, then one line per pass).
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import onnx


def op_histogram(graph: onnx.GraphProto, into: Counter | None = None) -> Counter:
    """Op types of a graph and all its subgraphs (bodies are looked for where
    core.graph.iter_graphs looks: the standard ops that have them, and foreign domains)."""
    from rewriter.core.graph import SUBGRAPH_OPS

    c = into if into is not None else Counter()
    c.update(node.op_type for node in graph.node)
    for node in graph.node:
        if node.op_type not in SUBGRAPH_OPS and node.domain in ("", "ai.onnx"):
            continue
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                op_histogram(a.g, c)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    op_histogram(g, c)
    return c


@dataclass
class PassRecord:
    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    changed: bool
    counts: dict[str, int]
    notes: list[str]
    rows: list = field(default_factory=list)
    verification: list[dict] | None = None
    round: int = 1                 # the pipeline's round (api: run to a fixed point)

    @property
    def label(self) -> str:
        return self.name if self.round == 1 else f"{self.name} #{self.round}"

    def summary(self) -> str:
        done = [f"{k} {v}" for k, v in sorted(self.counts.items()) if v and not k.startswith("skip:")]
        skips = [f"{k} {v}" for k, v in sorted(self.counts.items()) if v and k.startswith("skip:")]
        return "; ".join(done + skips) or ("changed" if self.changed else "nothing to do")


@dataclass
class Report:
    input: str
    output: str | None = None
    ops_before: Counter = field(default_factory=Counter)
    ops_after: Counter = field(default_factory=Counter)
    bytes_before: int = 0
    bytes_after: int = 0
    passes: list[PassRecord] = field(default_factory=list)
    verification: list[dict] | None = None
    verified_with: str | None = None
    failed_pass: str | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No check failed: onnxruntime's comparisons, and the MIGraphX step where it ran
        (``extra["compile"]["ok"]``, what makes the CLI exit 1 or 2 after writing; it was
        True over a model MIGraphX refused). True also when nothing was checked: see
        ``verified``."""
        return self.failed_pass is None and all(m["ok"] for m in self.verification or []) \
            and (self.extra.get("compile") or {}).get("ok", True) is not False

    @property
    def verified(self) -> bool:
        """The outputs were compared with the original (verify=True) and every one held:
        what an integrator gates on (``ok`` alone is True without any comparison)."""
        return self.verification is not None and self.ok

    def to_dict(self) -> dict:
        return {
            "input": self.input,
            "output": self.output,
            "ok": self.ok,
            "verified": self.verified,
            "ops_before": dict(sorted(self.ops_before.items())),
            "ops_after": dict(sorted(self.ops_after.items())),
            "nodes_before": sum(self.ops_before.values()),
            "nodes_after": sum(self.ops_after.values()),
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "passes": [vars(p) for p in self.passes],
            "verification": self.verification,
            "verified_with": self.verified_with,
            "failed_pass": self.failed_pass,
            "seconds": self.seconds,
            "warnings": self.warnings,
            **self.extra,
        }

    def to_json(self) -> str:
        """The JSON of :meth:`to_dict`, standard (:func:`json_text`): the SQNR of identical
        outputs, inf, is the largest float."""
        return json_text(self.to_dict())

    def render(self) -> str:
        lines = []
        ops = sorted(set(self.ops_before) | set(self.ops_after),
                     key=lambda o: (-self.ops_before.get(o, 0), o))
        w = max([len(o) for o in ops] + [10])
        lines.append(f"{'op':<{w}}  {'before':>7}  {'after':>7}")
        for o in ops:
            b, a = self.ops_before.get(o, 0), self.ops_after.get(o, 0)
            mark = "" if a == b else ("  -" if a < b else "  +")
            lines.append(f"{o:<{w}}  {b:>7}  {a:>7}{mark}")
        lines.append(f"{'nodes':<{w}}  {sum(self.ops_before.values()):>7}  "
                     f"{sum(self.ops_after.values()):>7}")
        lines.append(f"{'size':<{w}}  {_mb(self.bytes_before):>7}  {_mb(self.bytes_after):>7}")
        lines.append("")
        pw = max([len(p.label) for p in self.passes] + [4])
        for p in self.passes:
            lines.append(f"{p.label:<{pw}}  {p.seconds * 1000:7.1f} ms  "
                         f"{p.nodes_before:>5} -> {p.nodes_after:<5}  {p.summary()}")
            for n in p.notes:
                lines.append(f"{'':<{pw}}  note: {n}")
        planner = self.extra.get("planner")
        if planner and planner.get("summary"):     # --plan auto: what it chose, how sure
            lines.append("")
            lines.append(f"plan auto: {planner['summary']}")
            lines.extend(f"  note: {n}" for n in planner.get("notes", []))
        if self.verification is not None:
            lines.append("")
            lines.append(f"verify ({self.verified_with}):")
            ow = max([len(m["name"]) for m in self.verification] + [6])
            lossy = any(m.get("top1") is not None or m.get("sqnr_db", float("inf")) < 200
                        for m in self.verification)
            extra = f"  {'SQNR dB':>8}  {'top-1':>6}" if lossy else ""
            # With per-sample judgements below, the table's cosine is the pooled one: say so.
            cos = "cos pooled" if any(m.get("certificate") for m in self.verification) \
                else "cosine"
            lines.append(f"  {'output':<{ow}}  {'max_abs':>9}  {'max_rel':>9}  {cos:>10}{extra}"
                         "  ok")
            for m in self.verification:
                more = ""
                if m.get("empty"):     # shapes agree, no element to compare
                    more = f"  {'-':>8}  {'-':>6}" if lossy else ""
                    lines.append(f"  {m['name']:<{ow}}  {'-':>9}  {'-':>9}  {'-':>10}{more}  "
                                 f"{'yes' if m['ok'] else 'NO'}   (empty: nothing compared)")
                    continue
                if m.get("integer"):   # compared value by value: the share that is equal
                    if lossy:
                        more = f"  {'-':>8}  {1 - m['mismatch']:6.4f}"
                    kind = "strings" if m.get("dtype") == "object" else "integers"
                    said = "" if lossy else f"   ({kind}: {1 - m['mismatch']:.2%} equal)"
                    lines.append(f"  {m['name']:<{ow}}  {'-':>9}  {'-':>9}  {'-':>10}{more}  "
                                 f"{'yes' if m['ok'] else 'NO'}{said}")
                    continue
                if lossy:
                    top1 = "-" if m.get("top1") is None else f"{m['top1']:.4f}"
                    more = f"  {m.get('sqnr_db', float('inf')):8.1f}  {top1:>6}"
                lines.append(f"  {m['name']:<{ow}}  {m['max_abs']:9.2e}  {m['max_rel']:9.2e}  "
                             f"{m['cosine']:10.7f}{more}  {'yes' if m['ok'] else 'NO'}")
            for m in self.verification:
                if m.get("certificate"):
                    from rewriter.verify.certify import Judgement
                    lines.append("  " + Judgement(**m["certificate"]).line())
            for m in self.verification:   # judged on what its TopK/NMS/NonZero reads
                if m.get("selected"):
                    lines.append(f"  {m['name']}: selected by {m['selected']['by']}, judged on "
                                 "what it selects from:")
                    lines.extend("    " + _read_line(r) for r in m["selected"]["reads"])
                    lines.append("    its post-processing run on the original's values of "
                                 f"those: {m['selected']['replay']}")
        if self.failed_pass and self.extra.get("failed_after"):
            lines.append("verification failed after the plan's passes ("
                         + ", ".join(self.extra["failed_after"]) + ", judged together)")
        elif self.failed_pass:
            lines.append(f"verification failed after pass '{self.failed_pass}'")
        for w_ in self.warnings:
            lines.append(f"warning: {w_}")
        total = sum(self.seconds.values())
        lines.append(f"time {total:.2f} s (" + ", ".join(
            f"{k} {v:.2f}" for k, v in self.seconds.items()) + ")")
        return "\n".join(lines)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}MB" if n >= 1e5 else f"{n / 1e3:.1f}kB"


def json_text(obj, indent: int | None = 2) -> str:
    """Standard JSON of ``obj``, what every command writes (--report, `rewrite plan`'s
    files, `check --json`, `advise --json`): an inf (the SQNR of identical outputs, the
    max_rel of an output that is 0 in one and not the other) is the largest float,
    1.8e308, which keeps its order (max_rel > 1e-3 still holds); a NaN is null. Python's
    json writes ``Infinity`` and ``NaN``, which JSON.parse, Go's and Rust's readers refuse.
    Dataclasses, Counters and numpy values are written as their plain values."""
    return json.dumps(_finite(json.loads(json.dumps(obj, default=_json_default))),
                      indent=indent, allow_nan=False)


def _finite(o):
    """``o`` (what json.loads gives) with +-inf as +-the largest float and NaN as None."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None if math.isnan(o) else math.copysign(
            sys.float_info.max, o)
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o


def _json_default(o):
    import dataclasses

    if isinstance(o, Counter):
        return dict(o)
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "to_dict"):
        return o.to_dict()
    return str(o)


def _read_line(r: dict) -> str:
    """One tensor a selection reads, as judged (a metrics.OutputMetrics dict)."""
    ok = "yes" if r["ok"] else "NO"
    if r.get("certificate"):
        from rewriter.verify.certify import Judgement
        return f"{Judgement(**r['certificate']).line()}: {ok}"
    if r.get("integer"):
        return f"{r['name']}: {1 - r['mismatch']:.2%} of its integer values equal: {ok}"
    return f"{r['name']}: max_rel {r['max_rel']:.2e}, cosine {r['cosine']:.6f}: {ok}"
