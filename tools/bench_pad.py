"""Benchmark pad-channels: onnxruntime CPU latency, padded vs unpadded, batch 1 and 8.

    python tools/bench_pad.py                       # light model-zoo models + models/*.onnx
    python tools/bench_pad.py a.onnx b.onnx --multiples 4,16 --out docs/benchmarks_pad.md

Both variants go through the same front half of the pipeline (fold-constants,
fuse-conv-bn), so the only difference measured is pad-channels. They are timed side by side
in one process: for every model and batch size three sessions are created (unpadded, padded,
and a second unpadded one), warmed up, then run in turn, round after round, so that clock,
thermal and load drift hit all alike; the table shows medians. The A/A column (second
unpadded / first unpadded) is the noise floor: a padded/unpadded ratio inside the A/A
spread is no measured difference. onnxruntime runs with its full graph optimisations
(ORT_ENABLE_ALL), as a deployment would; ``--threads`` fixes the intra-op thread count.

The FLOPs column is the conv FLOPs overhead of pad-channels with the default cost guard
(from the pass's own per-conv report), and the last columns say how many convs were padded
or skipped. Models whose graph fixes the batch at 1 (a Reshape to [1, -1]) cannot run at
batch 8; their batch-8 cells say n/a.

CPU results say nothing about MIGraphX on a GPU: they show what padding costs where the
kernels do not care about alignment. The numbers are reported as measured.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import statistics
import sys
import time

import numpy as np
import onnx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


import rewriter


def default_models() -> list[str]:
    light = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__),
                                          "backend/test/data/light/*.onnx")))
    return light + sorted(glob.glob(os.path.join(ROOT, "models", "*.onnx")))


def with_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """The model with a symbolic batch dim on inputs and outputs (value_info dropped).

    Model-zoo graphs often reshape to a constant [1, -1]: a constant Reshape target whose
    first entry is 1 becomes 0 ("copy the input's dim"), the same edit in both variants.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {t.name for t in m.graph.initializer}
    by_name = {t.name: t for t in m.graph.initializer}
    for node in m.graph.node:
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] in by_name:
            t = by_name[node.input[1]]
            shape = onnx.numpy_helper.to_array(t).copy()
            if shape.ndim == 1 and shape.size and shape[0] == 1:
                shape[0] = 0
                t.CopyFrom(onnx.numpy_helper.from_array(shape, t.name))
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.name in inits or not vi.type.tensor_type.shape.dim:
            continue
        d = vi.type.tensor_type.shape.dim[0]
        d.Clear()
        d.dim_param = "batch"
    del m.graph.value_info[:]
    return m


def session(model: onnx.ModelProto, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def feeds_for(sess, batch: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for i in sess.get_inputs():
        shape = [batch if k == 0 else (d if isinstance(d, int) and d > 0 else 1)
                 for k, d in enumerate(i.shape)]
        out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def timed(sessions, feeds, min_runs: int, budget: float) -> list[float]:
    """Median latency (ms) of sessions run in turn, round after round, on the same inputs."""
    for s in sessions:
        for _ in range(2):
            s.run(None, feeds)
    times = [[] for _ in sessions]
    start = time.perf_counter()
    while len(times[0]) < min_runs or (time.perf_counter() - start < budget
                                       and len(times[0]) < 200):
        for s, acc in zip(sessions, times):
            t = time.perf_counter()
            s.run(None, feeds)
            acc.append((time.perf_counter() - t) * 1000)
    return [statistics.median(t) for t in times]


def bench_model(path: str, n: int, batches, threads: int, min_runs: int, budget: float) -> dict:
    base, _ = rewriter.rewrite(path, ["fold-constants", "fuse-conv-bn"])
    padded, rep = rewriter.rewrite(path, ["fold-constants", "fuse-conv-bn", "pad-channels"],
                                   verify=True, options={"pad_multiple": n})
    rows = next(r for r in rep.passes if r.name == "pad-channels").rows
    f0, f1 = sum(r.flops for r in rows), sum(r.flops_after for r in rows)
    res = {
        "model": os.path.basename(path), "n": n, "convs": len(rows),
        "padded": sum(r.status == "padded" for r in rows),
        "skipped": sum(r.status.startswith("skip:") for r in rows),
        "aligned": sum(r.pin % n == 0 and r.pout % n == 0 for r in rows),
        "flops": f0, "flops_pct": (f1 / f0 - 1) * 100 if f0 else 0.0,
        "verified": rep.ok, "lat": {},
    }
    for batch in batches:
        try:
            # a second, identical unpadded session is the A/A control: its ratio to the
            # first is the noise floor of this machine at this moment.
            sess = [session(with_batch(m, batch), threads) for m in (base, padded, base)]
            feeds = feeds_for(sess[0], batch)
            res["lat"][batch] = tuple(timed(sess, feeds, min_runs, budget))
        except Exception as e:  # noqa: BLE001 - a model that cannot run at this batch
            res["lat"][batch] = None
            res.setdefault("notes", []).append(f"batch {batch}: {type(e).__name__}")
    return res


def render(results: list[dict], batches, threads: int) -> str:
    import onnxruntime as ort

    lines = [
        (f"onnxruntime {ort.__version__} CPU, ORT_ENABLE_ALL, "
         f"{threads or os.cpu_count()} intra-op threads, "
         f"{platform.processor() or platform.machine()}, "
         f"{os.cpu_count()} logical CPUs; medians of alternating runs."),
        "",
    ]
    head = "| model | N | convs aligned | padded / skipped | conv FLOPs | "
    head += " | ".join(f"b{b} unpadded ms | b{b} padded ms | b{b} padded/unpadded | "
                       f"b{b} A/A" for b in batches) + " |"
    lines.append(head)
    lines.append("|" + "---|" * (5 + 4 * len(batches)))
    for r in results:
        cells = [r["model"].replace(".onnx", ""), str(r["n"]), f"{r['aligned']}/{r['convs']}",
                 f"{r['padded']} / {r['skipped']}",
                 f"{r['flops'] / 1e9:.2f} G +{r['flops_pct']:.2f}%"]
        for b in batches:
            lat = r["lat"].get(b)
            if lat is None:
                cells += ["n/a"] * 4
            else:
                cells += [f"{lat[0]:.2f}", f"{lat[1]:.2f}", f"{lat[1] / lat[0]:.3f}",
                          f"{lat[2] / lat[0]:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="default: light model-zoo models + models/*.onnx")
    ap.add_argument("--multiples", default="4", help="comma-separated N values (default 4)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = ORT default)")
    ap.add_argument("--min-runs", type=int, default=5)
    ap.add_argument("--budget", type=float, default=3.0, help="seconds per model and batch")
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    results = []
    for n in (int(x) for x in args.multiples.split(",")):
        for path in args.models or default_models():
            r = bench_model(path, n, batches, args.threads, args.min_runs, args.budget)
            print(f"{r['model']} N={n}: {r}", file=sys.stderr, flush=True)
            results.append(r)
    table = render(results, batches, args.threads)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
