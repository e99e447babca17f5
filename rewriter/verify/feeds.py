"""Inputs for verification: shapes from --input-shape, seeded random feeds, user files."""

from __future__ import annotations

import os
import re

import numpy as np
import onnx

from rewriter.core.errors import InputError


def parse_shape_args(items: list[str] | None) -> dict[str, list[int]]:
    """``name:1x3x224x224`` (repeatable, or several in one, comma-separated, as trtexec's
    --shapes) -> {name: [1, 3, 224, 224]}; bare ``1x3x..`` means the first input, stored
    under the key ``''``."""
    out: dict[str, list[int]] = {}
    pieces = []
    for item in items or []:
        parts = item.split(",")
        # an input whose name has a comma keeps it: split only where every part is NAME:DIMS
        each = len(parts) > 1 and all(re.fullmatch(r".+:\d+(x\d+)*", p.strip().lower())
                                      for p in parts)
        pieces += [p.strip() for p in parts] if each else [item]
    for item in pieces:
        name, _, dims = item.rpartition(":")
        try:
            shape = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            held = re.findall(r"\{\w*\}", dims)   # rewrite check's placeholders: {height}
            raise InputError(f"--input-shape '{item}': " + (
                f"replace {', '.join(held)} with your size{'s' if len(held) > 1 else ''}"
                if held else "expected name:1x3x224x224")) from None
        if any(d <= 0 for d in shape):
            raise InputError(f"--input-shape '{item}': dims must be positive")
        if name in out and out[name] != shape:   # the last one won, without a word
            raise InputError(f"--input-shape gives {name or 'the input'} twice: "
                             f"{'x'.join(map(str, out[name]))} and {dims}")
        out[name] = shape
    return out


def parse_value_args(items: list[str] | None) -> dict[str, str]:
    """``name=value`` (repeatable) -> {name: "value"}; the value is read against the
    input's type later (rewriter.core.convert.set_input_values)."""
    out: dict[str, str] = {}
    for item in items or []:
        name, eq, value = item.rpartition("=")
        if not eq or not name or not value.strip():
            raise InputError(f"--set-input '{item}': expected NAME=VALUE, e.g. "
                             "use_cache_branch=true")
        if name in out and out[name] != value:
            raise InputError(f"--set-input gives {name} twice: {out[name]} and {value}")
        out[name] = value
    return out


def real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (old IR lists weights as inputs too)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def batch_names(model: onnx.ModelProto) -> set[str]:
    """Names of the symbolic dims that lead an input of rank 2 or more: batches. Where such
    a name appears again (a recurrent state's [layers, batch, hidden]), it is the batch too."""
    out = set()
    for vi in real_inputs(model):
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if len(dims) > 1 and dims[0].dim_param:
            out.add(dims[0].dim_param)
    return out


def given_dims(shapes: dict[str, list[int]], name: str, rank: int) -> list[int] | None:
    """The dims --input-shape gives input ``name`` of rank ``rank``: its own, else a
    shape given without a name of that rank (a user's bare 1x3x224x224), else None."""
    if name in shapes:
        return shapes[name]
    bare = shapes.get("")
    return bare if bare is not None and len(bare) == rank else None


def input_shape(vi: onnx.ValueInfoProto, shapes: dict[str, list[int]], default: int = 1,
                fill: int | None = None, batches: set[str] = frozenset(),
                derived: dict[int, int] | None = None, fill_batch: bool = False) -> list[int]:
    """The dims of input ``vi``: the user's, else the declared ones with each symbolic dim
    the size a weight fixes for it (``derived``, see :func:`weight_dims`), else ``default``,
    or ``fill`` past the first position (the batch stays ``default``, as does a dim named
    as a batch, see :func:`batch_names`; a 1-D input's only dim, a length, takes
    ``fill``; with ``fill_batch``, the batch too: the last resort for inputs whose first
    dim is not a batch, madmom's [frames, bins])."""
    tt = vi.type.tensor_type
    dims = list(tt.shape.dim)
    given = given_dims(shapes, vi.name, len(dims))
    if given is not None:
        return given
    derived = derived or {}
    return [d.dim_value if _declared(d)
            else derived[i] if i in derived
            else default if fill is None or (_is_batch(dims, i, batches) and not fill_batch)
            else fill for i, d in enumerate(dims)]


def dim_expression(text: str):
    """(sympy expression, its names) for a symbolic dim that is arithmetic of others, as
    optimum and torch's exporters declare an attention mask after a KV cache:
    'past_sequence_length + sequence_length'; None for a plain name, or text that is no
    such sum or product ('batch-size' reads as one, judged by the caller: its names must
    be dims of their own)."""
    if not re.fullmatch(r"[\w\s+\-*/()]+", text) or not re.search(r"[-+*/]", text):
        return None
    names = set(re.findall(r"[A-Za-z_]\w*", text))
    if not names:
        return None
    import sympy
    from sympy.parsing.sympy_parser import parse_expr

    try:   # every name a symbol of its own: 'N', 'S' or 'E' is no sympy constant here
        return parse_expr(text, local_dict={n: sympy.Symbol(n) for n in names}), names
    except (SyntaxError, TypeError, ValueError, ZeroDivisionError, sympy.SympifyError):
        return None


def expression_dims(inputs: list, shapes: dict[str, list[int]], given=()) -> None:
    """Sets, in ``shapes`` ({input: dims}, changed in place), each dim declared as an
    expression of other inputs' symbolic dims (:func:`dim_expression`) to its value under
    theirs, except in the inputs the user sized (``given``): with each dim 1, a mask of
    'past_sequence_length + sequence_length' got 1 where the model needs 2, and no random
    input ran an optimum decoder with its KV cache (every size tried gave it one length)."""
    values, exprs = {}, []
    for vi in inputs:
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if not d.dim_param or i >= len(shapes[vi.name]):
                continue
            e = dim_expression(d.dim_param)
            if e is None:
                values.setdefault(d.dim_param, shapes[vi.name][i])
            elif vi.name not in given:
                exprs.append((vi.name, i, e))
    for name, i, (expr, names) in exprs:
        if names <= values.keys():
            v = expr.subs({n: values[n] for n in names})
            if v.is_integer and v >= 0:
                shapes[name][i] = int(v)


def _declared(d) -> bool:
    """A fixed dim. A declared 0 is one: onnxruntime runs such an input with 0 rows only. A
    -1 (PaddleOCR's exports) is dynamic."""
    return d.HasField("dim_value") and d.dim_value >= 0


def _is_batch(dims, i: int, batches) -> bool:
    return (i == 0 and len(dims) > 1) or (bool(dims[i].dim_param) and dims[i].dim_param in batches)


def symbolic_dims(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None,
                  batch: bool = False,
                  derived: dict[str, dict[int, int]] | None = None) -> dict[str, list[int]]:
    """{input: positions past the first (or a 1-D input's only one) whose dims are symbolic,
    not named as a batch (``batch``: the batch too), not fixed by a weight and not set by
    the user}. ``derived``: :func:`weight_dims` of the model, when the caller has it."""
    shapes = shapes or {}
    batches = batch_names(model)
    derived = weight_dims(model) if derived is None else derived
    out = {}
    for vi in real_inputs(model):
        if not vi.type.HasField("tensor_type"):
            continue
        dims = list(vi.type.tensor_type.shape.dim)
        if given_dims(shapes, vi.name, len(dims)) is not None:
            continue
        pos = [i for i, d in enumerate(dims) if (batch or not _is_batch(dims, i, batches))
               and not _declared(d) and i not in derived.get(vi.name, {})]
        if pos:
            out[vi.name] = pos
    return out


# Random inputs put this in the symbolic dims past the batch first. With 1 there, an
# attention's softmax runs over one element (always 1) and a recurrence over one step, so a
# rewrite that broke the Q.K path or a reshape of the time axis would still verify
# (an int8 MiniLM was verified at sequence length 1). Where the original does not run with
# it, FALLBACK_FILLS[0] (32) is tried, then 1, then the rest of FALLBACK_FILLS.
FIRST_FILL = 8

# Sizes tried, in order, for symbolic dims past the batch when random inputs with 1 there
# cannot run the original (a conv or pooling window larger than 1, a reshape that needs a
# multiple): the smallest usual sizes, so verification stays fast; 1024 last, for audio
# windows (openwakeword's mel spectrogram: an STFT of 512 samples as a conv).
FALLBACK_FILLS = (32, 224, 1024)


# Random inputs beyond this (all inputs together) are refused: a declared batch of 10^6
# makes a verification run that takes minutes and gigabytes (found by tools/fuzz.py).
# Users with such inputs pass --input-shape or their own --inputs (not limited).
MAX_FEED_BYTES = 64 << 20


def make_feeds(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None,
               seed: int = 0, fill: int | None = None, fill_batch: bool = False,
               ints: tuple[int, int] = (0, 4)) -> dict[str, np.ndarray]:
    """Seeded random inputs: N(0,1) floats, small non-negative integers, random bools.

    Integer inputs are often indices or lengths, so they get values in [0, 4), or below
    the rows of the table they index where that is smaller (:func:`index_bounds`: BERT's
    token_type_ids pick one of 2 rows); float inputs cast to such indices get whole numbers
    in the same range. Symbolic dims a weight fixes get that size (:func:`weight_dims`),
    the others 1, or ``fill`` past the first position (see :func:`input_shape`).
    ``ints`` is the [low, high) of integer values, (0, 4) unless the original gives NaN
    everywhere on them (an attention mask of 3 overflows T5's masking: api.new_verifier).
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    bounds = index_bounds(model)
    boxes = box_inputs(model)
    inputs = real_inputs(model)
    sizes = feed_shapes(model, shapes, fill, fill_batch)
    for vi in inputs:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = sizes[vi.name]
        if np.issubdtype(dtype, np.floating) and vi.name in boxes and shape and shape[-1] == 4:
            # RoiAlign's rois: N(0,1) corners are inverted boxes of under a pixel, on
            # which onnxruntime and MIGraphX differ (half_pixel); valid boxes instead
            x1y1 = rng.uniform(0, 16, size=shape[:-1] + [2])
            x = np.concatenate([x1y1, x1y1 + rng.uniform(2, 16, size=shape[:-1] + [2])], -1)
            x = x.astype(dtype)
        elif np.issubdtype(dtype, np.floating) and vi.name in bounds:
            # Floats cast to indices (tf2onnx's embeddings read float ids)
            x = rng.integers(ints[0], max(ints[0] + 1, min(ints[1], bounds[vi.name])),
                             size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            x = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            x = rng.random(shape) < 0.5
        else:
            x = rng.integers(ints[0], max(ints[0] + 1, min(ints[1], bounds.get(vi.name, 4))),
                             size=shape).astype(dtype)
        feeds[vi.name] = np.asarray(x, dtype=dtype)   # 0-d stays an array, not a scalar
    for name, (size, dtype) in length_inputs(model, feeds).items():
        # a separate stream: every other input keeps the values it had
        n = len(feeds[name])
        x = np.random.default_rng([seed, 1]).integers(max(1, size // 2), size + 1, n)
        feeds[name] = np.concatenate([[size], x[1:]])[:n].astype(dtype)
    return feeds


def feed_shapes(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None,
                fill: int | None = None, fill_batch: bool = False,
                derived: dict | None = None) -> dict[str, list[int]]:
    """{input: the shape :func:`make_feeds` draws it at}, checked without allocating:
    InputError for an unknown --input-shape name, an input that is not a tensor or of a
    type random inputs cannot take, and inputs over MAX_FEED_BYTES in all (declared dims
    can be absurd, 2^40). The MIGraphX step asks before the output is written, where
    --verify has not already drawn them (a failure then wrote the output: exit 2).
    ``derived``: :func:`weight_dims`'s result where the caller has it (it infers shapes)."""
    shapes = shapes or {}
    inputs = real_inputs(model)
    unknown = set(shapes) - {i.name for i in inputs} - {""}
    if unknown:
        names = ", ".join(i.name for i in inputs)
        raise InputError(f"--input-shape names unknown input(s) {sorted(unknown)}; inputs: {names}")
    for vi in inputs:
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input '{vi.name}' is not a tensor; pass it with --inputs")
    batches = batch_names(model) if fill is not None else frozenset()
    derived = weight_dims(model) if derived is None else derived
    sizes = {vi.name: list(input_shape(vi, shapes, fill=fill, batches=batches,
                                       derived=derived.get(vi.name), fill_batch=fill_batch))
             for vi in inputs}
    expression_dims(inputs, sizes, given=shapes)
    total = 0.0
    for vi in inputs:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer)
                or dtype == np.bool_):
            raise InputError(f"input '{vi.name}' has dtype {dtype}; pass it with --inputs")
        total += float(np.prod([float(d) for d in sizes[vi.name]])) * dtype.itemsize
        if total > MAX_FEED_BYTES:
            raise InputError(f"input '{vi.name}' of shape {sizes[vi.name]} is too large for "
                             f"random inputs (all inputs over {MAX_FEED_BYTES >> 20} MB); set "
                             "smaller dims with --input-shape or pass --inputs")
    return sizes


def length_inputs(model: onnx.ModelProto, feeds: dict) -> dict[str, tuple[int, object]]:
    """{input: (its values' upper end, dtype)} for the 1-D integer inputs that are lengths
    of a batch of signals: named so ("len" in the name: waveforms_lens, length,
    speech_lengths, x_lens) and sized by the leading (batch) dim of a float input of rank 2
    or more. Values in [0, 4) mask all but a few samples (onnx-asr's kaldi, NeMo and
    wespeaker front-ends then output zeros everywhere, a check that checks nothing), so
    they get that input's length: its longest symbolic dim past the batch (its longest
    dim past the batch where none is symbolic), the first sample whole, the others from
    half of it up."""
    decl = {vi.name: list(vi.type.tensor_type.shape.dim) for vi in real_inputs(model)
            if vi.type.HasField("tensor_type")}
    signals = [(dims, feeds[k].shape) for k, dims in decl.items()
               if k in feeds and len(dims) >= 2 and np.issubdtype(feeds[k].dtype, np.floating)]
    out = {}
    for k, dims in decl.items():
        x = feeds.get(k)
        if x is None or len(dims) != 1 or "len" not in k.lower() \
                or not np.issubdtype(x.dtype, np.integer):
            continue
        for sd, shape in signals:
            same = (dims[0].dim_param and dims[0].dim_param == sd[0].dim_param) or (
                _declared(dims[0]) and _declared(sd[0]) and dims[0].dim_value == sd[0].dim_value)
            if not same or shape[0] != x.shape[0]:
                continue
            free = [shape[i] for i in range(1, len(sd)) if not _declared(sd[i])]
            out[k] = (int(max(free or shape[1:])), x.dtype)
            break
    return out


# Ops that pass an integer input's values on unchanged (a subset, a copy, a new shape): an
# index keeps its meaning through them. Gather passes values on from its data (input 0).
_SAME_VALUES = {"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand",
                "Transpose", "Slice", "Tile", "Concat", "Gather"}
# Ops that carry their data's shape, read through to find how many rows a table has
# (a weight dequantised by Cast and Mul, or by DequantizeLinear, before the Gather).
_SAME_SHAPE = {"Cast", "Identity", "Mul", "DequantizeLinear"}


def index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """{input: how many rows the smallest constant table it indexes has}: inputs
    that reach a Gather's indices through value-preserving ops, where the Gather's data is
    a weight (an initializer or a Constant) of static shape. Random indices below that
    bound are valid; above it onnxruntime refuses the original model."""
    from rewriter.core.graph import constant_tensors

    g = model.graph
    shapes = {name: list(t.dims) for name, t in constant_tensors(g).items()}
    producer, consumers = {}, {}
    for n in g.node:
        for o in n.output:
            producer[o] = n
        for i, x in enumerate(n.input):
            consumers.setdefault(x, []).append((n, i))

    def table_shape(name, depth=0):
        if name in shapes:
            return shapes[name]
        n = producer.get(name)
        if n is None or depth > 4 or n.op_type not in _SAME_SHAPE or not n.input:
            return None
        return table_shape(n.input[0], depth + 1)

    out = {}
    for vi in real_inputs(model):
        bound = None
        for n, i in _value_reads(vi.name, consumers):
            if n.op_type == "Gather" and i == 1:
                dims = table_shape(n.input[0])
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                if dims and -len(dims) <= axis < len(dims) and dims[axis] > 0:
                    bound = min(bound or dims[axis], dims[axis])
            elif n.op_type == "RoiAlign" and i == 2:
                bound = 1   # an image of X's batch, which random inputs make 1
        if bound is not None:
            out[vi.name] = bound
    return out


def box_inputs(model: onnx.ModelProto) -> set[str]:
    """Inputs whose values reach a RoiAlign's rois (input 1) through value-preserving
    ops: they get boxes with x1 < x2 and y1 < y2 (a Mask R-CNN-style head, fifteenth
    round), not N(0,1) corners."""
    consumers = {}
    for n in model.graph.node:
        for i, x in enumerate(n.input):
            consumers.setdefault(x, []).append((n, i))
    return {vi.name for vi in real_inputs(model)
            if any(n.op_type == "RoiAlign" and i == 1
                   for n, i in _value_reads(vi.name, consumers))}


def _value_reads(name: str, consumers: dict):
    """(node, input index) of every read of ``name``'s values, directly or through
    value-preserving ops (_SAME_VALUES, by their first input)."""
    todo, seen = [name], set()
    while todo:
        t = todo.pop()
        if t in seen:
            continue
        seen.add(t)
        for n, i in consumers.get(t, []):
            yield n, i
            if n.op_type in _SAME_VALUES and i == 0:
                todo.extend(n.output[:1])


def branch_values(model: onnx.ModelProto, limit: int = 3) -> dict[str, list]:
    """{input: constants it is compared with}: inputs that reach an Equal with a one-element
    constant through value-preserving ops (Silero VAD: Equal(sr, 16000) -> If picks its
    16 kHz branch). Random values almost never equal those constants, so the branch they
    select would never be verified: :func:`branch_feed_sets` adds a feed set per value.
    An input an If reads as its condition (:func:`condition_inputs`) gets True and False."""
    from rewriter.core.graph import constant_tensors, graph_protos

    consts = {name: t for g in graph_protos(model.graph)   # a body reads outer names
              for name, t in constant_tensors(g).items() if int(np.prod(t.dims)) == 1}
    consumers = _consumers(model)
    out: dict[str, list] = {}
    for vi in real_inputs(model):
        values = []
        for n, i in _value_reads(vi.name, consumers):
            other = n.input[1 - i] if n.op_type == "Equal" and len(n.input) == 2 else None
            if other in consts:
                v = onnx.numpy_helper.to_array(consts[other]).ravel()[0].item()
                if v not in values:
                    values.append(v)
            elif n.op_type == "If" and i == 0:
                values += [v for v in (True, False) if v not in values]
        if values:
            out[vi.name] = values[:limit]
    return out


def _consumers(model: onnx.ModelProto) -> dict[str, list]:
    """{tensor name: [(node, input index)]} over the graph and its bodies."""
    from rewriter.core.graph import graph_protos

    out: dict[str, list] = {}
    for g in graph_protos(model.graph):
        for n in g.node:
            for i, x in enumerate(n.input):
                out.setdefault(x, []).append((n, i))
    return out


def condition_inputs(model: onnx.ModelProto) -> set[str]:
    """Inputs an If reads as its condition, directly or through value-preserving ops:
    optimum's merged decoders take use_cache_branch, and a random bool verified one of
    their two branches only."""
    consumers = _consumers(model)
    return {vi.name for vi in real_inputs(model)
            if any(n.op_type == "If" and i == 0 for n, i in _value_reads(vi.name, consumers))}


def branch_feed_sets(model: onnx.ModelProto, feeds: dict) -> list[dict]:
    """``feeds`` and, for each input :func:`branch_values` finds, a copy with that input set
    to each constant it is compared with (the other inputs as they are)."""
    sets = [feeds]
    for name, values in branch_values(model).items():
        if name not in feeds:
            continue
        x = np.asarray(feeds[name])
        for v in values:
            if x.size and np.all(x == v):   # the random set has it already
                continue
            sets.append({**feeds, name: np.full(x.shape, v, dtype=x.dtype)})
    return sets


def _inference_stub(model: onnx.ModelProto) -> onnx.ModelProto:
    """A weight-free copy without the exporter's value_info and output shapes: what shape
    inference derives from the inputs alone."""
    from rewriter.core.graph import weight_free_copy

    stub = weight_free_copy(model)
    del stub.graph.value_info[:]
    for vi in stub.graph.output:
        vi.type.tensor_type.ClearField("shape")
    return stub


# Ops whose (first) output has their first input's last dim, for weight_dims' walk up from
# an attention's query where shape inference stopped at a contrib op.
KEEPS_LAST_DIM = {"RotaryEmbedding", "SimplifiedLayerNormalization", "LayerNormalization",
                  "SkipSimplifiedLayerNormalization", "SkipLayerNormalization", "Add", "Mul",
                  "Cast", "Identity"}


def weight_dims(model: onnx.ModelProto) -> dict[str, dict[int, int]]:
    """{input: {position: size}} for the symbolic input dims whose size a layer's weight
    fixes: a MatMul's contracted dim (B's rows), a Gemm's, a Conv's channels (W's input
    channels times the groups), a ConvTranspose's, an LSTM/GRU/RNN's input size (W's last
    dim), a GroupQueryAttention's KV cache head dim (the query's width over its heads).
    madmom's beat trackers declare their input [input_dim_0, input_dim_1] and feed it
    to an LSTM whose W is [1, 100, 266]: no size but 266 runs them, and nothing else in
    the model says so.

    The dims are followed by onnx's shape inference on a weight-free copy (an unnamed
    symbolic dim gets a name first; the exporter's value_info and output shapes are
    dropped, so only what inference derives from the inputs counts). A dim only counts
    when every weight that fixes it agrees."""
    from rewriter.core.convert import shape_info
    from rewriter.core.graph import constant_tensors

    stub = _inference_stub(model)
    where: dict[str, list[tuple[str, int]]] = {}   # dim name -> (input, position)
    for vi in real_inputs(stub):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for i, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            if not d.dim_param:
                d.dim_param = f"__rewrite_{vi.name}_{i}"
            where.setdefault(d.dim_param, []).append((vi.name, i))
    if not where:
        return {}
    infos = shape_info(stub)
    weights = {name: list(t.dims) for name, t in constant_tensors(model.graph).items()}

    def dims(name: str) -> list | None:
        if name in weights:
            return weights[name]
        vi = infos.get(name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return None
        return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else d.dim_param
                for d in vi.type.tensor_type.shape.dim]

    found: dict[str, set[int]] = {}

    def fixes(data: str, axis: int, size) -> None:
        got = dims(data)
        if got and -len(got) <= axis < len(got) and isinstance(size, int) and size > 0 \
                and got[axis] in where:
            found.setdefault(got[axis], set()).add(size)

    producer = {o: n for n in model.graph.node for o in n.output}
    consts = constant_tensors(model.graph)

    def last_dim(name: str, depth: int = 0):
        # shape inference stops at onnxruntime's own ops: the projection's weight says it
        # (through RotaryEmbedding, Qwen3's per-head norm's Reshapes, the DML form's casts)
        got, p = dims(name), producer.get(name)
        if got and isinstance(got[-1], int) and got[-1] > 0:
            return got[-1]
        if p is None or depth > 8:
            return None
        if p.op_type == "MatMul" and len(p.input) > 1:
            w = dims(p.input[1])
            return w[-1] if w and isinstance(w[-1], int) else None
        if p.op_type == "MatMulNBits":   # com.microsoft: N, the outputs
            return next((a.i for a in p.attribute if a.name == "N"), None)
        if p.op_type == "Reshape" and len(p.input) > 1 and p.input[1] in consts \
                and consts[p.input[1]].data_location != onnx.TensorProto.EXTERNAL:
            s = onnx.numpy_helper.to_array(consts[p.input[1]]).reshape(-1)
            if s.size and s[-1] > 0:
                return int(s[-1])
        if p.op_type in KEEPS_LAST_DIM and p.input and p.output[0] == name:
            return last_dim(p.input[0], depth + 1)
        return None

    for n in model.graph.node:
        if n.op_type == "GroupQueryAttention" and len(n.input) > 4:
            # the KV cache's head dim (the genai builder declares it "kv_cache_dim"):
            # the query's width over num_heads, or the packed QKV's over all heads
            attr = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            width, heads = last_dim(n.input[0]), int(attr.get("num_heads", 0))
            if not n.input[1]:
                heads += 2 * int(attr.get("kv_num_heads", 0))
            if width and heads and width % heads == 0:
                for past in n.input[3:5]:
                    if past:
                        fixes(past, -1, width // heads)
            continue
        w = dims(n.input[1]) if len(n.input) > 1 and n.input[1] else None
        if not w:
            continue
        attr = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "MatMul":
            fixes(n.input[0], -1, w[-2] if len(w) >= 2 else w[0])
        elif n.op_type == "Gemm" and len(w) == 2:
            fixes(n.input[0], 0 if attr.get("transA") else 1, w[1 if attr.get("transB") else 0])
        elif n.op_type == "Conv" and len(w) >= 3 and isinstance(w[1], int):
            fixes(n.input[0], 1, w[1] * int(attr.get("group", 1)))
        elif n.op_type == "ConvTranspose" and len(w) >= 3:
            fixes(n.input[0], 1, w[0])
        elif n.op_type in ("LSTM", "GRU", "RNN") and len(w) == 3:
            fixes(n.input[0], 2, w[2])
    out: dict[str, dict[int, int]] = {}
    for name, sizes in found.items():
        if len(sizes) == 1:
            for inp, pos in where[name]:
                out.setdefault(inp, {})[pos] = next(iter(sizes))
    return out


def dense_fill(model: onnx.ModelProto, shapes: dict[str, list[int]] | None = None,
               fill_batch: bool = False, top: int = 4096) -> int | None:
    """The size that, put in every free symbolic dim (past the batch; with ``fill_batch``
    in the first dims too), gives a weight's rows to the first layer that needs them and
    does not get them from a known dim: a MatMul's or Gemm's contracted dim, or the dims
    after the first of a Reshape to [-1, K]'s input (a flatten into a Dense of K rows).
    None when there is none, or no size gives it. madmom's note CNN reads [frames, bins]
    and flattens its conv maps into [-1, 1060] for a Dense of 1060 rows: only 106 bins
    run it, which neither :func:`weight_dims` (the weight is past the convs) nor the usual
    sizes find. Conv, pooling and flattening sizes do not decrease as the input grows, so
    the size is found by bisection over onnx's shape inference on a weight-free copy
    (about 12 runs)."""
    from rewriter.core.convert import shape_info
    from rewriter.core.graph import constant_tensors

    consts = constant_tensors(model.graph)
    needs = []   # (tensor, which dims of it multiply to the rows, rows)
    for n in model.graph.node:
        t = consts.get(n.input[1]) if len(n.input) > 1 else None
        if t is None:
            continue
        attr = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "MatMul" and len(t.dims) == 2:
            needs.append((n.input[0], slice(-1, None), t.dims[0]))
        elif n.op_type == "Gemm" and len(t.dims) == 2:
            a = 0 if attr.get("transA") else 1
            needs.append((n.input[0], slice(a, a + 1), t.dims[1 if attr.get("transB") else 0]))
        elif n.op_type == "Reshape" and list(t.dims) == [2]:
            target = onnx.numpy_helper.to_array(t).tolist()
            if target[0] == -1 and target[1] > 0:
                needs.append((n.input[0], slice(1, None), target[1]))
    if not needs:
        return None
    stub = _inference_stub(model)
    batches = batch_names(model) if not fill_batch else frozenset()
    derived = weight_dims(model)

    def sizes(size: int | None) -> list:
        fixed = None if size is None else {
            vi.name: input_shape(vi, shapes or {}, fill=size, batches=batches,
                                 derived=derived.get(vi.name), fill_batch=fill_batch)
            for vi in real_inputs(model) if vi.type.HasField("tensor_type")}
        infos = shape_info(stub, fixed)
        out = []
        for name, which, _ in needs:
            vi = infos.get(name)
            dims = list(vi.type.tensor_type.shape.dim)[which] if vi is not None and \
                vi.type.tensor_type.HasField("shape") else []
            known = [d.dim_value for d in dims if d.HasField("dim_value") and d.dim_value > 0]
            out.append(int(np.prod(known)) if dims and len(known) == len(dims) else None)
        return out

    k = next((i for i, d in enumerate(sizes(None)) if d is None), None)
    if k is None:
        return None
    rows = needs[k][2]
    lo, hi = 1, top
    while lo < hi:   # the smallest size whose dims reach the rows
        mid = (lo + hi) // 2
        got = sizes(mid)[k]
        if got is not None and got >= rows:
            hi = mid
        else:
            lo = mid + 1
    got = sizes(lo)
    return lo if got[k] == rows and all(d is None or d == r for d, (_, _, r) in
                                        zip(got, needs)) else None


def load_inputs(path: str | os.PathLike, model: onnx.ModelProto, folder: bool = False
                ) -> dict[str, np.ndarray] | list[dict[str, np.ndarray]]:
    """Inputs from an .npz (keys = input names) or an .npy (single-input models); with
    ``folder``, ``path`` may be a folder of them, one sample each (sorted by name): a list."""
    if folder and os.path.isdir(path):
        files = sorted(f for f in os.listdir(path) if f.endswith((".npz", ".npy")))
        if not files:
            raise InputError(f"{path}: a folder without .npz or .npy inputs")
        return [load_inputs(os.path.join(path, f), model) for f in files]
    names = [i.name for i in real_inputs(model)]
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise InputError(f"{path}: cannot read inputs ({e.strerror})") from None
    if str(path).endswith(".npy") and head != b"\x93NUMPY":
        raise InputError(f"{path}: not an .npy file (numpy.save writes one)")
    if not str(path).endswith(".npy") and not head.startswith(b"PK"):
        # numpy's own message guessed "pickled (object) data" for a text file (tenth round)
        raise InputError(f"{path}: not an .npz file (numpy.savez writes one, keys = input "
                         "names)")
    try:
        if str(path).endswith(".npy"):
            if len(names) != 1:
                raise InputError(f"{path}: an .npy file needs a single-input model; inputs: {names}")
            return {names[0]: np.load(path, allow_pickle=False)}
        with np.load(path, allow_pickle=False) as z:
            feeds = {k: z[k] for k in z.files}
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"{path}: cannot read inputs ({type(e).__name__}: {e})") from None
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"{path}: missing input(s) {missing}; has {sorted(feeds)}")
    extra = sorted(set(feeds) - set(names))
    if extra:   # a misspelt name was ignored where the right one was there too
        raise InputError(f"{path}: key(s) {extra} name no input of the model; inputs: "
                         f"{names}")
    return {n: feeds[n] for n in names}


def feed_batch(feed: dict) -> int:
    """The samples one feed set holds: the leading dim of its first input of rank 2 or more
    (a 1-D input's dim is a length), else 1."""
    for v in feed.values():
        if np.ndim(v) >= 2:
            return int(np.shape(v)[0])
    return 1


def stack_runs(runs: list[list[np.ndarray]], feed_sets: list[dict] | None = None
               ) -> list[np.ndarray]:
    """Per output, the runs joined with one sample per row of axis 0, as the judges count
    samples: concatenated on axis 0 where that axis is each run's batch (``feed_sets`` tell
    the batches; without them it is assumed), else stacked on a new axis 0, one row per run
    (a recogniser's [T, N, classes] has T positions of one sample, not T samples); joined
    flat where shapes disagree."""
    return join_runs(runs, feed_sets)[0]


def join_runs(runs: list[list[np.ndarray]], feed_sets: list[dict] | None = None
              ) -> tuple[list[np.ndarray], list[bool], list[np.ndarray | None]]:
    """:func:`stack_runs`, and per output whether its axis 0 was the runs' batch (False:
    the axis was added, so a [n, C] result is not a batch of C classes by its shape), and
    where it was ragged, which of its values are real: runs of other lengths (a tagger's
    [1, T, tags] over sentences of T tokens) are padded with zeros to the longest, which
    leaves each sample's cosine as it is; the mask (True at the runs' own values, the
    joined output's shape; None where nothing was padded) keeps padded rows out of top-1
    (:func:`metrics.real_positions`)."""
    batches = [feed_batch(f) for f in feed_sets] if feed_sets is not None else None
    out, flags, ragged = [], [], []
    for arrays in zip(*runs):
        arrays = [np.asarray(a) for a in arrays]
        batched = all(a.ndim >= 1 for a in arrays) and (
            batches is None or all(a.shape[0] == b for a, b in zip(arrays, batches)))
        flags.append(batched)
        uneven = len({a.shape[1 if batched else 0:] for a in arrays}) > 1
        mask = None
        if uneven and len({a.ndim for a in arrays}) == 1:
            first = 1 if batched else 0
            top = np.max([a.shape[first:] for a in arrays], axis=0)
            pads = [[(0, 0)] * first + [(0, int(t) - d) for d, t in zip(a.shape[first:], top)]
                    for a in arrays]
            mask = [np.pad(np.ones(a.shape, bool), p) for a, p in zip(arrays, pads)]
            mask = np.concatenate(mask) if batched else np.stack(mask)
            arrays = [np.pad(a, p) for a, p in zip(arrays, pads)]
        ragged.append(mask)
        if len(arrays) == 1:
            out.append(arrays[0] if batched else arrays[0][None])
            continue
        try:
            out.append(np.concatenate(arrays, axis=0) if batched else np.stack(arrays))
        except ValueError:
            out.append(np.concatenate([a.ravel() for a in arrays]))
    return out, flags, ragged
