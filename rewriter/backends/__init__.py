"""Execution backends: onnxruntime (default, embedded) and MIGraphX (optional, lazy)."""
