"""Regenerate the op-list part of rewriter/migraphx/data/migraphx_profile.json from an onnx_ops.txt.

onnx_ops.txt is the list of op names MIGraphX's ONNX parser registers (one per line, read
from src/onnx/parse_*.cpp; ``migraphx.get_onnx_operators()`` prints the same list), with an
optional trailing comment ``# source: <repo>/src/onnx/parse_*.cpp at commit <sha>``.

    python tools/make_migraphx_profile.py /path/to/onnx_ops.txt            # rewrite the JSON
    python tools/make_migraphx_profile.py /path/to/onnx_ops.txt --check    # exit 1 if stale

Only ``onnx_ops``, ``source.ops_commit`` and ``onnx_standard_ops_not_parsed`` (the
standard-domain ops of the installed onnx that the list lacks; informational) are written.
Everything else in the profile (partial-support rules, QDQ rules, versions) is edited by
hand from PROFILE.md, so a newer MIGraphX is a data change: a new onnx_ops.txt, this
script, and the rules that changed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PROFILE = REPO / "rewriter" / "migraphx" / "data" / "migraphx_profile.json"


def read_ops(path: str | Path) -> tuple[list[str], str | None]:
    """The sorted op names in an onnx_ops.txt, and the commit named in its comment (if any)."""
    ops, commit = set(), None
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = re.search(r"commit\s+([0-9a-fA-F]{7,40})", line)
            commit = m.group(1) if m else commit
            continue
        ops.add(line.split()[0])
    return sorted(ops), commit


def standard_ops_not_parsed(ops: list[str]) -> tuple[list[str], str]:
    """Standard-domain ONNX ops (any opset of the installed onnx) missing from ``ops``."""
    import onnx
    import onnx.defs

    std = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ""}
    return sorted(std - set(ops)), onnx.__version__


def update(profile: dict, ops: list[str], commit: str | None) -> dict:
    out = dict(profile)
    out["onnx_ops"] = ops
    if commit:
        out["source"] = dict(out.get("source", {}), ops_commit=commit)
    missing, onnx_version = standard_ops_not_parsed(ops)
    out["onnx_standard_ops_not_parsed"] = {"onnx_version": onnx_version, "ops": missing}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ops_file", help="onnx_ops.txt: one ONNX op name per line")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE), help="profile JSON to update")
    ap.add_argument("--check", action="store_true",
                    help="do not write; exit 1 if the profile's op list differs from the file")
    args = ap.parse_args(argv)

    ops, commit = read_ops(args.ops_file)
    profile = json.loads(Path(args.profile).read_text())
    old = set(profile.get("onnx_ops", []))
    added, removed = sorted(set(ops) - old), sorted(old - set(ops))
    print(f"{len(ops)} ops in {args.ops_file}"
          + (f" (commit {commit})" if commit else "")
          + f"; added {added or 'none'}; removed {removed or 'none'}")
    if args.check:
        # Only the op list is compared: the 'not parsed' list depends on the installed onnx.
        stale = bool(added or removed) or (
            commit is not None and profile.get("source", {}).get("ops_commit") != commit)
        if stale:
            print(f"{args.profile} is stale: run without --check to regenerate")
        return 1 if stale else 0
    text = json.dumps(update(profile, ops, commit), indent=2) + "\n"
    Path(args.profile).write_text(text)
    print(f"wrote {args.profile}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
