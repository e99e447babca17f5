"""Progress bars: one tqdm bar on stderr for long work (calibration, sensitivity, GPTQ
rounding, MIGraphX samples), shown only on a terminal and only when asked."""
from __future__ import annotations

import sys


def progress_bar(progress: bool, **kw):
    """A tqdm bar on stderr when ``progress`` and stderr is a terminal; else a stand-in
    that does nothing (a disabled tqdm still starts tqdm's monitor thread, left running
    in an API caller's process)."""
    stream = sys.stderr
    if not (progress and hasattr(stream, "isatty") and stream.isatty()):
        return _NoBar(kw.get("iterable", ()))
    from tqdm.auto import tqdm
    return tqdm(file=stream, leave=False, **kw)


class _NoBar:
    """What the code calls on a bar, doing nothing; iterates its iterable."""

    def __init__(self, iterable=()):
        self.iterable = iterable

    def __iter__(self):
        return iter(self.iterable)

    def update(self, n=1):
        pass

    def set_postfix_str(self, s=""):
        pass

    def close(self):
        pass
