"""The `rewrite` command line.

    rewrite MODEL -o OUT [--passes a,b] [--verify] [--inputs F.npz|DIR] [--input-shape n:1x3x8x8]
                         [--report R.json] [--target migraphx|none] [-q] [-v]
    rewrite check MODEL [--target migraphx] [--input-shape ...] [--json]
    rewrite advise PROFILE [--model M] [--json]
    rewrite --list-passes

Exit codes: 0 ok; 1 verification failed (onnxruntime: nothing written; the MIGraphX step:
after the output is written); 2 usage or bad input; 3 internal error in a pass; 130
interrupted; 141 stdout closed.
Errors are one line on stderr; ``-v`` adds the traceback.
"""

from __future__ import annotations

import argparse
import sys
import traceback
import warnings
from pathlib import Path

from rewriter.quant import METHODS

EXIT_OK, EXIT_VERIFY, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
SUBCOMMANDS = ("check", "plan", "advise")


class _Formatter(argparse.HelpFormatter):
    """Help lines wrapped at spaces only: textwrap's default broke '--max-accuracy-drop'
    after '--max-' (a flag name split over two lines)."""

    def _split_lines(self, text, width):
        import textwrap
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", _Formatter)
        # No abbreviated options: `rewrite plan ... --target none` was read as
        # --target-speedup ("invalid float value: 'none'"); a full name or an error.
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    # argparse exits 2 on usage errors already; keep its message, on one line (its usage
    # block came first: 17 lines for a mistyped --seed).
    def error(self, message):
        raise SystemExit(f"rewrite: error: {message} (see '{self.prog} -h')")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="rewrite", description=(
        "Rewrite an ONNX model for AMD MIGraphX: fold constants, fuse Conv+BN(+activation), "
        "and check the result against the original in onnxruntime. "
        f"Subcommands: {', '.join(SUBCOMMANDS)} (see 'rewrite SUBCOMMAND -h')."))
    p.add_argument("model", nargs="?", help="input .onnx file (never modified)")
    p.add_argument("-o", "--output", help="output .onnx file (written atomically)")
    p.add_argument("--report", metavar="FILE", help="write the report as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")

    g = p.add_argument_group("pipeline")
    g.add_argument("--passes", help="comma-separated pass names, run in this order; "
                   "'default' stands for the default pipeline, e.g. default,pad-channels "
                   "(default: the default pipeline, --list-passes marks it)")
    g.add_argument("--list-passes", action="store_true", help="list the passes and exit")
    g.add_argument("--fold-size-limit", type=int, metavar="BYTES", default=1 << 20,
                   help="fold-constants leaves results larger than this (and more than 2x "
                        "their inputs) as nodes unless they are weights (default 1 MiB)")

    g = p.add_argument_group("verification")
    g.add_argument("--verify", action="store_true",
                   help="compare outputs with the original in onnxruntime after every pass "
                        "that changed the graph; exit 1 if a tolerance is exceeded")
    g.add_argument("--inputs", metavar="FILE|DIR", help="inputs for --verify (implies it): "
                   ".npz (keys = input names) or .npy (single-input models), or a folder of "
                   "them, one sample each; default: seeded random inputs")
    g.add_argument("--input-shape", action="append", metavar="NAME:DIMS",
                   help="shape for an input with symbolic dims, e.g. input:1x3x224x224 "
                        "(repeatable, or comma-separated: a:1x16,b:1x16; random inputs put "
                        "the size a weight fixes, else 1 in a symbolic batch, 8 in other "
                        "symbolic dims; its H and W size --calib images where the input's "
                        "are symbolic)")
    g.add_argument("--set-input", action="append", metavar="NAME=VALUE",
                   help="make an input a constant of this value (a number, true or false, "
                        "filling its dims) and drop it from the output's inputs, e.g. "
                        "use_cache_branch=true: a merged decoder's If then folds to one "
                        "branch; samples in --inputs or --calib that carry it must hold "
                        "this value (repeatable)")
    g.add_argument("--fix-shapes", action="store_true",
                   help="write the --input-shape dims into the output model's inputs and "
                        "fold the shape arithmetic that becomes static (MIGraphX turns "
                        "symbolic dims into 1 silently; this makes it explicit)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")

    g = p.add_argument_group("pad-channels")
    g.add_argument("--pad-multiple", type=int, choices=(4, 8, 16, 32),
                   metavar="N", help="channel multiple, 4 (default), 8, 16 or 32")
    g.add_argument("--pad-sides", choices=("in", "out", "both"),
                   help="pad conv inputs, outputs or both (default both)")
    g.add_argument("--pad-max-overhead", type=float, metavar="SHARE",
                   help="skip a conv whose FLOPs or weight bytes would grow by more than this "
                        "share (default 0.5 = +50%%)")

    g = p.add_argument_group("plan and calibration")
    g.add_argument("--plan", metavar="PLAN",
                   help="mixed-precision plan: a YAML/JSON file, or built-in 'default' (first "
                        "and last conv + classifier FP16, the rest INT8), 'int8', 'fp16', or "
                        "'auto' (the planner chooses, see 'rewrite plan -h')")
    g.add_argument("--calib", metavar="DIR",
                   help="calibration data for the plan's INT8 layers: .npy, .npz or images")
    g.add_argument("--preprocess", metavar="FILE", help=PREPROCESS_HELP)
    _planner_args(p)

    g = p.add_argument_group("MIGraphX")
    g.add_argument("--target", choices=("migraphx", "none"), default="migraphx",
                   help="check the output against MIGraphX and, where it is installed, "
                        "compile and compare (default migraphx)")
    g.add_argument("--backend", choices=("migraphx", "ort-migraphx"), default="migraphx",
                   help="compile through MIGraphX's Python API (default) or ONNX Runtime's "
                        "MIGraphX execution provider")
    g.add_argument("--migraphx-target", choices=("auto", "gpu", "ref"), default="auto",
                   help="MIGraphX target to compile for: auto (default: gpu when the install "
                        "has it, else no compilation), gpu, or ref (its slow CPU reference)")
    g.add_argument("--migraphx-version", metavar="X.Y",
                   help="target MIGraphX version for the plan's INT8 weight form and the "
                        "static check (default: the installed one, else the rules of every "
                        "version run)")
    g.add_argument("--migraphx-samples", type=int, default=8, metavar="N",
                   help="plan models are judged on MIGraphX on up to N samples (N >= 1; "
                        "a plan model on at least 2) (default 8)")
    g.add_argument("--save-mxr", metavar="FILE", help="save the compiled MIGraphX program")
    g.add_argument("--require-backend", action="store_true",
                   help="fail (exit 2) when the backend is not installed, instead of "
                        "skipping compilation with a note")
    return p


def main(argv: list[str] | None = None, *, freeze_graph: bool = False) -> int:
    """The CLI. ``freeze_graph`` (the console script's): this process does one FP32
    rewrite, so its imported graph is frozen out of the cycle collector's scans
    (core.gs_io.freeze_next_import), and its threads share one malloc arena (the exit
    gate's onnxruntime load reuses what the main thread freed). Not with --plan: the
    planner's graph is imported first and would stay frozen, unfreed, through the rewrite
    that follows."""
    from rewriter.core.errors import CALLER

    token = CALLER.set("cli")   # messages in the CLI's flags, not the API's names
    try:
        return _main(list(sys.argv[1:] if argv is None else argv), freeze_graph)
    finally:
        CALLER.reset(token)


def _main(argv: list[str], freeze_graph: bool) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        try:
            return _subcommand(argv[0], argv[1:])
        except KeyboardInterrupt:   # as the main command: one line, 130
            print("rewrite: interrupted", file=sys.stderr)
            return 130
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return EXIT_INPUT
        return EXIT_OK if e.code in (0, None) else EXIT_INPUT
    if freeze_graph and not args.plan:
        from rewriter.core.gs_io import freeze_next_import, single_malloc_arena

        freeze_next_import()
        single_malloc_arena()
    try:
        with warnings.catch_warnings():
            if not args.verbose:
                # numpy's RuntimeWarnings (overflow while folding a hostile model) and
                # libraries' DeprecationWarnings would break "one line on stderr".
                warnings.simplefilter("ignore")
            return _run(args)
    except KeyboardInterrupt:
        print("rewrite: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every failure becomes one line + exit code
        return _fail(e, args.verbose)


# A closed stdout (`| head`): 128 + SIGPIPE, as a process the signal ended, and no message.
EXIT_PIPE = 141


def _fail(e: BaseException, verbose: bool) -> int:
    from rewriter.core.errors import RewriteError

    if isinstance(e, BrokenPipeError):
        return EXIT_PIPE

    if verbose:
        traceback.print_exc()
    code = e.exit_code if isinstance(e, RewriteError) else EXIT_INTERNAL
    if isinstance(e, MemoryError):
        msg, code = "out of memory", EXIT_INTERNAL
    else:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if not isinstance(e, RewriteError):
        msg = f"internal error: {type(e).__name__}: {msg} (run with -v for the traceback)"
    print(f"rewrite: error: {msg}", file=sys.stderr)
    return code


def _run(args) -> int:
    from rewriter.core import registry
    from rewriter.core.errors import InputError, VerificationError

    if args.list_passes:
        default = registry.default_pipeline("migraphx")
        rows = sorted(registry.describe(), key=lambda r: default.index(r[0])
                      if r[0] in default else len(default))   # the pipeline's order first
        width = max(len(name) for name, _ in rows)
        for name, summary in rows:
            print(f"{'*' if name in default else ' '} {name:<{width}}  {summary}")
        print("* the default pipeline ('default' in --passes), in this order; "
              f"{', '.join(sorted(registry.MIGRAPHX_ONLY))} only with --target migraphx")
        return EXIT_OK
    if not args.model:
        raise InputError("no input model given (usage: rewrite MODEL -o OUT)")
    if not args.output:
        raise InputError("no output given: add -o OUT.onnx")
    if args.calib and not args.plan:
        raise InputError("--calib is for a plan's INT8 layers: add --plan (default, auto, "
                         "int8 or a file)")
    _planner_flags_need_the_planner(args)
    if args.preprocess and not args.calib:
        raise InputError("--preprocess says how --calib images become inputs: add --calib DIR")
    compile_flags = [f for f, given in (
        ("--save-mxr", args.save_mxr), ("--require-backend", args.require_backend),
        # given away from their defaults: --target none --migraphx-target ref did nothing
        (f"--migraphx-target {args.migraphx_target}", args.migraphx_target != "auto"),
        (f"--backend {args.backend}", args.backend != "migraphx"),
        ("--migraphx-samples", args.migraphx_samples != 8)) if given]
    if args.target == "none" and compile_flags:
        raise InputError(f"{compile_flags[0]} is for MIGraphX's compile: drop --target none")
    from rewriter.core.save import check_distinct, check_output_path
    check_distinct(args.model, [("-o", args.output), ("--report", args.report),
                                ("--save-mxr", args.save_mxr)])
    check_output_path(args.output)   # now, not after the passes (a 2.5 GB model: 5 s)
    if args.report:   # now, not after the run (then only a warning)
        check_output_path(args.report, "--report")
    from rewriter.api import rewrite
    from rewriter.verify import load_inputs, parse_shape_args, parse_value_args

    shapes = parse_shape_args(args.input_shape)
    target = None if args.target == "none" else args.target
    passes = registry.resolve(args.passes, target) if args.passes is not None else None
    pad = {k: v for k, v in (("pad_multiple", args.pad_multiple), ("pad_sides", args.pad_sides),
                             ("pad_max_overhead", args.pad_max_overhead)) if v is not None}
    inputs = None
    if args.inputs:
        from rewriter.core.load import load_model
        inputs = load_inputs(args.inputs, load_model(args.model, check=False), folder=True)
    from rewriter.migraphx.lowering import parse_version
    version = parse_version(args.migraphx_version)
    if args.migraphx_version and version is None:
        raise InputError(f"--migraphx-version '{args.migraphx_version}': expected X.Y, e.g. 2.16")
    mgx = None
    if args.target == "migraphx":
        mgx = {"device": args.migraphx_target, "backend": args.backend,
               "save_mxr": args.save_mxr, "require": args.require_backend,
               "samples": args.migraphx_samples}
    try:
        model, report = rewrite(
            args.model, passes, output=args.output, verify=args.verify or bool(args.inputs),
            input_shapes=shapes, inputs=inputs, seed=args.seed, fix_shapes=args.fix_shapes,
            set_inputs=parse_value_args(args.set_input),
            options={"fold_size_limit": args.fold_size_limit,
                     "planner": _planner_settings(args),
                     **pad,
                     "migraphx_version": version},
            materialize=False, plan=args.plan, calib=args.calib,
            progress=not args.quiet and sys.stderr.isatty(),
            target=target, migraphx=mgx)
    except VerificationError as e:
        report = getattr(e, "report", None)
        if report is not None:
            _emit(report, args)
        print(f"rewrite: error: {e} (output not written)", file=sys.stderr)
        return EXIT_VERIFY
    _emit(report, args)
    info = report.extra.get("compile")
    if info is None:
        return EXIT_OK
    if not args.quiet:
        from rewriter.migraphx.target import render
        print(render(info))
    if not info.get("ok", True):
        why = info.get("error") or (info.get("lowering") or {}).get("error") or (
            "MIGraphX's outputs are outside the " + info.get("judged_by", "tolerance"))
        print(f"rewrite: error: {why}", file=sys.stderr)
        # Refused, or computed as far off, for the original too: the model, its dims or
        # MIGraphX are at fault, not the rewrite.
        return EXIT_INPUT if info.get("original_refused") or info.get("original_differs") \
            else EXIT_VERIFY
    return EXIT_OK


# The planner's own settings (None/False: not given); --method, --percentile, --weights,
# --samples and --strict apply to every plan.
PLANNER_ONLY = ("min_top1", "min_cosine", "alpha", "beta", "int8_speed", "fp16_speed",
                "target_speedup", "max_accuracy_drop", "folds", "selection_correction",
                "max_abs", "min_within")


def _planner_flags_need_the_planner(args) -> None:
    """A planner flag without the planner was silently ignored: `--plan default --verify
    --min-top1 0.95` judged by the plan's own 0.99, and `--min-cosine` with no plan did
    nothing at all."""
    from rewriter.core.errors import InputError

    # `is`, not `in (None, False)`: 0 == False, and --min-top1 0 passed as not given
    flags = [f"--{k.replace('_', '-')}" for k in PLANNER_ONLY
             if getattr(args, k) is not None and getattr(args, k) is not False]
    if args.plan != "auto" and flags:
        raise InputError(f"{flags[0]} is a setting of the planner (--plan auto, rewrite plan); "
                         + ("a fixed plan's budget is its verify: section (docs/plans.md)"
                            if args.plan else "add --plan auto --calib DIR"))
    given = [f for f in ("method", "percentile", "weights", "samples")
             if getattr(args, f) is not None]
    if given and not args.plan:
        raise InputError(f"--{given[0]} is for a plan's INT8 layers: add --plan (default, "
                         "auto, int8 or a file)")


def _emit(report, args) -> None:
    if args.report:
        try:
            _atomic_write(Path(args.report), report.to_json())
        except OSError as e:
            print(f"rewrite: warning: cannot write report {args.report}: {e.strerror}",
                  file=sys.stderr)
    if not args.quiet:
        print(report.render())


def _subcommand(name: str, argv: list[str]) -> int:
    if name == "advise":
        from rewriter.advise import main as advise_main
        return advise_main(argv)
    if name == "check":
        return _check_main(argv)
    if name == "plan":
        return _plan_main(argv)
    return EXIT_INPUT


def _parse(p, argv):
    """Parsed args, or the exit code when argparse ended the run (-h, usage error)."""
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        return EXIT_OK if e.code in (0, None) else EXIT_INPUT


def _planner_args(p) -> None:
    g = p.add_argument_group("planner (also used by --plan auto)")
    g.add_argument("--min-top1", type=float, default=None,
                   help="top-1 agreement with FP32 the plan must keep (default 0.99; 0 when "
                        "--max-accuracy-drop is given and the samples have labels)")
    g.add_argument("--min-cosine", type=float, default=None,
                   help="output cosine with FP32 the plan must keep (default 0.995)")
    g.add_argument("--alpha", type=float, default=None, help="weight of FP16 loss (default 0.7)")
    g.add_argument("--beta", type=float, default=None, help="weight of INT8 loss (default 0.3)")
    g.add_argument("--int8-speed", type=float, default=None,
                   help="INT8 speed relative to FP32 for the speed model (default 1.74)")
    g.add_argument("--fp16-speed", type=float, default=None,
                   help="FP16 speed relative to FP32 (default 1.5, an assumption)")
    g.add_argument("--target-speedup", type=float, default=None,
                   help="report the INT8 FLOP share this speedup needs")
    g.add_argument("--max-accuracy-drop", type=float, default=None, metavar="POINTS",
                   help="with labels beside the calibration data (labels.txt/.json/.npy): "
                        "task accuracy the plan may lose against FP32, in points")
    g.add_argument("--max-abs", type=_max_abs_arg, default=None, metavar="X|NAME=X,...",
                   help="error in the outputs' own units (pixels, seconds) every value of a "
                        "sample must keep against FP32: one number for every output without "
                        "classes, or per output (boxes=2,landmarks=0.5)")
    g.add_argument("--min-within", type=float, default=None, metavar="SHARE",
                   help="share of inputs that must keep every value within --max-abs "
                        "(default 0.99)")
    # None = not given: the planner's defaults, or the plan file's own (which a given
    # value overrides for any --plan).
    g.add_argument("--method", choices=METHODS, default=None,
                   help="activation range method (default mse: the clip minimising the "
                        "quantisation error; overrides a plan file's)")
    g.add_argument("--percentile", type=float, default=None,
                   help="for percentile, in (50, 100] (default: the plan's, 99.999 in the "
                        "named plans; the planner's 99.99)")
    g.add_argument("--weights", choices=("per-channel", "per-tensor"), default=None,
                   help="INT8 weight scales (default per-channel; overrides a plan file's)")
    g.add_argument("--samples", type=int, default=None,
                   help="calibration samples used at most (default: the plan's, 200 in the "
                        "named plans; the planner's 256)")
    g.add_argument("--folds", type=int, default=None,
                   help="k-fold judgement: ranges from k-1 folds, judged on the k-th (4)")
    g.add_argument("--strict", action="store_true",
                   help="exit 1 when the data cannot certify the budget at 95%% confidence "
                        "(the planner's plan, and --verify of any plan)")
    g.add_argument("--selection-correction", action="store_true",
                   help="take each plan's bounds at 0.05/T for the T plans the search may "
                        "compare (Bonferroni), so the kept plan's bounds hold at 95%% after "
                        "the choice; keeps fewer layers INT8")


def _max_abs_arg(text: str):
    """--max-abs: a number, or NAME=X pairs separated by commas; a name may hold a comma
    or '=' (the value is after the last '=', a piece without one is part of the next name)."""
    if "=" not in text:
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number or NAME=X list: {text!r}") from None
    out, name = {}, ""
    for part in text.split(","):
        if not part.strip() and not name:   # 'y=1,' or ',y=1'
            continue
        if "=" not in part:    # an output named 'boxes,scores' (or an empty piece)
            name += part + ","
            continue
        head, _, value = part.rpartition("=")
        name, part = (name + head).strip(), name + part
        try:
            x = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not NAME=X: {part!r}") from None
        if not name:
            raise argparse.ArgumentTypeError(f"no output name in {part!r}")
        if name in out:    # the last silently won
            raise argparse.ArgumentTypeError(f"output {name!r} given twice")
        out[name], name = x, ""
    if name.strip(","):
        raise argparse.ArgumentTypeError(f"not NAME=X: {name.rstrip(',')!r}")
    return out


SHAPE_HELP = ("shape for an input with symbolic dims, e.g. input:1x3x224x224 (repeatable, or "
              "comma-separated: a:1x16,b:1x16)")
PREPROCESS_HELP = ("how images in --calib become inputs: a YAML/JSON file of preprocess "
                   "settings (size, scale, mean, std, channel_order, ...; or a plan whose "
                   "preprocess section is used); for any plan, auto included (default: "
                   "pixels/255, RGB)")


def _planner_settings(args) -> dict:
    from rewriter.quant.plan import load_preprocess
    pre = load_preprocess(args.preprocess) if args.preprocess else None
    if pre and args.calib:
        from rewriter.quant.data import check_preprocess_applies
        check_preprocess_applies(args.calib)
    return {"preprocess": pre, "min_top1": args.min_top1, "min_cosine": args.min_cosine,
            "alpha": args.alpha, "beta": args.beta, "int8_speed": args.int8_speed,
            "fp16_speed": args.fp16_speed, "target_speedup": args.target_speedup,
            "method": args.method, "percentile": args.percentile, "weights": args.weights,
            "samples": args.samples,
            "max_accuracy_drop": args.max_accuracy_drop, "folds": args.folds,
            "max_abs": args.max_abs, "min_within": args.min_within,
            "strict": args.strict, "selection_correction": args.selection_correction}


def plan_parser() -> argparse.ArgumentParser:
    """`rewrite plan`'s options (tests/test_docs.py checks the docs' flags against them)."""
    p = _Parser(prog="rewrite plan", description=(
        "Measure each layer's sensitivity to INT8 and FP16 on calibration data and write a "
        "mixed-precision plan that keeps the accuracy budget, with a sensitivity table and "
        "plot beside it."))
    p.add_argument("model", help="input .onnx file (never modified)")
    p.add_argument("--calib", required=True, metavar="DIR",
                   help="calibration data: .npy, .npz or images (labels.txt/.json/.npy "
                        "beside them for --max-accuracy-drop)")
    p.add_argument("--preprocess", metavar="FILE", help=PREPROCESS_HELP)
    p.add_argument("-o", "--output", required=True,
                   help="plan file to write (.yaml or .json); the sensitivity table "
                        "(.sensitivity.json) and plot (.sensitivity.png) go beside it")
    p.add_argument("--input-shape", action="append", metavar="NAME:DIMS", help=SHAPE_HELP)
    _planner_args(p)
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    return p


def _plan_main(argv: list[str]) -> int:
    args = _parse(plan_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        from pathlib import Path

        from rewriter.core.report import json_text
        from rewriter.core.save import check_distinct, check_output_path
        from rewriter.quant.planner import plan_auto, write_plot
        from rewriter.verify import parse_shape_args

        out = Path(args.output)
        stem = out.with_suffix("")
        check_output_path(out, "plan")   # now, not after minutes of measuring
        check_distinct(args.model, [("-o", str(out)),
                                    ("-o", f"{stem}.sensitivity.json"),
                                    ("-o", f"{stem}.sensitivity.png")])
        _, rep = plan_auto(args.model, args.calib, settings=_planner_settings(args),
                              input_shapes=parse_shape_args(args.input_shape),
                              progress=not args.quiet and sys.stderr.isatty())
        text = json_text(rep.plan) if out.suffix == ".json" else _yaml(rep.plan)
        _atomic_write(out, text)
        _atomic_write(Path(f"{stem}.sensitivity.json"), json_text(rep.to_dict()))
        plotted = write_plot(rep, f"{stem}.sensitivity.png")
        if not args.quiet:
            print(rep.render())
            print(f"wrote {out}, {stem}.sensitivity.json"
                  + (f", {stem}.sensitivity.png" if plotted else
                     " (no plot: pip install matplotlib)"))
        return EXIT_OK
    except Exception as e:  # noqa: BLE001
        return _fail(e, args.verbose)


def _yaml(d: dict) -> str:
    import yaml

    return ("# written by `rewrite plan`; see docs/plans.md\n"
            + yaml.safe_dump(d, sort_keys=False, default_flow_style=False))


def _atomic_write(path, text: str) -> None:
    """``text`` into ``path`` by a rename, with an ordinary file's mode (mkstemp's is
    0600); nothing is left behind if the write fails."""
    import os
    import tempfile

    from rewriter.core.save import _umask

    folder = path.parent if str(path.parent) else "."
    fd, tmp = tempfile.mkstemp(prefix=".rewrite-", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def check_parser() -> argparse.ArgumentParser:
    """`rewrite check`'s options."""
    p = _Parser(prog="rewrite check", description=(
        "Static check of a model against MIGraphX: unsupported ops, QDQ it would run in "
        "float, dynamic dims, unaligned channels. Exit 1 if errors were found."))
    p.add_argument("model", help="the .onnx file to check (its weights are not read)")
    p.add_argument("--target", choices=("migraphx",), default="migraphx",
                   help="the only target (default migraphx)")
    p.add_argument("--input-shape", action="append", metavar="NAME:DIMS",
                   help=SHAPE_HELP + ": the dims MIGraphX will be given")
    p.add_argument("--migraphx-version", metavar="X.Y",
                   help="check against this MIGraphX version's rules (default: the "
                        "installed one, else the rules of every version run)")
    p.add_argument("--details", action="store_true", help="every finding, not one line per rule")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")
    return p


def _check_main(argv: list[str]) -> int:
    args = _parse(check_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        from rewriter.core.errors import InputError
        from rewriter.core.load import load_model
        from rewriter.core.report import json_text
        from rewriter.migraphx.check import check_model
        from rewriter.migraphx.lowering import installed_version, parse_version
        from rewriter.verify import parse_shape_args

        version = parse_version(args.migraphx_version) or installed_version()
        if args.migraphx_version and parse_version(args.migraphx_version) is None:
            raise InputError(f"--migraphx-version '{args.migraphx_version}': expected X.Y")
        model = load_model(args.model)
        result = check_model(model, input_shapes=parse_shape_args(args.input_shape),
                             version=version)
        print(json_text(result.to_dict()) if args.json
              else result.render(details=args.details))
        return EXIT_VERIFY if any(f.severity == "error" for f in result.findings) else EXIT_OK
    except Exception as e:  # noqa: BLE001
        return _fail(e, args.verbose)


def entry() -> None:
    """The console script: main(), then a fast exit. A rewritten graph is millions of small
    objects in reference cycles; tearing them down at interpreter exit costs up to a second
    and changes nothing, since every file is written and closed by then. For the same
    reason the imported graph is frozen out of the cycle collector's scans (this process
    does one rewrite; main() called in-process by others does not do this)."""
    import os

    try:
        code = main(freeze_graph=True)
        sys.stdout.flush()
    except BrokenPipeError:
        code = EXIT_PIPE
    if code == EXIT_PIPE:   # the reader stopped (`rewrite check --json | head`): no more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # to tell it
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
