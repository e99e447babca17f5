"""onnxruntime on the CPU: the embedded backend for verification, calibration and benchmarks.

It only loads and runs a model and hands back arrays; comparison lives in rewriter.verify.
Graph optimisations are disabled by default, so what is measured is the model as written,
not what onnxruntime would have rewritten it into.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np


def session(model, base_dir: str | os.PathLike | None = None, optimize: bool = False,
            threads: int = 0, providers: Sequence[str] = ("CPUExecutionProvider",)):
    """An InferenceSession for a ModelProto, serialized bytes or a path.

    ``base_dir`` resolves external data referenced by an in-memory model.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if base_dir is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                    str(base_dir))
    if hasattr(model, "SerializeToString"):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = str(model)
    return ort.InferenceSession(model, so, providers=list(providers))


def run(sess, feeds: dict[str, np.ndarray], output_names: Sequence[str] | None = None
        ) -> list[np.ndarray]:
    return sess.run(list(output_names) if output_names else None, feeds)
