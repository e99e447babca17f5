"""The verifier: the original runs once in onnxruntime, candidates are compared against it."""

from __future__ import annotations

import re
import zlib

import numpy as np
import onnx

from rewriter.core import ort
from rewriter.core.errors import InputError
from rewriter.core.graph import (cut_model, graph_protos, node_bodies, runnable_names,
                                  selection_dependent, selection_reads)
from rewriter.core.pass_base import Numerics
from rewriter.verify.certify import judge_units, sample_abs_errors
from rewriter.verify.feeds import join_runs, stack_runs
from rewriter.verify.metrics import (MIN_COSINE, TINY_OUTPUT, CosineSums, OutputMetrics,
                                     abs_tolerance, class_outputs, compare, compute_eps,
                                     head_features, judge, real_positions, scale_groups,
                                     scale_split)


class OriginalRunError(InputError):
    """onnxruntime loads the original model but cannot run it on the feeds given; ``reason``
    is onnxruntime's why, without the feeds' sizes."""

    def __init__(self, message: str, reason: str = ""):
        super().__init__(message)
        self.reason = reason or message


class NonFiniteReference(InputError):
    """A float output of the original is NaN or infinite everywhere on the feeds: there is
    nothing to compare, and equal NaNs must not pass for a verified output."""


# Random integer inputs are drawn in [0, 4); where the original gives NaN or inf everywhere
# on them (T5's masking overflows on a mask of 3) or refuses them, again in these, in order
# (api's new_verifier, and the MIGraphX step without --verify): [low, high), as said.
NARROWER_INTS = (((0, 2), "0 or 1"), ((1, 2), "1"))


# The cosine the original's own one-ulp response must keep for it to widen the cosine floor
# (Verifier.allow_noise): below it the inputs test nothing (a YOLOv8 head whose ties reorder:
# 0.84 under one ulp, and 8x that 1 - cosine passed any output, a wrong one too).
NOISE_COSINE_MIN = 0.99


class Verifier:
    """Runs the original once, then compares candidates against it, output by output.

    ``feeds`` is one input dict or a list of them (e.g. held-out calibration samples);
    outputs of several sets are joined one sample per row (:func:`feeds.stack_runs`) before
    comparing.
    """

    def __init__(self, original: onnx.ModelProto, base_dir, feeds,
                 path: str | None = None, lossy: dict | None = None, labels=None,
                 strict: bool = False, classes: list[bool] | None = None, all_labels=None,
                 runs: list | None = None, label_output: str | None = None):
        """``classes`` and ``runs``: which outputs have classes and the original's outputs
        on ``feeds``, as a verifier on more of the same inputs found them (quick): decided
        on all of them, not again on the first few, and the original not loaded again;
        ``label_output``, the output the labels judge, likewise.
        ``all_labels``: every calibration sample's label, in reading order, of which
        ``labels`` are the held-out ones: checked in their place, so that a bad label is
        named by its place in the labels file, and one of a calibration sample is said too."""
        self.backend = ort
        self.strict = strict
        self._quick: Verifier | None = None
        # The planner's judgement of the plan (PlannerReport.measured) when it met the
        # budget, k-fold on every calibration sample: see judge_output.
        self.plan_certificate: dict | None = None
        self.labels = None if labels is None else np.asarray(labels)
        self.feed_sets = feeds if isinstance(feeds, list) else [feeds]
        self.lossy = lossy
        self.output_names = [o.name for o in original.graph.output]
        self.model_eps = compute_eps(original)
        self._noise: dict[str, OutputMetrics] | None = None
        self._requant: dict[str, OutputMetrics] | None = None
        self._source = (original, base_dir, path)   # for rounding_noise, run only if needed
        self._reads: dict[str, tuple] = {}   # tensor: (joined, per feed set, classes)
        self.real: dict = {}   # output padded to the longest run: its real positions
        # DFT/STFT run in float64 in the reference and every candidate (spectral_in_double),
        # MatMulNBits at accuracy_level 0 (exact_kernels)
        self.spectral = has_spectral(original)
        self.nbits = bool(approximate_nbits(original))
        self.random = sorted({n.op_type for n in unseeded_random(original)})
        self.random_outputs = random_outputs(original)
        renamed = runnable_names(original)   # onnxruntime refuses nodes sharing a name
        if renamed is not original:
            original, path = renamed, None
            self._source = (original, base_dir, path)
        # Outputs a TopK, NMS or NonZero selects: judged, where they miss, on what the
        # selection reads (judge_selected); named as the renamed copy names them.
        self.selection = {o: (f"{n.op_type} '{n.name or n.output[0]}'", reads)
                          for o, (n, reads) in selection_reads(original.graph).items()}
        if runs is None:
            try:
                sess = self._original_session()
            except Exception as e:
                raise InputError(f"onnxruntime cannot load the original model: "
                                 f"{_line(e)}") from None
        try:
            runs = runs if runs is not None else [ort.run(sess, f) for f in self.feed_sets]
            named = (self.lossy or {}).get("max_abs")
            self.reference, self.classes, splits, real = reference_traits(
                runs, self.feed_sets, original, set(named) if isinstance(named, dict) else (),
                classes)
            self.splits = dict(zip(self.output_names, splits))
            self.real = dict(zip(self.output_names, real))
        except Exception as e:
            given = ", ".join(f"{k} {list(np.shape(v))} {np.asarray(v).dtype}"
                              for k, v in self.feed_sets[0].items())
            raise OriginalRunError(f"onnxruntime cannot run the original model on these "
                                   f"inputs ({given}): {_line(e)}", _line(e)) from None
        # quick's reference, the first sets' runs (none kept where quick is this verifier),
        # copied: onnxruntime's arrays keep its session, and its arena, alive (0.9 GB more
        # at the peak on the thirtieth round's PaiNN)
        self._first_runs = ([[np.array(o) for o in r] for r in runs[:QUICK_FEEDS]]
                            if len(runs) > QUICK_FEEDS else None)
        from rewriter.verify.certify import label_output as labelled
        k = labelled(self.labels if all_labels is None else all_labels, self.reference,
                     self.classes, self.output_names)
        self.label_output = label_output or (None if k is None else self.output_names[k])
        bad = [n for n, r in zip(self.output_names, self.reference)
               if np.issubdtype(r.dtype, np.floating) and r.size and not np.isfinite(r).any()]
        if bad:
            raise NonFiniteReference(
                f"the original model's output{'s' if len(bad) > 1 else ''} "
                f"{', '.join(repr(b) for b in bad)} {'are' if len(bad) > 1 else 'is'} NaN or "
                "infinite everywhere on these inputs: nothing to compare")

    def quick(self) -> Verifier:
        """This verifier on its first QUICK_FEEDS feed sets, or itself when it has no more:
        for the check after each pass, the final model being checked on all of them (api).
        Each pass on every input took 339 s of a 420 s run with 128 inputs (thirtieth
        round's PaiNN, 4 passes that changed it). Itself too when the original gives no
        finite value in an output on those first sets alone."""
        if len(self.feed_sets) <= QUICK_FEEDS:
            return self
        if self._quick is None:
            original, base_dir, path = self._source
            labels = None if self.labels is None else self.labels[:QUICK_FEEDS]
            try:
                self._quick = Verifier(original, base_dir, self.feed_sets[:QUICK_FEEDS],
                                       path=path, lossy=self.lossy, labels=labels,
                                       strict=self.strict, classes=self.classes,
                                       runs=self._first_runs,
                                       label_output=self.label_output)
                self._quick.plan_certificate = self.plan_certificate
            except NonFiniteReference:
                self._quick = self
        return self._quick

    def check(self, exported, numerics: Numerics, depth: int = 1) -> list[OutputMetrics]:
        """Compare an :class:`rewriter.core.convert.Exported` model with the reference."""
        model = exported.model
        names = [o.name for o in model.graph.output]
        if names != self.output_names:
            return [OutputMetrics(n, False, float("inf"), float("inf"), 0.0, 1.0, ok=False)
                    for n in self.output_names]
        # What a selection reads, output by the same run: a miss on what it selects is
        # judged on those (judge_selected), which ran the whole model again, once a pass
        # (RetinaNet on 8 photos: 8.5 s of 32 s verifying). Optimisations are off: an
        # output more changes no kernel, so the outputs are the values a run without gives.
        reads = self.selected_reads(model) if self.selection else {}
        extra = [t for t in dict.fromkeys(t for r in reads.values() for t in r)
                 if t not in names]
        if extra:
            model = onnx.ModelProto()
            model.CopyFrom(exported.model)
            _add_outputs(model, extra)
        try:
            sess = self.backend.session(exact_kernels(model), exported.source_dir,
                                        initializers=exported.ort_initializers())
        except Exception as e:  # noqa: BLE001 - the caller names the pass or the input
            raise ModelLoadError(f"onnxruntime cannot load it: {_line(e)}") from None
        try:
            runs = [self.backend.run(sess, f) for f in self.feed_sets]
        except Exception as e:  # noqa: BLE001 - the original ran on these feeds
            raise ModelLoadError(f"onnxruntime cannot run it: {_line(e)}") from None
        outs = stack_runs([r[:len(names)] for r in runs], self.feed_sets)
        metrics = [self.judge_output(name, r, o, c, numerics, depth)
                   for name, r, o, c in zip(names, self.reference, outs, self.classes)]
        if any(not m.ok and m.name in self.selection for m in metrics):
            given = (names + extra, runs) if reads else None
            self.judge_selected(exported, metrics, numerics, depth, given=given)
        self.allow_noise(metrics, numerics, depth)
        self.allow_order(metrics, outs, numerics, depth)
        return metrics

    def allow_order(self, metrics: list[OutputMetrics], outs: list, numerics: Numerics,
                    depth: int) -> None:
        """An FP32 miss on an output computed from a selection (TopK, NMS, NonZero, behind
        control flow too), of the original's shape, judged again with each sample's rows
        matched as rows (:func:`match_rows`): near-equal scores that a rewrite's rounding
        reorders put the same boxes in another order (fortieth round: Faster R-CNN's exact
        rewrite on 32 photos, boxes cosine 0.99996 in place, 7.1e-6 reordered; its proposals
        reorder before the box head, so what the last selection reads differs in order
        too). A row keeps its values together (a box its four coordinates), so a rewrite
        that changed a value, or moved one within its row (x1 <-> y1), still fails;
        --strict refuses an output passed so."""
        if numerics is Numerics.LOSSY or not any(
                not m.ok and m.shape_ok for m in metrics):
            return
        chosen = selection_dependent(self._source[0].graph, flow=True)[1]
        for i, m in enumerate(metrics):
            if m.ok or not m.shape_ok or m.name not in chosen:
                continue
            ref = np.asarray(self.reference[i])
            matched = match_rows(ref, np.asarray(outs[i]))
            if matched is None:
                continue
            j = self.judge_output(f"{m.name} (rows matched)", ref, matched, False, numerics,
                                  depth, units=False)
            if j.ok:
                root = chosen[m.name]
                m.ok = not self.strict
                m.unordered = f"{root.op_type} '{root.name or root.output[0]}'"
                m.strict_refused = "unordered" if self.strict else ""

    def allow_noise(self, metrics: list[OutputMetrics], numerics: Numerics,
                    depth: int) -> None:
        """FP32 misses within NOISE_FACTOR times the original's own one-ulp response
        (:meth:`rounding_noise`) pass, marked with it; onnxruntime's and MIGraphX's
        outputs alike (a log-mel of near-empty bins). The cosine meets its floor, or, where
        the original's own response misses that floor too (a model chaotic on these
        inputs), is within NOISE_FACTOR times that response's 1 - cosine."""
        if numerics is not Numerics.LOSSY and any(_noise_may_explain(m) for m in metrics):
            noise = self.rounding_noise()
            widen = NOISE_FACTOR * max(1, depth) ** 0.5
            floor = MIN_COSINE.get(numerics, 1.0)
            for m in metrics:
                n = noise.get(m.name)
                if not _noise_may_explain(m) or n is None or m.max_rel > widen * n.max_rel:
                    continue
                if m.cosine >= floor:
                    m.ok, m.noise = True, n.max_rel
                elif NOISE_COSINE_MIN <= n.cosine < floor \
                        and 1 - m.cosine <= widen * (1 - n.cosine):
                    m.ok, m.noise, m.noise_cosine = True, n.max_rel, n.cosine
        elif numerics is Numerics.LOSSY and self.lossy is None and any(
                _requant_may_explain(m) for m in metrics):
            # No plan: a pass that re-rounds a Q/DQ model the model was given as
            # (weight-scales-after), judged against what the model itself does when its
            # quantizers' inputs move by one ulp (Smart Turn v3.2: 0.15 on a probability).
            noise = self.requantize_noise()
            for m in metrics:
                n = noise.get(m.name)
                if _requant_may_explain(m) and n is not None \
                        and m.max_rel <= NOISE_FACTOR * n.max_rel \
                        and 1 - m.cosine <= NOISE_FACTOR * (1 - n.cosine):
                    m.ok, m.noise, m.noise_at = True, n.max_rel, "quantizers"

    def judge_selected(self, exported, metrics: list[OutputMetrics], numerics: Numerics,
                       depth: int, given: tuple | None = None) -> None:
        """A miss on an output a TopK, NMS or NonZero selects, judged again in two halves
        (fifteenth round: YOLOv8's kept boxes at cosine 0.84 under --plan fp16 while the
        scores they were chosen by keep 1.0000; near-equal scores reorder under any
        quantization, and under float rounding, and everything gathered follows):

        1. what the selection reads, against the original's, by the same rule as an output;
        2. the rewritten model's post-processing replayed on the original's values of those
           tensors: it must give the original's output (FP32 tolerance, integers equal),
           so that a rewrite that changed the post-processing itself is still caught.

        Where both hold, the output passes, said by the caller; --strict refuses it. Only
        where the rewritten post-processing is plain and reads tensors the original's reads
        (core.graph.selection_reads); it may read fewer (a shape the passes folded).
        ``given``: (tensor names, their values a feed set) from the run that gave the
        outputs (check): the reads' values are taken from it, not run again."""
        reads = self.selected_reads(exported.model)
        bad = [m for m in metrics if not m.ok and m.name in reads]
        if not bad:
            return
        names = list(dict.fromkeys(t for m in bad for t in reads[m.name]))
        self.reference_reads(names)
        if given is not None and all(t in given[0] for t in names):
            at = [given[0].index(t) for t in names]
            values = stack_runs([[run[k] for k in at] for run in given[1]], self.feed_sets)
        else:
            values = _run_with_outputs(exported.model, exported.source_dir,
                                       exported.ort_initializers(), names, self.feed_sets)
        got = dict(zip(names, values))
        replayed, why = self._replay(exported, [m.name for m in bad], names)
        for m in bad:
            self.settle_selected(m, reads[m.name], got, replayed and replayed[m.name], why,
                                 numerics, depth)

    def selected_reads(self, model: onnx.ModelProto) -> dict[str, list[str]]:
        """{output the original's selection picks: the tensors ``model``'s post-processing
        reads}, where that is plain and reads tensors the original's reads (it may read
        fewer: a shape the passes folded)."""
        theirs = selection_reads(model.graph)
        return {o: theirs[o][1] for o in self.selection
                if o in theirs and set(theirs[o][1]) <= set(self.selection[o][1])}

    def settle_selected(self, m, reads: list[str], got: dict, replayed, why: str,
                        numerics: Numerics, depth: int, against=None,
                        whose: str = "the original's") -> None:
        """Judge output ``m`` (OutputMetrics, or its dict: the MIGraphX step's) on the
        values ``got`` of what its selection reads and on its post-processing's output
        ``replayed`` from the original's values of those (or ``why`` it did not run),
        against the original's output, or ``against`` (``whose``)."""
        judged = [self.judge_output(t, self._reads[t][0], got[t], self._reads[t][2],
                                    numerics, depth, units=False) for t in reads]
        name = m["name"] if isinstance(m, dict) else m.name
        k = self.output_names.index(name)
        said = ""
        if replayed is not None:
            close = Numerics.CLOSE if numerics is Numerics.LOSSY else numerics
            r = self.judge_output(name, self.reference[k] if against is None else against,
                                  replayed, self.classes[k], close, depth)
            # Integers equal, not the 1% of flipped ties an output may have: on the same
            # values, a flip is the post-processing changed (a threshold moved).
            r.ok = r.ok and not (r.integer and r.mismatch > 0)
            why = "" if r.ok else f"differs from {whose} ({_short_miss(r)})"
            said = "equal" if r.max_abs == 0 else f"equal to FP32 tolerance ({_short_miss(r)})"
        fields: dict = {"selected": {"by": self.selection[name][0],
                                     "reads": [j.to_dict() for j in judged],
                                     "replay": why or said}}
        if all(j.ok for j in judged) and not why:
            fields.update(ok=not self.strict, strict_refused="selected" if self.strict else "")
        elif all(j.ok or j.strict_refused for j in judged) and not why:
            fields["strict_refused"] = "selected"   # refused by --strict only (a read uncertified)
        for key, value in fields.items():
            if isinstance(m, dict):
                m[key] = value
            else:
                setattr(m, key, value)

    def reference_reads(self, names: list[str]) -> None:
        """The original's values of tensors it need not output: joined one sample per row as
        its outputs are, and per feed set (for the replay)."""
        names = [t for t in names if t not in self._reads]
        if not names:
            return
        original, base_dir, _ = self._source
        probe = onnx.ModelProto()
        probe.CopyFrom(original)
        del probe.graph.output[:]
        _add_outputs(probe, names)
        sess = _session(probe, base_dir)
        runs = [ort.run(sess, f) for f in self.feed_sets]
        joined, classes, splits, real = reference_traits(runs, self.feed_sets, probe)
        for k, (t, r, c, sp) in enumerate(zip(names, joined, classes, splits)):
            # A classifier's logits a TopK ranks keep their top-1 rule.
            self._reads[t] = (r, [run[k] for run in runs], c)
            self.splits[t] = sp
            self.real[t] = real[k]

    def _replay(self, exported, outputs: list[str], reads: list[str]):
        """({output: the rewritten model's post-processing run on the original's values of
        ``reads``, one sample per row}, "") or (None, why it could not run)."""
        sub = cut_model(exported.model, outputs,
                               {t: self._reads[t][1][0].dtype for t in reads})
        used = {t for n in sub.graph.node for t in n.input}
        inits = exported.ort_initializers()
        if inits is not None:
            inits = tuple(map(list, zip(*[(n, a) for n, a in zip(*inits) if n in used]))) \
                or None
        try:
            sess = _session(sub, exported.source_dir, initializers=inits)
            wanted = [i.name for i in sub.graph.input]
            runs = []
            for k, f in enumerate(self.feed_sets):
                feed = {t: self._reads[t][1][k] if t in self._reads else f[t] for t in wanted}
                runs.append(ort.run(sess, feed))
        except Exception as e:  # noqa: BLE001 - said in the report, the output stays failed
            return None, f"could not be replayed on the original's values: {_line(e)}"
        return dict(zip(outputs, stack_runs(runs, self.feed_sets))), ""

    def _original_session(self):
        """The original's onnxruntime session; from the file when there is one: onnxruntime
        reads it without a protobuf copy (not when its DFT/STFT run in float64, nor when
        it has float16 regions, which only a ModelProto's session rounds as stored: the
        candidates' sessions do, and a reference that did not would differ from them)."""
        original, base_dir, path = self._source
        if path and not self.spectral and not self.nbits and not self.random \
                and not ort.has_float16_region(original):
            return ort.session(path)
        return _session(original, base_dir)

    def rounding_noise(self) -> dict[str, OutputMetrics]:
        """{output: the original's outputs compared with themselves when every float input
        moves by one ulp (random direction, seeded)}: how much the model itself amplifies
        rounding on these inputs. SLANet on 8x8 random images: max_rel 1.2e-4, the FP32
        tolerance; onnxruntime's own basic optimiser drifts 0.9-5.5e-4 there. Run once, only
        when a check needs it."""
        if self._noise is None:
            sess = self._original_session()
            rng = np.random.default_rng(0)
            moved = []
            for f in self.feed_sets:
                g = {}
                for k, v in f.items():
                    v = np.asarray(v)
                    if np.issubdtype(v.dtype, np.floating):
                        way = np.where(rng.random(v.shape) < 0.5, -np.inf, np.inf)
                        v = np.nextafter(v, way.astype(v.dtype)).astype(v.dtype)
                    g[k] = v
                moved.append(ort.run(sess, g))
            self._noise = self._float_moves(stack_runs(moved, self.feed_sets))
        return self._noise

    def _float_moves(self, outs: list) -> dict[str, OutputMetrics]:
        """{float output: the reference compared with ``outs``, the same model's outputs
        under a one-ulp change} (rounding_noise, requantize_noise)."""
        return {name: compare(name, r, o)
                for name, r, o in zip(self.output_names, self.reference, outs)
                if np.issubdtype(np.asarray(r).dtype, np.floating) and np.shape(r) == np.shape(o)}

    def requantize_noise(self) -> dict[str, OutputMetrics]:
        """{output: the original's outputs compared with themselves when the input of every
        QuantizeLinear computed at run time moves by one ulp (a direction per node,
        seeded)}: how far a Q/DQ model's own requantization moves it, which a pass that
        changes only float rounding before a quantizer moves it by too. Empty when the
        model has no such node or the moved copy does not run. Run once, when needed."""
        if self._requant is None:
            self._requant = {}
            moved = _moved_quantizer_inputs(self._source[0])
            if moved is None:
                return self._requant
            try:
                sess = _session(moved, self._source[1])
                outs = stack_runs([ort.run(sess, f) for f in self.feed_sets], self.feed_sets)
            except Exception:  # noqa: BLE001 - e.g. float16 quantizer inputs: no allowance
                return self._requant
            self._requant = self._float_moves(outs)
        return self._requant

    def judge_output(self, name: str, ref, out, classes: bool, numerics: Numerics,
                     depth: int = 1, units: bool = True) -> OutputMetrics:
        """One output against its reference, by the rule every backend's run is judged by
        (onnxruntime's here, MIGraphX's in rewriter.migraphx.target). ``units``: False for a
        tensor that is not a model output (what a selection reads), which a ``max_abs`` in
        the outputs' units does not apply to."""
        real = self.real.get(name)
        if real is not None:    # the first samples (MIGraphX's one run) or another reference
            n = np.shape(ref)[0]
            real = real[:n] if real[:n].size * np.shape(ref)[-1] == np.size(ref) else None
        m = compare(name, ref, out, classes=classes, real=real)
        # An integer output a mapping max_abs names is held to it, not to equal values
        several = np.asarray(ref).ndim >= 1 and np.asarray(ref).shape[0] > 1
        int_tol = (abs_tolerance(self.lossy, name, False, integer=True)
                   if numerics is Numerics.LOSSY and m.shape_ok and m.integer and units
                   else None)
        # An output tiny everywhere (a detector's map with nothing to detect, 1e-7) is not
        # certified: float16 keeps few digits there, so cosine says nothing; metrics.judge
        # takes its absolute error, as in FP32, and the api says the check is weak.
        if several and (int_tol is not None or (
                numerics is Numerics.LOSSY and m.shape_ok and not m.integer
                and m.ref_max >= TINY_OUTPUT)):
            # Several samples: judged by the conservative ends of 95% intervals.
            j = (self.certify(name, ref, out, classes=classes, real=real, units=units)
                 if int_tol is None else judge_units(name, ref, out, int_tol, self.min_within()))
            # Too few samples to certify the budget at all (whether the flip-risk
            # model meets it or not, as long as it is not shown missed): the output is
            # kept with a warning (the caller's), unless strict.
            # A plan --plan auto certified on all the calibration samples (k-fold) that the
            # held-out third of them, a third as many, cannot certify but does not show
            # missed either is kept, as an undecided one is: the larger judgement decides.
            planned = self.plan_certificate is not None and not j.met and not j.refuted
            if planned and not self.strict:
                j.planned_n = int(self.plan_certificate.get("n") or 0) or None
            lenient = m.ok and (j.met or j.undecided or planned)
            m.ok = m.ok and ((j.met and (j.certifiable or not self.strict))
                             or ((j.undecided or planned) and not self.strict))
            m.strict_refused = "uncertified" if lenient and not m.ok else ""
            m.certificate = j.to_dict()
        elif int_tol is not None:   # one sample: its every value within
            m.ok = m.ok and float(np.max(sample_abs_errors(ref, out))) <= int_tol
        else:
            lossy = self.lossy if units else dict(self.lossy or {}, max_abs=None)
            m.ok = m.ok and judge(m, numerics, depth, lossy, self.model_eps)
        split = self.splits.get(name)
        if numerics is Numerics.LOSSY and m.shape_ok and not m.integer and split is not None:
            groups = scale_groups(ref, out, split)
            if groups is not None:
                m.groups = [self._component(ref, out, *g) for g in groups]
                # The output's cosine is its largest component's: a smaller one below the
                # budget is said (api) and refused with --strict.
                if self.strict and not all(g["ok"] for g in m.groups):
                    if m.ok:
                        m.strict_refused = "component"
                    m.ok = False
        return m

    def _component(self, ref, out, axis: int, index: list, cos: float) -> dict:
        """One scale group of a lossy output, judged as a whole output would be: by its
        cosine, or, where the original's values are all below TINY_OUTPUT (a dead unit's
        ~1e-11 beside offsets of 0.4: SSR-Net's, 23rd round), by absolute error."""
        from rewriter.verify.metrics import tiny_agrees
        r = np.take(ref, index, axis=axis).astype(np.float64)
        o = np.take(out, index, axis=axis).astype(np.float64)
        tiny = tiny_agrees(r, o, self.min_cosine())
        g = {"axis": axis, "index": index, "cosine": cos,
             "ok": cos >= self.min_cosine() if tiny is None else tiny}
        if tiny is not None:
            g["max_abs"] = float(np.max(np.abs(o - r)))
        return g

    def min_within(self) -> float:
        return float((self.lossy or {}).get("min_within") or 0.99)

    def min_cosine(self) -> float:
        from rewriter.verify.metrics import LOSSY_DEFAULT
        v = (self.lossy or {}).get("min_cosine")
        return float(LOSSY_DEFAULT["min_cosine"] if v is None else v)

    def certify(self, name: str, ref, out, classes: bool | None = None, real=None,
                units: bool = True):
        """verify.certify's judgement of one output against the plan's budget (labels, when
        the samples have them, for the output they judge: certify.label_output)."""
        from rewriter.verify.certify import judge_abs, judge_lossy, resolve_budget
        from rewriter.verify.metrics import LOSSY_DEFAULT, abs_tolerance

        labels = self.labels if name == self.label_output else None
        full = resolve_budget(dict(LOSSY_DEFAULT, **(self.lossy or {})), labels is not None)
        budget = {k: full[k] for k in ("min_top1", "min_cosine", "max_accuracy_drop")
                  if k in full and full[k] is not None}
        j = judge_lossy(name, ref, out, budget, labels=labels, classes=classes, real=real)
        tol = abs_tolerance(full, name, j.classes) if units else None
        return j if tol is None else judge_abs(j, name, ref, out, tol,
                                               self.min_within(), real=real)


MATCH_ROWS = 2048   # rows a sample at most for match_rows (its distances n x n float64)


def match_rows(ref: np.ndarray, out: np.ndarray) -> np.ndarray | None:
    """``out`` (joined one sample per row of axis 0, as ``ref``) with each sample's rows put
    in the order of the reference rows they match; None where a sample has one row, more
    than MATCH_ROWS, or the shapes differ. A sample's rows run along its first axis longer
    than 1 (a detector's [N, 4] boxes: N rows of 4 coordinates; [N, 1, h, w] masks: N of
    h * w), each kept whole, so only the rows' order can change: a value moved within its
    row (x1 <-> y1) still compares with the row it left. A row of one value (scores,
    labels) is matched by sorting; longer rows by mutual nearest neighbours, repeated (the
    closest remaining pair is always mutual; after 64 rounds each remaining row takes its
    nearest), on 16 seeded projections of rows longer than 16. Which pairing is taken
    decides nothing by itself: the caller judges the pairs, so a poor one can only fail."""
    if ref.shape != out.shape or ref.ndim < 2 or ref.dtype.kind not in "biuf":
        return None
    axis = next((k for k, d in enumerate(ref.shape[1:]) if d > 1), None)
    if axis is None or ref.shape[axis + 1] > MATCH_ROWS:
        return None
    n = ref.shape[axis + 1]
    a_all, b_all = ref.reshape(len(ref), n, -1), out.reshape(len(out), n, -1)
    width = a_all.shape[2]
    proj = (np.random.default_rng(0).standard_normal((width, 16)) if width > 16 else None)
    matched = np.empty_like(b_all)
    for s in range(len(a_all)):     # a sample at a time: a mask output is large
        a, b = (np.nan_to_num(x[s].astype(np.float64), posinf=1e300, neginf=-1e300)
                for x in (a_all, b_all))
        if width == 1:
            order = np.empty(n, np.int64)
            order[np.argsort(a[:, 0], kind="stable")] = np.argsort(b[:, 0], kind="stable")
            matched[s] = b_all[s][order]
            continue
        if proj is not None:
            a, b = a @ proj, b @ proj
        dist = np.zeros((n, n))
        for c in range(a.shape[1]):
            dist += (a[:, c, None] - b[None, :, c]) ** 2
        order = np.empty(n, np.int64)
        left_a, left_b = np.arange(n), np.arange(n)
        for _ in range(64):     # a handful of rounds, unless distances form long chains
            if not left_a.size:
                break
            sub = dist[np.ix_(left_a, left_b)]
            near_b = sub.argmin(1)
            mutual = sub.argmin(0)[near_b] == np.arange(left_a.size)
            order[left_a[mutual]] = left_b[near_b[mutual]]
            left_a = left_a[~mutual]
            left_b = np.delete(left_b, near_b[mutual])
        for i in left_a:        # then each remaining row its nearest remaining one
            k = int(dist[i, left_b].argmin())
            order[i], left_b = left_b[k], np.delete(left_b, k)
        matched[s] = b_all[s][order]
    return matched.reshape(out.shape)


def reference_traits(runs: list[list[np.ndarray]], feed_sets: list[dict],
                     model: onnx.ModelProto, quantities=(), classes=None
                     ) -> tuple[list[np.ndarray], list[bool], list]:
    """The reference outputs joined one sample per row (:func:`feeds.join_runs`), which of
    them have classes (:func:`metrics.class_outputs`, the model's linear heads seen; never
    one of ``quantities``, the outputs a ``max_abs`` mapping names: a tolerance in units
    says they are not class scores), for those without, their components of different
    scale (:func:`metrics.scale_split`), and for those padded to the longest run, their
    real positions (:func:`metrics.real_positions`): found once, on the reference, by the
    verifier and the planner alike (``classes``: as decided on more samples, kept)."""
    joined, batched, ragged = join_runs(runs, feed_sets)
    if classes is None:
        classes = class_outputs(joined, head_features(model), batched, ragged)
    classes = [c and o.name not in quantities for c, o in zip(classes, model.graph.output)]
    return (joined, classes, [None if c else scale_split(r) for r, c in zip(joined, classes)],
            [real_positions(g) if c else None for g, c in zip(ragged, classes)])


# Feed sets each pass's check runs on (Verifier.quick); the final model meets all of them.
QUICK_FEEDS = 16


# A check that fails FP32 tolerances passes when its max_rel is within this many times the
# original's own response to 1-ulp input changes (sqrt(depth) more after several passes),
# and its cosine meets the numerics' floor (or 1 - cosine is within as many times the
# original's own, where that misses the floor: EfficientNet-V2-S on random inputs): a
# rewrite's re-rounding moves every layer a little, more than one ulp at the input does
# (SLANet: 4.4e-4 against 1.2e-4).
NOISE_FACTOR = 8.0


def _noise_may_explain(m: OutputMetrics) -> bool:
    """A failed float output whose miss rounding could explain: not tiny (those are judged
    by absolute error)."""
    return not m.ok and m.shape_ok and not m.integer and m.ref_max >= TINY_OUTPUT


def _requant_may_explain(m: OutputMetrics) -> bool:
    """A failed float output that a Q/DQ model's own requantization could explain."""
    return not m.ok and m.shape_ok and not m.integer and np.isfinite(m.max_rel)


def _moved_quantizer_inputs(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of ``model`` whose top-level QuantizeLinear nodes reading a computed tensor
    read it times the float32 next to 1 above or below (seeded per node); None without
    such nodes."""
    consts = {t.name for t in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    if not any(n.op_type == "QuantizeLinear" and n.input[0] and n.input[0] not in consts
               for n in model.graph.node):
        return None
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    taken = consts | {n.name for n in model.graph.node} | {
        x for n in model.graph.node for x in (*n.input, *n.output)}

    def fresh(base: str) -> str:
        k = 0
        while f"{base}_ulp{k}" in taken:
            k += 1
        taken.add(f"{base}_ulp{k}")
        return f"{base}_ulp{k}"

    factors = [fresh(w) for w in ("up", "down")]
    moved.graph.initializer.extend(
        onnx.numpy_helper.from_array(np.nextafter(np.float32(1), np.float32(w)), name)
        for name, w in zip(factors, (2, 0)))
    rng = np.random.default_rng(0)
    nodes = []
    for n in moved.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] and n.input[0] not in consts:
            x, y = n.input[0], fresh(n.input[0])
            nodes.append(onnx.helper.make_node("Mul", [x, factors[int(rng.random() < 0.5)]],
                                               [y], name=y))
            n.input[0] = y
        nodes.append(n)
    del moved.graph.node[:]
    moved.graph.node.extend(nodes)
    return moved


class ModelLoadError(RuntimeError):
    """The rewritten model does not load, or does not run on the inputs the original ran
    on, in the verification backend."""


def _line(e: BaseException) -> str:
    """The first line of an error, onnxruntime's wrapper ("[ONNXRuntimeError] : 2 :
    INVALID_ARGUMENT : Non-zero status code returned while running Gather node. Name:'g'
    Status Message: ...", 130 characters before the why) said as "Gather node 'g': ..."."""
    s = str(e).strip().splitlines()
    s = s[0] if s else type(e).__name__
    m = re.match(r"\[ONNXRuntimeError\] : \d+ : \w+ : Non-zero status code returned while "
                 r"running (\S+) node\. Name:'([^']*)' Status Message: (.*)", s)
    if m:
        s = f"{m[1]} node{f' {m[2]!r}' if m[2] else ''}: {m[3]}"
    return s[:300]


def _short_miss(m: OutputMetrics) -> str:
    return (f"{1 - m.mismatch:.2%} of its integer values equal" if m.integer
            else f"max_rel {m.max_rel:.1e}, cosine {m.cosine:.6f}")


def _add_outputs(model: onnx.ModelProto, names: list[str]) -> None:
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in have)


def _run_with_outputs(model: onnx.ModelProto, base_dir, initializers, names: list[str],
                      feed_sets: list[dict]) -> list:
    """Tensors ``names`` of ``model`` (made outputs of a copy) on every feed set: one array
    per name, one sample per row (feeds.stack_runs)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    _add_outputs(m, names)
    sess = _session(m, base_dir, initializers=initializers)
    return stack_runs([ort.run(sess, f, names) for f in feed_sets], feed_sets)


# The inputs of each that carry the signal (DFT's input; STFT's signal and window).
_SPECTRAL = {"DFT": (0,), "STFT": (0, 2)}


def _session(model: onnx.ModelProto, base_dir, initializers=None):
    """An onnxruntime session for verification: every model the verifier runs, the
    original's and each candidate's, with its exact kernels (:func:`exact_kernels`)."""
    return ort.session(exact_kernels(model), base_dir, initializers=initializers)


def approximate_nbits(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """MatMulNBits nodes whose accuracy_level lets onnxruntime compute in less than the
    input's precision (4: the CPU kernel quantizes the activations to int8)."""
    return [n for g in graph_protos(model.graph) for n in g.node
            if n.op_type == "MatMulNBits" and n.domain == "com.microsoft"
            and any(a.name == "accuracy_level" and a.i > 1 for a in n.attribute)]


def exact_kernels(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` as the verifier runs it (a copy; ``model`` itself when nothing changes):
    DFT/STFT in float64 (:func:`spectral_in_double`), and MatMulNBits at accuracy_level 0,
    the dequantized weights' product in the input's type. The genai builder writes level 4
    for the CPU, where onnxruntime quantizes the activations to int8: ~1e-2 relative off
    the exact product, which MIGraphX computes (every int4 model failed its comparison,
    max_rel 6e-3 to 9e-3 on 2.16). accuracy_level is a speed hint, not the op's meaning.
    Random ops without a seed get one (:func:`seeded_random`)."""
    model = seeded_random(spectral_in_double(model))
    if not approximate_nbits(model):
        return model
    if not has_spectral(model) and not unseeded_random(model):   # copied already otherwise
        out = onnx.ModelProto()
        out.CopyFrom(model)
        model = out
    for n in approximate_nbits(model):
        next(a for a in n.attribute if a.name == "accuracy_level").i = 0
    return model


RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
              "Multinomial", "Bernoulli")


def unseeded_random(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The random ops that draw anew in every session (no ``seed`` attribute)."""
    return [n for g in graph_protos(model.graph) for n in g.node if _unseeded(n)]


def _random(n: onnx.NodeProto) -> bool:
    return n.op_type in RANDOM_OPS and n.domain in ("", "ai.onnx")


def _unseeded(n: onnx.NodeProto) -> bool:
    return _random(n) and not any(a.name == "seed" for a in n.attribute)


def random_outputs(model: onnx.ModelProto) -> dict[str, str]:
    """{graph output: the random ops it is computed from ('RandomNormalLike')}: a backend
    with its own generator (MIGraphX) draws other values than onnxruntime, seeded or not,
    so these outputs cannot be compared across backends. A node whose bodies hold such an
    op counts as one."""
    tainted: dict[str, set] = {}
    for n in model.graph.node:
        src = {n.op_type} if _random(n) else set()
        for g in node_bodies(n):
            src |= {b.op_type for sub in graph_protos(g) for b in sub.node if _random(b)}
        src = src.union(*(tainted.get(i, ()) for i in n.input))
        if src:
            tainted.update((o, src) for o in n.output if o)
    return {o.name: "/".join(sorted(tainted[o.name])) for o in model.graph.output
            if o.name in tainted}


def seeded_random(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with a seed on every random op that has none (a copy; ``model`` itself
    when it has none), for verification only. Unseeded, VITS's noise differs on every run
    of the original itself (its waveform's length too), so any rewrite failed --verify,
    named as the first pass that changed the graph. The seed comes from the node's name
    (its first output's where it has none), which the passes keep: the reference and
    every candidate draw the same values, in a fresh session each, run on the same inputs
    in the same order (onnxruntime seeds each kernel once, when the session is made).
    What is verified is the rewrite given the same draws."""
    if not unseeded_random(model):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in unseeded_random(out):
        key = (n.name or n.output[0]).encode()
        n.attribute.append(onnx.helper.make_attribute("seed", float(zlib.crc32(key) % (1 << 24))))
    return out


def has_spectral(model: onnx.ModelProto) -> bool:
    return any(n.op_type in _SPECTRAL and n.domain in ("", "ai.onnx")
               for g in graph_protos(model.graph) for n in g.node)


def spectral_in_double(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every DFT and STFT computed in float64 (a copy; ``model`` itself when
    it has none), for verification only. onnxruntime's float32 DFT is off by up to 4e-4
    (max_rel) from the exact transform at lengths that are not a power of two (Whisper's
    400-point STFT: 5e-4 from float64), more than the FP32 tolerance, so a rewrite
    closer to the exact transform (expand-spectral) failed --verify against it. The
    reference and every candidate run their remaining DFT/STFT in float64 alike, then
    cast back (CastLike) to the type the node computed in: what is compared is the
    rewrite, not onnxruntime's float32 kernel."""
    if not has_spectral(model):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    k = 0
    for g in graph_protos(out.graph):
        nodes = []
        for n in g.node:
            if n.op_type not in _SPECTRAL or n.domain not in ("", "ai.onnx"):
                nodes.append(n)
                continue
            like = n.input[0]
            for i in _SPECTRAL[n.op_type]:
                if i < len(n.input) and n.input[i]:
                    k += 1
                    wide = f"{n.input[i]}__rewrite_f64_{k}"
                    nodes.append(onnx.helper.make_node("Cast", [n.input[i]], [wide],
                                                       to=onnx.TensorProto.DOUBLE))
                    n.input[i] = wide
            nodes.append(n)
            k += 1
            wide = f"{n.output[0]}__rewrite_f64_{k}"
            nodes.append(onnx.helper.make_node("CastLike", [wide, like], [n.output[0]]))
            n.output[0] = wide
        del g.node[:]
        g.node.extend(nodes)
    return out


def layer_divergence(ref_exp, new_exp, names: list[str], feed_sets: list[dict],
                     min_cosine: float, labels: dict[str, str] | None = None,
                     chunk: int = 32) -> str | None:
    """First of ``names`` (in order) whose values in ``new_exp`` fall below ``min_cosine``
    against ``ref_exp``; compared ``chunk`` tensors at a time. Both models run one feed set
    at a time and each tensor's cosine is summed as they go (metrics.CosineSums): what is
    held is one feed set's values of ``chunk`` tensors in each model, however many feed
    sets (keeping every feed set's values in float64, both models, took U2-Net-p's failed
    plan to 3.4 GB at 8 feed sets of 320x320, 2.4 GB at 5). The two sessions are open
    together, so both models' weights are loaded at once (they were one after the other).
    Returns the layer label and its cosine, or None."""
    def session(exp, chunk_names):
        m = onnx.ModelProto()
        m.CopyFrom(exp.model)
        have = {o.name for o in m.graph.output}
        produced = {o for n in m.graph.node for o in n.output}
        for n in chunk_names:
            if n not in have and n in produced:
                m.graph.output.append(onnx.ValueInfoProto(name=n))
        outs = {o.name for o in m.graph.output}
        return _session(m, exp.source_dir, initializers=exp.ort_initializers()), outs

    for i in range(0, len(names), chunk):
        part = names[i:i + chunk]
        (ref, ref_outs), (new, new_outs) = session(ref_exp, part), session(new_exp, part)
        want = [n for n in part if n in ref_outs and n in new_outs]
        sums = {n: CosineSums() for n in want}
        for f in feed_sets:
            for n, a, b in zip(want, ort.run(ref, f, want), ort.run(new, f, want)):
                if n in sums and np.shape(a) == np.shape(b):
                    sums[n].add(a, b)
                else:
                    sums.pop(n, None)
            a = b = None
        del ref, new
        for n in want:
            if n in sums and sums[n].value() < min_cosine:
                return f"{(labels or {}).get(n, n)} (cosine {sums[n].value():.5f})"
    return None
