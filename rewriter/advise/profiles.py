"""Reading rocprof/rocprofv3 CSV output (see rewriter.advise for the formats)."""

from __future__ import annotations

import csv
import io
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rewriter.core.errors import InputError


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


def _num(path: Path, row: dict[str, str], col: str, finite: bool = True) -> float:
    """The number in ``row[col]``; ``finite``: a time or a count, where an inf or a NaN
    made every share NaN (a derived counter's nan is no error: the metrics skip it)."""
    try:
        v = float(row[col])
    except ValueError:
        raise ProfileError(
            f"{path}: line {row['_line']}, column {col}: {row[col]!r} is not a number"
        ) from None
    if finite and not math.isfinite(v):
        raise ProfileError(
            f"{path}: line {row['_line']}, column {col}: {row[col]!r} is not a finite number")
    return v


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
            counters = {c: _num(path, r, c, finite=False) for c in counter_cols}
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
            c, v = r[cname], _num(path, r, cvalue, finite=False)
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
