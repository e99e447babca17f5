"""How a quantized model keeps each component of an output whose parts differ in scale.

    python tools/scale_groups_eval.py MODEL --calib-dir DIR [--size 160] [--n-calib 32] \
        [--plan auto --plan default] [--rewriter SNAPSHOT ...] [--n 100] [--seed 11]

Writes ``--n-calib`` photo crops (tools/calib_images.py, pixel values in 0-1, NCHW) into
``--calib-dir``, rewrites MODEL with each ``--plan`` (the installed rewriter, and the
rewriter package at each ``--rewriter`` folder, e.g. an older commit from ``git archive``),
then judges every plan model against MODEL in onnxruntime (graph optimisations off) on
``--n`` fresh crops (``--seed``): the whole output's cosine and, per group of
``metrics.scale_split`` of the FP32 output (e.g. YOLO's box rows and class-score rows), the
per-sample mean cosine and the largest absolute error. docs/plans.md has the NudeNet table
this printed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calib_images as ci  # noqa: E402


def outputs(path: str, name: str, xs: list[np.ndarray]) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return np.concatenate([s.run(None, {name: x[None]})[0] for x in xs])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--calib-dir", required=True)
    p.add_argument("--size", type=int, default=160)
    p.add_argument("--n-calib", type=int, default=32)
    p.add_argument("--plan", action="append", default=None)
    p.add_argument("--rewriter", action="append", default=[],
                   help="folder holding an older rewriter package (PYTHONPATH)")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--seed", type=int, default=11)
    a = p.parse_args()
    a.model, a.calib_dir = os.path.abspath(a.model), os.path.abspath(a.calib_dir)
    import onnx

    from rewriter.verify.metrics import cosine, scale_split

    ci.write_calib_dir(a.calib_dir, a.n_calib, (1, 3, a.size, a.size), mean=(0, 0, 0),
                       std=(1, 1, 1), seed=3)
    name = onnx.load(a.model, load_external_data=False).graph.input[0].name
    work = Path(tempfile.mkdtemp(prefix="scale-groups-"))
    models = {}
    for plan in a.plan or ["auto"]:
        for tag, where in [("installed", None)] + [(Path(r).name, r) for r in a.rewriter]:
            out = work / f"{plan}.{tag}.onnx"
            env = dict(os.environ, **({"PYTHONPATH": where} if where else {}))
            subprocess.run([sys.executable, "-m", "rewriter.cli", a.model, "-o", str(out),
                            "--plan", plan, "--calib", a.calib_dir, "--target", "none", "-q"],
                           check=True, env=env, cwd=work)   # not the checkout's package
            counts = {}
            for n in onnx.load(str(out)).graph.node:
                counts[n.op_type] = counts.get(n.op_type, 0) + 1
            models[f"{plan} ({tag})"] = (str(out), counts.get("QuantizeLinear", 0))
    xs = [x.astype(np.float32) for x in ci.image_crops(a.n, (a.size, a.size), a.seed)]
    ref = outputs(a.model, name, xs)
    split = scale_split(ref)
    print(f"{a.n} fresh crops (seed {a.seed}); groups along axis "
          f"{split[0] if split else '-'}: {split[1] if split else 'none'}")
    for label, (path, qs) in models.items():
        out = outputs(path, name, xs)
        line = f"{label:<28} Q nodes {qs:4d}  whole {cosine(ref, out):.5f}"
        for g in (split[1] if split else []):
            r, o = np.take(ref, g, axis=split[0]), np.take(out, g, axis=split[0])
            per = np.mean([cosine(r[i], o[i]) for i in range(len(xs))])
            line += (f"  [{g[0]}..{g[-1]}] cosine {per:.4f} max err "
                     f"{float(np.abs(r - o).max()):.3f}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
