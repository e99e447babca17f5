"""The automatic planner: measure each layer's sensitivity, then choose precisions.

    rewrite plan model.onnx --calib DIR -o plan.yaml      (or --plan auto inline)

1. The model goes through the FP32 passes (BatchNorm folded first), calibration data is
   split into a calibration part (ranges) and a held-out evaluation part.
2. Sensitivity: for every layer (Conv/MatMul/Gemm/ConvTranspose), the model is rewritten
   with only that layer in INT8, and again with only that layer in FP16, and compared with
   FP32 on the evaluation samples: loss = 1 - cosine (mean over outputs), SQNR, top-1.
3. The accuracy model, from the AMD challenge write-up, as a sympy expression::

       predicted_loss = alpha * sum(FP16 losses of FP16 layers) + beta * sum(INT8 losses of INT8 layers)

   with alpha = 0.7, beta = 0.3 by default. The speed model::

       speedup = 1 / ((1 - lambda) / fp16_speed + lambda / int8_speed)

   lambda = the INT8 share of conv/matmul FLOPs. fp16_speed and int8_speed are speeds
   relative to FP32 (defaults: int8 1.74 = 2176/1248 img/s, MI250X ResNet-50 INT8 vs
   MIGraphX FP32 as published; fp16 1.5, an assumption: measure on your GPU). Kept
   symbolic, so the planner can report the predicted speedup of a plan or solve for the
   lambda a target speedup needs.
4. Choice: start from every INT8-capable layer in INT8; order INT8 layers by predicted
   loss per FLOP (FLOPs from shapes inferred at the calibration data's real input size);
   find, by bisection with real measurements of the whole plan, the fewest of the
   most sensitive layers to move out of INT8 (to FP16, or FP32 where FP16 hurts too) so
   that the plan meets the budget (top-1 agreement and cosine on the held-out samples);
   then try to bring each of the (at most ``refine``) least sensitive demoted layers back
   to INT8, keeping the budget. The accuracy model ranks candidates; every decision is
   measured.

Outputs: a plan (YAML, explicit per-layer overrides), a sensitivity table (text/JSON) and
a PNG plot (layer vs INT8/FP16 loss) when matplotlib is installed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rewriter.core.convert import export, shape_info, to_graph, upgrade_opset
from rewriter.core.errors import InputError
from rewriter.core.graph import Namer, node_id, weight_free_copy
from rewriter.core.load import load_model
from rewriter.quant.plan import INT8_OPS, LAYER_OPS, Assignment, Plan
from rewriter.verify.metrics import cosine, has_classes, sqnr_db, top1_agreement
from rewriter.verify.verifier import stack_runs

DEFAULTS = {"alpha": 0.7, "beta": 0.3, "int8_speed": 2176 / 1248, "fp16_speed": 1.5,
            "min_top1": 0.99, "min_cosine": 0.995, "fp16_ok_loss": 1e-4, "refine": 32}


@dataclass
class LayerResult:
    id: str
    op: str
    flops: float
    int8_loss: float | None     # 1 - cosine with only this layer in INT8 (None: not capable)
    fp16_loss: float
    int8_top1: float | None
    fp16_top1: float | None
    int8_sqnr_db: float | None
    choice: str = "fp32"


@dataclass
class PlannerReport:
    layers: list[LayerResult]
    plan: dict
    measured: dict[str, float]         # top1, cosine of the chosen plan
    predicted_loss: float
    int8_flop_share: float
    predicted_speedup: float
    lambda_for_target: float | None
    settings: dict[str, Any]
    evaluations: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        return d

    def render(self) -> str:
        lines = [f"{'layer':<36} {'op':<8} {'MFLOPs':>8} {'int8 loss':>10} {'fp16 loss':>10} "
                 f"{'int8 top1':>9}  choice"]
        for r in self.layers:
            i8 = f"{r.int8_loss:10.2e}" if r.int8_loss is not None else f"{'-':>10}"
            t1 = f"{r.int8_top1:9.3f}" if r.int8_top1 is not None else f"{'-':>9}"
            lines.append(f"{r.id[:36]:<36} {r.op:<8} {r.flops / 1e6:8.2f} {i8} "
                         f"{r.fp16_loss:10.2e} {t1}  {r.choice}")
        c = {p: sum(r.choice == p for r in self.layers) for p in ("int8", "fp16", "fp32")}
        lines.append("")
        lines.append(f"chosen: {c['int8']} int8, {c['fp16']} fp16, {c['fp32']} fp32; "
                     f"INT8 share of FLOPs {self.int8_flop_share:.2f}")
        lines.append(f"measured on held-out samples: top-1 agreement {self.measured['top1']:.4f}, "
                     f"cosine {self.measured['cosine']:.5f}")
        lines.append(f"predicted loss {self.predicted_loss:.3e}; predicted speedup vs FP32 "
                     f"{self.predicted_speedup:.2f}x (int8 {self.settings['int8_speed']:.2f}x, "
                     f"fp16 {self.settings['fp16_speed']:.2f}x)")
        if self.lambda_for_target is not None:
            lines.append(f"INT8 FLOP share needed for {self.settings['target_speedup']}x: "
                         f"{self.lambda_for_target:.2f}")
        lines.append(f"{self.evaluations} model evaluations in {self.seconds:.1f} s")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


# --------------------------------------------------------------------------- models


def accuracy_model():
    """(expression, symbols) for predicted loss = alpha*FP16_loss + beta*INT8_loss."""
    import sympy as sp

    a, b, l16, l8 = sp.symbols("alpha beta FP16_loss INT8_loss", nonnegative=True)
    return a * l16 + b * l8, (a, b, l16, l8)


def speed_model():
    """(expression, symbols) for speedup = 1/((1-lambda)/fp16_speed + lambda/int8_speed)."""
    import sympy as sp

    lam, s16, s8 = sp.symbols("lambda fp16_speed int8_speed", positive=True)
    return 1 / ((1 - lam) / s16 + lam / s8), (lam, s16, s8)


def predicted_speedup(lam: float, fp16_speed: float, int8_speed: float) -> float:
    expr, (L, s16, s8) = speed_model()
    return float(expr.subs({L: lam, s16: fp16_speed, s8: int8_speed}))


def lambda_for(target: float, fp16_speed: float, int8_speed: float) -> float | None:
    """The INT8 FLOP share that reaches ``target`` speedup, or None if out of [0, 1]."""
    import sympy as sp

    expr, (L, s16, s8) = speed_model()
    sol = sp.solve(sp.Eq(expr.subs({s16: fp16_speed, s8: int8_speed}), target), L)
    vals = [float(s) for s in sol if s.is_real and 0 <= float(s) <= 1]
    return vals[0] if vals else None


def predicted_loss(layers: list[LayerResult], alpha: float, beta: float) -> float:
    expr, (a, b, l16, l8) = accuracy_model()
    f16 = sum(r.fp16_loss for r in layers if r.choice == "fp16")
    i8 = sum(r.int8_loss or 0.0 for r in layers if r.choice == "int8")
    return float(expr.subs({a: alpha, b: beta, l16: f16, l8: i8}))


def _real_shapes(model, feeds: dict, input_shapes=None) -> dict[str, list]:
    """Tensor shapes inferred with the graph inputs fixed to real sizes (a calibration
    sample's, or the user's --input-shape): symbolic dims would count as 1 in FLOPs."""
    m = weight_free_copy(model)
    given = dict(input_shapes or {})
    for vi in m.graph.input:
        dims = given.get(vi.name) or (list(np.shape(feeds[vi.name])) if vi.name in feeds else None)
        if dims is None or not vi.type.HasField("tensor_type"):
            continue
        vi.type.tensor_type.shape.Clear()
        for d in dims:
            vi.type.tensor_type.shape.dim.add().dim_value = int(d)
    for vi in m.graph.value_info:
        vi.type.tensor_type.ClearField("shape")
    out = {}
    for name, vi in shape_info(m).items():
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            out[name] = [d.dim_value if d.HasField("dim_value") else None
                         for d in vi.type.tensor_type.shape.dim]
    return out


def layer_flops(node, shapes: dict | None = None) -> float:
    """Multiply-accumulates x 2 of a Conv/Gemm/MatMul from its weight and output shapes
    (``shapes``: real inferred shapes by tensor name, preferred over the graph's own)."""
    w = node.inputs[1] if len(node.inputs) > 1 else None
    y = node.outputs[0]
    wshape = getattr(w, "shape", None)
    yshape = (shapes or {}).get(y.name) or y.shape
    if wshape is None or yshape is None:
        return 0.0
    out = [d if isinstance(d, (int, np.integer)) and d > 0 else 1 for d in yshape]
    if node.op in ("Conv", "ConvTranspose"):
        k = float(np.prod(wshape[1:])) if node.op == "Conv" else float(np.prod(wshape[2:])) * wshape[0] / max(1, wshape[1])
        return 2.0 * float(np.prod(out)) * k
    kdim = wshape[0] if node.op == "MatMul" or not int(node.attrs.get("transB", 0)) else wshape[1]
    return 2.0 * float(np.prod(out)) * float(kdim)


# --------------------------------------------------------------------------- evaluation


class _Evaluator:
    """Runs plan variants of one FP32 graph on held-out samples; compares with FP32."""

    def __init__(self, graph, original, base_dir, eval_feeds, ranges, settings):
        from rewriter.core import ort

        self.graph, self.original, self.base_dir = graph, original, base_dir
        self.feeds, self.ranges, self.settings = eval_feeds, ranges, settings
        exp = export(graph, original, base_dir)
        sess = ort.session(exp.model, exp.source_dir, initializers=exp.ort_initializers())
        self.reference_stacked = stack_runs([ort.run(sess, f) for f in eval_feeds])
        self.count = 0

    def measure(self, precision: dict[str, str]) -> dict[str, float]:
        from rewriter.core import ort
        from rewriter.core.manager import run_pipeline
        from rewriter.core.pass_base import Context, Options
        from rewriter.core.registry import resolve

        g = self.graph.copy()
        ids = [node_id(n) for n in g.nodes if n.op in LAYER_OPS]
        ops = {node_id(n): n.op for n in g.nodes if n.op in LAYER_OPS}
        full = {i: precision.get(i, "fp32") for i in ids}
        a = Assignment(full, {i: "planner" for i in ids}, ids, ops)
        plan = Plan(int8={"calibration": {}, "weights": self.settings["weights"],
                          "weight_form": self.settings["weight_form"], "bias": "float"})
        ctx = Context(Options(migraphx_version=self.settings.get("migraphx_version")),
                      Namer(g), plan=plan, assignment=a, ranges=self.ranges)
        run_pipeline(g, resolve(["insert-qdq", "convert-fp16"]), ctx)
        exp = export(g, self.original, self.base_dir)
        sess = ort.session(exp.model, exp.source_dir, initializers=exp.ort_initializers())
        self.count += 1
        cos, top1, sqnr = [], [], []
        outs = stack_runs([ort.run(sess, f) for f in self.feeds])
        for r, o in zip(self.reference_stacked, outs):
            if not np.isfinite(np.asarray(o, np.float64)).all():
                cos.append(0.0)
                top1.append(0.0)
                continue
            cos.append(cosine(r, o))
            sqnr.append(sqnr_db(r, o))
            if has_classes(r):
                top1.append(top1_agreement(r, o))
        return {"cosine": float(np.min(cos)), "loss": float(1.0 - np.mean(cos)),
                "top1": float(np.min(top1)) if top1 else 1.0,
                "sqnr_db": float(np.min(sqnr)) if sqnr else float("inf")}


def plan_auto(model, calib, *, input_shapes=None, settings: dict | None = None,
              base_dir=None, progress: bool = False) -> tuple[Plan, PlannerReport]:
    """Measure sensitivities and choose a plan under the accuracy budget (see module doc)."""
    from rewriter.core.manager import run_pipeline
    from rewriter.core.pass_base import Context
    from rewriter.core.registry import resolve
    from rewriter.quant import plan as plan_mod
    from rewriter.quant.data import load_calibration
    from rewriter.quant.ranges import collect_ranges

    t0 = time.perf_counter()
    s = dict(DEFAULTS, weights="per-channel", weight_form="auto", method="percentile",
             percentile=99.99, num_bins=2048, samples=256, target_speedup=None,
             preprocess=None, migraphx_version=None)
    s.update({k: v for k, v in (settings or {}).items() if v is not None})
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        from pathlib import Path
        original = load_model(model)
        base_dir = Path(model).parent
    else:
        original = model
    graph = to_graph(original, base_dir)
    run_pipeline(graph, resolve(["fold-constants", "fuse-conv-bn"]), Context(namer=Namer(graph)))
    data = load_calibration(calib, original, preprocess=s["preprocess"], limit=int(s["samples"]))
    if len(data) < 8:
        raise InputError(f"the planner needs at least 8 calibration samples ({len(data)} given)")
    from rewriter.quant.data import held_out_count
    n_eval = held_out_count(len(data))
    cal_data, eval_data = data.split(n_eval)
    eval_feeds = list(eval_data)
    form_plan = Plan(int8={"weights": s["weights"], "weight_form": s["weight_form"]})
    if form_plan.weight_form(s["migraphx_version"])[0] == "axis" and graph.opset < 13:
        graph, original = upgrade_opset(graph, original, base_dir, 13)
    layers = [n for n in graph.nodes if n.op in LAYER_OPS]
    if not layers:
        raise InputError("the model has no Conv/MatMul/Gemm layers to plan")
    tensors = sorted({n.inputs[0].name for n in layers if n.op in INT8_OPS})
    exp = export(graph, original, base_dir)
    ranges = collect_ranges(exp.model, tensors, cal_data, method=s["method"],
                            percentile=float(s["percentile"]), num_bins=int(s["num_bins"]),
                            base_dir=exp.source_dir, initializers=exp.ort_initializers(),
                            progress=progress)
    ev = _Evaluator(graph, original, base_dir, eval_feeds, ranges, s)
    shapes = _real_shapes(exp.model, eval_feeds[0], input_shapes)
    results: list[LayerResult] = []
    bar = _progress(len(layers), progress)
    for n in layers:
        i = node_id(n)
        m16 = ev.measure({i: "fp16"})
        m8 = ev.measure({i: "int8"}) if n.op in INT8_OPS else None
        results.append(LayerResult(i, n.op, layer_flops(n, shapes),
                                   m8["loss"] if m8 else None, m16["loss"],
                                   m8["top1"] if m8 else None, m16["top1"],
                                   m8["sqnr_db"] if m8 else None))
        bar.update(1)
    bar.close()

    fp32_set: set[str] = set()

    def assign(demoted: set[str]) -> dict[str, str]:
        """INT8 unless demoted; a demoted layer runs FP16 unless FP16 hurts (or was
        pushed to FP32 in the first stage)."""
        out = {}
        for r in results:
            if r.id in fp32_set:
                out[r.id] = "fp32"
            elif r.int8_loss is not None and r.id not in demoted:
                out[r.id] = "int8"
            elif r.fp16_loss <= s["fp16_ok_loss"]:
                out[r.id] = "fp16"
            else:
                out[r.id] = "fp32"
        return out

    def meets(m):
        return m["top1"] >= s["min_top1"] and m["cosine"] >= s["min_cosine"]

    def bisect(ranked_ids: list[str], plan_for) -> tuple[int, dict]:
        """Fewest k of ranked_ids (most harmful first) to move so the plan meets the budget
        (k = len when even moving all of them does not)."""
        lo, hi = 0, len(ranked_ids)
        best = (hi, ev.measure(plan_for(hi)))
        if not meets(best[1]):
            return best
        while lo < hi:
            mid = (lo + hi) // 2
            m = ev.measure(plan_for(mid))
            if meets(m):
                hi, best = mid, (mid, m)
            else:
                lo = mid + 1
        return best

    # Most harm per FLOP first: a plan keeps the most INT8 work for a given loss when the
    # cheap, sensitive layers are the ones that leave INT8.
    ranked = sorted((r for r in results if r.int8_loss is not None),
                    key=lambda r: -(s["beta"] * r.int8_loss - s["alpha"] * r.fp16_loss)
                    / max(r.flops, 1.0))
    all_int8_out = {r.id for r in ranked}
    notes: list[str] = []
    # Stage 1: with no layer in INT8, which FP16 layers must stay FP32 for the budget?
    by_fp16 = sorted(results, key=lambda r: -r.fp16_loss)
    m0 = ev.measure(assign(all_int8_out))
    if not meets(m0):
        j, _ = bisect([r.id for r in by_fp16],
                      lambda j: (fp32_set.clear(), fp32_set.update(r.id for r in by_fp16[:j]),
                                 assign(all_int8_out))[2])
        fp32_set.clear()
        fp32_set.update(r.id for r in by_fp16[:j])
        notes.append(f"FP16 everywhere misses the budget: {j} most FP16-sensitive layers kept FP32")
    # Stage 2: the fewest most INT8-sensitive layers to keep out of INT8.
    ranked = [r for r in ranked if r.id not in fp32_set]
    k, measured = bisect([r.id for r in ranked], lambda k: assign({r.id for r in ranked[:k]}))
    if not meets(measured):
        notes.append("the budget is not met even in FP32 on these samples (check the data)")
    demoted = {r.id for r in ranked[:k]}
    # Refine: bisection assumes sensitivity adds up in rank order; it does not quite, so try
    # to bring each demoted layer back to INT8, least sensitive first, keeping the budget.
    if k and meets(measured):
        for r in reversed(ranked[:k][-int(s["refine"]):]):
            m = ev.measure(assign(demoted - {r.id}))
            if meets(m):
                demoted.discard(r.id)
                measured = m
    choice = assign(demoted)
    for r in results:
        r.choice = choice[r.id]
    total = sum(r.flops for r in results) or 1.0
    lam = sum(r.flops for r in results if r.choice == "int8") / total
    plan_dict = {"version": 1, "default": "fp32",
                 "overrides": {r.id: r.choice for r in results},
                 "int8": {"calibration": {"method": s["method"], "percentile": s["percentile"],
                                          "num_bins": s["num_bins"], "samples": s["samples"]},
                          "weights": s["weights"], "weight_form": s["weight_form"],
                          "bias": "float"},
                 "verify": {"min_cosine": s["min_cosine"], "min_top1": s["min_top1"],
                            "min_sqnr_db": 0.0}}
    if s["preprocess"]:
        plan_dict["preprocess"] = s["preprocess"]
    rep = PlannerReport(
        layers=results, plan=plan_dict, measured=measured,
        predicted_loss=predicted_loss(results, s["alpha"], s["beta"]),
        int8_flop_share=lam,
        predicted_speedup=predicted_speedup(lam, s["fp16_speed"], s["int8_speed"]),
        lambda_for_target=(lambda_for(float(s["target_speedup"]), s["fp16_speed"], s["int8_speed"])
                           if s["target_speedup"] else None),
        settings={k_: v for k_, v in s.items() if k_ != "preprocess"},
        evaluations=ev.count, seconds=time.perf_counter() - t0, notes=notes)
    return plan_mod.from_dict(plan_dict, "auto"), rep


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="sensitivity", unit="layer", disable=not enabled, leave=False)


def write_plot(rep: PlannerReport, path: str) -> bool:
    """Layer vs INT8/FP16 loss, chosen precision marked; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    x = np.arange(len(rep.layers))
    i8 = [r.int8_loss if r.int8_loss is not None else np.nan for r in rep.layers]
    f16 = [r.fp16_loss for r in rep.layers]
    fig, ax = plt.subplots(figsize=(max(8, len(x) * 0.18), 4.5), dpi=110)
    floor = 1e-9
    ax.semilogy(x, np.maximum(np.array(i8, float), floor), "o-", label="INT8 alone: 1 - cosine",
                color="#d62728", ms=4)
    ax.semilogy(x, np.maximum(np.array(f16, float), floor), "s-", label="FP16 alone: 1 - cosine",
                color="#1f77b4", ms=3)
    colors = {"int8": "#d62728", "fp16": "#1f77b4", "fp32": "#7f7f7f"}
    for xi, r in zip(x, rep.layers):
        ax.axvspan(xi - 0.5, xi + 0.5, color=colors[r.choice], alpha=0.08, lw=0)
    ax.set_xlabel("layer (graph order); background = chosen precision (red int8, blue fp16, grey fp32)")
    ax.set_ylabel("output loss (1 - cosine)")
    ax.set_title(f"Per-layer sensitivity: {sum(r.choice == 'int8' for r in rep.layers)} INT8 "
                 f"layers, top-1 {rep.measured['top1']:.3f}, cosine {rep.measured['cosine']:.4f}")
    ax.legend(loc="upper right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
