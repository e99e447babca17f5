"""expand-contrib: onnxruntime's com.microsoft ops back to standard ONNX ops.

A model saved by onnxruntime's optimiser (``optimized_model_filepath``, ORT_ENABLE_EXTENDED
or ALL) carries fused contrib ops; MIGraphX's parser does not know FusedConv, FusedGemm or
FusedMatMul. Those it parses and computes right (GELUs, Skip(Simplified)LayerNormalization:
MIGRAPHX_PARSES, in the forms its parser accepts) are kept, counted as
``parsed-by-migraphx:<Op>``, unless the target MIGraphX version predates them.
Before -> after::

    FusedConv(x, W, B, Z; act, params)      =>  act(Add(Conv(x, W, B), Z))
    FusedGemm(A, B, C; act, act_alpha ..)   =>  act(Gemm(A, B, C))
    FusedMatMul(A, B; transA, transB, transBatchA, transBatchB, alpha)
                                            =>  Mul(MatMul(Transpose(A), Transpose(B)), alpha)
    Gelu(x) / BiasGelu(x, b)                =>  v = x (+ b);  (v * 0.5) * (Erf(v / sqrt2) + 1)
    FastGelu(x [, b])                       =>  v = x (+ b);  (v*0.5) * (Tanh(v*(v*C*v + B)) + 1)
    QuickGelu(x; alpha=1.702)               =>  x * Sigmoid(x * alpha)
    SkipLayerNormalization(x, s, g, b, bias)=>  t = x + s (+ bias);  LayerNorm(t, g, b; axis=-1)
    BiasAdd(x, bias, skip)                  =>  (x + bias) + skip
    NhwcMaxPool(x)                          =>  Transpose(MaxPool(Transpose(x)))
    DynamicQuantizeMatMul(A, B, bs, bz, bias)  =>  Aq, as, az = DynamicQuantizeLinear(A);
                                                then as MatMulIntegerToFloat
    MatMulIntegerToFloat(A, B, as, bs, az, bz, bias)
                                            =>  Cast(MatMulInteger(A, B, az, bz)) * (as * bs) + bias
    QGemm(A, as, az, B, bs, bz, C, ys, yz)  =>  acc = MatMulInteger(A, B, az, bz) + C;
                                                QuantizeLinear(Cast(acc) * (as*bs/ys), 1, yz)
    QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B), the standard op with a bias (MIGraphX 2.15
    computes it wrongly, 2.16 refuses a per-tensor weight scale; without B both are exact)
                                            =>  acc = ConvInteger(x, w, xz, wz) + B;
                                                QuantizeLinear(Cast(acc) * (xs*ws/ys), 1, yz)
    SkipSimplifiedLayerNormalization, and onnxruntime's own default-domain schemas
    LayerNormalization (opset < 17) and SimplifiedLayerNormalization  =>  the decomposition
                                                (the last kept over the last axis, where
                                                MIGraphX parses it: MIGRAPHX_PARSES_ORT)
    MatMulNBits(A, B, scales, zp[N, n])     =>  MatMulNBits(A, B, scales, zp[N * n]): kept
                                                (MIGraphX parses it), zero points 1-D as specified
    Attention(x, w, b, mask_index[B])       =>  Attention(x, w, b, Cast(Range(S) < mask_index)):
                                                kept (MIGraphX parses it), the mask raw [B, S]
    EmbedLayerNormalization(ids, sids, W, P, S, g, b, mask)  =>  LayerNorm((W[ids] + P[:S])
                                                + S[sids], g, b); mask_index = count(mask == 1)
    Op(a, b, "", "")  (any contrib op kept)   =>  Op(a, b): trailing optional inputs left out,
                                                as the schema allows; MIGraphX's parser counts
                                                empty ones as inputs (the genai builder's 12-input
                                                GroupQueryAttention: "Wrong number of inputs")

The semantics are onnxruntime's CPU kernels' (contrib_ops/cpu: fused_activation.cc,
fused_gemm.cc, the core MatMul's trans_batch, bert/bias_gelu.cc with B = sqrt(2/pi) and
C = 0.044715*sqrt(2/pi), activations.h, skip_layer_norm.cc) and docs/ContribOperators.md:
FusedConv adds Z before the activation; transBatchA moves A's first axis to just before the
matrix axes (perm [1, .., r-2, 0, r-1]), then transA swaps the last two; skip broadcasts over
the leading axes. The order of operations mirrors the kernels, so the GELUs come out
bit-exact in onnxruntime; Conv+Z and the LayerNorms re-round (the kernel sums Z before the
bias, and computes E[x^2] - E[x]^2 in one sweep): Numerics.CLOSE.

LayerNorm becomes ONNX LayerNormalization from opset 17, else ReduceMean, Sub, Pow(2),
ReduceMean, Add(eps), Sqrt, Div, Mul, Add: the pattern MIGraphX matches as layernorm. GELU
uses Erf (ONNX Gelu is opset 20). Clip takes min/max as inputs from opset 11, as attributes
before. Output tensor names are kept; the main new node (Conv, Gemm, MatMul, the norm) keeps
the contrib node's name; a transposed weight is transposed once, at rewrite time. Shape
inference stops at the first contrib op, so a dtype it missed is found by walking up through
ops whose output has their first input's type. If/Loop/Scan bodies are done too.

Skipped, counted as ``<reason>:<Op>``: any other contrib op (``unsupported-contrib``:
Attention, GroupQueryAttention, the NCHWc ops with blocked weights ...), an activation
outside the table, a dtype not found or not float (``unknown-dtype``), FusedMatMul
transposes of an input of unknown rank or rank < 2, used Mean/InvStdDev outputs of a norm, a
float16 norm that must be decomposed (the kernels accumulate in float32), ops missing at the
model's opset (Erf < 9, ThresholdedRelu < 10, integer MaxPool < 12). The com.microsoft opset
import stays (the exporter keeps the original's imports; unused, it is valid ONNX).
onnx.checker knows no default-domain ORT schema (core.graph.ORT_DEFAULT_DOMAIN): loading
checks them as custom ops, and every genai model builder's RMSNorm is one.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_graphsurgeon as gs
from onnx import helper

from rewriter.core.graph import (graph_protos, iter_graphs, ort_default_domain, own_constant,
                                 peek_values)
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

MS = "com.microsoft"
# Activation -> its ONNX attributes, in FusedConv's activation_params order.
ACTS = {"Relu": (), "Tanh": (), "Sigmoid": (), "Silu": (), "Softplus": (), "Softsign": (),
        "LeakyRelu": ("alpha",), "Elu": ("alpha",), "ThresholdedRelu": ("alpha",),
        "Selu": ("alpha", "gamma"), "HardSigmoid": ("alpha", "beta"), "Clip": ("min", "max")}
# Contrib ops MIGraphX parses itself, from the version that added them (src/onnx/
# parse_gelu.cpp since 2.10, ROCm 6.2; parse_skip_simplified_layer_normalization.cpp since
# 2.11; parse_skip_layer_normalization.cpp since 2.13, ROCm 7.0), and computes within FP32
# tolerances on 2.15 and 2.16 (tests/test_migraphx_models.py): they are kept, not expanded,
# unless the target version (Options.migraphx_version) predates them. Kept, they stay
# exact: the LayerNorm decomposition re-rounds (Numerics.CLOSE), and a model that rounds
# it on into dynamic quantization and durations (Kokoro TTS, int8) then drifts (cosine
# -0.23). QuickGelu is not here: MIGraphX requires its alpha attribute, onnxruntime not.
MIGRAPHX_PARSES = {"Gelu": (2, 10), "BiasGelu": (2, 10), "FastGelu": (2, 10),
                   "SkipSimplifiedLayerNormalization": (2, 11),
                   "SkipLayerNormalization": (2, 13)}
# onnxruntime's default-domain schemas MIGraphX parses by name (parse_simplified_layer_
# normalization.cpp, added with the skip one): over the last axis only, its reduce's one axis.
MIGRAPHX_PARSES_ORT = {"SimplifiedLayerNormalization": (2, 11)}
# To find a dtype shape inference missed (it stops at the first contrib op): ops whose output
# has the type of all their inputs (ALL_T), or of their first input (SAME_TYPE).
ALL_T = {"Add", "Sub", "Mul", "Div", "MatMul", "Gemm", "Conv", "Sum", "Max", "Min", "Concat",
         "FusedConv", "FusedGemm", "FusedMatMul", "TransposeMatMul", "BiasGelu", "FastGelu",
         "BiasAdd", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}
SAME_TYPE = {"Relu", "Sigmoid", "Tanh", "Erf", "Identity", "Transpose", "Reshape", "Flatten",
             "Squeeze", "Unsqueeze", "Softmax", "MaxPool", "AveragePool", "GlobalAveragePool",
             "Pow", "Sqrt", "LayerNormalization", "BatchNormalization", "LeakyRelu", "Clip",
             "Neg", "Split", "Slice", "Gather", "Expand", "Pad", "Resize", "ReduceMean",
             "ReduceSum", "Attention", "MultiHeadAttention", "GroupQueryAttention",
             "RotaryEmbedding", "MatMulNBits"}


def _contrib(domain, op: str, opset: int) -> bool:
    return (domain or "").startswith(MS) or ort_default_domain(op, domain, opset)


def _migraphx_parses(node: gs.Node, version) -> bool:
    """Whether MIGraphX (``version``, None: 2.15/2.16) parses this contrib node as it is:
    the op is in MIGRAPHX_PARSES at that version, float32 or float16, only its first output
    read (and a skip norm's fourth, input + skip (+ bias), which the parsers return too: the
    genai builder's residual stream), and for the skip layer norms the ranks its parser
    accepts (SkipLayerNormalization: input 3-D, skip 3-D or 2-D; the simplified one: input
    2-D or 3-D, skip the same rank; gamma, beta and bias 1-D). Not a simplified norm with a
    bias: 2.15 and 2.16 add it after the norm instead of before it
    (parse_skip_simplified_layer_normalization.cpp:120, cosine 0.34 on ref)."""
    if node.domain == MS:
        since = MIGRAPHX_PARSES.get(node.op)
    else:   # the default-domain RMSNorm: x and scale, over the last axis, only y read
        since = MIGRAPHX_PARSES_ORT.get(node.op)
        x, axis = node.inputs[0], int(node.attrs.get("axis", -1))
        rank = _rank(x)
        if since is None or len(node.inputs) != 2 or rank is None or rank < 2 \
                or axis not in (-1, rank - 1) or _rank(node.inputs[1]) != 1:
            return False
    if since is None or tuple(version or since) < since:
        return False
    read = [i for i, t in enumerate(node.outputs) if i and t.name and t.outputs]
    if any(i != 3 or not node.op.startswith("Skip") for i in read) or _dtype(node) not in (
            np.float32, np.float16):
        return False
    if not node.op.startswith("Skip"):
        return True
    if node.op == "SkipSimplifiedLayerNormalization" and len(node.inputs) > 3 \
            and node.inputs[3].name:
        return False
    ranks = [None if t.name == "" else _rank(t) for t in node.inputs]
    x, skip, params = ranks[0], ranks[1], ranks[2:]
    if any(r != 1 for r, t in zip(params, node.inputs[2:]) if t.name):
        return False
    if node.op == "SkipLayerNormalization":
        return x == 3 and skip in (2, 3)
    return x in (2, 3) and skip == x


# Ops whose output has the rank of their inputs broadcast together (the largest), for a
# rank shape inference did not give (it stops at the first contrib op).
BROADCAST_RANK = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Relu", "Sigmoid", "Tanh", "Erf",
                  "Sqrt", "Cast", "Identity", "Softmax", "LeakyRelu", "Clip", "Neg",
                  "DequantizeLinear", "QuantizeLinear", "DynamicQuantizeLinear", "MatMul",
                  "MatMulInteger", "Gelu", "BiasGelu", "FastGelu", "QuickGelu", "BiasAdd",
                  "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
                  "LayerNormalization", "SimplifiedLayerNormalization", "MatMulNBits",
                  "RotaryEmbedding", "GroupQueryAttention", "Attention", "MultiHeadAttention"}
# ... of which only the first input's rank counts (the others: weights, caches, masks)
FIRST_RANK = ("Skip", "LayerNorm", "SimplifiedLayerNorm", "MatMulNBits", "RotaryEmbedding",
              "GroupQueryAttention", "Attention", "MultiHeadAttention")


def _rank(t, depth: int = 0) -> int | None:
    """A tensor's rank: its shape's, or from its producer's inputs (BROADCAST_RANK)."""
    if t.shape is not None:
        return len(t.shape)
    if isinstance(t, gs.Constant):
        return t.values.ndim
    n = t.inputs[0] if t.inputs else None
    if n is None or depth > 64 or n.op not in BROADCAST_RANK or t is not n.outputs[0]:
        return None
    ranks = [_rank(i, depth + 1) for i in n.inputs if i.name]
    if n.op == "DequantizeLinear" or n.op == "QuantizeLinear":
        ranks = ranks[:1]
    elif n.op in ("MatMul", "MatMulInteger"):
        ranks = ranks[:2]
    elif n.op.startswith(FIRST_RANK):
        ranks = ranks[:1]
    return None if not ranks or None in ranks else max(ranks)


class ExpandContrib(Pass):
    name = "expand-contrib"
    phase = Phase.FOLD
    numerics = Numerics.CLOSE
    summary = "onnxruntime's com.microsoft ops MIGraphX lacks (FusedConv ...) as standard ONNX"

    def needs_shapes(self, model) -> bool:
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        return any(_contrib(n.domain, n.op_type, opset)
                   for g in graph_protos(model.graph) for n in g.node)

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        consts: dict = {}
        raws: dict = {}
        for g in iter_graphs(graph):
            for node in list(g.nodes):   # topological: producers first, their dtypes set
                if not node.outputs or not (_contrib(node.domain, node.op, graph.opset)
                                            or _qlinear_conv_to_expand(node)):
                    continue
                known = (node.domain or "") in (MS, "", "ai.onnx")
                while node.domain == MS and node.inputs and not node.inputs[-1].name:
                    node.inputs.pop()   # MIGraphX counts them: GroupQueryAttention's 12 refused
                    res.count(f"trimmed-empty-inputs:{node.op}")
                    res.changed = True
                if node.op == "MatMulNBits" and node.domain == MS:
                    res.outcome(_flat_zero_points(node, ctx), "flattened-zero-points:MatMulNBits")
                    continue
                if node.op == "Attention" and node.domain == MS:
                    res.outcome(_raw_mask(node, g, ctx, raws), "raw-mask:Attention")
                if _migraphx_parses(node, ctx.options.migraphx_version):
                    res.skip(f"parsed-by-migraphx:{node.op}")
                    _type_kept(node)
                    continue
                handler = HANDLERS.get(node.op) if known else None
                if handler is None:
                    dom = "" if node.domain == MS else f"{node.domain}:"
                    res.skip(f"unsupported-contrib:{dom}{node.op}")
                    _type_kept(node)
                    continue
                e = _Emit(node, g, graph.opset, ctx, consts)
                reason = (e.float_check() if node.op not in INTEGER_OUT else None) or handler(e)
                if reason:
                    res.skip(f"{reason}:{node.op}")
                    continue
                g.nodes.extend(e.new)
                res.count(f"expanded:{node.op}")
                res.changed = True
        return res


def _type_kept(node: gs.Node) -> None:
    """A kept contrib op's first output gets its type T where inference (which stops at
    the op) left none and SAME_TYPE / ALL_T say it: what reads it is then typed, and a
    plan's FP16 layers after it are converted (BERT from onnxruntime's optimizer: all 6
    MatMuls after its Attention skipped as unknown-input-dtype, nothing said)."""
    y = node.outputs[0] if node.outputs else None
    if y is not None and y.dtype is None and (node.op in SAME_TYPE or node.op in ALL_T):
        y.dtype = _dtype(node)


def _flat_zero_points(node: gs.Node, ctx: Context) -> str | None:
    """MatMulNBits' packed uint8 zero points in the contrib spec's 1-D form,
    [N * ceil(n_blocks * bits / 8)]: onnxruntime's 4-bit quantizer writes them
    [N, ceil(n_blocks * bits / 8)], which onnxruntime reads alike and MIGraphX 2.15 and 2.16
    refuse ("zero_points does not match expected dims"). The same bytes: exact."""
    zp = node.inputs[3] if len(node.inputs) > 3 else None
    if zp is None or not zp.name or not isinstance(zp, gs.Constant):
        return ""
    v = peek_values(zp)
    if v.dtype != np.uint8 or v.ndim != 2:
        return ""
    own_constant(node, 3, v.reshape(-1), ctx.namer, "flat")
    return None


def _raw_mask(node: gs.Node, g: gs.Graph, ctx: Context, raws: dict) -> str | None:
    """Attention's 1-D mask_index [B] (each sequence's length: right padding, what
    EmbedLayerNormalization counts) as the raw [B, S] mask of ones and zeros that means the
    same to onnxruntime (the same filter value on the same keys): MIGraphX 2.15 and 2.16
    refuse the 1-D form ("Left/Right Padding not currently supported") and parse the raw
    one. Not with a past (keys past + S long) nor a [2B] mask (ends and starts). One raw
    mask per mask and sequence: a later Attention whose x comes, through the first inputs of
    shape-keeping ops, from an earlier one's x reads the same (BERT's layers, 6 nodes each)."""
    ins = list(node.inputs) + [gs.Variable("")] * 7
    x, mask = ins[0], ins[3]
    if not mask.name or ins[4].name or mask.shape is None or len(mask.shape) != 1:
        return ""
    chain = _first_chain(x)
    if _rank(x) != 3 or mask.shape[0] is None or mask.shape[0] not in [
            t.shape[0] for t in chain if t.shape]:
        return "mask-not-batch-sized"
    made = next((raws[mask.name, t.name] for t in chain if (mask.name, t.name) in raws), None)
    if made is not None:
        node.inputs[3] = made
        return None
    namer, i64 = ctx.namer, np.int64

    def add(op, inputs, dtype, **attrs):
        out = gs.Variable(namer(f"{mask.name}_{op.lower()}"), dtype=dtype)
        g.nodes.append(gs.Node(op, namer(f"{mask.name}_{op.lower()}"), attrs, inputs, [out]))
        return out

    def const(v):
        return gs.Constant(namer(f"{mask.name}_c"), np.asarray(v, dtype=i64))
    shape = add("Shape", [x], i64)
    length = add("Gather", [shape, const(1)], i64)   # a scalar: S
    keys = add("Range", [const(0), length, const(1)], i64)
    ends = add("Unsqueeze", [add("Cast", [mask], i64, to=7), const([1])], i64)
    keep = add("Less", [keys, ends], np.bool_)
    raw = add("Cast", [keep], np.int32, to=6)
    raw.shape = [mask.shape[0], x.shape[1] if x.shape is not None else None]
    node.inputs[3] = raws[mask.name, x.name] = raw
    return None


def _first_chain(t) -> list:
    """``t``, its producer's first input where that has the same rank (BROADCAST_RANK ops),
    and so on up: their first two dims name ``t``'s on any input the model runs on. Inference
    stops at a contrib op, and gives a broadcast with a computed operand fresh names
    (optimum's BERT embeddings: [B, S] + position embeddings sliced to a computed length is
    [unk, unk, 64]); a 1 up the chain that broadcasts to k > 1 leaves a mask onnxruntime
    refuses for the original too (a count neither k nor 2k long, a raw mask not k wide)."""
    chain = []
    for _ in range(64):
        chain.append(t)
        n = t.inputs[0] if t.inputs else None
        if n is None or n.op not in BROADCAST_RANK or t is not n.outputs[0] \
                or not n.inputs or _rank(n.inputs[0]) != _rank(t) or _rank(t) == 0:
            break
        t = n.inputs[0]
    return chain


class _Emit:
    """Builds the replacement of one node. A handler checks first, then calls ``begin``
    (which detaches the node) and emits; ``out=`` writes an original output tensor."""

    def __init__(self, node, g, opset, ctx, consts):
        self.node, self.g, self.opset, self.namer, self.consts = node, g, opset, ctx.namer, consts
        self.ins = [t if t.name else None for t in node.inputs] + [None] * 5
        self.outs: list = []
        self.new: list[gs.Node] = []
        self.base = node.outputs[0].name
        self.dtype = _dtype(node)
        self.named = False

    def attr(self, k, default=None):
        return self.node.attrs.get(k, default)

    def used(self, i: int) -> bool:
        outs = self.node.outputs
        return (i < len(outs) and bool(outs[i].name)
                and (bool(outs[i].outputs) or any(o is outs[i] for o in self.g.outputs)))

    def float_check(self) -> str | None:
        if self.dtype is None:
            return "unknown-dtype"
        return None if self.dtype.kind == "f" else "unsupported-dtype"

    def begin(self, like=None) -> None:
        self.outs = list(self.node.outputs)
        self.node.inputs.clear()
        self.node.outputs.clear()
        y = self.outs[0]   # later contrib nodes read its dtype (and rank)
        if y.dtype is None and self.dtype is not None:
            y.dtype = self.dtype
        if like is not None and y.shape is None and like.shape is not None:
            y.shape = list(like.shape)

    def const(self, v, dtype=None) -> gs.Constant:
        a = np.asarray(v, dtype=dtype or self.dtype)
        key = (id(self.g), a.dtype.str, a.shape, a.tobytes())
        if key not in self.consts:   # one constant per value and graph, not one per site
            self.consts[key] = gs.Constant(self.namer(f"{self.base}_c"), a)
        return self.consts[key]

    def op(self, op, *inputs, out=None, main=False, **attrs) -> gs.Tensor:
        ins = [t if isinstance(t, gs.Tensor) else self.const(t) for t in inputs if t is not None]
        if out is None:
            out = gs.Variable(self.namer(f"{self.base}_{op.lower()}"), dtype=self.dtype)
        if main and self.node.name and not self.named:
            name, self.named = self.node.name, True
        else:
            name = self.namer(f"{self.node.name or self.base}_{op.lower()}")
        self.new.append(gs.Node(op, name, attrs, ins, [out]))
        return out

    def act(self, act, x, params: dict, out):
        if act == "Clip":
            if self.opset >= 11:
                return self.op("Clip", x, self.const(params["min"]), self.const(params["max"]),
                               out=out)
            return self.op("Clip", x, out=out, **params)
        if act == "Silu":
            return self.op("Mul", x, self.op("Sigmoid", x), out=out)
        return self.op(act, x, out=out, **params)

    def reduce_mean(self, x, axes):
        if self.opset >= 18:
            return self.op("ReduceMean", x, self.const(axes, np.int64), keepdims=1)
        return self.op("ReduceMean", x, axes=axes, keepdims=1)


def _typed_inputs(node) -> list:
    if node.op == "MatMulIntegerToFloat":   # T3, its output's type, is its scales'
        return node.inputs[2:3]
    if node.op == "EmbedLayerNormalization":   # T, its word embedding's; ids are int32
        return node.inputs[2:3]
    if node.op in ALL_T:
        return [t for t in node.inputs if t.name]
    return node.inputs[:1] if node.op in SAME_TYPE or node.op in HANDLERS else []


def _dtype(node) -> np.dtype | None:
    """The type T of a contrib node's first output: known, or found breadth-first up through
    inputs of that type (a weight of a Gemm upstream, say)."""
    todo = node.outputs[:1] + _typed_inputs(node)
    for t in todo:   # grows while it is read
        if t.dtype is not None:
            return np.dtype(t.dtype)
        if t.inputs and len(todo) < 256:
            todo.extend(_typed_inputs(t.inputs[0]))
    return None


def _act_params(e, act, values) -> dict | str:
    if act not in ACTS:
        return "unsupported-activation"
    if act == "ThresholdedRelu" and e.opset < 10:
        return "op-needs-higher-opset"
    names = ACTS[act]
    if isinstance(values, dict):   # FusedGemm: activation_<name> attributes
        if act == "Clip" and not all(n in values for n in names):
            return "clip-without-bounds"
        return {n: float(values[n]) for n in names if n in values}
    if len(values) != len(names):   # FusedConv: onnxruntime refuses a wrong count too
        return "activation-params-count"
    return {n: float(v) for n, v in zip(names, values)}


def _fused_conv(e: _Emit):
    act = e.attr("activation", "")
    params = _act_params(e, act, list(e.attr("activation_params", []))) if act else {}
    if isinstance(params, str):
        return params
    x, w, b, z = e.ins[:4]
    attrs = {k: v for k, v in e.node.attrs.items() if not k.startswith("activation")}
    e.begin()
    y = e.outs[0]
    last = not act and z is None
    c = e.op("Conv", x, w, b, out=y if last else None, main=True, **attrs)
    if z is not None:
        c = e.op("Add", c, z, out=None if act else y)
    if act:
        e.act(act, c, params, y)


def _fused_gemm(e: _Emit):
    act = e.attr("activation", "")
    acts = {k[len("activation_"):]: v for k, v in e.node.attrs.items()
            if k.startswith("activation_")}
    params = _act_params(e, act, acts) if act else {}
    if isinstance(params, str):
        return params
    a, b, c = e.ins[:3]
    attrs = {k: e.attr(k) for k in ("alpha", "beta", "transA", "transB") if k in e.node.attrs}
    e.begin()
    if c is None and e.opset < 11:   # C is optional only from Gemm-11
        c = e.const(0.0)
    g = e.op("Gemm", a, b, c, out=None if act else e.outs[0], main=True, **attrs)
    if act:
        e.act(act, g, params, e.outs[0])


def _fused_matmul(e: _Emit):
    ts = []
    for t, tr, tb in ((e.ins[0], "transA", "transBatchA"), (e.ins[1], "transB", "transBatchB")):
        tr, tb = int(e.attr(tr, 0)), int(e.attr(tb, 0))
        perm = None
        if tr or tb:
            if t.shape is None:
                return "unknown-rank"
            r = len(t.shape)
            if r < 2:
                return "transpose-below-rank-2"
            perm = list(range(1, r - 1)) + [0, r - 1] if tb else list(range(r))
            if tr:
                perm[-2], perm[-1] = perm[-1], perm[-2]
            perm = None if perm == list(range(r)) else perm
        ts.append((t, perm))
    alpha = float(e.attr("alpha", 1.0))
    e.begin()
    ab = []
    for t, perm in ts:
        if perm is not None and isinstance(t, gs.Constant):   # a weight: transpose it now,
            key = ("T", id(e.g), id(t), tuple(perm))           # once for all its readers
            if key not in e.consts:
                e.consts[key] = gs.Constant(e.namer(f"{t.name}_t"),
                                            np.ascontiguousarray(t.values.transpose(perm)))
            t = e.consts[key]
        elif perm is not None:
            t = e.op("Transpose", t, perm=perm)
        ab.append(t)
    m = e.op("MatMul", *ab, out=e.outs[0] if alpha == 1.0 else None, main=True)
    if alpha != 1.0:
        e.op("Mul", m, alpha, out=e.outs[0])


def _integer_matmul(e: _Emit, a, b, a_scale, b_scale, a_zp, b_zp, bias) -> None:
    """(A - a_zp)(B - b_zp) in int32, then * (a_scale * b_scale) (+ bias) in float: the order
    of onnxruntime's kernels and of quantize_dynamic's unfused graph."""
    acc = gs.Variable(e.namer(f"{e.base}_int32"), dtype=np.int32)
    if a_zp is None and b_zp is not None:   # no empty input name: a zero point of A's type
        a_zp = e.const(0, np.dtype(a.dtype) if a.dtype is not None else np.uint8)
    zps = [z for z in (a_zp, b_zp) if z is not None]
    e.new.append(gs.Node("MatMulInteger", e.namer(f"{e.node.name or e.base}_matmulinteger"),
                         inputs=[a, b] + zps, outputs=[acc]))
    f = e.op("Cast", acc, to=int(helper.np_dtype_to_tensor_dtype(e.dtype)))
    scale = e.op("Mul", a_scale, b_scale)
    y = e.op("Mul", f, scale, out=e.outs[0] if bias is None else None, main=True)
    if bias is not None:
        e.op("Add", y, bias, out=e.outs[0])


def _dynamic_quantize_matmul(e: _Emit):
    """DynamicQuantizeMatMul(A, B, b_scale, b_zero_point, bias), what onnxruntime's extended
    optimiser fuses quantize_dynamic's graph into, and MIGraphX does not parse: A is
    quantized to uint8 at run time (DynamicQuantizeLinear), then as MatMulIntegerToFloat."""
    a, b, b_scale, b_zp, bias = e.ins[:5]
    e.begin()
    aq = gs.Variable(e.namer(f"{e.base}_a_quantized"), dtype=np.uint8)
    a_scale = gs.Variable(e.namer(f"{e.base}_a_scale"), dtype=np.float32)
    a_zp = gs.Variable(e.namer(f"{e.base}_a_zero_point"), dtype=np.uint8)
    e.new.append(gs.Node("DynamicQuantizeLinear", e.namer(f"{e.base}_dynamicquantize"),
                         inputs=[a], outputs=[aq, a_scale, a_zp]))
    _integer_matmul(e, aq, b, a_scale, b_scale, a_zp, b_zp, bias)


def _matmul_integer_to_float(e: _Emit):
    """MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias):
    MIGraphX parses it but computes a uint8 zero point of 128 wrongly (measured on 2.15 and
    2.16, as for MatMulInteger's others): as MatMulInteger, which integer-zero-points puts
    in a form MIGraphX computes right, then the float scale and bias."""
    a, b, a_scale, b_scale, a_zp, b_zp, bias = e.ins[:7]
    e.begin()
    _integer_matmul(e, a, b, a_scale, b_scale, a_zp, b_zp, bias)


def _qgemm(e: _Emit):
    """QGemm(A, as, az, B, bs, bz, C, ys, yz; alpha, transA, transB), what onnxruntime's
    QOperator quantizer writes for every Gemm (MIGraphX parses no QGemm: the whole model is
    refused). As its kernel computes it: acc = C + (A - az)(B - bz) in int32, then
    float(acc) * ((alpha * as) * bs [/ ys]); with yz, rounded half to even, + yz, saturated:
    QuantizeLinear with a scale of 1 does exactly that. MatMulInteger is quant_dot on
    MIGraphX; integer-zero-points puts its zero points in the form MIGraphX computes right."""
    a, a_scale, a_zp, b, b_scale, b_zp, c, y_scale, y_zp = e.ins[:9]
    if y_zp is not None and (not isinstance(y_zp, gs.Constant) or y_zp.values.size != 1):
        return "zero-point-not-constant"
    if b.shape is None or len(b.shape) != 2 or (a.shape is not None and len(a.shape) != 2):
        return "unknown-rank"
    alpha = float(e.attr("alpha", 1.0))
    ta, tb = int(e.attr("transA", 0)), int(e.attr("transB", 0))
    if a.dtype is None and a_zp is not None and a_zp.dtype is not None:
        a.dtype = a_zp.dtype   # TA, as the schema ties them: integer-zero-points reads it
    e.begin()
    e.dtype = np.dtype(np.float32)
    if ta:
        a_type, a = a.dtype, e.op("Transpose", a, perm=[1, 0])
        a.dtype = a_type
    if tb and isinstance(b, gs.Constant):
        key = ("T", id(e.g), id(b), (1, 0))
        if key not in e.consts:
            e.consts[key] = gs.Constant(e.namer(f"{b.name}_t"),
                                        np.ascontiguousarray(peek_values(b).T))
        b = e.consts[key]
    elif tb:
        b_type, b = b.dtype, e.op("Transpose", b, perm=[1, 0])
        b.dtype = b_type
    if a_zp is None and b_zp is not None:
        a_zp = e.const(0, np.uint8 if e.ins[0].dtype is None else np.dtype(e.ins[0].dtype))
    acc = gs.Variable(e.namer(f"{e.base}_int32"), dtype=np.int32)
    e.new.append(gs.Node("MatMulInteger", e.namer(f"{e.node.name or e.base}_matmulinteger"),
                         inputs=[a, b] + [z for z in (a_zp, b_zp) if z is not None],
                         outputs=[acc]))
    if c is not None:
        acc2 = gs.Variable(e.namer(f"{e.base}_int32_bias"), dtype=np.int32)
        e.new.append(gs.Node("Add", e.namer(f"{e.node.name or e.base}_bias"),
                             inputs=[acc, c], outputs=[acc2]))
        acc = acc2
    scale = e.op("Mul", e.op("Mul", alpha, a_scale) if alpha != 1.0 else a_scale, b_scale)
    if y_scale is not None:
        scale = e.op("Div", scale, y_scale)
    f = e.op("Cast", acc, to=int(helper.np_dtype_to_tensor_dtype(np.dtype(np.float32))))
    y = e.op("Mul", f, scale, out=e.outs[0] if y_zp is None else None, main=True)
    if y_zp is not None:
        zp = peek_values(y_zp).reshape(())
        e.op("QuantizeLinear", y, e.const(1.0, np.float32), e.const(zp, zp.dtype),
             out=e.outs[0])


def _qlinear_conv_to_expand(node) -> bool:
    """A standard QLinearConv with its int32 bias: MIGraphX 2.15 computes it wrongly (every
    output off, up to 255) and 2.16 refuses it with a per-tensor weight scale
    ("dequantizelinear: Dimensions do not match"); without a bias both are exact. Or one on
    uint8 input: MIGraphX parses it into uint8 Q/DQ around a float conv, which simplify_qdq
    leaves float (#2704; onnxruntime's QOperator U8S8 ResNet: 11 of 14 layers float in the
    GPU pass order), where ConvInteger becomes quant_convolution."""
    if node.op != "QLinearConv" or (node.domain or "") not in ("", "ai.onnx"):
        return False
    biased = len(node.inputs) > 8 and bool(node.inputs[8].name)
    xz = node.inputs[2] if len(node.inputs) > 2 else None
    return biased or (xz is not None and xz.dtype is not None
                      and np.dtype(xz.dtype) == np.uint8)


def _qlinear_conv(e: _Emit):
    """QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B) as qlinearconv.cc computes it:
    acc = ConvInteger(x, w, xz, wz) + B in int32, then float(acc) * (xs * ws / ys), rounded
    half to even, + yz, saturated (a QuantizeLinear of scale 1). onnxruntime requires one
    weight zero point for all channels. ConvInteger is quant_convolution on MIGraphX."""
    x, xs, xz, w, ws, wz, ys, yz, bias = e.ins[:9]
    consts = (w, ws, wz, yz, bias)
    if any(t is not None and not isinstance(t, gs.Constant) for t in consts) or wz is None \
            or yz is None or xz is None:
        return "not-constant"
    wv, wsv, wzv = peek_values(w), peek_values(ws), peek_values(wz)
    if e.node.attrs.get("channels_last") or wv.ndim < 3 or np.unique(wzv).size != 1 \
            or wsv.size not in (1, wv.shape[0]):
        return "unsupported-form"
    if x.dtype is None and xz.dtype is not None:
        x.dtype = xz.dtype   # T1, as the schema ties them: integer-zero-points reads it
    e.begin()
    e.dtype = np.dtype(np.float32)
    chan = [wv.shape[0]] + [1] * (wv.ndim - 2)
    acc = gs.Variable(e.namer(f"{e.base}_int32"), dtype=np.int32)
    e.new.append(gs.Node("ConvInteger", e.namer(f"{e.node.name or e.base}_convinteger"),
                         dict(e.node.attrs), [x, w, xz, e.const(wzv.reshape(-1)[0], wzv.dtype)],
                         [acc]))
    acc2 = acc
    if bias is not None:
        acc2 = gs.Variable(e.namer(f"{e.base}_int32_bias"), dtype=np.int32)
        e.new.append(gs.Node("Add", e.namer(f"{e.node.name or e.base}_bias"),
                             inputs=[acc, e.const(peek_values(bias).reshape(chan), np.int32)],
                             outputs=[acc2]))
    ws_c = e.const(wsv.reshape(chan if wsv.size > 1 else ()), np.float32)
    scale = e.op("Div", e.op("Mul", xs, ws_c), ys)
    f = e.op("Cast", acc2, to=int(helper.np_dtype_to_tensor_dtype(np.dtype(np.float32))))
    y = e.op("Mul", f, scale, main=True)
    zp = peek_values(yz).reshape(())
    e.op("QuantizeLinear", y, e.const(1.0, np.float32), e.const(zp, zp.dtype), out=e.outs[0])


def _gelu(e: _Emit):
    if e.opset < 9:
        return "op-needs-higher-opset"   # Erf
    x, bias = e.ins[:2]
    e.begin(like=x)
    v = e.op("Add", x, bias) if bias is not None else x
    erf = e.op("Erf", e.op("Mul", v, 1.0 / math.sqrt(2.0)))
    e.op("Mul", e.op("Mul", v, 0.5), e.op("Add", erf, 1.0), out=e.outs[0])


def _fast_gelu(e: _Emit):
    x, bias = e.ins[:2]
    e.begin(like=x)
    v = e.op("Add", x, bias) if bias is not None else x
    inner = e.op("Add", e.op("Mul", e.op("Mul", v, 0.035677408136300125), v), 0.7978845608028654)
    t = e.op("Tanh", e.op("Mul", v, inner))
    e.op("Mul", e.op("Mul", v, 0.5), e.op("Add", t, 1.0), out=e.outs[0])


def _quick_gelu(e: _Emit):
    x, alpha = e.ins[0], float(e.attr("alpha", 1.702))
    e.begin(like=x)
    s = e.op("Sigmoid", e.op("Mul", x, alpha) if alpha != 1.0 else x)
    e.op("Mul", x, s, out=e.outs[0])


def _bias_add(e: _Emit):
    x, bias, skip = e.ins[:3]
    e.begin(like=x)
    e.op("Add", e.op("Add", x, bias), skip, out=e.outs[0])


def _norm(e: _Emit, x, scale, bias, axis, eps, simplified, out):
    """LayerNorm (or RMSNorm when ``simplified``) of ``x`` over the axes from ``axis`` on."""
    if not simplified and e.opset >= 17:
        return e.op("LayerNormalization", x, scale, bias, out=out, main=True, axis=axis,
                    epsilon=eps)
    axes = list(range(axis, 0))   # axis is negative here: no rank needed
    d = x if simplified else e.op("Sub", x, e.reduce_mean(x, axes))
    var = e.reduce_mean(e.op("Pow", d, 2.0), axes)
    n = e.op("Div", d, e.op("Sqrt", e.op("Add", var, eps)))
    y = e.op("Mul", n, scale, out=out if bias is None else None, main=True)
    return y if bias is None else e.op("Add", y, bias, out=out)


def _norm_check(e: _Emit, simplified) -> str | None:
    if e.used(1) or e.used(2):   # Mean / InvStdDev: read by training graphs only
        return "layernorm-statistics-used"
    if (simplified or e.opset < 17) and e.dtype.itemsize < 4:
        return "float16-layernorm-below-opset-17"   # the kernels accumulate in float32
    return None


def _layer_norm(e: _Emit):
    simplified = e.node.op == "SimplifiedLayerNormalization"
    x, axis = e.ins[0], int(e.attr("axis", -1))
    if axis >= 0:
        if x.shape is None:
            return "unknown-rank"
        axis -= len(x.shape)
    reason = _norm_check(e, simplified)
    if reason:
        return reason
    scale, bias = e.ins[1], None if simplified else e.ins[2]
    e.begin(like=x)
    _norm(e, x, scale, bias, axis, float(e.attr("epsilon", 1e-5)), simplified, e.outs[0])


def _skip_layer_norm(e: _Emit):
    simplified = e.node.op == "SkipSimplifiedLayerNormalization"
    reason = _norm_check(e, simplified)
    if reason:
        return reason
    x, skip, gamma = e.ins[:3]
    beta, bias = (None, e.ins[3]) if simplified else e.ins[3:5]
    keep_sum = e.used(3)   # input+skip+bias: kept when something reads it
    e.begin(like=x)
    s = e.op("Add", x, skip, out=e.outs[3] if keep_sum and bias is None else None)
    if bias is not None:
        s = e.op("Add", s, bias, out=e.outs[3] if keep_sum else None)
    _norm(e, s, gamma, beta, -1, float(e.attr("epsilon", 1e-12)), simplified, e.outs[0])


def _embed_layer_norm(e: _Emit):
    """EmbedLayerNormalization(ids, segment_ids, word, position, segment, gamma, beta, mask,
    position_ids; epsilon), onnxruntime's optimizer's BERT embedding, which MIGraphX does
    not parse, as embed_layer_norm.cc computes it: s = (word[ids] + position[position_ids or
    0 .. S-1]) + segment[segment_ids]; y = LayerNorm(s, gamma, beta); mask_index[b] = how
    many of mask[b] are 1 (0 without a mask); embedding_sum = s."""
    ids, seg_ids, word, pos, seg, gamma, beta, mask, pos_ids = e.ins[:9]
    if e.used(1) and int(e.attr("mask_index_type", 1)) != 1:
        return "unsupported-mask-index-type"
    if (seg_ids is None) != (seg is None) or gamma is None:
        return "unsupported-form"
    if e.opset < 13:   # Slice by inputs (10), ReduceSum's axes input (13)
        return "op-needs-higher-opset"
    if e.opset < 17 and e.dtype.itemsize < 4:
        return "float16-layernorm-below-opset-17"   # the kernel accumulates in float32
    count_mask, keep_sum = e.used(1), e.used(2)   # read before begin() detaches them
    e.begin()
    if ids.shape is not None and word.shape is not None and len(word.shape) == 2:
        for y in e.outs[0:3:2]:   # [B, S, H]: the skip norms after it read their rank
            if y.name and y.shape is None:
                y.shape = list(ids.shape) + [word.shape[1]]
    i64 = np.int64
    x = e.op("Gather", word, ids)
    if pos_ids is None:   # positions 0 .. S-1: the table's first S rows
        shape = e.op("Shape", ids)
        shape.dtype = i64
        length = e.op("Gather", shape, e.const([1], i64))
        length.dtype = i64
        pos = e.op("Slice", pos, e.const([0], i64), length, e.const([0], i64))
        x = e.op("Add", x, pos)
    else:
        x = e.op("Add", x, e.op("Gather", pos, pos_ids))
    if seg is not None:
        x = e.op("Add", x, e.op("Gather", seg, seg_ids), out=e.outs[2] if keep_sum else None)
    elif keep_sum:
        x = e.op("Identity", x, out=e.outs[2])
    _norm(e, x, gamma, beta, -1, float(e.attr("epsilon", 1e-12)), False, e.outs[0])
    if count_mask:
        i32 = int(helper.np_dtype_to_tensor_dtype(np.dtype(np.int32)))
        if mask is None:   # no mask: zeros, one per sequence
            shape = e.op("Shape", ids)
            shape.dtype = i64
            batch = e.op("Gather", shape, e.const([0], i64))
            batch.dtype = i64
            e.op("ConstantOfShape", batch, out=e.outs[1],
                 value=helper.make_tensor("zero", i32, [1], [0]))
        else:
            ones = e.op("Equal", mask, e.const(1, np.int32))
            ones.dtype = np.bool_
            count = e.op("Cast", ones, to=i32)
            count.dtype = np.int32
            e.op("ReduceSum", count, e.const([1], i64), keepdims=0, out=e.outs[1])


def _nhwc_max_pool(e: _Emit):
    if e.opset < 12 and (e.dtype is None or e.dtype.kind != "f"):
        return "op-needs-higher-opset"
    r, x = len(e.attr("kernel_shape")) + 2, e.ins[0]   # kernel_shape is required
    e.begin()
    t = e.op("Transpose", x, perm=[0, r - 1] + list(range(1, r - 1)))
    p = e.op("MaxPool", t, main=True, **dict(e.node.attrs))
    e.op("Transpose", p, perm=[0] + list(range(2, r)) + [1], out=e.outs[0])


HANDLERS = {"FusedConv": _fused_conv, "FusedGemm": _fused_gemm, "FusedMatMul": _fused_matmul,
            "TransposeMatMul": _fused_matmul, "Gelu": _gelu, "BiasGelu": _gelu,
            "FastGelu": _fast_gelu, "QuickGelu": _quick_gelu, "BiasAdd": _bias_add,
            "LayerNormalization": _layer_norm, "SimplifiedLayerNormalization": _layer_norm,
            "SkipLayerNormalization": _skip_layer_norm,
            "SkipSimplifiedLayerNormalization": _skip_layer_norm,
            "NhwcMaxPool": _nhwc_max_pool, "DynamicQuantizeMatMul": _dynamic_quantize_matmul,
            "MatMulIntegerToFloat": _matmul_integer_to_float, "QGemm": _qgemm,
            "QLinearConv": _qlinear_conv, "EmbedLayerNormalization": _embed_layer_norm}
# Handlers whose op has an integer output, or a float one not typed as its inputs.
INTEGER_OUT = {"NhwcMaxPool", "QGemm", "QLinearConv"}
