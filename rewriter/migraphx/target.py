"""The MIGraphX step: compile the rewritten model, run it, judge it, and say what became int8.

Where ``import migraphx`` works:

1. **Compile and compare.** Parse the saved output with the inputs' dims (MIGraphX turns a
   symbolic dim into 1 silently otherwise), compile for ``gpu`` or ``ref`` (its CPU
   reference), run every sample, and compare with the *original* model in onnxruntime
   (graph optimisations off). An FP32 rewrite is judged by the FP32 tolerances. A plan
   model is judged against the FP32 original by the plan's accuracy budget (top-1
   agreement, cosine, SQNR) over several samples, next to onnxruntime's figure for the same
   model on the same samples: MIGraphX legitimately differs from onnxruntime on QDQ
   (match_qlinear_reused rewires a reused quantized tensor; float summation order moves
   values across int8 rounding boundaries), so comparing the two with FP32 tolerances would
   be wrong.
2. **INT8 lowering.** For a plan with INT8 layers: "N of M planned INT8 layers lower to
   quant_convolution/quant_dot", each layer that stays float named with its reason. On a GPU
   the count comes from the compiled program; elsewhere from MIGraphX's own GPU passes up to
   simplify_qdq run by migraphx-driver (rewriter.lowering), since ``ref`` has no int8 pass.

Where it does not: nothing is faked. The report says compilation was skipped and why; the
static check (rewriter.check) has already said what MIGraphX would refuse or run in float.
``require=True`` turns the skip into an error.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from rewriter.core.errors import InputError
from rewriter.core.pass_base import Numerics
from rewriter.verify.metrics import MIN_COSINE


class BackendUnavailable(InputError):
    """The requested backend is not installed and the user required it (exit 2)."""


def migraphx_step(output_path: str | os.PathLike, verifier, feed_sets: list[dict],
                  input_shapes: dict[str, list[int]] | None, *, candidate=None,
                  planned_int8: Sequence[str] = (), lossy: dict | None = None,
                  budget: str = "plan budget",
                  backend: str = "migraphx", device: str = "auto",
                  save_mxr: str | None = None, require: bool = False,
                  findings=None, what: str = "planned INT8 layers",
                  original: str | os.PathLike | None = None,
                  progress: bool = False, unknown: tuple = ((), None)) -> dict[str, Any]:
    """Compile ``output_path`` on MIGraphX, compare with ``verifier``'s reference (the
    original in onnxruntime on ``feed_sets``) and check the INT8 lowering.

    ``verifier`` may be a zero-argument callable that makes it (it runs the original, so
    only once MIGraphX is known to be there). ``candidate`` (a rewriter.Exported of the
    same model) gives onnxruntime's figure for a plan model; ``lossy`` is the plan's budget,
    or the default lossy one for a model quantized elsewhere, named by ``budget`` (None: an
    FP32 rewrite). ``original``: the original model's file, run on MIGraphX too when the
    outputs miss (``original_differs`` says when MIGraphX computes it as far off).
    ``unknown``: (ops the installed parser lacks that the original has, where that list
    came from): the compile is then not tried, the answer is known.
    Returns a JSON-able dict (status compiled | skipped | failed, metrics, lowering, ok).
    """
    be = _backend(backend)
    ok, why = be.available()
    if not ok:   # nothing below the return reads output_path, verifier or feed_sets
        if require:
            raise BackendUnavailable(f"{backend} is required but not available: {why}")
        info = {"backend": backend, "status": "skipped", "ok": True,
                "reason": f"compilation skipped: {why}"}
        if planned_int8:
            from rewriter.migraphx.lowering import Lowering
            low = Lowering("skipped", "simplify_qdq via migraphx-driver", planned=len(
                planned_int8), what=what, reason=f"{why}; the static check's "
                "plan-int8-stays-float findings are all that is known")
            info["lowering"] = low.to_dict()
        return info
    if not callable(verifier):
        verifier = (lambda made: lambda: made)(verifier)   # already made: hand it back
    info: dict[str, Any] = {"backend": backend, "version": why, "samples": len(feed_sets),
                            "judged_by": budget if lossy is not None else
                            "FP32 tolerances"}
    shapes = {k: list(v) for k, v in (input_shapes or {}).items() if k}
    numerics = Numerics.LOSSY if lossy is not None else Numerics.CLOSE
    run = None
    if backend == "migraphx":
        run = _compile_migraphx(be, info, output_path, verifier, feed_sets, shapes, numerics,
                                lossy, device, save_mxr, require, progress, unknown)
    else:
        outputs = be.run(output_path, feed_sets[0])
        info.update(status="compiled", device="gpu")
        info["metrics"] = _judge(verifier(), outputs, numerics, single=True)
    if candidate is not None and lossy is not None and info["status"] == "compiled":
        info["onnxruntime"] = [m.to_dict() for m in verifier().check(candidate, Numerics.LOSSY)]
        _as_onnxruntime(info)
    if run is not None and original is not None and not all(m["ok"] for m in info["metrics"]):
        _original_too(be, info, original, run, verifier(), feed_sets, shapes, numerics,
                      info["device"])
    if run is not None and not all(m["ok"] for m in info["metrics"]) \
            and not info.get("original_differs"):   # not explained by the original's run
        _selected(be, info, output_path, verifier(), feed_sets, shapes, numerics,
                  info["device"])
    if run is not None and not all(m["ok"] for m in info["metrics"]):
        _in_order(info, verifier(), run.outputs, numerics)
    if planned_int8 and backend == "migraphx":
        info["lowering"] = _lowering(info, output_path, feed_sets[0], shapes,
                                     planned_int8, findings, what)
    metrics_ok = all(m["ok"] for m in info.get("metrics", []))
    lowering_ok = info.get("lowering", {}).get("status") != "failed"
    info["ok"] = info["status"] != "failed" and metrics_ok and lowering_ok
    return info


def _in_order(info, verifier, outputs, numerics) -> None:
    """The misses left, judged as --verify judges them last (Verifier.allow_order): an FP32
    output computed from what a TopK/NMS/NonZero selects, of the original's shape, that
    agrees with each sample's rows matched in another order passes, said so; --strict
    refuses it (exit 1). A TopK over near-tied scores before a layer (a two-stage
    detector's box head) orders them by each backend's rounding: the original on MIGraphX
    misses as far, and the rewrite was blamed on the model (exit 2) where --verify passed.
    After the tie probe and the replay (which say more where they apply)."""
    from dataclasses import fields

    from rewriter.verify.metrics import OutputMetrics
    known = {f.name for f in fields(OutputMetrics)}
    ms = [OutputMetrics(**{k: v for k, v in m.items() if k in known}) for m in info["metrics"]]
    verifier.allow_order(ms, [o for _, o in _shaped(verifier.reference, outputs)], numerics, 2)
    for d, m in zip(info["metrics"], ms):
        if m.unordered:
            d.update(ok=m.ok, unordered=m.unordered, strict_refused=m.strict_refused)
    bad = [m for m in info["metrics"] if not m["ok"]]
    if bad and any(m.get("strict_refused") != "unordered" for m in bad):
        return   # a miss no order explains: judged as it was
    info.pop("original_differs", None)   # the original's miss was its order too
    info.pop("error", None)
    if bad:
        info["error"] = (f"MIGraphX's output '{bad[0]['name']}' agrees with the original's "
                         "in onnxruntime only with each sample's rows matched in another "
                         f"order (computed from what {bad[0]['unordered']} selects): --strict "
                         "refuses it")


def _shaped(reference, outputs) -> list[tuple]:
    """(reference, output) pairs, an output of the reference's shape but for its 1-dims
    reshaped to it: MIGraphX returns a 0-d output as shape {1}."""
    pairs = []
    for r, o in zip(reference, outputs):
        o = np.asarray(o)
        if o.shape != np.shape(r) and _squeezed(o.shape) == _squeezed(np.shape(r)):
            o = o.reshape(np.shape(r))
        pairs.append((r, o))
    return pairs


def backend_available(mgx: dict) -> bool:
    """Whether the backend ``mgx`` names (the API's ``migraphx=`` settings) imports."""
    return _backend(mgx.get("backend", "migraphx")).available()[0]


def _backend(name: str):
    if name == "migraphx":
        from rewriter.migraphx import backend as be
    elif name == "ort-migraphx":
        from rewriter.migraphx import ort_ep as be
    else:
        raise InputError(f"unknown backend '{name}' (migraphx, ort-migraphx)")
    return be


def _compile_migraphx(be, info, output_path, verifier, feed_sets, shapes, numerics, lossy,
                      device, save_mxr, require, progress=False, unknown=((), None)):
    """Compile and run on MIGraphX into ``info``; returns the run (None if it failed)."""
    if device == "auto":
        device = "gpu" if be.has_target("gpu") else None
        if device is None:
            info.update(status="skipped", device="none", reason=(
                "this MIGraphX has no GPU target (a CPU-only build): not compiled; "
                "--migraphx-target ref compiles on its slow CPU reference"))
            if require:
                raise BackendUnavailable(f"MIGraphX GPU target required: {info['reason']}")
            return None
    info["device"] = device
    ops, source = unknown
    if ops:
        # The installed parser does not know these ops and the original has them: parsing
        # either model throws 'Unknown operator'. Said now, without parsing a 194 MB tree
        # ensemble twice (97 s each, tenth round).
        info.update(status="failed", stage="parse",
                    original_refused=f"parse failed: Unknown operator: {ops[0]}",
                    error=f"MIGraphX cannot parse the original model either: its ONNX parser "
                          f"({source}) does not know {', '.join(ops)} (not caused by the "
                          "rewrite; nothing was compiled)")
        return None
    try:
        run = be.compile_and_run(output_path, feed_sets, input_shapes=shapes or None,
                                 target=device, save_mxr=save_mxr, progress=progress)
    except be.MigraphxError as e:
        info.update(status="failed", error=str(e), stage=e.stage)
        return None
    except ValueError as e:   # feeds the compiled program cannot take (backend._params)
        raise InputError(f"MIGraphX: {e}") from None
    info.update(status="compiled", op_histogram=run.op_histogram,
                kernel_counts=run.kernel_counts, compile_seconds=run.compile_seconds,
                run_seconds=run.run_seconds, input_dims=run.input_dims)
    info["metrics"] = _judge(verifier(), run.outputs, numerics)
    info["program_text"] = run.program_text if device == "gpu" else None
    return run


def _as_onnxruntime(info) -> None:
    """A plan's output that misses the budget on MIGraphX's samples as it does in
    onnxruntime on the same samples (top-1 at most one sample lower, cosine at most 0.01):
    MIGraphX computes the plan as onnxruntime does, and the budget is --verify's to judge,
    on all the held-out samples, not on this subset (vietcombank's captcha digits: one flip
    in 8 failed MIGraphX's check while 1 in 21 passed onnxruntime's, both at 0.875 on the
    same 8 samples)."""
    ort = {m["name"]: m for m in info.get("onnxruntime", [])}
    n = info.get("samples", 1)
    for m in info.get("metrics", []):
        o = ort.get(m["name"])
        if m["ok"] or o is None or o["ok"]:
            continue
        # the share within a max_abs too (certify.judge_abs): at most one sample fewer
        w, wo = ((x.get("certificate") or {}).get("within") for x in (m, o))
        if (m.get("top1") is None or o.get("top1") is None
                or m["top1"] >= o["top1"] - 1.0 / max(n, 1) - 1e-9) \
                and m["cosine"] >= o["cosine"] - 0.01 \
                and (w is None or wo is None or w >= wo - 1.0 / max(n, 1) - 1e-9):
            m["ok"], m["as_onnxruntime"] = True, True


def _original_too(be, info, original, run, verifier, feed_sets, shapes, numerics, device
                  ) -> None:
    """The rewritten model's MIGraphX outputs miss the tolerance: the original runs on
    MIGraphX too, on the same inputs. When MIGraphX computes the original as far from
    onnxruntime, and the rewritten model as the original (judged by the same rule),
    MIGraphX is at fault, not the rewrite (e.g. onnxruntime's dynamic uint8 quantization,
    MatMulInteger, which MIGraphX 2.15/2.16 compute differently)."""
    try:
        orig = be.compile_and_run(original, feed_sets, input_shapes=shapes or None,
                                  target=device)
    except be.MigraphxError:
        return
    if any(np.shape(a) != np.shape(b) for a, b in zip(orig.outputs, run.outputs)):
        return
    same = [verifier.judge_output(n, a, b, c, numerics, 2)
            for n, a, b, c in zip(verifier.output_names, orig.outputs, run.outputs,
                                  verifier.classes)]
    judged = _judge(verifier, orig.outputs, numerics)
    if not all(m.ok for m in same):
        # The rewrite changed what MIGraphX computes (integer-zero-points fixes its dynamic
        # int8): if the original lands further from onnxruntime, the miss is MIGraphX's.
        info["original_on_migraphx"] = [m.to_dict() for m in same]
        old = min(judged, key=lambda m: m["cosine"])
        new = min(info["metrics"], key=lambda m: m["cosine"])
        info["original_vs_onnxruntime"] = (f"{old['name']}: cosine {old['cosine']:.6f}, "
                                           f"max_rel {old['max_rel']:.2e}")
        if not old["ok"] and old["cosine"] <= new["cosine"]:
            # As far or further: an NMS whose output MIGraphX pads gives cosine 0 on both
            # (the fifteenth round's YOLOv8 + NMS under a plan).
            info["original_differs"] = f"{old['name']}: cosine {old['cosine']:.6f}"
            info["error"] = (
                f"MIGraphX computes the original model as far or further from onnxruntime "
                f"({old['name']}: cosine {old['cosine']:.6f}, max_rel {old['max_rel']:.2e}) "
                f"than the rewritten one ({new['name']}: cosine {new['cosine']:.6f}, max_rel "
                f"{new['max_rel']:.2e}, outside the {info['judged_by']}): not caused by the "
                "rewrite")
        return
    bad = [m for m in judged if not m["ok"]]
    if not bad:
        return
    apart = max(m.max_rel for m in same)
    tied = _tied_order(be, original, feed_sets, shapes, device, [m["name"] for m in bad])
    if len(tied) == len(bad):   # every miss is the order of ties: the rewrite is exact there
        for m in info["metrics"]:
            if m["name"] in tied:
                m["ok"], m["tied_order"] = True, (
                    f"{tied[m['name']]}; the rewritten model matches the original on MIGraphX, "
                    f"max_rel {apart:.2e}")
        return
    if _backends_apart(info, bad, numerics, apart):
        return
    worst = min(bad, key=lambda m: m["cosine"])
    info["original_differs"] = f"{worst['name']}: cosine {worst['cosine']:.6f}"
    info["error"] = (f"MIGraphX computes the original model differently from onnxruntime too "
                     f"({worst['name']}: cosine {worst['cosine']:.6f}, max_rel "
                     f"{worst['max_rel']:.2e}), and the rewritten model as the original "
                     f"(max_rel {apart:.2e} between them): not caused by the rewrite")


def _selected(be, info, output_path, verifier, feed_sets, shapes, numerics, device) -> None:
    """A miss on an output a TopK, NMS or NonZero selects, judged on MIGraphX as --verify
    judges it in onnxruntime (Verifier.judge_selected): what the selection reads, run on
    MIGraphX, against the original's values in onnxruntime; and the rewritten model's
    post-processing, compiled on MIGraphX and fed the original's values of those, against
    the original model's post-processing compiled and fed alike. MIGraphX computes that
    part its own way (the order of exact ties in a TopK, the zeros it pads an NMS's output
    with, which the check reports); the rewrite must not change what it computes there."""
    import tempfile

    import onnx

    from rewriter.core.graph import cut_model
    from rewriter.verify.verifier import _add_outputs
    # Reordering only: an output of another shape (an NMS's rows padded with zeros) is
    # MIGraphX computing it otherwise, which no selection explains.
    bad = [m for m in info["metrics"] if not m["ok"] and m["name"] in verifier.selection
           and m["shape_ok"]]
    if not bad:
        return
    model = onnx.load(output_path)
    reads = verifier.selected_reads(model)
    bad = [m for m in bad if m["name"] in reads]
    if not bad:
        return
    outs = [m["name"] for m in bad]
    names = list(dict.fromkeys(t for m in bad for t in reads[m["name"]]))
    theirs = list(dict.fromkeys(t for o in outs for t in verifier.selection[o][1]))
    verifier.reference_reads(list(dict.fromkeys(names + theirs)))
    values = [{t: verifier._reads[t][1][k] for t in verifier._reads}
              for k in range(len(feed_sets))]
    original = verifier._source[0]
    with tempfile.TemporaryDirectory(prefix="rewrite-mgx-") as tmp:
        paths = [os.path.join(tmp, f) for f in ("reads.onnx", "post.onnx", "orig_post.onnx")]
        post = cut_model(model, outs, {t: values[0][t].dtype for t in names})
        # What the original reads and the rewritten one does not is a shape the passes
        # folded: a constant here too (MIGraphX needs it at compile; one size per compile).
        orig_post = cut_model(original, outs, {
            t: values[0][t].dtype if t in names else np.asarray(values[0][t]) for t in theirs})
        del model.graph.output[:]
        _add_outputs(model, names)
        for path, m in zip(paths, (model, post, orig_post)):
            onnx.save(m, path)
        try:
            got = be.compile_and_run(paths[0], feed_sets, input_shapes=shapes or None,
                                     target=device).outputs
            replays = []
            for path, sub in zip(paths[1:], (post, orig_post)):
                wanted = [i.name for i in sub.graph.input]
                feeds = [{k: {**f, **v}[k] for k in wanted} for f, v in zip(feed_sets, values)]
                replays.append(be.compile_and_run(path, feeds, target=device).outputs)
        except be.MigraphxError as e:
            for m in bad:
                m["selected"] = {"by": verifier.selection[m["name"]][0], "reads": [],
                                 "replay": f"could not run on MIGraphX: {e}"}
            return
    got = dict(zip(names, got))
    for m, mine, orig in zip(bad, *replays):
        verifier.settle_selected(m, reads[m["name"]], got, np.asarray(mine), "", numerics, 2,
                                 against=np.asarray(orig),
                                 whose="the original's post-processing on MIGraphX")


def _backends_apart(info, bad: list[dict], numerics, apart: float) -> bool:
    """The rewritten model misses FP32 tolerances on MIGraphX only where the original does
    too, MIGraphX computes the rewritten model as the original, and every such output
    keeps FP32's cosine and top-1: MIGraphX and onnxruntime differ by their own rounding
    (tf2onnx's ResNet50V2: max_rel 3.0e-4 at cosine 1.000000 on the original, thirteenth
    round), and the rewrite changed nothing there. Those outputs pass, with the figures
    said; a larger difference (cosine below the floor, a top-1 flip) stays an error."""
    floor = MIN_COSINE.get(numerics)
    orig = {m["name"]: m for m in bad}
    mine = [m for m in info["metrics"] if not m["ok"]]
    if floor is None or not mine or any(
            m["name"] not in orig or m.get("integer") or m["cosine"] < floor
            or m.get("top1") not in (None, 1.0) or orig[m["name"]]["cosine"] < floor
            for m in mine):
        return False
    for m in mine:
        o = orig[m["name"]]
        m["ok"], m["backends_apart"] = True, (
            f"the original on MIGraphX is as far from onnxruntime, cosine {o['cosine']:.6f}, "
            f"max_rel {o['max_rel']:.2e}: the backends differ, and MIGraphX computes the "
            f"rewritten model as the original, max_rel {apart:.2e}")
    return True


def _tied_order(be, original, feed_sets, shapes, device, names: list[str]) -> dict[str, str]:
    """{output: why} for the outputs ``names`` whose difference between MIGraphX and
    onnxruntime is the order of ties in a TopK: every tensor the TopK-dependent part of
    the graph reads from the rest (the TopK's own input included) agrees within FP32
    tolerances, yet values in a TopK's top k lie closer together than those tensors
    differ by, so which comes first is rounding, and all that is gathered by its indices
    comes out in another order. An end-to-end YOLOv8 head (TopK 300 of its scores, boxes
    gathered by index) on an input with nothing to detect: onnxruntime's Sigmoid errs by
    up to 1.1e-7 on logits below -16 (2.1e-7 for 9.5e-8) and MIGraphX's does not, so
    hundreds of scores near 1e-7 tie differently: cosine 0.76 on an output whose
    computation agrees everywhere else.

    Measured, not assumed: those tensors are made outputs of a copy of the original and
    run on both, on the same inputs. Any doubt (no TopK, a tensor that differs, no tie
    within the difference, control flow after the TopK, a model over 1 GB) leaves the
    outputs judged as they were."""
    import tempfile

    import onnx

    from rewriter.core import ort
    from rewriter.core.errors import RewriteError
    from rewriter.core.graph import (constant_tensors, iter_model_tensors, selection_dependent,
                                     tensor_nbytes)
    from rewriter.verify.feeds import stack_runs
    from rewriter.verify.metrics import ABS_FLOOR, compare

    try:   # the weights' size from the headers first: a copy is written below
        model = onnx.load(original, load_external_data=False)
        if sum(tensor_nbytes(t) for t in iter_model_tensors(model.graph)) > (1 << 30):
            return {}
        onnx.load_external_data_for_model(model, os.path.dirname(os.fspath(original)))
    except (OSError, ValueError, RewriteError):
        return {}
    g = model.graph
    consts = constant_tensors(g)
    # Tensors that depend on a TopK's order: its outputs and everything computed from them;
    # the first TopK on each path is a root.
    roots, dependent, frontier = selection_dependent(g, ("TopK",))
    if not roots or not all(name in dependent for name in names):
        return {}
    data = sorted(frontier)
    g.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in data)  # our copy
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "topk_inputs.onnx")
        onnx.save(model, path)
        try:
            got = be.compile_and_run(path, feed_sets, input_shapes=shapes or None,
                                     target=device).outputs[-len(data):]
            sess = ort.session(path)
            want = stack_runs([ort.run(sess, f, data) for f in feed_sets], feed_sets)
        except Exception:   # noqa: BLE001 - a probe that does not run explains nothing
            return {}
    noise = {}
    for t, a, b in zip(data, got, want):
        a, b = np.asarray(a), np.asarray(b)
        m = compare(t, b, a) if a.shape == b.shape else None
        if m is None or not (m.max_abs <= ABS_FLOOR or (m.cosine >= 0.99999
                                                        and m.max_rel <= 1e-3)):
            return {}   # MIGraphX computes something else differently: not just the order
        noise[t] = (m.max_abs, b)
    for n in roots:
        if n.input[0] not in noise:   # a graph input: the same on both, ties ordered alike
            continue
        diff, values = noise[n.input[0]]
        attr = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
        k = int(onnx.numpy_helper.to_array(consts[n.input[1]]).ravel()[0])
        v = np.moveaxis(np.asarray(values, np.float64), int(attr.get("axis", -1)), -1)
        v = -np.sort(-v, axis=-1) if attr.get("largest", 1) else np.sort(v, axis=-1)
        ties = int((np.abs(np.diff(v[..., :k + 1], axis=-1)) <= diff).sum())
        if ties and diff > 0:   # equal inputs order ties alike (lower index first)
            why = (f"ordered by TopK '{n.name or n.output[0]}': {ties} of the gaps between "
                   f"its top {k + 1} values are within the {diff:.1e} by which MIGraphX's "
                   "input to it differs from onnxruntime's (everything else it reads "
                   "agrees), so the two order those ties differently")
            return dict.fromkeys(names, why)
    return {}


def _squeezed(shape) -> tuple:
    return tuple(d for d in shape if d != 1)


def _judge(verifier, outputs, numerics, single: bool = False) -> list[dict]:
    """MIGraphX's outputs judged as the verifier judges onnxruntime's (several samples of a
    lossy model: by the certificate, so that a budget the samples cannot decide passes on
    both or neither)."""
    reference = verifier.reference
    if single and len(verifier.feed_sets) > 1:   # one run only: compare its first sample
        n = np.shape(outputs[0])[0] if np.ndim(outputs[0]) else 1
        reference = [np.asarray(r)[:n] for r in reference]
    from rewriter.verify.metrics import OutputMetrics
    metrics, empties = [], set()
    for name, (r, o), c in zip(verifier.output_names, _shaped(reference, outputs),
                               verifier.classes):
        if np.size(r) == 0 and o.size <= 1 and o.shape != np.shape(r):
            # MIGraphX has no zero-element tensors: an empty one (optimum's merged decoder's
            # unused encoder cache, a Constant of shape [0, 4, 1, 16]) comes back as one
            # undefined scalar, from the original as from the rewritten model (2.15, 2.16).
            metrics.append(OutputMetrics(name, True, 0.0, 0.0, 1.0, 0.0, empty=True))
            empties.add(name)
            continue
        m = verifier.judge_output(name, r, o, c, numerics, 2)
        if name in verifier.random_outputs:   # MIGraphX draws with its own generator
            m.ok = True
        metrics.append(m)
    # as --verify allows it: onnx-asr's GigaAM log-mel on a pure chirp, max_rel 4.0e-4 on
    # MIGraphX, 6.1e-4 on onnxruntime, against the original's own 5.4e-4 per ulp
    verifier.allow_noise(metrics, numerics, 2)
    return [dict(m.to_dict(), **({"no_empty": True} if m.name in empties else {}),
                 **({"random": verifier.random_outputs[m.name]}
                    if m.name in verifier.random_outputs else {})) for m in metrics]


def _lowering(info, output_path, feeds, shapes, planned, findings, what) -> dict:
    from rewriter.migraphx import lowering
    from rewriter.migraphx.backend import kernel_counts

    dims = {k: list(v) for k, v in shapes.items()}
    for name, x in feeds.items():
        dims.setdefault(name, list(np.shape(x)))
    result = lowering.lower_int8(output_path, dims, list(planned), findings=findings)
    result.what = what
    text = info.pop("program_text", None)
    if info.get("device") == "gpu" and text:
        # On a GPU the compiled program is the truth for the figure; the driver's run (when
        # it worked) still names the layers.
        kc = kernel_counts(text)
        result.source = "compiled GPU program"
        result.quant_kernels = kc["quant_convolution"] + kc["quant_dot"]
        result.status = "ok"
        result.error = None
        if not result.layers:
            result.named = False
            result.planned = len(planned)
        result.lowered = min(result.quant_kernels, len(planned))
    return result.to_dict()


def render(info: dict[str, Any]) -> str:
    """The MIGraphX part of the terminal summary."""
    if info["status"] == "skipped" and "lowering" not in info:
        return f"{info['backend']}: {info['reason']}"
    head = info["backend"] + (f" ({info['version']}, {info.get('device', '')})"
                              if info.get("version") else "")
    lines = []
    if info["status"] == "skipped":
        lines.append(f"{head}: {info['reason']}")
    elif info["status"] == "failed":
        lines.append(f"{head}: {info['error']}")
    else:
        lines.append(f"{head}: compiled, {info['samples']} sample(s)" + (
            f" (each {info['joined']} joined: the batch --input-shape gives)"
            if info.get("joined") else "") + (
            f" ({info['other_shapes']} given of other shapes not run: one compiled shape)"
            if info.get("other_shapes") else "") + f", judged by {info['judged_by']}:")
        ort = {m["name"]: m for m in info.get("onnxruntime", [])}
        for m in info.get("metrics", []):
            lines.append("  " + _metric_line(m, ort.get(m["name"])))
        if info.get("original_vs_onnxruntime"):
            lines.append("  the original model on MIGraphX, against onnxruntime: "
                         + info["original_vs_onnxruntime"])
    low = info.get("lowering")
    if low and low["status"] == "skipped":
        lines.append("  " + low["headline"])
    elif low:
        lines.append("  " + low["headline"] + f" [{low['source']}, MIGraphX {low['version']}]")
        for name, why in low.get("stays_float", {}).items():
            lines.append(f"    stays float: {name}: {why or 'no reason known'}")
        if low.get("fp16_warning"):
            lines.append("    " + low["fp16_warning"])
    return "\n".join(lines)


def _metric_line(m: dict, ort: dict | None) -> str:
    from rewriter.verify.verifier import NOISE_FACTOR
    s = f"{m['name']}: "
    if m.get("no_empty"):
        return s + ("empty in onnxruntime (0 elements); MIGraphX has no zero-element tensors "
                    "and returns one undefined value: not compared")
    if m.get("random"):
        return s + (f"computed from {m['random']}, which MIGraphX draws with its own "
                    f"generator: not compared with onnxruntime (cosine {m['cosine']:.6f} here)")
    if m.get("top1") is not None:
        s += f"top-1 vs FP32 {m['top1']:.4f}" + (
            f" (onnxruntime {ort['top1']:.4f})" if ort and ort.get("top1") is not None else "")
        s += ", "
    if m.get("integer"):   # compared value by value, as onnxruntime's table says
        s += f"integers, {1 - m['mismatch']:.2%} equal {'ok' if m['ok'] else 'NOT OK'}"
    else:
        s += f"cosine {m['cosine']:.6f}" + (f" (onnxruntime {ort['cosine']:.6f})"
                                            if ort else "")
        s += f", max_rel {m['max_rel']:.2e} {'ok' if m['ok'] else 'NOT OK'}"
    c = m.get("certificate")
    if c is not None and c.get("within") is not None:   # a max_abs (certify.judge_abs)
        oc = (ort or {}).get("certificate") or {}
        s += (f", within max_abs {c['max_abs']:g} on {c['within']:.3f} of samples"
              + (f" (onnxruntime {oc['within']:.3f})" if oc.get("within") is not None
                 else "") + f", largest error {c['abs_worst']:.3g}")
    if m.get("tied_order"):
        s += f" (not comparable element by element: {m['tied_order']})"
    elif m.get("unordered"):
        s += (" (agrees with each sample's rows matched in another order: computed from "
              f"what {m['unordered']} selects" + ("; --strict refuses it)"
                                                   if m.get("strict_refused") else ")"))
    elif m.get("selected") and m["ok"]:
        sel = m["selected"]
        s += (f" (selected by {sel['by']}: judged on what it selects from, "
              + ", ".join(f"'{r['name']}' cosine {r['cosine']:.6f}" for r in sel["reads"])
              + "; its post-processing and the original's, on MIGraphX from the original's "
              f"values of those: {sel['replay']})")
    elif m.get("backends_apart"):
        s += f" ({m['backends_apart']})"
    elif m.get("noise") is not None and m["ok"]:
        s += (f" (within {NOISE_FACTOR:g}x the {m['noise']:.1e} by which the original moves "
              "when its inputs move by one ulp, as --verify allows)")
    elif m.get("as_onnxruntime"):
        s += (f" (misses on these {c['n'] if c else ''} samples as onnxruntime does on the "
              "same samples: --verify judges the budget on all held-out samples)")
    elif c is not None and not c["met"]:
        s += f" (not certified on {c['n']} samples: {c['why']})" if m["ok"] else \
            f" ({c['why']})"
    return s


def static_check(report, exported, version: tuple[int, ...] | None, input_shapes,
                 typed=None, examples=None) -> tuple:
    """The API's target step, first half: the static check into ``report`` (grouped
    warnings). Returns what :func:`compile_output` needs: the check's result, the layers
    meant to run INT8 and what to call them."""
    from rewriter.migraphx.check import check_model

    layers = (report.extra.get("plan") or {}).get("layers", {})
    int8 = [k for k, v in layers.items() if v["precision"] == "int8"]
    result = check_model(exported.model, input_shapes=input_shapes, plan_int8_nodes=int8,
                         version=version, typed=typed, examples=examples)
    what = "planned INT8 layers"
    if not int8 and result.qdq_layers:   # a model quantized elsewhere: its Q/DQ layers
        int8, what = list(result.qdq_layers), "Q/DQ layers"
    report.extra["migraphx_check"] = result.to_dict()
    # A finding whose hint names a pass that ran and skipped: say so, not only that the
    # pass writes such nodes (a DFT with a computed dft_length is left by expand-spectral).
    skipped = {p.name: ", ".join(f"{k} {v}" for k, v in p.counts.items() if k.startswith("skip:"))
               for p in report.passes}
    for line in result.summary_lines(("error", "warning")):
        left = [f"{n} ran and left it ({why})" for n, why in skipped.items()
                if why and f"the pass {n}," in line]
        report.warnings.append(f"migraphx {line}" + (f" [{'; '.join(left)}]" if left else ""))
    return result, int8, what


# Refusals of the original that no size changes (lowering.KNOWN_FAILURES' codes): the
# other sizes are not tried.
SIZE_INDEPENDENT = ("unsupported-op", "int4-tensor-shape", "unsupported-dtype")


def compile_output(report, checked: tuple, exported, original, base_dir, output, mgx: dict,
                   input_shapes, inputs, seed: int, held_out: list, plan, verifier,
                   model_path: str | None, fill: int | None = None,
                   ints: tuple[int, int] = (0, 4)) -> None:
    """The API's target step, second half: :func:`migraphx_step` on the saved output
    (``checked`` is what :func:`static_check` returned). Random inputs use ``fill`` in
    the symbolic dims past the batch (None: 1) and integers in ``ints``, as verification
    did; without
    verification, FIRST_FILL, 32 and then 1, as verification would have.

    When MIGraphX refuses the output, the original is tried at the same dims: if it is
    refused too, the dims are at fault, not the rewrite; with random inputs and symbolic
    dims the user did not set, the larger sizes of feeds.FALLBACK_FILLS are tried next."""
    from rewriter.migraphx import backend as mgx_backend
    mgx_backend.said().clear()
    mgx_backend.notes().clear()
    try:
        _compile_sizes(report, checked, exported, original, base_dir, output, mgx,
                       input_shapes, inputs, seed, held_out, plan, verifier, model_path, fill,
                       ints)
    finally:
        said = mgx_backend.said()
        if said:   # the C++ side's console lines, kept out of stdout and -q
            report.warnings.append("MIGraphX printed while parsing: " + "; ".join(said[:5]))
            said.clear()
        report.warnings.extend(f"migraphx: {n}" for n in mgx_backend.notes())
        mgx_backend.notes().clear()


def _compile_sizes(report, checked, exported, original, base_dir, output, mgx, input_shapes,
                   inputs, seed, held_out, plan, verifier, model_path, fill, ints) -> None:
    """compile_output's sizes: the verification's, then larger ones where only they run."""
    from rewriter.migraphx.lowering import known_failure
    from rewriter.verify.feeds import FALLBACK_FILLS, FIRST_FILL, symbolic_dims, weight_dims
    from rewriter.verify.verifier import OriginalRunError

    if not _backend(mgx.get("backend", "migraphx")).available()[0]:
        # Skipped at any size: no sizes to work out (weight_dims infers the shapes of the
        # whole model, 0.6 s and 70 MB on a chain of 4,000 Conv+BN+Relu).
        _compile_output(report, checked, exported, original, base_dir, output, mgx,
                        input_shapes, inputs, seed, held_out, plan, verifier, model_path,
                        fill, ints)
        return
    random = inputs is None and not (plan is not None and held_out)
    derived = weight_dims(original) if random else {}
    free = symbolic_dims(original, input_shapes, derived=derived) if random else {}
    if free and verifier is None:   # no --verify chose the sizes: as it would have
        fills = [FIRST_FILL, FALLBACK_FILLS[0], None, *FALLBACK_FILLS[1:]]
    else:
        fills = [fill] + ([f for f in FALLBACK_FILLS if fill is None or f > fill] if free else [])
    fills = [(f, False) for f in fills]
    # Last, the first dims too (madmom's key CNN reads [frames, bins]: MIGraphX refuses to
    # pool one frame where onnxruntime runs it), as verification's last resort does.
    batch = symbolic_dims(original, input_shapes, batch=True, derived=derived) if random else {}
    if batch != free:   # some first dim is symbolic too
        fills += [(f, True) for f in (FIRST_FILL, *FALLBACK_FILLS)]
        free = {**free, **batch}
    first = first_info = info = None
    tried: list[int] = []
    for k, (f, fill_batch) in enumerate(fills):
        try:
            ints = _narrowing(report, ints, random, lambda i: _compile_output(
                report, checked, exported, original, base_dir, output, mgx, input_shapes,
                inputs, seed, held_out, plan, verifier if k == 0 else None, model_path, f, i,
                fill_batch=fill_batch))
        except OriginalRunError as e:   # the reference, in onnxruntime
            if k + 1 == len(fills):
                raise
            first = first or str(e)
            tried.append(k)
            continue
        except InputError:
            if k == 0:
                raise
            continue   # a fallback size too large for random inputs (224 in a batch dim)
        tried.append(k)
        info = report.extra["compile"]
        if info.get("status") != "failed" or not info.get("original_refused"):
            break
        first = first or "MIGraphX " + info["original_refused"]
        first_info = first_info or info
        known = known_failure(info["original_refused"])
        if known is not None and known[2] in SIZE_INDEPENDENT or info.get("fix_shapes"):
            break   # an unknown operator is unknown at every size
    if info is None:   # the original ran at no size that random inputs can take
        raise OriginalRunError(first)
    sizes = [str(fills[i][0] or 1) for i in tried]
    k = tried[-1]   # the last size that ran (a later one may have been too large)
    if k > 0 and info.get("status") == "failed" and info.get("original_refused"):
        # The first size's error: the later ones fail for their size (a table of 512
        # positions at 1024), which says nothing of the model at the size it was given.
        info = report.extra["compile"] = first_info
        past = [str(fills[i][0] or 1) for i in tried[1:] if not fills[i][1]]
        firsts = [str(fills[i][0] or 1) for i in tried[1:] if fills[i][1]]
        info["error"] += "".join(
            f"; nor with {' or '.join(v)} {where}" for v, where in (
                (past, "in the symbolic dims past the batch"),
                (firsts, "in the first dims too")) if v) + ": --input-shape sets the sizes"
    if info.get("status") == "failed" and info.get("set_input"):
        info["error"] += "; " + info["set_input"]
    f, fill_batch = fills[k]
    if k > 0 and info.get("status") == "compiled" and (f in FALLBACK_FILLS or fill_batch):
        where = "; ".join(f"{n} at {v}" for n, v in free.items())
        report.warnings.append(
            f"the original model does not run with {' or '.join(dict.fromkeys(sizes[:-1]))} "
            f"in its symbolic dims ({where}): {first}; compiled and compared with {f} "
            + ("in the first dims too" if fill_batch else "there instead")
            + ": --input-shape sets the sizes you use")


def _narrowing(report, ints: tuple[int, int], random: bool, compile_with) -> tuple[int, int]:
    """``compile_with(ints)``; where the original gives NaN or inf everywhere in an output
    on random integers in [0, 4) (T5's masking overflows on a mask of 3), again with
    integers in {0, 1}, then all 1, as --verify does (api's new_verifier): without
    --verify, nothing had narrowed them. Returns the integers that ran."""
    from rewriter.verify.verifier import NARROWER_INTS, NonFiniteReference

    try:
        compile_with(ints)
        return ints
    except NonFiniteReference as e:
        if not random or ints != (0, 4):
            raise
        first = e
    for narrower, say in NARROWER_INTS:
        try:
            compile_with(narrower)
        except NonFiniteReference:
            continue
        report.warnings.append(f"MIGraphX's random inputs, integers in [0, 4): {first}; "
                               f"compared with the integer inputs set to {say} instead (a "
                               "mask, say): --inputs gives real ones")
        return narrower
    raise first


def _compile_output(report, checked, exported, original, base_dir, output, mgx, input_shapes,
                    inputs, seed, held_out, plan, verifier, model_path, fill,
                    ints=(0, 4), fill_batch: bool = False) -> None:
    result, int8, what = checked
    backend = mgx.get("backend", "migraphx")
    if not backend_available(mgx):   # skipped: no inputs to make, nothing to save
        report.extra["compile"] = migraphx_step(
            output, None, [], input_shapes, planned_int8=int8, backend=backend,
            require=bool(mgx.get("require")), what=what)
        return
    feed_sets = _feed_sets(original, input_shapes, inputs, seed, held_out, plan,
                           int(mgx.get("samples", 8)), fill, ints, fill_batch)
    lossy = plan.verify if plan is not None else None
    strict = bool(getattr(verifier, "strict", False))
    budget = "plan budget"
    if lossy is None and int8 and what == "Q/DQ layers":
        # A model quantized elsewhere: MIGraphX and onnxruntime legitimately round its Q/DQ
        # differently (docs/migraphx.md), so FP32 tolerances would fail a correct compile.
        from rewriter.verify.metrics import LOSSY_DEFAULT
        lossy, budget = dict(LOSSY_DEFAULT), "lossy budget (a Q/DQ model)"

    made: list = []

    def reference():   # the original runs only when MIGraphX did compile
        if not made:
            if verifier is not None and _same_feeds(verifier.feed_sets, feed_sets):
                made.append(verifier)
            else:
                from rewriter.verify import Verifier
                # an api._OnFile not written yet: in memory, not written for onnxruntime
                path = model_path if getattr(model_path, "written", True) else None
                made.append(Verifier(original, base_dir, feed_sets, path=path,
                                     lossy=lossy, strict=strict))
        return made[0]

    import tempfile

    from rewriter.core.save import save_model
    with tempfile.TemporaryDirectory(prefix="rewrite-mgx-") as tmp:
        path = output
        if path is None:
            path = os.path.join(tmp, "model.onnx")
            save_model(exported, path)
        report.extra["compile"] = migraphx_step(
            path, reference, feed_sets, input_shapes, candidate=exported, planned_int8=int8,
            lossy=lossy, budget=budget, backend=mgx.get("backend", "migraphx"),
            device=mgx.get("device", "auto"), save_mxr=mgx.get("save_mxr"),
            require=bool(mgx.get("require")), findings=result.findings, what=what,
            original=model_path if backend == "migraphx" else None,
            progress=bool(mgx.get("progress")),
            unknown=(_unknown_in_original(result, original), result.profile.get("ops_source")))
        info = report.extra["compile"]
        for m in info.get("metrics", []):   # as --verify warns of it (api._Rewrite)
            if m.get("unordered") and (m["ok"] or m["strict_refused"]):
                report.warnings.append(
                    f"MIGraphX: output '{m['name']}' differs in place from the original's in "
                    f"onnxruntime (cosine {m['cosine']:.4f}) and agrees with each sample's "
                    f"rows matched in another order: it is computed from what {m['unordered']}"
                    " selects, which orders near-equal values otherwise after the "
                    "backends' rounding; --strict refuses it")
        if feed_sets and getattr(feed_sets[0], "per", 1) > 1:
            info["joined"] = feed_sets[0].per
        given = [inputs] if isinstance(inputs, dict) else inputs or []
        first = {k: np.shape(v) for k, v in feed_sets[0].items()} if feed_sets else {}
        other = sum({k: np.shape(v) for k, v in f.items()} != first for f in given)
        if other:   # chars2vec's words of other lengths: "1 sample(s)" of 8, unsaid
            info["other_shapes"] = other
        # a run's failure too: a Loop state declared without a shape made 2.16 throw on
        # the original as on the rewritten model, and the rewrite was blamed (exit 1)
        if info.get("status") == "failed" and info.get("stage") in ("parse", "compile", "run") \
                and model_path is not None and backend == "migraphx" \
                and not info.get("original_refused"):
            from rewriter.migraphx.backend import _dims
            dims = _dims(feed_sets[0], {k: v for k, v in (input_shapes or {}).items() if k})
            run = {"feeds": feed_sets[:1]} if info["stage"] == "run" else {}
            err = _backend(backend).refuses(
                model_path, dims, None if info["stage"] == "parse" else info.get("device"), **run)
            # a 0-d input (Silero's sr) as [], not as nothing ("sr:"; h82)
            shown = ", ".join(f"{k}:{'x'.join(map(str, v)) or '[]'}" for k, v in dims.items())
            if err is not None:
                info["original_refused"] = f"{err.stage} failed: {err.message}"
                own = info.get("error", "")
                info["error"] = (f"MIGraphX cannot {err.stage} the original model either at "
                                 f"{shown}: {err.message} (not caused by the rewrite)")
                if err.message not in own:   # the rewrite got past that one, not past another
                    info["error"] += f"; the rewritten model fails otherwise: {own}"
                hint = _set_input_hint(original)
                if hint:   # said last
                    info["set_input"] = hint
                if err.stage == "parse" and _symbolic(exported.model) \
                        and _fixed_parses(model_path, dims, tmp):
                    flags = " ".join(f"--input-shape {k}:{'x'.join(map(str, v))}"
                                     for k, v in dims.items() if len(v))
                    info["error"] += ("; with these sizes written into the model, MIGraphX "
                                      f"parses it: add --fix-shapes {flags}")
                    info["fix_shapes"] = flags   # the sizes are fine: no other is tried
            else:
                does = {"parse": "parses", "compile": "compiles"}.get(info["stage"], "runs")
                info["error"] += f" (the original model {does} at {shown}: the rewrite broke it)"


def _set_input_hint(original) -> str:
    """Where the original is refused: the flags that fold its Ifs (check.set_input_flags)."""
    from rewriter.migraphx.check import set_input_flags

    flags = list(set_input_flags(original).values())
    return f"{' or '.join(flags[:2])} keeps one branch of the If" if flags else ""


def _unknown_in_original(result, original) -> list[str]:
    """The ops the static check found unknown to the installed MIGraphX's parser (its own
    op list, not the packaged profile's) that the original model has too."""
    if not str(result.profile.get("ops_source", "")).startswith("installed"):
        return []
    from rewriter.core.graph import graph_protos
    have = {n.op_type for g in graph_protos(original.graph) for n in g.node}
    return sorted({f.op_type for f in result.findings
                   if f.code == "unsupported-op" and f.op_type in have})


def _symbolic(model) -> bool:
    """Whether a graph input has a dim that is not a fixed size."""
    return any(not (d.HasField("dim_value") and d.dim_value > 0)
               for vi in model.graph.input if vi.type.HasField("tensor_type")
               for d in vi.type.tensor_type.shape.dim)


def _fixed_parses(model_path, dims: dict, tmp: str) -> bool:
    """Whether MIGraphX parses the model once ``dims`` are written into its inputs and
    what they make static is folded (--fix-shapes): it parses sizes computed from Shape
    only when they are constants (a ConstantOfShape of a batch dim, say)."""
    from rewriter.api import rewrite
    from rewriter.core.errors import RewriteError

    path = os.path.join(tmp, "fixed.onnx")
    try:
        rewrite(model_path, output=path, input_shapes=dims, fix_shapes=True,
                materialize=False)
    except RewriteError:
        return False
    return _backend("migraphx").refuses(path, dims, None) is None


def _feed_sets(original, input_shapes, inputs, seed, held_out, plan, samples: int,
               fill: int | None = None, ints: tuple[int, int] = (0, 4),
               fill_batch: bool = False) -> list:
    """What MIGraphX runs: the user's inputs; else, for a plan, up to ``samples`` held-out
    calibration samples of one shape (or seeded random ones); else one random sample."""
    from rewriter.verify import make_feeds

    if inputs is not None or (plan is not None and held_out):
        # one compiled shape: the samples of the first one's
        given = held_out if inputs is None else [inputs] if isinstance(inputs, dict) else inputs
        first = {k: np.shape(v) for k, v in given[0].items()}
        same = [f for f in given if {k: np.shape(v) for k, v in f.items()} == first]
        return _batched(same, input_shapes)[:max(2 if inputs is None else 1, samples)]
    n = max(2, samples) if plan is not None else 1
    return [make_feeds(original, input_shapes, seed + i, fill=fill, ints=ints,
                       fill_batch=fill_batch) for i in range(n)]


def _batched(feeds: list, input_shapes) -> list:
    """Samples of a smaller batch than --input-shape gives (calibration images, one a
    sample; --input-shape images:4x3x96x128), joined on axis 0 into batches of that size,
    the last one filled from the first samples: MIGraphX compiles the given batch, and ran
    them at theirs (exit 2, 'the compiled program expects [4, 3, 96, 128]: pass
    input_shapes', which was given). Unchanged unless every input's samples are a whole
    part of its given batch, the other dims equal."""
    from rewriter.verify.feeds import given_dims

    shapes = input_shapes or {}
    if not feeds:
        return feeds
    parts = set()
    for k, v in feeds[0].items():
        have = np.shape(v)
        want = given_dims(shapes, k, len(have))
        if want is None or len(want) != len(have) or not have or have[0] < 1 \
                or list(have[1:]) != [int(d) for d in want[1:]] or int(want[0]) % have[0]:
            return feeds
        parts.add(int(want[0]) // have[0])
    if len(parts) != 1 or parts == {1}:
        return feeds
    (k,) = parts
    groups = -(-len(feeds) // k)
    return [_Joined(k, {n: np.concatenate([feeds[(g * k + i) % len(feeds)][n]
                                           for i in range(k)]) for n in feeds[0]})
            for g in range(groups)]


class _Joined(dict):
    """A feed of ``per`` samples joined (:func:`_batched`), said in the compile line."""

    def __init__(self, per: int, feed: dict):
        super().__init__(feed)
        self.per = per


def _same_feeds(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        for x, y in zip(a, b))
