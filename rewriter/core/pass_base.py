"""The pass contract: what a pass is, what it gets, what it returns.

A pass edits an onnx-graphsurgeon graph in place: find -> check -> rewrite. A site that
fails its check is not an error: the check returns a kebab-case reason and the pass counts
it as ``skip:<reason>``, so the report says why a rewrite did not happen. The manager does
the rest (cleanup, toposort, structural and numeric checks); see docs/writing-a-pass.md.
"""

from __future__ import annotations

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

    def count(self, key: str, n: int = 1) -> None:
        self.counts[key] += n

    def skip(self, reason: str, n: int = 1) -> None:
        self.counts[f"skip:{reason}"] += n


@dataclass
class Context:
    """What a pass may know beyond the graph: options and precomputed facts.

    Passes stay pure graph transforms; anything that needs running the model (calibration
    ranges, sensitivities) is computed before and handed in through ``data``.
    """

    options: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    namer: Namer | None = None

    def option(self, key: str, default: Any = None) -> Any:
        return self.options.get(key, default)


class Pass:
    """Base class. Subclasses set ``name``, ``phase``, ``numerics``, ``summary`` and ``run``."""

    name: ClassVar[str] = ""
    phase: ClassVar[Phase] = Phase.CLEANUP
    numerics: ClassVar[Numerics] = Numerics.EXACT
    summary: ClassVar[str] = ""

    def needs_shapes(self, model) -> bool:
        """Does this pass need inferred shapes/dtypes on ``model`` (an onnx.ModelProto)?
        Shape inference costs time and memory on long graphs, so passes that can tell
        they do not need it say so; the default is the safe answer."""
        return True

    def requires(self, graph: gs.Graph, ctx: Context) -> None:
        """Raise PreconditionError when the graph is not fit for this pass."""

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:  # pragma: no cover
        raise NotImplementedError
