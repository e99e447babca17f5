"""The compile step: hand the rewritten model to MIGraphX and check what it made of it.

Where ``import migraphx`` works: parse the saved output with the user's input dims (MIGraphX
turns a symbolic dim into 1 silently otherwise), compile for ``gpu`` (or the ``ref`` CPU
reference target), run on the same inputs as the onnxruntime reference of the ORIGINAL
model, and report the same error metrics plus the compiled program's op histogram: how many
convolutions/matmuls became ``quant_convolution``/``quant_dot`` versus how many INT8 layers
the plan asked for. ONNX Runtime's MIGraphX execution provider is a second route
(``backend="ort-migraphx"``).

Where it does not: nothing is faked. The report says that compilation was skipped and why;
the static check (rewriter.check) has already said what MIGraphX would refuse or run in
float. ``require=True`` turns the skip into an error.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import InputError
from .pass_base import Numerics


class BackendUnavailable(InputError):
    """The requested backend is not installed and the user required it (exit 2)."""


def compile_and_compare(output_path: str | os.PathLike, reference_path: str | os.PathLike,
                        feeds: dict[str, np.ndarray], input_shapes: dict[str, list[int]],
                        numerics: Numerics, *, backend: str = "migraphx",
                        device: str = "gpu", save_mxr: str | None = None,
                        require: bool = False, int8_requested: int = 0,
                        lossy: dict | None = None) -> dict[str, Any]:
    """Compile ``output_path`` on the backend and compare it with the original in onnxruntime.

    Returns a JSON-able dict: status ("compiled" | "skipped"), reason, metrics, op histogram,
    kernel counts, and a warning when fewer layers run in int8 than the plan asked.
    """
    if backend == "migraphx":
        from .backends import migraphx as be
    elif backend == "ort-migraphx":
        from .backends import ort_migraphx as be
    else:
        raise InputError(f"unknown backend '{backend}' (migraphx, ort-migraphx)")
    ok, why = be.available()
    if not ok:
        if require:
            raise BackendUnavailable(f"{backend} is required but not available: {why}")
        return {"backend": backend, "status": "skipped",
                "reason": f"compilation skipped: {why}"}

    from .backends import ort
    from .verify import compare, judge

    shapes = {k: list(v) for k, v in (input_shapes or {}).items() if k}
    reference = ort.run(ort.session(str(reference_path)), feeds)
    info: dict[str, Any] = {"backend": backend, "status": "compiled", "version": why}
    if backend == "migraphx":
        run = be.compile_and_run(output_path, feeds, input_shapes=shapes or None, target=device,
                                 save_mxr=save_mxr)
        outputs = run.outputs
        info.update(device=device, op_histogram=run.op_histogram,
                    kernel_counts=run.kernel_counts, compile_seconds=run.compile_seconds,
                    run_seconds=run.run_seconds, input_dims=run.input_dims)
        got = run.kernel_counts.get("quant_convolution", 0) + run.kernel_counts.get("quant_dot", 0)
        info["int8_requested"], info["int8_compiled"] = int8_requested, got
        if device == "gpu" and got < int8_requested:
            info["warning"] = (f"the plan puts {int8_requested} layers in INT8 but MIGraphX "
                               f"compiled {got} quant_convolution/quant_dot: the rest run in "
                               "float (see the static check's qdq findings for the nodes)")
    else:
        outputs = be.run(output_path, feeds)
    metrics = []
    for vi_name, r, o in zip(_names(reference_path), reference, outputs):
        m = compare(vi_name, r, np.asarray(o))
        m.ok = m.ok and judge(m, numerics, 2, lossy)
        metrics.append(m.to_dict())
    info["metrics"] = metrics
    info["ok"] = all(m["ok"] for m in metrics)
    return info


def _names(path) -> list[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def render(info: dict[str, Any]) -> str:
    if info["status"] != "compiled":
        return f"{info['backend']}: {info['reason']}"
    lines = [f"{info['backend']} ({info.get('version', '')}, {info.get('device', '')}):"]
    kc = info.get("kernel_counts")
    if kc:
        lines.append("  compiled: " + ", ".join(f"{k} {v}" for k, v in sorted(kc.items())))
    for m in info["metrics"]:
        lines.append(f"  {m['name']}: max_abs {m['max_abs']:.2e} max_rel {m['max_rel']:.2e} "
                     f"cosine {m['cosine']:.6f} {'ok' if m['ok'] else 'NOT OK'}")
    if "warning" in info:
        lines.append(f"  warning: {info['warning']}")
    return "\n".join(lines)
