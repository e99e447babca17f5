"""Throughput and latency of the original, the FP32-rewritten and a plan's model, side by side.

    python tools/bench.py MODEL --batch 64 --input-shape input:64x3x224x224 \\
        [--plan default --calib DIR] [--backend onnxruntime|migraphx] [--iterations 50]

For comparison with the published MI250X ResNet-50 figures at batch 64 (512 img/s in
PyTorch, 1248 after MIGraphX graph optimisation, 2176 with INT8), run it on the GPU machine
with ``--backend migraphx``; MIGraphX compiles each model for the GPU and the figures are
``prog.run`` throughput after warm-up. With ``--backend onnxruntime`` (the default here,
CPU) the figures say nothing about a GPU: QDQ models run slower than FP32 on onnxruntime's
CPU kernels (shared FACTS.md). Prints a markdown table; ``--json`` for tools.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


import rewriter  # noqa: E402
from rewriter.core.load import load_model  # noqa: E402
from rewriter.verify import make_feeds, parse_shape_args  # noqa: E402


def bench_ort(path: str, feeds: dict, iterations: int, warmup: int) -> dict:
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for _ in range(warmup):
        sess.run(None, feeds)
    times = []
    for _ in range(iterations):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    return {"latency_ms": {"median": 1e3 * statistics.median(times), "min": 1e3 * min(times)}}


def bench_migraphx(path: str, feeds: dict, shapes: dict, iterations: int, warmup: int,
                   device: str) -> dict:
    from rewriter.migraphx import backend as migraphx

    ok, why = migraphx.available()
    if not ok:
        raise SystemExit(f"bench: --backend migraphx: {why}")
    r = migraphx.benchmark(path, feeds, input_shapes=shapes or None, target=device,
                           iterations=iterations, warmup=warmup)
    return {"latency_ms": {"median": r["latency_ms"]["median"], "min": r["latency_ms"]["min"]},
            "compile_seconds": r.get("compile_seconds")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools/bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--input-shape", action="append", metavar="NAME:DIMS")
    p.add_argument("--batch", type=int, default=1, help="batch size (images per run)")
    p.add_argument("--plan", help="also benchmark this plan's model (needs --calib for INT8)")
    p.add_argument("--calib", help="calibration data for --plan")
    p.add_argument("--backend", choices=("onnxruntime", "migraphx"), default="onnxruntime")
    p.add_argument("--migraphx-target", choices=("gpu", "ref"), default="gpu")
    p.add_argument("--iterations", type=int, default=50)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    shapes = parse_shape_args(args.input_shape)
    original = load_model(args.model)
    feeds = make_feeds(original, shapes, seed=0)
    work = tempfile.mkdtemp(prefix="rewrite-bench-")
    variants = [("original", args.model)]
    fp32 = os.path.join(work, "fp32.onnx")
    rewriter.rewrite(args.model, output=fp32, materialize=False)
    variants.append(("rewritten FP32", fp32))
    if args.plan:
        q = os.path.join(work, "plan.onnx")
        rewriter.rewrite(args.model, output=q, plan=args.plan, calib=args.calib, materialize=False)
        variants.append((f"plan {args.plan}", q))
    rows = []
    for name, path in variants:
        if args.backend == "migraphx":
            r = bench_migraphx(path, feeds, shapes, args.iterations, args.warmup,
                               args.migraphx_target)
        else:
            r = bench_ort(path, feeds, args.iterations, args.warmup)
        med = r["latency_ms"]["median"]
        rows.append({"model": name, "latency_ms": med, "min_ms": r["latency_ms"]["min"],
                     "items_per_s": args.batch * 1e3 / med})
    base = rows[0]["items_per_s"]
    if args.json:
        print(json.dumps({"backend": args.backend, "batch": args.batch, "rows": rows}, indent=2))
        return 0
    dev = args.backend + (f" ({args.migraphx_target})" if args.backend == "migraphx" else " (CPU)")
    print(f"{args.model}, batch {args.batch}, {dev}, median of {args.iterations} runs\n")
    print("| model | latency ms | items/s | vs original |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['latency_ms']:.2f} | {r['items_per_s']:.1f} | "
              f"{r['items_per_s'] / base:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
