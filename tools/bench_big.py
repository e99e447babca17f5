"""Rewrite a >2 GB external-data model end to end and time it next to onnxsim and onnxslim.

    python tools/bench_big.py --dir /tmp/big [--gb 2.5] [--tools rewrite,rewrite-verify,onnxsim,onnxslim]
                              [--timeout 1800] [--json results.json] [--markdown]

The model comes from tools/make_big_model.py (a stack of Conv 3x3 1024x1024 + BN + Relu and
an MLP, float32 weights in ``big_convbn.onnx.data``); it is generated into ``--dir`` when
missing and never committed. Each tool runs in its own process, one after the other, so
the peak resident memory of each is its own (``ru_maxrss`` of that child from ``wait4``,
which counts the file-backed pages of memory-mapped weights too). A tool that fails is
recorded with its exit code and the last line of its stderr: a failure is a result here.

What is checked besides time and memory: the output files exist, ``onnx.checker`` accepts
the output by path (external data followed), and the output's weight bytes. The
``rewrite-verify`` run compares the rewritten model with the original in onnxruntime on
random inputs, so its exit code 0 is the numeric check.

The budget the issue sets for the FP32 pipeline without verification is
``1.5 x weight bytes + 300 MB`` of peak memory; the table says whether each run kept it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

TOOLS = {
    # name: argv template ({src} input model, {out} output model)
    "rewrite": ["rewrite", "{src}", "-o", "{out}", "--target", "none", "-q",
                "--report", "{out}.report.json"],
    "rewrite-verify": ["rewrite", "{src}", "-o", "{out}", "--target", "none", "-q", "--verify",
                       "--report", "{out}.report.json"],
    "onnxsim": ["onnxsim", "{src}", "{out}", "--save-as-external-data"],
    "onnxslim": ["onnxslim", "{src}", "{out}", "--save-as-external-data"],
}


def weight_bytes(data_file: Path) -> int:
    return data_file.stat().st_size if data_file.exists() else 0


def run_one(argv: list[str], timeout: float, cwd: Path) -> dict:
    """Run argv; return exit code, wall time, peak RSS (MB) and the last stderr line."""
    t0 = time.perf_counter()
    err_f = tempfile.TemporaryFile()
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err_f, cwd=cwd)
    except FileNotFoundError:
        return {"exit": None, "seconds": 0.0, "peak_rss_mb": 0.0,
                "error": f"{argv[0]}: not installed"}
    timed_out = threading.Event()

    def _kill():
        timed_out.set()
        proc.kill()

    timer = threading.Timer(timeout, _kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - t0
    err_f.seek(0)
    lines = [ln for ln in err_f.read().decode(errors="replace").splitlines() if ln.strip()]
    err_f.close()
    error = None
    if timed_out.is_set():
        error = f"timeout after {timeout:.0f} s"
    elif proc.returncode != 0:
        error = lines[-1][:300] if lines else f"exit {proc.returncode}"
    return {"exit": proc.returncode, "seconds": round(seconds, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 0), "error": error,
            "traceback": any(ln.startswith("Traceback") for ln in lines)}


def check_output(out: Path) -> dict:
    """onnx.checker by path in a subprocess (keeps this process small) and output sizes."""
    if not out.exists():
        return {"output": "missing"}
    code = ("import onnx,sys; onnx.checker.check_model(sys.argv[1]); "
            "m=onnx.load(sys.argv[1], load_external_data=False); "
            "print(sum(n.op_type=='BatchNormalization' for n in m.graph.node))")
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True)
    data = sorted(p for p in out.parent.iterdir()
                  if p.name.startswith(out.name) and p != out and not p.name.endswith(".json"))
    return {"checker": "ok" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1][:200],
            "bn_left": int(r.stdout.strip()) if r.returncode == 0 and r.stdout.strip() else None,
            "output_bytes": out.stat().st_size + sum(p.stat().st_size for p in data)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True, help="working folder (model + outputs)")
    ap.add_argument("--gb", type=float, default=2.5, help="weight size of the generated model")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated: " + ", ".join(TOOLS))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per tool")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the output models")
    args = ap.parse_args(argv)

    args.dir.mkdir(parents=True, exist_ok=True)
    src = args.dir / "big_convbn.onnx"
    data = args.dir / "big_convbn.onnx.data"
    if not src.exists() or not data.exists():
        print(f"generating {src} ({args.gb} GB) ...", flush=True)
        subprocess.run([sys.executable, str(HERE / "make_big_model.py"), "--out", str(args.dir),
                        "--gb", str(args.gb)], check=True)
    wbytes = weight_bytes(data)
    budget_mb = (1.5 * wbytes + 300e6) / 2**20
    results = {"model": str(src), "weight_bytes": wbytes, "budget_mb": round(budget_mb),
               "tools": {}}
    for name in [t.strip() for t in args.tools.split(",") if t.strip()]:
        if name not in TOOLS:
            ap.error(f"unknown tool {name!r}; known: {', '.join(TOOLS)}")
        outdir = args.dir / f"out_{name}"
        shutil.rmtree(outdir, ignore_errors=True)
        outdir.mkdir()
        out = outdir / "model.onnx"
        cmd = [a.format(src=src, out=out) for a in TOOLS[name]]
        print(f"{name}: {' '.join(cmd)}", flush=True)
        # Not the model's folder: external data must resolve from anywhere.
        r = run_one(cmd, args.timeout, HERE.parent)
        r["command"] = " ".join(cmd)
        if r["exit"] == 0:
            r.update(check_output(out))
        report = Path(f"{out}.report.json")
        if report.exists():  # our own phases: load, reference, passes, verify, save
            r["phases"] = {k: round(v, 1) for k, v in
                           json.loads(report.read_text()).get("seconds", {}).items()}
            report.unlink()
        r["within_budget"] = r["peak_rss_mb"] <= budget_mb
        results["tools"][name] = r
        print(f"  exit {r['exit']}  {r['seconds']} s  peak {r['peak_rss_mb']:.0f} MB"
              + (f"  error: {r['error']}" if r["error"] else "")
              + (f"  checker {r.get('checker')}" if "checker" in r else ""), flush=True)
        if not args.keep:
            shutil.rmtree(outdir, ignore_errors=True)
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def markdown(results: dict) -> str:
    wb = results["weight_bytes"]
    lines = [f"weights {wb / 1e9:.3f} GB ({wb} bytes); budget without verification "
             f"1.5 x weights + 300 MB = {results['budget_mb']} MB", "",
             "| tool | exit | time (s) | peak RSS (MB) | peak / weights | result |",
             "|---|---|---|---|---|---|"]
    for name, r in results["tools"].items():
        ratio = r["peak_rss_mb"] * 2**20 / wb if wb else 0
        if r["error"]:
            what = r["error"] + (" (Python traceback)" if r.get("traceback") else "")
        else:
            what = f"checker {r.get('checker')}, BN left {r.get('bn_left')}, " \
                   f"output {r.get('output_bytes', 0) / 1e9:.3f} GB"
        lines.append(f"| {name} | {r['exit']} | {r['seconds']} | {r['peak_rss_mb']:.0f} | "
                     f"{ratio:.2f}x | {what} |")
    for name, r in results["tools"].items():
        if r.get("phases"):
            lines.append(f"\n{name} phases (s): " + ", ".join(f"{k} {v}" for k, v in
                                                            r["phases"].items()))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
