"""Mixed-precision plans: load, validate, and resolve to a precision per layer.

A plan says, per layer (Conv, ConvTranspose, MatMul, Gemm), ``fp32``, ``fp16`` or ``int8``::

    version: 1
    default: fp32                       # layers no rule matches
    rules:                              # first matching rule wins
      - {match: {position: first_conv}, precision: fp16}
      - {match: {position: last_conv},  precision: fp16}
      - {match: {position: classifier}, precision: fp16}
      - {match: {op: [Conv, MatMul, Gemm]}, precision: int8}
    overrides: {"conv_17": fp32}         # by node name; always win
    int8:
      calibration: {method: minmax, percentile: 99.999, num_bins: 2048, samples: 200}
      weights: per-channel                # or per-tensor
      weight_form: auto                   # where per-channel scales go: axis (on the weight's
                                          # DequantizeLinear), mul (a Mul after the layer),
                                          # auto (from the target MIGraphX version)
      bias: float                         # or int32
    fp16: {clamp: true}
    verify: {min_cosine: 0.99, min_top1: 0.99, min_sqnr_db: 15, max_accuracy_drop: 1.0,
             max_abs: 0.5, min_within: 0.99}  # max_abs: in the outputs' units, or by output
    preprocess: {...}                    # for image calibration folders (rewriter.calibrate)

Matchers (all given keys must hold): ``name`` (exact node name), ``regex`` (re.search on
the name), ``op`` (op type or list), ``position`` (first_conv; last_conv = the last conv of
each output head, no conv after it; classifier = the last Gemm/MatMul with a weight). A
``name`` or override that matches no node is an error listing the closest names, so a typo
never silently leaves a layer in the wrong precision.

Nodes are identified by name, or by their first output's name when the name is empty.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import onnx_graphsurgeon as gs

from rewriter.core.errors import InputError
from rewriter.core.graph import (StoredInt8, float32_layer, iter_graphs, node_id,
                                 stored_int8_weight)
from rewriter.quant import MAX_BINS, METHODS, WEIGHT_FORMS
from rewriter.verify.metrics import LOSSY_DEFAULT, check_budget, max_abs_setting

PRECISIONS = ("fp32", "fp16", "int8")
LAYER_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm")
INT8_OPS = ("Conv", "MatMul", "Gemm")  # what MIGraphX turns into quant_convolution/quant_dot
POSITIONS = ("first_conv", "last_conv", "classifier")

# The accuracy techniques are on by default (docs/plans.md: what each buys, measured).
_DEFAULT_INT8 = {"calibration": {"method": "mse", "percentile": 99.999, "num_bins": 2048,
                                 "samples": 200},
                 "weights": "per-channel", "weight_form": "auto", "bias": "float",
                 "equalize": True, "equalize_alpha": 0.5, "bias_correction": True,
                 "rounding": "gptq", "stored_weights": "requantize"}
# The first MIGraphX version whose simplify_qdq throws on a per-axis weight DequantizeLinear
# (develop after PR #4470; shared/migraphx/PROFILE.md item 9, run on the 2.15 and 2.16 builds).
PER_AXIS_BREAKS_FROM = (2, 16)

BUILTIN = {
    # The classic recipe: first and last conv FP16, middle convs/matmuls INT8, classifier FP16
    # ("last" per output head: a detector's box and class convs at every level). A
    # ConvTranspose is asked INT8 too, so that the plan says it stays FP32: MIGraphX quantizes
    # convolution and dot only (simplify_qdq.cpp:48 at f729a52faf, the 2.16 build), and a
    # layer no rule named was left FP32 without a word (HiFi-GAN's upsamplers).
    "default": {"version": 1, "default": "fp32", "rules": [
        {"match": {"position": "first_conv"}, "precision": "fp16"},
        {"match": {"position": "last_conv"}, "precision": "fp16"},
        {"match": {"position": "classifier"}, "precision": "fp16"},
        {"match": {"op": list(LAYER_OPS)}, "precision": "int8"},
    ]},
    "int8": {"version": 1, "default": "fp32", "rules": [
        {"match": {"op": list(LAYER_OPS)}, "precision": "int8"}]},
    "fp16": {"version": 1, "default": "fp16", "rules": []},
}


@dataclass
class Plan:
    default: str = "fp32"
    rules: list[dict] = field(default_factory=list)
    overrides: dict[str, str] = field(default_factory=dict)
    int8: dict[str, Any] = field(default_factory=lambda: copy.deepcopy(_DEFAULT_INT8))
    fp16: dict[str, Any] = field(default_factory=lambda: {"clamp": True})
    verify: dict[str, Any] = field(default_factory=lambda: dict(LOSSY_DEFAULT))
    preprocess: dict[str, Any] | None = None
    source: str = "<dict>"

    def to_dict(self) -> dict:
        d = {"version": 1, "default": self.default, "rules": self.rules,
             "overrides": self.overrides, "int8": self.int8, "fp16": self.fp16,
             "verify": self.verify}
        if self.preprocess:
            d["preprocess"] = self.preprocess
        return d

    @property
    def per_channel(self) -> bool:
        return self.int8.get("weights", "per-channel") == "per-channel"

    def weight_form(self, migraphx_version: tuple[int, ...] | None) -> tuple[str, str]:
        """(form, why): where per-channel weight scales go for this target.

        ``axis`` puts them on the weight's DequantizeLinear; ``mul`` keeps a per-tensor DQ of
        scale 1 and multiplies the layer's output per channel (the same arithmetic).
        ``auto`` picks ``axis`` for MIGraphX before 2.16 and ``mul`` otherwise, including an
        unknown version, since ``mul`` lowers to int8 kernels on every version run here.
        """
        form = self.int8.get("weight_form", "auto")
        if not self.per_channel:
            return "per-tensor", "per-tensor weights"
        if form != "auto":
            return form, f"plan sets weight_form: {form}"
        if migraphx_version is None:
            return "mul", "no MIGraphX version given or installed: the form every version lowers"
        shown = ".".join(str(v) for v in migraphx_version[:2])
        if tuple(migraphx_version[:2]) < PER_AXIS_BREAKS_FROM:
            return "axis", f"MIGraphX {shown} lowers per-axis weight DequantizeLinear"
        return "mul", f"MIGraphX {shown} cannot lower per-axis weight DequantizeLinear"

    def qdq_opset(self, migraphx_version: tuple[int, ...] | None) -> tuple[int, str]:
        """(opset, what for): the default-domain opset the INT8 form needs, 13 for per-axis
        DequantizeLinear, else 10 (QuantizeLinear's first)."""
        if self.weight_form(migraphx_version)[0] == "axis":
            return 13, "per-channel weight scales"
        return 10, "QuantizeLinear/DequantizeLinear"


def load(spec: str | os.PathLike | dict | Plan) -> Plan:
    """A Plan from a built-in name ('default', 'int8', 'fp16'), a YAML/JSON file or a dict."""
    if isinstance(spec, Plan):
        return spec
    if isinstance(spec, dict):
        return from_dict(spec, "<dict>")
    s = str(spec)
    if s in BUILTIN:
        return from_dict(copy.deepcopy(BUILTIN[s]), f"built-in '{s}'")
    if not os.path.isfile(s):
        close = difflib.get_close_matches(s, [*BUILTIN, "auto"], n=1, cutoff=0.7)
        hint = f"; did you mean '{close[0]}'?" if close else ""   # int-8, fp-16
        raise InputError(f"plan '{s}': no such file (built-in plans: {', '.join(BUILTIN)}, "
                         f"auto){hint}")
    return from_dict(_read(s, "plan"), s)


def _read(path: str, what: str) -> Any:
    """A YAML or JSON file's content (JSON by a .json suffix); InputError in one line."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if path.endswith(".json"):
            return json.loads(text)
        import yaml
        return yaml.safe_load(text)
    except OSError as e:
        raise InputError(f"{what} {path}: {e.strerror}") from None
    except Exception as e:
        mark = getattr(e, "problem_mark", None)   # YAML's: where, and what it expected
        if mark is not None and getattr(e, "problem", None):
            context = f" ({e.context})" if getattr(e, "context", None) else ""
            raise InputError(f"{what} {path}: cannot parse line {mark.line + 1}, column "
                             f"{mark.column + 1}: {e.problem}{context}") from None
        raise InputError(f"{what} {path}: cannot parse ({type(e).__name__}: "
                         f"{str(e).splitlines()[0]})") from None


def load_preprocess(path: str | os.PathLike) -> dict:
    """The image preprocessing of a --preprocess file: a mapping of preprocess keys, or a
    plan whose ``preprocess:`` section is used; checked (InputError on a bad key or value)."""
    from rewriter.quant.data import Preprocess

    s = os.fspath(path)
    d = _read(s, "--preprocess")
    if isinstance(d, dict) and isinstance(d.get("preprocess"), dict):
        d = d["preprocess"]
    if not isinstance(d, dict):
        raise InputError(f"--preprocess {s}: expected a mapping of preprocess settings "
                         "(size, scale, mean, std, ...)")
    Preprocess.from_dict(d)
    return d


def _number(v, where: str) -> float | None:
    """A plan's number (None: not given); InputError in one line for text, a list, a
    bool (YAML's ``min_within: [0.9]`` was an internal error, exit 3)."""
    if v is None:
        return None
    try:
        if isinstance(v, bool):
            raise TypeError
        return float(v)
    except (TypeError, ValueError):
        raise InputError(f"{where} must be a number, not {v!r}") from None


def from_dict(d: Any, source: str) -> Plan:
    if not isinstance(d, dict):
        raise InputError(f"plan {source}: expected a mapping at the top level")
    known = {"version", "default", "rules", "overrides", "int8", "fp16", "verify", "preprocess"}
    _no_unknown(d, known, f"plan {source}")
    if d.get("version", 1) != 1:
        raise InputError(f"plan {source}: unsupported version {d.get('version')} (expected 1)")
    p = Plan(source=source)
    p.default = _precision(d.get("default", "fp32"), f"plan {source}: default")
    rules = d.get("rules", []) or []
    if not isinstance(rules, list):
        raise InputError(f"plan {source}: 'rules' must be a list")
    for i, r in enumerate(rules):
        where = f"plan {source}: rules[{i}]"
        if isinstance(r, dict):   # a misspelt key first: 'precison' gets a did-you-mean
            _no_unknown(r, {"match", "precision"}, where)
        if not isinstance(r, dict) or "match" not in r or "precision" not in r:
            raise InputError(f"{where}: expected {{match: {{...}}, precision: fp32|fp16|int8}}")
        m = r["match"]
        if not isinstance(m, dict) or not m:
            raise InputError(f"{where}: 'match' must be a non-empty mapping")
        _no_unknown(m, {"name", "regex", "op", "position"}, f"{where}.match")
        if "position" in m and m["position"] not in POSITIONS:
            raise InputError(f"{where}: position '{m['position']}' is not one of {', '.join(POSITIONS)}")
        if "regex" in m:
            try:
                re.compile(m["regex"])
            except re.error as e:
                raise InputError(f"{where}: bad regex {m['regex']!r} ({e})") from None
        if "op" in m:
            ops = m["op"] if isinstance(m["op"], list) else [m["op"]]
            bad = [o for o in ops if o not in LAYER_OPS]
            if bad:
                raise InputError(f"{where}: op {bad} is not a layer op ({', '.join(LAYER_OPS)})")
        p.rules.append({"match": dict(m), "precision": _precision(r["precision"], where)})
    ov = d.get("overrides", {}) or {}
    if not isinstance(ov, dict):
        raise InputError(f"plan {source}: 'overrides' must map node names to precisions")
    p.overrides = {str(k): _precision(v, f"plan {source}: overrides[{k}]") for k, v in ov.items()}
    int8 = d.get("int8", {}) or {}
    _no_unknown(int8, set(_DEFAULT_INT8), f"plan {source}: int8")
    cal = dict(_DEFAULT_INT8["calibration"], **(int8.get("calibration") or {}))
    _no_unknown(cal, set(_DEFAULT_INT8["calibration"]), f"plan {source}: int8.calibration")
    if cal["method"] not in METHODS:
        raise InputError(f"plan {source}: calibration method '{cal['method']}' is not one of "
                         f"{', '.join(METHODS)}")
    if not 50.0 < (_number(cal["percentile"], f"plan {source}: percentile") or 0) <= 100.0:
        raise InputError(f"plan {source}: percentile must be in (50, 100]")
    for k, low in (("samples", 1), ("num_bins", 2)):   # int(): .inf was exit 3, 2.5 ran as 2
        v = _number(cal[k], f"plan {source}: int8.calibration.{k}")
        if v is None or not math.isfinite(v) or v != int(v) or v < low:
            raise InputError(f"plan {source}: int8.calibration.{k} must be a whole number of "
                             f"at least {low}, not {cal[k]!r}")
        if k == "num_bins" and v > MAX_BINS:   # 1e12 asked for 8 TB of histogram counts
            raise InputError(f"plan {source}: int8.calibration.num_bins must be at most "
                             f"{MAX_BINS}, not {cal[k]!r}")
        cal[k] = int(cal[k]) if isinstance(cal[k], int) else int(v)
    p.int8 = {"calibration": cal,
              "weights": int8.get("weights", "per-channel"),
              "weight_form": int8.get("weight_form", "auto"),
              "bias": int8.get("bias", "float"),
              "equalize": int8.get("equalize", _DEFAULT_INT8["equalize"]),
              "equalize_alpha": _number(int8.get("equalize_alpha", 0.5),
                                        f"plan {source}: int8.equalize_alpha"),
              "bias_correction": bool(int8.get("bias_correction",
                                               _DEFAULT_INT8["bias_correction"])),
              "rounding": int8.get("rounding", _DEFAULT_INT8["rounding"]),
              "stored_weights": int8.get("stored_weights", _DEFAULT_INT8["stored_weights"])}
    if p.int8["stored_weights"] not in ("requantize", "keep"):
        raise InputError(f"plan {source}: int8.stored_weights must be requantize or keep")
    if p.int8["rounding"] not in ("nearest", "gptq"):
        raise InputError(f"plan {source}: int8.rounding must be nearest or gptq")
    if p.int8["equalize"] not in (True, False, "all"):
        raise InputError(f"plan {source}: int8.equalize must be true, false or all")
    if not 0.0 <= p.int8["equalize_alpha"] <= 1.0:
        raise InputError(f"plan {source}: int8.equalize_alpha must be in [0, 1]")
    if p.int8["weight_form"] not in WEIGHT_FORMS:
        raise InputError(f"plan {source}: int8.weight_form must be one of {', '.join(WEIGHT_FORMS)}")
    if p.int8["weights"] not in ("per-channel", "per-tensor"):
        raise InputError(f"plan {source}: int8.weights must be per-channel or per-tensor")
    if p.int8["bias"] not in ("float", "int32"):
        raise InputError(f"plan {source}: int8.bias must be float or int32")
    fp16 = d.get("fp16", {}) or {}
    _no_unknown(fp16, {"clamp"}, f"plan {source}: fp16")
    p.fp16 = {"clamp": bool(fp16.get("clamp", True))}
    ver = d.get("verify", {}) or {}
    _no_unknown(ver, set(LOSSY_DEFAULT), f"plan {source}: verify")
    p.verify = {k: _number(ver.get(k, v), f"plan {source}: verify.{k}")
                for k, v in LOSSY_DEFAULT.items() if k != "max_abs"}
    for k, v in p.verify.items():   # min_sqnr_db .nan was taken and failed every sample
        if v is not None and not math.isfinite(v):
            raise InputError(f"plan {source}: verify.{k} must be a finite number, not {v}")
    p.verify["max_abs"] = max_abs_setting(ver.get("max_abs"), f"plan {source}: verify")
    if p.verify["min_within"] is None:   # null: the default (it was a TypeError, exit 3)
        p.verify["min_within"] = LOSSY_DEFAULT["min_within"]
    # read by nothing without max_abs (its default, as the schema in plans.md shows it, is)
    if p.verify["min_within"] != LOSSY_DEFAULT["min_within"] and p.verify["max_abs"] is None:
        raise InputError(f"plan {source}: verify.min_within is the share of samples within "
                         "max_abs: give max_abs too")
    if not 0.0 < p.verify["min_within"] <= 1.0:
        raise InputError(f"plan {source}: verify.min_within must be in (0, 1]")
    check_budget(p.verify, f"plan {source}: verify.")
    if ver.get("max_accuracy_drop") is not None and "min_top1" not in ver:
        p.verify["min_top1"] = None     # the verifier's: 0 where labels judge accuracy
    p.preprocess = d.get("preprocess")
    if p.preprocess is not None:   # checked now, as every other key: with an .npy folder
        from rewriter.quant.data import Preprocess   # it is unused, and a typo went unsaid
        try:
            Preprocess.from_dict(p.preprocess)
        except InputError as e:
            raise InputError(f"plan {source}: {e}") from None
    return p


def _no_unknown(d: dict, known: set, where: str) -> None:
    for k in d:
        if k not in known:
            close = difflib.get_close_matches(str(k), sorted(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; known: {', '.join(sorted(known))}"
            raise InputError(f"{where}: unknown key '{k}'{hint}")


def _precision(v: Any, where: str) -> str:
    if v not in PRECISIONS:
        raise InputError(f"{where}: precision '{v}' is not one of {', '.join(PRECISIONS)}")
    return v


# --------------------------------------------------------------------------- resolving


@dataclass
class Assignment:
    precision: dict[str, str]           # node id -> fp32/fp16/int8, for every layer
    why: dict[str, str]                 # node id -> "rule 3" / "override" / "default"
    order: list[str]                    # layers in graph order
    op: dict[str, str]                  # node id -> op type
    notes: list[str] = field(default_factory=list)
    inside: list[str] = field(default_factory=list)   # layers inside If/Loop/Scan bodies

    @property
    def main(self) -> list[str]:
        """The main graph's layers (``order`` lists them first, then ``inside``)."""
        return self.order[:len(self.order) - len(self.inside)]

    def counts(self) -> dict[str, int]:
        c = {p: 0 for p in PRECISIONS}
        for v in self.precision.values():
            c[v] += 1
        return c


def resolve(plan: Plan, nodes: list, inside: list = ()) -> Assignment:
    """Precision of every layer among ``nodes`` (topological order), by the plan's rules,
    and of those among ``inside`` (the nodes of If/Loop/Scan bodies): positions (first
    conv, classifier...) are the main graph's; names, ops and the default reach the bodies
    too, in FP16 or FP32 only: INT8's calibration (ranges, GPTQ statistics) and Q/DQ work
    on the main graph."""
    layers = [n for n in nodes if _op(n) in LAYER_OPS]
    body = [n for n in inside if _op(n) in LAYER_OPS]
    main_ids = [node_id(n) for n in layers]
    ids = main_ids + [node_id(n) for n in body]
    ops = {node_id(n): _op(n) for n in layers + body}
    all_names = [node_id(n) for n in list(nodes) + list(inside)]
    convs = [i for i in main_ids if ops[i] in ("Conv", "ConvTranspose")]
    mats = [i for i in main_ids if ops[i] in ("MatMul", "Gemm")]
    computed = {node_id(n) for n in layers + body if computed_weight(n)}
    trans_a = {node_id(n) for n in layers + body if _transposed_a(n)}
    not_2d = {node_id(n) for n in layers + body if _weights_not_2d(n)}
    # The classifier is the last MatMul/Gemm with a weight: an attention's activation x
    # activation MatMul is no classifier (a YOLOv8-seg's backbone one was taken, eighth
    # round). Nodes that cannot say (NodeProto) count as weighted.
    weighted = [i for i in mats if i not in computed]
    positions = {"first_conv": convs[:1], "last_conv": _head_convs(nodes, set(convs)),
                 "classifier": (weighted or mats)[-1:]}
    for r in plan.rules:
        name = r["match"].get("name")
        if name is not None and name not in ids:
            raise InputError(_missing(name, ids, all_names, plan.source))
    for name in plan.overrides:
        if name not in ids:
            raise InputError(_missing(name, ids, all_names, plan.source))
    prec, why = {}, {}
    for i in ids:
        if i in plan.overrides:
            prec[i], why[i] = plan.overrides[i], "override"
            continue
        for k, r in enumerate(plan.rules):
            if _matches(r["match"], i, ops[i], positions):
                prec[i], why[i] = r["precision"], f"rule {k + 1}"
                break
        else:
            prec[i], why[i] = plan.default, "default"
    no_kernel, no_weight, in_body, batched, main = [], [], [], [], set(main_ids)
    stored = {node_id(n): stored_int8_weight(n) for n in layers + body}
    for i in ids:
        if prec[i] == "int8" and i not in main:
            in_body.append(i)
            prec[i], why[i] = "fp32", why[i] + " (inside a body: not calibrated)"
        elif prec[i] == "int8" and ops[i] not in INT8_OPS:
            no_kernel.append(i)
            prec[i], why[i] = "fp32", why[i] + " (no int8 kernel)"
        elif prec[i] == "int8" and i in computed:
            # insert-qdq quantises a layer's constant weight; attention's Q x K^T has none
            no_weight.append(i)
            prec[i], why[i] = "fp32", why[i] + " (computed weight)"
        elif prec[i] == "int8" and i in trans_a:
            no_kernel.append(i)
            prec[i], why[i] = "fp32", why[i] + " (transA=1: no int8 form)"
        elif prec[i] == "int8" and i in not_2d:
            batched.append(i)
            prec[i], why[i] = "fp32", why[i] + " (weight not 2-D)"
    # One line per kind, not per layer: a 12-block ViT gave 24 lines of its attention
    # MatMuls, which the user cannot act on (eleventh round).
    notes = []
    if no_kernel:
        kinds = ", ".join(sorted({ops[i] + (" transA=1" if i in trans_a else "")
                                  for i in no_kernel}))
        notes.append(f"{_count(no_kernel)} planned int8 ({kinds}) {_have(no_kernel)} no int8 "
                     f"kernel in MIGraphX; kept fp32: {_names(no_kernel)}")
    by_reason: dict[str, list] = {}
    for i in no_weight:
        if isinstance(stored[i], str):
            by_reason.setdefault(stored[i], []).append(i)
    for reason, hand in by_reason.items():
        # PP-OCRv6 rec tiny's int8 convs were reported as attention before; those with a
        # symmetric int8 weight and per-channel scales go INT8 now, keeping that weight
        notes.append(f"{_count(hand)} planned int8 {_have(hand)} a weight the graph dequantises "
                     f"(stored as an integer, weight-only quantized) that INT8 cannot keep "
                     f"as it is ({reason}: {_STORED_WHY[reason]}); kept fp32 as they are: "
                     f"{_names(hand)}")
    rest = [i for i in no_weight if not isinstance(stored[i], str)]
    if rest:
        notes.append(f"{_count(rest)} planned int8 {_have(rest)} a computed second input, not "
                     "a weight (attention's Q x K^T and attn x V; INT8 needs a constant "
                     f"one); kept fp32: {_names(rest)}")
    if batched:
        notes.append(f"{_count(batched)} planned int8 (MatMul) {_have(batched)} a weight that "
                     f"is not 2-D (a batch of weights; INT8 quantises 2-D ones); kept fp32: "
                     f"{_names(batched)}")
    if in_body:   # Silero VAD v5: all 12 of its layers in the If branches of its two rates
        notes.append(f"{_count(in_body)} planned int8 {'sits' if len(in_body) == 1 else 'sit'} "
                     "inside If/Loop/Scan bodies, where INT8 is not calibrated nor inserted "
                     f"(FP16 is); kept fp32: {_names(in_body)}")
    return Assignment(prec, why, ids, ops, notes, ids[len(main_ids):])


def _have(names: list) -> str:
    return "has" if len(names) == 1 else "have"


def _count(names: list) -> str:
    return f"{len(names)} layer{'s' if len(names) != 1 else ''}"


def _names(names: list, shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more"
                                      if len(names) > shown else "")


def body_nodes(graph: gs.Graph) -> list:
    """The nodes inside If/Loop/Scan bodies, outermost bodies first."""
    return [n for g in list(iter_graphs(graph))[1:] for n in g.nodes]


def int8_capable(node) -> bool:
    """A layer insert-qdq can put in INT8: a Conv/MatMul/Gemm with a constant weight (not
    attention's Q x K^T or attn x V, which :func:`resolve` keeps FP32: the planner counted
    them as INT8 and credited BERT's plan with 16 INT8 layers for the 12 it had, twelfth
    round), and one computing in float32 (an onnx-graphsurgeon node): --plan auto run again
    on its own output measured its float16 layers as INT8, where insert-qdq leaves them as
    they are, and planned them INT8 at no loss (fuzz seed 62007, case 170)."""
    return _op(node) in INT8_OPS and not computed_weight(node) and not _transposed_a(node) \
        and not _weights_not_2d(node) and (not hasattr(node, "inputs") or float32_layer(node))


def _weights_not_2d(node) -> bool:
    """A MatMul whose constant weight is not 2-D (a batch of weights: MViT-V2's relative
    positions against [t, c, k] tables): insert-qdq keeps it float (skip:matmul-weight-not-2d),
    so it is no INT8 layer (the report counted MViT-V2's 48 as INT8)."""
    w = getattr(node, "inputs", [None, None])[1:2]
    return _op(node) == "MatMul" and bool(w) and isinstance(w[0], gs.Constant) \
        and w[0].values.ndim != 2


def _transposed_a(node) -> bool:
    """A Gemm with transA=1: insert-qdq keeps it float (skip:gemm-transposed-activation),
    so it is no INT8 layer (the plan and the lowering headline counted it as one)."""
    if _op(node) != "Gemm":
        return False
    attrs = getattr(node, "attrs", None)
    if attrs is not None:
        return bool(int(attrs.get("transA", 0)))
    return any(a.name == "transA" and a.i for a in node.attribute)


# Ops that only move or split data, walked through from a DFL to its box conv.
_LAYOUT = {"Reshape", "Transpose", "Split", "Slice", "Concat", "Squeeze", "Unsqueeze",
           "Flatten", "Identity"}


def _head_convs(nodes: list, convs: set[str]) -> list[str]:
    """The convs no other conv reads, directly or through other nodes, in graph order: the
    last conv of each output head. Only the last conv in graph order was taken, so a
    RetinaNet's or SSD's box convs at every level but one ran INT8 (fifteenth round).
    ``nodes`` are in topological order, onnx-graphsurgeon or protobuf nodes."""
    def names(ts):
        return [getattr(t, "name", t) for t in ts]
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for t in names(getattr(n, "inputs", None) or getattr(n, "input", [])):
            readers.setdefault(t, []).append(k)
    feeds_conv = [False] * len(nodes)     # a conv is downstream of node k
    for k in range(len(nodes) - 1, -1, -1):
        outs = names(getattr(nodes[k], "outputs", None) or getattr(nodes[k], "output", []))
        feeds_conv[k] = any(node_id(nodes[r]) in convs or feeds_conv[r]
                            for t in outs if t for r in readers.get(t, ()))
    last = {k for k, (n, f) in enumerate(zip(nodes, feeds_conv))
            if not f and node_id(n) in convs}
    # YOLOv8's DFL: box conv -> Concat/Split/Reshape -> Softmax -> a 1x1 conv whose weights
    # are 0..15, a fixed expectation over the bins. The learned convs before the Softmax
    # are the box head's last layers too. Walked back along data through layout ops only
    # (a Concat's inputs, any other's first), from a last conv to a Softmax, then to the
    # nearest convs: an attention's Softmax before a conv is behind a MatMul, not found.
    made = {t: k for k, n in enumerate(nodes)
            for t in names(getattr(n, "outputs", None) or getattr(n, "output", []))}
    for k in list(last):
        todo, seen = [(k, False)], set()
        while todo:
            j, past = todo.pop()
            ins = names(getattr(nodes[j], "inputs", None) or getattr(nodes[j], "input", []))
            for t in ins if _op(nodes[j]) == "Concat" else ins[:1]:
                i = made.get(t)
                if i is None or (i, past) in seen:
                    continue
                seen.add((i, past))
                if node_id(nodes[i]) in convs:
                    if past:
                        last.add(i)
                elif _op(nodes[i]) in _LAYOUT or (_op(nodes[i]) == "Softmax" and not past):
                    todo.append((i, past or _op(nodes[i]) == "Softmax"))
    return [node_id(n) for k, n in enumerate(nodes) if k in last]


def computed_weight(node) -> bool:
    """A graph layer (onnx-graphsurgeon) whose second input is not a constant, nor a
    weight the model stores as int8 and dequantises (:func:`stored_int8_weight`), nor a
    DequantizeLinear's output read by a Q/DQ layer (a model quantized already)."""
    inputs = getattr(node, "inputs", None)
    if inputs is None or len(inputs) < 2 or isinstance(inputs[1], gs.Constant):
        return False
    stored = stored_int8_weight(node)
    return not isinstance(stored, StoredInt8) and not (stored is None and _dequantized(inputs[1]))


# Why a weight stored as an integer cannot go INT8 as it is (stored_int8_weight's reasons).
_STORED_WHY = {
    "stored-weight-not-int8": "MIGraphX's int8 kernels take int8 weights",
    "stored-weight-zero-point": "a non-zero zero point; the int8 kernels take symmetric "
                                "weights",
    "stored-scale-not-constant": "its scale is computed",
    "stored-weight-not-fp32": "not dequantised to float32",
    "stored-weight-rank": "a MatMul weight that is not 2-D, or a scale of more axes than q",
    "stored-scale-not-per-channel": "its scale is neither per tensor nor per output channel",
    "stored-scale-zero-or-not-finite": "a zero or non-finite scale",
    "stored-weight-read-elsewhere": "the dequantised weight is read by more than layers",
}


def _dequantized(t) -> bool:
    """Produced by a DequantizeLinear (a model quantised already)."""
    return len(getattr(t, "inputs", [])) == 1 and t.inputs[0].op == "DequantizeLinear"


def _op(node) -> str:
    return getattr(node, "op", None) or node.op_type


def _matches(m: dict, i: str, op: str, positions: dict) -> bool:
    if "name" in m and m["name"] != i:
        return False
    if "regex" in m and not re.search(m["regex"], i):
        return False
    if "op" in m and op not in (m["op"] if isinstance(m["op"], list) else [m["op"]]):
        return False
    if "position" in m and i not in positions[m["position"]]:
        return False
    return True


def _missing(name: str, ids: list[str], all_names: list[str], source: str) -> str:
    close = difflib.get_close_matches(name, ids, n=3, cutoff=0.4)
    where = "is not a layer (Conv/MatMul/Gemm)" if name in all_names else "does not exist"
    if close:
        hint = f"; closest layers: {', '.join(close)}"
    else:   # nothing alike: say what the layers are called
        hint = f"; the {len(ids)} layers are named like {', '.join(ids[:3])}" + (
            ", ..." if len(ids) > 3 else "") if ids else "; the model has no such layers"
    return f"plan {source}: node '{name}' {where}{hint}"
