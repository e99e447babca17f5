"""onnxruntime on the CPU: the embedded backend for verification, calibration and benchmarks.

It only loads and runs a model and hands back arrays; comparison lives in rewriter.verify.
Graph optimisations are disabled by default, so what is measured is the model as written,
not what onnxruntime would have rewritten it into.
"""

from __future__ import annotations

import functools
import os
from typing import Sequence

import numpy as np


def session(model, base_dir: str | os.PathLike | None = None, optimize: bool = False,
            threads: int = 0, providers: Sequence[str] = ("CPUExecutionProvider",),
            initializers: tuple[list[str], list[np.ndarray]] | None = None,
            custom_ops: bool | None = None):
    """An InferenceSession for a ModelProto, serialized bytes or a path.

    ``base_dir`` resolves external data referenced by an in-memory model;
    ``initializers`` (names, arrays) supplies weights the model holds as stubs, without
    copying them through protobuf. ``custom_ops``: whether onnxruntime-extensions' ops
    are registered; None: for a ModelProto, when :func:`needs_custom_ops`, else always.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.log_severity_level = 4  # our error line carries the message; no ORT log spam
    # Spinning worker threads burn the other core between the many tiny runs that
    # verification makes on this kind of 2-core machine.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        so.intra_op_num_threads = threads
    if base_dir is not None:
        so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                    str(base_dir))
    keep = None
    if initializers is not None and initializers[0]:
        keep = [_ort_value(ort, a) for a in initializers[1]]
        so.add_external_initializers(list(initializers[0]), keep)
    if custom_ops or custom_ops is None and (not hasattr(model, "SerializeToString")
                                             or needs_custom_ops(model)):
        _custom_ops(so)
    outputs = None
    if hasattr(model, "SerializeToString"):
        model, outputs = _float16_honoured(scan_states_computed(model))
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = str(model)
    sess = ort.InferenceSession(model, so, providers=list(providers))
    sess._rewrite_keepalive = keep  # the OrtValues must outlive the session
    sess._rewrite_outputs = outputs  # the model's own outputs (run asks for these)
    return sess


def require_qdq(opset: int, ir_version: int) -> None:
    """InputError when onnxruntime, which calibrates and verifies INT8 layers, has no
    QuantizeLinear/DequantizeLinear kernel at ``opset``: a fuzzed model at opset 28 was
    exit 3 ('pass insert-qdq failed', or the planner's internal error), exit 2 only when
    bias correction met it first."""
    problem = qdq_unsupported(opset, ir_version)
    if problem:
        import onnxruntime

        from rewriter.core.errors import InputError
        raise InputError(f"onnxruntime {onnxruntime.__version__} cannot run QuantizeLinear/"
                         f"DequantizeLinear at the model's opset {opset} ({problem[:120]}): "
                         "INT8 layers cannot be calibrated; --plan fp16, or the model at "
                         "an older opset")


@functools.lru_cache(maxsize=None)
def qdq_unsupported(opset: int, ir_version: int) -> str | None:
    """None when onnxruntime runs QuantizeLinear -> DequantizeLinear at ``opset``, else
    its error's first line: onnx knows opsets onnxruntime has no kernel for yet (opset 28
    with onnx 1.23 and onnxruntime 1.32: QuantizeLinear(28) is not implemented)."""
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [1.0]),
         helper.make_tensor("z", TensorProto.INT8, [], [0])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          ir_version=ir_version)
    try:
        session(m)
    except Exception as e:  # noqa: BLE001 - whatever onnxruntime says, in one line
        return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return None


def _ort_value(ort, a: np.ndarray):
    """An OrtValue of ``a``; ml_dtypes' bfloat16 and float8 arrays (numpy dtype kind V,
    which ortvalue_from_numpy refuses) as their bits with the ONNX type."""
    if a.dtype.kind != "V":
        return ort.OrtValue.ortvalue_from_numpy(a)
    import onnx

    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
        a.view(f"u{a.dtype.itemsize}"), onnx.helper.np_dtype_to_tensor_dtype(a.dtype))


def _scan_states(model):
    """(body, the body outputs that are states, the body input names) of every Scan."""
    from rewriter.core.graph import graph_protos

    for g in graph_protos(model.graph):
        for n in g.node:
            body = next((a.g for a in n.attribute if a.name == "body"), None)
            if n.op_type != "Scan" or n.domain not in ("", "ai.onnx") or body is None:
                continue
            m = next((a.i for a in n.attribute if a.name == "num_scan_inputs"), 0)
            yield (n, body, body.output[:max(len(n.input) - m, 0)],
                   {i.name for i in body.input})


def scan_pass_through(model) -> list[str]:
    """The Scan states whose body returns its state input unchanged (body output = body
    input, no node between), as 'scan node: state'. onnxruntime computes such a state
    wrongly: zeros or stale memory instead of the value, while MIGraphX and onnx's
    reference evaluator carry it (measured, tests/verify/test_scan_pass_through.py)."""
    return [f"{n.name or n.output[0]}: {o.name}" for n, _, states, names in _scan_states(model)
            for o in states if o.name in names]


def scan_states_computed(model):
    """``model`` (a copy when anything changes) with an Identity computing every Scan state
    that its body passes through unchanged (:func:`scan_pass_through`), which onnxruntime
    then computes right; what the model computes does not change."""
    if not scan_pass_through(model):
        return model
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    for _, body, states, names in _scan_states(out):
        taken = names | {t for b in body.node for t in b.output}
        for o in states:
            if o.name not in names:
                continue
            new = o.name + "_carried"
            while new in taken:
                new += "_"
            taken.add(new)
            body.node.append(onnx.helper.make_node("Identity", [o.name], [new]))
            o.name = new
    return out


def _float16_honoured(model):
    """(model, its own output names or None): where convert-fp16 made float16 regions,
    every float16 value of the main graph reaches its readers through two Identities.
    onnxruntime's CPU has no float16 kernel for Conv, MatMul and most ops: it runs a run of
    such ops in float32 with a Cast only at the run's ends, and drops each float32 ->
    float16 -> float32 pair of Casts, so a region computed in float32 from end to end: an
    overflow to inf never showed (MobileOne: MIGraphX NaN, --verify ok), and FP16 errors
    were too small (ResNet-18: 3.9e-4 against MIGraphX's 1.3e-2; eleventh round). Making
    the values graph outputs, the first remedy, kept the Casts that wrote those outputs but
    not the rounding their readers saw (onnxruntime 1.32: a region's entry Cast -> Conv
    read the unrounded float32 input, and a Conv -> Conv pair ran without a Cast between
    them). Identity has a float16 kernel, so every float16 value is stored as float16
    between two ops, rounded (and overflowing) as float16 storage does on the GPU; which
    op sits between the entry Cast and a Conv (a Transpose an exact pass moved there, the
    twenty-first round) then no longer changes the arithmetic. Two Identities, because
    onnxruntime runs a lone float16 op between two float32 ones in float32 too.
    The same inside If/Loop/Scan bodies, whose regions convert-fp16 writes too (a Loop's
    LSTM MatMuls in float16 verified exactly equal to float32: the rounding never ran), a
    body's float16 values being its own Casts' and those of the main graph it reads."""
    import onnx

    from rewriter.core.graph import graph_protos

    if not has_float16_region(model):
        return model, None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    graphs = list(graph_protos(m.graph))          # outermost first
    taken = {t.name for g in graphs for t in g.initializer}
    taken |= {x for g in graphs for n in g.node for x in list(n.output) + list(n.input)}
    taken |= {i.name for g in graphs for i in g.input}
    outer: set[str] = set()
    halves = []
    for g in graphs:
        fp16 = _float16_entries(g) | outer
        for n in g.node:   # exported graphs are in topological order
            if n.op_type == "Cast" or n.op_type in ("QuantizeLinear", "DequantizeLinear"):
                continue
            if any(i in fp16 for i in n.input):
                fp16.update(o for o in n.output if o)
        if g is graphs[0]:
            outer = set(fp16)
        halves.append(fp16)
    # Innermost first: a graph's nodes are copied when it is rewritten, its bodies with them.
    for g, fp16 in reversed(list(zip(graphs, halves))):
        stored, nodes = {}, []
        for n in g.node:
            for k, i in enumerate(n.input):
                if i in fp16:
                    if i not in stored:
                        name, j = f"{i}__fp16_stored", 0
                        while name in taken or name + "_" in taken:
                            j += 1
                            name = f"{i}__fp16_stored{j}"
                        taken.update((name, name + "_"))
                        stored[i] = name
                        nodes += [onnx.helper.make_node("Identity", [i], [name + "_"]),
                                  onnx.helper.make_node("Identity", [name + "_"], [name])]
                    n.input[k] = stored[i]
            nodes.append(n)
        del g.node[:]
        g.node.extend(nodes)
    return m, [o.name for o in model.graph.output]


def _float16_entries(g) -> set[str]:
    """The outputs of a graph's own Casts to float16: where its float16 regions start."""
    import onnx

    half = onnx.TensorProto.FLOAT16
    return {n.output[0] for n in g.node if n.op_type == "Cast" and any(
        a.name == "to" and a.i == half for a in n.attribute)}


def has_float16_region(model) -> bool:
    """Whether a session of ``model`` from its file would skip the float16 rounding that a
    session of the ModelProto keeps (_float16_honoured): a Cast to float16 in any graph."""
    from rewriter.core.graph import graph_protos

    return any(_float16_entries(g) for g in graph_protos(model.graph))


# The domains onnxruntime implements itself.
_OWN_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "ai.onnx.training",
                          "ai.onnx.preview.training"})


def needs_custom_ops(model) -> bool:
    """Whether ``model`` (a ModelProto) declares an opset domain beyond onnxruntime's own
    (a node's domain must be declared): only then are the extensions' ops registered.
    Loading their library cost the exit gate's onnxruntime load 7-9 MB of RSS at the
    run's peak (chain4000: 219-222 MiB with it, 208-214 without, 5 runs each)."""
    return any(o.domain not in _OWN_DOMAINS for o in model.opset_import) or any(
        o.domain not in _OWN_DOMAINS for f in model.functions for o in f.opset_import)


def _custom_ops(so) -> None:
    """onnxruntime-extensions' ops (ai.onnx.contrib: tokenizers, string ops, image codecs)
    where that package is installed: models that carry their tokenizer in the graph then
    run, so they can be verified and calibrated like any other."""
    path = _extensions_library()
    if path is None:
        return
    try:
        so.register_custom_ops_library(path)
    except Exception:  # noqa: BLE001 - built for another onnxruntime: a model that needs
        return         # its ops then fails to load, and says which op


@functools.lru_cache(maxsize=1)
def _extensions_library() -> str | None:
    """The library's path, looked up once: a failed import is not cached by Python, and
    sessions are made many times per run (verification, calibration).

    Found beside the package, as its ``get_library_path`` gives it (the file of its
    ``_extensions_pydll`` module), without importing the package: its import (transformers
    and tokenizer converters probed) took 0.06-0.13 s of every rewrite, in the exit gate's
    thread; the import only where the file is not found there."""
    import importlib.machinery
    import importlib.util

    try:
        spec = importlib.util.find_spec("onnxruntime_extensions")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    for folder in spec.submodule_search_locations or ():
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_extensions_pydll" + suffix)
            if os.path.isfile(path):
                return path
    try:
        from onnxruntime_extensions import get_library_path
        return get_library_path()
    except Exception:  # noqa: BLE001 - broken
        return None


def run(sess, feeds: dict[str, np.ndarray], output_names: Sequence[str] | None = None
        ) -> list[np.ndarray]:
    """The outputs as arrays: sequence and map outputs (scikit-learn's ZipMap writes a
    sequence of {class: probability}) become arrays, so that they compare like tensors."""
    names = output_names or getattr(sess, "_rewrite_outputs", None)
    return [_as_array(o) for o in sess.run(list(names) if names else None, feeds)]


def _as_array(x):
    """An output as an array: a map -> its values by sorted key; a sequence -> its items
    stacked (flattened and joined where their shapes differ)."""
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, dict):
        return np.asarray([x[k] for k in sorted(x)])
    if isinstance(x, (list, tuple)):
        items = [_as_array(i) for i in x]
        if not items:
            return np.zeros((0,), np.float32)
        try:
            return np.stack(items)
        except ValueError:
            return np.concatenate([np.ravel(i) for i in items])
    return np.asarray(x)
