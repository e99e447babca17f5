"""expand-functions: standard ONNX ops MIGraphX does not parse, written as their ONNX
function bodies.

Newer opsets define many ops as functions of older ones, and onnxruntime runs them, but
MIGraphX's parser does not register them ("Unknown operator"): RMSNormalization (opset 23,
what torch's dynamo exporter writes for a Llama RMSNorm from opset 23), Swish (24), Mish,
the window functions, CenterCropPad, SwiGLU. Attention and RotaryEmbedding of opset 23
are worse: MIGraphX reads them by name as onnxruntime's com.microsoft ops, whose inputs and
attributes differ, and refuses them. Each such node becomes the body the ONNX schema gives
for it at the model's opset (``onnx.defs``: the plain function, or the one built for the
node's attributes and input types), e.g.::

    RMSNormalization <axis=-1, epsilon=1e-5> (X, scale)
        =>  Mul(Div(X, Sqrt(Add(ReduceMean(Mul(X, X), axes), eps))), scale)
            (its Shape/Size/Range axes fold later)

The body is the op's definition, so the outputs are the same up to float rounding
(onnxruntime's fused kernels sum in another order): Numerics.CLOSE. Skipped with a reason:
an op without a body (no-function-body), inputs whose type is unknown where the body
depends on it (unknown-type), a body written for an older opset that onnx's version
converter cannot bring to the model's (body-op-version), an Attention whose qk_matmul_output is read
(qk-output-read: onnxruntime writes its masked scores as float's lowest, the body -inf),
a bfloat16 input (bfloat16:
onnxruntime's CPU has no bfloat16 kernels for the body's Add, Expand ..., so the result
could not be verified). Ops a body
writes that MIGraphX does not parse either are expanded in turn. Which ops: NOT_PARSED and,
from opset 23, READ_AS_CONTRIB, as measured on the shared builds (a newer MIGraphX that
parses one natively still gets the same math). In the default pipeline
only when MIGraphX is the target: elsewhere the one node is the better model.
"""

from __future__ import annotations

import onnx
import onnx_graphsurgeon as gs
from onnx import defs, version_converter

from rewriter.core.graph import has_function_body, iter_graphs, np_dtype, op_schema
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

# The standard ops with an ONNX function body that MIGraphX 2.15/2.16 do not parse: the
# packaged profile's onnx_standard_ops_not_parsed that have one (tests/passes check the two
# agree), but Bernoulli (random: nothing to verify), SequenceMap (sequences) and AffineGrid,
# whose body (onnx 1.23) Squeezes theta without axes and so fails for a batch of 1.
NOT_PARSED = frozenset({
    "BlackmanWindow", "CausalConvWithState", "CenterCropPad", "HammingWindow",
    "HannWindow", "LinearAttention", "Mish", "RMSNormalization", "SwiGLU", "Swish"})
# Opset-23 ops MIGraphX parses by name as onnxruntime's com.microsoft ones (the profile's
# contrib_named_ops): refused, as their inputs and attributes differ.
READ_AS_CONTRIB = frozenset({"Attention", "RotaryEmbedding"})


class ExpandFunctions(Pass):
    name = "expand-functions"
    phase = Phase.FOLD
    numerics = Numerics.CLOSE
    summary = "standard ops MIGraphX does not parse (RMSNormalization, Swish, opset-23 " \
              "Attention ...) as their ONNX function bodies"

    def needs_shapes(self, model) -> bool:
        # The bodies of RMSNormalization, Attention ... are built for their input types.
        from rewriter.core.report import op_histogram

        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        return any(_refused(op, opset) and has_function_body(op, opset)
                   for op in op_histogram(model.graph))

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        # One sweep: an op a body writes that needs expanding too (none does today) is
        # taken by the manager's next round.
        res = PassResult()
        opset = int(graph.opset or 1)
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.domain in (None, "", "ai.onnx") and _refused(node.op, opset):
                    res.outcome(_expand(node, g, opset, ctx), f"expanded-{node.op}")
        return res


def _refused(op: str, opset: int) -> bool:
    return op in NOT_PARSED or (op in READ_AS_CONTRIB and opset >= 23)


def _value_info(name: str, t: gs.Tensor | None) -> onnx.ValueInfoProto:
    """A body's formal input, typed as the node's actual one where that is known."""
    vi = onnx.ValueInfoProto(name=name)
    typed = _type_proto(t) if t is not None else None
    if typed:
        vi.type.ParseFromString(typed)
    return vi


def _node_proto(node: gs.Node) -> onnx.NodeProto:
    from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter

    return OnnxExporter.export_node(node)


def _masked_scores_read(node: gs.Node, g: gs.Graph) -> bool:
    """Whether an Attention's qk_matmul_output is read in a mode that shows masked scores
    (1: after the mask, 2: after the soft cap) where a mask writes -inf (causal, a bool
    mask, nonpad_kv_seqlen)."""
    if len(node.outputs) < 4 or not node.outputs[3].name or not (
            node.outputs[3].outputs or any(t is node.outputs[3] for t in g.outputs)):
        return False
    if int(node.attrs.get("qk_matmul_output_mode", 0)) not in (1, 2):
        return False
    mask = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3].name else None
    return (bool(node.attrs.get("is_causal", 0))
            or (mask is not None and (mask.dtype is None or np_dtype(mask.dtype) == bool))
            or (len(node.inputs) > 6 and bool(node.inputs[6].name)))


def _elem(t: gs.Tensor) -> int:
    """The ONNX element type of ``t``."""
    return onnx.helper.np_dtype_to_tensor_dtype(np_dtype(t.dtype))


def _type_proto(t: gs.Tensor) -> bytes | None:
    """The serialized TypeProto of ``t`` (None when its element type is unknown)."""
    if not t.name:
        return b""
    if t.dtype is None:
        return None
    elem = _elem(t)
    shape = None if t.shape is None else [d if isinstance(d, int) else None for d in t.shape]
    return onnx.helper.make_tensor_type_proto(elem, shape).SerializeToString()


def _function(node: gs.Node, opset: int) -> onnx.FunctionProto | str:
    schema = op_schema(node.op, opset)
    if schema is None:
        return "no-function-body"
    proto = _node_proto(node)
    if schema.has_context_dependent_function:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if not versions:
            return "no-function-body"
        types = [_type_proto(t) for t in node.inputs]
        if any(t is None for t in types):
            return "unknown-type"
        try:
            raw = schema.get_context_dependent_function_with_opset_version(
                max(versions), proto.SerializeToString(), types)
        except Exception:   # the schema's builder refuses these inputs or attributes
            return "no-function-body"
    elif schema.has_function:
        versions = [v for v in schema.function_opset_versions if v <= opset]
        if not versions:
            return "no-function-body"
        raw = schema.get_function_with_opset_version(max(versions))
    else:
        return "no-function-body"
    f = onnx.FunctionProto()
    f.ParseFromString(raw)
    if not f.node:
        return "no-function-body"
    _bind_attributes(f, proto, schema)
    return f


def _bind_attributes(f: onnx.FunctionProto, proto: onnx.NodeProto, schema) -> None:
    """Attributes of the body that refer to the node's (``ref_attr_name``) take the node's
    value, else the schema's default, else are left out (the op's own default)."""
    given = {a.name: a for a in proto.attribute}
    for n in f.node:
        kept = []
        for a in n.attribute:
            if not a.ref_attr_name:
                kept.append(a)
                continue
            src = given.get(a.ref_attr_name)
            if src is None and a.ref_attr_name in schema.attributes:
                default = schema.attributes[a.ref_attr_name].default_value
                src = default if default.type else None
            if src is not None:
                b = onnx.AttributeProto()
                b.CopyFrom(src)
                b.name = a.name
                kept.append(b)
        del n.attribute[:]
        n.attribute.extend(kept)


def _expand(node: gs.Node, g: gs.Graph, opset: int, ctx: Context) -> str | None:
    if any(t.name and t.dtype is not None and _elem(t) == onnx.TensorProto.BFLOAT16
           for t in node.inputs):
        return "bfloat16"   # onnxruntime's CPU has no bfloat16 Add, Expand ...: unverifiable
    if node.op == "Attention" and _masked_scores_read(node, g):
        # onnxruntime's kernel writes masked scores there as float's lowest, the spec's
        # body -inf: the output would differ from what the model gave (Y does not)
        return "qk-output-read"
    f = _function(node, opset)
    if isinstance(f, str):
        return f
    body_opset = next((o.version for o in f.opset_import if o.domain in ("", "ai.onnx")),
                      opset)
    if any(n.domain not in ("", "ai.onnx") for n in f.node):
        return "body-op-version"
    body = onnx.helper.make_model(
        onnx.helper.make_graph(
            list(f.node), "body",
            [_value_info(name, t)
             for name, t in zip(f.input, list(node.inputs) + [None] * len(f.input))],
            [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in f.output]),
        opset_imports=[onnx.helper.make_opsetid("", body_opset)])
    if body_opset != opset:
        # Written for an older opset: onnx's version converter rewrites the ops whose
        # definition changed since (ReduceMean's axes an input from 18, Split's
        # num_outputs); it refuses what it cannot convert.
        try:
            body = version_converter.convert_version(body, opset)
        except Exception:
            return "body-op-version"
    try:
        # Types for the body's tensors: a Cast to the type it already has is then seen
        # as a no-op and goes (RMSNormalization's stash Casts on a float input).
        body = onnx.shape_inference.infer_shapes(body)
    except Exception:  # noqa: BLE001 - untyped tensors are only missed simplifications
        pass
    base = node.name or node.outputs[0].name
    sub = gs.import_onnx(body)
    actual = {}
    for formal, t in zip(sub.inputs, list(node.inputs) + [None] * len(sub.inputs)):
        actual[id(formal)] = t if t is not None and t.name else gs.Variable.empty()
    for formal, t in zip(sub.outputs, node.outputs):
        if t.name:
            actual[id(formal)] = t
    node.inputs.clear()
    node.outputs.clear()
    g.nodes.remove(node)
    renamed: set[int] = set()
    for n in sub.nodes:
        bodies = [v for v in n.attrs.values() if isinstance(v, gs.Graph)]
        for inner in [n] + [m for b in bodies for sg in iter_graphs(b) for m in sg.nodes]:
            # an If in the body (14 of onnx's node cases of these ops have one) reads the
            # formals from outside; the body's own names (Zero, One ...) are made unique,
            # or a branch's would shadow a tensor of the model's
            for i, t in enumerate(inner.inputs):
                if id(t) in actual:
                    inner.inputs[i] = actual[id(t)]
            for i, t in enumerate(inner.outputs):
                if id(t) in actual:
                    inner.outputs[i] = actual[id(t)]
                elif id(t) not in renamed:
                    renamed.add(id(t))
                    t.name = ctx.namer(f"{base}_{t.name}")
            inner.name = ctx.namer(f"{base}_{inner.op.lower()}")
        g.nodes.append(n)
    return None
