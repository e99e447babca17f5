"""MIGraphX: parse, compile and run an ONNX model with AMD's MIGraphX Python API.

The documented route (shared/migraphx/PROFILE.md, and src/py/migraphx_py.cpp upstream):

    prog = migraphx.parse_onnx(path, map_input_dims={"x": [8, 3, 224, 224]})
    prog.compile(migraphx.get_target("gpu"), offload_copy=True, fast_math=True)
    outs = prog.run({"x": np.ascontiguousarray(x)})        # in graph-output order
    y = np.array(outs[0])                                  # copy out of MIGraphX's buffer

``migraphx`` is imported lazily and is optional: :func:`available` says why it is missing,
and every other entry point raises ``RuntimeError`` with that reason. There is no fallback
and no mock: a run here is a real MIGraphX run or none.

Why each step is the way it is:

* ``map_input_dims`` always: MIGraphX silently turns a symbolic dim into 1, so the dims come
  from ``input_shapes`` or, failing that, from the feeds themselves.
* Feeds must match the parameter dtype and shape exactly (MIGraphX makes no implicit copy
  or cast); a mismatch is a ``ValueError`` naming the input, not a wrong answer.
* Op counts come from the compiled program's text (``str(prog)``: ``module: "main"`` then one
  ``name = op[attrs](args) -> shape`` line per instruction). quant_convolution/quant_dot count
  the main-module instructions that mention them, which covers ``gpu::quant_convolution``
  as well as fused rocMLIR kernels named after it (``mlir_quant_convolution...``).
* ``ref`` is a CPU reference target without the int8 pass: Q/DQ run as float math there, so
  it checks numerics, never int8 kernel counts.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

# MIGraphX shape type names -> numpy dtypes, to refuse a feed it would misread.
_DTYPES = {
    "float_type": np.float32, "half_type": np.float16, "double_type": np.float64,
    "int8_type": np.int8, "uint8_type": np.uint8, "int16_type": np.int16,
    "uint16_type": np.uint16, "int32_type": np.int32, "uint32_type": np.uint32,
    "int64_type": np.int64, "uint64_type": np.uint64, "bool_type": np.bool_,
}

_INSTRUCTION = re.compile(r"^(?P<out>\S+) = (?P<op>[^\s\[\(\{]+)(?P<rest>.*)$")
# Which main-module instructions are which kernel. A fused kernel carries the name of the
# op it was built around (symbol or module name), so match anywhere in the op/attribute text.
_KINDS = {
    "quant_convolution": re.compile(r"quant_convolution"),
    "quant_dot": re.compile(r"quant_dot"),
    "convolution": re.compile(r"(?<![A-Za-z])(?<!quant_)convolution(?!_backwards)"),
    "dot": re.compile(r"(?<![A-Za-z])(?<!quant_)dot(?![A-Za-z])"),
}


@dataclass
class MigraphxRun:
    """What one compile-and-run produced."""

    outputs: list[np.ndarray]            # graph-output order
    output_names: list[str]
    op_histogram: dict[str, int]         # op name -> instructions, all modules
    kernel_counts: dict[str, int]        # quant_convolution, quant_dot, convolution, dot
    compile_seconds: float
    run_seconds: float
    target: str
    fast_math: bool
    input_dims: dict[str, list[int]]
    migraphx_version: str
    program_text: str = field(repr=False, default="")

    @property
    def quant_convolution(self) -> int:
        return self.kernel_counts["quant_convolution"]

    @property
    def quant_dot(self) -> int:
        return self.kernel_counts["quant_dot"]


def _import():
    try:
        import migraphx
    except Exception as e:  # ImportError, or a ROCm install whose shared libraries fail to load
        return None, f"MIGraphX is not installed (import migraphx failed: {type(e).__name__}: {e})"
    return migraphx, ""


def available() -> tuple[bool, str]:
    """(True, version) when ``import migraphx`` works, else (False, why not)."""
    mgx, reason = _import()
    if mgx is None:
        return False, reason
    return True, f"migraphx {getattr(mgx, '__version__', '?')}"


def has_target(name: str) -> bool:
    """Can this install compile for ``name``? A CPU-only build has ``ref`` but no ``gpu``
    (get_target fails to load libmigraphx_gpu.so)."""
    mgx, _ = _import()
    if mgx is None:
        return False
    try:
        mgx.get_target(name)
    except Exception:
        return False
    return True


class MigraphxError(RuntimeError):
    """MIGraphX refused or failed on the model; ``stage`` is parse, compile or run and
    ``message`` MIGraphX's own text without its source path."""

    def __init__(self, stage: str, message: str):
        self.stage, self.message = stage, message
        super().__init__(f"MIGraphX {stage} failed: {message}")

    def __reduce__(self):
        return type(self), (self.stage, self.message)


def clean_message(text: str) -> str:
    """MIGraphX's message on one line without its source location:
    '<src>/op/broadcast.hpp:86: build_output: BROADCAST: ...' -> 'build_output: BROADCAST: ...'."""
    import re

    line = (text.strip().splitlines() or ["no message"])[0].strip()
    return re.sub(r"^\S*\.(?:hpp|cpp|h):\d+:\s*", "", line)[:300]


def _clean(e: BaseException) -> str:
    return clean_message(str(e) or type(e).__name__)


def _require():
    mgx, reason = _import()
    if mgx is None:
        raise RuntimeError(reason)
    return mgx


def parse_program_text(text: str) -> dict[str, list[tuple[str, str, str]]]:
    """Module name -> [(output name, op name, rest of line)] from a printed program."""
    modules: dict[str, list[tuple[str, str, str]]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("module:"):
            current = line.split(":", 1)[1].strip().strip('"')
            modules.setdefault(current, [])
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            op = m.group("op")
            if op.startswith("@param"):
                op = "@param"   # '@param:x' names the parameter; count all as one op
            modules[current].append((m.group("out"), op, m.group("rest")))
    return modules


def op_histogram(text: str) -> dict[str, int]:
    """Instructions per op name over all modules of a printed program."""
    c = Counter(op for instrs in parse_program_text(text).values() for _, op, _ in instrs)
    return dict(c.most_common())


def kernel_counts(text: str) -> dict[str, int]:
    """quant_convolution / quant_dot / convolution / dot instructions in the main module.

    Only "main" counts: fused kernels print their body as a separate module too, and
    counting both would count each conv twice.
    """
    counts = dict.fromkeys(_KINDS, 0)
    for _, op, rest in parse_program_text(text).get("main", []):
        if op in ("@param", "@literal", "@return"):
            continue
        head = op + rest.split(" -> ")[0]      # drop the output shape
        for kind, pattern in _KINDS.items():
            if pattern.search(head):
                counts[kind] += 1
    return counts


def _dims(feeds: Mapping[str, np.ndarray], input_shapes) -> dict[str, list[int]]:
    dims = {k: [int(d) for d in v] for k, v in (input_shapes or {}).items()}
    for name, x in feeds.items():
        dims.setdefault(name, [int(d) for d in np.shape(x)])
    return dims


# What MIGraphX's C++ printed while parsing, per thread (compile_output puts it in the
# report). The redirection of the process's stdout and stderr is one at a time: two
# threads swapping file descriptors at once could leave stdout pointing at a temp file.
_SAID = threading.local()
_REDIRECT = threading.Lock()


def _thread_list(name: str) -> list[str]:
    if not hasattr(_SAID, name):
        setattr(_SAID, name, [])
    return getattr(_SAID, name)


def said() -> list[str]:
    """This thread's captured MIGraphX console lines (clear it before a compile)."""
    return _thread_list("lines")


def _refuse_crash(model_path) -> None:
    """MigraphxError where MIGraphX's parser would kill this process on ``model_path``: a
    0-d int4/uint4 tensor (onnxruntime's quantize_static writes one as a per-tensor zero
    point) is a segfault in parse_tensor_shape on 2.15 and 2.16, measured; and on 2.15 a Pad
    with negative pads (see :func:`_negative_pad`)."""
    import onnx

    from rewriter.core.graph import iter_model_tensors

    model = onnx.load(os.fspath(model_path), load_external_data=False)
    packed = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    for t in iter_model_tensors(model.graph):
        if t.data_type in packed and not t.dims:
            kind = onnx.TensorProto.DataType.Name(t.data_type)
            raise MigraphxError("parse", f"the 0-d {kind} tensor '{t.name}' crashes MIGraphX's "
                                "parser (a segfault on 2.15 and 2.16): not parsed")
    from rewriter.core.pass_base import parse_version

    version = parse_version(getattr(_import()[0], "__version__", None))
    if version is not None and version[:2] < (2, 16):
        err = _negative_pad(model)
        if err:
            raise err


# mode -> (the stage MIGraphX 2.15 fails at, what it does); edge's second: a begin crop.
# The stage is the one the original is then tried up to (a constant Pad's abort is at run).
_PAD_CAUSES = {
    "edge": (("parse", "parses it into instructions without bound until std::bad_alloc "
                       "(line 160)"),
             ("parse", "drops the crop at parse: a longer output (line 147)")),
    "reflect": (("parse", "refuses it (a std::vector of negative size, lines 85-86)"),),
    "constant": (("run", "runs a pad op that writes past its output, an abort on ref "
                         "(src/targets/ref/lowering.cpp:227-235; GPU not run)"),)}


def _negative_pad(model) -> MigraphxError | None:
    """Why MIGraphX 2.15 cannot be handed ``model``, at the stage it would fail at: a Pad
    with constant negative pads (a crop). Its parser (src/onnx/parse_pad.cpp at rocm-7.2.4)
    counts an edge pad's end copies in a size_t (line 160): -1 pushes instructions until
    std::bad_alloc, after 70-200 s and all the memory there is (onnx-asr's Kaldi and
    WeSpeaker front-ends); a negative begin is dropped (line 147: a longer output), reflect
    throws from std::vector<int>(-1) (lines 85-86), and the ref target's pad op (constant)
    writes every input element, past the cropped output (src/targets/ref/lowering.cpp:
    227-235): "free(): invalid size", an abort, at run. 2.16 parses one pad op that crops
    (#4481)."""
    from onnx import numpy_helper

    from rewriter.core.graph import constant_tensors, graph_protos

    for g in graph_protos(model.graph):
        consts = constant_tensors(g)
        for n in g.node:
            if n.op_type != "Pad" or n.domain not in ("", "ai.onnx"):
                continue
            pads = [list(a.ints) for a in n.attribute if a.name == "pads"]
            if not pads and len(n.input) > 1 and n.input[1] in consts:
                pads = [numpy_helper.to_array(consts[n.input[1]]).ravel().tolist()]
            mode = next((a.s.decode() for a in n.attribute if a.name == "mode"), "constant")
            if not pads or min(pads[0], default=0) >= 0 or mode not in _PAD_CAUSES:
                continue
            crops_end = min(pads[0][len(pads[0]) // 2:], default=0) < 0
            stage, cause = _PAD_CAUSES[mode][0 if mode != "edge" or crops_end else 1]
            return MigraphxError(stage, (
                f"the {mode} Pad '{n.name or n.output[0]}' has negative pads {pads[0]}: "
                f"MIGraphX 2.15 {cause} (src/onnx/parse_pad.cpp at rocm-7.2.4 unless said; "
                "2.16 crops right); the pass crop-pads writes the crop as a Slice; not parsed"))
    return None


_SHAPED = re.compile(r"^(@\d+) = (\S+?)(?:\[.*\])?\((.*?)\) -> \w+, \{([\d, ]*)\}")
_LITERAL = re.compile(r"^(@\d+) = @literal\{(-?\d+)\} -> int64_type")


def nms_overflow(program_text: str) -> str | None:
    """Why running a compiled program would write past a NonMaxSuppression's output, or
    None. MIGraphX 2.15 sizes that output batches x boxes rows (src/include/migraphx/op/
    nonmaxsuppression.hpp:118 at dd11a75), not x classes (fixed in #4699 for 2.16): with
    more than one class, more indices can be selected than it holds, and the run writes
    past the buffer: 'free(): invalid next size', an abort that kills the process
    (measured on 2.15 with 2 classes, 6 boxes, 4 per class). Read from the program: the
    scores' shape, the output's rows, max_output_boxes_per_class where it is a literal."""
    shapes, ints = {}, {}
    for line in program_text.splitlines():
        line = line.strip()
        lit = _LITERAL.match(line)
        if lit:
            ints[lit.group(1)] = int(lit.group(2))
        m = _SHAPED.match(line)
        if not m:
            continue
        name, op, args, lens = m.groups()
        shapes[name] = [int(d) for d in lens.split(",") if d.strip()]
        if not op.endswith("nonmaxsuppression"):
            continue
        ids = [a.strip() for a in args.split(",")]
        scores = shapes.get(ids[1]) if len(ids) > 1 else None
        rows = shapes[name][0] if shapes[name] else None
        if not scores or len(scores) != 3 or rows is None:
            continue
        b, c, n = scores
        per_class = min(ints.get(ids[2], n), n) if len(ids) > 2 else 0
        if b * c * per_class > rows:
            return (f"MIGraphX's NonMaxSuppression output holds {rows} rows but can select "
                    f"{b * c * per_class} ({b} batch x {c} classes x {per_class}): running it "
                    "would write past the buffer and abort the process (2.15 sizes it "
                    "batches x boxes, without the classes; 2.16 is fixed): not run")
    return None


def notes() -> list[str]:
    """This thread's notes on how MIGraphX was called (clear it before a compile)."""
    return _thread_list("notes")


_CHILD: dict = {}   # in a child process of :func:`isolated`: the file its stage goes to
# The child's bootstrap: the parent's sys.path first, so it imports the same rewriter and
# the same migraphx (a toolchain may have put either on its path by hand).
# The call follows in the same file, read after the path is set (streamed both ways: a
# nested pickle of 288 MB of feeds was one more copy of them in each process).
_BOOT = ("import pickle, sys; f = open(sys.argv[1], 'rb'); job = pickle.load(f); "
         "sys.path[:] = job['path']; from rewriter.migraphx import backend; "
         "backend._child(job, f)")


def _stage(name: str, done: int | None = None) -> None:
    """In a child of :func:`isolated`: say which stage MIGraphX is in (and how many samples
    are done), so that the parent can show progress and name the stage if the child dies."""
    if _CHILD.get("stage"):
        with open(_CHILD["stage"], "w") as f:
            f.write(name if done is None else f"{name} {done}")


def isolated(fn, *args, bar: dict | None = None):
    """``fn(*args)`` (``fn`` importable by name) in a child Python process: its result, or
    its exception raised here. MIGraphX can kill the process it runs in (a segfault in its
    parser, an abort in a ``ref`` kernel, a parse that allocates until ``bad_alloc``;
    docs/migraphx.md lists those measured). In a child, the caller survives them all: a
    child that dies is a :class:`MigraphxError` at the stage it died in ("compile failed:
    crashed (signal SIGSEGV ...)"), which the target step judges like any refusal, trying
    the original too; and a toolchain calling the API keeps its process. The child gets
    this process's ``sys.path`` and environment and ignores Ctrl-C (this process stops it);
    its console output stays off stdout and stderr (parse lines reach :func:`said` as
    in-process ones do; the rest is read only to name a crash). ``bar`` (``total``,
    ``desc``): a progress bar here over the samples the child has run.
    ``REWRITE_MIGRAPHX_IN_PROCESS=1`` calls ``fn`` here instead, unprotected."""
    if _CHILD or os.environ.get("REWRITE_MIGRAPHX_IN_PROCESS") == "1":
        return fn(*args)
    import pickle
    import signal
    import subprocess

    from rewriter.core.progress import progress_bar
    with _temp_dir() as d:
        job, out, stage, log = (os.path.join(d, n) for n in ("job", "out", "stage", "log"))
        try:
            with open(job, "wb") as f:
                pickle.dump({"path": _child_path(), "out": out, "stage": stage,
                             "parent": os.getpid()}, f, protocol=pickle.HIGHEST_PROTOCOL)
                pickle.dump((fn, args), f, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as e:   # TMPDIR full: an internal error, exit 3, was said
            raise _no_room(d, e) from None
        shown = progress_bar(bool(bar), total=(bar or {}).get("total"), unit="sample",
                             desc=(bar or {}).get("desc"))
        try:
            with open(log, "wb") as console:
                p = spawn([sys.executable or "python3", "-c", _BOOT, job],
                          stdin=subprocess.DEVNULL, stdout=console, stderr=console)
        except OSError as e:   # e.g. an embedded interpreter with no executable to start
            shown.close()
            note = f"MIGraphX ran in this process, unprotected: no child process ({e})"
            if note not in notes():
                notes().append(note)
            return fn(*args)
        try:
            while True:
                try:
                    # Never a wait without a timeout: an interrupt that sends no signal to
                    # this thread (_thread.interrupt_main, a SIGINT another thread took)
                    # is seen only when Python runs; it waited for the whole compile.
                    p.wait(timeout=0.25)
                    break
                except subprocess.TimeoutExpired:
                    if bar:
                        shown.update(max(0, _done(stage) - getattr(shown, "n", 0)))
        finally:
            shown.close()
            if p.poll() is None:   # interrupted here: the child goes too
                p.kill()
                p.wait()
        if os.path.exists(out):
            with open(out, "rb") as f:
                kind, value, lines, told = pickle.load(f)
            said().extend(x for x in lines if x not in said())
            notes().extend(x for x in told if x not in notes())
            if kind == "raise":
                raise value
            return value
        at = (_read(stage) or "parse").split()[0]
        last = [x.strip() for x in _read(log).splitlines() if x.strip()][-1:]
        if p.returncode == _NO_ROOM:
            raise _no_room(d, last[0] if last else "")
    how = (f"signal {signal.Signals(-p.returncode).name}" if -p.returncode in
           set(signal.Signals) else f"exit status {p.returncode}")
    raise MigraphxError(at, f"crashed ({how}; in a child process, so rewrite goes on)"
                        + (f": {clean_message(last[0])}" if last else ""))


_NO_ROOM = 75   # the child's exit status when it cannot write its result


def spawn(cmd: list[str], **kwargs):
    """``subprocess.Popen(cmd, **kwargs)`` with an interrupt held while the child starts.
    One that lands inside Popen() after its fork (it waits there for the exec) left the
    child running with no handle to kill it by (a migraphx-driver, a MIGraphX child). An
    interrupt held is raised once the child is killed. Held in the main thread only (the
    one interrupts reach; signal handlers are set there), and where the SIGINT handler
    is Python's to set back. Not where SIGINT is ignored: nothing can interrupt then, and
    a child started under a handler would not inherit the ignoring (exec resets a handled
    signal to the default), so a ^C its caller ignores would kill it."""
    import signal
    import subprocess

    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) in (None, signal.SIG_IGN):   # None: set
        return subprocess.Popen(cmd, **kwargs)   # outside Python, cannot be put back
    held: list[int] = []
    before = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        p = subprocess.Popen(cmd, **kwargs)
    finally:
        signal.signal(signal.SIGINT, before)
    if held:
        p.kill()
        p.wait()
        signal.raise_signal(signal.SIGINT)   # as it came: KeyboardInterrupt, or the default
    return p


def _temp_dir():
    import tempfile
    try:
        return tempfile.TemporaryDirectory(prefix="rewrite-migraphx-")
    except OSError as e:
        raise _no_room(tempfile.gettempdir(), e) from None


def _no_room(where: str, why) -> Exception:
    """The one-line error (exit 2) for a temporary folder the child's files do not fit in:
    its job (the feeds) and its result (the outputs) go through files there."""
    from rewriter.core.errors import InputError
    return InputError(f"MIGraphX runs in a child process, whose inputs and outputs go through "
                      f"files in {os.path.dirname(where) or where}: {why} (set TMPDIR to a "
                      "folder with room)")


def _child_path() -> list[str]:
    """The child's ``sys.path``: this one, after the folders this process imported
    ``rewriter`` and ``migraphx`` from (a zip's path for a zip). A ``python -c`` caller's ''
    is its working directory at import, which it may have left since: the child, started
    in the new one, imported another folder's ``rewriter`` (a MigraphxError "parse failed:
    crashed" for an ImportError)."""
    roots = []
    for name in ("migraphx", "rewriter"):
        spec = getattr(sys.modules.get(name), "__spec__", None)
        if spec is not None and spec.origin and spec.has_location:
            up = 2 if spec.submodule_search_locations is not None else 1   # a package
            roots.append(os.path.abspath(os.path.join(spec.origin, *[os.pardir] * up)))
    return list(dict.fromkeys(roots + sys.path))


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _done(stage: str) -> int:
    """Samples the child has run, from its stage file ("run 3")."""
    words = _read(stage).split()
    return int(words[1]) if len(words) == 2 and words[1].isdigit() else 0


def _child(job: dict, f) -> None:
    """The child's side of :func:`isolated`: run the call read from ``f``, write (kind,
    value, said lines, notes) for the parent, and leave without Python's teardown."""
    import pickle
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:   # Linux: killed with the parent (a `timeout` or kill), never compiling on alone
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != job["parent"]:   # the parent is gone already
        os._exit(1)
    _CHILD["stage"] = job["stage"]
    try:
        with f:
            fn, args = pickle.load(f)
        result = ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - handed to the parent, raised there
        try:
            pickle.dumps(e)
        except Exception:   # an exception that does not pickle: its type and text
            e = RuntimeError(f"{type(e).__name__}: {e}")
        result = ("raise", e)
    try:
        with open(job["out"] + ".part", "wb") as f:
            pickle.dump(result + (said(), notes()), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(job["out"] + ".part", job["out"])
    except OSError as e:   # no room for the outputs: said as such, not as a crash
        print(f"{type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(_NO_ROOM)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# parse_onnx unrolls a Scan (and bounds a Loop) to max_loop_iterations, 10 by default, and
# refuses a model that needs more, saying how many it needs (2.15 and 2.16).
_ITERATIONS = re.compile(r"required iterations \{(\d+)\} would exceed the maximum iteration "
                         r"limit \{(\d+)\}")
MAX_LOOP_ITERATIONS = 65535   # parse_onnx's limit_max_iterations default


def _parse(mgx, model_path, dims):
    """parse_onnx, again with ``max_loop_iterations`` set to what it says a Scan needs when
    that is over its default of 10 (onnx-asr's wespeaker front-end: 98 frames), which a
    note says, for the user's own compile (see :func:`_parse_once`)."""
    try:
        return _parse_once(mgx, model_path, dims)
    except MigraphxError as e:
        m = _ITERATIONS.search(e.message)
        if not m or not 10 <= int(m.group(2)) < int(m.group(1)) <= MAX_LOOP_ITERATIONS:
            raise
        need = int(m.group(1))
        prog = _parse_once(mgx, model_path, dims, max_loop_iterations=need)
        note = (f"parsed with max_loop_iterations={need}: a Scan or Loop needs {need} "
                f"iterations, more than parse_onnx's default of {m.group(2)}; give the same "
                "when you compile the output (migraphx.parse_onnx(..., "
                f"max_loop_iterations={need}))")
        if note not in notes():
            notes().append(note)
        return prog


def _parse_once(mgx, model_path, dims, **options):
    """parse_onnx with the process's stdout and stderr captured into :func:`said`:
    MIGraphX prints 'Warning: onnx model is not topologically sorted' on parsing a model
    (an original often), past -q and into a caller's pipe."""
    import tempfile
    lines = said()
    with _REDIRECT, tempfile.TemporaryFile() as tmp:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            try:
                _stage("parse")
                return mgx.parse_onnx(os.fspath(model_path), map_input_dims=dims, **options)
            except Exception as e:
                raise MigraphxError("parse", _clean(e)) from None
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            tmp.seek(0)
            for line in tmp.read().decode(errors="replace").splitlines():
                if line.strip() and line.strip() not in lines:
                    lines.append(line.strip())


def _compile(mgx, model_path, dims, target: str, fast_math: bool):
    t0 = time.perf_counter()
    _refuse_crash(model_path)
    prog = _parse(mgx, model_path, dims)
    _stage("compile")
    try:
        prog.compile(mgx.get_target(target), offload_copy=True, fast_math=fast_math)
    except Exception as e:
        raise MigraphxError("compile", _clean(e)) from None
    return prog, time.perf_counter() - t0


def _params(prog, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds checked against the compiled parameters: same names, dtype and shape."""
    shapes = prog.get_parameter_shapes()
    params = {}
    for name, shape in shapes.items():
        if name not in feeds:
            raise ValueError(f"MIGraphX program needs input '{name}' "
                             f"({shape.type_string()} {list(shape.lens())}); feeds give "
                             f"{sorted(feeds)}")
        x = np.asarray(feeds[name])
        want = _DTYPES.get(shape.type_string())
        if want is not None and x.dtype != want:
            raise ValueError(f"input '{name}' is {x.dtype}, MIGraphX expects "
                             f"{np.dtype(want)} ({shape.type_string()}); cast it explicitly")
        if x.ndim == 0 and shape.scalar():
            # A 0-d ONNX input is a scalar parameter (lens {1}, strides {0}), which no numpy
            # array converts to: build the argument from the shape itself.
            import migraphx
            if float(x) != x:
                raise ValueError(f"input '{name}': {x} is not exact as the float the "
                                 "MIGraphX binding builds a scalar from")
            params[name] = migraphx.create_argument(shape, [float(x)])
            continue
        if list(x.shape) != list(shape.lens()):
            raise ValueError(f"input '{name}' has shape {list(x.shape)}, the compiled program "
                             f"expects {list(shape.lens())}: pass input_shapes")
        params[name] = np.ascontiguousarray(x)
    return params


def _output_names(model_path) -> list[str]:
    import onnx

    model = onnx.load(os.fspath(model_path), load_external_data=False)
    return [o.name for o in model.graph.output]


def save_quantized_fp16(model_path: str | os.PathLike, dims: dict[str, list[int]],
                        out_path: str | os.PathLike) -> None:
    """Parse ``model_path`` at ``dims``, apply MIGraphX's own ``quantize_fp16`` (what
    ``migraphx-driver --fp16`` and onnxruntime's ``migraphx_fp16_enable`` run before
    compiling) and save the program to ``out_path`` (.mxr), in a child process."""
    _require()
    isolated(_save_quantized_fp16, os.fspath(model_path), dims, os.fspath(out_path))


def _save_quantized_fp16(model_path, dims, out_path) -> None:
    mgx = _require()
    _refuse_crash(model_path)
    prog = _parse(mgx, model_path, dims)
    _stage("quantize_fp16")
    try:
        mgx.quantize_fp16(prog)
        mgx.save(prog, out_path)
    except Exception as e:
        raise MigraphxError("quantize_fp16", _clean(e)) from None


def refuses(model_path: str | os.PathLike, dims: dict[str, list[int]], target: str | None = None,
             feeds: list | None = None) -> MigraphxError | None:
    """What MIGraphX says when it parses ``model_path`` at ``dims`` (and compiles it for
    ``target``, if given; and runs it on ``feeds``, if given): None when it can, else its
    error. Runs in a child process (:func:`isolated`)."""
    _require()   # not installed: said here, no child started
    try:
        return isolated(_refuses, os.fspath(model_path), dims, target, feeds)
    except MigraphxError as e:   # the child died
        return e


def _refuses(model_path, dims, target, feeds) -> MigraphxError | None:
    mgx = _require()
    try:
        if feeds is not None:
            _compile_and_run(model_path, feeds, dims, target or "ref")
        elif target is None:
            _refuse_crash(model_path)
            _parse(mgx, model_path, dims)
        else:
            _compile(mgx, model_path, dims, target, True)
    except MigraphxError as e:
        return e
    return None


def compile_and_run(model_path: str | os.PathLike, feeds, input_shapes: dict[str, list[int]]
                    | None = None, target: str = "gpu", fast_math: bool = True,
                    save_mxr: str | None = None, progress: bool = False) -> MigraphxRun:
    """Parse, compile for ``target`` ("gpu" or "ref"), run, and report what compiled.

    ``feeds`` is one input dict or a list of them (all of one shape: one compiled program);
    ``outputs`` holds each output joined over the runs as ``verify.feeds.stack_runs`` joins
    onnxruntime's.
    Failures inside MIGraphX raise :class:`MigraphxError` (one line, MIGraphX's message),
    a crash of MIGraphX too: it runs in a child process (:func:`isolated`).
    ``progress``: a bar over the samples on a terminal (the ``ref`` target takes 25 s a
    320x320 detector image)."""
    _require()
    n = len(feeds) if isinstance(feeds, list) else 1
    return isolated(_compile_and_run, os.fspath(model_path), feeds, input_shapes, target,
                    fast_math, save_mxr, progress, bar={"total": n, "desc": f"MIGraphX {target}"}
                    if progress and n > 1 else None)


def _compile_and_run(model_path, feeds, input_shapes=None, target="gpu", fast_math=True,
                     save_mxr=None, progress=False) -> MigraphxRun:
    from rewriter.core.progress import progress_bar
    mgx = _require()
    feed_sets = feeds if isinstance(feeds, list) else [feeds]
    dims = _dims(feed_sets[0], input_shapes)
    prog, compile_s = _compile(mgx, model_path, dims, target, fast_math)
    overflow = nms_overflow(str(prog))
    if overflow:
        raise MigraphxError("run", overflow)
    runs = []
    t0 = time.perf_counter()
    _stage("run", 0)
    for f in progress_bar(progress and len(feed_sets) > 1, iterable=feed_sets,
                          desc=f"MIGraphX {target}", unit="sample"):
        params = _params(prog, f)
        try:
            raw = prog.run(params)
        except Exception as e:
            raise MigraphxError("run", _clean(e)) from None
        runs.append([np.array(o) for o in raw])   # copies: MIGraphX may reuse its buffers
        _stage("run", len(runs))
    run_s = (time.perf_counter() - t0) / len(feed_sets)
    from rewriter.verify.feeds import stack_runs
    outputs = stack_runs(runs, feed_sets)
    text = str(prog)
    if save_mxr:
        mgx.save(prog, os.fspath(save_mxr))
    return MigraphxRun(
        outputs=outputs, output_names=_output_names(model_path), op_histogram=op_histogram(text),
        kernel_counts=kernel_counts(text), compile_seconds=compile_s, run_seconds=run_s,
        target=target, fast_math=fast_math, input_dims=dims,
        migraphx_version=str(getattr(mgx, "__version__", "?")), program_text=text)


def benchmark(model_path: str | os.PathLike, feeds: dict[str, np.ndarray],
              input_shapes: dict[str, list[int]] | None = None, target: str = "gpu",
              iterations: int = 100, warmup: int = 10, fast_math: bool = True) -> dict:
    """Latency and throughput of ``prog.run`` after ``warmup`` runs.

    With offload_copy=True each run includes the host-to-device copies of the inputs and
    the copy of the outputs back, which is also what makes it return only when done.
    """
    if iterations < 1:
        raise ValueError("iterations must be >= 1")
    _require()
    return isolated(_benchmark, model_path, feeds, input_shapes, target, iterations, warmup,
                    fast_math)


def _benchmark(model_path, feeds, input_shapes, target, iterations, warmup, fast_math) -> dict:
    mgx = _require()
    dims = _dims(feeds, input_shapes)
    prog, compile_s = _compile(mgx, model_path, dims, target, fast_math)
    params = _params(prog, feeds)
    _stage("run")
    for _ in range(max(0, warmup)):
        prog.run(params)
    times = np.empty(iterations)
    for i in range(iterations):
        t0 = time.perf_counter()
        prog.run(params)
        times[i] = time.perf_counter() - t0
    ms = times * 1e3
    first = next(iter(dims.values()), [1])
    batch = int(first[0]) if first else 1
    median = float(np.median(ms))
    return {
        "backend": "migraphx", "target": target, "fast_math": fast_math,
        "migraphx_version": str(getattr(mgx, "__version__", "?")),
        "input_dims": dims, "batch": batch, "iterations": iterations, "warmup": warmup,
        "compile_seconds": compile_s, "includes_host_device_copies": True,
        "latency_ms": {"mean": float(ms.mean()), "median": median,
                       "p90": float(np.percentile(ms, 90)), "p99": float(np.percentile(ms, 99)),
                       "min": float(ms.min()), "max": float(ms.max()), "std": float(ms.std())},
        "throughput_per_s": batch / (median / 1e3) if median > 0 else float("inf"),
    }


__all__: Sequence[str] = ("MigraphxRun", "MigraphxError", "available", "has_target",
                          "compile_and_run", "benchmark",
                          "op_histogram", "kernel_counts", "parse_program_text")
