"""The static MIGraphX check: what MIGraphX will refuse, or silently run in float, before it runs.

It reads a plain ``onnx.ModelProto`` (load it with ``load_external_data=False``: no weight
data is read, only dims, dtypes and the small scale/zero-point tensors) and interprets the
target profile, ``rewriter/migraphx/data/migraphx_profile.json`` (derived from
shared/migraphx/PROFILE.md). Rules live in that data, so a newer MIGraphX is a data change.

    result = check_model(onnx.load("m.onnx", load_external_data=False),
                         input_shapes={"x": [8, 3, 224, 224]}, plan_int8_nodes=["conv1"])
    print(result.render())            # one line per finding, grouped, with counts
    result.to_dict()                  # for the JSON report

What it finds, each naming the node (or its first output when the node has no name):

* ``unsupported-op``: an op MIGraphX's ONNX parser does not register (it dispatches on
  op_type only and throws "Unknown operator"), in the main graph and in If/Loop/Scan bodies.
* partial support: ``pad-mode-refused``, ``resize-mode-refused``, ``input-not-constant`` (an
  input the parser evaluates at parse time; constant = initializer, Constant, Shape/Size, or
  an op whose inputs are all constant), ``unsupported-dtype`` (OCP FP8),
  ``unsupported-value-type`` (sequence/optional/map values).
* QDQ that MIGraphX silently runs in float: ``qdq-uint8``, ``qdq-not-int8``,
  ``qdq-no-zero-point``, ``qdq-scale-not-constant``, ``qdq-scale-not-positive``,
  ``qdq-per-channel-activation``, ``qdq-weight-folded`` / ``qdq-half-quantized`` (a
  Conv/MatMul/Gemm with only one input from DequantizeLinear), ``qdq-scale-shape-1`` (per-
  tensor scale [1] instead of 0-d), ``qdq-weight-axis``, ``qdq-per-channel-weight`` (which
  MIGraphX versions break), ``qdq-fp16-scale``, ``qdq-nonzero-zero-point``.
* ``integer-zero-point``: a MatMulInteger/ConvInteger zero-point form MIGraphX computes
  wrongly without an error, or refuses (:func:`integer_op_wrong`; onnxruntime's dynamic
  quantization is one): the pass integer-zero-points rewrites most of them.
* ``output-padded``: a NonZero or NonMaxSuppression on computed inputs, whose output MIGraphX
  pads to a fixed size with zeros that read as valid indices (wrong numbers, no error).
* ``dynamic-input-dim``: a symbolic graph-input dim MIGraphX would silently set to 1.
* ``resize-strided-input`` (2.15 and unknown versions): a Resize reading a computed tensor,
  which 2.15 computes wrongly where MIGraphX holds it as a strided view (resize-inputs).
* ``conv-channels-not-multiple`` (info): C_in per group or C_out off the profile's multiple.
* ``plan-int8-stays-float``: a node a plan put in INT8 that will not become
  quant_convolution/quant_dot, with the reasons.

Nothing here imports migraphx except :func:`load_profile`, which, when it is installed,
takes the op list from ``migraphx.get_onnx_operators()`` instead of the profile's.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from rewriter.core.errors import InputError
from rewriter.core.graph import (SMALL_TENSOR, graph_protos, has_function_body, node_id,
                                 tensor_nbytes, weight_free_copy)
from rewriter.core.integer_ops import COMPUTED, INTEGER_OPS, integer_op_wrong
from rewriter.core.pass_base import parse_version

PROFILE_PATH = Path(__file__).resolve().parent / "data" / "migraphx_profile.json"
SCHEMA_VERSION = 1
SEVERITIES = ("error", "warning", "info")



@dataclass(frozen=True)
class Finding:
    severity: str          # 'error' | 'warning' | 'info'
    code: str              # kebab-case, stable: tests and reports key on it
    node: str              # node name, or its first output when the node has no name
    op_type: str
    message: str
    graph: str = ""        # "" for the main graph, "If_0/then_branch" inside a subgraph


@dataclass
class CheckResult:
    findings: list[Finding] = field(default_factory=list)
    profile: dict = field(default_factory=dict)   # version summary, not the rules
    qdq_layers: list[str] = field(default_factory=list)  # main-graph conv/dot fed by a DQ

    @property
    def ok(self) -> bool:
        """True when nothing would stop MIGraphX from parsing the model."""
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def counts(self) -> dict[str, int]:
        c = Counter(f.severity for f in self.findings)
        return {s: c.get(s, 0) for s in SEVERITIES}

    def codes(self, severity: str | None = None) -> Counter:
        return Counter(f.code for f in self.findings if severity in (None, f.severity))

    def to_dict(self) -> dict:
        return {"ok": self.ok, "counts": self.counts(), "profile": dict(self.profile),
                "findings": [asdict(f) for f in self.findings]}

    def render(self, details: bool = False) -> str:
        return render_text(self, details)

    def summary_lines(self, severities=SEVERITIES) -> list[str]:
        """One line per (severity, code): count, nodes in short, the rule's reason."""
        return _summary_lines(self, severities)


def render_text(result: CheckResult, details: bool = False) -> str:
    """Headline with counts, then one line per rule (severity, code, count, the nodes in
    short, what the rule says); ``details`` adds every finding's own message."""
    c = result.counts()
    p = result.profile
    target = p.get("target_version") or "unknown (rules of every version run)"
    head = (f"MIGraphX check: {c['error']} error(s), {c['warning']} warning(s), {c['info']} info"
            f" (target MIGraphX {target}; profile {p.get('profile_version', '?')}, ops from "
            f"{p.get('ops_source', 'profile')})")
    lines = [head] + result.summary_lines()
    if details:
        for f in result.findings:
            where = f" in {f.graph}" if f.graph else ""
            lines.append(f"  {f.severity} {f.code}: {f.node} [{f.op_type}]{where}: {f.message}")
    return "\n".join(lines)


def _common_tail(messages: list[str]) -> str | None:
    """What all messages of one rule say alike: their longest common ending that starts
    after a ': ' (the rule's reason); None when they share no such ending of 20 characters
    or more (each message is then about its own node)."""
    if len(set(messages)) == 1:   # the same words for every node: all of them, the op's
        return messages[0]        # name included (text2tashkeel's DynamicQuantizeLSTMs)
    first = messages[0]
    n = 0
    while n < len(first) and all(len(m) > n and m[-1 - n] == first[-1 - n] for m in messages):
        n += 1
    tail = first[len(first) - n:]
    cut = tail.find(": ")
    if cut < 0:   # the shared ending starts inside a word: no reason in common
        return None
    tail = tail[cut + 2:]
    return tail if len(tail) >= 20 else None


def _summary_lines(result: "CheckResult", severities=SEVERITIES, width: int = 240) -> list[str]:
    order = {s: i for i, s in enumerate(SEVERITIES)}
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in sorted(result.findings, key=lambda f: (order.get(f.severity, 9), f.code)):
        if f.severity in severities:
            groups.setdefault((f.severity, f.code), []).append(f)
    lines = []
    for (sev, code), items in groups.items():
        nodes = list(dict.fromkeys(f.node for f in items))
        shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
        what = _common_tail([f.message for f in items])
        if what is None:
            what = f"e.g. {items[0].node}: {items[0].message}"
        line = f"{sev} {code} ({len(items)}): {shown}: {what}"
        lines.append(line if len(line) <= width else line[:width - 3] + "...")
    return lines


def load_profile(path: str | os.PathLike | None = None, use_installed: bool = True) -> dict:
    """The target profile; the packaged one when ``path`` is None.

    Where migraphx is importable (and ``use_installed``), its ``get_onnx_operators()``
    replaces the op list, since the installed parser is the truth for this machine.
    """
    # the packaged one through importlib.resources: from a zip, a Path into it is no file
    from importlib.resources import files
    p = Path(path) if path is not None else files(__package__) / "data" / PROFILE_PATH.name
    try:
        profile = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read MIGraphX profile {p}: {e}") from e
    if profile.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"MIGraphX profile {p} has schema_version "
                         f"{profile.get('schema_version')!r}; this checker reads {SCHEMA_VERSION}")
    for key in ("onnx_ops", "attribute_rules", "constant_inputs", "qdq", "layout"):
        if key not in profile:
            raise ValueError(f"MIGraphX profile {p} lacks '{key}'")
    profile["ops_source"] = "profile"
    if use_installed:
        try:
            import migraphx  # lazy: optional, and slow to import where present

            ops = list(migraphx.get_onnx_operators())
            if ops:
                profile["onnx_ops"] = sorted(ops)
                version = getattr(migraphx, "__version__", "?")
                profile["ops_source"] = f"installed migraphx {version}"
        except Exception:  # not installed, or a version without get_onnx_operators
            pass
    return profile


def check_model(model: onnx.ModelProto | str | os.PathLike,
                profile: dict | str | os.PathLike | None = None,
                input_shapes: Mapping[str, Iterable[int]] | None = None,
                plan_int8_nodes: Iterable[str] | None = None,
                version: tuple[int, ...] | None = None,
                typed: onnx.ModelProto | None = None,
                examples: Mapping[str, Iterable[int]] | None = None) -> CheckResult:
    """Check ``model`` against the MIGraphX profile; see the module docstring.

    ``examples``: dims known to run (e.g. what verification used) for the ``--input-shape``
    a dynamic-dim finding suggests; 1 in every symbolic dim otherwise.

    ``version`` (major, minor[, patch]) or "X.Y" is the target MIGraphX: rules that differ
    between versions (per-axis weight scales, zero scales) take its entry; None states both.
    ``typed``: a weight-free copy of ``model`` with its shapes inferred already, whose
    graph inputs may include top-level initializers (the rewriter's exit gate infers
    one); without it the check makes and infers its own."""
    # as --migraphx-version and --input-shape take them: "2.16" read as (2, 1, 6) and a
    # node name as its letters
    if isinstance(version, str):
        text, version = version, parse_version(version)
        if version is None:
            raise InputError(f"version {text!r}: 'X.Y' or a tuple like (2, 16)")
    elif version is not None and not (isinstance(version, Sequence) and all(
            isinstance(v, (int, np.integer)) for v in version)):
        # 2.16 as a float was a TypeError (exit 3), and cannot tell 2.1 from 2.10
        raise InputError(f"version {version!r}: 'X.Y' or a tuple like (2, 16)")
    if isinstance(plan_int8_nodes, bytes):   # b"conv1" was read as its bytes' numbers
        plan_int8_nodes = plan_int8_nodes.decode(errors="replace")
    plan_int8_nodes = [plan_int8_nodes] if isinstance(plan_int8_nodes, str) else plan_int8_nodes
    if plan_int8_nodes is not None and not all(isinstance(n, str) for n in plan_int8_nodes):
        raise InputError(f"plan_int8_nodes: node names (strings), got {plan_int8_nodes!r}")
    if input_shapes is not None and not isinstance(input_shapes, Mapping):
        raise InputError(f"input_shapes: a dict of input name -> dims, got "
                         f"{type(input_shapes).__name__}")
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(os.fspath(model), load_external_data=False)
    if profile is None or isinstance(profile, (str, os.PathLike)):
        profile = load_profile(profile)
    checker = _Checker(model, profile, input_shapes or {}, version, typed, examples)
    checker.run(list(plan_int8_nodes or []))
    src = profile.get("source", {})
    summary = {"profile_version": profile.get("profile_version"),
               "target_version": ".".join(map(str, version)) if version else None,
               "migraphx_version": src.get("migraphx_version"),
               "ops_commit": src.get("ops_commit"),
               "ops_source": profile.get("ops_source", "profile"),
               "shape_inference": checker.inferred}
    return CheckResult(checker.findings, summary, checker.qdq_layers)


def set_input_flags(model: onnx.ModelProto) -> dict[str, str]:
    """{input: the --set-input flag that makes it a constant} for the graph inputs that
    choose an If's branch (its condition: optimum's merged decoders' use_cache_branch; or
    compared with a constant: Silero VAD's Equal(sr, 16000)); none without an If. MIGraphX
    folds an If on a constant condition and parses one on a run-time condition only where
    both branches return the same shapes at the sizes given (parse_if.cpp, PARSE_IF;
    optimum's merged decoders' branches do not, and declare that they do)."""
    from rewriter.verify.feeds import branch_values

    if not any(n.op_type == "If" for g in graph_protos(model.graph) for n in g.node):
        return {}
    return {name: f"--set-input {name}=" + (
        "true (or false)" if isinstance(v[0], bool) else f"{v[0]:g}"
        if isinstance(v[0], float) else str(v[0]))
        for name, v in branch_values(model).items()}


def _moved_weights(model: onnx.ModelProto, typed: onnx.ModelProto) -> dict:
    """The initializers of ``model`` that ``typed`` holds as graph inputs, as the checker
    sees weights: small ones as they are (read, never copied), big ones as stubs (dims, no
    data) like :func:`weight_free_copy`'s."""
    names = {i.name for i in typed.graph.input}
    out: dict[str, TensorProto] = {}
    for t in model.graph.initializer:
        if t.name in names:
            if t.data_location == TensorProto.EXTERNAL or tensor_nbytes(t) > SMALL_TENSOR:
                stub = TensorProto(name=t.name, data_type=t.data_type)
                stub.dims.extend(t.dims)
                t = stub
            out[t.name] = t
    return out


# ---------------------------------------------------------------------------------------------


class _Graph:
    """One graph's lookups: producers, constants, types; outer scopes chained."""

    def __init__(self, graph: onnx.GraphProto, path: str, outer: "_Graph | None",
                 profile: dict, extra_inits: dict | None = None, in_loop: bool = False):
        self.graph, self.path, self.outer = graph, path, outer
        # a Loop's or Scan's body, or a graph inside one: MIGraphX parses it at fixed shapes
        self.in_loop = in_loop or (outer is not None and outer.in_loop)
        self.inits = {t.name: t for t in graph.initializer}
        self.inits.update(extra_inits or {})   # weights a typed copy holds as graph inputs
        self.inits.update({s.values.name: s.values for s in graph.sparse_initializer})
        self.producer: dict[str, onnx.NodeProto] = {}
        # Q/DQ here or in an outer scope (which a body's names may come from): without
        # any, no value is dequantized and the Q/DQ rules have nothing to look at.
        self.has_qdq = (outer is not None and outer.has_qdq) or any(
            n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in graph.node)
        for n in graph.node:
            for o in n.output:
                if o:
                    self.producer[o] = n
        self.types: dict[str, onnx.TypeProto] = {}
        for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
            if vi.type.WhichOneof("value"):
                self.types[vi.name] = vi.type
        self.graph_inputs = {i.name for i in graph.input} - set(self.inits)
        self.consts = self._constants(profile)

    def _constants(self, profile: dict) -> set[str]:
        like = set(profile.get("constant_like_ops", {}).get("ops", []))
        never = set(profile.get("never_constant_ops", []))
        consts = set(self.inits)
        changed = True
        while changed:   # a fixpoint, so graphs that are not topologically sorted work too
            changed = False
            for n in self.graph.node:
                if not n.output or n.output[0] in consts:
                    continue
                ins = [i for i in n.input if i]
                if n.op_type in never:
                    ok = False
                elif n.op_type == "Constant" or n.op_type in like:
                    ok = True
                else:
                    ok = all(i in consts or self._outer_const(i) for i in ins)
                if ok:
                    consts.update(o for o in n.output if o)
                    changed = True
        return consts

    def _outer_const(self, name: str) -> bool:
        # Names defined in this graph (including a body's own inputs) shadow outer ones.
        if name in self.producer or name in self.inits or name in self.graph_inputs:
            return False
        return self.outer is not None and self.outer.is_const(name)

    def is_const(self, name: str) -> bool:
        return name in self.consts or self._outer_const(name)

    def find_producer(self, name: str) -> onnx.NodeProto | None:
        g: _Graph | None = self
        while g is not None:
            if name in g.producer:
                return g.producer[name]
            if name in g.inits:
                return None
            g = g.outer
        return None

    def tensor(self, name: str) -> TensorProto | None:
        """The constant tensor behind ``name`` (initializer or Constant value), if any."""
        g: _Graph | None = self
        while g is not None:
            if name in g.inits:
                return g.inits[name]
            n = g.producer.get(name)
            if n is not None:
                if n.op_type != "Constant":
                    return None
                for a in n.attribute:
                    if a.name == "value":
                        return a.t
                    if a.name in ("value_float", "value_int", "value_floats", "value_ints"):
                        return numpy_helper.from_array(
                            np.asarray(onnx.helper.get_attribute_value(a),
                                       np.float32 if "float" in a.name else np.int64), name)
                return None
            g = g.outer
        return None

    def elem_type(self, name: str) -> int | None:
        t = self.tensor(name)
        if t is not None:
            return t.data_type
        g: _Graph | None = self
        while g is not None:
            tp = g.types.get(name)
            if tp is not None and tp.WhichOneof("value") == "tensor_type":
                return tp.tensor_type.elem_type or None
            g = g.outer
        return None

    def dims(self, name: str) -> list[int] | None:
        """Static dims of ``name`` where known (None when unknown or symbolic)."""
        t = self.tensor(name)
        if t is not None:
            return list(t.dims)
        g: _Graph | None = self
        while g is not None:
            tp = g.types.get(name)
            if tp is not None and tp.WhichOneof("value") == "tensor_type":
                if not tp.tensor_type.HasField("shape"):
                    return None
                d = [x.dim_value if x.HasField("dim_value") else -1
                     for x in tp.tensor_type.shape.dim]
                return None if any(v < 0 for v in d) else d
            g = g.outer
        return None


def _value(t: TensorProto | None) -> np.ndarray | None:
    """The values of a small constant tensor; None when stored externally (not read)."""
    if t is None or t.data_location == TensorProto.EXTERNAL:
        return None
    try:
        return numpy_helper.to_array(t)
    except Exception:
        return None


def _attr(node: onnx.NodeProto, name: str, default=None):
    """onnx.helper.get_node_attr_value, with a default for an absent attribute."""
    try:
        return onnx.helper.get_node_attr_value(node, name)
    except ValueError:
        return default


def _version_matches(entry: dict, version: tuple[int, ...] | None) -> bool:
    """Does a ``by_version`` entry ({"min": "2.16"}, {"max": "2.15"}, {"unknown": true})
    hold for ``version`` (major, minor, ...; None = unknown)?"""
    if version is None:
        return bool(entry.get("unknown"))
    if entry.get("unknown"):
        return False
    v = tuple(version[:2])
    lo = tuple(int(x) for x in str(entry.get("min", "0.0")).split(".")[:2])
    hi = tuple(int(x) for x in str(entry.get("max", "999.0")).split(".")[:2])
    return lo <= v <= hi


class _Checker:
    def __init__(self, model: onnx.ModelProto, profile: dict, input_shapes: Mapping,
                 version: tuple[int, ...] | None = None,
                 typed: onnx.ModelProto | None = None, examples: Mapping | None = None):
        self.model, self.profile, self.version = model, profile, version
        self.examples = {k: [int(d) for d in v] for k, v in (examples or {}).items()}
        self.fixed_dims: dict | None = None   # weight_dims, when advice needs it
        self.kernel_dqs: set[str] = set()
        self.kernel_blockers: dict[str, list[str]] = {}
        self.qdq_layers: list[str] = []
        self.input_shapes = {k: [int(d) for d in v] for k, v in input_shapes.items()}
        self.ops = set(profile["onnx_ops"])
        self.qdq = profile["qdq"]
        self.through = frozenset(self.qdq.get("passthrough_ops", []))
        bad = profile.get("refused_dtypes", {})
        self.refused_codes = {int(k): v for k, v in bad.get("codes", {}).items()}
        # Rules by op type, looked up once per node instead of scanned.
        self.attribute_rules: dict[str, list] = {}
        for rule in profile["attribute_rules"]:
            self.attribute_rules.setdefault(rule["op_type"], []).append(rule)
        self.constant_rules: dict[str, list] = {}
        for rule in profile["constant_inputs"]:
            self.constant_rules.setdefault(rule["op_type"], []).append(rule)
        self.findings: list[Finding] = []
        self._seen: set[tuple] = set()
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                          0)
        self.moved: dict[str, TensorProto] = {}
        if typed is not None:
            self.typed, self.inferred = typed, True
            self.moved = _moved_weights(model, typed)
            # Types the model declares for values inference did not reach (custom ops).
            tg = typed.graph
            have = {v.name for vis in (tg.input, tg.value_info, tg.output) for v in vis}
            for vi in model.graph.value_info:
                if vi.name not in have:
                    tg.value_info.add().CopyFrom(vi)
        else:
            light = weight_free_copy(model)
            try:
                self.typed = onnx.shape_inference.infer_shapes(light, strict_mode=False)
                self.inferred = True
            except Exception as e:   # a broken or exotic model: no intermediate types
                self.typed, self.inferred = light, False
                self.add("info", "shape-inference-failed", "<model>", "", f"types of "
                         f"intermediate values unknown, dtype checks are partial: "
                         f"{type(e).__name__}: {e}")
        # Why a DequantizeLinear would not feed an int8 kernel, keyed by its output name.
        self.dq_blockers: dict[str, list[str]] = {}
        self.main: _Graph | None = None

    def add(self, severity: str, code: str, node: str, op_type: str, message: str,
            graph: str = "") -> None:
        key = (code, node, graph, message)
        if key not in self._seen:
            self._seen.add(key)
            self.findings.append(Finding(severity, code, node, op_type, message, graph))

    # -- driver -------------------------------------------------------------------------------

    def run(self, plan_int8_nodes: list[str]) -> None:
        self.main = self.visit(self.typed.graph, "", None, self.moved)
        self.check_inputs(self.main)
        self.check_plan(self.main, plan_int8_nodes)
        self.check_branch_inputs()

    def check_branch_inputs(self) -> None:
        """An If whose branch a graph input chooses: :func:`set_input_flags`."""
        flags = set_input_flags(self.model)
        if not flags:
            return
        first_if = next(n for g in graph_protos(self.model.graph) for n in g.node
                        if n.op_type == "If")
        for name, flag in flags.items():
            self.add("info", "if-chosen-by-input", node_id(first_if), "If",
                     f"input '{name}' chooses an If's branch at run time: MIGraphX parses "
                     "it only where both branches return the same shapes at the sizes given "
                     f"(PARSE_IF); {flag} makes it a constant and keeps one branch")

    def visit(self, graph: onnx.GraphProto, path: str, outer: _Graph | None,
              extra_inits: dict | None = None, in_loop: bool = False) -> _Graph:
        g = _Graph(graph, path, outer, self.profile, extra_inits, in_loop)
        self.check_values(g)
        for node in graph.node:
            self.check_node(g, node)
        self.check_qdq(g)
        for node in graph.node:
            for a in node.attribute:
                subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
                for i, sub in enumerate(subs):
                    name = a.name if len(subs) == 1 else f"{a.name}[{i}]"
                    sub_path = f"{path}/{node_id(node)}/{name}" if path else f"{node_id(node)}/{name}"
                    self.visit(sub, sub_path, g, in_loop=node.op_type in ("Loop", "Scan"))
        return g

    # -- values and ops -----------------------------------------------------------------------

    def check_values(self, g: _Graph) -> None:
        bad_dtypes = self.profile.get("refused_dtypes", {})
        codes = {int(k): v for k, v in bad_dtypes.get("codes", {}).items()}
        vt = self.profile.get("unsupported_value_types", {})
        kinds = set(vt.get("kinds", []))
        for t in g.inits.values():
            if t.data_type in codes:
                self.add(bad_dtypes["severity"], "unsupported-dtype", t.name, "initializer",
                         f"{codes[t.data_type]} tensor: {bad_dtypes['reason']}", g.path)
            self.check_packed_shape(g, t, t.name, "initializer")
        inputs = {i.name for i in g.graph.input} - set(g.inits)
        outputs = {o.name for o in g.graph.output}
        for name, tp in g.types.items():
            kind = tp.WhichOneof("value")
            if kind not in kinds and not (kind == "tensor_type"
                                          and tp.tensor_type.elem_type in codes
                                          and (name in inputs or name in outputs)):
                continue
            node = g.producer.get(name)
            if node is not None and node.op_type not in self.ops:
                continue   # already reported as an unsupported op
            where = ("graph input" if name in inputs else "graph output" if name in outputs
                     else node.op_type if node is not None else "value")
            label = node_id(node) if node is not None else name
            if kind in kinds:
                self.add(vt["severity"], "unsupported-value-type", label, where,
                         f"'{name}' is a {kind.replace('_type', '')} value: {vt['reason']}",
                         g.path)
            else:
                # Intermediate values get their FP8 type from an initializer or a dtype
                # attribute, which are reported where they are; only the boundary is new here.
                self.add(bad_dtypes["severity"], "unsupported-dtype", label, where,
                         f"'{name}' is {codes[tp.tensor_type.elem_type]}: "
                         f"{bad_dtypes['reason']}", g.path)

    def body_hint(self, node: onnx.NodeProto) -> str:
        """" (...)" where the standard op has an ONNX function body expand-functions writes
        out, else ""."""
        if node.domain in ("", "ai.onnx") and has_function_body(node.op_type, self.opset):
            return (" (it has an ONNX function body: the pass expand-functions, in the "
                    "MIGraphX target's pipeline, writes it out)")
        return ""

    def check_node(self, g: _Graph, node: onnx.NodeProto) -> None:
        label, op = node_id(node), node.op_type
        if op not in self.ops:
            body = self.body_hint(node)
            hint = self.profile.get("op_hints", {}).get(op)
            hint = hint + body if hint else body[2:-1] if body else None
            dom = f" (domain '{node.domain}')" if node.domain not in ("", "ai.onnx") else ""
            self.add("error", "unsupported-op", label, op,
                     f"{op}{dom} is not among the {len(self.ops)} ops MIGraphX's ONNX parser "
                     f"registers: parsing throws 'Unknown operator'"
                     + (f"; {hint}" if hint else ""), g.path)
            return
        if op == "GroupQueryAttention" and node.domain == "com.microsoft":
            # parse_group_query_attention.cpp (2.15, 2.16): concat_past_present writes the new
            # keys into the past buffer at seqlens_k; present keeps the past's length
            self.add("warning", "kv-cache-shared-buffer", label, op,
                     "MIGraphX computes GroupQueryAttention on onnxruntime-genai's shared KV "
                     "buffer (past_present_share_buffer): past_key/past_value must be buffers "
                     "of the longest length, present keeps their length; a cache only as long "
                     "as the past (present = past + new tokens) gives other outputs", g.path)
        cn = self.profile.get("contrib_named_ops", {})
        if op in cn.get("ops", ()) and node.domain in ("", "ai.onnx") and self.opset >= 23:
            self.add(cn["severity"], "standard-op-read-as-contrib", label, op,
                     f"{op} (ONNX opset {self.opset}): {cn['reason']}{self.body_hint(node)}",
                     g.path)
            return
        if node.domain not in ("", "ai.onnx", "com.microsoft"):
            # The parser looks ops up by name only (src/onnx/onnx_parser.cpp:620): an
            # onnxruntime NCHWc Conv (blocked weights) would be read as a plain Conv.
            self.add("error", "foreign-domain", label, op,
                     f"{op} of domain '{node.domain}': MIGraphX ignores the domain and parses "
                     f"it as the standard {op}, whose semantics differ; rewrite the model "
                     f"without it (e.g. save from onnxruntime at the basic level)", g.path)
            return
        said = set()   # one finding per attribute (2.15 refuses not_larger by two rules)
        for rule in self.attribute_rules.get(op, ()):
            if rule["attribute"] in said:
                continue
            # optional keys: "if_input" (the rule holds only when that input is given),
            # "versions" (by_version entries, any of which must match) and "refused" "*"
            # (any value given explicitly is refused, its default included)
            at = rule.get("if_input")
            if at is not None and not (len(node.input) > at and node.input[at]):
                continue
            if "versions" in rule and not any(_version_matches(e, self.version)
                                              for e in rule["versions"]):
                continue
            given = any(a.name == rule["attribute"] for a in node.attribute)
            value = _attr(node, rule["attribute"], rule.get("default"))
            if isinstance(value, bytes):
                value = value.decode()
            if (given if rule["refused"] == "*" else value in rule["refused"]):
                said.add(rule["attribute"])
                self.add(rule["severity"], rule["code"], label, op,
                         f"{rule['attribute']}={value!r}: {rule['reason']}", g.path)
        for rule in self.constant_rules.get(op, ()):
            # optional "loop_body": the severity and reason inside a Loop's or Scan's body
            sev, why = ((rule["loop_body"]["severity"], rule["loop_body"]["reason"])
                        if g.in_loop and "loop_body" in rule else
                        (rule["severity"], rule["reason"]))
            for idx, what in rule["inputs"].items():
                i = int(idx)
                if i < len(node.input) and node.input[i] and not g.is_const(node.input[i]):
                    self.add(sev, "input-not-constant", label, op,
                             f"input {i} ({what}, '{node.input[i]}') is computed at run time: "
                             f"{why}", g.path)
        padded = self.profile.get("padded_outputs", {})
        rule = padded.get("ops", {}).get(op)
        if rule and not all(g.is_const(n) for n in node.input[:rule["inputs"]] if n):
            # a constant input is evaluated at parse time, to the exact size
            self.add(padded["severity"], "output-padded", label, op, rule["reason"], g.path)
        self.check_dtype_attrs(g, node)
        if op in INTEGER_OPS and "integer_ops" in self.profile:
            self.check_integer_op(g, node)
        ctp = self.profile.get("convtranspose_output_padding")
        if ctp and op == "ConvTranspose" and any(_attr(node, "output_padding", [])) \
                and any(_attr(node, "pads", [])):
            self.add(ctp["severity"], "convtranspose-output-padding", label, op,
                     f"output_padding {list(_attr(node, 'output_padding', []))} next to pads "
                     f"{list(_attr(node, 'pads', []))}: {ctp['reason']}", g.path)
        sp = self.profile.get("softplus_overflow")
        if sp and op == "Softplus" and not self.softplus_guarded(g, node, sp["finite_to"]):
            self.add(sp["severity"], "softplus-overflow", label, op, sp["reason"], g.path)
        ltc = self.profile.get("loop_trip_count")
        if ltc and op == "Loop" and not (node.input and node.input[0]):
            self.add(ltc["severity"], "loop-trip-count-unbounded", label, op,
                     f"no trip count: {ltc['absent_reason']}", g.path)
        elif ltc and op == "Loop":
            m = _value(g.tensor(node.input[0]))
            body = next((a.g for a in node.attribute if a.name == "body"), None)
            scans = len(body.output) - 1 - max(len(node.input) - 2, 0) if body else 0
            if m is not None and m.size == 1 and int(m.ravel()[0]) >= ltc["limit"] and scans:
                self.add(ltc["severity"], "loop-trip-count-unbounded", label, op,
                         f"trip count {int(m.ravel()[0])} and {scans} scan output"
                         f"{'s' if scans > 1 else ''}: {ltc['reason']}", g.path)
        rsi = self.profile.get("resize_strided_input")
        if rsi and op == "Resize" and node.input and node.input[0] \
                and any(_version_matches(e, self.version) for e in rsi["versions"]):
            p = g.producer.get(node.input[0])   # computed here, not by resize-inputs' Reshape
            while p is not None and p.op_type == "Cast" and p.input[0] in g.producer:
                p = g.producer[p.input[0]]        # convert-fp16's Cast keeps the layout
            if p is not None and p.op_type != "Reshape" and not g.is_const(node.input[0]):
                self.add(rsi["severity"], "resize-strided-input", label, op,
                         f"input '{node.input[0]}' computed by {p.op_type}: {rsi['reason']}",
                         g.path)
        qcb = self.profile.get("qlinear_conv_bias")
        if qcb and op == "QLinearConv" and len(node.input) > 8 and node.input[8]:
            self.add(qcb["severity"], "qlinear-conv-bias", label, op, qcb["reason"], g.path)

    def check_integer_op(self, g: _Graph, node: onnx.NodeProto) -> None:
        first = INTEGER_OPS[node.op_type]   # where the zero points are
        ins = list(node.input) + [""] * (first + 2 - len(node.input))
        types = [g.elem_type(n) for n in ins[:2]]
        if any(t not in (TensorProto.UINT8, TensorProto.INT8) for t in types):
            return
        dts = [np.dtype(np.uint8 if t == TensorProto.UINT8 else np.int8) for t in types]
        names = ins[first:first + 2]
        zps = [None if not n else (_value(g.tensor(n)) if g.is_const(n) else COMPUTED)
               for n in names]
        zps = [COMPUTED if n and z is None else z for n, z in zip(names, zps)]
        if integer_op_wrong(node.op_type, dts[0], dts[1], zps[0], zps[1]):
            r = self.profile["integer_ops"]
            form = ", ".join(f"{w} {d.name} zero point " + (
                "left out" if z is None else "computed" if isinstance(z, str) else
                f"{np.ravel(z)[:1].tolist()[0] if np.size(z) else '?'}")
                for w, d, z in zip(("A", "B"), dts, zps))
            why = r[{"MatMulInteger": "matmul_reason", "ConvInteger": "conv_reason"}.get(
                node.op_type, "to_float_reason")]
            self.add(r["severity"], "integer-zero-point", node_id(node), node.op_type,
                     f"{form}: {why}", g.path)

    @staticmethod
    def softplus_guarded(g: _Graph, node: onnx.NodeProto, finite_to: float) -> bool:
        """Is the Softplus read only by Where(Greater(x, t <= finite_to), x, it), the form
        default-attributes writes, or of float64 (finite far past 89)?"""
        x, y = node.input[0], node.output[0]
        t = g.types.get(x)
        if t is not None and t.tensor_type.elem_type == TensorProto.DOUBLE:
            return True
        readers = [n for n in g.graph.node if y in n.input] + [
            o for o in g.graph.output if o.name == y]
        w = readers[0] if len(readers) == 1 else None
        if not isinstance(w, onnx.NodeProto) or w.op_type != "Where" \
                or list(w.input[1:]) != [x, y]:
            return False
        c = g.producer.get(w.input[0])
        if c is None or c.op_type != "Greater" or c.input[0] != x:
            return False
        v = _value(g.tensor(c.input[1]))
        return v is not None and v.size == 1 and float(v.ravel()[0]) <= finite_to

    def check_dtype_attrs(self, g: _Graph, node: onnx.NodeProto) -> None:
        bad, codes = self.profile.get("refused_dtypes", {}), self.refused_codes
        for a in node.attribute:
            dtype = None
            if a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype", "output_dtype"):
                dtype = a.i
            elif a.type == onnx.AttributeProto.TENSOR:
                dtype = a.t.data_type
                self.check_packed_shape(g, a.t, node_id(node), node.op_type)
            if dtype in codes:
                self.add(bad["severity"], "unsupported-dtype", node_id(node), node.op_type,
                         f"attribute {a.name} is {codes[dtype]}: {bad['reason']}", g.path)

    def check_packed_shape(self, g: _Graph, t: TensorProto, label: str, op: str) -> None:
        """int4/uint4 tensors MIGraphX's parser refuses (an odd last dim) or dies on (0-d)."""
        r = self.profile.get("packed_int4", {})
        kind = r.get("codes", {}).get(str(t.data_type))
        if kind is None or (t.dims and t.dims[-1] % 2 == 0):
            return
        why = (f"0-d {kind} tensor '{t.name}': {r['scalar_reason']}" if not t.dims else
               f"{kind} tensor '{t.name}' of shape {list(t.dims)}: {r['odd_reason']}")
        self.add(r["severity"], "int4-tensor-shape", label, op, why, g.path)

    # -- QDQ ----------------------------------------------------------------------------------

    def rule(self, name: str) -> dict:
        """A qdq rule with its ``by_version`` entry for the target version applied."""
        base = dict(self.qdq[name])
        for entry in base.pop("by_version", []):
            if _version_matches(entry, self.version):
                base.update({k: v for k, v in entry.items() if k not in ("min", "max", "unknown")})
                break
        return base

    def _dq_source(self, g: _Graph, name: str, path: list | None = None
                   ) -> onnx.NodeProto | None:
        """The DequantizeLinear ``name`` comes from, through the ops simplify_qdq looks
        through; ``path`` collects the nodes passed on the way."""
        through = self.through
        seen = 0
        node = g.find_producer(name)
        while node is not None and seen < 16:
            if node.op_type == "DequantizeLinear":
                return node
            if node.op_type not in through or not node.input:
                return None
            if path is not None:
                path.append(node)
            node, seen = g.find_producer(node.input[0]), seen + 1
        return None

    def check_qdq(self, g: _Graph) -> None:
        q = self.qdq
        kernels = q["int8_kernels"]
        # Q/DQ that feed a conv/dot input: a [1] scale there throws instead of being odd.
        self.kernel_dqs: set[str] = set()
        if not g.has_qdq:
            return
        for node in g.graph.node:
            if node.op_type in kernels:
                for i in node.input[:2]:
                    dq = self._dq_source(g, i)
                    if dq is not None:
                        self.kernel_dqs.add(dq.output[0])
                        src = g.find_producer(dq.input[0])
                        if src is not None and src.op_type == "QuantizeLinear":
                            self.kernel_dqs.add(src.output[0])
        for node in g.graph.node:
            if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
                self.check_qdq_node(g, node)
        for node in g.graph.node:
            if node.op_type not in kernels or len(node.input) < 2:
                continue
            label = node_id(node)
            paths: list[list] = [[], []]
            a, b = (self._dq_source(g, node.input[i], paths[i]) for i in (0, 1))
            if (a is not None or b is not None) and not g.path:
                self.qdq_layers.append(label)
            hidden = [(i, self._hidden_dq(g, node.input[i])) for i, found in ((0, a), (1, b))
                      if found is None]
            hidden = [(i, ops) for i, ops in hidden if ops]
            for i, ops in hidden:
                r = q["not_looked_through"]
                self.add(r["severity"], "qdq-not-looked-through", label, node.op_type,
                         f"input {i} comes from a DequantizeLinear through {', '.join(ops)}: "
                         f"{r['reason']}", g.path)
                self.kernel_blockers.setdefault(label, []).append(
                    f"input {i} is dequantized behind {', '.join(ops)}")
            if hidden:
                continue
            if a is not None and b is None:
                if g.is_const(node.input[1]) and self._is_float(g, node.input[1]):
                    r = q["folded_weight"]
                    self.add(r["severity"], "qdq-weight-folded", label, node.op_type,
                             f"activation '{node.input[0]}' is dequantized but weight "
                             f"'{node.input[1]}' is a float constant: {r['reason']}", g.path)
                else:
                    r = q["half_quantized"]
                    self.add(r["severity"], "qdq-half-quantized", label, node.op_type,
                             f"input 1 '{node.input[1]}' does not come from DequantizeLinear: "
                             f"{r['reason']}", g.path)
            elif b is not None and a is None:
                r = q["half_quantized"]
                self.add(r["severity"], "qdq-half-quantized", label, node.op_type,
                         f"input 0 '{node.input[0]}' does not come from DequantizeLinear: "
                         f"{r['reason']}", g.path)
            if a is not None and b is not None:
                self.check_between(g, node, paths)
                if node.op_type == "Gemm" and float(_attr(node, "alpha", 1.0)) != 1.0:
                    r = q["gemm_alpha"]
                    self.add(r["severity"], "qdq-gemm-alpha", label, node.op_type,
                             f"alpha={_attr(node, 'alpha', 1.0):g}: {r['reason']}", g.path)
                    self.kernel_blockers.setdefault(label, []).append(
                        f"Gemm alpha={_attr(node, 'alpha', 1.0):g} puts a mul between DQ and dot")
            # Only a layer both of whose inputs are dequantized is matched by simplify_qdq:
            # a per-axis weight DQ beside a float activation does not throw on 2.16.
            if a is not None and b is not None and g.is_const(b.input[0]):
                self.check_weight_scale(g, node, b)

    def _hidden_dq(self, g: _Graph, name: str, depth: int = 4) -> list[str]:
        """The ops (not looked through) between ``name`` and a DequantizeLinear a few steps
        up its first inputs, or [] when there is none."""
        through = self.through
        ops: list[str] = []
        node = g.find_producer(name)
        while node is not None and len(ops) < depth and node.input:
            if node.op_type in self.qdq["int8_kernels"]:
                return []   # a DQ above another layer is that layer's input, not this one's
            if node.op_type == "DequantizeLinear":
                return ops if any(o.split(" ")[0] not in through for o in ops) else []
            ops.append(f"{node.op_type} '{node_id(node)}'")
            node = g.find_producer(node.input[0])
        return []

    def check_between(self, g: _Graph, node: onnx.NodeProto, paths: list[list]) -> None:
        """A Cast that keeps the type, between a DQ and the kernel, makes simplify_qdq throw."""
        for path in paths:
            for n in path:
                if n.op_type != "Cast":
                    continue
                src = g.elem_type(n.input[0])
                if src is not None and src == _attr(n, "to"):
                    r = self.qdq["noop_cast"]
                    self.add(r["severity"], "qdq-noop-cast", node_id(node), node.op_type,
                             f"Cast '{node_id(n)}' to the type it already has sits between a "
                             f"DequantizeLinear and this {node.op_type}: {r['reason']}", g.path)

    def _is_float(self, g: _Graph, name: str) -> bool:
        return g.elem_type(name) in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                     TensorProto.BFLOAT16, TensorProto.DOUBLE)

    def check_qdq_node(self, g: _Graph, node: onnx.NodeProto) -> None:
        q, label, op = self.qdq, node_id(node), node.op_type
        ins = list(node.input) + [""] * (3 - len(node.input))
        x, scale, zp = ins[0], ins[1], ins[2]
        blockers: list[str] = []

        def flag(rule: dict, code: str, message: str, blocks: bool = True) -> None:
            self.add(rule["severity"], code, label, op, f"{message}: {rule['reason']}", g.path)
            if blocks:
                blockers.append(f"{label}: {message}")

        # The quantized dtype: the zero point's, else Q's output_dtype (uint8 by default),
        # else the DequantizeLinear input's.
        if zp:
            qtype = g.elem_type(zp)
        elif op == "QuantizeLinear":
            qtype = _attr(node, "output_dtype", 0) or TensorProto.UINT8
        else:
            qtype = g.elem_type(x)
        dt = q["dtype"]
        if not zp and op == "DequantizeLinear":
            # simplify_qdq reads only the DQ's zero point: a Q may omit one when it writes int8.
            flag(q["require_zero_point"], "qdq-no-zero-point", "no zero-point input")
        name = TensorProto.DataType.Name(qtype) if qtype else "?"
        if qtype in dt["uint8"]:
            self.add(dt["uint8_severity"], "qdq-uint8", label, op,
                     f"quantized type is uint8: {dt['uint8_reason']}", g.path)
            blockers.append(f"{label}: uint8")
        elif (qtype and qtype not in dt["int8"]
              and not (op == "DequantizeLinear" and qtype in dt["dequantize_also_fine"])):
            self.add(dt["other_severity"], "qdq-not-int8", label, op,
                     f"quantized type is {name}: {dt['other_reason']}", g.path)
            blockers.append(f"{label}: {name}")
        for what, value_name, code in (("scale", scale, "qdq-scale-not-constant"),
                                       ("zero point", zp, "qdq-zero-point-not-constant")):
            if value_name and not g.is_const(value_name):
                flag(q["constant_scale"], code, f"{what} '{value_name}' is computed at run time")
        if scale and g.is_const(scale):
            t = g.tensor(scale)
            v = _value(t)
            if t is not None and v is None:
                self.add("info", "qdq-scale-not-checked", label, op,
                         f"scale '{scale}' is stored externally or large: its values were not read",
                         g.path)
            elif v is not None and np.any(v == 0):
                r = self.rule("positive_scale")
                flag(r, "qdq-scale-not-positive", f"scale '{scale}' has zeros",
                     blocks=r.get("blocks", True))
            elif v is not None and not (np.all(np.isfinite(v)) and np.all(v > 0)):
                flag(q["odd_scale"], "qdq-scale-not-positive",
                     f"scale '{scale}' has negative or non-finite values (min {np.min(v):g})",
                     blocks=False)
        if zp and g.is_const(zp) and qtype in dt["int8"]:
            v = _value(g.tensor(zp))
            if v is not None and np.any(v != 0):
                r = q["nonzero_zero_point"]
                self.add(r["severity"], "qdq-nonzero-zero-point", label, op,
                         f"zero point '{zp}' is not 0: {r['reason']}", g.path)
        self.check_qdq_shapes(g, node, x, scale, zp, flag)
        sd = g.dims(scale) if scale else None
        if sd is not None and int(np.prod(sd)) > 1 and not g.is_const(x):
            flag(q["per_channel_activation"], "qdq-per-channel-activation",
                 f"activation '{x}' has a per-channel scale of shape {sd}")
        if op == "DequantizeLinear":
            # An activation DQ inherits what is wrong with the Q feeding it.
            src = g.find_producer(x)
            if src is not None and src.op_type == "QuantizeLinear":
                blockers += self.dq_blockers.get(f"Q:{src.output[0]}", [])
            self.dq_blockers[node.output[0]] = blockers
        else:
            self.dq_blockers[f"Q:{node.output[0]}"] = blockers

    def check_qdq_shapes(self, g: _Graph, node, x: str, scale: str, zp: str, flag) -> None:
        """Shapes and types MIGraphX's parser and simplify_qdq refuse (all measured)."""
        q, op = self.qdq, node.op_type
        rank = q.get("per_tensor_rank", 0)
        feeds_kernel = node.output[0] in self.kernel_dqs
        for what, value_name in (("scale", scale), ("zero point", zp)):
            d = g.dims(value_name) if value_name else None
            if d == [1] and rank == 0:
                r = q["scale_shape_1"]
                if feeds_kernel:
                    flag(r, "qdq-scale-shape-1",
                         f"per-tensor {what} '{value_name}' has shape [1], not 0-d")
                else:
                    self.add(r["severity_elsewhere"], "qdq-scale-shape-1", node_id(node), op,
                             f"per-tensor {what} '{value_name}' has shape [1], not 0-d: "
                             f"{r['reason_elsewhere']}", g.path)
        sd, zd = (g.dims(scale) if scale else None), (g.dims(zp) if zp else None)
        # [1] beside 0-d parses and compiles on 2.15 and 2.16 (onnxruntime's quantize_static
        # writes it for int16 biases); a [1] on a conv/dot input is qdq-scale-shape-1's.
        if sd is not None and zd is not None and sd != zd and not (
                int(np.prod(sd)) == int(np.prod(zd)) == 1):
            flag(q["scale_zero_point_shape"], "qdq-scale-zero-point-shape",
                 f"scale '{scale}' has shape {sd}, zero point '{zp}' {zd}")
        block = _attr(node, "block_size", 0)
        if block and sd:
            axis = _attr(node, "axis", 1) % len(sd)
            if sd[axis] == 1:
                flag(q["blockwise_one_block"], "qdq-blockwise-one-block",
                     f"scale '{scale}' of shape {sd} has one block of {block} on axis {axis}")
        st, xt = (g.elem_type(scale) if scale else None), g.elem_type(x)
        r = q["scale_type"]
        if (op == "QuantizeLinear" and self.opset >= r["min_opset"] and st and xt
                and st != xt):
            flag(r, "qdq-scale-type", f"input '{x}' is {TensorProto.DataType.Name(xt)}, scale "
                 f"'{scale}' {TensorProto.DataType.Name(st)} at opset {self.opset}")
        zt = g.elem_type(zp) if zp else None
        if op == "DequantizeLinear" and zt and xt and zt != xt:
            flag(q["zero_point_type"], "qdq-zero-point-type",
                 f"input '{x}' is {TensorProto.DataType.Name(xt)}, zero point '{zp}' "
                 f"{TensorProto.DataType.Name(zt)}")

    def check_weight_scale(self, g: _Graph, node: onnx.NodeProto, dq: onnx.NodeProto) -> None:
        q, label = self.qdq, node_id(node)
        spec = q["weight_axis"].get(node.op_type)
        scale = dq.input[1] if len(dq.input) > 1 else ""
        sd = g.dims(scale) if scale else None
        if _attr(dq, "block_size", 0):
            r = q["blockwise_weight"]
            self.add(r["severity"], "qdq-blockwise-weight", label, node.op_type,
                     f"weight '{dq.input[0]}' is blockwise (block_size "
                     f"{_attr(dq, 'block_size', 0)}): {r['reason']}", g.path)
            self.kernel_blockers.setdefault(label, []).append(
                f"{node_id(dq)}: blockwise weight scales")
            return
        wd = g.dims(dq.input[0])
        if spec is None or sd is None or int(np.prod(sd)) <= 1:
            return
        rank = len(wd) if wd is not None else None
        want = spec["axis"]
        if node.op_type == "Gemm" and _attr(node, "transB", 0) and "axis_if_transB" in spec:
            want = spec["axis_if_transB"]
        axis = _attr(dq, "axis", 1)
        if rank:
            want, axis = want % rank, axis % rank
        if axis != want:
            r = q["weight_axis"]
            self.add(r["severity"], "qdq-weight-axis", label, node.op_type,
                     f"weight '{dq.input[0]}' is per-channel on axis {axis}, expected {want}: "
                     f"{r['reason']}", g.path)
            self.dq_blockers.setdefault(dq.output[0], []).append(
                f"{node_id(dq)}: per-channel weight axis {axis}")
        r = self.rule("per_channel_weights")
        grouped = node.op_type == "Conv" and _attr(node, "group", 1) > 1
        kind = "grouped/depthwise conv" if grouped else node.op_type
        self.add(r["severity"], "qdq-per-channel-weight", label, node.op_type,
                 f"{kind} with per-axis weight scales ({sd[0] if sd else '?'}): "
                 f"{r['reason']}", g.path)

    # -- main-graph checks --------------------------------------------------------------------

    def example(self, name: str, dims: list) -> list:
        """Dims for a suggested --input-shape: the caller's example (sizes known to run)
        when it fits the declared dims; else 1 for a leading batch and a placeholder such as
        ``{height}`` in the other symbolic dims, for the user to replace: any number here
        would be a guess (1 is what MIGraphX silently takes, ``image:1x1x1x3`` was the
        advice), and one that --input-shape accepted would compile at that guess. A dim a
        layer's weight fixes is that size (a conv's channels: ``pixel_values:1x3x{height}``,
        not ``{num_channels}``)."""
        ex = self.examples.get(name)
        if ex is not None and len(ex) == len(dims) and all(
                not (isinstance(d, int) and d > 0) or d == e for d, e in zip(dims, ex)):
            return ex
        if self.fixed_dims is None:
            from rewriter.verify.feeds import weight_dims
            try:
                self.fixed_dims = weight_dims(self.model)
            except Exception:   # advice only: no sizes rather than no check
                self.fixed_dims = {}
        fixed = self.fixed_dims.get(name, {})
        out = []
        for i, d in enumerate(dims):
            if isinstance(d, int) and d > 0:
                out.append(d)
            elif i in fixed:
                out.append(fixed[i])
            elif i == 0 and len(dims) > 1:
                out.append(1)
            else:
                word = re.sub(r"\W", "_", d) if isinstance(d, str) else ""
                ok = re.fullmatch(r"[A-Za-z]\w{0,11}", word) and "x" not in word.lower()
                out.append("{" + (word if ok else f"d{i}") + "}")
        return out

    def check_inputs(self, g: _Graph) -> None:
        from rewriter.verify.feeds import given_dims

        dd = self.profile.get("dynamic_dims", {})
        inits = set(g.inits)
        names, nameless = set(), False
        for vi in g.graph.input:
            if vi.name in inits:
                continue   # old-IR models list weights as inputs too
            names.add(vi.name)
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is None:
                continue
            dims = ([d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in tt.shape.dim] if tt.HasField("shape") else None)
            given = self.input_shapes.get(vi.name) if dims is None else given_dims(
                self.input_shapes, vi.name, len(dims))   # a shape without a name: its rank's
            nameless |= given is not None and vi.name not in self.input_shapes
            if given is not None:
                if dims is not None and (len(given) != len(dims) or any(
                        isinstance(d, int) and d > 0 and d != v for d, v in zip(dims, given))):
                    self.add("warning", "input-shape-mismatch", vi.name, "graph input",
                             f"--input-shape {given} does not match the model's {dims}")
                continue
            if dims is None:
                self.add(dd.get("severity", "warning"), "dynamic-input-dim", vi.name,
                         "graph input", f"rank unknown: {dd.get('note', '')}; pass --input-shape")
                continue
            bad = [i for i, d in enumerate(dims) if not isinstance(d, int) or d <= 0]
            shown = "x".join(str(d) for d in dims)
            if bad and all(dims[i] == 0 for i in bad):
                self.add(dd.get("severity", "warning"), "dynamic-input-dim", vi.name,
                         "graph input",
                         f"dims {shown}: position(s) {bad} are declared 0 (an empty input), "
                         f"which MIGraphX reads as symbolic and silently sets to "
                         f"{dd.get('silent_value', 1)}: it cannot run this input empty")
            elif bad:
                self.add(dd.get("severity", "warning"), "dynamic-input-dim", vi.name,
                         "graph input",
                         f"dims {shown}: position(s) {bad} are symbolic and MIGraphX silently "
                         f"uses {dd.get('silent_value', 1)}; pass e.g. --input-shape "
                         f"{vi.name}:{'x'.join(str(d) for d in self.example(vi.name, dims))}"
                         f" with your sizes at position(s) {bad}")
        for name in sorted(set(self.input_shapes) - names - ({""} if nameless else set())):
            dims = "x".join(map(str, self.input_shapes[name]))
            self.add("warning", "input-shape-unknown-input", name, "graph input",
                     f"--input-shape names '{name}', which is not a graph input "
                     f"(inputs: {sorted(names)})" if name else
                     f"--input-shape {dims} (no name) fits no graph input of its rank "
                     f"(inputs: {sorted(names)}): it is not used")
        self.check_channels(g)

    def check_channels(self, g: _Graph) -> None:
        lay = self.profile["layout"]
        m = int(lay.get("channel_multiple", 0) or 0)
        if m <= 1:
            return
        for node in g.graph.node:
            if node.op_type != "Conv" or len(node.input) < 2:
                continue
            w = node.input[1]
            dq = self._dq_source(g, w)
            wd = g.dims(w) or (g.dims(dq.input[0]) if dq is not None else None)
            if not wd or len(wd) < 2:
                continue
            c_out, c_in_g = wd[0], wd[1]
            off = []
            if c_in_g > 1 and c_in_g % m:
                off.append(f"C_in per group {c_in_g}")
            if c_out % m:
                off.append(f"C_out {c_out}")
            if off:
                self.add(lay.get("severity", "info"), "conv-channels-not-multiple", node_id(node),
                         "Conv", f"{' and '.join(off)} not a multiple of {m}: {lay['note']}",
                         g.path)

    def check_plan(self, g: _Graph, names: list[str]) -> None:
        if not names:
            return
        kernels = self.qdq["int8_kernels"]
        by_label = {node_id(n): n for n in g.graph.node}
        by_label.update({n.name: n for n in g.graph.node if n.name})
        for name in names:
            node = by_label.get(name)
            if node is None:
                self.add("warning", "plan-node-not-found", name, "",
                         "the plan puts this node in INT8 but the model has no such node")
                continue
            if node.op_type not in kernels:
                self.add("warning", "plan-int8-stays-float", name, node.op_type,
                         f"the plan puts a {node.op_type} in INT8; MIGraphX makes int8 kernels "
                         f"only for {sorted(kernels)}")
                continue
            reasons = []
            for i in (0, 1):
                dq = self._dq_source(g, node.input[i]) if i < len(node.input) else None
                if dq is None:
                    reasons.append(f"input {i} '{node.input[i] if i < len(node.input) else ''}'"
                                   f" is not dequantized")
                else:
                    reasons += self.dq_blockers.get(dq.output[0], [])
            reasons += self.kernel_blockers.get(name, [])
            if reasons:
                self.add("warning", "plan-int8-stays-float", name, node.op_type,
                         f"the plan puts it in INT8 but it will not become "
                         f"{kernels[node.op_type]} (runs in float): {'; '.join(reasons)}")
