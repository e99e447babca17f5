"""MIGraphX kernel names -> op kinds, and the ONNX nodes a kernel can stand for."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from rewriter.advise.profiles import ProfileError, clean_kernel_name

_ACTIVATION_TOKENS = {"relu": "Relu", "clip": "Clip", "sigmoid": "Sigmoid", "tanh": "Tanh",
                      "leaky": "LeakyRelu", "elu": "Elu", "erf": "Gelu", "gelu": "Gelu",
                      "hardswish": "HardSwish", "hardsigmoid": "HardSigmoid"}
_ACTIVATION_OPS = set(_ACTIVATION_TOKENS.values()) | {"PRelu", "Selu", "Softplus", "Mish"}
# MIOpen kernels: miopenSp3AsmConv_*, igemm_fwd_*, naive_conv_fwd_*, MIOpenConvUni,
# gridwise_convolution_implicit_gemm_*, Im2Col ... ("conv" but not "convert")
_MIOPEN_CONV = re.compile(r"miopen|igemm|winograd|im2col|conv(?!ert)", re.I)


@dataclass
class KernelClass:
    """What a kernel name says: ``kind`` is one of mlir-conv, mlir-dot, mlir-other, jit-conv,
    qdq, pointwise, layout, convert, miopen-conv, batchnorm, blas-gemm, other."""

    kind: str
    ops: list[str]
    precision: str | None  # "int8", "float" (FP32/FP16 cannot be told apart by name), None
    activation: str | None  # ONNX op type of a fused / contained activation


def classify_kernel(raw_name: str) -> KernelClass:
    name = clean_kernel_name(raw_name)
    low = name.lower()
    tokens = low.split("_")
    act = next((_ACTIVATION_TOKENS[t] for t in tokens if t in _ACTIVATION_TOKENS), None)
    if low.startswith("mlir_"):
        ops = tokens[1:]
        kind = ("mlir-conv" if "convolution" in ops else "mlir-dot" if "dot" in ops
                else "mlir-other")
        precision = None
        if kind != "mlir-other":  # quant_convolution / quant_dot are the INT8 forms
            precision = "int8" if "quant" in ops else "float"
        return KernelClass(kind, ops, precision, act)
    if low.endswith("_kernel"):  # MIGraphX JIT kernels: <op>_<op>_kernel
        ops = tokens[:-1]
        if "conv" in ops:
            return KernelClass("jit-conv", ops, "float", act)
        if "quantizelinear" in ops or "dequantizelinear" in ops:
            return KernelClass("qdq", ops, None, act)
        if ops and ops[0] in ("contiguous", "transpose", "layout"):
            return KernelClass("layout", ops, None, None)
        if ops == ["convert"]:
            return KernelClass("convert", ops, None, None)
        return KernelClass("pointwise", ops, None, act)
    if "batchnorm" in low or "bnfwd" in low:
        return KernelClass("batchnorm", [], None, None)
    if low.startswith(("cijk_", "rocblas", "hipblaslt")):  # Tensile / rocBLAS / hipBLASLt GEMM
        return KernelClass("blas-gemm", [], None, None)
    if _MIOPEN_CONV.search(name):
        return KernelClass("miopen-conv", [], None, None)
    return KernelClass("other", [], None, act)


# --------------------------------------------------------------------------- the model

def _model_facts(path: str | Path) -> dict:
    """Counts and per-Conv facts from the ONNX graph (top level; weights are not loaded)."""
    try:
        import onnx
    except ImportError:
        raise ProfileError("--model needs the onnx package (pip install onnx)") from None
    from rewriter.core.graph import node_id   # onnx-graphsurgeon: not for `advise -h`
    p = Path(path)
    if not p.is_file():
        raise ProfileError(f"{p}: model not found")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf raises several unrelated types for a corrupt file
        raise ProfileError(f"{p}: cannot read as ONNX ({type(e).__name__}: {e})") from None
    g = model.graph
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list] = defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    inits = {t.name: t for t in g.initializer}

    def followers(n, hops=0) -> list:
        # what consumes the conv's result, looking through a bias Add, a BatchNorm and a
        # Q->DQ pair, which is how far MIGraphX looks when it fuses a conv's epilogue
        out = []
        for c in consumers[n.output[0]]:
            out.append(c)
            if hops < 3 and c.op_type in ("Add", "BatchNormalization", "QuantizeLinear",
                                          "DequantizeLinear"):
                out += followers(c, hops + 1)
        return out

    def weight_dims(name: str) -> list[int] | None:
        if name in inits:
            return list(inits[name].dims)
        src = producer.get(name)  # int8 initializer -> DequantizeLinear -> Conv
        if src is not None and src.op_type == "DequantizeLinear" and src.input[0] in inits:
            return list(inits[src.input[0]].dims)
        return None

    convs, matmuls = [], []
    for n in g.node:
        int8 = len(n.input) >= 2 and all(
            producer.get(i) is not None and producer[i].op_type == "DequantizeLinear"
            for i in n.input[:2])
        if n.op_type in ("MatMul", "Gemm"):
            matmuls.append({"node": node_id(n), "int8": int8})
        if n.op_type != "Conv":
            continue
        after = followers(n)
        ops_after = [c.op_type for c in after]
        act = next((o for o in ops_after if o in _ACTIVATION_OPS), None)
        qdq_before_act = act is not None and "QuantizeLinear" in ops_after[: ops_after.index(act)]
        dims = weight_dims(n.input[1]) if len(n.input) > 1 else None
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        k, c = (dims[0], dims[1] * group) if dims and len(dims) >= 2 else (None, None)
        convs.append({"node": node_id(n), "activation": act, "int8": int8,
                      "batchnorm_after": "BatchNormalization" in ops_after,
                      "qdq_between_conv_and_activation": qdq_before_act,
                      "in_channels": c, "out_channels": k,
                      "unaligned": bool(k and c and (k % 4 or c % 4))})
    ops = Counter(n.op_type for n in g.node)
    return {"path": str(p), "ops": dict(ops), "convs": convs, "matmuls": matmuls,
            "labels": {node_id(n): n.op_type for n in g.node}}  # labels: internal, not printed


def _match_nodes(name: str, kc: KernelClass, facts: dict) -> list[str]:
    """ONNX nodes this kernel can stand for (by op pattern; exact only if names coincide)."""
    if name in facts["labels"]:
        return [name]
    if kc.kind in ("mlir-conv", "jit-conv"):
        return [c["node"] for c in facts["convs"]
                if c["activation"] == kc.activation and c["int8"] == (kc.precision == "int8")]
    if kc.kind == "mlir-dot":
        return [m["node"] for m in facts["matmuls"] if m["int8"] == (kc.precision == "int8")]
    if kc.kind == "qdq":
        return [c["node"] for c in facts["convs"] if c["qdq_between_conv_and_activation"]]
    if kc.kind == "batchnorm":
        return [n for n, op in facts["labels"].items() if op == "BatchNormalization"]
    if kc.kind == "pointwise" and kc.activation:
        return [n for n, op in facts["labels"].items() if op == kc.activation]
    return []


# --------------------------------------------------------------------------- the tree
