"""The decision tree, the advice and the ``rewrite advise`` command line."""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rewriter.advise.kernels import _match_nodes, _model_facts, classify_kernel
from rewriter.advise.profiles import _KIND_FORMAT, _Dispatch, _key, load_profile
from rewriter.core.errors import InputError


def decide(valu_busy: float | None, sq_wait: float | None,
           valu_threshold: float = 60.0, wait_threshold: float = 30.0) -> str:
    """fusion | memory | quantize, or undecided when a counter the branch needs is missing."""
    if valu_busy is None:
        return "undecided"
    if valu_busy < valu_threshold:
        return "fusion"
    if sq_wait is None:
        return "undecided"
    return "memory" if sq_wait > wait_threshold else "quantize"


def _metrics(dispatches: list[_Dispatch]) -> tuple[dict, dict]:
    """Run-wide metric values and, for each, the counters and dispatch count behind it."""
    def series(*names):
        keys = {_key(n) for n in names}
        # a derived counter can come out as nan/inf (e.g. a zero denominator): not a value
        return [(v, d.duration_ns) for d in dispatches
                for c, v in d.counters.items() if _key(c) in keys and math.isfinite(v)]

    def weighted(*names):
        s = series(*names)
        if not s:
            return None, 0
        if all(w for _, w in s):  # weight by duration when every dispatch has one
            return sum(v * w for v, w in s) / sum(w for _, w in s), len(s)
        return sum(v for v, _ in s) / len(s), len(s)

    values, basis = {}, {}
    for metric, counter in (("valu_busy", "VALUBusy"), ("valu_utilization", "VALUUtilization"),
                            ("mem_unit_busy", "MemUnitBusy"),
                            ("mem_unit_stalled", "MemUnitStalled"), ("l2_hit", "L2CacheHit")):
        v, n = weighted(counter)
        values[metric] = v
        if v is not None:
            basis[metric] = f"{counter}, duration-weighted over {n} dispatches"
    wait, cycles = series("SQ_WAIT_INST_ANY"), series("SQ_WAVE_CYCLES")
    if wait and cycles and sum(v for v, _ in cycles) > 0:
        values["sq_wait"] = 100.0 * sum(v for v, _ in wait) / sum(v for v, _ in cycles)
        basis["sq_wait"] = (f"100 * SQ_WAIT_INST_ANY / SQ_WAVE_CYCLES = 100 * "
                            f"{sum(v for v, _ in wait):.4g} / {sum(v for v, _ in cycles):.4g}")
    else:
        values["sq_wait"] = None
    if values["l2_hit"] is None:  # raw L2 counters, if those were collected instead
        hit, miss = series("TCC_HIT", "TCC_HIT_sum"), series("TCC_MISS", "TCC_MISS_sum")
        total = sum(v for v, _ in hit) + sum(v for v, _ in miss)
        if hit and miss and total > 0:
            values["l2_hit"] = 100.0 * sum(v for v, _ in hit) / total
            basis["l2_hit"] = "100 * TCC_HIT / (TCC_HIT + TCC_MISS)"
    return values, basis


# --------------------------------------------------------------------------- the advice

@dataclass
class KernelRow:
    name: str
    calls: int
    total_ns: float
    share: float  # percent of all kernel time in the profile
    kind: str
    precision: str | None
    activation: str | None
    nodes: list[str] = field(default_factory=list)


@dataclass
class Step:
    area: str  # fusion | memory | quantize
    text: str


@dataclass
class Advice:
    profile: str
    formats: list[str]
    files: list[dict]
    time_source: str | None
    total_kernel_ns: float | None
    kernels: list[KernelRow]
    metrics: dict[str, float | None]
    metric_basis: dict[str, str]
    thresholds: dict[str, float]
    verdict: str
    reasons: list[str]
    missing: list[dict]  # {"counter", "why", "command"}
    steps: list[Step]
    model: dict | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    def render_text(self, top: int = 10) -> str:
        out = [f"Profile: {self.profile} ({', '.join(self.formats)}: "
               f"{len(self.files)} file(s): "
               f"{', '.join(sorted({Path(f['path']).name for f in self.files}))})"]
        if self.kernels:
            out.append(f"\nHot kernels (share of {(self.total_kernel_ns or 0) / 1e6:.3f} ms kernel "
                       f"time, from {self.time_source}):")
            for k in self.kernels[:top]:
                what = k.kind + (f", {k.precision}" if k.precision else "") + (
                    f", +{k.activation}" if k.activation else "")
                line = f"  {k.share:5.1f}%  {k.name}  x{k.calls}  [{what}]"
                if k.nodes:
                    more = f" (+{len(k.nodes) - 3} more)" if len(k.nodes) > 3 else ""
                    line += f"  -> {', '.join(k.nodes[:3])}{more}"
                out.append(line)
            if len(self.kernels) > top:
                out.append(f"  ... {len(self.kernels) - top} more kernels")
        else:
            out.append("\nHot kernels: no kernel times in this profile.")
        out.append(f"\nVerdict: {self.verdict.upper()}")
        out += [f"  {r}" for r in self.reasons]
        shown = {k: v for k, v in self.metrics.items() if v is not None}
        if shown:
            out.append("Metrics: " + ", ".join(f"{k} {v:.1f}%" for k, v in shown.items()))
        if self.missing:
            out.append("\nMissing counters (collect them, then run advise on the same folder):")
            for m in self.missing:
                out.append(f"  {m['counter']}: {m['why']}\n    {m['command']}")
        if self.steps:
            out.append("\nNext steps:")
            out += [f"  {i}. [{s.area}] {s.text}" for i, s in enumerate(self.steps, 1)]
        if self.model:
            ops = self.model["ops"]
            convs = self.model["convs"]
            out.append(
                f"\nModel {self.model['path']}: {ops.get('Conv', 0)} Conv, "
                f"{ops.get('BatchNormalization', 0)} BatchNormalization, "
                f"{ops.get('QuantizeLinear', 0)} QuantizeLinear, "
                f"{ops.get('DequantizeLinear', 0)} DequantizeLinear, "
                f"{sum(c['unaligned'] for c in convs)} Conv with channels not a multiple of 4")
        out += [f"Note: {n}" for n in self.notes]
        return "\n".join(out)


_QDQ_SHARE = 5.0     # standalone Q/DQ kernels above this share of time are worth a fix
_LAYOUT_SHARE = 5.0  # same for layout copies (contiguous / transpose kernels)
_FLOAT_SHARE = 10.0  # float conv/GEMM time worth offering to the INT8 planner


def _collect_cmd(counters: str, out_dir: str, app: str, tag: str) -> str:
    return (f"rocprofv3 --pmc {counters} --output-format csv -d {out_dir} -o {tag} "
            f"-- {app}")


def _names(rows: list[KernelRow], limit: int = 3) -> str:
    return ", ".join(f"{r.name} {r.share:.1f}%" for r in rows[:limit])


def _steps(kernels: list[KernelRow], verdict: str, model: dict | None,
           model_arg: str) -> list[Step]:
    by_kind: dict[str, list[KernelRow]] = defaultdict(list)
    for k in kernels:
        by_kind[k.kind].append(k)
    share = {kind: sum(k.share for k in rows) for kind, rows in by_kind.items()}
    steps: list[Step] = []
    convs = model["convs"] if model else []
    plan = (f"`rewrite plan {model_arg} --calib DIR -o plan.yaml` (the automatic planner), "
            f"then rewrite with `--plan plan.yaml --calib DIR`")

    # fusion: Q/DQ that MIGraphX could not fold into an mlir_quant_* kernel (#1904, #2566)
    if share.get("qdq", 0.0) >= _QDQ_SHARE:
        between = [c["node"] for c in convs if c["qdq_between_conv_and_activation"]]
        where = (f" In the model, {len(between)} Conv have a Q/DQ pair between them and their "
                 f"activation ({', '.join(between[:3])}), which keeps the activation out of "
                 "the conv kernel." if between else "")
        steps.append(Step("fusion", (
            f"Standalone quantize/dequantize kernels take {share['qdq']:.1f}% of kernel time "
            f"({_names(by_kind['qdq'])}). MIGraphX folds Q/DQ into mlir_quant_* kernels only "
            "for int8 DequantizeLinear (explicit zero point) -> Conv/MatMul with the "
            f"activation right after the conv; this QDQ placement defeated that.{where} "
            f"Regenerate the placement: {plan}.")))
    # fusion: activations or BatchNorm left as their own kernels
    loose = [k for k in by_kind.get("pointwise", []) if k.activation]
    if loose and (by_kind.get("miopen-conv") or any(
            not k.activation for k in by_kind.get("mlir-conv", []))):
        steps.append(Step("fusion", (
            f"Activations run as separate kernels ({_names(loose)}) next to convolutions "
            "that did not absorb them. Keep each activation directly after its conv: run "
            "`fold-constants` and `fuse-conv-bn` (folds BatchNorm into the conv and keeps "
            "the activation right after it).")))
    bn_after = [c["node"] for c in convs if c["batchnorm_after"]]
    if by_kind.get("batchnorm") or bn_after:
        src = (f"BatchNorm kernels take {share.get('batchnorm', 0.0):.1f}% of kernel time"
               if by_kind.get("batchnorm") else
               f"{len(bn_after)} Conv are followed by BatchNormalization "
               f"({', '.join(bn_after[:3])}); MIGraphX folds those into float convs itself "
               "but not into INT8 (quant_convolution) ones")
        steps.append(Step("fusion", f"{src}. Run `fuse-conv-bn` before quantising."))

    # memory: layout copies and channel counts the kernels do not like
    if share.get("layout", 0.0) >= _LAYOUT_SHARE:
        steps.append(Step("memory", (
            f"Layout copies take {share['layout']:.1f}% of kernel time "
            f"({_names(by_kind['layout'])}): look for Transpose/Reshape chains around "
            "convolutions; MIGraphX runs NCHW unless MIGRAPHX_ENABLE_NHWC=1 (worth a test).")))
    pad = f"`rewrite {model_arg} -o OUT --passes default,pad-channels --pad-multiple 4`"
    unaligned = [c for c in convs if c["unaligned"]]
    if unaligned:
        sample = ", ".join(f"{c['node']} ({c['in_channels']}->{c['out_channels']})"
                           for c in unaligned[:3])
        steps.append(Step("memory", (
            f"{len(unaligned)} Conv have channel counts that are not a multiple of 4 "
            f"({sample}): try {pad} and measure; MIGraphX no longer "
            "pads channels itself (removed in ROCm 6.1), and padding costs FLOPs.")))

    # quantize: conv / GEMM time still in floating point
    floats = [k for k in kernels if k.precision == "float"
              or k.kind in ("miopen-conv", "blas-gemm")]
    float_share = sum(k.share for k in floats)
    if float_share >= _FLOAT_SHARE:
        n_float = sum(not c["int8"] for c in convs)
        in_model = f" The model has {n_float} Conv still in float." if model else ""
        steps.append(Step("quantize", (
            f"{float_share:.1f}% of kernel time is in FP32/FP16 convolution/GEMM kernels "
            f"({_names(floats)}).{in_model} Let the planner move the tolerant layers to "
            f"INT8: {plan}. Measure: INT8 is not faster than FP16 on every GPU.")))

    # the verdict's own area first, and never leave the verdict without a step
    wanted = verdict if verdict in ("fusion", "memory", "quantize") else None
    if wanted and not any(s.area == wanted for s in steps):
        generic = {
            "fusion": "The ALUs are mostly idle but no unfused pattern shows in the kernel "
                      "names; run `fold-constants` and `fuse-conv-bn`, and rerun advise with "
                      "--model to match kernels to nodes.",
            "memory": "Waves wait on memory: check layouts (Transpose chains) and channel "
                      f"alignment ({pad}, measured); rerun advise "
                      "with --model to find unaligned convolutions.",
            "quantize": f"The kernels are busy and not memory-bound: quantise. {plan}.",
        }[wanted]
        steps.append(Step(wanted, generic))
    return sorted(steps, key=lambda s: s.area != wanted)


def advise(profile_path_or_dir, model=None, valu_threshold: float = 60.0,
           wait_threshold: float = 30.0) -> Advice:
    """Read a profile (and optionally the ONNX model that was profiled) into an Advice."""
    prof = load_profile(profile_path_or_dir)
    facts = _model_facts(model) if model is not None else None
    notes: list[str] = []

    # kernel time: aggregated stats beat per-dispatch traces, which beat counter runs (those
    # serialise kernels and add overhead, so their times are only a fallback)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    time_source = None
    if prof.stats:
        time_source = "kernel stats"
        for name, calls, ns in prof.stats:
            totals[name][0] += calls
            totals[name][1] += ns
    else:
        for source, dispatches in (("kernel trace", prof.traced),
                                   ("counter collection", prof.counted)):
            timed = [d for d in dispatches if d.duration_ns is not None]
            if timed:
                time_source = source
                for d in timed:
                    totals[d.kernel][0] += 1
                    totals[d.kernel][1] += d.duration_ns
                break
        if time_source == "counter collection":
            notes.append("kernel times come from counter collection, which serialises "
                         "kernels; add `--kernel-trace --stats` for real times")
    grand = sum(ns for _, ns in totals.values())
    kernels = []
    for name, (calls, ns) in totals.items():
        kc = classify_kernel(name)
        kernels.append(KernelRow(name, int(calls), ns, 100.0 * ns / grand if grand else 0.0,
                                 kc.kind, kc.precision, kc.activation,
                                 _match_nodes(name, kc, facts) if facts else []))
    kernels.sort(key=lambda k: -k.total_ns)

    values, basis = _metrics(prof.traced + prof.counted)
    verdict = decide(values["valu_busy"], values["sq_wait"], valu_threshold, wait_threshold)
    reasons = []
    if values["valu_busy"] is not None:
        op = "<" if values["valu_busy"] < valu_threshold else ">="
        reasons.append(f"VALU busy {values['valu_busy']:.1f}% {op} {valu_threshold:g}% "
                       f"threshold ({basis['valu_busy']})")
    if values["sq_wait"] is not None and verdict != "fusion":
        op = ">" if values["sq_wait"] > wait_threshold else "<="
        reasons.append(f"SQ wait {values['sq_wait']:.1f}% {op} {wait_threshold:g}% "
                       f"threshold ({basis['sq_wait']})")

    root = Path(profile_path_or_dir)
    out_dir = str(root if root.is_dir() else root.parent)
    app = f"migraphx-driver perf {model}" if model else "<your inference command>"
    missing = []
    if not kernels:
        missing.append({"counter": "kernel times", "why": "needed for the hot-kernel list",
                        "command": f"rocprofv3 --kernel-trace --stats --output-format csv "
                                   f"-d {out_dir} -o trace -- {app}"})
    if values["valu_busy"] is None:
        missing.append({"counter": "VALUBusy", "why": "first branch of the tree",
                        "command": _collect_cmd("VALUBusy", out_dir, app, "valu")})
    if values["sq_wait"] is None and verdict != "fusion":
        missing.append({"counter": "SQ_WAIT_INST_ANY, SQ_WAVE_CYCLES",
                        "why": "second branch of the tree (SQ wait)",
                        "command": _collect_cmd("SQ_WAIT_INST_ANY SQ_WAVE_CYCLES",
                                                out_dir, app, "wait")})
    if verdict == "undecided":
        reasons.append("not enough counters to walk the tree; see the missing counters below")

    return Advice(
        profile=str(profile_path_or_dir),
        formats=sorted({_KIND_FORMAT[f["kind"]] for f in prof.files}),
        files=prof.files, time_source=time_source, total_kernel_ns=grand or None,
        kernels=kernels, metrics=values, metric_basis=basis,
        thresholds={"valu_busy": valu_threshold, "sq_wait": wait_threshold},
        verdict=verdict, reasons=reasons, missing=missing,
        steps=_steps(kernels, verdict, facts, model or "model.onnx"),
        model={k: v for k, v in facts.items() if k != "labels"} if facts else None,
        notes=notes + prof.notes)


# --------------------------------------------------------------------------- CLI

class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str]) -> int:
    ap = _Parser(prog="rewrite advise", description=(
        "Read a rocprofv3 or legacy rocprof CSV profile of a MIGraphX run and say what to "
        "do next: fusion, memory or quantize."))
    ap.add_argument("profile", help="a profiler CSV, or a directory holding them")
    ap.add_argument("--model", help="the ONNX model that was profiled (matches kernels to nodes)")
    ap.add_argument("--valu-threshold", type=float, default=60.0, metavar="PCT",
                    help="VALU busy below this -> fusion (default 60)")
    ap.add_argument("--wait-threshold", type=float, default=30.0, metavar="PCT",
                    help="SQ wait above this -> memory, else quantize (default 30)")
    ap.add_argument("--top", type=int, default=10, help="hot kernels to list (default 10)")
    ap.add_argument("--json", action="store_true", help="print the advice as JSON")
    ap.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): a return code, not an exit
        return int(e.code or 0)
    for flag, v in (("--valu-threshold", args.valu_threshold),
                    ("--wait-threshold", args.wait_threshold)):
        if not 0.0 <= v <= 100.0:
            print(f"rewrite advise: error: {flag} must be a percentage between 0 and 100, "
                  f"got {v:g}", file=sys.stderr)
            return 2
    try:
        adv = advise(args.profile, args.model, args.valu_threshold, args.wait_threshold)
    except (InputError, OSError) as e:
        if args.verbose:
            traceback.print_exc()
        print(f"rewrite advise: error: {e}", file=sys.stderr)
        return 2
    from rewriter.core.report import json_text   # lazy: `advise -h` loads nothing heavy

    print(json_text(adv.to_dict()) if args.json else adv.render_text(args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
