"""The writer: atomic, streamed, external data beside the output when needed.

Temp files beside the target, then ``os.replace``; big or externally stored weights go to
``<output>.data``, streamed in chunks from wherever they live (numpy arrays, the input's
memory-mapped external data, untouched protos). The protobuf encoding is written by hand
around them, so no serialized copy of the weights is ever made.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from .convert import EXTERNAL_THRESHOLD, MEMORY, Exported, is_stub, raw_bytes
from .errors import InputError
from .graph import copy_fields, iter_model_tensors, tensor_nbytes, varint
from .load import ExternalValues, _external_info, resolve_external

# Write external data whenever the weights get close to protobuf's 2 GB hard limit.
PROTO_LIMIT = 2**31 - 2**26


def total_weight_bytes(model: onnx.ModelProto) -> int:
    n = 0
    for t in iter_model_tensors(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            info = _external_info(t)
            if info.get("location") == MEMORY:
                n += tensor_nbytes(t)
            else:
                n += int(info.get("length", 0))
        else:
            n += tensor_nbytes(t) if t.data_type != onnx.TensorProto.STRING else t.ByteSize()
    return n


def _source_chunks(t: onnx.TensorProto, exp: Exported) -> tuple[int, object]:
    """(byte length, chunk iterator) of a big tensor's data, wherever it lives."""
    if is_stub(t):
        w = exp.weights[t.name]
        if isinstance(w, np.ndarray):
            arr = np.ascontiguousarray(w)
            return arr.nbytes, iter([memoryview(arr).cast("B")])
        b = raw_bytes(w)
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


def save_model(exp: Exported, path: str | os.PathLike, external: bool | None = None,
               before_commit: Callable[[], None] | None = None) -> list[str]:
    """Write atomically; return the files written.

    ``before_commit`` runs once the bytes are in temporary files, before they are renamed
    into place; if it raises, nothing is written (the gate's last check runs meanwhile).

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
        return _save(exp, out, folder, external, before_commit)
    except OSError as e:
        # ENOSPC, EROFS, EACCES for root on odd filesystems ...: the user's to fix (exit 2).
        raise InputError(f"{out}: cannot write the output ({e.strerror or e})") from None


def _save(exp: Exported, out: Path, folder: Path, external: bool | None,
          before_commit: Callable[[], None] | None) -> list[str]:
    model = exp.model
    inits = list(model.graph.initializer)
    has_ext = any(t.data_location == onnx.TensorProto.EXTERNAL and not is_stub(t) for t in inits)
    if external is None:
        external = has_ext or total_weight_bytes(model) > PROTO_LIMIT
    data_name = out.name + ".data"
    if has_ext:
        # The input's weights are streamed from its data files while the output is written,
        # and the input is never modified: neither output file may be one of them.
        targets = {os.path.realpath(out)} | ({os.path.realpath(folder / data_name)}
                                             if external else set())
        for t in inits:
            if t.data_location == onnx.TensorProto.EXTERNAL and not is_stub(t):
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
                pieces.append((head.SerializeToString() + b"\x4a" + varint(n), n, chunks))
        if data_f is not None:
            data_f.close()
        graph_body = shell.graph.SerializeToString()
        graph_len = len(graph_body) + sum(
            1 + len(varint(len(h) + n)) + len(h) + n for h, n, _ in pieces)
        g = shell.graph
        shell.ClearField("graph")
        with os.fdopen(fd, "wb") as f:
            f.write(shell.SerializeToString())
            f.write(b"\x3a" + varint(graph_len))  # ModelProto.graph: field 7
            f.write(graph_body)
            for h, n, chunks in pieces:
                f.write(b"\x2a" + varint(len(h) + n))  # GraphProto.initializer: field 5
                f.write(h)
                if chunks is not None:
                    for c in chunks:
                        f.write(c)
        shell.graph.CopyFrom(g)
        # mkstemp creates 0600 files; an output is an ordinary file (0666 minus the umask).
        mode = 0o666 & ~_umask()
        for t in tmps:
            os.chmod(t, mode)
        if before_commit is not None:
            before_commit()
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


def _copy_shell(model: onnx.ModelProto, shell: onnx.ModelProto) -> None:
    """Copy everything but the graph's initializers (no weight bytes are touched)."""
    copy_fields(model, shell, "graph")
    copy_fields(model.graph, shell.graph, "initializer")
