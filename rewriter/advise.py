"""``rewrite advise PROFILE [--model opt.onnx]``: read a GPU profile of a MIGraphX run, advise.

Input formats (PROFILE is one CSV file or a directory searched recursively; files are
recognised by name and header, so ``-o``/``-d`` prefixes and ``pmc_N/`` subfolders are fine):

rocprofv3 (ROCprofiler-SDK), written with ``--output-format csv`` (rocpd ``.db`` is the
default from ROCm 7.0; ``rocpd convert -i X_results.db --output-format csv`` turns it into CSV)
  ``*kernel_stats.csv``        (``--kernel-trace --stats``) Name, Calls, TotalDurationNs,
                               AverageNs, Percentage, MinNs, MaxNs, StdDev
  ``*kernel_trace.csv``        (``--kernel-trace``) one row per dispatch: Kernel_Name,
                               Start_Timestamp, End_Timestamp, Dispatch_Id, ...
  ``*counter_collection.csv``  (``--pmc ...``) one row per dispatch *and counter*:
                               Dispatch_Id, Kernel_Name, Counter_Name, Counter_Value,
                               Start_Timestamp, End_Timestamp, ...
legacy rocprof (v1)
  ``<out>.stats.csv``          (``--stats``) Name, Calls, TotalDurationNs, AverageNs, Percentage
  ``<out>.csv``                (``-i input.txt``) one row per dispatch: Index, KernelName,
                               gpu-id, ..., then one column per requested counter, then
                               DispatchNs, BeginNs, EndNs, CompleteNs (with timestamps on)
Column names are matched ignoring case, ``_``, ``-`` and spaces, with a few known aliases
(KernelName / Kernel_Name, BeginNs / Start_Timestamp, ...). A missing column, an empty or
truncated file, or a non-number where a number belongs is a :class:`ProfileError`: one line.

The decision tree (thresholds are options; the counters behind each number are named in the
output, and a missing counter is reported with the rocprofv3 command that collects it, never
guessed)::

    VALU busy < 60%  -> fusion    (the vector ALUs idle: launch/elementwise overhead, unfused
                                   activations, standalone quantize kernels)
    else SQ wait > 30% -> memory  (waves stall waiting to issue: layout, alignment, bandwidth)
    else             -> quantize  (compute-bound and busy: fewer bits per MAC is what is left)

VALU busy is the derived counter ``VALUBusy`` (rocprofv3 and legacy rocprof both define it:
100 * SQ_ACTIVE_INST_VALU / CU_NUM / GRBM_GUI_ACTIVE on gfx942), averaged over dispatches
weighted by duration. SQ wait is 100 * sum(SQ_WAIT_INST_ANY) / sum(SQ_WAVE_CYCLES): the share
of wave lifetime spent waiting to issue an instruction (both counters are in the same
wave-cycle units).

Kernel names: MIGraphX names each compiled kernel after the ops fused into it, e.g.
``mlir_convolution_add_relu`` (rocMLIR conv + bias + ReLU), ``mlir_quant_convolution_...``
(an INT8 conv), ``add_relu_kernel`` (a JIT pointwise kernel), ``quantizelinear_kernel`` (a
standalone quantize that did not fuse). Convolutions MIGraphX hands to MIOpen and GEMMs it
hands to rocBLAS/hipBLASLt carry those libraries' names (``igemm_fwd_...``, ``Cijk_...``).
The names carry op *types*, not ONNX node names, so with ``--model`` a kernel is matched to
the nodes whose pattern it can be (e.g. Conv nodes followed by Relu), not to one node.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import sys
import traceback
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rewriter.errors import InputError


class ProfileError(InputError):
    """Unusable profiler or model input; the message is the one line the user sees (exit 2)."""


# --------------------------------------------------------------------------- reading CSVs

def _key(column: str) -> str:
    return re.sub(r"[^a-z0-9]", "", column.lower())


# Accepted spellings of each column role, as _key() sees them. Both profilers and their
# versions differ only in spelling here (Kernel_Name / KernelName, Start_Timestamp / BeginNs).
_ROLES = {
    "name": ("name", "kernelname"),
    "kernel": ("kernelname",),
    "calls": ("calls", "count", "numcalls"),
    "total": ("totaldurationns", "totalduration", "totalns", "totaldurationnanoseconds"),
    "start": ("starttimestamp", "beginns", "begintimestamp", "startns"),
    "end": ("endtimestamp", "endns", "stoptimestamp", "stopns"),
    "counter": ("countername",),
    "value": ("countervalue",),
    "dispatch": ("dispatchid", "index", "correlationid"),
}
_SHOWN = {  # what an error message says the file should have had
    "name": "Name or KernelName", "kernel": "Kernel_Name or KernelName",
    "total": "TotalDurationNs", "start": "Start_Timestamp or BeginNs",
    "end": "End_Timestamp or EndNs", "counter": "Counter_Name", "value": "Counter_Value",
}


def _find(header: list[str], role: str) -> str | None:
    keys = {_key(h): h for h in header}
    return next((keys[k] for k in _ROLES[role] if k in keys), None)


def _need(path: Path, header: list[str], role: str) -> str:
    col = _find(header, role)
    if col is None:
        raise ProfileError(f"{path}: no {_SHOWN[role]} column (header: {', '.join(header)})")
    return col


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows; every way a file can be unusable becomes one ProfileError line."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ProfileError(f"{path}: not a text CSV file (not UTF-8)") from None
    except OSError as e:
        raise ProfileError(f"{path}: cannot read: {e.strerror or e}") from None
    if not text.strip():
        raise ProfileError(f"{path}: file is empty")
    reader = csv.reader(io.StringIO(text), strict=True)
    rows: list[tuple[int, list[str]]] = []
    try:
        for row in reader:
            # legacy rocprof writes a blank line after the header: skip blank lines anywhere
            if any(cell.strip() for cell in row):
                rows.append((reader.line_num, [cell.strip() for cell in row]))
    except csv.Error as e:
        raise ProfileError(
            f"{path}: malformed CSV at line {reader.line_num} ({e}); the file looks truncated"
        ) from None
    header = rows[0][1]
    if len(rows) == 1:
        raise ProfileError(f"{path}: has a header but no data rows")
    for line, row in rows[1:]:
        if len(row) != len(header):
            raise ProfileError(
                f"{path}: line {line} has {len(row)} fields but the header has {len(header)}; "
                "the file looks truncated or edited"
            )
    return header, [dict(zip(header, row), _line=str(line)) for line, row in rows[1:]]


def _num(path: Path, row: dict[str, str], col: str) -> float:
    try:
        return float(row[col])
    except ValueError:
        raise ProfileError(
            f"{path}: line {row['_line']}, column {col}: {row[col]!r} is not a number"
        ) from None


def clean_kernel_name(raw: str) -> str:
    """The kernel's base name: no argument list, no legacy ``.kd`` / ``[clone .kd]`` suffix."""
    name = raw.strip().strip('"')
    name = re.sub(r"\s*\[clone \.kd\]$", "", name)
    name = re.sub(r"\.kd$", "", name)
    name = re.sub(r"^void\s+", "", name)
    if "(" in name and not name.startswith("("):
        name = name[: name.index("(")]
    return name.strip()


# Counters taken from the per-dispatch columns of a legacy results.csv: the derived metrics by
# name and raw hardware counters by block prefix. Everything else there (grd, wgr, sgpr, sig...)
# describes the launch, not the hardware.
_DERIVED = {"VALUBusy", "VALUUtilization", "SALUBusy", "MemUnitBusy", "MemUnitStalled",
            "L2CacheHit", "GPUBusy", "Wavefronts", "WriteUnitStalled", "ALUStalledByLDS",
            "LDSBankConflict", "FetchSize", "WriteSize"}
_RAW_COUNTER = re.compile(r"^(SQ|SQC|TCC|TCP|TA|TD|GRBM|SPI|CPC|CPF|GL2C)_[A-Z0-9_]+(\[\d+\])?$")


@dataclass
class _Dispatch:
    kernel: str
    duration_ns: float | None
    counters: dict[str, float]


@dataclass
class _Profile:
    files: list[dict] = field(default_factory=list)       # {"path", "kind"}
    stats: list[tuple[str, int, float]] = field(default_factory=list)   # name, calls, ns
    traced: list[_Dispatch] = field(default_factory=list)     # from trace / legacy csv
    counted: list[_Dispatch] = field(default_factory=list)    # from counter_collection
    notes: list[str] = field(default_factory=list)


_KIND_FORMAT = {"v3-stats": "rocprofv3", "v3-trace": "rocprofv3", "v3-counters": "rocprofv3",
                "v1-stats": "rocprof (legacy)", "v1-dispatch": "rocprof (legacy)"}


def _classify(path: Path, header: list[str]) -> str | None:
    name = path.name.lower()
    if name.endswith("kernel_stats.csv"):
        return "v3-stats"
    if name.endswith(".stats.csv"):  # legacy <out>.stats.csv; not hip_stats/copy_stats
        return "v1-stats"
    if _find(header, "counter") and _find(header, "value"):
        return "v3-counters"
    if "KernelName" in header:  # legacy spelling; rocprofv3 writes Kernel_Name
        return "v1-dispatch"
    if _find(header, "kernel") and _find(header, "start") and _find(header, "end"):
        return "v3-trace"
    return None


def _duration(path: Path, header: list[str], row: dict[str, str]) -> float | None:
    start, end = _find(header, "start"), _find(header, "end")
    if not (start and end):
        return None
    return max(0.0, _num(path, row, end) - _num(path, row, start))


def _load_file(path: Path, kind: str, header: list[str], rows: list[dict], prof: _Profile):
    if kind in ("v3-stats", "v1-stats"):
        name, total = _need(path, header, "name"), _need(path, header, "total")
        calls = _find(header, "calls")
        for r in rows:
            n = int(_num(path, r, calls)) if calls else 1
            prof.stats.append((clean_kernel_name(r[name]), n, _num(path, r, total)))
    elif kind in ("v3-trace", "v1-dispatch"):
        name = _need(path, header, "kernel" if kind == "v3-trace" else "name")
        counter_cols = [h for h in header if h in _DERIVED or _RAW_COUNTER.match(h)]
        for r in rows:
            counters = {c: _num(path, r, c) for c in counter_cols}
            prof.traced.append(_Dispatch(clean_kernel_name(r[name]),
                                         _duration(path, header, r), counters))
    else:  # v3-counters: long format, one row per (dispatch, counter)
        name = _need(path, header, "kernel")
        cname, cvalue = _need(path, header, "counter"), _need(path, header, "value")
        did = _find(header, "dispatch")
        start, end = _find(header, "start"), _find(header, "end")
        by_dispatch: dict[tuple, _Dispatch] = {}
        seen: Counter = Counter()
        for r in rows:
            key = (r[did],) if did else (r[name], r.get(start), r.get(end))
            d = by_dispatch.setdefault(
                key, _Dispatch(clean_kernel_name(r[name]), _duration(path, header, r), {}))
            c, v = r[cname], _num(path, r, cvalue)
            seen[key, c] += 1
            # One row per counter is what the docs show. Should a counter come as several
            # rows (one per instance), raw counts add up; a derived percentage is averaged.
            if c not in d.counters or _RAW_COUNTER.match(c):
                d.counters[c] = d.counters.get(c, 0.0) + v
            else:
                d.counters[c] += (v - d.counters[c]) / seen[key, c]
        prof.counted.extend(by_dispatch.values())


_OTHER_OUTPUTS = re.compile(r"agent_info|api_trace|api_stats|domain_stats|memory_copy|"
                            r"memory_allocation|scratch_memory|hip_stats|hsa_stats|copy_stats")
_OURS = re.compile(r"kernel_stats|kernel_trace|counter_collection|\.stats\.csv$|^results", re.I)


def load_profile(path: str | Path) -> _Profile:
    """Parse every recognised profiler CSV at ``path`` (a file, or a directory searched
    recursively). Raises ProfileError when nothing usable is there."""
    root = Path(path)
    if not root.exists():
        raise ProfileError(f"{root}: no such file or directory")
    prof = _Profile()
    if root.is_file():
        header, rows = _read_csv(root)
        kind = _classify(root, header)
        if kind is None:
            raise ProfileError(
                f"{root}: not a recognised profiler CSV (expected a rocprofv3 kernel_stats/"
                "kernel_trace/counter_collection CSV or a legacy rocprof results.csv/.stats.csv)")
        _load_file(root, kind, header, rows, prof)
        prof.files.append({"path": str(root), "kind": kind})
        return prof
    for f in sorted(root.rglob("*.csv")):
        # rocprofv3's and rocprof's other outputs (API traces can be huge): not read at all
        if _OTHER_OUTPUTS.search(f.name):
            continue
        try:
            header, rows = _read_csv(f)
        except ProfileError as e:
            if _OURS.search(f.name):  # a broken kernel CSV is an error...
                raise
            prof.notes.append(f"skipped {e}")  # ...a broken unrelated CSV is not
            continue
        kind = _classify(f, header)
        if kind is not None:
            _load_file(f, kind, header, rows, prof)
            prof.files.append({"path": str(f), "kind": kind})
    if not prof.files:
        dbs = sorted(root.rglob("*.db"))
        hint = (f"; found a rocpd database ({dbs[0].name}): convert it with "
                f"`rocpd convert -i {dbs[0]} --output-format csv`, or profile with "
                "`--output-format csv`") if dbs else ""
        raise ProfileError(
            f"{root}: no rocprofv3 (*kernel_stats.csv, *kernel_trace.csv, "
            f"*counter_collection.csv) or legacy rocprof (results.csv, results.stats.csv) "
            f"files found{hint}")
    return prof


# --------------------------------------------------------------------------- kernel names

_ACTIVATION_TOKENS = {"relu": "Relu", "clip": "Clip", "sigmoid": "Sigmoid", "tanh": "Tanh",
                      "leaky": "LeakyRelu", "elu": "Elu", "erf": "Gelu", "gelu": "Gelu",
                      "hardswish": "HardSwish", "hardsigmoid": "HardSigmoid"}
_ACTIVATION_OPS = set(_ACTIVATION_TOKENS.values()) | {"PRelu", "Selu", "Softplus", "Mish"}
# MIOpen kernels: miopenSp3AsmConv_*, igemm_fwd_*, naive_conv_fwd_*, MIOpenConvUni,
# gridwise_convolution_implicit_gemm_*, Im2Col ... ("conv" but not "convert")
_MIOPEN_CONV = re.compile(r"miopen|igemm|winograd|im2col|conv(?!ert)", re.I)


@dataclass
class KernelClass:
    """What a kernel name says: ``kind`` is one of mlir-conv, mlir-dot, mlir-other, jit-conv,
    qdq, pointwise, layout, convert, miopen-conv, batchnorm, blas-gemm, other."""

    kind: str
    ops: list[str]
    precision: str | None  # "int8", "float" (FP32/FP16 cannot be told apart by name), None
    activation: str | None  # ONNX op type of a fused / contained activation


def classify_kernel(raw_name: str) -> KernelClass:
    name = clean_kernel_name(raw_name)
    low = name.lower()
    tokens = low.split("_")
    act = next((_ACTIVATION_TOKENS[t] for t in tokens if t in _ACTIVATION_TOKENS), None)
    if low.startswith("mlir_"):
        ops = tokens[1:]
        kind = ("mlir-conv" if "convolution" in ops else "mlir-dot" if "dot" in ops
                else "mlir-other")
        precision = None
        if kind != "mlir-other":  # quant_convolution / quant_dot are the INT8 forms
            precision = "int8" if "quant" in ops else "float"
        return KernelClass(kind, ops, precision, act)
    if low.endswith("_kernel"):  # MIGraphX JIT kernels: <op>_<op>_kernel
        ops = tokens[:-1]
        if "conv" in ops:
            return KernelClass("jit-conv", ops, "float", act)
        if "quantizelinear" in ops or "dequantizelinear" in ops:
            return KernelClass("qdq", ops, None, act)
        if ops and ops[0] in ("contiguous", "transpose", "layout"):
            return KernelClass("layout", ops, None, None)
        if ops == ["convert"]:
            return KernelClass("convert", ops, None, None)
        return KernelClass("pointwise", ops, None, act)
    if "batchnorm" in low or "bnfwd" in low:
        return KernelClass("batchnorm", [], None, None)
    if low.startswith(("cijk_", "rocblas", "hipblaslt")):  # Tensile / rocBLAS / hipBLASLt GEMM
        return KernelClass("blas-gemm", [], None, None)
    if _MIOPEN_CONV.search(name):
        return KernelClass("miopen-conv", [], None, None)
    return KernelClass("other", [], None, act)


# --------------------------------------------------------------------------- the model

def _model_facts(path: str | Path) -> dict:
    """Counts and per-Conv facts from the ONNX graph (top level; weights are not loaded)."""
    try:
        import onnx
    except ImportError:
        raise ProfileError("--model needs the onnx package (pip install onnx)") from None
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"{p}: model not found")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf raises several unrelated types for a corrupt file
        raise ProfileError(f"{p}: cannot read as ONNX ({type(e).__name__}: {e})") from None
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    inits = {t.name: t for t in g.initializer}

    def label(n) -> str:  # node names may be empty in ONNX: fall back to the output tensor
        return n.name or n.output[0]

    def followers(n, hops=0) -> list:
        # what consumes the conv's result, looking through a bias Add, a BatchNorm and a
        # Q->DQ pair, which is how far MIGraphX looks when it fuses a conv's epilogue
        out = []
        for c in consumers[n.output[0]]:
            out.append(c)
            if hops < 3 and c.op_type in ("Add", "BatchNormalization", "QuantizeLinear",
                                          "DequantizeLinear"):
                out += followers(c, hops + 1)
        return out

    def weight_dims(name: str) -> list[int] | None:
        if name in inits:
            return list(inits[name].dims)
        src = producer.get(name)  # int8 initializer -> DequantizeLinear -> Conv
        if src is not None and src.op_type == "DequantizeLinear" and src.input[0] in inits:
            return list(inits[src.input[0]].dims)
        return None

    convs, matmuls = [], []
    for n in g.node:
        int8 = len(n.input) >= 2 and all(
            producer.get(i) is not None and producer[i].op_type == "DequantizeLinear"
            for i in n.input[:2])
        if n.op_type in ("MatMul", "Gemm"):
            matmuls.append({"node": label(n), "int8": int8})
        if n.op_type != "Conv":
            continue
        after = followers(n)
        ops_after = [c.op_type for c in after]
        act = next((o for o in ops_after if o in _ACTIVATION_OPS), None)
        qdq_before_act = act is not None and "QuantizeLinear" in ops_after[: ops_after.index(act)]
        dims = weight_dims(n.input[1]) if len(n.input) > 1 else None
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        k, c = (dims[0], dims[1] * group) if dims and len(dims) >= 2 else (None, None)
        convs.append({"node": label(n), "activation": act, "int8": int8,
                      "batchnorm_after": "BatchNormalization" in ops_after,
                      "qdq_between_conv_and_activation": qdq_before_act,
                      "in_channels": c, "out_channels": k,
                      "unaligned": bool(k and c and (k % 4 or c % 4))})
    ops = Counter(n.op_type for n in g.node)
    return {"path": str(p), "ops": dict(ops), "convs": convs, "matmuls": matmuls,
            "labels": {label(n): n.op_type for n in g.node}}  # labels: internal, not printed


def _match_nodes(name: str, kc: KernelClass, facts: dict) -> list[str]:
    """ONNX nodes this kernel can stand for (by op pattern; exact only if names coincide)."""
    if name in facts["labels"]:
        return [name]
    if kc.kind in ("mlir-conv", "jit-conv"):
        return [c["node"] for c in facts["convs"]
                if c["activation"] == kc.activation and c["int8"] == (kc.precision == "int8")]
    if kc.kind == "mlir-dot":
        return [m["node"] for m in facts["matmuls"] if m["int8"] == (kc.precision == "int8")]
    if kc.kind == "qdq":
        return [c["node"] for c in facts["convs"] if c["qdq_between_conv_and_activation"]]
    if kc.kind == "batchnorm":
        return [n for n, op in facts["labels"].items() if op == "BatchNormalization"]
    if kc.kind == "pointwise" and kc.activation:
        return [n for n, op in facts["labels"].items() if op == kc.activation]
    return []


# --------------------------------------------------------------------------- the tree

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
    unaligned = [c for c in convs if c["unaligned"]]
    if unaligned:
        sample = ", ".join(f"{c['node']} ({c['in_channels']}->{c['out_channels']})"
                           for c in unaligned[:3])
        steps.append(Step("memory", (
            f"{len(unaligned)} Conv have channel counts that are not a multiple of 4 "
            f"({sample}): try `pad-channels --pad-multiple 4` and measure; MIGraphX no longer "
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
                      "alignment (`pad-channels --pad-multiple 4`, measured); rerun advise "
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
    print(json.dumps(adv.to_dict(), indent=2) if args.json else adv.render_text(args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
