"""The exceptions `rewrite` raises, and the exit code each maps to.

Every failure a user can cause (a missing file, a bad pass name, a model onnx.checker
rejects) is an :class:`InputError`: the CLI prints its message as one line and exits 2.
A pass that crashes is wrapped in :class:`PassError` naming the pass and the passes that ran
before it (exit 3). A rewritten model whose outputs drift past the tolerance raises
:class:`VerificationError` naming the pass that broke it (exit 1).
"""

from __future__ import annotations


class RewriteError(Exception):
    """Base class; ``exit_code`` is what the CLI returns for it."""

    exit_code = 3


class InputError(RewriteError):
    """Bad input or usage: missing/corrupt file, unknown pass, bad option (exit 2)."""

    exit_code = 2


class PreconditionError(InputError):
    """A pass cannot run on this graph (e.g. a phase order that goes backwards)."""


class PassError(RewriteError):
    """A pass raised: a bug inside the pass, not the user's fault (exit 3)."""

    exit_code = 3

    def __init__(self, pass_name: str, before: list[str], cause: BaseException):
        self.pass_name = pass_name
        self.before = list(before)
        self.cause = cause
        ran = ", ".join(self.before) if self.before else "none"
        super().__init__(
            f"pass '{pass_name}' failed: {type(cause).__name__}: {cause} (passes before it: {ran})"
        )


class VerificationError(RewriteError):
    """Rewritten outputs differ from the original beyond tolerance (exit 1). ``pass_name``
    is the pass after which they did (as PassError's), when known."""

    exit_code = 1

    @property
    def pass_name(self) -> str | None:
        report = getattr(self, "report", None)
        return getattr(report, "failed_pass", None)
