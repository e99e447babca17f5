"""Pass name -> pass class: one explicit list, no import side effects.

Adding a pass means adding one line to ``_PASSES``. Unknown names are an error that
suggests the closest known one; a misspelled pass is never silently ignored.
"""

from __future__ import annotations

import difflib
import importlib

from rewriter.core.errors import InputError

# (CLI name, "module:Class"). Modules are imported on first use, to keep start-up cheap.
_PASSES = [
    ("expand-contrib", "rewriter.passes.expand_contrib:ExpandContrib"),
    ("expand-ml", "rewriter.passes.expand_ml:ExpandMl"),
    ("default-attributes", "rewriter.passes.default_attributes:DefaultAttributes"),
    ("expand-functions", "rewriter.passes.expand_functions:ExpandFunctions"),
    ("expand-spectral", "rewriter.passes.expand_spectral:ExpandSpectral"),
    ("integer-zero-points", "rewriter.passes.integer_zero_points:IntegerZeroPoints"),
    ("qdq-forms", "rewriter.passes.qdq_forms:QdqForms"),
    ("weight-scales-after", "rewriter.passes.weight_scales_after:WeightScalesAfter"),
    ("fold-shapes", "rewriter.passes.fold_shapes:FoldShapes"),
    ("fold-constants", "rewriter.passes.fold_constants:FoldConstants"),
    ("crop-pads", "rewriter.passes.crop_pads:CropPads"),
    ("sink-transposes", "rewriter.passes.sink_transposes:SinkTransposes"),
    ("collapse-chains", "rewriter.passes.collapse_chains:CollapseChains"),
    ("merge-duplicates", "rewriter.passes.merge_duplicates:MergeDuplicates"),
    ("fuse-conv-bn", "rewriter.passes.fuse_conv_bn:FuseConvBn"),
    ("fuse-pad", "rewriter.passes.fuse_pad:FusePad"),
    ("fuse-space-to-depth", "rewriter.passes.fuse_space_to_depth:FuseSpaceToDepth"),
    ("fuse-matmul-add", "rewriter.passes.fuse_matmul_add:FuseMatmulAdd"),
    ("resize-inputs", "rewriter.passes.resize_inputs:ResizeInputs"),
    ("scan-states", "rewriter.passes.scan_states:ScanStates"),
    ("bound-loops", "rewriter.passes.bound_loops:BoundLoops"),
    ("pad-channels", "rewriter.passes.pad_channels:PadChannels"),
    ("equalize-channels", "rewriter.passes.equalize_channels:EqualizeChannels"),
    ("insert-qdq", "rewriter.passes.insert_qdq:InsertQdq"),
    ("correct-bias", "rewriter.passes.correct_bias:CorrectBias"),
    ("convert-fp16", "rewriter.passes.convert_fp16:ConvertFp16"),
]

# FP32, numerically exact or equal to rounding; the order matters: contrib ops first (so
# every later pass sees standard ops), shapes before constants (folded shapes feed them),
# Transposes sunk before the chains collapse (they meet their inverse there) and before
# fuse-conv-bn (the per-channel Mul/Add then sit right after the conv), fusions on the
# folded graph, CSE last (fusions make new duplicates). integer-zero-points
# makes onnxruntime's dynamic quantization compute right on MIGraphX (exact in int32);
# expand-ml writes ai.onnx.ml's Scaler, which MIGraphX does not parse, as Sub and Mul;
# default-attributes drops a Resize's keep_aspect_ratio_policy=stretch, which MIGraphX 2.15
# refuses to parse; expand-functions writes standard ops it does not parse (RMSNormalization,
# opset-23 Attention ...) as their ONNX function bodies, before fold-shapes folds their shapes;
# expand-spectral writes DFT and STFT (no body, not parsed) as a MatMul or Conv against cos/sin;
# qdq-forms writes one-block blockwise scales per axis and 0-d or odd-sized int4 as int8;
# crop-pads writes a Pad's negative pads as a Slice (MIGraphX 2.15 runs out of memory parsing
# an edge Pad that crops), after fold-constants, which may make its pads constant;
# resize-inputs reads a Resize's computed input through a Reshape (MIGraphX 2.15 computes
# one read as a strided view wrongly) and scan-states a Scan's computed initial states
# (MIGraphX refuses a state it holds as a view), last: collapse-chains drops such Reshapes;
# bound-loops writes a Loop's trip count from the counters its condition tests (MIGraphX
# sizes a loop's outputs for M, 65535 when M is 2^63 - 1), after folding made them constant.
DEFAULT_PIPELINE = ["expand-contrib", "expand-ml", "default-attributes", "expand-functions",
                    "expand-spectral", "integer-zero-points", "qdq-forms", "weight-scales-after",
                    "fold-shapes", "fold-constants", "crop-pads", "sink-transposes",
                    "collapse-chains", "fuse-conv-bn", "fuse-pad", "fuse-space-to-depth",
                    "fuse-matmul-add", "merge-duplicates", "resize-inputs", "scan-states",
                    "bound-loops"]
# Fixes for what MIGraphX gets wrong or lacks, not optimisations: in the default pipeline
# only when MIGraphX is the target.
MIGRAPHX_ONLY = {"integer-zero-points", "expand-ml", "default-attributes", "expand-functions",
                 "expand-spectral", "qdq-forms", "weight-scales-after", "crop-pads",
                 "resize-inputs", "scan-states", "bound-loops"}


def default_pipeline(target: str | None) -> list[str]:
    """The default pipeline for ``target`` ("migraphx", or anything else)."""
    return [p for p in DEFAULT_PIPELINE if target == "migraphx" or p not in MIGRAPHX_ONLY]


def names() -> list[str]:
    return [n for n, _ in _PASSES]


def get(name: str):
    """The pass class registered under ``name``; InputError with a suggestion otherwise."""
    for n, target in _PASSES:
        if n == name:
            module, cls = target.split(":")
            return getattr(importlib.import_module(module), cls)
    close = difflib.get_close_matches(name, names(), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known passes: {', '.join(names())}"
    raise InputError(f"unknown pass '{name}'{hint}")


def resolve(spec, target: str | None = None) -> list:
    """Pass instances from a list of names / classes / instances, or a comma string. The
    name "default" stands for :func:`default_pipeline` (``target``'s), e.g.
    "default,pad-channels"."""
    from rewriter.core.pass_base import Pass

    if spec is None:
        spec = DEFAULT_PIPELINE
    if isinstance(spec, str):
        spec = [s.strip() for s in spec.split(",") if s.strip()]
        if not spec:
            raise InputError("--passes is empty")
    try:
        spec = list(spec)
    except TypeError:
        raise InputError(f"passes: names, Pass classes or instances, got {spec!r}") from None
    out = []
    for item in spec:
        if item == "default":
            out.extend(get(name)() for name in default_pipeline(target))
        elif isinstance(item, str):
            out.append(get(item)())
        elif isinstance(item, type) and issubclass(item, Pass):
            out.append(item())
        elif isinstance(item, Pass):
            out.append(item)
        else:
            raise InputError(f"passes: {item!r} is not a pass name, Pass class or instance")
        if not out[-1].name:
            raise InputError(f"pass {type(out[-1]).__name__} has no name (its report row and "
                             "errors need one)")
    return out


def describe() -> list[tuple[str, str]]:
    """(name, one-line summary) for --list-passes."""
    return [(n, get(n).summary) for n in names()]
