"""The exceptions `rewrite` raises, and the exit code each maps to.

Every failure a user can cause (a missing file, a bad pass name, a model onnx.checker
rejects) is an :class:`InputError`: the CLI prints its message as one line and exits 2.
A pass that crashes is wrapped in :class:`PassError` naming the pass and the passes that ran
before it (exit 3). A rewritten model whose outputs drift past the tolerance raises
:class:`VerificationError` naming the pass that broke it (exit 1).
"""

from __future__ import annotations

import contextvars
import re


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

    def __reduce__(self):
        # A process pool re-raises a worker's error in the caller by pickling it; rebuilt
        # from ``args`` (the message alone) it was a TypeError there. The message as worded
        # (the API's words) goes along.
        import pickle

        cause = self.cause
        try:   # a cause holding a lock or a session made this error unpicklable too, and
            pickle.loads(pickle.dumps(cause))   # one whose __init__ takes more than its
        except Exception:  # noqa: BLE001 - args failed in the caller: its type and words go
            cause = RuntimeError(f"{type(cause).__name__}: {cause}")
        return type(self), (self.pass_name, self.before, cause), {
            **self.__dict__, "cause": cause, "args": self.args}


class VerificationError(RewriteError):
    """Rewritten outputs differ from the original beyond tolerance (exit 1). ``pass_name``
    is the pass after which they did (as PassError's), when known."""

    exit_code = 1

    @property
    def pass_name(self) -> str | None:
        report = getattr(self, "report", None)
        return getattr(report, "failed_pass", None)


# Who is calling: the CLI words messages in its flags; rewriter.rewrite called from Python
# adds the argument each flag stands for (a toolchain has no --calib to give).
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("rewrite_caller", default="api")

API_NAMES = {
    "--calib": "calib=", "--plan": "plan=", "--verify": "verify=True", "--inputs": "inputs=",
    "--input-shape": "input_shapes=", "--fix-shapes": "fix_shapes=True", "--seed": "seed=",
    "--set-input": "set_inputs=",
    "--passes": "passes=", "--target": "target=", "--labels": "labels=",
    "--migraphx-target": 'migraphx={"device": ...}',
    "--backend": 'migraphx={"backend": ...}',
    "--fold-size-limit": 'options={"fold_size_limit": ...}',
    "--save-mxr": 'migraphx={"save_mxr": ...}',
    "--migraphx-samples": 'migraphx={"samples": ...}',
    "--require-backend": 'migraphx={"require": ...}',
    "--migraphx-version": 'options={"migraphx_version": ...}',
    "--pad-multiple": 'options={"pad_multiple": ...}',
    "--pad-sides": 'options={"pad_sides": ...}',
    "--pad-max-overhead": 'options={"pad_max_overhead": ...}',
    **{f"--{k.replace('_', '-')}": f'options={{"planner": {{"{k}": ...}}}}' for k in (
        "strict", "preprocess", "samples", "percentile", "method", "weights", "min_top1",
        "min_cosine", "max_accuracy_drop", "target_speedup", "int8_speed", "fp16_speed",
        "selection_correction", "folds", "alpha", "beta", "max_abs", "min_within")},
}
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def api_words(message: str) -> str:
    """``message``, followed by the Python API's name for each CLI flag it names; once (a
    message already worded so, from a rewriter.rewrite called inside another, stays)."""
    if "[Python API: " in message:
        return message
    flags = [f for f in dict.fromkeys(_FLAG.findall(message)) if f in API_NAMES]
    if not flags:
        return message
    return message + " [Python API: " + "; ".join(f"{f} is {API_NAMES[f]}" for f in flags) + "]"


def in_api_words(e: RewriteError) -> None:
    """``e``'s message and its report's warnings, for a caller of the Python API."""
    if e.args and isinstance(e.args[0], str):
        e.args = (api_words(e.args[0]),) + e.args[1:]
    report = getattr(e, "report", None)
    if report is not None and getattr(report, "warnings", None):
        report.warnings = [api_words(w) for w in report.warnings]
