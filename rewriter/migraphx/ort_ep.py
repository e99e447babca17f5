"""ONNX Runtime's MIGraphX execution provider: the other route to MIGraphX.

onnxruntime can hand a model to MIGraphX through ``MIGraphXExecutionProvider`` (options such
as ``device_id``, ``migraphx_fp16_enable``, ``migraphx_int8_enable`` and
``migraphx_save_compiled_model`` go in ``provider_options``). Its known failure is silence:
nodes the EP does not take, or the whole session, quietly run on the CPU (#2203, #5058).
So :func:`run` refuses both: it sets ``session.disable_cpu_ep_fallback`` (session creation
fails if any node would go to the CPU) and checks that the session kept the MIGraphX EP.

Graph optimisations are off by default: onnxruntime's optimiser can write contrib ops that
MIGraphX does not take (#2756, #2778), and the point is to run the model as written.
"""

from __future__ import annotations

import os
from typing import Mapping

import numpy as np

PROVIDER = "MIGraphXExecutionProvider"


def available() -> tuple[bool, str]:
    """(True, description) when this onnxruntime has the MIGraphX EP, else (False, why not)."""
    try:
        import onnxruntime as ort
    except Exception as e:
        return False, f"onnxruntime is not importable: {type(e).__name__}: {e}"
    providers = ort.get_available_providers()
    if PROVIDER in providers:
        return True, f"onnxruntime {ort.__version__} with {PROVIDER}"
    return False, (f"onnxruntime {ort.__version__} has no {PROVIDER} (it has {providers}); "
                   f"it needs an onnxruntime build with the MIGraphX execution provider (ROCm)")


def run(model_path: str | os.PathLike, feeds: dict[str, np.ndarray],
        provider_options: Mapping[str, object] | None = None,
        optimize: bool = False) -> list[np.ndarray]:
    """Run ``model_path`` on the MIGraphX EP only; outputs in graph-output order."""
    ok, reason = available()
    if not ok:
        raise RuntimeError(reason)
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    options = {k: str(v) for k, v in (provider_options or {}).items()}
    try:
        sess = ort.InferenceSession(os.fspath(model_path), so, providers=[(PROVIDER, options)])
    except Exception as e:
        raise RuntimeError(f"{PROVIDER} did not take the whole model (CPU fallback is "
                           f"disabled on purpose): {type(e).__name__}: {e}") from e
    if PROVIDER not in sess.get_providers():
        raise RuntimeError(f"the session fell back to {sess.get_providers()}, not {PROVIDER}")
    return sess.run(None, dict(feeds))
