"""Our streaming writer vs onnx-ir's save, on the same rewritten model, in one process.

    pip install onnx-ir
    python tools/bench_writer.py /tmp/big/big_convbn.onnx --out /tmp/writer [--rounds 3]

Runs the default pipeline once (as ``rewrite SRC -o OUT --target none`` does), keeps the
exported model (big weights as stubs plus the numpy arrays / memory-mapped input data behind
them), then saves that same model alternately with ``rewriter.core.save.save_model`` and
with ``onnx_ir.save`` (initializers wrapped as ``onnx_ir.Tensor`` without copying, untouched
ones left as onnx-ir ExternalTensors on the input's data file), ``sync`` before each save,
the order alternating per round, each save to a fresh path; medians over the rounds.
Per save: wall seconds and the RSS the save added (peak sampled every 5 ms minus before).
Both outputs are checked: ``onnx.checker`` by path, and every initializer byte-identical.
The generated 2.5 GB model comes from tools/make_big_model.py (--gb 2.5).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import psutil


class _Peak:
    """Wall time and the RSS peak (sampled) of a block."""

    def __enter__(self):
        self.p = psutil.Process()
        self.before = self.peak = self.p.memory_info().rss
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._sample, daemon=True)
        self.t.start()
        self.t0 = time.perf_counter()
        return self

    def _sample(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.p.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
        self.stop.set()
        self.t.join()
        self.added_mb = (self.peak - self.before) / 1e6


def exported_of(src: str):
    """The Exported the CLI would save for ``src`` (default pipeline, no target step)."""
    import rewriter.api as api

    captured = {}

    def keep(exp, path, external=None, before_commit=None):
        if before_commit is not None:
            before_commit()   # the exit gate's last check, as in a real save
        captured["exp"] = exp
        return [str(path)]

    real, api.save_model = api.save_model, keep
    try:
        api.rewrite(src, output=os.devnull + ".onnx", materialize=False)
    finally:
        api.save_model = real
    return captured["exp"]


def to_onnx_ir(exp):
    import onnx_ir as ir
    from onnx_ir import external_data

    from rewriter.core.convert import raw_bytes

    model = ir.serde.deserialize_model(exp.model)
    external_data.set_base_dir(model.graph, str(exp.source_dir))
    for name, v in model.graph.initializers.items():
        if name not in exp.weights:
            continue
        w, t = exp.weights[name], v.const_value
        arr = (np.ascontiguousarray(w) if isinstance(w, np.ndarray) else
               np.frombuffer(raw_bytes(w), dtype=t.dtype.numpy()).reshape(
                   [int(d) for d in t.shape]))
        v.const_value = ir.Tensor(arr, dtype=t.dtype, name=name)
    return model


def same_weights(a: Path, b: Path) -> bool:
    ma = onnx.load(str(a))
    mb = {t.name: t for t in onnx.load(str(b)).graph.initializer}
    return all(np.array_equal(onnx.numpy_helper.to_array(t),
                              onnx.numpy_helper.to_array(mb[t.name]))
               for t in ma.graph.initializer)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--out", required=True, help="folder for the outputs")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import onnx_ir as ir

    from rewriter.core.convert import EXTERNAL_THRESHOLD
    from rewriter.core.save import save_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exp = exported_of(args.model)
    rows = {"ours": [], "onnx-ir": []}
    for r in range(args.rounds):
        # Alternate who goes first (the first save of a round meets whatever state the
        # page cache is in); each save writes to a path that does not exist (no
        # truncation or unlink of an old 2.5 GB output inside the timing).
        for writer in (list(rows) if r % 2 == 0 else list(rows)[::-1]):
            path = out / f"{writer}.onnx"
            for old in (path, out / f"{writer}.onnx.data"):
                if old.exists():
                    old.unlink()
            subprocess.run(["sync"])
            with _Peak() as m:
                if writer == "ours":
                    save_model(exp, path)
                else:
                    ir.save(to_onnx_ir(exp), path, external_data=path.name + ".data",
                            size_threshold_bytes=EXTERNAL_THRESHOLD)
            rows[writer].append({"seconds": round(m.seconds, 2),
                                 "rss_added_mb": round(m.added_mb, 1)})
            print(writer, rows[writer][-1], flush=True)
    for writer in rows:
        onnx.checker.check_model(str(out / f"{writer}.onnx"))
    identical = same_weights(out / "ours.onnx", out / "onnx-ir.onnx")
    import statistics
    summary = {w: {"median_s": statistics.median(x["seconds"] for x in v),
                   "min_s": min(x["seconds"] for x in v), "max_s": max(x["seconds"] for x in v),
                   "max_rss_added_mb": max(x["rss_added_mb"] for x in v)}
               for w, v in rows.items()}
    print(json.dumps({"onnx_ir": ir.__version__, "rounds": rows, "summary": summary,
                      "weights_identical": identical}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
