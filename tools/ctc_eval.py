"""How a quantized CTC text recogniser keeps FP32's text, on fresh rendered lines.

    python tools/ctc_eval.py MODEL [--calib-dir DIR] [--plan default --plan auto] \
        [--size 64x256] [--grey] [--mean 0.5 --std 0.5] [--n-calib 64] [--n 200] [--seed 7]

Writes ``--n-calib`` rendered text lines (tools/calib_images.py ``text_crops``, seed 0) as
PNG files into ``--calib-dir``, rewrites MODEL with each ``--plan`` (``--preprocess`` from
``--size``/``--mean``/``--std``), then runs MODEL and each plan model in onnxruntime (graph
optimisations off) on ``--n`` fresh lines (``--seed``) and prints, against FP32: the
per-position top-1 agreement, the share of lines whose every position agrees, and the share
whose greedy CTC decoding (blank 0, repeats merged) is the same text. The input is the
model's first; its layout NCHW, one channel with ``--grey``. docs/robustness.md has the
ddddocr table this printed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calib_images as ci  # noqa: E402


def decode(ids) -> list[int]:
    return [int(c) for i, c in enumerate(ids) if c != 0 and (i == 0 or ids[i - 1] != c)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--calib-dir")
    ap.add_argument("--plan", action="append", default=[])
    ap.add_argument("--size", default="64x256")
    ap.add_argument("--grey", action="store_true")
    ap.add_argument("--mean", type=float, default=0.5)
    ap.add_argument("--std", type=float, default=0.5)
    ap.add_argument("--n-calib", type=int, default=64)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    import onnxruntime as ort
    from PIL import Image

    ort.set_default_logger_severity(3)
    h, w = (int(v) for v in a.size.lower().split("x"))
    work = Path(tempfile.mkdtemp(prefix="ctc_eval_"))
    calib = Path(a.calib_dir) if a.calib_dir else work / "calib"
    calib.mkdir(parents=True, exist_ok=True)
    for i, (x, _) in enumerate(ci.text_crops(a.n_calib, size=(h, w), seed=0,
                                             rotate_fraction=0)):
        img = (np.transpose(x, (1, 2, 0)) * 255).round().astype(np.uint8)
        Image.fromarray(img).save(calib / f"l{i:03d}.png")
    pre = work / "pre.yaml"
    pre.write_text(f"size: [{h}, {w}]\nmean: {a.mean}\nstd: {a.std}\n")
    models = {"fp32": a.model}
    for plan in a.plan:
        out = work / f"{plan}.onnx"
        subprocess.run([sys.executable, "-m", "rewriter.cli", a.model, "-o", str(out), "-q",
                        "--plan", plan, "--calib", str(calib), "--preprocess", str(pre),
                        "--target", "none"], check=True)
        models[plan] = str(out)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sessions = {k: ort.InferenceSession(v, so) for k, v in models.items()}
    name = sessions["fp32"].get_inputs()[0].name
    ids: dict[str, list[np.ndarray]] = {k: [] for k in sessions}
    for x, _ in ci.text_crops(a.n, size=(h, w), seed=a.seed, rotate_fraction=0):
        x = x.mean(axis=0, keepdims=True) if a.grey else x
        feed = {name: ((x[None] - a.mean) / a.std).astype(np.float32)}
        for k, s in sessions.items():
            ids[k].append(s.run(None, feed)[0].argmax(-1).ravel())
    print(f"{Path(a.model).name}: {a.n} fresh lines (seed {a.seed}), against FP32")
    print("plan       per-position top-1   every position   decoded text equal")
    for k in a.plan:
        pos = np.mean([np.mean(r == q) for r, q in zip(ids["fp32"], ids[k])])
        every = np.mean([np.all(r == q) for r, q in zip(ids["fp32"], ids[k])])
        text = np.mean([decode(r) == decode(q) for r, q in zip(ids["fp32"], ids[k])])
        print(f"{k:<10} {pos:>18.4f} {every:>16.3f} {text:>20.3f}")


if __name__ == "__main__":
    main()
