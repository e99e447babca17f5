"""rewrite: an ONNX graph-rewriting front-end for AMD's MIGraphX.

    import rewriter
    model, report = rewriter.rewrite("model.onnx", verify=True)

Importing this package is cheap: onnxruntime and the passes load only when used.
"""

__version__ = "0.1.0"

__all__ = ["rewrite", "__version__"]


def __getattr__(name):
    # Lazy, so that `import rewriter` does not pull in onnx, graphsurgeon or onnxruntime.
    if name == "rewrite":
        from .api import rewrite
        return rewrite
    raise AttributeError(f"module 'rewriter' has no attribute {name!r}")
