"""Write docs/cli.md from the CLI's own --help (tests/test_docs.py checks it is current).

    python tools/gen_cli_docs.py            # write it
    python tools/gen_cli_docs.py --check    # exit 1 when it is stale, write nothing
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "cli.md"


def _help(argv: list[str]) -> str:
    from rewriter.cli import main

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: fix it for a stable doc
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(argv)
    return buf.getvalue().rstrip()


def render() -> str:
    return f"""# CLI reference

Generated from `--help` by `python tools/gen_cli_docs.py`; `tests/test_docs.py` fails when
it is stale.

## rewrite

```
{_help(["--help"])}
```

## rewrite plan

```
{_help(["plan", "--help"])}
```

## rewrite check

```
{_help(["check", "--help"])}
```

## rewrite advise

```
{_help(["advise", "--help"])}
```

See also [profiling on ROCm](profiling-rocm.md).

Exit codes: 0 ok; 1 verification failed (in onnxruntime: nothing is written; in the
MIGraphX step, which runs on the written output: the output stays), `check` found errors, or
`plan --strict` could not certify its budget; 2 bad input or usage, or a MIGraphX failure
the original model has too (refused, or computed as far off); 3 an internal error in a
pass; 130 interrupted (Ctrl-C); 141 stdout was closed (`| head`).
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale")
    a = p.parse_args()
    text = render()
    if a.check:
        stale = not DOC.exists() or DOC.read_text() != text
        print(f"{DOC} is {'stale' if stale else 'current'}")
        return int(stale)
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
