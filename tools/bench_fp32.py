"""FP32 pipeline benchmark: ``rewrite`` against onnxsim, onnxslim, onnxoptimizer and
onnxruntime's offline basic optimisation, on the same files, in one run.

    python tools/bench_fp32.py                       # everything, R=3, -> docs/benchmarks_fp32.md
    python tools/bench_fp32.py --quick               # a few models, small chains, R=1
    python tools/bench_fp32.py --models resnet50,resnet50_like --tools ours,ort-basic
    python tools/bench_fp32.py --render results.json # re-render a finished run's raw JSON

What is measured, and how
-------------------------
* Every tool runs as its own whole process per model (start-up and imports included, as a
  user pays them), started with ``subprocess.Popen`` and reaped with ``os.wait4``: wall clock
  from fork to exit, peak RSS of the tool process alone from GNU time's ``%M`` (a child's own
  ``ru_maxrss`` would include the pre-exec image of its parent). Console scripts are
  resolved beside ``sys.executable``, never through pyenv's bash shims (which add ~50-100 ms
  of their own to every command).
* Each (model, tool) runs R times (``--repeat``, default 3), interleaved round-robin across
  the tools so that a noisy minute on this shared 2-core machine hits every tool alike; the
  median is reported. A run longer than ``--long`` seconds is not repeated; a run past
  ``--timeout`` is killed (its whole process group) and recorded as a timeout, and on the
  chains a tool that timed out is not tried on the larger sizes.
* Every output is then checked in a separate process (so a crash in onnxruntime cannot take
  the benchmark down): node count (subgraphs included), BatchNormalization count, whether
  onnxruntime loads it with default options, and equivalence with the input: both run in
  onnxruntime CPU with graph optimisations *disabled*, on the same seeded random input
  (symbolic dims = 1), ``max_rel = max|a-b| / max|a|`` per output, worst output reported.
* A tool that fails (non-zero exit, no output, timeout) is recorded with the first line of
  its error (the exception line of a Python traceback) and the benchmark goes on.

Models: the 9 "light" model-zoo models shipped inside the onnx package (their weights are
ConstantOfShape nodes, so every tool that folds them writes real-sized ~10-550 MB weights),
``resnet50_like()`` from models/make_models.py (ResNet-50 v1.5 shapes, 25.6M parameters,
unfused BN), the committed models/resnet_mini.onnx and models/mobilenet_mini.onnx when
present, and ``conv_bn_relu_chain(N)`` for N = 1000, 2000, 4000 (scaling: time ratio of the
two largest sizes, peak memory against 2x the weight bytes + 200 MB).

The raw measurements are kept as JSON beside the generated models (``--workdir``) and can be
re-rendered with ``--render``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PY = sys.executable
TIME_BIN = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None

# onnxoptimizer: the passes a user would pick for an inference graph. fuse_bn_into_conv is
# the one that matters here; the eliminations are the ones its README recommends.
ONNXOPTIMIZER_PASSES = [
    "eliminate_deadend", "eliminate_identity", "eliminate_nop_dropout",
    "eliminate_nop_transpose", "eliminate_nop_pad", "eliminate_unused_initializer",
    "extract_constant_to_initializer", "fuse_consecutive_transposes",
    "fuse_transpose_into_gemm", "fuse_add_bias_into_conv", "fuse_pad_into_conv",
    "fuse_bn_into_conv",
]

_OPTIMIZER_SCRIPT = (
    "import sys, onnx, onnxoptimizer\n"
    "m = onnx.load(sys.argv[1])\n"
    f"m = onnxoptimizer.optimize(m, {ONNXOPTIMIZER_PASSES!r})\n"
    "onnx.save(m, sys.argv[2])\n"
)
_ORT_BASIC_SCRIPT = (
    "import sys, onnxruntime as ort\n"
    "so = ort.SessionOptions()\n"
    "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC\n"
    "so.optimized_model_filepath = sys.argv[2]\n"
    "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])\n"
)


def _script(name: str) -> str:
    p = BIN / name
    return str(p) if p.exists() else (shutil.which(name) or name)


# name -> (label, module that must import, argv builder). "ours" first: ratios divide by it.
TOOLS = {
    "ours": ("rewrite (ours)", "rewriter",
             lambda i, o: [_script("rewrite"), i, "-o", o]),
    "onnxsim": ("onnxsim", "onnxsim", lambda i, o: [_script("onnxsim"), i, o]),
    "onnxslim": ("onnxslim", "onnxslim", lambda i, o: [_script("onnxslim"), i, o]),
    "onnxoptimizer": ("onnxoptimizer", "onnxoptimizer",
                      lambda i, o: [PY, "-c", _OPTIMIZER_SCRIPT, i, o]),
    "ort-basic": ("onnxruntime basic", "onnxruntime",
                  lambda i, o: [PY, "-c", _ORT_BASIC_SCRIPT, i, o]),
}

LIGHT = ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512"]
QUICK_LIGHT = ["resnet50", "squeezenet"]
GROUP_TITLES = {
    "light": "Light model-zoo models (onnx/backend/test/data/light)",
    "large": "Larger models",
    "chain": "Scaling: N x (Conv 3x3 + BN + Relu), 8 channels, 8x8",
}
# What "equivalent" means in the tables: float32 re-association of a folded BN is ~1e-6 per
# layer; the 4000-block chain accumulates ~5e-5 (models/make_models.py).
EQUIV_TOL = 1e-3
NOTES_MARKER = "<!-- analysis: hand-written, kept when the tables are regenerated -->"


# ------------------------------------------------------------------------ measuring


def run_measured(cmd: list[str], timeout: float, log_dir: Path, tag: str,
                 env: dict | None = None) -> dict:
    """Run one whole process; wall seconds, peak RSS bytes, exit code, error line."""
    load = os.getloadavg()[0]
    out_p, err_p = log_dir / f"{tag}.stdout", log_dir / f"{tag}.stderr"
    rss_p = log_dir / f"{tag}.maxrss"
    rss_p.unlink(missing_ok=True)
    if TIME_BIN:
        # Linux keeps the pre-exec image's peak in the child's ru_maxrss: a child forked from
        # a big parent reports at least the parent's RSS. GNU time is a tiny C parent, so
        # its %M is the tool's own peak.
        cmd = [TIME_BIN, "-f", "%M", "-o", str(rss_p)] + cmd
    timed_out = threading.Event()
    with open(out_p, "wb") as fo, open(err_p, "wb") as fe:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                             start_new_session=True, cwd=str(log_dir), env=env)

        def kill():
            timed_out.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
    rss = ru.ru_maxrss * 1024
    if TIME_BIN:
        try:
            rss = int(rss_p.read_text().split()[-1]) * 1024
        except (OSError, ValueError, IndexError):
            pass  # killed before GNU time wrote it: keep the upper bound
    rec = {"wall": wall, "rss": rss, "rc": p.returncode,
           "user": ru.ru_utime, "sys": ru.ru_stime, "load": load}
    if timed_out.is_set():
        rec["error"] = f"timeout after {timeout:.0f} s"
    elif p.returncode != 0:
        rec["error"] = f"exit {p.returncode}: " + error_line(err_p.read_text(errors="replace"))
    return rec


def error_line(stderr: str) -> str:
    """The line that names the error: the exception line of a traceback, else the first."""
    lines = [ln.rstrip() for ln in stderr.splitlines() if ln.strip()]
    # onnxruntime's own log lines (warnings) are noise here.
    lines = [ln for ln in lines if "[W:onnxruntime" not in ln and not ln.startswith("\x1b[0;93m")]
    if not lines:
        return "(no message)"
    if any(ln.startswith("Traceback") for ln in lines):
        for ln in reversed(lines):
            head = ln.split(":", 1)[0]
            if not ln.startswith(" ") and head and head.replace(".", "").replace("_", "").isalnum():
                return ln[:200]
    return lines[0][:200]


# ------------------------------------------------------------------------ checking outputs


def _inspect(path: str) -> dict:
    import onnx

    m = onnx.load(path, load_external_data=False)
    ops: dict[str, int] = {}

    def walk(g):
        for n in g.node:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(m.graph)
    wbytes = 0
    for t in m.graph.initializer:
        n_el = 1
        for d in t.dims:
            n_el *= d
        size = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if t.data_type else 4
        wbytes += n_el * size
    files = [p for p in Path(path).parent.glob(Path(path).name + "*")]
    return {"nodes": sum(ops.values()), "bn": ops.get("BatchNormalization", 0), "ops": ops,
            "weight_bytes": wbytes, "file_bytes": sum(p.stat().st_size for p in files)}


def _feeds(path: str, seed: int):
    import numpy as np
    import onnx

    m = onnx.load(path, load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in m.graph.input:
        if i.name in inits:
            continue
        tt = i.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
                 for d in tt.shape.dim]
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.floating):
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
        else:
            feeds[i.name] = np.zeros(shape, dt)
    return feeds


def _session(path: str, optimise: bool):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimise:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def evaluate(spec: dict) -> dict:
    """Structure + equivalence of each output against the input (runs in a child process)."""
    import numpy as np

    res: dict = {"input": _inspect(spec["input"]), "outputs": {}}
    feeds = _feeds(spec["input"], spec.get("seed", 0))
    ref_sess = _session(spec["input"], optimise=False)
    ref_names = [o.name for o in ref_sess.get_outputs()]
    ref = ref_sess.run(None, feeds)
    del ref_sess
    for tool, path in spec["outputs"].items():
        r: dict = {}
        res["outputs"][tool] = r
        try:
            r.update(_inspect(path))
        except Exception as e:  # noqa: BLE001
            r["inspect_error"] = error_line(f"{type(e).__name__}: {e}")
            continue
        try:
            _session(path, optimise=True)
            r["loads"] = True
        except Exception as e:  # noqa: BLE001
            r["loads"] = False
            r["load_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        try:
            sess = _session(path, optimise=False)
            names = {i.name for i in sess.get_inputs()}
            out = sess.run(None, {k: v for k, v in feeds.items() if k in names})
            got = dict(zip([o.name for o in sess.get_outputs()], out))
            worst, shape_ok = 0.0, len(out) == len(ref)
            for k, (name, a) in enumerate(zip(ref_names, ref)):
                b = got.get(name, out[k] if k < len(out) else None)
                if b is None or a.shape != b.shape:
                    shape_ok = False
                    continue
                a64, b64 = a.astype(np.float64), b.astype(np.float64)
                scale = float(np.max(np.abs(a64))) if a64.size else 0.0
                diff = float(np.max(np.abs(a64 - b64))) if a64.size else 0.0
                worst = max(worst, diff / scale if scale > 0 else diff)
            r["max_rel"], r["shape_ok"] = worst, shape_ok
        except Exception as e:  # noqa: BLE001
            msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
            if "Required inputs" in msg and "are missing" in msg:
                # e.g. onnxruntime "basic" on old-IR models: it drops folded initializers
                # but keeps them as graph inputs, which then have to be fed.
                n = msg.split("[", 1)[-1].split("]", 1)[0].count("'") // 2
                msg = f"does not run with the model's own inputs: {n} graph inputs lost " \
                      "their initializers"
            r["run_error"] = f"{type(e).__name__}: {msg[:200]}"
    return res


def evaluate_isolated(inp: str, outputs: dict[str, str], work: Path, timeout: float) -> dict:
    """evaluate() in a child process; if it dies, again one output at a time."""
    def child(outs: dict[str, str]) -> dict | str:
        spec_p = work / "eval_spec.json"
        res_p = work / "eval_result.json"
        spec_p.write_text(json.dumps({"input": inp, "outputs": outs, "seed": 0}))
        res_p.unlink(missing_ok=True)
        rec = run_measured([PY, __file__, "--_eval", str(spec_p), str(res_p)], timeout, work,
                           "eval")
        if "error" in rec or not res_p.exists():
            return rec.get("error", "no result")
        return json.loads(res_p.read_text())

    res = child(outputs)
    if isinstance(res, dict):
        return res
    merged: dict = {"outputs": {}, "eval_error": res}
    for tool, path in outputs.items():
        one = child({tool: path})
        if isinstance(one, dict):
            merged["input"] = one["input"]
            merged["outputs"].update(one["outputs"])
        else:
            merged["outputs"][tool] = {"eval_error": one}
    merged.setdefault("input", {})
    return merged


# ------------------------------------------------------------------------ models


def _make_models_module():
    sys.path.insert(0, str(REPO / "models"))
    try:
        import make_models
        return make_models
    except ImportError:
        return None
    finally:
        sys.path.pop(0)


def light_dir() -> Path:
    import importlib.util  # not `import onnx`: the parent stays small (see run_measured)
    spec = importlib.util.find_spec("onnx")
    return Path(next(iter(spec.submodule_search_locations))) / "backend" / "test" / "data" / "light"


def plan_models(args) -> list[dict]:
    """[{name, group, path or builder, n_blocks}] in run order."""
    light = QUICK_LIGHT if args.quick else LIGHT
    chains = [int(x) for x in args.chains.split(",") if x]
    models: list[dict] = []
    for n in light:
        p = light_dir() / f"light_{n}.onnx"
        if p.exists():
            models.append({"name": n, "group": "light", "path": str(p)})
    models.append({"name": "resnet50_like", "group": "large", "build": "resnet50_like"})
    if not args.quick:
        for n in ("resnet_mini", "mobilenet_mini"):
            p = REPO / "models" / f"{n}.onnx"
            if p.exists():
                models.append({"name": n, "group": "large", "path": str(p)})
    for n in chains:
        models.append({"name": f"chain{n}", "group": "chain", "build": "conv_bn_relu_chain",
                       "n_blocks": n})
    if args.models:
        want = {w.strip() for w in args.models.split(",") if w.strip()}
        models = [m for m in models if m["name"] in want or m["group"] in want
                  or f"light_{m['name']}" in want]
    return models


def materialise(m: dict, work: Path) -> str:
    """Path of the model's file; generated ones are built in a child process, so that the
    benchmark process itself never holds a model (its RSS would leak into the children's)."""
    if "path" in m:
        return m["path"]
    path = work / f"{m['name']}.onnx"
    spec_p = work / f"{m['name']}.build.json"
    spec_p.write_text(json.dumps({k: v for k, v in m.items() if k != "tools"}))
    subprocess.run([PY, __file__, "--_build", str(spec_p), str(path)], check=True,
                   capture_output=True, timeout=1800)
    m.update(json.loads(spec_p.read_text()))
    return str(path)


def _build(m: dict, path: Path) -> None:
    import onnx

    mm = _make_models_module()
    fn = getattr(mm, m["build"], None) if mm else None
    if fn is None:
        fn = _FALLBACK_BUILDERS[m["build"]]
        m["source"] = "tools/bench_fp32.py fallback generator"
    else:
        m["source"] = f"models/make_models.py:{m['build']}"
    model = fn(m["n_blocks"]) if "n_blocks" in m else fn()
    onnx.save(model, str(path))


def _fallback_chain(n_blocks: int, channels: int = 8, hw: int = 8, seed: int = 42):
    """Conv 3x3 + BN + Relu chain, used only if models/make_models.py is missing."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "input"
    for i in range(n_blocks):
        q, r = np.linalg.qr(rng.standard_normal((channels, channels)))
        w = rng.normal(0, 0.01, (channels, channels, 3, 3))
        w[:, :, 1, 1] = q * np.sign(np.diag(r))
        p = f"b{i}"
        stats = [rng.uniform(0.8, 1.2, channels), rng.uniform(3.5, 4.5, channels),
                 rng.normal(0, 0.1, channels), rng.uniform(0.8, 1.25, channels)]
        inits.append(numpy_helper.from_array(w.astype(np.float32), f"{p}.w"))
        inits += [numpy_helper.from_array(s.astype(np.float32), f"{p}.bn{k}")
                  for k, s in enumerate(stats)]
        nodes.append(helper.make_node("Conv", [x, f"{p}.w"], [f"{p}.c"], pads=[1] * 4))
        nodes.append(helper.make_node("BatchNormalization", [f"{p}.c"] + [f"{p}.bn{k}" for k in
                                      range(4)], [f"{p}.n"]))
        x = "output" if i == n_blocks - 1 else f"{p}.r"
        nodes.append(helper.make_node("Relu", [f"{p}.n"], [x]))
    shape = ["N", channels, hw, hw]
    g = helper.make_graph(nodes, f"chain{n_blocks}",
                          [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


_FALLBACK_BUILDERS = {"conv_bn_relu_chain": _fallback_chain}


# ------------------------------------------------------------------------ the run


def machine_info() -> dict:
    cpu = "?"
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    versions = {}
    from importlib import metadata
    for pkg in ("rewrite", "onnx", "onnxruntime", "onnx-graphsurgeon", "onnxsim", "onnxslim",
                "onnxoptimizer", "numpy", "protobuf"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10,
                                check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = "?"
    return {"date": _dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "nproc": os.cpu_count(),
            "cpu": cpu, "mem": mem, "python": platform.python_version(),
            "platform": platform.platform(), "versions": versions, "commit": commit,
            "loadavg_start": os.getloadavg()}


def snapshot_ours(spec: str, work: Path) -> tuple[dict | None, str]:
    """The code "ours" runs: a snapshot of the committed tree, byte-compiled.

    Other people edit rewriter/ and passes/ while a run lasts; a snapshot keeps every run of
    one benchmark on one version. It is byte-compiled as ``pip install`` does for the peers'
    wheels (this environment sets PYTHONDONTWRITEBYTECODE, so an editable checkout would
    recompile our modules in every process; see the start-up table). ``worktree`` runs the
    checkout as it is instead.
    """
    if spec == "worktree":
        return None, "working tree (editable install, as is)"
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", spec],
                            capture_output=True, text=True, check=True).stdout.strip()
    arch = subprocess.run(["git", "-C", str(REPO), "archive", commit, "rewriter", "passes"],
                          capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=arch, check=True)
    # passes/ installs as rewriter.passes (package-dir); inside the snapshot's rewriter/ it
    # is found before the editable install's mapping to the checkout's passes/.
    shutil.move(str(src / "passes"), str(src / "rewriter" / "passes"))
    subprocess.run([PY, "-m", "compileall", "-q", str(src)], check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    env = {**os.environ, "PYTHONPATH": str(src)}
    return env, f"commit {commit} (git archive into the work folder, byte-compiled)"


def available_tools(names: list[str]) -> tuple[list[str], dict[str, str]]:
    import importlib.util

    ok, missing = [], {}
    for n in names:
        if n not in TOOLS:
            raise SystemExit(f"unknown tool {n!r}; known: {', '.join(TOOLS)}")
        if importlib.util.find_spec(TOOLS[n][1]) is None:
            missing[n] = f"{TOOLS[n][1]} is not installed"
        else:
            ok.append(n)
    return ok, missing


def startup_floor(tools: list[str], work: Path, repeat: int, timeout: float,
                  ours_env: dict | None) -> dict:
    """Whole-process cost of doing nothing but importing, to separate start-up from work."""
    cmds = {"python -c pass": [PY, "-c", "pass"],
            "import numpy": [PY, "-c", "import numpy"],
            "import onnx": [PY, "-c", "import onnx"],
            "import onnxruntime": [PY, "-c", "import onnxruntime"],
            "import onnx_graphsurgeon": [PY, "-c", "import onnx_graphsurgeon"]}
    mods = {"ours": "rewriter.cli, rewriter.api, rewriter.passes.fold_constants, rewriter.passes.fuse_conv_bn",
            "onnxsim": "onnxsim", "onnxslim": "onnxslim", "onnxoptimizer": "onnx, onnxoptimizer",
            "ort-basic": "onnxruntime"}
    envs = {}
    for t in tools:
        cmds[f"{t}: import {mods[t]}"] = [PY, "-c", f"import {mods[t]}"]
        if t == "ours":
            envs[f"{t}: import {mods[t]}"] = ours_env
            if ours_env is not None:
                # What an editable checkout pays here: our modules compiled in every process.
                label = "ours, not byte-compiled (editable checkout): same imports"
                cmds[label] = [PY, "-c", f"import {mods[t]}"]
                envs[label] = {**os.environ, "PYTHONPATH": str(REPO)}
            cmds["ours: rewrite --list-passes"] = [_script("rewrite"), "--list-passes"]
            envs["ours: rewrite --list-passes"] = ours_env
    out = {}
    for label, cmd in cmds.items():
        runs = [run_measured(cmd, timeout, work, "startup", envs.get(label))
                for _ in range(repeat)]
        good = [r for r in runs if "error" not in r]
        out[label] = {"wall": statistics.median(r["wall"] for r in good) if good else None,
                      "rss": max(r["rss"] for r in good) if good else None,
                      "error": None if good else runs[0].get("error")}
    return out


def bench(args) -> dict:
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_fp32_")).resolve()
    (work / "out").mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    tool_names, missing = available_tools([t.strip() for t in args.tools.split(",")])
    raw_p = work / "results.json"
    results = {"machine": machine_info(), "command": args.command, "repeat": args.repeat,
               "timeout": args.timeout, "tools": tool_names, "missing_tools": missing,
               "equiv_tol": EQUIV_TOL, "onnxoptimizer_passes": ONNXOPTIMIZER_PASSES,
               "models": [], "workdir": str(work),
               "rss_source": "time" if TIME_BIN else "wait4"}

    def save():
        raw_p.write_text(json.dumps(results, indent=1))

    ours_env, results["ours_code"] = snapshot_ours(args.ours_code, work)
    envs = {t: (ours_env if t == "ours" else None) for t in tool_names}
    log(f"ours: {results['ours_code']}")
    log(f"workdir {work}; tools {', '.join(tool_names)}"
        + (f"; missing {missing}" if missing else ""))
    if not args.no_startup:
        log("start-up floor ...")
        results["startup"] = startup_floor(tool_names, work / "logs", max(5, args.repeat),
                                           args.timeout, ours_env)
        save()
    timed_out_chain: dict[str, int] = {}
    for m in plan_models(args):
        log(f"model {m['name']} ...")
        try:
            inp = materialise(m, work)
        except subprocess.CalledProcessError as e:
            m["error"] = "could not build: " + error_line(e.stderr.decode(errors="replace"))
            results["models"].append(m)
            save()
            continue
        except Exception as e:  # noqa: BLE001
            m["error"] = f"could not build: {type(e).__name__}: {e}"
            results["models"].append(m)
            save()
            continue
        m["path"] = inp
        m["tools"] = {t: {"runs": []} for t in tool_names}
        active = []
        for t in tool_names:
            if m["group"] == "chain" and t in timed_out_chain:
                m["tools"][t]["error"] = f"skipped: timed out at N={timed_out_chain[t]}"
            else:
                active.append(t)
        outs = {t: str(work / "out" / f"{m['name']}.{t}.onnx") for t in tool_names}
        for r in range(args.repeat):
            for t in list(active):
                rec = m["tools"][t]
                for p in Path(outs[t]).parent.glob(Path(outs[t]).name + "*"):
                    p.unlink()
                run = run_measured(TOOLS[t][2](inp, outs[t]), args.timeout, work / "logs",
                                   f"{m['name']}.{t}.{r}", envs[t])
                if "error" not in run and not Path(outs[t]).exists():
                    run["error"] = "exit 0 but no output file"
                rec["runs"].append(run)
                log(f"  {t:<14} run {r + 1}: {run['wall']:7.2f} s  {run['rss'] / 2**20:7.0f} MB"
                    + (f"  ERROR {run['error']}" if "error" in run else ""))
                if "error" in run:
                    rec["error"] = run["error"]
                    active.remove(t)
                    if m["group"] == "chain" and run["error"].startswith("timeout"):
                        timed_out_chain[t] = m.get("n_blocks", 0)
                elif run["wall"] > args.long:
                    active.remove(t)  # too long to repeat; its one run stands
            save()
        done = {t: outs[t] for t in tool_names
                if "error" not in m["tools"][t] and Path(outs[t]).exists()}
        log(f"  checking {len(done)} outputs ...")
        ev = evaluate_isolated(inp, done, work / "logs", args.timeout)
        m["input"] = ev.get("input", {})
        if "eval_error" in ev:
            m["eval_error"] = ev["eval_error"]
        for t, r in ev.get("outputs", {}).items():
            m["tools"][t]["check"] = r
        if not args.keep_outputs:
            for t in tool_names:
                for p in Path(outs[t]).parent.glob(Path(outs[t]).name + "*"):
                    p.unlink()
        if "build" in m and not args.keep_outputs:
            Path(inp).unlink(missing_ok=True)
        results["models"].append(m)
        save()
    results["machine"]["loadavg_end"] = os.getloadavg()
    save()
    log(f"raw results: {raw_p}")
    return results


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------ rendering


def _median(rec: dict) -> float | None:
    good = [r["wall"] for r in rec.get("runs", []) if "error" not in r]
    return statistics.median(good) if good and "error" not in rec else None


def _peak(rec: dict) -> float | None:
    good = [r["rss"] for r in rec.get("runs", []) if "error" not in r]
    return statistics.median(good) if good and "error" not in rec else None


def _mb(b) -> str:
    return "-" if b is None else f"{b / 2**20:,.0f}"


def _equiv(chk: dict) -> str:
    if "max_rel" not in chk:
        return "error: " + chk.get("run_error", chk.get("eval_error", chk.get("inspect_error",
                                                                               "not run")))
    mark = "" if chk.get("shape_ok") and chk["max_rel"] <= EQUIV_TOL else " **NOT EQUIV**"
    if not chk.get("shape_ok"):
        mark += " (shape/outputs differ)"
    return f"{chk['max_rel']:.1e}{mark}"


def _tool_rows(m: dict, tools: list[str]) -> list[str]:
    rows = []
    t_ours = _median(m["tools"].get("ours", {}))
    inp = m.get("input", {})
    rows.append(f"| **{m['name']}** | input | | | | {inp.get('nodes', '?')} | "
                f"{inp.get('bn', '?')} | | | {_mb(inp.get('file_bytes'))} MB file |")
    for t in tools:
        rec = m["tools"].get(t, {})
        chk = rec.get("check", {})
        t_med = _median(rec)
        if t_med is None:
            err = rec.get("error", "not run").replace("|", "/")
            rows.append(f"| | {TOOLS[t][0]} | failed | | | | | | | {err} |")
            continue
        n = len([r for r in rec["runs"] if "error" not in r])
        ratio = "1.00" if t == "ours" else (f"{t_med / t_ours:.2f}" if t_ours else "-")
        loads = {True: "yes", False: "**no**"}.get(chk.get("loads"), "?")
        note = chk.get("load_error", "")
        if n == 1 and len(rec["runs"]) == 1 and m.get("_repeat", 1) > 1:
            note = (note + "; " if note else "") + "1 run (too long to repeat)"
        walls = [r["wall"] for r in rec["runs"] if "error" not in r]
        spread = f" ({min(walls):.2f}–{max(walls):.2f})" if len(walls) > 1 else ""
        rows.append(f"| | {TOOLS[t][0]} | {t_med:.2f}{spread} | {ratio} | {_mb(_peak(rec))} | "
                    f"{chk.get('nodes', '?')} | {chk.get('bn', '?')} | {loads} | "
                    f"{_equiv(chk)} | {_mb(chk.get('file_bytes'))} MB{'; ' + note if note else ''} |")
    return rows


def _verdict(m: dict, tools: list[str], large: bool) -> str:
    t_ours = _median(m["tools"].get("ours", {}))
    peers = {t: _median(m["tools"][t]) for t in tools if t != "ours" and t in m["tools"]}
    peers = {t: v for t, v in peers.items() if v is not None}
    if t_ours is None:
        return f"| {m['name']} | failed | | | | | | | | |"
    if not peers:
        return f"| {m['name']} | {t_ours:.2f} | no peer finished | | | | | | | |"
    fast_t = min(peers, key=peers.get)
    fast = peers[fast_t]
    beaten = [t for t, v in peers.items() if v < t_ours]
    chk = m["tools"]["ours"].get("check", {})
    nodes_ours = chk.get("nodes")
    peer_nodes = [m["tools"][t].get("check", {}).get("nodes") for t in peers]
    peer_nodes = [n for n in peer_nodes if n is not None]
    nodes_ok = ("-" if nodes_ours is None or not peer_nodes else
                ("yes" if nodes_ours <= min(peer_nodes) else f"**no** ({nodes_ours} vs {min(peer_nodes)})"))
    faster = "yes" if not beaten else "**no**: slower than " + ", ".join(TOOLS[t][0] for t in beaten)
    # A peer that is faster because it did less (more nodes left) or wrote something that
    # does not run with the model's inputs or differs is a different result, not a win.
    as_good = [t for t in beaten if _as_good(m["tools"][t].get("check", {}), nodes_ours)]
    real = ("-" if not beaten else "none" if not as_good else
            "**" + ", ".join(TOOLS[t][0] for t in as_good) + "**")
    half = ("yes" if t_ours <= 0.5 * fast else "**no**") if large else "n/a"
    return (f"| {m['name']} | {t_ours:.2f} | {TOOLS[fast_t][0]} {fast:.2f} | "
            f"{t_ours / fast:.2f} | {_paired(m, fast_t)} | {faster} | {real} | {half} | "
            f"{nodes_ok} | {_equiv(chk)} |")


def _paired(m: dict, peer: str) -> str:
    """Ours / ``peer`` round by round (runs are interleaved, so round i of each ran under
    about the same load): the median ratio, its 95% bootstrap interval, and in how many
    rounds ours was faster. "-" with fewer than 5 complete rounds."""
    runs = [m["tools"][t].get("runs", []) for t in ("ours", peer)]
    if len(runs[0]) != len(runs[1]) or len(runs[0]) < 5 or any(
            "error" in r for rs in runs for r in rs):
        return "-"
    import numpy as np
    q = np.array([r["wall"] for r in runs[0]]) / np.array([r["wall"] for r in runs[1]])
    rng = np.random.default_rng(0)
    boot = np.median(rng.choice(q, (5000, len(q))), axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return f"{np.median(q):.2f} ({lo:.2f}–{hi:.2f}), {int((q < 1).sum())}/{len(q)}"


def _as_good(chk: dict, nodes_ours) -> bool:
    return (nodes_ours is not None and chk.get("nodes") is not None
            and chk["nodes"] <= nodes_ours and chk.get("loads") is True
            and chk.get("shape_ok") is True and chk.get("max_rel", 1.0) <= EQUIV_TOL)


def render(res: dict) -> str:
    mi = res["machine"]
    tools = res["tools"]
    L: list[str] = []
    L.append("# FP32 pipeline benchmark: rewrite vs onnxsim, onnxslim, onnxoptimizer, "
             "onnxruntime basic\n")
    L.append(f"Generated by `tools/bench_fp32.py` on {mi['date']} "
             f"(repo commit {mi['commit']}). Reproduce with:\n")
    L.append(f"```\n{res['command']}\n```\n")
    L.append(f"Machine: {mi['nproc']} cores ({mi['cpu']}), {mi['mem']} RAM, Python "
             f"{mi['python']}, {mi['platform']}; shared and noisy (load average "
             f"{mi['loadavg_start'][0]:.2f} at start, "
             f"{mi.get('loadavg_end', [float('nan')])[0]:.2f} at end). Versions: "
             + ", ".join(f"{k} {v}" for k, v in mi["versions"].items()) + ".\n")
    if res.get("ours_code"):
        L.append(f"Our code: {res['ours_code']}.\n")
    if res.get("missing_tools"):
        L.append("Not measured: " + "; ".join(f"{k} ({v})" for k, v in
                                               res["missing_tools"].items()) + ".\n")
    L.append(
        "How: every tool is a separate whole process per model (start-up and imports "
        f"included), R = {res['repeat']} runs interleaved across tools, median wall time; peak "
        f"RSS from {'GNU time %M (the tool process alone)' if res.get('rss_source') == 'time' else 'the child rusage (os.wait4)'}. Commands: "
        "`rewrite IN -o OUT` (the default, static MIGraphX check included); `onnxsim IN OUT`; `onnxslim IN OUT`; "
        "onnxoptimizer: `python -c` load, `onnxoptimizer.optimize(model, "
        f"{res['onnxoptimizer_passes']})`, save; onnxruntime basic: `python -c` "
        "InferenceSession with ORT_ENABLE_BASIC and optimized_model_filepath. "
        "All with default settings (no tool verifies its output by default). Checks: nodes "
        "(subgraphs included), BatchNormalization left, loads in onnxruntime (default "
        "options), max_rel = max|a-b|/max|a| of the worst output against the input model, "
        "both in onnxruntime CPU with optimisations disabled, seeded N(0,1) input with "
        f"symbolic dims = 1; 'NOT EQUIV' above {res['equiv_tol']:g}. "
        f"Runs past {res['timeout']:.0f} s are killed. × ours = tool time / our time "
        "(above 1: we are faster).\n")

    if res.get("startup"):
        L.append("## Start-up floor (a process that only imports)\n")
        L.append("| command | wall s | peak RSS MB |")
        L.append("|---|---:|---:|")
        for k, v in res["startup"].items():
            w = "-" if v["wall"] is None else f"{v['wall']:.2f}"
            L.append(f"| `{k}` | {w} | {_mb(v['rss'])} |" if not v.get("error")
                     else f"| `{k}` | failed: {v['error']} | |")
        L.append("")

    header = ("| model | tool | time s, median (min–max) | × ours | peak RSS MB | nodes | BN | loads in ORT | "
              "max_rel vs input | output size / notes |")
    sep = "|---|---|---:|---:|---:|---:|---:|---|---|---|"
    for group in ("light", "large", "chain"):
        ms = [m for m in res["models"] if m["group"] == group]
        if not ms:
            continue
        L.append(f"## {GROUP_TITLES[group]}\n")
        for m in ms:
            m["_repeat"] = res["repeat"]
        L.append("### Verdict against the goals\n")
        L.append("| model | ours s | fastest peer s | ours / fastest | paired per round² | "
                 "faster than every peer | "
                 "faster peers with an as-good output¹ | ≤ 0.5 × fastest | nodes ≤ every peer | "
                 "our max_rel |")
        L.append("|---|---:|---|---:|---|---|---|---|---|---|")
        for m in ms:
            if "error" in m:
                L.append(f"| {m['name']} | {m['error']} | | | | | | | | |")
            else:
                L.append(_verdict(m, tools, large=group in ("large", "chain")))
        L.append("\n¹ A faster peer whose output runs in onnxruntime with the model's own inputs, "
                 f"matches the input within {EQUIV_TOL:g} and has no more nodes than ours.\n"
                 "² Ours / the fastest peer in each interleaved round: median ratio (95% "
                 "bootstrap interval), rounds in which ours was faster. Below 1 with the whole "
                 "interval below 1: faster with confidence.\n")
        if group == "chain":
            L.extend(_scaling(ms, tools))
        L.append("### Details\n")
        L.append(header)
        L.append(sep)
        for m in ms:
            if "error" not in m:
                L.extend(_tool_rows(m, tools))
        L.append("")
        srcs = sorted({m["source"] for m in ms if m.get("source")})
        if srcs:
            L.append("Generated by " + ", ".join(f"`{s}`" for s in srcs) + ".\n")
    return "\n".join(L) + "\n"


def _scaling(ms: list[dict], tools: list[str]) -> list[str]:
    ms = sorted([m for m in ms if "n_blocks" in m and "tools" in m], key=lambda m: m["n_blocks"])
    if len(ms) < 2:
        return []
    a, b = ms[-2], ms[-1]
    L = ["### Scaling\n",
         (f"Time ratio t({b['n_blocks']})/t({a['n_blocks']}) (goal ≤ 2.3 for a doubling) and peak "
          f"RSS against 2 × weight bytes + 200 MB at N = {b['n_blocks']} (weights "
          f"{_mb(b.get('input', {}).get('weight_bytes'))} MB).\n"),
         "| tool | " + " | ".join(f"t({m['n_blocks']}) s" for m in ms)
         + f" | t({b['n_blocks']})/t({a['n_blocks']}) | ≤ 2.3 | "
         + " | ".join(f"RSS({m['n_blocks']}) MB" for m in ms) + " | budget MB | under budget |",
         "|---|" + "---:|" * len(ms) + "---:|---|" + "---:|" * len(ms) + "---:|---|"]
    wb = b.get("input", {}).get("weight_bytes")
    budget = None if wb is None else 2 * wb + 200 * 2**20
    for t in tools:
        ts = [_median(m["tools"].get(t, {})) for m in ms]
        rs = [_peak(m["tools"].get(t, {})) for m in ms]
        cells = [("-" if v is None else f"{v:.2f}") if v is not None or "error" not in
                 m["tools"].get(t, {}) else _short(m["tools"][t]["error"]) for v, m in zip(ts, ms)]
        ratio = ts[-1] / ts[-2] if ts[-1] and ts[-2] else None
        ok = "-" if ratio is None else ("yes" if ratio <= 2.3 else "**no**")
        under = "-" if rs[-1] is None or budget is None else ("yes" if rs[-1] <= budget else "**no**")
        L.append(f"| {TOOLS[t][0]} | " + " | ".join(cells) + " | "
                 + ("-" if ratio is None else f"{ratio:.2f}") + f" | {ok} | "
                 + " | ".join(_mb(r) for r in rs) + f" | {_mb(budget)} | {under} |")
    L.append("")
    return L


def _short(err: str) -> str:
    return err.split(":")[0] if err.startswith(("timeout", "skipped")) else "failed"


# ------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_build"]:
        m = json.loads(Path(argv[1]).read_text())
        _build(m, Path(argv[2]))
        Path(argv[1]).write_text(json.dumps(m))
        return 0
    if argv[:1] == ["--_eval"]:
        spec = json.loads(Path(argv[1]).read_text())
        Path(argv[2]).write_text(json.dumps(evaluate(spec)))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 light models, resnet50_like, chains 500,1000; R=1")
    ap.add_argument("--models", help="comma list of model names or groups (light, large, "
                    "chain), e.g. resnet50,resnet50_like,chain1000")
    ap.add_argument("--tools", default=",".join(TOOLS), help=f"comma list of {', '.join(TOOLS)}")
    ap.add_argument("--repeat", type=int, help="runs per (model, tool) (default 3, quick 1)")
    ap.add_argument("--chains", help="chain sizes (default 1000,2000,4000; quick 500,1000)")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds per run (default 420)")
    ap.add_argument("--long", type=float, default=60.0,
                    help="a run longer than this is not repeated (default 60 s)")
    ap.add_argument("--out", default=str(REPO / "docs" / "benchmarks_fp32.md"),
                    help="markdown file to write (default docs/benchmarks_fp32.md)")
    ap.add_argument("--workdir", help="folder for generated models, logs and results.json "
                    "(default: a new temp folder)")
    ap.add_argument("--keep-outputs", action="store_true", help="keep the tools' outputs")
    ap.add_argument("--no-startup", action="store_true", help="skip the start-up floor")
    ap.add_argument("--ours-code", default="HEAD", metavar="REV|worktree",
                    help="which code 'ours' runs: a byte-compiled snapshot of a git revision "
                    "(default HEAD) or the working tree as it is ('worktree')")
    ap.add_argument("--render", metavar="RESULTS_JSON", help="only render a finished run")
    args = ap.parse_args(argv)
    if args.render:
        res = json.loads(Path(args.render).read_text())
    else:
        args.repeat = args.repeat or (1 if args.quick else 3)
        args.chains = args.chains or ("500,1000" if args.quick else "1000,2000,4000")
        try:
            rel = Path(__file__).resolve().relative_to(Path.cwd())
        except ValueError:
            rel = Path(__file__).resolve()
        args.command = " ".join(["python", str(rel)] + argv)
        res = bench(args)
    md = render(res)
    print(md)
    if args.out and args.out != "-":
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        # Hand-written analysis below the marker survives a re-run.
        if out.exists() and NOTES_MARKER in out.read_text():
            md += "\n" + NOTES_MARKER + out.read_text().split(NOTES_MARKER, 1)[1]
        out.write_text(md)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
