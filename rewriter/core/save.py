"""The writer: atomic, streamed, external data beside the output when needed.

Temp files beside the target, then ``os.replace``; big or externally stored weights go to
``<output>.data``, streamed in chunks from wherever they live (numpy arrays, the input's
memory-mapped external data, untouched protos). The protobuf encoding is written by hand
around them, so no serialized copy of the weights is ever made.
"""

from __future__ import annotations

import mmap
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from .convert import EXTERNAL_THRESHOLD, MEMORY, Exported, is_stub, raw_bytes
from .errors import InputError
from .graph import copy_fields, iter_model_tensors, onnx_bytes, tensor_nbytes, varint
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
        if isinstance(w, np.ndarray) and w.dtype.kind != "V":
            arr = np.ascontiguousarray(w)
            return arr.nbytes, iter([memoryview(arr).cast("B")])
        if isinstance(w, ExternalValues):   # an inline weight left in the input file
            return w.length, w
        b = raw_bytes(w)
        return len(b), iter([b])
    if t.data_location == onnx.TensorProto.EXTERNAL:
        p, off, length = resolve_external(t, Path(exp.source_dir))
        return length, ExternalValues(t, p, off, length).raw_chunks()
    if not t.HasField("raw_data"):
        b = onnx_bytes(onnx.numpy_helper.to_array(t))
    else:
        b = t.raw_data
    return len(b), iter([b])


def _is_big(t: onnx.TensorProto) -> bool:
    return (t.data_location == onnx.TensorProto.EXTERNAL
            or (t.data_type != onnx.TensorProto.STRING and tensor_nbytes(t) > EXTERNAL_THRESHOLD))


def check_output_path(path: str | os.PathLike, what: str = "output") -> Path:
    """The folder a file can be written to at ``path``; InputError, naming ``what``, when
    it does not exist, is not writable, or ``path`` is a folder."""
    out = Path(path)
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"{out}: {what} folder does not exist")
    if not os.access(folder, os.W_OK):
        raise InputError(f"{out}: {what} folder is not writable")
    if out.is_dir():
        raise InputError(f"{out}: is a folder; give an {what} file name")
    return folder


def check_distinct(model: str | os.PathLike | None,
                   writes: list[tuple[str, str | None]]) -> None:
    """InputError when a file the run will write, (flag, path), is the input model, one
    of its external data files, or another written file: ``--report m.onnx`` replaced the
    model with JSON and exited 0. Only paths that exist can be input files; the model's
    external data are read from its proto when the file is small (EXTERNAL_SCAN_BYTES)."""

    def same(a, b) -> bool:
        try:
            return os.path.samefile(a, b)
        except OSError:
            return os.path.realpath(a) == os.path.realpath(b)

    inputs = [(str(model), "the input model")] if model is not None else []   # in memory
    if model is not None and any(p and os.path.exists(p) for _, p in writes) \
            and os.path.isfile(model) \
            and os.path.getsize(model) <= EXTERNAL_SCAN_BYTES and _names_a_location(model):
        try:
            m = onnx.load(str(model), load_external_data=False)
        except Exception:  # noqa: BLE001 - an unreadable model is refused later, with its reason
            m = None
        base = Path(model).parent
        for t in (iter_model_tensors(m.graph) if m is not None else ()):
            for e in t.external_data:
                if e.key == "location":
                    inputs.append((str(base / e.value), "the input's external data"))
    written: list[tuple[str, str]] = []
    for flag, path in writes:
        if not path:
            continue
        for other, what in inputs + written:
            if same(path, other):
                raise InputError(f"{flag} {path}: would overwrite {what}; choose another path")
        written.append((path, f"the file of {flag}"))


def _names_a_location(path: str | os.PathLike) -> bool:
    """Whether the file holds the bytes every external-data entry starts with (its key,
    "location", as protobuf writes it): a model without them has no external data to
    parse for. Searching chain4000's 12 MB: 8 ms; parsing it and walking its 21,335
    tensors: 48 ms, on every run whose output existed."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(b"\n\x08location") >= 0
    except (OSError, ValueError):   # an empty file (mmap refuses it), unreadable: parsed
        return True


# check_distinct parses a model up to this size to find its external data files (a model
# whose weights are external has a small proto; a bigger file holds them inline, and -o is
# checked against external data again when it is written): a re-run whose output exists
# costs at most a few ms of parsing, not a second load of an inline model.
EXTERNAL_SCAN_BYTES = 16 << 20


def save_model(exp: Exported, path: str | os.PathLike, external: bool | None = None,
               before_commit: Callable[[], None] | None = None) -> list[str]:
    """Write atomically; return the files written.

    ``before_commit`` runs once the bytes are in temporary files, before they are renamed
    into place; if it raises, nothing is written (the gate's last check runs meanwhile).

    Inline (one .onnx file) unless asked, unless the input used external data, or unless
    the weights approach protobuf's 2 GB limit; then weights go to ``<name>.data``. Either
    way no serialized copy of the weights is made: inline, big tensors are streamed from
    where they live with the protobuf framing written by hand around them; external, onnx-ir
    writes the arrays and memory-mapped input tensors directly.
    """
    out = Path(path)
    folder = check_output_path(out)
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
        if exp.weight_bytes is None:
            exp.weight_bytes = total_weight_bytes(model)
        external = has_ext or exp.weight_bytes > PROTO_LIMIT
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
    if external:
        return _save_external(exp, out, folder, data_name, before_commit)
    return _save_inline(exp, out, folder, inits, before_commit)


def _save_inline(exp: Exported, out: Path, folder: Path, inits: list,
                 before_commit: Callable[[], None] | None) -> list[str]:
    """One .onnx file, big tensors streamed: the protobuf encoding is written by hand around
    them (a model is its fields, then the graph field; a graph is its fields, then each
    initializer), so no serialized copy of the weights is ever made (onnx-ir's inline save
    serialises the whole model)."""
    shell = onnx.ModelProto()   # the model and graph without initializers
    _copy_shell(exp.model, shell)
    fd, tmp_model = tempfile.mkstemp(prefix=".rewrite-", suffix=".onnx.tmp", dir=folder)
    try:
        pieces = []  # per initializer: (header bytes, length, chunks or None)
        for t in inits:
            if not _is_big(t):
                pieces.append((t.SerializeToString(), 0, None))
                continue
            n, chunks = _source_chunks(t, exp)
            head = onnx.TensorProto(name=t.name, data_type=t.data_type)
            head.dims.extend(t.dims)
            # raw_data is field 9, length-delimited: tag 0x4A
            pieces.append((head.SerializeToString() + b"\x4a" + varint(n), n, chunks))
        graph_body = shell.graph.SerializeToString()
        graph_len = len(graph_body) + sum(
            1 + len(varint(len(h) + n)) + len(h) + n for h, n, _ in pieces)
        shell.ClearField("graph")
        with os.fdopen(fd, "wb") as f:
            f.write(shell.SerializeToString())
            f.write(b"\x3a" + varint(graph_len))  # ModelProto.graph: field 7
            f.write(graph_body)
            for h, n, chunks in pieces:
                f.write(b"\x2a" + varint(len(h) + n))  # GraphProto.initializer: field 5
                f.write(h)
                if isinstance(chunks, ExternalValues):
                    _copy_range(f, chunks)
                elif chunks is not None:
                    for c in chunks:
                        f.write(c)
        _commit([(tmp_model, out)], before_commit)
        return [str(out)]
    except BaseException:
        if os.path.exists(tmp_model):
            os.unlink(tmp_model)
        raise


def _copy_range(f, src: ExternalValues) -> None:
    """Append ``src``'s bytes to ``f`` with a kernel-side copy (os.copy_file_range): no
    user-space copy and no page faults on fresh buffers (0.05 s of resnet50_like's 100 MB);
    read and write where the file system refuses it."""
    f.flush()   # then f's next write goes where the kernel's copy left the descriptor
    off, left = src.offset, src.length
    with open(src.path, "rb") as g:
        try:
            while left:
                n = os.copy_file_range(g.fileno(), f.fileno(), left, off)
                if not n:
                    break
                off, left = off + n, left - n
        except (OSError, AttributeError):   # EXDEV, ENOSYS, EINVAL ...; not on this OS
            pass
        g.seek(off)
        while left:
            b = g.read(min(left, 64 << 20))
            if not b:
                raise InputError(f"{src.path} is shorter than its weights' declared data")
            f.write(b)
            left -= len(b)


def _save_external(exp: Exported, out: Path, folder: Path, data_name: str,
                   before_commit: Callable[[], None] | None) -> list[str]:
    """The .onnx file and ``<name>.data``, written by onnx-ir (measured faster than our own
    streaming writer on the 2.5 GB benchmark, same memory: docs/benchmarks_robustness.md)
    into a fresh folder beside the output, then renamed into place: the data file's
    relative location stays right, and nothing is replaced until both are complete."""
    import onnx_ir as ir

    tmp_dir = Path(tempfile.mkdtemp(prefix=".rewrite-", dir=folder))
    try:
        model = _to_onnx_ir(exp)
        ir.save(model, tmp_dir / out.name, external_data=data_name,
                size_threshold_bytes=EXTERNAL_THRESHOLD, alignment=64)
        _commit([(tmp_dir / data_name, folder / data_name), (tmp_dir / out.name, out)],
                before_commit)
        return [str(out), str(folder / data_name)]
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def _to_onnx_ir(exp: Exported):
    """``exp`` as an onnx-ir model without copying weights: stubs become onnx-ir tensors
    over the arrays behind them; the input's external tensors stay references to its data
    files (onnx-ir memory-maps them while writing)."""
    import onnx_ir as ir
    from onnx_ir import external_data

    model = ir.serde.deserialize_model(exp.model)
    if exp.source_dir is not None:
        external_data.set_base_dir(model.graph, str(exp.source_dir))
    for name, v in model.graph.initializers.items():
        if name not in exp.weights:
            continue
        w, t = exp.weights[name], v.const_value
        arr = (np.ascontiguousarray(w) if isinstance(w, np.ndarray) else
               np.frombuffer(raw_bytes(w), dtype=t.dtype.numpy()).reshape(
                   [int(d) for d in t.shape]))
        v.const_value = ir.Tensor(arr, dtype=t.dtype, name=name)
    return model


def _commit(moves: list[tuple], before_commit: Callable[[], None] | None) -> None:
    """Give the temporary files an ordinary file's mode (mkstemp makes them 0600), run
    ``before_commit``, then rename each into place (the .onnx last)."""
    mode = 0o666 & ~_umask()
    for src, _ in moves:
        os.chmod(src, mode)
    if before_commit is not None:
        before_commit()
    for src, dst in moves:
        os.replace(src, dst)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _copy_shell(model: onnx.ModelProto, shell: onnx.ModelProto) -> None:
    """Copy everything but the graph's initializers (no weight bytes are touched)."""
    copy_fields(model, shell, "graph")
    copy_fields(model.graph, shell.graph, "initializer")
