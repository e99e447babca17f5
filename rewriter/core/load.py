"""Reading untrusted model files: one :class:`InputError` line for anything wrong.

:func:`load` reads a model *without* its external weights, validates every external-data
reference (no path outside the model's folder, no symlink out, file present and long
enough, length matching dims x dtype), refuses what onnx's checker lets through but breaks
later (invalid UTF-8 in any string, unknown data types, raw data of the wrong size), and
runs the checker on a weight-free copy. :class:`ExternalValues` reads a validated external
tensor memory-mapped.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
from onnx_graphsurgeon.ir.tensor import LazyValues

from .errors import InputError
from .graph import (PACKED, SMALL_TENSOR, SUB_BYTE, graph_protos, iter_model_tensors,
                    node_bodies, ort_schema_nodes, ort_schemas_as_contrib, stable_order,
                    varint, weight_free_copy)


# A weight's bytes, shared by every read of it while any array from them is alive: a map of
# its own region of the file, or for a small one a read-only copy. A map per read (np.memmap
# at the tensor's offset) made one more mapping of the same pages each time a weight was
# read: the planner, which builds and judges ~50 models, held 960 maps of a 69 MB MiniLM
# (RSS 5 GB, 4.4 GB of it the file again and again) until the cyclic garbage collector freed
# the graphs that held them. One map of the whole file instead kept every page ever read
# mapped while any weight of the file lived: the 2.3 GB model's FP32 rewrite peaked at
# 4.5 GB RSS (its fused weights and all of the original's), 2.3 GB with a map per weight,
# which goes with the weight's last array. Copies of the small ones bound the number of maps
# by the file's size (at most one per MAP_MIN_BYTES; the kernel allows 65,530 by default).
_REGIONS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
MAP_MIN_BYTES = 1 << 20


def _region(path: str, offset: int, length: int) -> np.ndarray:
    """Bytes ``offset .. offset + length`` of ``path`` as a read-only uint8 array: the same
    array while one from it is in use and the file is unchanged (size, mtime and inode)."""
    st = os.stat(path)
    if offset + length > st.st_size:
        raise InputError(f"external data file {path} is shorter than declared")
    key = (path, offset, length, st.st_size, st.st_mtime_ns, st.st_ino)
    raw = _REGIONS.get(key)
    if raw is None:
        if length >= MAP_MIN_BYTES:
            raw = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(length,))
        else:
            raw = np.empty(length, dtype=np.uint8)
            with open(path, "rb") as f:
                f.seek(offset)
                if f.readinto(memoryview(raw)) != length:
                    raise InputError(f"external data file {path} is shorter than declared")
            raw.flags.writeable = False
        _REGIONS[key] = raw
    return raw


class ExternalValues(LazyValues):
    """Lazily loaded values of a tensor stored in an external data file.

    onnx-graphsurgeon's own LazyValues would resolve the location against the working
    directory; this one reads from the validated absolute path, memory-mapped so an
    untouched weight costs no memory and a read one costs one copy at most.
    """

    def __init__(self, tensor: onnx.TensorProto, path: str, offset: int, length: int):
        super().__init__(tensor)
        self.path, self.offset, self.length = path, offset, length
        # An inline weight left in its model file by load_model(weights_in_file=True):
        # exported as a stub, so it is written back inline.
        self.inline = is_inline_source(path)

    def load(self) -> np.ndarray:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.tensor.data_type)
        count = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        need = (count * _element_bits(self.tensor.data_type) + 7) // 8
        if need != self.length:
            raise InputError(
                f"external data for '{self.tensor.name}' has {self.length} bytes, "
                f"its shape needs {need}"
            )
        if count == 0:
            return np.zeros(self.shape, dtype=dtype)
        if self.tensor.data_type in PACKED:   # int4 ...: two to a byte, unpacked by onnx
            t = onnx.TensorProto(data_type=self.tensor.data_type, dims=self.tensor.dims)
            t.raw_data = b"".join(self.raw_chunks())
            return onnx.numpy_helper.to_array(t)
        raw = _region(self.path, self.offset, need)
        return raw.view(dtype).reshape(self.shape)

    def raw_chunks(self, chunk: int = 64 << 20) -> Iterator[bytes]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            left = self.length
            while left:
                b = f.read(min(chunk, left))
                if not b:
                    raise InputError(f"external data file {self.path} is shorter than declared")
                left -= len(b)
                yield b

def _external_info(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def resolve_external(t: onnx.TensorProto, base_dir: Path) -> tuple[str, int, int]:
    """Validated (absolute path, offset, length) of an external tensor, or InputError."""
    info = _external_info(t)
    loc = info.get("location", "")
    if not loc:
        raise InputError(f"tensor '{t.name}' is marked external but names no location")
    if os.path.isabs(loc) or loc.startswith(("/", "\\")) or ":" in loc.split("/")[0]:
        raise InputError(f"tensor '{t.name}': external data location '{loc}' is absolute; refused")
    base = os.path.realpath(base_dir)
    path = os.path.realpath(os.path.join(base, loc))
    if os.path.commonpath([base, path]) != base:
        raise InputError(
            f"tensor '{t.name}': external data location '{loc}' points outside the model's "
            "folder; refused"
        )
    if not os.path.isfile(path):
        raise InputError(f"tensor '{t.name}': external data file '{loc}' is missing")
    try:
        offset = int(info.get("offset", 0))
        size = os.path.getsize(path)
        length = int(info["length"]) if "length" in info else size - offset
    except ValueError as e:
        raise InputError(f"tensor '{t.name}': bad external data offset/length ({e})") from None
    need = _data_bytes(t)
    if need is not None:
        if "length" not in info:
            length = need  # "rest of the file" may hold other tensors after this one
        elif length != need:
            raise InputError(f"tensor '{t.name}': external data length {length} does not match "
                             f"its shape {list(t.dims)} ({need} bytes)")
    if offset < 0 or length < 0 or offset + length > size:
        raise InputError(
            f"tensor '{t.name}': external data '{loc}' is too short "
            f"(needs bytes {offset}..{offset + length}, file has {size})"
        )
    return path, offset, length


def _data_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes a fixed-size tensor's raw data takes (None for strings and unknown types)."""
    bits = _ELEMENT_BITS.get(t.data_type)
    if bits is None:
        bits = _ELEMENT_BITS[t.data_type] = _element_bits(t.data_type)
    if not bits:
        return None
    n = 1
    for d in t.dims:
        if d < 0:
            return None  # the checker reports negative dims with its own message
        n *= d
    return (n * bits + 7) // 8


_ELEMENT_BITS: dict[int, int] = {}   # data_type -> bits per element in raw data (0: n/a)


def _element_bits(data_type: int) -> int:
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(data_type)
    except Exception:  # noqa: BLE001 - unknown or undefined data type
        return 0
    if dtype.kind in "OSU":
        return 0
    packed = {getattr(onnx.TensorProto, k): b for k, b in SUB_BYTE.items()
              if hasattr(onnx.TensorProto, k)}
    return packed.get(data_type, 8 * dtype.itemsize)



def load_model(path: str | os.PathLike, check: bool = True,
               weights_in_file: bool = False) -> onnx.ModelProto:
    """Load a model file without its external data, validated; InputError on any problem.

    ``weights_in_file``: a big file's big inline weights are not parsed but referenced
    where they lie, as external data whose location is the model file itself (see
    :func:`_weights_left_in_file`); to_graph reads them memory-mapped and the writer streams
    them back inline. For callers that resolve external data against the file's folder."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if not p.is_file():
        raise InputError(f"{p}: not a file")
    try:
        model = _read_model(p, weights_in_file)
    except Exception as e:  # DecodeError, RuntimeWarning from protobuf, OSError ...
        raise InputError(f"{p}: not a readable ONNX model ({type(e).__name__}: {first_line(e)})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise InputError(f"{p}: not an ONNX model (no graph; truncated or another file type?)")
    bad = _bad_text_or_type(model)  # before reading external_data entries
    if bad:
        raise InputError(f"{p}: {bad}")
    external = False
    for t in iter_model_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            resolve_external(t, p.parent)
            external = True
    if check:
        validate_model(model, str(p), text_checked=True,
                       whole=not external and p.stat().st_size < CHECK_WHOLE_BYTES)
    return model


def _read_model(p: Path, weights_in_file: bool = False) -> onnx.ModelProto:
    """The ModelProto in ``p``, without external data. A protobuf file is parsed from a
    memory map: onnx.load_model reads the whole file into a bytes object first, one more
    copy of every inline weight (100 MB for resnet50_like). Text and JSON formats go to
    onnx.load_model."""
    fmt = onnx.serialization.registry.get_format_from_file_extension(p.suffix)
    if fmt not in (None, "protobuf"):
        return onnx.load_model(str(p), load_external_data=False)
    model = onnx.ModelProto()
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            model.ParseFromString(b"")
            return model
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            mv = memoryview(mm)
            if weights_in_file and len(mv) >= LEAVE_MIN_FILE:
                left = _weights_left_in_file(mv, p)
                if left is not None:
                    return left
            model.ParseFromString(mv)   # protobuf copies what it keeps: the map can close
        finally:
            # A view of the map still alive elsewhere (a profiler holding the scan's frame
            # made this "not a readable ONNX model (BufferError ...)"): the map then closes
            # when the last view goes.
            with contextlib.suppress(BufferError):
                mv.release()
                mm.close()
    return model


# A file this big has its big inline weights left in it (parsing copies every byte of them:
# 0.07 s and 100 MB for resnet50_like); below, the wire-format scan costs more than the
# parse saves (chain4000: 12 MB in 32,000 graph fields, 35 vs 12 ms).
LEAVE_MIN_FILE = 32 << 20
LEAVE_MIN_TENSOR = SMALL_TENSOR   # as weight_free_copy: smaller ones (Reshape shapes ...) are
                                  # read by shape inference and stay parsed
_INLINE_SOURCES: set[str] = set()   # real paths of model files whose weights were left


def is_inline_source(path: str) -> bool:
    """Whether ``path`` (resolved) is a model file whose inline weights were left in it:
    its "external" tensors are inline tensors and are written back inline."""
    return path in _INLINE_SOURCES


def _weights_left_in_file(buf: memoryview, p: Path) -> onnx.ModelProto | None:
    """The model in ``buf`` parsed without the raw data of its big top-level initializers;
    each of those becomes external data at its own bytes in ``p`` (location ``p``'s name,
    offset, length): valid ONNX that onnxruntime and MIGraphX read as it is. None (the
    caller parses everything) for anything unusual: a graph field given twice (protobuf
    would merge them), a tensor with other data fields or a size its dims disagree with,
    a name that does not resolve back to ``p``: the full parse then reports what is wrong
    with the usual messages."""
    try:
        scanned = _strip_raw_data(buf, LEAVE_MIN_TENSOR)
    except (IndexError, ValueError):
        return None
    if scanned is None or not scanned[1]:
        return None
    stripped, refs = scanned
    model = onnx.ModelProto()
    try:
        model.ParseFromString(stripped)
        inits = model.graph.initializer
        for k, offset, length in refs:
            t = inits[k]
            if _data_bytes(t) != length:
                return None
            t.data_location = onnx.TensorProto.EXTERNAL
            t.external_data.add(key="location", value=p.name)
            t.external_data.add(key="offset", value=str(offset))
            t.external_data.add(key="length", value=str(length))
        path = resolve_external(inits[refs[0][0]], p.parent)[0]
    except Exception:  # noqa: BLE001 - DecodeError, an unencodable or refused file name ...
        return None
    if path != os.path.realpath(p):
        return None
    _INLINE_SOURCES.add(path)
    return model


def _strip_raw_data(b: memoryview, min_bytes: int) -> tuple[bytes, list] | None:
    """Protobuf wire format: ``b`` (a ModelProto) without the raw_data of top-level
    initializers of more than ``min_bytes`` whose only data field is raw_data, and
    [(initializer index, raw data offset, length)] of those. None when the graph field
    occurs twice; IndexError/ValueError on malformed input."""
    parts, graph, i, end = [], None, 0, len(b)
    while i < end:
        start = i
        key, i = _read_varint(b, i)
        if key >> 3 == 7 and key & 7 == 2:   # ModelProto.graph
            if graph is not None:
                return None
            n, i = _read_varint(b, i)
            graph, i = (i, i + n), i + n
        else:
            i = _skip_field(b, i, key & 7)
            parts.append(b[start:i])
    if graph is None or i != end:
        return None
    pieces, refs, k, run = [], [], 0, graph[0]
    i, gend = graph
    while i < gend:
        start = i
        key, i = _read_varint(b, i)
        if key & 7 != 2:
            i = _skip_field(b, i, key & 7)
            continue
        n, i = _read_varint(b, i)
        body, i = i, i + n
        if key >> 3 != 5:                       # GraphProto.initializer
            continue
        if n > min_bytes:
            raw = _raw_data_field(b, body, i)
            if raw is not None and raw[3] > min_bytes:
                field_start, field_end, offset, length = raw
                rest = bytes(b[body:field_start]) + bytes(b[field_end:i])
                pieces += [b[run:start], b"\x2a" + varint(len(rest)), rest]
                refs.append((k, offset, length))
                run = i
        k += 1
    if i != gend:
        raise ValueError("graph overruns its field")
    pieces.append(b[run:gend])
    g = b"".join(pieces)
    return b"".join(parts + [b"\x3a" + varint(len(g)), g]), refs


# TensorProto fields a tensor whose data is only raw_data may carry: dims, data_type,
# name, doc_string, metadata_props.
_PLAIN_TENSOR_FIELDS = frozenset({1, 2, 8, 12, 16})


def _raw_data_field(b: memoryview, i: int, end: int) -> tuple[int, int, int, int] | None:
    """(field start, field end, data offset, data length) of a TensorProto's raw_data
    (field 9) in ``b[i:end]``, or None unless raw_data is there once and alone with data."""
    raw = None
    while i < end:
        start = i
        key, i = _read_varint(b, i)
        field, wire = key >> 3, key & 7
        if field == 9 and wire == 2 and raw is None:
            n, i = _read_varint(b, i)
            raw = (start, i + n, i, n)
            i += n
        elif field in _PLAIN_TENSOR_FIELDS:
            i = _skip_field(b, i, wire)
        else:
            return None
    if i != end:
        raise ValueError("tensor overruns its field")
    return raw


def _read_varint(b: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        c = b[i]
        i += 1
        result |= (c & 0x7F) << shift
        if c < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _skip_field(b: memoryview, i: int, wire: int) -> int:
    if wire == 0:
        return _read_varint(b, i)[1]
    if wire == 1:
        return i + 8
    if wire == 5:
        return i + 4
    if wire == 2:
        n, i = _read_varint(b, i)
        return i + n
    raise ValueError(f"wire type {wire}")   # groups (3, 4) are not in ONNX


# Below this file size (all data inline) the checker reads the model itself: serialising a
# few MB costs less than building the weight-free copy of thousands of small tensors.
CHECK_WHOLE_BYTES = 32 << 20


_DATA_TYPES = frozenset(onnx.TensorProto.DataType.values())


def _bad_text_or_type(model: onnx.ModelProto) -> str | None:
    """What onnx.checker lets through but breaks later, as a message, or None.

    protobuf does not validate proto2 strings: a name (or dim_param, location, doc string
    ...) with invalid UTF-8 reads back as bytes and fails when written into a new proto.
    The checker does not check a tensor's data_type against the enum either
    (onnx-graphsurgeon then fails with a KeyError). Every string field of the model is
    visited; tensor data is not (reading raw_data would copy it).
    """
    def text(values):
        for v in values:
            if isinstance(v, bytes):
                return f"a name or string is not valid UTF-8 ({v[:40]!r})"
        return None

    def tensor(t):
        if t.data_type not in _DATA_TYPES or t.data_type == onnx.TensorProto.UNDEFINED:
            return f"tensor {t.name!r} has an unknown data type {t.data_type}"
        return text([t.name, t.doc_string]
                    + [x for e in t.external_data for x in (e.key, e.value)])

    def walk(msg):
        if isinstance(msg, onnx.TensorProto):
            return tensor(msg)
        if isinstance(msg, onnx.NodeProto):
            return node(msg)
        return fields(msg)

    def node(n):
        """The fields nodes carry, read directly (ListFields over every node and attribute
        was most of this check's time on a 12,000-node model); a node or attribute with
        any other field set (overload, metadata, sparse tensors, type protos), or an onnx
        whose protos have fields this does not know, goes through the generic walk."""
        if not _FAST_NODES or (n.HasField("overload") or len(n.metadata_props)
                               or len(n.device_configurations)):
            return fields(n)
        bad = text([n.name, n.op_type, n.domain, n.doc_string]) or text(n.input) or text(
            n.output)
        for a in n.attribute:
            if bad:
                return bad
            if (a.HasField("sparse_tensor") or a.HasField("tp") or len(a.sparse_tensors)
                    or len(a.type_protos)):
                bad = fields(a)
                continue
            bad = text([a.name, a.doc_string, a.ref_attr_name])
            if not bad and a.HasField("t"):
                bad = tensor(a.t)
            if not bad and a.HasField("g"):
                bad = walk(a.g)
            for t in a.tensors:
                bad = bad or tensor(t)
            for g in a.graphs:
                bad = bad or walk(g)
        return bad

    def fields(msg):
        for fd, value in msg.ListFields():
            repeated = getattr(fd, "is_repeated", None)
            if repeated is None:
                repeated = fd.label == fd.LABEL_REPEATED
            values = value if repeated else [value]
            if fd.type == fd.TYPE_STRING:
                bad = text(values)
            elif fd.type == fd.TYPE_MESSAGE:
                bad = None
                for v in values:
                    bad = bad or walk(v)
            elif fd.name == "elem_type" and isinstance(msg, onnx.TypeProto.Tensor):
                bad = (None if value in _DATA_TYPES else
                       f"a value has an unknown element type {value}")
            else:
                bad = None
            if bad:
                return bad
        return None

    return walk(model)


# The node and attribute fields node() above knows; with any other (a newer onnx), it
# leaves nodes to the generic walk.
_FAST_NODES = (
    {f.name for f in onnx.NodeProto.DESCRIPTOR.fields}
    == {"input", "output", "name", "op_type", "domain", "overload", "attribute",
        "doc_string", "metadata_props", "device_configurations"}
    and {f.name for f in onnx.AttributeProto.DESCRIPTOR.fields}
    == {"name", "ref_attr_name", "doc_string", "type", "f", "i", "s", "t", "g",
        "sparse_tensor", "tp", "floats", "ints", "strings", "tensors", "graphs",
        "sparse_tensors", "type_protos"})


def first_line(e: BaseException) -> str:
    # onnx.checker spreads one message over lines ("input 'x' of node:\nname: ...\n is not
    # output of any previous nodes."): keep all of it, as one line.
    s = " ".join(str(e).split())
    return s[:300] if s else type(e).__name__


def validate_model(model: onnx.ModelProto, what: str = "model",
                   text_checked: bool = False, whole: bool = False) -> None:
    """onnx.checker on the structure (weights are not loaded, so this stays cheap).

    External tensors are checked on a copy where they are empty: for a ModelProto, the
    checker looks for external data files relative to the *working directory*, so a model
    loaded from another folder would be refused. Their files were validated by
    :func:`resolve_external` already (path inside the folder, file long enough). ``whole``
    (a small file with all data inline) checks the model itself instead of that copy.
    """
    bad = None if text_checked else _bad_text_or_type(model)
    if bad:
        raise InputError(f"{what}: {bad}")
    # The structure is what is checked: serialising the weights into the C++ checker would
    # cost a copy of them (and external tensors would be looked up relative to the cwd).
    # The checker then cannot see the stubbed tensors' sizes: those are checked here.
    for t in model.graph.initializer:
        bad = _size_problem(t)
        if bad:
            raise InputError(f"{what}: {bad}")
    bad = _output_type_contradiction(model.graph)
    if bad:
        raise InputError(f"{what}: {bad}")
    bad = _undefined_function_call(model)
    if bad:
        raise InputError(f"{what}: {bad}")
    if not model.graph.output:
        # The checker passes it; every node is dead, and the empty graph left was exit 3
        # (onnxruntime refuses a model whose initializers nothing reads; fuzz seed 61721).
        raise InputError(f"{what}: the graph has no outputs: nothing to compute (onnxruntime "
                         "refuses to run it: 'At least one output should be requested')")
    original = model
    if not whole:
        model = weight_free_copy(model, keep_dims=False)
    if ort_schema_nodes(model):   # onnxruntime's own schemas: in a copy, as custom ops
        if model is original:
            model = onnx.ModelProto()
            model.CopyFrom(original)
        ort_schemas_as_contrib(model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        # Nodes out of order (onnxruntime's float16 converter writes them so, and
        # onnxruntime runs them): sorted, in our copy, when a topological order exists.
        if "topologically sorted" in str(e) and sort_nodes(original):
            return validate_model(original, what, text_checked=True, whole=whole)
        # IR 3 wants every initializer listed as a graph input; onnxruntime runs such files
        # without (its own datasets/mul_1.onnx), and IR 4 allows it: read, and written, as 4.
        if "in initializer but not in graph input" in str(e) and original.ir_version < 4:
            original.ir_version = 4
            return validate_model(original, what, text_checked=True, whole=whole)
        # A graph output declared without a shape (onnx.helper.make_tensor_value_info with
        # shape None; a tool exposing an intermediate tensor): onnxruntime runs it, the
        # checker wants a shape. Given the inferred one, where inference knows it.
        if "Field 'shape' of 'type' is required" in str(e) and _output_shapes(original):
            return validate_model(original, what, text_checked=True, whole=whole)
        raise InputError(f"{what}: onnx.checker rejects it: {first_line(e)}") from None
    except Exception as e:  # e.g. protobuf size errors
        raise InputError(f"{what}: cannot be checked: {first_line(e)}") from None


def _undefined_function_call(model: onnx.ModelProto) -> str | None:
    """A node in the domain of the model's own functions whose op no function of that
    domain defines: onnx's checker lets it pass (it does not know the domain's ops) and
    onnxruntime refuses it; the passes read it by its name, and a 'Conv' there, one input,
    was taken for a convolution (exit 3, fuzz seed 61722)."""
    defined = {(f.domain, f.name) for f in model.functions}
    # domains with ops of their own (onnxruntime's contrib ops beside a local function)
    domains = {d for d, _ in defined if d not in ("", "ai.onnx", "ai.onnx.ml")
               and not d.startswith(("ai.onnx.", "com.microsoft"))}
    if not domains:
        return None
    from rewriter.core.graph import graph_protos, node_bodies
    graphs = [model.graph] + [b for f in model.functions for n in f.node
                              for b in node_bodies(n)]
    calls = [n for f in model.functions for n in f.node]
    for n in calls + [n for b in graphs for g in graph_protos(b) for n in g.node]:
        if n.domain in domains and (n.domain, n.op_type) not in defined:
            return (f"node '{n.name or (n.output[0] if n.output else n.op_type)}' calls "
                    f"{n.domain}.{n.op_type}, which no function of the model defines")
    return None


def _output_type_contradiction(g: onnx.GraphProto) -> str | None:
    """A graph output that is a graph input or an initializer, declared with another element
    type: onnxruntime runs it (and returns the input's type); the checker lets it pass;
    the graph we build holds one tensor for the name and took the output's type (fuzz seed
    61714 case 987: input x float, output x int8, and convert-fp16 wrote a model onnxruntime
    refused, exit 3)."""
    have = {vi.name: vi.type.tensor_type.elem_type for vi in g.input
            if vi.type.HasField("tensor_type")}
    have.update({t.name: t.data_type for t in g.initializer})
    for o in g.output:
        want = o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
        if o.name in have and want and have[o.name] and want != have[o.name]:
            name = onnx.helper.tensor_dtype_to_np_dtype
            try:
                a, b = name(have[o.name]).name, name(want).name
            except (KeyError, TypeError, ValueError):
                a, b = str(have[o.name]), str(want)
            kind = "initializer" if any(t.name == o.name for t in g.initializer) else "input"
            return (f"graph output '{o.name}' is the {kind} of that name, {a}, but is "
                    f"declared {b}: fix the declaration")
    return None


def _output_shapes(model: onnx.ModelProto) -> bool:
    """Give the graph outputs declared without a shape their inferred one; False when one
    is not known (or none was missing: the checker's complaint is about something else)."""
    from rewriter.core.convert import shape_info

    missing = [o for o in model.graph.output if o.type.HasField("tensor_type")
               and not o.type.tensor_type.HasField("shape")]
    if not missing:
        return False
    try:
        infos = shape_info(model, check=True)   # not from what the model's lies give
    except Exception:  # noqa: BLE001 - inference failing leaves the checker's word
        return False
    for o in missing:
        vi = infos.get(o.name)
        if vi is None or not vi.type.tensor_type.HasField("shape"):
            return False
    for o in missing:
        o.type.tensor_type.shape.CopyFrom(infos[o.name].type.tensor_type.shape)
    return True


def sort_nodes(model: onnx.ModelProto) -> bool:
    """Put every graph's nodes (bodies included) in a topological order, keeping the
    given order where it already is one. False when nothing moved: already in order (the
    checker's complaint is then something else, e.g. a value nobody produces), or a cycle.
    A node waits for the values it and its bodies read that its own graph produces."""
    graphs = list(graph_protos(model.graph))
    orders = []
    for g in graphs:
        made = {o: i for i, n in enumerate(g.node) for o in n.output if o}
        needs = []
        for n in g.node:
            reads = set(n.input).union(   # and what its bodies read from this graph
                *(m.input for b in node_bodies(n) for h in graph_protos(b) for m in h.node))
            needs.append({made[x] for x in reads if x in made} - {len(needs)})
        order = stable_order(needs)
        if order is None:
            return False
        orders.append(order)
    moved = False
    for g, order in zip(graphs, orders):
        if order != sorted(order):
            nodes = [onnx.NodeProto() for _ in order]
            for new, i in zip(nodes, order):
                new.CopyFrom(g.node[i])
            del g.node[:]
            g.node.extend(nodes)
            moved = True
    return moved


def _size_problem(t: onnx.TensorProto) -> str | None:
    """Negative dims, or inline raw data whose length disagrees with dims x dtype."""
    if t.dims and min(t.dims) < 0:
        return f"tensor {t.name!r} has a negative dimension {list(t.dims)}"
    if t.data_location == onnx.TensorProto.EXTERNAL or not t.HasField("raw_data"):
        return None  # external: resolve_external checks it; typed fields: the checker does
    need = _data_bytes(t)
    # Reading raw_data copies it, but protobuf's ByteSize() serialises the tensor to measure
    # it: twice the time (0.14 vs 0.07 s on 100 MB) and the same transient memory.
    have = len(t.raw_data)
    if need is not None and have != need:
        return (f"tensor {t.name!r} has {have} bytes of data, its shape {list(t.dims)} "
                f"needs {need}")
    return None
