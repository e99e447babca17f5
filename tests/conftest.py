"""Shared test helpers: models from ONNX text with distinct seeded weights, and runners.

Identical weights hide wiring bugs (two swapped inputs give the same numbers), so every
initializer gets its own seeded random values.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

ONNX_DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
ROOT = Path(__file__).resolve().parents[1]
# Trained models fetched by tools/fetch_models.py
CACHE_MODELS = Path(os.environ.get("REWRITE_MODELS", Path.home() / ".cache" / "rewrite" / "models"))


def load_script(rel: str):
    """Import a script by path: models/ and tools/ are folders of scripts, not packages."""
    path = ROOT / rel
    name = "_rewrite_" + path.stem
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def seconds_to_interrupt(fn, *args, after: float = 0.5, ready=None) -> float:
    """How long ``fn(*args)`` takes to raise KeyboardInterrupt after another thread calls
    ``_thread.interrupt_main`` (how a toolchain cancels a call: no signal reaches this
    thread) ``after`` seconds in, or ``after`` seconds after ``ready()`` first holds (polled
    for up to 60 s: on a loaded machine a child can take longer than ``after`` to start).
    Python's own SIGINT handler is installed for the call: interrupt_main does nothing where
    SIGINT is ignored, as in a job that a non-interactive shell starts in the background."""
    import _thread
    import signal
    import threading
    import time

    def interrupt():
        end = time.monotonic() + 60
        while ready is not None and not ready() and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(after)
        sent.append(time.perf_counter())
        _thread.interrupt_main()

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread, sent = threading.Thread(target=interrupt, daemon=True), []
    try:
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            fn(*args)
    finally:
        thread.join()
        signal.signal(signal.SIGINT, before)
    return time.perf_counter() - sent[0]


def make_model(text: str, inits: dict | None = None, seed: int = 0) -> onnx.ModelProto:
    """Parse ONNX text; turn the named graph inputs into initializers with random values.

    ``inits`` maps a name to a shape (N(0,1) values), to ("pos", shape) for positive
    values (BN variances), or to an explicit array.
    """
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    inits = inits or {}
    for name, spec in inits.items():
        if isinstance(spec, np.ndarray):
            arr = spec
        elif isinstance(spec, tuple) and spec and spec[0] == "pos":
            arr = rng.uniform(0.5, 2.0, size=spec[1]).astype(np.float32)
        else:
            arr = rng.standard_normal(spec).astype(np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(arr, name))
    keep = [i for i in model.graph.input if i.name not in inits]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    onnx.checker.check_model(model)
    return model


def bodies_model(path, rng) -> None:
    """MatMul -> If (a MatMul named "mm" in each branch, as two branches exported from one
    module are) -> Loop (a MatMul whose weight the main graph's MatMul shares) -> Neg;
    inputs x [2, 4] and the If's condition c."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    def w(name):
        return nh.from_array((rng.standard_normal((4, 4)) * 0.5).astype(np.float32), name)

    def branch(k, act):
        y = h.make_tensor_value_info(f"y{k}", T.FLOAT, None)
        return h.make_graph([h.make_node("MatMul", ["a", f"w{k}"], [f"m{k}"], "mm"),
                             h.make_node(act, [f"m{k}"], [f"y{k}"])],
                            f"b{k}", [], [y], [w(f"w{k}")])
    body = h.make_graph(
        [h.make_node("MatMul", ["s", "w"], ["sm"], "loop_mm"), h.make_node("Tanh", ["sm"], ["s2"]),
         h.make_node("Identity", ["lc"], ["c2"])],
        "body", [h.make_tensor_value_info("i", T.INT64, []),
                 h.make_tensor_value_info("lc", T.BOOL, []),
                 h.make_tensor_value_info("s", T.FLOAT, [2, 4])],
        [h.make_tensor_value_info("c2", T.BOOL, []),
         h.make_tensor_value_info("s2", T.FLOAT, [2, 4])])
    g = h.make_graph(
        [h.make_node("MatMul", ["x", "w"], ["a"], "first"),
         h.make_node("If", ["c"], ["o"], "branch", then_branch=branch(0, "Relu"),
                     else_branch=branch(1, "Sigmoid")),
         h.make_node("Loop", ["n", "", "o"], ["z"], "loop", body=body),
         h.make_node("Neg", ["z"], ["out"])],
        "g", [h.make_tensor_value_info("x", T.FLOAT, [2, 4]),
              h.make_tensor_value_info("c", T.BOOL, [])],
        [h.make_tensor_value_info("out", T.FLOAT, [2, 4])],
        [w("w"), nh.from_array(np.array(3, np.int64), "n")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(m, full_check=True)
    onnx.save(m, path)


def run_ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    from rewriter.core import ort

    return ort.run(ort.session(model), feeds)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# -- MIGraphX ---------------------------------------------------------------------------------
# CI (.ci/run) installs the shared MIGraphX builds and sets REWRITE_REQUIRE_MIGRAPHX=1: there
# a `migraphx` test that skips (migraphx not importable, driver missing) is a failure, never
# a quiet pass. Elsewhere they skip with the reason.
REQUIRE_MIGRAPHX = os.environ.get("REWRITE_REQUIRE_MIGRAPHX") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_MIGRAPHX and report.skipped and item.get_closest_marker("migraphx"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"REWRITE_REQUIRE_MIGRAPHX=1 but this MIGraphX test skipped: "
                           f"{reason}")


@pytest.fixture(scope="session")
def migraphx_version():
    """The importable MIGraphX's (major, minor, patch); skips where it does not import."""
    pytest.importorskip("migraphx", reason="MIGraphX is not installed (not on PyPI/Debian)")
    from rewriter.migraphx.lowering import installed_version

    return installed_version()


@pytest.fixture(scope="session")
def migraphx_driver(migraphx_version):
    """migraphx-driver of the importable MIGraphX (same version); skips where missing."""
    from rewriter.migraphx.lowering import driver_version, find_driver

    driver = find_driver()
    if driver is None:
        pytest.skip("migraphx-driver not found beside the migraphx module or on PATH")
    assert driver_version(driver)[:2] == migraphx_version[:2], "driver and module differ"
    return driver


def gap_head():
    """Conv -> GlobalAveragePool -> Flatten: a classifier's [N, 4] without a softmax or a
    linear layer (SqueezeNet's head), a class output only where its argmax is decisive."""
    return make_model("""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[N,3,8,8] x) => (float[N,4] y) {
      w = Constant<value = float[4,3,1,1] {1,-2,3,-4,5,-6,7,-8,9,-10,11,-12}>()
      c = Conv(x, w)
      p = GlobalAveragePool(c)
      y = Flatten(p)
    }""")
