"""The pass contract: what a pass is, what it gets, what it returns.

A pass edits an onnx-graphsurgeon graph in place: find -> check -> rewrite. A site that
fails its check is not an error: the check returns a kebab-case reason and the pass counts
it as ``skip:<reason>``, so the report says why a rewrite did not happen. The manager does
the rest (cleanup, toposort, structural and numeric checks); see docs/writing-a-pass.md.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any, ClassVar

import onnx_graphsurgeon as gs

from rewriter.core.graph import Namer


class Phase(IntEnum):
    """Pipeline order; the manager refuses a pipeline that goes backwards."""

    CLEANUP = 10
    FOLD = 20
    FUSE = 30
    LAYOUT = 40
    QUANTIZE = 50


class Numerics(Enum):
    """How far a pass may move the outputs; the verifier picks its tolerance from it."""

    EXACT = "exact"   # same math, only float rounding of re-associated constants
    CLOSE = "close"   # re-associated arithmetic (e.g. BN folded into weights)
    LOSSY = "lossy"   # reduced precision (fp16/int8): judged by the plan's thresholds


@dataclass
class PassResult:
    changed: bool = False
    counts: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)
    rows: list = field(default_factory=list)   # per-site detail (dataclasses), e.g. one per conv

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def skip(self, reason: str, n: int = 1) -> None:
        self.counts[f"skip:{reason}"] += n

    def outcome(self, reason: str | None, done: str) -> None:
        """One site's result: None = rewritten (count ``done``, changed), a reason = skipped
        with it, "" = the pattern does not apply (nothing to count)."""
        if reason is None:
            self.count(done)
            self.changed = True
        elif reason:
            self.skip(reason)


@dataclass
class Options:
    """Pass options, typed and checked once (the CLI's flags and the API's ``options``)."""

    fold_size_limit: int = 1 << 20     # fold-constants: results over this stay nodes ...
    fold_growth: float = 2.0           # ... when they are also this much bigger than inputs
    fold_max_bytes: int = 1 << 30      # fold-constants: never evaluate anything bigger
    strict: bool = False               # fold-constants: raise where evaluation fails
    pad_multiple: int = 4              # pad-channels: 4, 8, 16 or 32
    pad_sides: str = "both"            # pad-channels: in, out or both
    pad_max_overhead: float = 0.5      # pad-channels: largest FLOP/weight growth per conv
    migraphx_version: tuple[int, ...] | None = None   # target MIGraphX (insert-qdq's form)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, ignore: tuple[str, ...] = ()) -> "Options":
        """Options from a dict; an unknown key is an InputError naming the closest one."""
        import difflib
        from dataclasses import fields

        from rewriter.core.errors import InputError

        known = {f.name: f for f in fields(cls)}
        kw = {}
        for k, v in (d or {}).items():
            if k in ignore:
                continue
            if not isinstance(k, str) or k not in known:
                close = difflib.get_close_matches(k, list(known), n=1) \
                    if isinstance(k, str) else []
                hint = f"; did you mean '{close[0]}'?" if close else ""
                raise InputError(f"unknown option {k!r}{hint}")
            kw[k] = _checked(k, v, getattr(cls, k))
        return cls(**kw)


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """(2, 16, 0) from '2.16.0.dev+2025...', 'MIGraphX Version: 2.16.0.2025...' or '2.16'."""
    if not text:
        return None
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _checked(name: str, v: Any, default: Any) -> Any:
    """An option's value in its type (the type of its default), or InputError: a string
    for a size failed inside fold-constants, blamed on the pass (the API review)."""
    from rewriter.core.errors import InputError

    if name == "migraphx_version":
        if v is None:
            return None
        version = parse_version(v) if isinstance(v, str) else (
            tuple(int(x) for x in v) if isinstance(v, (tuple, list)) and v
            and all(isinstance(x, int) for x in v) else None)
        if version is None:
            raise InputError(f"option 'migraphx_version' {v!r}: 'X.Y' or a tuple like (2, 16)")
        return version
    kind = type(default)
    ok = (isinstance(v, bool) if kind is bool else
          isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else
          isinstance(v, int) and not isinstance(v, bool) if kind is int else
          isinstance(v, kind))
    if not ok:
        raise InputError(f"option {name!r} {v!r}: expected {kind.__name__}")
    if kind in (int, float) and v < 0:
        raise InputError(f"option {name!r} {v!r}: 0 or more")
    return kind(v)


@dataclass
class Context:
    """What a pass may know beyond the graph: its options and precomputed facts.

    Passes stay pure graph transforms; what needs running the model (calibration ranges,
    sensitivities) is computed before them and handed in here.
    """

    options: Options = field(default_factory=Options)
    namer: Namer | None = None
    plan: Any = None                   # rewriter.quant.plan.Plan, for insert-qdq/convert-fp16
    assignment: Any = None             # rewriter.quant.plan.Assignment: a precision per layer
    ranges: dict[str, float] = field(default_factory=dict)   # activation amax per tensor
    fp16_ranges: dict[str, float] = field(default_factory=dict)  # max |x| at FP16 layers
    channel_stats: dict[str, Any] = field(default_factory=dict)  # tensor -> ChannelStats
    bias_shift: dict[str, Any] = field(default_factory=dict)     # layer -> per-channel shift
    hessians: dict[str, Any] = field(default_factory=dict)       # conv -> E[x x^T] per group
    # Rounded weights by (layer, weight, form): the planner builds many plans from one
    # graph and shares this dict, so a layer's GPTQ rounding runs once.
    weight_cache: dict[tuple, Any] = field(default_factory=dict)
    progress: bool = False             # a bar on stderr (a terminal) for long passes


class Pass:
    """Base class. Subclasses set ``name``, ``phase``, ``numerics``, ``summary`` and ``run``."""

    name: ClassVar[str] = ""
    phase: ClassVar[Phase] = Phase.CLEANUP
    numerics: ClassVar[Numerics] = Numerics.EXACT
    summary: ClassVar[str] = ""

    #: Ops (in any graph or body) whose presence means the pass reads inferred shapes;
    #: ``()``: never; None: always, the safe default. Override needs_shapes for subtler rules.
    shape_ops: tuple[str, ...] | None = None

    def needs_shapes(self, model) -> bool:
        """Does this pass need inferred shapes/dtypes on ``model`` (an onnx.ModelProto)?
        Shape inference costs time and memory on long graphs, so passes that can tell
        they do not need it say so (``shape_ops``); the default is the safe answer."""
        if not self.shape_ops:
            return self.shape_ops is None
        from rewriter.core.report import op_histogram

        return self._uses_shape_ops(op_histogram(model.graph))

    def _uses_shape_ops(self, ops) -> bool:
        return self.shape_ops is None or any(ops.get(o) for o in self.shape_ops)

    def requires(self, graph: gs.Graph, ctx: Context) -> None:
        """Raise PreconditionError when the graph is not fit for this pass."""

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:  # pragma: no cover
        raise NotImplementedError


def pipeline_needs_shapes(passes, model) -> bool:
    """Whether any of ``passes`` needs inferred shapes on ``model``: the op histogram is
    counted once for every pass that keeps the ``shape_ops`` rule (on a 12,000-node model
    each count is 15-25 ms); passes with their own rule are asked."""
    from rewriter.core.report import op_histogram

    ops = None
    for p in passes:
        if type(p).needs_shapes is Pass.needs_shapes:
            if ops is None:
                ops = op_histogram(model.graph)
            if p._uses_shape_ops(ops):
                return True
        elif p.needs_shapes(model):
            return True
    return False
