"""Write docs/cli.md from the CLI's own --help (tests/test_docs.py checks it is current).

    python tools/gen_cli_docs.py
"""

from __future__ import annotations

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

## rewrite check

```
{_help(["check", "--help"])}
```

## rewrite advise

```
{_help(["advise", "--help"])}
```

See also [profiling on ROCm](profiling-rocm.md).

Exit codes: 0 ok, 1 verification failed (or `check` found errors), 2 bad input or usage,
3 an internal error in a pass.
"""


if __name__ == "__main__":
    DOC.write_text(render())
    print(f"wrote {DOC}")
    sys.exit(0)
