"""Node counts against the peers: is our default pipeline the leanest equivalent output?

    python tools/lean.py                   # every model the tests use -> a markdown table
    python tools/lean.py --models light_squeezenet,silero_vad --json out.json

For every model (the onnx wheel's light model-zoo models, the trained models from
tools/fetch_models.py, models/*.onnx), each tool runs in its own process: ours (``rewrite M
-o OUT --target none``), onnxsim, OnnxSlim, and onnxruntime's basic offline optimiser
(``optimized_model_filepath`` at ORT_ENABLE_BASIC). Each output is checked: node count
(If/Loop/Scan bodies included), and equivalence with the input (both in onnxruntime with
optimisations off, one seeded random input, symbolic dims 1 unless the model needs more;
max |a - b| <= 1e-3 max |a| + 1e-5 per output, or the same integers). The leanest *equivalent*
peer is what our count is held to.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("REWRITE_MODELS", Path.home() / ".cache" / "rewrite" / "models"))
TOOLS = ("ours", "onnxsim", "onnxslim", "ort-basic")
# Inputs some models need to run at all (a 1-sample audio chunk is too short, a 1x1 image too).
SHAPES = {"silero_vad": {"input": [1, 512]}, "silero_vad_16k_op15": {"input": [1, 512]},
          "silero_vad_op18_ifless": {"input": [1, 512]},
          "ch_PP-OCRv4_det_infer": {"x": [1, 3, 64, 64]}, "ch_PP-OCRv4_rec_infer": {"x": [1, 3, 48, 80]},
          "ch_ppocr_mobile_v2.0_cls_infer": {"x": [1, 3, 48, 192]},
          "nudenet_320n": {"images": [1, 3, 64, 64]},
          "ddddocr_common_old": {"input1": [1, 1, 64, 64]},
          # TopK 300 of the anchors: 160x160 gives 525; 32 frames for PLCMOS's convs; 1 s of audio.
          "isbnx_best": {"images": [1, 3, 160, 160]},
          "speechmos_plcmos_v2": {"degraded_audio": [1, 1, 32, 257]},
          **{m: {"waveforms": [1, 16000]} for m in ("onnx_asr_gigaam_v2", "onnx_asr_kaldi",
                                                    "onnx_asr_wespeaker")}}

CHILD = {
    "ours": "import sys; from rewriter.cli import main; sys.exit(main([sys.argv[1], '-o', "
            "sys.argv[2], '--target', 'none', '-q']))",
    "onnxsim": "import sys, onnx, onnxsim; m, ok = onnxsim.simplify(onnx.load(sys.argv[1])); "
               "onnx.save(m, sys.argv[2])",
    "onnxslim": "import sys, onnxslim; onnxslim.slim(sys.argv[1], sys.argv[2])",
    "ort-basic": "import sys, onnxruntime as ort; so = ort.SessionOptions(); "
                 "so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC; "
                 "so.optimized_model_filepath = sys.argv[2]; so.log_severity_level = 4; "
                 "ort.InferenceSession(sys.argv[1], so, providers=['CPUExecutionProvider'])",
}


def models(selected: list[str] | None) -> dict[str, Path]:
    import onnx

    found = {}
    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    for p in sorted(glob.glob(os.path.join(light, "*.onnx"))):
        found[Path(p).stem] = Path(p)
    for p in sorted(CACHE.glob("*.onnx")):
        found[p.stem] = p
    for p in sorted((REPO / "models").glob("*.onnx")):
        found[p.stem] = p
    if selected:
        found = {k: v for k, v in found.items() if k in selected}
    return found


def count_nodes(m) -> int:
    import onnx

    def walk(g):
        n = 0
        for node in g.node:
            n += 1
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n += walk(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    n += sum(walk(x) for x in a.graphs)
        return n
    return walk(m.graph)


def feeds_for(path: Path, name: str) -> dict:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in m.graph.initializer}
    rng = np.random.default_rng(0)
    out = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = SHAPES.get(name, {}).get(vi.name) or [
            d.dim_value if d.dim_value > 0 else 1 for d in tt.shape.dim]
        if np.issubdtype(dtype, np.floating):
            out[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            out[vi.name] = np.asarray(rng.random(shape) < 0.5)
        else:
            out[vi.name] = np.asarray(rng.integers(0, 4, size=shape)).astype(dtype)
    if "waveforms_lens" in out and "waveforms" in out:  # onnx-asr: every sample is audio
        out["waveforms_lens"] = np.full_like(out["waveforms_lens"], out["waveforms"].shape[1])
    if name.startswith("silero_vad"):
        out = {k: (np.array(16000, np.int64) if k == "sr" else
                   np.zeros((2, 1, 128), np.float32) if k == "state" else v)
               for k, v in out.items()}
    return out


def run_ort(path, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def equivalent(ref, got) -> bool:
    if len(ref) != len(got):
        return False
    for a, b in zip(ref, got):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        if not np.issubdtype(a.dtype, np.floating):
            if np.mean(a != b) > 0.01:
                return False
            continue
        scale = float(np.max(np.abs(a))) if a.size else 0.0
        if a.size and float(np.max(np.abs(a - b))) > 1e-3 * scale + 1e-5:
            return False
    return True


def measure(name: str, path: Path, tools, work: Path, timeout: float) -> dict:
    import onnx

    row = {"model": name, "input_nodes": count_nodes(onnx.load(str(path),
                                                               load_external_data=False))}
    feeds = feeds_for(path, name)
    try:
        ref = run_ort(path, feeds)
    except Exception as e:  # noqa: BLE001 - the original does not run: counts only
        ref = None
        row["note"] = f"original does not run: {str(e).splitlines()[0][:80]}"
    for tool in tools:
        out = work / f"{name}.{tool}.onnx"
        t = time.perf_counter()
        try:
            p = subprocess.run([sys.executable, "-c", CHILD[tool], str(path), str(out)],
                               capture_output=True, text=True, timeout=timeout)
            ok = p.returncode == 0 and out.exists()
            err = (p.stderr.strip().splitlines() or [""])[-1][:100]
        except subprocess.TimeoutExpired:
            ok, err = False, "timeout"
        secs = time.perf_counter() - t
        if not ok:
            row[tool] = {"ok": False, "error": err, "seconds": round(secs, 2)}
            continue
        m = onnx.load(str(out), load_external_data=False)
        eq = None
        if ref is not None:
            try:
                eq = equivalent(ref, run_ort(out, feeds))
            except Exception:  # noqa: BLE001
                eq = False
        row[tool] = {"ok": True, "nodes": count_nodes(m), "equivalent": eq,
                     "seconds": round(secs, 2)}
        for f in glob.glob(str(out) + "*"):
            os.unlink(f)
    peers = [row[t]["nodes"] for t in tools if t != "ours" and row.get(t, {}).get("ok")
             and row[t].get("equivalent") is not False]
    row["leanest_peer"] = min(peers) if peers else None
    ours = row.get("ours", {})
    row["gap"] = (ours["nodes"] - row["leanest_peer"]
                  if ours.get("ok") and row["leanest_peer"] is not None else None)
    return row


def table(rows: list[dict], tools) -> str:
    head = "| model | input | " + " | ".join(tools) + " | leanest equivalent peer | ours - leanest |"
    out = [head, "|" + "---|" * (len(tools) + 4)]
    for r in rows:
        cells = []
        for t in tools:
            c = r.get(t, {})
            if not c.get("ok"):
                cells.append(f"fails ({c.get('error', '')[:40]})")
            else:
                mark = "" if c["equivalent"] is not False else " (not equivalent)"
                cells.append(f"{c['nodes']}{mark}")
        gap = r["gap"]
        out.append(f"| {r['model']} | {r['input_nodes']} | " + " | ".join(cells)
                   + f" | {r['leanest_peer']} | {'-' if gap is None else f'{gap:+d}'} |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma list of model names (default: all)")
    p.add_argument("--tools", default=",".join(TOOLS))
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json")
    a = p.parse_args()
    tools = a.tools.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="lean-") as tmp:
        for name, path in models(a.models.split(",") if a.models else None).items():
            rows.append(measure(name, path, tools, Path(tmp), a.timeout))
            r = rows[-1]
            print(name, {t: r.get(t, {}).get("nodes") for t in tools}, "gap", r["gap"],
                  flush=True)
    print(table(rows, tools))
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
