"""INT8 lowering without a GPU: which planned INT8 layers MIGraphX turns into int8 kernels.

Only MIGraphX's GPU target lowers Q/DQ to ``quant_convolution`` / ``quant_dot``, in its
``simplify_qdq`` pass; the CPU ``ref`` target runs Q/DQ as float math. So the question "does
this layer become an int8 kernel?" is answered by running MIGraphX's *own* GPU-target passes,
in the GPU target's order up to and including ``simplify_qdq``
(src/targets/gpu/target.cpp), on the parsed program, with ``migraphx-driver``::

    migraphx-driver read M.onnx --input-dim @x 1 3 224 224 -p normalize_ops \\
        -p dead_code_elimination -p eliminate_identity -p dead_code_elimination \\
        -p simplify_qdq --brief

(input dims are always fixed, so the dynamic-shape passes that the GPU target runs first
when a dim is dynamic have nothing to do). The printed program's main module lists one
``convolution``/``quant_convolution`` per ONNX Conv and one ``dot``/``quant_dot`` per
MatMul/Gemm, in graph order (the parser walks the nodes in order and simplify_qdq replaces an
instruction in place), which maps each kernel back to its ONNX layer. Where the counts do not
line up (an LSTM or Einsum adds dots of its own), layers are not named and the figure is a
count. On a GPU the headline figure comes from the compiled program instead
(rewriter.backends.migraphx.kernel_counts).

A MIGraphX exception is one line naming the QDQ form that caused it (:func:`explain`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from rewriter.core.pass_base import parse_version  # noqa: F401 (in core for Options)

GPU_PASSES = ("normalize_ops", "dead_code_elimination", "eliminate_identity",
              "dead_code_elimination", "simplify_qdq")
CONV_OPS = ("Conv", "ConvInteger", "QLinearConv")
DOT_OPS = ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul")
_KIND = {"convolution": "conv", "quant_convolution": "conv", "dot": "dot", "quant_dot": "dot"}

# What MIGraphX's error text means, measured on the shared 2.15 and 2.16 builds
# (tests/test_migraphx_rules.py): (pattern, the form that causes it, static-check code, advice).
KNOWN_FAILURES = (
    (r"broadcast ndims - axis\) is less than s0 ndims",
     "a per-axis (per-channel) weight DequantizeLinear, which simplify_qdq cannot lower on "
     "MIGraphX >= 2.16", "qdq-per-channel-weight",
     "a plan's int8.weight_form: mul (the default for 2.16) or weights: per-tensor; a "
     "model's own Q/DQ layers: the default pipeline's weight-scales-after pass"),
    (r"succeeding sizes must match",
     "a Q/DQ scale or zero point of shape [1] (not 0-d) on a conv/dot input",
     "qdq-scale-shape-1", "store per-tensor scales and zero points as 0-d tensors"),
    (r"quant_(convolution|dot): Types do not match",
     "a Cast that does not change the type between a DequantizeLinear and its conv/dot",
     "qdq-noop-cast", "remove the Cast"),
    (r"x and y_scale must be of same type",
     "a QuantizeLinear whose input and scale types differ (opset >= 19)", "qdq-scale-type",
     "keep Q/DQ in float32 with Casts around them"),
    (r"y_zero_point must be of same type|x_zero_point must be of same type",
     "a DequantizeLinear whose zero point type differs from its input", "qdq-zero-point-type",
     "give the zero point the quantized input's type"),
    (r"Unknown operator", "an operator MIGraphX's ONNX parser does not know", "unsupported-op",
     "see `rewrite check`"),
    (r"for block granularity|Block size\(actual",
     "a blockwise Q/DQ with one block along its axis", "qdq-blockwise-one-block",
     "give the scales per axis on the other dim (axis=1, no block_size)"),
    (r"crashes MIGraphX's parser|Int4: currently supports only even-sized packed tensors",
     "an int4/uint4 tensor that is 0-d or has an odd last dim", "int4-tensor-shape",
     "store it as int8 (the same values), its zero point too"),
    (r"Prototensor data type (17|19|20) not supported", "an OCP float8 tensor",
     "unsupported-dtype", "quantize to int8 or FLOAT8E4M3FNUZ"),
)


def show_version(v: tuple[int, ...] | None) -> str:
    return ".".join(str(x) for x in v) if v else "unknown"


def installed_version() -> tuple[int, ...] | None:
    """The importable migraphx module's version, or None when it does not import."""
    try:
        import migraphx
    except Exception:
        return None
    return parse_version(getattr(migraphx, "__version__", None))


def _module_dir() -> Path | None:
    try:
        import migraphx
    except Exception:
        return None
    f = getattr(migraphx, "__file__", None)
    return Path(f).resolve().parent if f else None


def find_driver() -> str | None:
    """``migraphx-driver`` of the same install as the importable module, else one on PATH.

    Order: $REWRITE_MIGRAPHX_DRIVER; bin/ beside the module's lib/ (a ROCm install and the
    shared builds both lay it out so); $MIGRAPHX_PREFIX/bin; PATH; /opt/rocm/bin.
    """
    candidates = [os.environ.get("REWRITE_MIGRAPHX_DRIVER")]
    mod = _module_dir()
    if mod is not None:
        candidates.append(str(mod.parent / "bin" / "migraphx-driver"))
    if os.environ.get("MIGRAPHX_PREFIX"):
        candidates.append(os.path.join(os.environ["MIGRAPHX_PREFIX"], "bin", "migraphx-driver"))
    candidates += [shutil.which("migraphx-driver"), "/opt/rocm/bin/migraphx-driver"]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def driver_version(driver: str) -> tuple[int, ...] | None:
    try:
        p = _run([driver, "--version"], 60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(_after(p.stdout + p.stderr, "MIGraphX Version:"))


def _after(text: str, marker: str) -> str | None:
    for line in text.splitlines():
        if marker in line:
            return line.split(marker, 1)[1]
    return None


@dataclass
class Layer:
    name: str
    op: str
    planned_int8: bool
    kernel: str | None = None      # quant_convolution, convolution, quant_dot, dot
    why_float: str | None = None

    @property
    def int8(self) -> bool:
        return bool(self.kernel and self.kernel.startswith("quant_"))


@dataclass
class Lowering:
    """What MIGraphX made of a model's planned INT8 layers."""

    status: str                       # "ok" | "failed" | "skipped"
    source: str                       # how the figure was obtained
    version: str = "unknown"
    planned: int = 0                  # planned INT8 layers (Conv/MatMul/Gemm)
    lowered: int = 0                  # of those, how many became quant_* kernels
    named: bool = True                # False: counts only, layers could not be mapped
    layers: list[Layer] = field(default_factory=list)
    quant_kernels: int = 0            # quant_convolution + quant_dot in the program
    error: str | None = None
    reason: str | None = None         # why skipped
    what: str = "planned INT8 layers"
    # of ``lowered``, how many still do after MIGraphX's own quantize_fp16 (its driver's
    # --fp16, onnxruntime's migraphx_fp16_enable); None: not measured
    fp16_lowered: int | None = None

    def headline(self) -> str:
        if self.status == "skipped":
            return f"INT8 lowering not checked: {self.reason}"
        if self.status == "failed":
            return f"INT8 lowering failed: {self.error}"
        s = (f"{self.lowered} of {self.planned} {self.what} lower to "
             f"quant_convolution/quant_dot")
        return s + ("" if self.named else " (by count: layers could not be mapped one to one)")

    def fp16_line(self) -> str | None:
        """A warning when MIGraphX's own quantize_fp16 would take int8 kernels away."""
        if self.fp16_lowered is None or self.fp16_lowered >= self.lowered:
            return None
        return (f"compile this model as written: after MIGraphX's own quantize_fp16 "
                f"(migraphx-driver --fp16, onnxruntime's migraphx_fp16_enable; --bf16 alike), "
                f"{self.fp16_lowered} of these {self.lowered} lower to int8 kernels: it removes "
                "the zero points simplify_qdq matches (docs/migraphx.md)")

    def float_layers(self) -> list[Layer]:
        """The planned layers that stay float; none are named when the layers could not
        be paired with kernels (each would show as float: 72 lines under '72 of 72')."""
        if not self.named:
            return []
        return [x for x in self.layers if x.planned_int8 and not x.int8]

    def render(self) -> str:
        lines = [f"{self.headline()} [{self.source}, MIGraphX {self.version}]"]
        for x in self.float_layers():
            lines.append(f"  stays float: {x.name} ({x.op}): {x.why_float or 'no reason known'}")
        fp16 = self.fp16_line()
        if fp16:
            lines.append("  " + fp16)
        return "\n".join(lines)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["headline"] = self.headline()
        d["stays_float"] = {x.name: x.why_float for x in self.float_layers()}
        d["fp16_warning"] = self.fp16_line()
        return d


def main_kernels(program_text: str) -> list[str]:
    """conv/dot kernels of the main module in program order (quant_* or float), one a layer.

    A nonzero zero point (an asymmetric activation, or weight) makes simplify_qdq compute
    its term with int8 kernels of its own, read only by the add/sub that build the
    DequantizeLinear's zero point (2.15, 2.16): those are no layer's."""
    from rewriter.migraphx.backend import parse_program_text

    instrs = parse_program_text(program_text).get("main", [])
    readers: dict[str, set[str]] = {}
    for _, op, rest in instrs:
        args = re.search(r"\(([^()]*)\)\s*(->|$)", rest)
        for arg in (args.group(1).split(",") if args else []):
            readers.setdefault(arg.strip(), set()).add(op)
    return [op for out, op, _ in instrs if op in _KIND
            and not (op.startswith("quant_") and readers.get(out, {op}) <= {"add", "sub"})]


def map_layers(model, planned: Sequence[str], kernels: Sequence[str]) -> tuple[list[Layer], bool]:
    """Pair each main-graph conv/dot node with the kernel MIGraphX made of it, by order.

    Returns (layers, named): ``named`` is False when the node and kernel counts of a kind
    differ, so no pairing is trustworthy; layers then carry no kernel."""
    from rewriter.core.graph import node_id

    planned = set(planned)
    nodes = [n for n in model.graph.node if n.op_type in CONV_OPS + DOT_OPS]
    layers = [Layer(node_id(n), n.op_type, node_id(n) in planned) for n in nodes]
    named = True
    for kind, ops in (("conv", CONV_OPS), ("dot", DOT_OPS)):
        mine = [x for x in layers if x.op in ops]
        theirs = [k for k in kernels if _KIND[k] == kind]
        if len(mine) != len(theirs):
            named = named and not any(x.planned_int8 for x in mine)
            continue
        for x, k in zip(mine, theirs):
            x.kernel = k
    return layers, named


def run_driver(driver: str, model_path: str | os.PathLike, input_dims: Mapping[str, Sequence[int]],
               passes: Sequence[str] = GPU_PASSES, timeout: float = 900,
               fmt: str = "--onnx") -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``migraphx-driver read`` with ``passes`` applied
    (``fmt``: ``--migraphx`` for a saved program)."""
    cmd = [driver, "read", os.fspath(model_path), fmt]
    dims = [tok for name, d in input_dims.items() for tok in (f"@{name}", *map(str, d))]
    if dims:
        cmd += ["--input-dim", *dims]
    for p in passes:
        cmd += ["-p", p]
    cmd.append("--brief")
    with tempfile.TemporaryDirectory(prefix="rewrite-mgx-") as tmp:
        # On failure MIGraphX dumps the program into $TMPDIR/migraphx: keep that out of /tmp.
        env = dict(os.environ, TMPDIR=tmp)
        p = _run(cmd, timeout, env)
    return p.returncode, p.stdout, p.stderr


def _run(cmd: list[str], timeout: float, env=None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)``, waiting in
    steps of 0.25 s: an interrupt that sends this thread no signal (``_thread.interrupt_main``,
    how a toolchain cancels a call from another thread) is seen at once, not when the driver
    ends, and the driver is killed on it."""
    import time

    from rewriter.migraphx.backend import spawn

    end = time.monotonic() + timeout
    with spawn(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as p:
        try:
            while True:
                try:   # retrying communicate loses no output
                    out, err = p.communicate(timeout=max(0.0, min(0.25, end - time.monotonic())))
                    return subprocess.CompletedProcess(cmd, p.returncode, out, err)
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= end:
                        raise subprocess.TimeoutExpired(cmd, timeout) from None
        except BaseException:
            p.kill()
            p.wait()   # reaped here: Popen's exit does not wait on a KeyboardInterrupt
            raise


def what(stderr: str) -> str:
    """MIGraphX's exception text from a failed driver run, one line, without source paths."""
    for marker in ("what():", "Error simplify_qdq:", "[ERROR]"):
        line = _after(stderr, marker)
        if line:
            break
    else:
        tail = [x for x in stderr.strip().splitlines() if x.strip()]
        line = tail[-1] if tail else "no message"
    from rewriter.migraphx.backend import clean_message

    return clean_message(line)


def known_failure(message: str) -> tuple[str, str, str, str] | None:
    """The KNOWN_FAILURES entry (pattern, form, code, advice) a MIGraphX error matches."""
    return next((k for k in KNOWN_FAILURES if re.search(k[0], message)), None)


def explain(message: str, findings=None) -> str:
    """MIGraphX's error message plus the QDQ form that causes it and the layers that have
    that form (from the static check's findings), as one line."""
    known = known_failure(message)
    if known is None:
        return message
    _, form, code, advice = known
    nodes = list(dict.fromkeys(f.node for f in findings or [] if f.code == code))
    where = f" (in {compact(nodes)})" if nodes else ""
    return f"{message}: caused by {form}{where}; {advice}"


def compact(names: Sequence[str], limit: int = 4) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def lower_int8(model_path: str | os.PathLike, input_dims: Mapping[str, Sequence[int]],
               planned: Sequence[str], *, model=None, findings=None,
               driver: str | None = None, fp16: bool = True) -> Lowering:
    """Run MIGraphX's GPU passes up to simplify_qdq on ``model_path`` and say which of the
    ``planned`` INT8 layers (node ids) became quant_convolution/quant_dot, and why the others
    did not (``findings``: the static check's, whose plan-int8-stays-float reasons name
    each layer's blocker). ``fp16``: also count them after MIGraphX's own quantize_fp16
    (``fp16_lowered``), when the Python module is there."""
    import onnx

    driver = driver or find_driver()
    source = "simplify_qdq via migraphx-driver, GPU pass order"
    if driver is None:
        return Lowering("skipped", source, planned=len(planned),
                        reason="migraphx-driver not found (it ships with MIGraphX; set "
                               "REWRITE_MIGRAPHX_DRIVER)")
    version = show_version(driver_version(driver))
    if model is None:
        model = onnx.load(os.fspath(model_path), load_external_data=False)
    rc, out, err = run_driver(driver, model_path, input_dims)
    if rc != 0:
        return Lowering("failed", source, version, planned=len(planned),
                        error=f"MIGraphX {version} failed: {explain(what(err), findings)}")
    layers, named, quant, lowered = _count(model, planned, out)
    reasons = _reasons(findings)
    for x in layers:
        if x.planned_int8 and x.kernel and not x.int8:
            x.why_float = reasons.get(x.name, "simplify_qdq did not match it; the static "
                                               "check knows no reason")
    result = Lowering("ok", source, version, len(planned), lowered, named,
                      [x for x in layers if x.planned_int8], quant)
    if lowered and fp16:
        result.fp16_lowered = _fp16_lowered(driver, model_path, input_dims, model, planned,
                                            lowered)
    return result


def _count(model, planned: Sequence[str], program_text: str) -> tuple:
    """(layers, named, quant kernels, planned layers lowered) of a driver's program text:
    by layer where the kernels pair with the layers, else by count."""
    kernels = main_kernels(program_text)
    layers, named = map_layers(model, planned, kernels)
    quant = sum(1 for k in kernels if k.startswith("quant_"))
    lowered = (sum(1 for x in layers if x.planned_int8 and x.int8) if named
               else min(quant, len(planned)))
    return layers, named, quant, lowered


def _fp16_lowered(driver, model_path, input_dims, model, planned, lowered) -> int | None:
    """Of the planned layers that lower, how many still do when MIGraphX's own
    quantize_fp16 runs first, as its driver's --fp16 and onnxruntime's migraphx_fp16_enable
    run it before compiling. On 2.15 and 2.16 none do: its simplify_algebra drops a zero
    point of 0 from every Q/DQ (eliminate_zero_point), and simplify_qdq matches only a DQ
    that has one (match/dq_helpers.hpp:40-45). None when the Python module cannot say."""
    from rewriter.migraphx import backend

    if not backend.available()[0]:
        return None
    with tempfile.TemporaryDirectory(prefix="rewrite-mgx-") as tmp:
        mxr = os.path.join(tmp, "fp16.mxr")
        try:
            backend.save_quantized_fp16(model_path, {k: list(v) for k, v in input_dims.items()},
                                        mxr)
        except Exception:   # noqa: BLE001 - a refusal here says nothing of the model as written
            return None
        rc, out, _ = run_driver(driver, mxr, {}, fmt="--migraphx")
    return min(lowered, _count(model, planned, out)[3]) if rc == 0 else None


def _reasons(findings) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in findings or []:
        if f.code == "plan-int8-stays-float":
            out[f.node] = f.message.split("(runs in float): ", 1)[-1]
    return out
