"""The Python API: ``rewrite(model_or_path, ...) -> (onnx.ModelProto, Report)``.

Flow: load (validated, weights not read) -> reference outputs if verifying -> for each
pass: run, cleanup, structural check, numeric check if it changed the graph -> export ->
onnx.checker -> final numeric check -> atomic save if an output path was given.

A model passed in memory is copied first: the caller's proto is never modified.
"""

from __future__ import annotations

import gc
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import onnx

from rewriter.core import registry
from rewriter.core.convert import export, to_graph, upgrade_opset
from rewriter.core.errors import InputError, VerificationError
from rewriter.core.graph import Namer
from rewriter.core.load import load_model, validate_model
from rewriter.core.manager import check_order, run_pipeline
from rewriter.core.pass_base import Context, Numerics
from rewriter.core.report import Report, op_histogram
from rewriter.core.save import save_model, total_weight_bytes


@contextmanager
def _no_gc():
    # Graphs are millions of small objects; Python's cyclic GC rescans them over and over
    # and turns linear passes superlinear. Nothing here makes garbage cycles worth chasing.
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def rewrite(model: str | os.PathLike | onnx.ModelProto,
            passes: Iterable | str | None = None,
            *,
            output: str | os.PathLike | None = None,
            verify: bool = False,
            input_shapes: dict[str, list[int]] | None = None,
            inputs: dict[str, np.ndarray] | None = None,
            seed: int = 0,
            options: dict[str, Any] | None = None,
            base_dir: str | os.PathLike | None = None,
            data: dict[str, Any] | None = None,
            materialize: bool = True,
            plan: Any = None,
            calib: Any = None,
            progress: bool = False,
            target: str | None = None,
            migraphx: dict[str, Any] | None = None,
            ) -> tuple[onnx.ModelProto, Report]:
    """Rewrite a model with a pipeline of passes (default: fold-constants, fuse-conv-bn).

    Args:
        model: a path, or an in-memory ModelProto (copied, never modified).
        passes: pass names (list or "a,b,c"), classes or instances; None = default pipeline.
        output: where to save atomically (external data beside it when needed).
        verify: compare with the original in onnxruntime after every changing pass.
        input_shapes: {input name: dims} for symbolic dims (default 1); for random inputs.
        inputs: user inputs for verification instead of random ones.
        options: pass options, e.g. {"fold_size_limit": 1 << 20}.
        base_dir: folder that resolves external data of an in-memory model.
        data: precomputed facts for passes (calibration ranges ...), see Context.data.
        plan: a mixed-precision plan (built-in name, file, dict or Plan): after the FP32
            passes, its INT8 layers get Q/DQ (insert-qdq) and its FP16 layers float16
            regions (convert-fp16).
        calib: calibration data for the plan's INT8 layers: a folder or an iterable of input
            dicts (see rewriter.calibrate); a held-out part of it is used for verification.
        progress: show progress bars (calibration).
        materialize: return the model with every weight inline; False returns it with
            big weights as stubs (what the CLI uses: nothing is copied that is not needed).
        target: "migraphx" runs the static MIGraphX check on the result
            (``report.extra["migraphx_check"]``, grouped warnings).
        migraphx: with ``target="migraphx"``, compile and compare on MIGraphX where it is
            installed and check the INT8 lowering (``report.extra["compile"]``); keys:
            ``device`` ("auto" = gpu when the install has it, "gpu", "ref"), ``backend``
            ("migraphx", "ort-migraphx"), ``save_mxr``, ``require``, ``samples`` (plan
            models are judged on up to this many samples, default 8). The target MIGraphX
            version for the plan's weight form and the check is ``options["migraphx_version"]``
            (default: the installed one).

    Raises:
        InputError (bad input), PassError (bug in a pass), VerificationError (outputs
        drift; its ``report`` attribute holds the report).
    """
    with _no_gc():
        return _rewrite(model, passes, output, verify, input_shapes, inputs, seed,
                        options or {}, base_dir, dict(data or {}), materialize, plan, calib,
                        progress, target, migraphx)


def _rewrite(model, passes, output, verify, input_shapes, inputs, seed, options, base_dir, data,
             materialize, plan, calib, progress, target, migraphx):
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    if isinstance(model, onnx.ModelProto):
        name = "<model>"
        original = onnx.ModelProto()
        original.CopyFrom(model)
        validate_model(original)
    else:
        name = str(model)
        original = load_model(model)
        base_dir = Path(model).parent if base_dir is None else base_dir
    if output is not None and not isinstance(model, onnx.ModelProto):
        if Path(output).exists() and os.path.samefile(output, model):
            raise InputError(f"{output}: output would overwrite the input; choose another path")
    pipeline = registry.resolve(passes)
    quantize: list = []
    calib_data = eval_feeds = None
    held_out: list = []
    if target == "migraphx" and options.get("migraphx_version") is None:
        from rewriter.migraphx.lowering import installed_version
        options = dict(options, migraphx_version=installed_version())
    if isinstance(plan, str) and plan == "auto":
        if calib is None:
            raise InputError("--plan auto measures layer sensitivities on data: give --calib DIR")
        from rewriter.quant.planner import plan_auto
        t = time.perf_counter()
        plan, planner_report = plan_auto(original, calib, base_dir=base_dir,
                                         input_shapes=input_shapes,
                                         settings=dict(options.get("planner") or {},
                                                       migraphx_version=options.get(
                                                           "migraphx_version")),
                                         progress=progress)
        data["planner"] = planner_report
        seconds["plan"] = time.perf_counter() - t
    if plan is not None:
        from rewriter.quant import plan as plan_mod
        plan = plan_mod.load(plan)
        data["plan"] = plan
        quantize = registry.resolve(["insert-qdq", "convert-fp16"])
        pipeline = [p for p in pipeline if p.name not in ("insert-qdq", "convert-fp16")]
        if calib is not None:
            from rewriter.quant.data import load_calibration
            calib_data = load_calibration(calib, original, preprocess=plan.preprocess,
                                          limit=int(plan.int8["calibration"]["samples"]))
            if len(calib_data) >= 8:
                # The same samples are held out with or without --verify, and by the
                # planner: the model written is the model the planner measured, and
                # --verify judges it on samples its scales were not computed from.
                from rewriter.quant.data import held_out_count
                calib_data, held = calib_data.split(held_out_count(len(calib_data)))
                held_out = list(held)
                if verify and inputs is None:
                    eval_feeds = held_out
    report = Report(input=name, output=str(output) if output else None)
    if "planner" in data:
        pr = data["planner"]
        report.extra["planner"] = {"measured": pr.measured, "int8_flop_share": pr.int8_flop_share,
                                   "predicted_speedup": pr.predicted_speedup,
                                   "evaluations": pr.evaluations, "seconds": pr.seconds}
    report.ops_before = op_histogram(original.graph)
    report.bytes_before = total_weight_bytes(original)
    # Shape inference only when a pass needs it: on long graphs it is the memory peak.
    infer = plan is not None or any(p.needs_shapes(original) for p in pipeline)
    graph = to_graph(original, base_dir, infer=infer)
    seconds["load"] = time.perf_counter() - t0 - seconds.get("plan", 0.0)

    verifier = None
    if verify:
        t = time.perf_counter()
        from rewriter.verify import Verifier, make_feeds
        if inputs is not None:
            feeds, what = inputs, "user inputs"
        elif eval_feeds:
            feeds, what = eval_feeds, f"{len(eval_feeds)} held-out calibration samples"
        else:
            feeds, what = make_feeds(original, input_shapes, seed), f"random inputs seed {seed}"
        verifier = Verifier(original, base_dir, feeds,
                            path=None if isinstance(model, onnx.ModelProto) else str(model),
                            lossy=plan.verify if plan is not None else None)
        report.verified_with = "onnxruntime CPU, graph optimisations off, " + what
        seconds["reference"] = time.perf_counter() - t

    ctx = Context(options=options, data=data, namer=Namer(graph))
    depth = {"n": 0, "worst": Numerics.EXACT}
    verify_time = [0.0]

    def after_change(p, rec, records):
        if verifier is None:
            return
        t = time.perf_counter()
        depth["n"] += 1
        if Numerics.LOSSY in (p.numerics, depth["worst"]):
            depth["worst"] = Numerics.LOSSY
        elif p.numerics is Numerics.CLOSE:
            depth["worst"] = Numerics.CLOSE
        exported = export(graph, original, base_dir)
        metrics = verifier.check(exported, depth["worst"], depth["n"])
        last_metrics[0] = metrics
        rec.verification = [m.to_dict() for m in metrics]
        verify_time[0] += time.perf_counter() - t
        if p.numerics is Numerics.LOSSY and p is not quantize[-1]:
            return  # a plan is judged as a whole: its FP16 part comes after its INT8 part
        if not all(m.ok for m in metrics):
            report.failed_pass = p.name
            report.verification = rec.verification
            report.passes = done[0] + list(records)
            report.ops_after = op_histogram(exported.model.graph)
            report.bytes_after = total_weight_bytes(exported.model)
            report.seconds = seconds
            raise _verification_error(
                f"outputs drift beyond tolerance after pass '{p.name}'", metrics, verifier,
                report, fp32_snapshot[0] if p.numerics is Numerics.LOSSY else None,
                exported, graph, plan)

    done: list = [[]]              # records of the FP32 part, for a failure's report
    last_metrics: list = [None]    # the check after the last pass that changed the graph
    fp32_snapshot: list = [None]   # the FP32-rewritten model, to locate a lossy divergence
    check_order(pipeline + quantize)
    records = run_pipeline(graph, pipeline, ctx, after_change)
    if plan is not None:
        done[0] = list(records)
        t = time.perf_counter()
        from rewriter.quant.plan import resolve
        form = plan.weight_form(options.get("migraphx_version"))[0]
        if form == "axis" and graph.opset < 13 and "int8" in resolve(
                plan, list(graph.nodes)).precision.values():
            # Per-axis Q/DQ needs opset 13; converting first is exact (shared FACTS.md).
            graph, original = upgrade_opset(graph, original, base_dir, 13)
            ctx.namer = Namer(graph)
            last_metrics[0] = None  # the graph changed outside a pass: check it again
            report.warnings.append("model converted to opset 13 for per-channel weight scales")
        fp32_exported = _prepare_plan(graph, original, base_dir, ctx, plan, calib_data,
                                      progress, report)
        seconds["calibrate"] = time.perf_counter() - t
        if verifier is not None:
            fp32_snapshot[0] = fp32_exported or export(graph, original, base_dir)
        records += run_pipeline(graph, quantize, ctx, after_change,
                                before=[r.name for r in records])
    seconds["passes"] = sum(r.seconds for r in records)
    report.passes = records

    t = time.perf_counter()
    exported = export(graph, original, base_dir)
    validate_model(exported.checkable(), "rewritten model")
    result = exported.model
    report.ops_after = op_histogram(result.graph)
    report.bytes_after = total_weight_bytes(result)
    seconds["export"] = time.perf_counter() - t
    if verifier is not None:
        t = time.perf_counter()
        # Passes that changed nothing leave the graph as the last check saw it: reuse it.
        metrics = last_metrics[0] or verifier.check(exported, depth["worst"], max(1, depth["n"]))
        report.verification = [m.to_dict() for m in metrics]
        seconds["verify"] = verify_time[0] + time.perf_counter() - t
        if not report.ok:
            report.failed_pass = report.failed_pass or "(final model)"
            report.seconds = seconds
            raise _verification_error("rewritten model's outputs drift beyond tolerance",
                                      metrics, verifier, report,
                                      fp32_snapshot[0] if plan is not None else None,
                                      exported, graph, plan)
    if output is not None:
        t = time.perf_counter()
        save_model(exported, output)
        seconds["save"] = time.perf_counter() - t
    if target == "migraphx":
        t = time.perf_counter()
        from rewriter.migraphx.target import check_and_compile
        check_and_compile(report, exported, original, base_dir, output, migraphx, options,
                          input_shapes, inputs, seed, held_out, plan, verifier,
                          None if isinstance(model, onnx.ModelProto) else str(model))
        seconds["migraphx"] = time.perf_counter() - t
    report.seconds = seconds
    if materialize:
        result = exported.materialize()
    return result, report


def _prepare_plan(graph, original, base_dir, ctx, plan, calib_data, progress, report):
    """Resolve the plan on the FP32-rewritten graph and calibrate its INT8 inputs; return the
    export calibration ran on (None without INT8 layers), reused to locate lossy failures."""
    from rewriter.core.graph import node_id
    from rewriter.quant.plan import resolve

    assignment = resolve(plan, list(graph.nodes))
    ctx.data["assignment"] = assignment
    report.extra["plan"] = {"source": plan.source, "layers": {
        i: {"op": assignment.op[i], "precision": assignment.precision[i], "why": assignment.why[i]}
        for i in assignment.order}, "counts": assignment.counts()}
    report.warnings.extend(assignment.notes)
    int8 = [n for n in graph.nodes if assignment.precision.get(node_id(n)) == "int8"]
    if not int8:
        return None
    if calib_data is None:
        raise InputError(f"the plan puts {len(int8)} layers in INT8: calibration data is needed "
                         "(--calib DIR), or use a plan without INT8 layers")
    from rewriter.quant.ranges import collect_ranges

    cal = plan.int8["calibration"]
    tensors = sorted({n.inputs[0].name for n in int8})
    exported = export(graph, original, base_dir)
    ctx.data["ranges"] = collect_ranges(
        exported.model, tensors, calib_data, method=cal["method"],
        percentile=float(cal["percentile"]), num_bins=int(cal["num_bins"]),
        base_dir=exported.source_dir, initializers=exported.ort_initializers(),
        progress=progress)
    report.extra["calibration"] = {"method": cal["method"], "samples": len(calib_data),
                                   "tensors": len(tensors)}
    return exported


def _verification_error(what, metrics, verifier, report, fp32_exported, exported, graph, plan):
    """The error (with the report attached); for a lossy failure it names the first layer
    whose activations leave the budget."""
    msg = f"{what} ({_worst(metrics, verifier)})"
    if fp32_exported is not None:
        layer = _first_divergence(fp32_exported, exported, graph, verifier, plan)
        if layer:
            report.extra["first_divergent_layer"] = layer
            msg += f"; first layer beyond budget: {layer}"
    err = VerificationError(msg)
    err.report = report
    return err


def _worst(metrics, verifier=None) -> str:
    bad = [m for m in metrics if not m.ok] or metrics
    m = max(bad, key=lambda m: m.max_rel)
    s = (f"output '{m.name}': max_rel {m.max_rel:.2e}, max_abs {m.max_abs:.2e}, "
         f"cosine {m.cosine:.6f}")
    if m.top1 is not None:
        s += f", top-1 agreement {m.top1:.4f}"
    if m.sqnr_db != float("inf"):
        s += f", SQNR {m.sqnr_db:.1f} dB"
    if verifier is not None and verifier.lossy:
        s += " vs budget " + ", ".join(f"{k} {v:g}" for k, v in verifier.lossy.items())
    return s + ("" if m.shape_ok else ", shape/dtype differs")


def _first_divergence(ref_exp, new_exp, graph, verifier, plan) -> str | None:
    """The first layer (graph order) whose output's cosine with FP32 is below budget."""
    from rewriter.core.graph import node_id
    from rewriter.quant.plan import LAYER_OPS
    from rewriter.verify import layer_divergence

    names, labels = [], {}
    for n in graph.nodes:
        if n.op in LAYER_OPS and n.outputs:
            t = n.outputs[0]
            # convert-fp16 renames the float16 side of a region exit to <name>_fp16; the
            # float32 name is the Cast's output, which both models have.
            base = t.name[:-5] if t.name.endswith("_fp16") and t.dtype == np.float16 else t.name
            names.append(base)
            labels[base] = node_id(n)
    budget = (plan.verify["min_cosine"] if plan is not None else 0.99)
    return layer_divergence(ref_exp, new_exp, names, verifier.feed_sets[:8], budget, labels)
