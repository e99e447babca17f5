"""Is ">= 99% top-1 with at least half the convs INT8" reachable by choosing layers alone?

    python tools/quant_half_oracle.py --task orient-photo [--task cls-photo ...] [--frac 0.5,0.6]

For each task of tools/quant_eval.py: the planner (``plan_auto``, default settings) measures
every layer's INT8 sensitivity on the 64 calibration samples; then, ignoring its budget,
INT8 goes to the least sensitive ``frac`` of the convs (ranked by INT8 loss, and by loss per
FLOP), the other layers stay as the planner chose them (FP16 where it chose INT8), and each
such plan is judged on the 300 fresh samples, as quant_eval judges ``--plan auto``. If no
ranked half reaches 0.99 on fresh data, the planner's caution is not what keeps auto below
the goal: INT8 itself is. ``--ungrouped-only`` keeps depthwise (grouped) convs out of INT8.
``--asymmetric`` judges each plan again with asymmetric activation ranges: every activation
Q/DQ whose tensor's calibration minimum is above -amax/2 gets the range [min(lo, 0), amax]
over all 256 int8 levels with a non-zero zero point (amax the plan's own symmetric clip),
an experiment: the pipeline writes zero points 0, MIGraphX's fast path.
``--tune-scales`` judges each plan again after an end-to-end search of its activation
scales: coordinate descent, two sweeps, each scale times 0.5-1.5, keeping what lowers the
mean KL divergence from FP32 on the 64 calibration samples (an experiment too).
``--ablate`` judges each plan again without its activation Q/DQ (INT8 weights, float
activations), then without each activation's Q/DQ alone: where the loss comes from.
``--channel-groups K`` judges each plan again with each 4-D activation's channels split into
K groups by their calibration max |x| (0: one group per channel), each group with its own
scale, min(its max, the tensor's clip) / 127: per-tensor int8 as MIGraphX runs it, once per
group (a conv split over input-channel groups). An upper bound for that rewrite, simulated
with per-channel Q/DQ in onnxruntime.
``--greedy`` adds a third ranking: layers chosen one at a time, end to end, each step
the capable conv whose activation Q/DQ raises the planner's harm (flip risk plus 1 - cosine,
on the 64 calibration samples) least, given the ones already chosen: interactions between
layers count, which the one-layer-at-a-time ranking ignores. The search runs on one
all-INT8 model whose activation Q/DQ are switched on and off by inputs (weights INT8
throughout); the chosen half is then built and judged as the others.
``--greedy-select N`` runs that search on N other fresh samples (``--greedy-seed``, 3 by
default), counting their top-1 flips: layers chosen with far more data than a planner has,
an informed bound on what choosing the half can reach (ranges still from the 64).
``--n-eval N --eval-seed S`` judge on N fresh samples drawn with seed S (300 and 1 by
default, quant_eval's set); ``--n-build N`` builds the plans (ranges, equalisation, GPTQ)
from N calibration samples of seed 0 instead of the planner's 64; ``--bias-correction``
and ``--alpha A`` set those two INT8 options of the plan (the planner's plans leave bias
correction off; alpha 0.5 by default).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_eval as qe  # noqa: E402


def activation_qs(g) -> list:
    """The QuantizeLinear nodes of graph ``g`` on computed tensors (not weights)."""
    consts = {i.name for i in g.initializer} | {n.output[0] for n in g.node
                                                 if n.op_type == "Constant"}
    return [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] not in consts]


def probe(m, xs):
    """(constants by name, the activation QuantizeLinear nodes, and per calibration sample
    a dict of their input tensors' values) of model ``m``."""
    import onnx
    from onnx import numpy_helper as nh

    from rewriter.core import ort

    g = m.graph
    consts = {i.name: nh.to_array(i) for i in g.initializer}
    consts.update({n.output[0]: nh.to_array(a.t) for n in g.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value"})
    qs = activation_qs(g)
    names = sorted({q.input[0] for q in qs})
    probed = onnx.ModelProto()
    probed.CopyFrom(m)
    probed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in names)
    sess = ort.session(probed)
    feed = sess.get_inputs()[0].name
    samples = (dict(zip(names, ort.run(sess, {feed: xs[i:i + 1]}, names)))
               for i in range(len(xs)))
    return consts, qs, samples


def asymmetric(src: Path, dst: Path, xs) -> None:
    """``src`` with one-sided activation tensors quantised over [lo, amax] (see above)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper as nh

    m = onnx.load(str(src))
    g = m.graph
    consts, qs, samples = probe(m, xs)
    lo = {q.input[0]: 0.0 for q in qs}
    for values in samples:
        for t, a in values.items():
            lo[t] = min(lo[t], float(a.min()))
    for q in qs:
        amax = 127 * float(consts[q.input[1]])
        if lo[q.input[0]] < -amax / 2:
            continue
        scale = (amax - lo[q.input[0]]) / 255
        zp = int(np.clip(np.round(-128 - lo[q.input[0]] / scale), -128, 127))
        qparams = (q.output[0] + "_asym_scale", q.output[0] + "_asym_zero_point")
        g.initializer.extend([nh.from_array(np.array(scale, np.float32), qparams[0]),
                              nh.from_array(np.array(zp, np.int8), qparams[1])])
        for n in g.node:
            if n is q or (n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]):
                n.input[1], n.input[2] = qparams
    onnx.save(m, str(dst))


def tune_scales(src: Path, dst: Path, xs, ref) -> tuple[float, float]:
    """``src`` with each activation scale (a QuantizeLinear's scale on a computed tensor)
    searched end to end: one session whose scales are graph inputs, coordinate descent over
    multipliers, objective the mean KL(FP32 || quantised) on ``xs`` (FP32 outputs ``ref``).
    Returns the KL before and after."""
    import numpy as np
    import onnx
    from onnx import numpy_helper as nh

    from rewriter.core import ort
    from rewriter.verify.certify import _log_probs

    m = onnx.load(str(src))
    g = m.graph
    names = list(dict.fromkeys(n.input[1] for n in activation_qs(g)))
    inits = {t.name: t for t in g.initializer}
    cur = {s: nh.to_array(inits[s]).astype(np.float32) for s in names}
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    probe.graph.input.extend(onnx.helper.make_tensor_value_info(
        s, onnx.TensorProto.FLOAT, list(cur[s].shape)) for s in names)
    sess = ort.session(probe)
    feed = sess.get_inputs()[0].name

    lp_ref = _log_probs(ref)

    def kl(scales) -> float:
        out = np.concatenate([ort.run(sess, {feed: xs[i:i + 1], **scales})[0]
                              for i in range(len(xs))])
        return float((np.exp(lp_ref) * (lp_ref - _log_probs(out))).sum(1).mean())

    start = best = kl(cur)
    for _ in range(2):
        for s in names:
            base, pick = cur[s], 1.0
            for mult in (0.5, 0.65, 0.8, 0.9, 1.1, 1.25, 1.5):
                v = kl({**cur, s: np.asarray(base * mult, dtype=np.float32)})
                if v < best - 1e-9:
                    best, pick = v, mult
            cur[s] = np.asarray(base * pick, dtype=np.float32)
    for s in names:
        inits[s].CopyFrom(nh.from_array(cur[s], s))
    onnx.save(m, str(dst))
    return start, best


def channel_groups(src: Path, dst: Path, xs, k: int) -> bool:
    """``src`` with each 4-D activation Q/DQ given per-channel scales: channels sorted by
    their calibration max |x|, cut into ``k`` equal groups (0: one per channel), each
    group's scale min(its max, the tensor's amax) / 127 (see --channel-groups)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper as nh

    m = onnx.load(str(src))
    if next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0) < 13:
        return False   # per-axis Q/DQ on activations needs opset 13
    g = m.graph
    consts, qs, samples = probe(m, xs)
    cmax: dict = {}
    for values in samples:
        for t, a in values.items():
            if a.ndim == 4:
                v = np.abs(a).max(axis=(0, 2, 3))
                cmax[t] = np.maximum(cmax.get(t, v), v)
    for q in qs:
        t = q.input[0]
        if t not in cmax:
            continue
        amax = 127 * float(consts[q.input[1]])
        c = cmax[t]
        order = np.argsort(c)
        parts = np.array_split(order, len(c) if k <= 0 else min(k, len(c)))
        per = np.empty_like(c)
        for part in parts:
            per[part] = min(float(c[part].max()), amax)
        scale = np.maximum(per, 1e-12).astype(np.float32) / 127
        qparams = (q.output[0] + "_grp_scale", q.output[0] + "_grp_zero_point")
        g.initializer.extend([nh.from_array(scale, qparams[0]),
                              nh.from_array(np.zeros(len(c), np.int8), qparams[1])])
        for n in g.node:
            if n is q or (n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]):
                n.input[1], n.input[2] = qparams
                n.attribute.append(onnx.helper.make_attribute("axis", 1))
    onnx.save(m, str(dst))
    return True


def without_activation_qdq(src: Path, dst: Path, tensors: set | None = None) -> list[str]:
    """``src`` with the Q -> DQ pairs on computed tensors (all, or those in ``tensors``)
    removed: the DQ's readers read the tensor itself. Returns the activation tensors."""
    import onnx

    m = onnx.load(str(src))
    g = m.graph
    qs = activation_qs(g)
    acts = sorted({n.input[0] for n in qs})
    drop = {n.output[0]: n.input[0] for n in qs if tensors is None or n.input[0] in tensors}
    to = {n.output[0]: drop[n.input[0]] for n in g.node
          if n.op_type == "DequantizeLinear" and n.input[0] in drop}
    keep = [n for n in g.node if n.output[0] not in drop and n.output[0] not in to]
    for n in keep:
        n.input[:] = [to.get(x, x) for x in n.input]
    del g.node[:]
    g.node.extend(keep)
    onnx.save(m, str(dst))
    return acts


def greedy_order(model: str, rep, capable: list, calib: list, xc, n_pick: int,
                 work: Path, select=None) -> list:
    """The first ``n_pick`` of ``capable`` (planner layer rows) in greedy end-to-end order
    (see --greedy). With ``select`` (inputs not used by calibration), each step is judged
    on them instead, by their top-1 flips (ties: 1 - mean cosine): see --greedy-select."""
    import numpy as np
    import onnx

    import rewriter
    from rewriter.core import ort
    from rewriter.core.graph import node_id
    from rewriter.verify.certify import _log_probs, flip_risk, margins_and_leads

    ids = {r.id for r in capable}
    every = work / "greedy.all.onnx"
    over = {r.id: "int8" if r.id in ids else "fp32" for r in rep.layers}
    rewriter.rewrite(model, output=every, plan=dict(rep.plan, overrides=over), calib=calib,
                     materialize=False)
    m = onnx.load(str(every))
    g = m.graph
    made = {o: n for n in g.node for o in n.output}
    flags, extra = {}, []
    for n in g.node:
        if n.op_type != "Conv" or node_id(n) not in ids:
            continue
        dq = made.get(n.input[0])
        q = made.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        if q is None or q.op_type != "QuantizeLinear":
            continue
        flag = f"greedy_flag_{len(flags)}"
        flags[node_id(n)] = flag
        sw = n.input[0] + f"_{flag}"
        extra.append(onnx.helper.make_node("Where", [flag, n.input[0], q.input[0]], [sw]))
        n.input[0] = sw
    g.input.extend(onnx.helper.make_tensor_value_info(f, onnx.TensorProto.BOOL, [])
                   for f in flags.values())
    g.node.extend(extra)
    onnx.save(m, str(work / "greedy.switched.onnx"))
    sess = ort.session(str(work / "greedy.switched.onnx"))
    feed = sess.get_inputs()[0].name
    xs = xc if select is None else select
    ref = _log_probs(qe.outputs(model, xs))

    def harm(on: set) -> float:
        fl = {f: np.array(i in on) for i, f in flags.items()}
        out = np.concatenate([ort.run(sess, {feed: xs[i:i + 1], **fl})[0]
                              for i in range(len(xs))])
        lp = _log_probs(out)
        p, q = np.exp(ref), np.exp(lp)
        cos = (p * q).sum(1) / (np.linalg.norm(p, axis=1) * np.linalg.norm(q, axis=1))
        if select is not None:
            return float((ref.argmax(1) != lp.argmax(1)).sum()) + float(1 - cos.mean())
        margins, drops = margins_and_leads(ref, lp)
        return flip_risk(margins, drops) + float(1 - cos.mean())

    chosen: list = []
    left = [r for r in capable if r.id in flags]
    while len(chosen) < n_pick and left:
        scores = [(harm({c.id for c in chosen} | {r.id}), r) for r in left]
        best, r = min(scores, key=lambda t: t[0])
        chosen.append(r)
        left.remove(r)
        print(f"  greedy {len(chosen):2d}: {r.id} (harm {best:.4f})", flush=True)
    return chosen


def judge(ref, out, labels) -> dict:
    """quant_eval's judgement plus, between log-probabilities, how close to a tie the flipped
    samples were: the largest FP32 margin among them, the share of all samples with a margin
    that small, and the 90th percentile of the drops of the FP32 top class's lead."""
    import numpy as np

    from rewriter.verify.certify import _log_probs, margins_and_leads

    margins, drops = margins_and_leads(_log_probs(ref), _log_probs(out))
    flipped = ref.argmax(1) != out.argmax(1)
    worst = float(margins[flipped].max()) if flipped.any() else 0.0
    return {**qe.judge(ref, out, labels), "flipped_margin_max": worst,
            "margin_share": float(np.mean(margins <= worst)),
            "lead_drop_q90": float(np.quantile(drops, 0.9))}


def show(row: dict) -> None:
    print(f"{qe.line(row)}  flipped margins <= {row['flipped_margin_max']:.3f} "
          f"({row['margin_share']:.1%} of samples), lead drop q90 {row['lead_drop_q90']:.3f}",
          flush=True)


def run(task: str, fracs: list[float], work: Path, pointwise: bool = False,
        asym: bool = False, tune: bool = False, n_eval: int = 300, eval_seed: int = 1,
        int8: dict | None = None, ablate: bool = False,
        groups: list[int] | None = None, greedy: bool = False,
        select: tuple[int, int] | None = None, n_build: int = 64) -> list[dict]:
    import onnx

    import rewriter
    from rewriter.core.graph import node_id
    from rewriter.quant.planner import plan_auto

    model = str(qe.CACHE / qe.TASKS[task][0])
    xc, _ = qe.task_data(task, 64, 0)
    xe, ye = qe.task_data(task, n_eval, eval_seed)
    calib = [{"x": xc[i:i + 1]} for i in range(len(xc))]
    xb = xc if n_build == 64 else qe.task_data(task, n_build, 0)[0]
    build = [{"x": xb[i:i + 1]} for i in range(len(xb))]
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
    keys = ("loss",) if pointwise else ("loss", "loss-per-flop")
    for key in keys + ((("greedy-informed" if select else "greedy"),) if greedy else ()):
        if key.startswith("greedy"):
            xs = qe.task_data(task, *select)[0] if select else None
            order = greedy_order(model, rep, capable, calib, xc,
                                 math.ceil(max(fracs) * n_convs), work, xs)
        else:
            order = sorted(capable, key=lambda r: r.int8_loss if key == "loss"
                           else r.int8_loss / max(r.flops, 1.0))
        for frac in fracs:
            pick = {r.id for r in order[:math.ceil(frac * n_convs)]}
            over = {r.id: "int8" if r.id in pick else (r.choice if r.choice != "int8" else "fp16")
                    for r in rep.layers}
            out = work / f"{task}.{key}.{frac}{'.pw' if pointwise else ''}.onnx"
            plan = dict(rep.plan, overrides=over,
                        int8={**(rep.plan.get("int8") or {}), **(int8 or {})})
            rewriter.rewrite(model, output=out, plan=plan, calib=build, materialize=False)
            label = f"{'ungrouped ' if pointwise else ''}{key} {frac:.0%}"
            row = {"task": task, "plan": label, "int8_convs": len(pick),
                   "convs": n_convs, "seconds": 0.0,
                   **judge(ref, qe.outputs(str(out), xe), ye)}
            show(row)
            rows.append(row)
            if asym:
                asymmetric(out, out.with_suffix(".asym.onnx"), xc)
                rows.append({**row, "plan": label + " asym",
                             **judge(ref, qe.outputs(str(out.with_suffix(".asym.onnx")), xe), ye)})
                show(rows[-1])
            for k in groups or []:
                grp = out.with_suffix(f".g{k}.onnx")
                if not channel_groups(out, grp, xc, k):
                    print(f"  {task}: channel groups need opset 13 (per-axis Q/DQ)")
                    break
                rows.append({**row, "plan": label + f" {k or 'per-channel'} groups",
                             **judge(ref, qe.outputs(str(grp), xe), ye)})
                show(rows[-1])
            if ablate:
                bare = out.with_suffix(".bare.onnx")
                acts = without_activation_qdq(out, bare)
                rows.append({**row, "plan": label + " weights only",
                             **judge(ref, qe.outputs(str(bare), xe), ye)})
                show(rows[-1])
                for t in acts:
                    without_activation_qdq(out, bare, {t})
                    agree = qe.outputs(str(bare), xe).argmax(1) == ref.argmax(1)
                    print(f"  without {t}'s Q/DQ: {int((~agree).sum())} flips", flush=True)
                    rows[-1].setdefault("flips_without", {})[t] = int((~agree).sum())
            if tune:
                tuned = out.with_suffix(".tuned.onnx")
                before, after = tune_scales(out, tuned, xc, qe.outputs(model, xc))
                rows.append({**row, "plan": label + " tuned", "calib_kl": [before, after],
                             **judge(ref, qe.outputs(str(tuned), xe), ye)})
                show(rows[-1])
                print(f"  calibration KL {before:.2e} -> {after:.2e}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", action="append", choices=list(qe.TASKS), required=True)
    p.add_argument("--frac", default="0.5,0.6")
    p.add_argument("--ungrouped-only", action="store_true",
                   help="only convs with group 1 may be INT8 (depthwise ones never are)")
    p.add_argument("--asymmetric", action="store_true",
                   help="judge each plan again with asymmetric activation ranges")
    p.add_argument("--tune-scales", action="store_true",
                   help="judge each plan again after an end-to-end activation-scale search")
    p.add_argument("--ablate", action="store_true",
                   help="judge each plan again without activation Q/DQ, all and one by one")
    p.add_argument("--channel-groups", default="",
                   help="judge each plan again with activations in K channel groups, each "
                   "its own scale (comma list; 0 = per channel)")
    p.add_argument("--greedy", action="store_true",
                   help="also choose the layers greedily, end to end (see above)")
    p.add_argument("--greedy-select", type=int, metavar="N",
                   help="--greedy judged on N other fresh samples (--greedy-seed) by their "
                   "top-1 flips: an informed bound, not a planner")
    p.add_argument("--greedy-seed", type=int, default=3)
    p.add_argument("--n-eval", type=int, default=300, help="fresh samples to judge on")
    p.add_argument("--n-build", type=int, default=64,
                   help="calibration samples (seed 0) the plans are built with: ranges, "
                   "equalisation, GPTQ (the planner still ranks on 64)")
    p.add_argument("--eval-seed", type=int, default=1)
    p.add_argument("--bias-correction", action="store_true",
                   help="bias correction on in the plans (the planner leaves it off)")
    p.add_argument("--alpha", type=float, help="equalize_alpha of the plans (default 0.5)")
    p.add_argument("--int8", help="plan int8 keys as JSON, merged over the planner's (e.g. "
                   "'{\"calibration\": {\"method\": \"minmax\"}}')")
    p.add_argument("--work", default="/tmp/quant_half_oracle")
    p.add_argument("--json")
    a = p.parse_args()
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    int8 = {**({"bias_correction": True} if a.bias_correction else {}),
            **({"equalize_alpha": a.alpha} if a.alpha is not None else {}),
            **(json.loads(a.int8) if a.int8 else {})}
    rows = [r for t in a.task for r in run(t, [float(f) for f in a.frac.split(",")], work,
                                           a.ungrouped_only, a.asymmetric, a.tune_scales,
                                           a.n_eval, a.eval_seed, int8, a.ablate,
                                           [int(k) for k in a.channel_groups.split(",") if k],
                                           a.greedy or bool(a.greedy_select),
                                           (a.greedy_select, a.greedy_seed)
                                           if a.greedy_select else None, a.n_build)]
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
