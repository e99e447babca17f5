"""Is ">= 99% top-1 with at least half the convs INT8" reachable by choosing layers alone?

    python tools/quant_half_oracle.py --task orient-photo [--task cls-photo ...] [--frac 0.5,0.6]

For each task of tools/quant_eval.py: the planner (``plan_auto``, default settings) measures
every layer's INT8 sensitivity on the 64 calibration samples; then, ignoring its budget,
INT8 goes to the least sensitive ``frac`` of the convs (ranked by INT8 loss, and by loss per
FLOP), the other layers stay as the planner chose them (FP16 where it chose INT8), and each
such plan is judged on the 300 fresh samples, as quant_eval judges ``--plan auto``. If no
ranked half reaches 0.99 on fresh data, the planner's caution is not what keeps auto below
the goal: INT8 itself is. ``--ungrouped-only`` keeps depthwise (grouped) convs out of INT8.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_eval as qe  # noqa: E402


def run(task: str, fracs: list[float], work: Path, pointwise: bool = False) -> list[dict]:
    import onnx

    import rewriter
    from rewriter.core.graph import node_id
    from rewriter.quant.planner import plan_auto

    model = str(qe.CACHE / qe.TASKS[task][0])
    xc, _ = qe.task_data(task, 64, 0)
    xe, ye = qe.task_data(task, 300, 1)
    calib = [{"x": xc[i:i + 1]} for i in range(len(xc))]
    ref = qe.outputs(model, xe)
    _, rep = plan_auto(model, calib)
    n_convs = sum(r.op == "Conv" for r in rep.layers)
    capable = [r for r in rep.layers if r.op == "Conv" and r.int8_loss is not None]
    if pointwise:   # depthwise (grouped) convs stay out of INT8
        grouped = {node_id(n) for n in onnx.load(model, load_external_data=False).graph.node
                   if n.op_type == "Conv" and any(a.name == "group" and a.i > 1
                                                  for a in n.attribute)}
        capable = [r for r in capable if r.id not in grouped]
    rows = []
    for key in ("loss",) if pointwise else ("loss", "loss-per-flop"):
        order = sorted(capable, key=lambda r: r.int8_loss if key == "loss"
                       else r.int8_loss / max(r.flops, 1.0))
        for frac in fracs:
            pick = {r.id for r in order[:math.ceil(frac * n_convs)]}
            over = {r.id: "int8" if r.id in pick else (r.choice if r.choice != "int8" else "fp16")
                    for r in rep.layers}
            out = work / f"{task}.{key}.{frac}{'.pw' if pointwise else ''}.onnx"
            rewriter.rewrite(model, output=out, plan=dict(rep.plan, overrides=over),
                             calib=calib, materialize=False)
            label = f"{'ungrouped ' if pointwise else ''}{key} {frac:.0%}"
            row = {"task": task, "plan": label, "int8_convs": len(pick),
                   "convs": n_convs, "seconds": 0.0,
                   **qe.judge(ref, qe.outputs(str(out), xe), ye)}
            print(qe.line(row), flush=True)
            rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", action="append", choices=list(qe.TASKS), required=True)
    p.add_argument("--frac", default="0.5,0.6")
    p.add_argument("--ungrouped-only", action="store_true",
                   help="only convs with group 1 may be INT8 (depthwise ones never are)")
    p.add_argument("--work", default="/tmp/quant_half_oracle")
    p.add_argument("--json")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = [r for t in a.task for r in run(t, [float(f) for f in a.frac.split(",")], work,
                                           a.ungrouped_only)]
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
