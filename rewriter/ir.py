"""The one module that converts between ONNX protobuf and the onnx-graphsurgeon graph.

Everything about files lives here too, because files are where models get lost:

* :func:`load` reads a model *without* its external weights, validates every external-data
  reference (no path outside the model's folder, no symlink out, file present and long
  enough) and runs onnx's checker, turning every failure into one :class:`InputError` line.
* :func:`to_graph` imports into onnx-graphsurgeon; external weights become lazily
  memory-mapped values, so a 2.5 GB model is never read whole and never crosses the 2 GB
  protobuf limit.
* :func:`to_model` exports back, reusing untouched weight protos (no copies) and keeping the
  model-level fields (IR version, opsets, metadata, functions) of the original.
* :func:`save` writes atomically: temp files beside the target, then ``os.replace``; big
  or externally stored weights go to ``<output>.data`` beside the output, streamed in chunks.

Helpers the passes share: :class:`Namer` (fresh tensor names), :func:`iter_graphs`
(a graph and all its If/Loop/Scan bodies), :func:`const_value`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues

from .errors import InputError

# onnx-graphsurgeon prints its warnings on *stdout* (e.g. a multi-line dump of every pair of
# nodes sharing a name): that breaks `-q` and one-line errors. Its errors still raise.
gs.logger.G_LOGGER.severity = max(gs.logger.G_LOGGER.severity, gs.logger.G_LOGGER.ERROR)

# Tensors above this many bytes go to the external data file when we write one.
EXTERNAL_THRESHOLD = 1024
# Write external data whenever the weights get close to protobuf's 2 GB hard limit.
PROTO_LIMIT = 2**31 - 2**26


class ExternalValues(LazyValues):
    """Lazily loaded values of a tensor stored in an external data file.

    onnx-graphsurgeon's own LazyValues would resolve the location against the working
    directory; this one reads from the validated absolute path, memory-mapped so an
    untouched weight costs no memory and a read one costs one copy at most.
    """

    def __init__(self, tensor: onnx.TensorProto, path: str, offset: int, length: int):
        super().__init__(tensor)
        self.path, self.offset, self.length = path, offset, length

    def load(self) -> np.ndarray:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(self.tensor.data_type)
        count = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        if count * dtype.itemsize != self.length:
            raise InputError(
                f"external data for '{self.tensor.name}' has {self.length} bytes, "
                f"its shape needs {count * dtype.itemsize}"
            )
        if count == 0:
            return np.zeros(self.shape, dtype=dtype)
        arr = np.memmap(self.path, dtype=dtype, mode="r", offset=self.offset, shape=(count,))
        return arr.reshape(self.shape)

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


# --------------------------------------------------------------------------- loading


def _external_info(t: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def iter_model_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Initializers and Constant-node tensors of a graph and all its subgraphs."""
    yield from graph.initializer
    for sp in graph.sparse_initializer:
        yield sp.values
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.GRAPH:
                yield from iter_model_tensors(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from iter_model_tensors(sg)


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
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.data_type)
    except Exception:  # noqa: BLE001 - unknown or undefined data type
        return None
    if dtype.kind in "OSU":
        return None
    n = 1
    for d in t.dims:
        if d < 0:
            return None  # the checker reports negative dims with its own message
        n *= d
    bits = {getattr(onnx.TensorProto, k): b for k, b in SUB_BYTE.items()
            if hasattr(onnx.TensorProto, k)}.get(t.data_type)
    return (n * bits + 7) // 8 if bits else n * dtype.itemsize


# Packed types: several elements per byte in raw data (numpy holds one per byte).
SUB_BYTE = {"INT4": 4, "UINT4": 4, "FLOAT4E2M1": 4, "INT2": 2, "UINT2": 2}


def load(path: str | os.PathLike, check: bool = True) -> onnx.ModelProto:
    """Load a model file without its external data, validated; InputError on any problem."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if not p.is_file():
        raise InputError(f"{p}: not a file")
    try:
        model = onnx.load_model(str(p), load_external_data=False)
    except Exception as e:  # DecodeError, RuntimeWarning from protobuf, OSError ...
        raise InputError(f"{p}: not a readable ONNX model ({type(e).__name__}: {_first_line(e)})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise InputError(f"{p}: not an ONNX model (no graph; truncated or another file type?)")
    bad = _bad_text_or_type(model)  # before reading external_data entries
    if bad:
        raise InputError(f"{p}: {bad}")
    for t in iter_model_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            resolve_external(t, p.parent)
    if check:
        check_model(model, str(p))
    return model


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


def _first_line(e: BaseException) -> str:
    # onnx.checker spreads one message over lines ("input 'x' of node:\nname: ...\n is not
    # output of any previous nodes."): keep all of it, as one line.
    s = " ".join(str(e).split())
    return s[:300] if s else type(e).__name__


def check_model(model: onnx.ModelProto, what: str = "model") -> None:
    """onnx.checker on the structure (weights are not loaded, so this stays cheap).

    External tensors are checked on a copy where they are empty: for a ModelProto, the
    checker looks for external data files relative to the *working directory*, so a model
    loaded from another folder would be refused. Their files were validated by
    :func:`resolve_external` already (path inside the folder, file long enough).
    """
    bad = _bad_text_or_type(model)
    if bad:
        raise InputError(f"{what}: {bad}")
    # The structure is what is checked: serialising the weights into the C++ checker would
    # cost a copy of them (and external tensors would be looked up relative to the cwd).
    # The checker then cannot see the stubbed tensors' sizes: those are checked here.
    for t in model.graph.initializer:
        bad = _size_problem(t)
        if bad:
            raise InputError(f"{what}: {bad}")
    model = weight_free_copy(model, for_checker=True)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in iter_model_tensors(model.graph)):
        model = _structure_only(model)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise InputError(f"{what}: onnx.checker rejects it: {_first_line(e)}") from None
    except Exception as e:  # e.g. protobuf size errors
        raise InputError(f"{what}: cannot be checked: {_first_line(e)}") from None


def _size_problem(t: onnx.TensorProto) -> str | None:
    """Negative dims, or inline raw data whose length disagrees with dims x dtype."""
    if any(d < 0 for d in t.dims):
        return f"tensor {t.name!r} has a negative dimension {list(t.dims)}"
    if t.data_location == onnx.TensorProto.EXTERNAL or not t.HasField("raw_data"):
        return None  # external: resolve_external checks it; typed fields: the checker does
    need = _data_bytes(t)
    have = _raw_len(t)
    if need is not None and have != need:
        return (f"tensor {t.name!r} has {have} bytes of data, its shape {list(t.dims)} "
                f"needs {need}")
    return None


def _raw_len(t: onnx.TensorProto) -> int:
    """len(t.raw_data) without reading it (reading copies the bytes): from the sizes."""
    head = onnx.TensorProto()
    _copy_fields(t, head, "raw_data")
    rest = t.ByteSize() - head.ByteSize() - 1  # minus raw_data's tag byte
    for k in range(1, 11):  # the length varint takes k bytes
        if len(_varint(rest - k)) == k:
            return rest - k
    return -1


def _structure_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose external tensors are empty (dims [0]); the model proto is small then."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in iter_model_tensors(m.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
            del t.dims[:]
            t.dims.append(0)
    return m


# --------------------------------------------------------------------------- gs graph


def iter_graphs(graph: gs.Graph) -> Iterator[gs.Graph]:
    """The graph and every subgraph (If/Loop/Scan bodies), outermost first."""
    yield graph
    for node in graph.nodes:
        for v in node.attrs.values():
            if isinstance(v, gs.Graph):
                yield from iter_graphs(v)
            elif isinstance(v, list) and v and isinstance(v[0], gs.Graph):
                for sg in v:
                    yield from iter_graphs(sg)


def shape_info(model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    """Inferred value infos by name, computed on a weight-free copy of the model.

    Shape inference only needs the dims of big initializers, so they are replaced by
    empty stubs: no copy of the weights, and it works on models over 2 GB.
    """
    stub = weight_free_copy(model)
    for t in stub.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            del t.external_data[:]
            t.data_location = onnx.TensorProto.DEFAULT
    try:
        inferred = onnx.shape_inference.infer_shapes(stub, strict_mode=False, data_prop=True)
    except Exception:
        return {}
    g = inferred.graph
    return {vi.name: vi for vi in list(g.value_info) + list(g.output) + list(g.input)}


def tensor_nbytes(t: onnx.TensorProto) -> int:
    """Data size from dims and dtype: no copy (reading raw_data would copy the bytes)."""
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    try:
        item = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except Exception:
        return 0
    return int(np.prod(t.dims, dtype=np.int64)) * item


def weight_free_copy(model: onnx.ModelProto, for_checker: bool = False) -> onnx.ModelProto:
    """A copy of ``model`` whose big top-level initializers carry no data.

    For shape inference they keep their dims (declared external, with no file: inference
    reads dims only); for onnx.checker they become empty tensors (dims [0]), since the
    checker would look for an external file. Weights are never copied or serialised.
    """
    stub = onnx.ModelProto()
    _copy_fields(model, stub, "graph")
    _copy_fields(model.graph, stub.graph, "initializer")
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and (
                tensor_nbytes(t) <= 4096 or (for_checker and not t.HasField("raw_data"))):
            # (typed-field data, float_data etc., is rare for big tensors: the checker
            # validates its count)
            stub.graph.initializer.add().CopyFrom(t)
            continue
        s = stub.graph.initializer.add(name=t.name, data_type=t.data_type)
        if for_checker:
            s.dims.append(0)
        else:
            s.dims.extend(t.dims)
            s.data_location = onnx.TensorProto.EXTERNAL
            s.external_data.add(key="location", value="__stub__")
    return stub


def to_graph(model: onnx.ModelProto, base_dir: str | os.PathLike | None = None,
             infer: bool = True) -> gs.Graph:
    """Import into onnx-graphsurgeon; external weights become memory-mapped lazy values."""
    graph = gs.import_onnx(model)
    if base_dir is not None:
        for g in iter_graphs(graph):
            for t in g.tensors().values():
                if (isinstance(t, gs.Constant) and isinstance(t._values, LazyValues)
                        and not isinstance(t._values, ExternalValues)
                        and getattr(t._values.tensor, "data_location", 0) == onnx.TensorProto.EXTERNAL):
                    path, off, length = resolve_external(t._values.tensor, Path(base_dir))
                    t._values = ExternalValues(t._values.tensor, path, off, length)
            for node in g.nodes:
                for v in node.attrs.values():
                    # A Constant node's tensor stored outside (save_model(convert_attribute=
                    # True)): read it now. Exported as it came, its location would be
                    # resolved against the *output* folder, and it could not be folded.
                    if (isinstance(v, gs.Constant) and isinstance(v._values, LazyValues)
                            and v._values.tensor.data_location == onnx.TensorProto.EXTERNAL):
                        path, off, length = resolve_external(v._values.tensor, Path(base_dir))
                        v.values = np.array(
                            ExternalValues(v._values.tensor, path, off, length).load())
                        v.data_location = None
    if infer:
        infos = shape_info(model)
        for g in iter_graphs(graph):
            for name, t in g.tensors().items():
                vi = infos.get(name)
                if isinstance(t, gs.Variable) and vi is not None and vi.type.HasField("tensor_type"):
                    tt = vi.type.tensor_type
                    if t.dtype is None and tt.elem_type:
                        t.dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
                    if t.shape is None and tt.HasField("shape"):
                        t.shape = [d.dim_value if d.HasField("dim_value") else
                                   (d.dim_param or None) for d in tt.shape.dim]
    return graph


MEMORY = "__rewrite_memory__"  # location of a weight stub whose bytes live in Exported.weights


class Exported:
    """A model whose big weights are stubs, plus where each stub's bytes are.

    ``model`` is small (no big weights inside), so checking, verifying and saving it never
    copy the weights through protobuf; a stub is a TensorProto with external data at
    location ``MEMORY``; ``weights[name]`` is a numpy array or lazy values to stream.
    """

    def __init__(self, model: onnx.ModelProto, weights: dict, source_dir):
        self.model, self.weights, self.source_dir = model, weights, source_dir

    def array(self, name: str) -> np.ndarray:
        w = self.weights[name]
        return w if isinstance(w, np.ndarray) else w.load()

    def ort_initializers(self) -> tuple[list[str], list[np.ndarray]]:
        names = sorted(self.weights)
        return names, [np.ascontiguousarray(self.array(n)) for n in names]

    def checkable(self) -> onnx.ModelProto:
        """A copy onnx.checker accepts: stubs become empty tensors (structure only)."""
        def empty(t):
            del t.dims[:]
            t.dims.append(0)
        return self._copy_replacing_stubs(empty)

    def materialize(self) -> onnx.ModelProto:
        """The full ModelProto with every stub's bytes inline (for the Python API)."""
        def fill(t):
            t.raw_data = _raw_bytes(self.weights[t.name])
        return self._copy_replacing_stubs(fill)

    def _copy_replacing_stubs(self, fix) -> onnx.ModelProto:
        m = onnx.ModelProto()
        m.CopyFrom(self.model)
        for t in m.graph.initializer:
            if _is_stub(t):
                del t.external_data[:]
                t.data_location = onnx.TensorProto.DEFAULT
                fix(t)
        return m


def _is_stub(t: onnx.TensorProto) -> bool:
    return (t.data_location == onnx.TensorProto.EXTERNAL and len(t.external_data) == 1
            and t.external_data[0].value == MEMORY)


def _raw_bytes(w) -> bytes:
    if isinstance(w, np.ndarray):
        return np.ascontiguousarray(w).tobytes()
    if isinstance(w, ExternalValues):
        return b"".join(w.raw_chunks())
    t = w.tensor
    return t.raw_data if t.HasField("raw_data") else onnx.numpy_helper.to_array(t).tobytes()


def _stub(name: str, dtype: int, dims) -> onnx.TensorProto:
    t = onnx.TensorProto(name=name, data_type=dtype, data_location=onnx.TensorProto.EXTERNAL)
    t.dims.extend(int(d) for d in dims)
    t.external_data.add(key="location", value=MEMORY)
    return t


def export(graph: gs.Graph, original: onnx.ModelProto, source_dir=None) -> Exported:
    """Export with big top-level weights as stubs (see :class:`Exported`).

    Untouched weights are never copied: their original proto or memory map is what gets
    streamed at save time. Weights in original external files stay references to them.
    """
    weights: dict = {}
    swapped = []
    for g in iter_graphs(graph):
        for t in g.tensors().values():
            if isinstance(t, gs.Constant) and not isinstance(t._values, LazyValues):
                # gs keeps the imported data_location and writes it on export: a weight that
                # was external and got new values would be "external" with inline bytes.
                t.data_location = None
    for t in graph.tensors().values():
        if not isinstance(t, gs.Constant) or t.name in weights:
            continue
        v = t._values
        if isinstance(v, ExternalValues):
            continue  # keeps its reference to the source file
        if isinstance(v, LazyValues):
            if v.tensor.data_type == onnx.TensorProto.STRING or v.nbytes <= EXTERNAL_THRESHOLD:
                continue
            src, dtype, dims = v, v.tensor.data_type, v.shape
        else:
            arr = t.values
            if arr.dtype.kind in "OSU" or arr.nbytes <= EXTERNAL_THRESHOLD:
                continue
            src, dtype, dims = arr, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape
        weights[t.name] = src
        swapped.append((t, v))
        t._values = LazyValues(_stub(t.name, dtype, dims))
    try:
        model = to_model(graph, original)
    finally:
        for t, v in swapped:  # the graph stays as it was
            t._values = v
    return Exported(model, weights, source_dir)


def to_model(graph: gs.Graph, original: onnx.ModelProto) -> onnx.ModelProto:
    """Export, keeping the original's model-level fields and only its value_info names."""
    model = gs.export_onnx(graph, do_type_check=False)
    model.ir_version = original.ir_version
    graph_inputs = {i.name for i in model.graph.input}
    if original.ir_version < 4 and any(t.name not in graph_inputs for t in model.graph.initializer):
        # IR 3 requires every initializer to be a graph input; we treat weights as constants
        # (dropping IR-3 weight inputs, adding folded initializers), which IR 4 allows.
        model.ir_version = 4
    # gs only knows the default domain's version: the original's opset list is the truth,
    # plus any domain a pass introduced, and a default-domain bump a pass made.
    added = [op for op in model.opset_import
             if op.domain not in {o.domain for o in original.opset_import}]
    opsets = [onnx.helper.make_opsetid(o.domain, max(o.version, graph.opset)
                                       if o.domain in ("", "ai.onnx") else o.version)
              for o in original.opset_import]
    del model.opset_import[:]
    model.opset_import.extend(opsets + added)
    model.producer_name, model.producer_version = "rewrite", _version()
    model.doc_string = original.doc_string
    model.domain, model.model_version = original.domain, original.model_version
    del model.metadata_props[:]
    model.metadata_props.extend(original.metadata_props)
    if not model.functions and original.functions:
        model.functions.extend(original.functions)
    model.graph.name = original.graph.name
    keep_vi = {vi.name for vi in original.graph.value_info}
    vis = [vi for vi in model.graph.value_info if vi.name in keep_vi]
    del model.graph.value_info[:]
    model.graph.value_info.extend(vis)
    unique_node_names(model)
    return model


def _graph_protos(g: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graph_protos(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    yield from _graph_protos(sg)


def duplicate_node_names(model: onnx.ModelProto) -> bool:
    """Does any graph have two nodes with one (non-empty) name? onnxruntime refuses those."""
    for g in _graph_protos(model.graph):
        names = [n.name for n in g.node if n.name]
        if len(names) != len(set(names)):
            return True
    return False


def unique_node_names(model: onnx.ModelProto) -> int:
    """Rename the second and later nodes sharing a name within a graph (``name_1`` ...).

    ONNX only says node names are for diagnostics, but onnxruntime refuses a graph with two
    nodes of one name. The first keeps its name (plans name nodes). Returns how many changed.
    """
    changed = 0
    for g in _graph_protos(model.graph):
        names = [n.name for n in g.node if n.name]
        if len(names) == len(set(names)):
            continue
        used, seen = set(names), set()
        for n in g.node:
            if not n.name:
                continue
            if n.name in seen:
                i = 1
                while f"{n.name}_{i}" in used:
                    i += 1
                n.name = f"{n.name}_{i}"
                used.add(n.name)
                changed += 1
            seen.add(n.name)
    return changed


def _version() -> str:
    from . import __version__
    return __version__


# --------------------------------------------------------------------------- saving


def total_weight_bytes(model: onnx.ModelProto) -> int:
    n = 0
    for t in iter_model_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = _external_info(t)
            if info.get("location") == MEMORY:
                n += int(np.prod(t.dims, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(
                    t.data_type).itemsize
            else:
                n += int(info.get("length", 0))
        else:
            n += tensor_nbytes(t) if t.data_type != onnx.TensorProto.STRING else t.ByteSize()
    return n


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _source_chunks(t: onnx.TensorProto, exp: Exported) -> tuple[int, object]:
    """(byte length, chunk iterator) of a big tensor's data, wherever it lives."""
    if _is_stub(t):
        w = exp.weights[t.name]
        if isinstance(w, np.ndarray):
            arr = np.ascontiguousarray(w)
            return arr.nbytes, iter([memoryview(arr).cast("B")])
        b = _raw_bytes(w)
        return len(b), iter([b])
    if t.data_location == onnx.TensorProto.EXTERNAL:
        p, off, length = resolve_external(t, Path(exp.source_dir))
        return length, ExternalValues(t, p, off, length).raw_chunks()
    if not t.HasField("raw_data"):
        b = onnx.numpy_helper.to_array(t).tobytes()
    else:
        b = t.raw_data
    return len(b), iter([b])


def _is_big(t: onnx.TensorProto) -> bool:
    return (t.data_location == onnx.TensorProto.EXTERNAL
            or (t.data_type != onnx.TensorProto.STRING and tensor_nbytes(t) > EXTERNAL_THRESHOLD))


def save(exp: Exported, path: str | os.PathLike, external: bool | None = None) -> list[str]:
    """Write atomically; return the files written.

    Inline (one .onnx file) unless asked, unless the input used external data, or unless
    the weights approach protobuf's 2 GB limit; then weights go to ``<name>.data``. Either
    way big tensors are streamed from where they live: the protobuf encoding is written by
    hand around them (a model is its fields, then the graph field; a graph is its fields,
    then each initializer), so no serialized copy of the weights is ever made.
    """
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{out}: output folder does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{out}: output folder is not writable")
    if out.is_dir():
        raise InputError(f"{out}: is a folder; give an output file name")
    try:
        return _save(exp, out, folder, external)
    except OSError as e:
        # ENOSPC, EROFS, EACCES for root on odd filesystems ...: the user's to fix (exit 2).
        raise InputError(f"{out}: cannot write the output ({e.strerror or e})") from None


def _save(exp: Exported, out: Path, folder: Path, external: bool | None) -> list[str]:
    model = exp.model
    inits = list(model.graph.initializer)
    has_ext = any(t.data_location == onnx.TensorProto.EXTERNAL and not _is_stub(t) for t in inits)
    if external is None:
        external = has_ext or total_weight_bytes(model) > PROTO_LIMIT
    data_name = out.name + ".data"
    if has_ext:
        # The input's weights are streamed from its data files while the output is written,
        # and the input is never modified: neither output file may be one of them.
        targets = {os.path.realpath(out)} | ({os.path.realpath(folder / data_name)}
                                             if external else set())
        for t in inits:
            if t.data_location == onnx.TensorProto.EXTERNAL and not _is_stub(t):
                src = resolve_external(t, Path(exp.source_dir))[0]
                if os.path.realpath(src) in targets:
                    raise InputError(f"{out}: writing would overwrite the input's external data "
                                     f"{src}; choose another output name")
    # The model and graph without initializers; initializers are appended after them.
    shell = onnx.ModelProto()
    _copy_shell(model, shell)
    tmps: list[str] = []
    try:
        data_f = None
        if external:
            fd, tmp_data = tempfile.mkstemp(prefix=".rewrite-", suffix=".data.tmp", dir=folder)
            tmps.append(tmp_data)
            data_f = os.fdopen(fd, "wb")
        fd, tmp_model = tempfile.mkstemp(prefix=".rewrite-", suffix=".onnx.tmp", dir=folder)
        tmps.append(tmp_model)
        pieces = []  # per initializer: (header bytes, length, chunks or None)
        offset = 0
        for t in inits:
            if not _is_big(t):
                pieces.append((t.SerializeToString(), 0, None))
                continue
            n, chunks = _source_chunks(t, exp)
            head = onnx.TensorProto(name=t.name, data_type=t.data_type)
            head.dims.extend(t.dims)
            if external:
                pad = (-offset) % 64  # aligned for memory-mapping readers
                data_f.write(b"\0" * pad)
                offset += pad
                for c in chunks:
                    data_f.write(c)
                head.data_location = onnx.TensorProto.EXTERNAL
                for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(n))):
                    head.external_data.add(key=k, value=v)
                offset += n
                pieces.append((head.SerializeToString(), 0, None))
            else:
                # raw_data is field 9, length-delimited: tag 0x4A
                pieces.append((head.SerializeToString() + b"\x4a" + _varint(n), n, chunks))
        if data_f is not None:
            data_f.close()
        graph_body = shell.graph.SerializeToString()
        graph_len = len(graph_body) + sum(
            1 + len(_varint(len(h) + n)) + len(h) + n for h, n, _ in pieces)
        g = shell.graph
        shell.ClearField("graph")
        with os.fdopen(fd, "wb") as f:
            f.write(shell.SerializeToString())
            f.write(b"\x3a" + _varint(graph_len))  # ModelProto.graph: field 7
            f.write(graph_body)
            for h, n, chunks in pieces:
                f.write(b"\x2a" + _varint(len(h) + n))  # GraphProto.initializer: field 5
                f.write(h)
                if chunks is not None:
                    for c in chunks:
                        f.write(c)
        shell.graph.CopyFrom(g)
        # mkstemp creates 0600 files; an output is an ordinary file (0666 minus the umask).
        mode = 0o666 & ~_umask()
        for t in tmps:
            os.chmod(t, mode)
        written = []
        if external:
            os.replace(tmps[0], folder / data_name)
            written.append(str(folder / data_name))
        os.replace(tmp_model, out)
        return [str(out)] + written
    except BaseException:
        for t in tmps:
            if os.path.exists(t):
                os.unlink(t)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _copy_fields(src, dst, skip: str) -> None:
    for fd, value in src.ListFields():
        if fd.name == skip:
            continue
        repeated = getattr(fd, "is_repeated", None)  # protobuf >= 6 dropped .label
        if repeated is None:
            repeated = fd.label == fd.LABEL_REPEATED
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.type == fd.TYPE_MESSAGE:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def _copy_shell(model: onnx.ModelProto, shell: onnx.ModelProto) -> None:
    """Copy everything but the graph's initializers (no weight bytes are touched)."""
    _copy_fields(model, shell, "graph")
    _copy_fields(model.graph, shell.graph, "initializer")


# --------------------------------------------------------------------------- helpers


def _subgraph_inputs(node: gs.Node) -> list[gs.Tensor]:
    """Tensors a node's subgraphs read (outer-scope references included)."""
    found: list[gs.Tensor] = []
    for v in node.attrs.values():
        graphs = [v] if isinstance(v, gs.Graph) else (
            v if isinstance(v, list) and v and isinstance(v[0], gs.Graph) else [])
        for sg in graphs:
            for n in sg.nodes:
                found.extend(n.inputs)
                found.extend(_subgraph_inputs(n))
    return found


def toposort(graph: gs.Graph) -> None:
    """Stable topological sort of a graph and its subgraphs.

    Nodes keep their original order wherever the data flow allows it (Kahn's algorithm
    with the old index as priority): outputs stay readable, diffs small and deterministic.
    A subgraph's outer-scope reads count as inputs of the node that owns it.
    """
    import heapq

    for g in iter_graphs(graph):
        nodes = g.nodes
        index = {id(n): i for i, n in enumerate(nodes)}
        producer = {}
        for n in nodes:
            for t in n.outputs:
                producer[id(t)] = n
        consumers: dict[int, list[int]] = {}
        indeg = [0] * len(nodes)
        for i, n in enumerate(nodes):
            deps = set()
            for t in list(n.inputs) + _subgraph_inputs(n):
                p = producer.get(id(t))
                if p is not None and p is not n:
                    deps.add(index[id(p)])
            indeg[i] = len(deps)
            for d in deps:
                consumers.setdefault(d, []).append(i)
        ready = [i for i, d in enumerate(indeg) if d == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for c in consumers.get(i, ()):
                indeg[c] -= 1
                if indeg[c] == 0:
                    heapq.heappush(ready, c)
        if len(order) != len(nodes):
            from .errors import InputError
            raise InputError(f"graph '{g.name}' has a cycle")
        g.nodes = [nodes[i] for i in order]



class Namer:
    """Fresh, unique tensor/node names for one graph and its subgraphs.

    Two new tensors with one name would export as one and give silently wrong numbers, so
    every name a pass invents comes from here.
    """

    def __init__(self, graph: gs.Graph):
        self.used: set[str] = set()
        for g in iter_graphs(graph):
            self.used.update(g.tensors().keys())
            self.used.update(n.name for n in g.nodes if n.name)

    def __call__(self, base: str) -> str:
        base = base or "t"
        name, i = base, 0
        while name in self.used:
            i += 1
            name = f"{base}_{i}"
        self.used.add(name)
        return name


def upgrade_opset(graph: gs.Graph, original: onnx.ModelProto, base_dir, target: int
                  ) -> tuple[gs.Graph, onnx.ModelProto]:
    """The graph converted to default-domain opset ``target`` with onnx's version converter
    (per-axis QuantizeLinear/DequantizeLinear need opset 13); (graph, new original)."""
    model = export(graph, original, base_dir).materialize()
    try:
        converted = onnx.version_converter.convert_version(model, target)
    except Exception as e:
        raise InputError(f"cannot convert the model to opset {target}: {_first_line(e)}") from None
    new_original = onnx.ModelProto()
    new_original.CopyFrom(original)
    del new_original.opset_import[:]
    new_original.opset_import.extend(converted.opset_import)
    return to_graph(converted, base_dir), new_original


def set_values(t: gs.Constant, values: np.ndarray) -> None:
    """Replace a constant's values (and dtype). Graph.copy() pins export_dtype to the old
    dtype, which would make the exporter refuse a new one."""
    t.values = values
    t._export_dtype = None


def const_value(t: gs.Tensor) -> np.ndarray | None:
    """The values of a constant tensor, else None."""
    if isinstance(t, gs.Constant):
        return t.values
    return None


def is_const(t: gs.Tensor) -> bool:
    return isinstance(t, gs.Constant)


def graph_output_names(graph: gs.Graph) -> set[str]:
    return {t.name for t in graph.outputs}
