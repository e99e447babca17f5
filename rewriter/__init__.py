"""rewrite: an ONNX graph-rewriting front-end for AMD's MIGraphX.

    import rewriter
    model, report = rewriter.rewrite("model.onnx", verify=True)

Importing this package is cheap: onnx, onnxruntime and the passes load only when used.
The errors ``rewriter.rewrite`` raises (``InputError`` and its ``PreconditionError``,
``PassError``, ``VerificationError``, all ``RewriteError``) are reachable from here too.

Layout (docs/architecture.md): ``core`` (load, convert, save, graph utilities, the pass
contract, registry, manager, report, onnxruntime), ``passes`` (one module per pass),
``verify``, ``quant`` (plans, calibration, planner), ``migraphx`` (profile, static check,
backends, lowering, compile-and-compare), ``advise``; ``api`` and ``cli`` are the two doors.
"""

__version__ = "0.1.0"

__all__ = ["rewrite", "RewriteError", "InputError", "PreconditionError", "PassError",
           "VerificationError", "__version__"]

_ERRORS = ("RewriteError", "InputError", "PassError", "VerificationError", "PreconditionError")


def __getattr__(name):
    # Lazy, so that `import rewriter` does not pull in onnx, graphsurgeon or onnxruntime.
    if name == "rewrite":
        from rewriter.api import rewrite
        return rewrite
    if name in _ERRORS:
        from rewriter.core import errors
        return getattr(errors, name)
    raise AttributeError(f"module 'rewriter' has no attribute {name!r}")


def __dir__():
    # What help() and tab completion show: the lazy names too.
    return sorted({*globals(), *__all__})
