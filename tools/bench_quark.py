"""AMD Quark ONNX PTQ on the quant_eval tasks, MIGraphX-style int8 QDQ only: the peer rows
of docs/benchmarks_quant.md ("INT8 techniques").

    python -m venv --system-site-packages /tmp/quark_venv
    /tmp/quark_venv/bin/pip install amd-quark==0.13      # pins onnx<=1.22: keep it apart
    /tmp/quark_venv/bin/python tools/bench_quark.py --task orient-photo
    ... --task cls-lines --variants minmax,percentile,entropy,cle,adaround --adaround-iters 100
    (results -> $QUARK_BENCH/results/<task>.json; models -> $QUARK_BENCH/work/<task>/,
    QUARK_BENCH defaults to /tmp/quark_bench)

The venv sees the system site-packages, so torch (CPU) and the editable `rewriter` come from
the system Python; amd-quark 0.13 pins onnx<=1.22, so it lives in the venv.

Every variant: signed int8 activations (per-tensor) and weights (per-channel), symmetric
(zero point 0), float32 (not power-of-2) scales, QDQ with ai.onnx QuantizeLinear /
DequantizeLinear (no Vitis / com.microsoft ops), NPU CNN off.
Data: quant_eval.task_data, calibration 64 samples seed 0, evaluation 300 samples seed 1;
reference = the original FP32 model in onnxruntime (quant_eval.outputs, optimisations off).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, version_converter

sys.path.insert(0, str(Path(__file__).resolve().parent))
import quant_eval as qe  # noqa: E402

from onnxruntime.quantization.calibrate import CalibrationDataReader  # noqa: E402
from quark.onnx import ModelQuantizer  # noqa: E402
from quark.onnx.quantization.config.algorithm import AdaRoundConfig, CLEConfig  # noqa: E402
from quark.onnx.quantization.config.config import QConfig  # noqa: E402
from quark.onnx.quantization.config.data_type import Int8  # noqa: E402
from quark.onnx.quantization.config.spec import (  # noqa: E402
    CalibMethod, QLayerConfig, QTensorConfig, QuantGranularity, ScaleType)

BASE = Path(os.environ.get("QUARK_BENCH", "/tmp/quark_bench"))
N_CALIB, CALIB_SEED, N_EVAL, EVAL_SEED = 64, 0, 300, 1
CALIB = {"minmax": CalibMethod.MinMax, "percentile": CalibMethod.Percentile,
         "entropy": CalibMethod.Entropy}


# ----------------------------------------------------------------------------- config
def qconfig(calib: str, algos=()) -> QConfig:
    """The one config family used everywhere; only the activation range method / algos vary."""
    act = QTensorConfig(symmetric=True, scale_type=ScaleType.Float32,
                        calibration_method=CALIB[calib],
                        quant_granularity=QuantGranularity.Tensor, data_type=Int8)
    # Weights: the weight calibrate method maps to MinMax for anything but MinMSE.
    wgt = QTensorConfig(symmetric=True, scale_type=ScaleType.Float32,
                        calibration_method=CalibMethod.MinMax,
                        quant_granularity=QuantGranularity.Channel, data_type=Int8)
    extra = {
        # as in Quark's own A8W8_QCONFIG, minus FoldRelu (dropping Relu is only exact with an
        # asymmetric/unsigned range; with symmetric int8 it would let negatives through)
        "ForceQuantizeNoInputCheck": True, "AlignSlice": False, "AlignConcat": True,
        "FoldRelu": False,
        "UseQDQVitisCustomOps": False,   # standard ai.onnx QuantizeLinear/DequantizeLinear
        "UseQDQContribOps": False,       # not com.microsoft
        "EnableNPUCnn": False,
        "Percentile": 99.999,            # Quark's default; only read by the Percentile method
    }
    return QConfig(global_config=QLayerConfig(input_tensors=act, weight=wgt),
                   algo_config=list(algos), use_external_data_format=False,
                   extra_options=extra)


def adaround(iters: int) -> AdaRoundConfig:
    # Quark's INT8_CNN_ACCURATE / DEFAULT_ADAROUND_PARAMS values (CPU, batch 2, lr 0.1, early
    # stop) except the iteration count: Quark's 1000 per layer took 88-184 s per layer here
    # (while other jobs shared the 2 cores), so a 100-iteration run is added beside it.
    return AdaRoundConfig(optim_device="cpu", infer_device="cpu", batch_size=2,
                          num_iterations=iters, learning_rate=0.1, early_stop=True,
                          data_size=N_CALIB)


# ----------------------------------------------------------------------------- data/model
class Reader(CalibrationDataReader):
    def __init__(self, xs, name):
        self.xs, self.name, self.i = xs, name, 0

    def get_next(self):
        if self.i >= len(self.xs):
            return None
        self.i += 1
        return {self.name: self.xs[self.i - 1:self.i]}

    def rewind(self):
        self.i = 0

    def __len__(self):
        return len(self.xs)


def prepare(task: str, work: Path) -> tuple[Path, list[str]]:
    """Static 1x3xHxW input; opset raised to 13 where lower (per-channel QDQ needs axis)."""
    fname, _, (h, w) = qe.TASKS[task]
    m = onnx.load(str(qe.CACHE / fname))
    notes = []
    inits = {i.name for i in m.graph.initializer}
    inp = [i for i in m.graph.input if i.name not in inits][0]
    for d, v in zip(inp.type.tensor_type.shape.dim, (1, 3, h, w)):
        d.ClearField("dim_param")
        d.dim_value = v
    notes.append(f"input {inp.name} fixed to 1x3x{h}x{w}")
    op = max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    if op < 13:
        m = version_converter.convert_version(m, 13)
        notes.append(f"opset {op} -> 13 (onnx.version_converter)")
    out = work / f"{Path(fname).stem}_prep.onnx"
    onnx.save(m, str(out))
    return out, notes


# ----------------------------------------------------------------------------- form check
def _pow2(v: np.ndarray) -> np.ndarray:
    m, _ = np.frexp(v.astype(np.float64))
    return np.abs(m) == 0.5


def form_check(path: Path) -> dict:
    m = onnx.load(str(path))
    g = m.graph
    init = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    const = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node
             if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    init.update(const)
    producer = {o: n for n in g.node for o in n.output}
    qdq = [n for n in g.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    bad_domain = sorted({f"{n.domain}:{n.op_type}" for n in g.node
                         if n.domain not in ("", "ai.onnx")})
    zp_missing, zp_nonzero, zp_types, scales = 0, 0, {}, []
    for n in qdq:
        if len(n.input) < 3 or not n.input[2] or n.input[2] not in init:
            zp_missing += 1
            continue
        zp = init[n.input[2]]
        zp_types[str(zp.dtype)] = zp_types.get(str(zp.dtype), 0) + 1
        zp_nonzero += int(np.any(zp != 0))
        if n.input[1] in init and zp.dtype == np.int8:
            scales.append(init[n.input[1]].ravel())
    sc = np.concatenate(scales) if scales else np.zeros(0)
    # weights: input 1 of Conv/Gemm/MatMul through a DequantizeLinear of an int8 initializer
    wt = {"per_channel": 0, "per_tensor": 0, "float": 0}
    int8_convs = 0
    convs = [n for n in g.node if n.op_type == "Conv"]
    for n in g.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2:
            continue
        d = producer.get(n.input[1])
        if d is None or d.op_type != "DequantizeLinear":
            if n.input[1] in init:
                wt["float"] += 1
            continue
        s = init.get(d.input[1])
        if s is not None and s.size > 1:
            wt["per_channel"] += 1
        else:
            wt["per_tensor"] += 1
        a = producer.get(n.input[0])
        if n.op_type == "Conv" and a is not None and a.op_type == "DequantizeLinear":
            int8_convs += 1
    ok = (not bad_domain and zp_missing == 0 and zp_nonzero == 0 and
          set(zp_types) <= {"int8", "int32"} and zp_types.get("int8", 0) > 0 and
          sc.size > 0 and not bool(_pow2(sc).all()) and wt["per_tensor"] == 0)
    return {"ok": bool(ok), "qdq_nodes": len(qdq), "non_default_domain_ops": bad_domain,
            "zero_point_dtypes": zp_types, "zero_points_missing": zp_missing,
            "zero_points_nonzero": zp_nonzero, "int8_scales": int(sc.size),
            "int8_scales_pow2": int(_pow2(sc).sum()) if sc.size else 0,
            "weights": wt, "int8_convs": int8_convs, "convs": len(convs),
            "opset": [(o.domain, o.version) for o in m.opset_import]}


# ----------------------------------------------------------------------------- main
def run_variant(name, cfg, prep, out, xc, xe, ye, ref, inp, ref_c):
    load0 = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    err = None
    try:
        ModelQuantizer(cfg).quantize_model(str(prep), str(out), Reader(xc, inp))
    except Exception as e:  # report, do not hide
        err = f"{type(e).__name__}: {e}"
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    # wall time, this process's CPU time (all threads), 1-min load average before/after: the
    # machine is shared, so wall time alone can be inflated by other people's jobs
    row = {"variant": name, "seconds": round(secs, 1), "cpu_seconds": round(cpu, 1),
           "loadavg_before_after": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    if err or not out.exists():
        row["error"] = err or "no output written"
        return row
    row["form"] = form_check(out)
    row.update(qe.judge(ref, qe.outputs(str(out), xe), ye))
    # selection signal that never looks at the evaluation set
    row["calib_cosine"] = qe.judge(ref_c, qe.outputs(str(out), xc), None)["cosine"]
    return row


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--task", required=True, choices=list(qe.TASKS))
    p.add_argument("--variants", default="minmax,percentile,entropy,cle,adaround")
    p.add_argument("--adaround-iters", default="100,1000",
                   help="comma list; 1000 = Quark's own default (INT8_CNN_ACCURATE)")
    p.add_argument("--resume", action="store_true",
                   help="keep rows already in the JSON and run only the missing variants")
    p.add_argument("--out", help="JSON path (default /tmp/quark_bench/results/<task>.json)")
    a = p.parse_args()
    work = BASE / "work" / a.task
    work.mkdir(parents=True, exist_ok=True)
    (BASE / "results").mkdir(exist_ok=True)
    out_json = Path(a.out or BASE / "results" / f"{a.task}.json")

    prep, notes = prepare(a.task, work)
    inp = onnx.load(str(prep)).graph.input[0].name
    xc, _ = qe.task_data(a.task, N_CALIB, CALIB_SEED)
    xe, ye = qe.task_data(a.task, N_EVAL, EVAL_SEED)
    orig = str(qe.CACHE / qe.TASKS[a.task][0])
    ref = qe.outputs(orig, xe)
    ref_c = qe.outputs(orig, xc)
    prep_diff = float(np.abs(qe.outputs(str(prep), xe[:20]) - ref[:20]).max())
    import quark
    import torch
    import onnxruntime
    res = {"task": a.task, "quark": quark.__version__, "torch": torch.__version__,
           "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
           "prep": notes, "prep_max_abs_diff_vs_original": prep_diff,
           "n_calib": N_CALIB, "n_eval": N_EVAL, "rows": []}
    if ye is not None:
        res["acc_fp32"] = float((ref.argmax(1) == ye).mean())
    variants = a.variants.split(",")
    rows = res["rows"]
    if a.resume and out_json.exists():
        rows += [r for r in json.loads(out_json.read_text())["rows"] if "error" not in r]
    done = {r["variant"] for r in rows}

    def save():
        out_json.write_text(json.dumps(res, indent=1, default=str))

    for v in [v for v in variants if v in CALIB and v not in done]:
        r = run_variant(v, qconfig(v), prep, work / f"{v}.onnx", xc, xe, ye, ref, inp, ref_c)
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)
        save()
    # "best" of the range methods, chosen on the calibration set (cosine vs FP32), not on eval
    ok = [r for r in rows if r["variant"] in CALIB and "error" not in r]
    best = max(ok, key=lambda r: r["calib_cosine"])["variant"] if ok else "percentile"
    res["best_range_method"] = best
    if "cle" in variants and f"{best}+cle" not in done:
        r = run_variant(f"{best}+cle", qconfig(best, [CLEConfig()]), prep,
                        work / f"{best}_cle.onnx", xc, xe, ye, ref, inp, ref_c)
        rows.append(r)
        print(json.dumps(r, default=str), flush=True)
        save()
    if "adaround" in variants:
        # on top of the better of best / best+CLE (again by calibration cosine)
        cand = [r for r in rows if r["variant"] in (best, f"{best}+cle") and "error" not in r]
        use_cle = bool(cand) and max(cand, key=lambda r: r["calib_cosine"])["variant"].endswith("cle")
        for iters in [int(i) for i in a.adaround_iters.split(",")]:
            algos = ([CLEConfig()] if use_cle else []) + [adaround(iters)]
            name = f"{best}{'+cle' if use_cle else ''}+adaround{iters}"
            if name in done:
                continue
            r = run_variant(name, qconfig(best, algos), prep,
                            work / f"{name.replace('+', '_')}.onnx", xc, xe, ye, ref, inp, ref_c)
            rows.append(r)
            print(json.dumps(r, default=str), flush=True)
            save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
