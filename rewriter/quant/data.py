"""Calibration data: a folder or an iterable in, a validated stream of feed dicts out.

:func:`load_calibration` turns a folder (``.npy``, ``.npz`` or images with a
:class:`Preprocess`) or an iterable of ``{input_name: array}`` dicts into
:class:`CalibrationData`: a re-iterable, lazily loaded, validated stream of feed dicts that
can hold samples out (:meth:`CalibrationData.split`, :func:`held_out_count`). Files are read
in sorted order; nothing is read until iterated. See docs/calibration.md.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from rewriter.core.errors import InputError, RewriteError

NPY, NPZ, IMAGE = "npy", "npz", "image"
# A labels file beside the samples: one label (class index) per sample, in reading order.
LABEL_FILES = ("labels.txt", "labels.json", "labels.npy")
IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")


# --------------------------------------------------------------------------- preprocess

_INTERPOLATION = ("nearest", "bilinear", "bicubic", "lanczos", "box")
_RESIZE = ("stretch", "center-crop")
_DTYPES = ("float32", "float16", "float64", "uint8", "int8")


@dataclass(frozen=True)
class Preprocess:
    """How an image file becomes a model input: ``x = (pixel * scale - mean) / std``.

    Fields (all optional; the plan's ``preprocess:`` section uses the same names):

    ``size``
        (h, w) of the model input; None takes the input's static dims.
    ``resize``
        ``stretch`` (straight to (h, w)) or ``center-crop`` (scale so the image covers
        (h, w) keeping its aspect ratio, then cut out the centre).
    ``interpolation``
        nearest, bilinear (default), bicubic, lanczos or box (Pillow's filters).
    ``mean``, ``std``
        one value or one per channel, in the units *after* ``scale`` and in the model's
        channel order (after a BGR swap) (ImageNet RGB: mean 0.485 0.456 0.406, std 0.229
        0.224 0.225 with scale 1/255).
    ``scale``
        multiplies the 0..255 pixel first; default (None) 1/255 for a float input and raw
        pixels for an integer one. ``"1/255"`` is accepted as text.
    ``layout``
        NCHW or NHWC; None reads it from the input's static dims (channels 1 or 3),
        falling back to NCHW.
    ``channel_order``
        RGB (default) or BGR. One-channel inputs get greyscale (Pillow's "L").
    ``dtype``
        None takes the model input's; integer dtypes take raw pixels (scale unset or 1,
        mean 0, std 1).
    """

    size: tuple[int, int] | None = None
    resize: str = "stretch"
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    scale: float | None = None
    layout: str | None = None
    channel_order: str = "RGB"
    dtype: str | None = None

    def __post_init__(self):
        # Validate here so that Preprocess(...) from Python fails as clearly as a plan file.
        set_ = lambda k, v: object.__setattr__(self, k, v)
        set_("size", _parse_size(self.size))
        set_("resize", _choice("resize", self.resize, _RESIZE))
        set_("interpolation", _choice("interpolation", self.interpolation, _INTERPOLATION))
        set_("mean", _floats("mean", self.mean))
        set_("std", _floats("std", self.std))
        if any(not s > 0 for s in self.std):
            raise InputError(f"preprocess.std must be > 0, got {list(self.std)}")
        if self.scale is not None:
            set_("scale", _number("scale", self.scale))
            if not self.scale > 0:
                raise InputError(f"preprocess.scale must be > 0, got {self.scale}")
        if self.layout is not None:
            set_("layout", _choice("layout", self.layout, ("NCHW", "NHWC"), upper=True))
        set_("channel_order", _choice("channel_order", self.channel_order, ("RGB", "BGR"),
                                      upper=True))
        if self.dtype is not None:
            try:
                name = np.dtype(self.dtype).name
            except TypeError:
                name = str(self.dtype)
            set_("dtype", _choice("dtype", name, _DTYPES))
        # A mean in 0..255 units with the default 1/255 scale gives garbage ranges silently.
        if self.pixel_scale * 255.0 <= 1.0 + 1e-6 and max(abs(m) for m in self.mean) > 1.5:
            raise InputError(
                f"preprocess.mean {list(self.mean)} looks like 0..255 units but scale is "
                f"{self.pixel_scale:g} (pixels in 0..1); set scale: 1 or give mean in 0..1 units")

    @property
    def pixel_scale(self) -> float:
        """The scale a float input gets: the one given, else 1/255."""
        return 1.0 / 255.0 if self.scale is None else self.scale

    @classmethod
    def from_dict(cls, d: dict | None) -> Preprocess:
        """From the plan's ``preprocess:`` mapping; InputError on unknown keys or bad values."""
        if d is None:
            return cls()
        if isinstance(d, Preprocess):
            return d
        if not isinstance(d, dict):
            raise InputError(f"preprocess: expected a mapping of settings, got {type(d).__name__}")
        fields = [f.name for f in dataclasses.fields(cls)]
        for k in d:
            if k not in fields:
                near = difflib.get_close_matches(str(k), fields, n=1)
                hint = f"; did you mean '{near[0]}'?" if near else f"; known: {', '.join(fields)}"
                raise InputError(f"preprocess: unknown key '{k}'{hint}")
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _choice(key: str, v, options: Sequence[str], upper: bool = False) -> str:
    s = str(v).upper() if upper else str(v).lower()
    if s not in options:
        raise InputError(f"preprocess.{key}: '{v}' is not one of {', '.join(options)}")
    return s


def _number(key: str, v) -> float:
    if isinstance(v, str) and "/" in v:  # YAML has no fractions: "1/255"
        a, _, b = v.partition("/")
        try:
            return float(a) / float(b)
        except (ValueError, ZeroDivisionError):
            raise InputError(f"preprocess.{key}: '{v}' is not a number") from None
    if isinstance(v, bool):
        raise InputError(f"preprocess.{key}: '{v}' is not a number")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise InputError(f"preprocess.{key}: '{v}' is not a number") from None
    if not math.isfinite(f):
        raise InputError(f"preprocess.{key}: '{v}' is not finite")
    return f


def _floats(key: str, v) -> tuple[float, ...]:
    items = list(v) if isinstance(v, (list, tuple, np.ndarray)) else [v]
    if not items:
        raise InputError(f"preprocess.{key}: needs one value or one per channel")
    return tuple(_number(key, x) for x in items)


def _parse_size(v) -> tuple[int, int] | None:
    if v is None:
        return None
    if isinstance(v, str):
        parts = v.lower().replace(",", "x").split("x")
    elif isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        parts = [v, v]
    elif isinstance(v, (list, tuple)):
        parts = list(v)
    else:
        raise InputError(f"preprocess.size: '{v}' is not [h, w], an int or 'HxW'")
    try:
        hw = tuple(int(str(p).strip()) for p in parts)
    except ValueError:
        raise InputError(f"preprocess.size: '{v}' is not [h, w], an int or 'HxW'") from None
    if len(hw) != 2 or min(hw) < 1:
        raise InputError(f"preprocess.size: '{v}' must be two positive ints [h, w]")
    return hw


# --------------------------------------------------------------------------- model inputs


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: np.dtype
    dims: tuple  # int for a static dim, None for a symbolic/unknown one

    def shape_text(self) -> str:
        return "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"

    def check(self, arr: np.ndarray, where: str) -> None:
        # A string input takes numpy's str arrays (what .npz holds without pickle; onnxruntime
        # reads them as it reads object arrays of str).
        strings = self.dtype == object
        if arr.dtype != self.dtype and not (strings and arr.dtype.kind == "U"):
            fix = ("a numpy str array, e.g. np.array(['a', 'b'])" if strings
                   else f"convert with .astype(np.{self.dtype})")
            raise InputError(f"{where}: input '{self.name}' has dtype {arr.dtype}, the model "
                             f"expects {'strings' if strings else self.dtype} ({fix})")
        ok = arr.ndim == len(self.dims) and all(
            d is None or d == s for d, s in zip(self.dims, arr.shape))
        if not ok:
            hint = ""
            if arr.ndim == len(self.dims) - 1:
                hint = " (batch dimension missing? each sample must include it)"
            raise InputError(f"{where}: input '{self.name}' has shape {list(arr.shape)}, the "
                             f"model expects {self.shape_text()} (? = any){hint}")


def _model_inputs(model: onnx.ModelProto) -> list[_Input]:
    from rewriter.verify import real_inputs

    out = []
    for vi in real_inputs(model):
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input '{vi.name}' is not a tensor; calibration feeds tensors only")
        tt = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                     for d in tt.shape.dim)
        out.append(_Input(vi.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)),
                          dims))
    if not out:
        raise InputError("the model has no inputs to calibrate with")
    return out


def _proto(model) -> onnx.ModelProto:
    """The ModelProto of ``model``: itself, an Exported's, or a path's (loaded, validated,
    without external data; a path was an AttributeError)."""
    from rewriter.core.convert import Exported

    if isinstance(model, (str, os.PathLike)):
        from rewriter.core.load import load_model
        return load_model(model)
    if not isinstance(model, (onnx.ModelProto, Exported)):
        raise InputError(f"model: a path or an onnx.ModelProto, got {type(model).__name__}")
    return model.model if isinstance(model, Exported) else model


# --------------------------------------------------------------------------- readers


def _npy_header(f) -> tuple[tuple, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    else:
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    return tuple(shape), np.dtype(dtype)


def _describe(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:200]}" if s else type(e).__name__


def _read_npy(path: Path, header_only: bool):
    try:
        if header_only:
            with open(path, "rb") as f:
                return _npy_header(f)
        return np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any decoder error is a bad file
        raise InputError(f"{path}: not a readable .npy file ({_describe(e)})") from None


def _read_npz(path: Path, names: list[str], header_only: bool):
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [n for n in names if n not in z.files]
            if missing:
                raise InputError(f"{path}: missing input(s) {missing}; the file has "
                                 f"{sorted(z.files)} (keys must be the model's input names)")
            if not header_only:
                return {n: z[n] for n in names}
            out = {}
            for n in names:
                with z.zip.open(n + ".npy") as f:
                    out[n] = _npy_header(f)
            return out
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - BadZipFile, ValueError, OSError, EOFError ...
        raise InputError(f"{path}: not a readable .npz file ({_describe(e)})") from None


def _pillow():
    try:
        from PIL import Image, ImageOps
    except ImportError:
        raise InputError("reading an image folder needs Pillow: pip install pillow") from None
    return Image, ImageOps


class _ImageReader:
    """One image file -> one (C, H, W) or (H, W, C) array, per :class:`Preprocess`."""

    def __init__(self, spec: _Input, pre: Preprocess, given=None):
        """``given``: the input's shape from --input-shape, if any: its H and W size the
        images where the model's are symbolic and the preprocessing names no size."""
        if len(spec.dims) != 4:
            raise InputError(f"an image folder needs a 4-D image input; '{spec.name}' is "
                             f"{spec.shape_text()}")
        d = spec.dims
        layout = pre.layout
        if layout is None:  # channels 1 or 3 at one place and not the other says which
            layout = "NHWC" if d[3] in (1, 3) and d[1] not in (1, 3) else "NCHW"
        c, h, w = (d[1], d[2], d[3]) if layout == "NCHW" else (d[3], d[1], d[2])
        if c is None:
            c = 3
        if c not in (1, 3):
            raise InputError(f"input '{spec.name}' {spec.shape_text()} has {c} channels in "
                             f"{layout} layout; images give 1 or 3 (set preprocess.layout?)")
        if pre.size is not None:
            if (h is not None and h != pre.size[0]) or (w is not None and w != pre.size[1]):
                raise InputError(f"preprocess.size {list(pre.size)} does not fit input "
                                 f"'{spec.name}' {spec.shape_text()} ({layout})")
            h, w = pre.size
        elif (h is None or w is None) and given is not None and len(given) == 4:
            gh, gw = (given[2], given[3]) if layout == "NCHW" else (given[1], given[2])
            h, w = h or int(gh), w or int(gw)
        elif h is None or w is None:
            raise InputError(f"input '{spec.name}' {spec.shape_text()} has no static height "
                             f"and width: give them, e.g. --input-shape {spec.name}:"
                             f"{'1x3xHxW' if layout == 'NCHW' else '1xHxWx3'}, or size: [h, w] "
                             "in --preprocess FILE or the plan's preprocess: section")
        dtype = np.dtype(pre.dtype) if pre.dtype is not None else spec.dtype
        if dtype != spec.dtype:
            raise InputError(f"preprocess.dtype {dtype} differs from input '{spec.name}' "
                             f"dtype {spec.dtype}")
        for key, v in (("mean", pre.mean), ("std", pre.std)):
            if len(v) not in (1, c):
                raise InputError(f"preprocess.{key} has {len(v)} values; input '{spec.name}' "
                                 f"has {c} channels")
        # An unset scale is no request to scale: an integer input takes the pixels as they are.
        identity = pre.scale in (None, 1.0) and set(pre.mean) == {0.0} and set(pre.std) == {1.0}
        if dtype.kind in "iu" and not identity:
            raise InputError(f"input '{spec.name}' is {dtype}: raw pixels only; set scale: 1, "
                             "mean: 0, std: 1")
        if dtype.kind not in "iuf":
            raise InputError(f"input '{spec.name}' is {dtype}; images give numbers")
        self.spec, self.pre, self.layout, self.dtype = spec, pre, layout, dtype
        self.c, self.h, self.w = c, h, w
        self.mean = np.asarray(pre.mean, np.float32)
        self.std = np.asarray(pre.std, np.float32)

    def check_header(self, path: Path) -> None:
        Image, _ = _pillow()
        try:
            with Image.open(path) as im:
                im.size  # noqa: B018 (Image.open reads the header only)
        except Exception as e:  # noqa: BLE001 - any decoder error is a bad file
            raise InputError(f"{path}: not a readable image ({_describe(e)})") from None

    def __call__(self, path: Path) -> np.ndarray:
        Image, ImageOps = _pillow()
        try:
            with Image.open(path) as im:
                im = ImageOps.exif_transpose(im)
                im = im.convert("L" if self.c == 1 else "RGB")
                im = self._resize(im, Image)
                pix = np.asarray(im, dtype=np.float32)
        except InputError:
            raise
        except Exception as e:  # noqa: BLE001 - any decoder error is a bad file
            raise InputError(f"{path}: cannot decode image ({_describe(e)})") from None
        if pix.ndim == 2:
            pix = pix[:, :, None]
        if self.c == 3 and self.pre.channel_order == "BGR":
            pix = pix[:, :, ::-1]
        if self.dtype.kind == "f":
            pix = (pix * np.float32(self.pre.pixel_scale) - self.mean) / self.std
        if self.layout == "NCHW":
            pix = pix.transpose(2, 0, 1)
        return np.ascontiguousarray(pix.astype(self.dtype))

    def _resize(self, im, Image):
        f = getattr(Image.Resampling, self.pre.interpolation.upper())
        h, w = self.h, self.w
        if self.pre.resize == "center-crop":
            iw, ih = im.size
            s = max(w / iw, h / ih)
            nw, nh = max(w, round(iw * s)), max(h, round(ih * s))
            im = im.resize((nw, nh), f)
            left, top = (nw - w) // 2, (nh - h) // 2
            return im.crop((left, top, left + w, top + h))
        return im.resize((w, h), f)


# --------------------------------------------------------------------------- dataset


class CalibrationData:
    """A re-iterable stream of feed dicts ``{input_name: array}`` for one model.

    Items are what the user supplied (a file, an image, a dict); iteration groups them into
    batches of ``batch_size`` and loads one batch at a time, so a folder of any size costs
    one batch of memory. ``len()`` is the number of feed dicts one iteration yields;
    ``n_samples`` the number of items. Every feed has been checked against the model's
    inputs (dtype, rank, static dims); errors name the file.
    """

    def __init__(self, items: list, kind: str, inputs: list[_Input], load: Callable,
                 batch_size: int = 1, drop_last: bool = False, source: str = "",
                 ignored: Sequence[str] = (), labels: np.ndarray | None = None):
        self._items, self.kind, self._inputs, self._load = list(items), kind, inputs, load
        self.batch_size, self._drop_last, self.source = batch_size, drop_last, source
        self.ignored = list(ignored)
        # One label per item (each item one sample), or None: judge agreement with FP32.
        self.labels = None if labels is None else np.asarray(labels)

    @property
    def names(self) -> list[str]:
        """The model input names every feed dict holds, in graph order."""
        return [i.name for i in self._inputs]

    @property
    def n_samples(self) -> int:
        return len(self._items)

    @property
    def files(self) -> list[Path]:
        """The files in reading order (empty for in-memory data)."""
        return [p for p in self._items if isinstance(p, Path)]

    def __len__(self) -> int:
        n, b = len(self._items), self.batch_size
        return n // b if self._drop_last else -(-n // b)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for i in range(len(self)):
            group = self._items[i * self.batch_size:(i + 1) * self.batch_size]
            yield self._feed(group)

    def _feed(self, group: list) -> dict[str, np.ndarray]:
        parts = [self._load(item) for item in group]
        where = _where(group[0]) if len(group) == 1 else f"{_where(group[0])}..{_where(group[-1])}"
        if self.kind == IMAGE:
            feeds = {self._inputs[0].name: np.stack(parts)}
        elif len(parts) == 1:
            feeds = parts[0]
        else:
            feeds = {n: np.concatenate([p[n] for p in parts]) for n in self.names}
        for spec in self._inputs:
            spec.check(feeds[spec.name], where)
        return {n: np.ascontiguousarray(feeds[n]) for n in self.names}

    def _subset(self, idx: list[int]) -> CalibrationData:
        return CalibrationData([self._items[j] for j in idx], self.kind, self._inputs,
                               self._load, self.batch_size, self._drop_last, self.source,
                               self.ignored, None if self.labels is None else self.labels[idx])

    def folds(self, k: int) -> list[list[int]]:
        """Item indices of ``k`` folds, interleaved (item j goes to fold j mod k): every fold
        sees the whole folder, as :meth:`split` does."""
        return [list(range(f, len(self._items), k)) for f in range(k)]

    def subset(self, idx: Sequence[int]) -> CalibrationData:
        """The items at ``idx``, in that order (labels follow)."""
        return self._subset(list(idx))

    def split(self, n_eval: int) -> tuple[CalibrationData, CalibrationData]:
        """(calibration, held-out) with ``n_eval`` items held out, evenly spaced.

        Evenly spaced rather than the last ones: folders sorted by name are often sorted by
        class, and a held-out tail would be one class. Deterministic.
        """
        n = len(self._items)
        if not 0 <= n_eval < n:
            raise InputError(f"cannot hold out {n_eval} of {n} calibration samples "
                             "(need 0 <= n_eval < samples)")
        held = {int((i + 0.5) * n / n_eval) for i in range(n_eval)} if n_eval else set()
        return (self._subset([j for j in range(n) if j not in held]),
                self._subset([j for j in range(n) if j in held]))

    def limit(self, n: int | None) -> CalibrationData:
        """The first ``n`` items (all when None)."""
        return self if n is None else self._subset(list(range(min(n, len(self._items)))))

    def __repr__(self) -> str:
        return (f"CalibrationData({self.kind}, {self.n_samples} samples in {len(self)} "
                f"batches of {self.batch_size}, inputs={self.names}"
                + (f", from {self.source}" if self.source else "") + ")")


def sample_the_original_refuses(data: CalibrationData, model: onnx.ModelProto,
                                base_dir=None) -> InputError | None:
    """The error to give when a run over ``data`` failed: the first sample that the original
    model itself cannot run in onnxruntime (token ids past the vocabulary, an attention
    mask shorter than the ids), named, or None when the original runs on every one (then the
    failure is the rewrite's); when onnxruntime cannot load the original at all, that.
    Calibration ran such samples through the rewritten model and
    their onnxruntime error came out as an internal error, exit 3."""
    from rewriter.core import ort
    from rewriter.core.graph import runnable_names

    model = runnable_names(model)   # onnxruntime refuses nodes sharing a name
    try:
        sess = ort.session(model, base_dir)
    except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
        # Nor can it load the original (Silero VAD with a mutated If branch, --plan auto:
        # the planner's run of the rewritten model was exit 3; fuzz, seed 61412)
        line = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        return InputError(f"onnxruntime cannot load the original model: {line}")
    for i in range(len(data)):
        group = data._items[i * data.batch_size:(i + 1) * data.batch_size]
        where = _where(group[0]) if len(group) == 1 else \
            f"{_where(group[0])}..{_where(group[-1])}"
        feeds = data._feed(group)
        try:
            ort.run(sess, feeds)
        except Exception as e:  # noqa: BLE001 - onnxruntime's own exception types
            given = ", ".join(f"{k} {list(np.shape(v))} {v.dtype}" for k, v in feeds.items())
            line = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            return InputError(f"{where}: onnxruntime cannot run the original model on this "
                              f"sample ({given}): {line}")
    return None


@contextmanager
def samples_blamed(data, model: onnx.ModelProto, base_dir=None):
    """Runs the block; an error that is not a RewriteError (onnxruntime's) becomes the
    InputError naming the sample the original model cannot run either, when there is one
    (``data``: CalibrationData, a callable giving it, or None)."""
    try:
        yield
    except RewriteError:
        raise
    except Exception:
        d = data() if callable(data) else data
        err = sample_the_original_refuses(d, model, base_dir) if d is not None else None
        if err is None:
            raise
        raise err from None


def _where(item) -> str:
    return str(item) if isinstance(item, Path) else "calibration sample"


def _classify(path: Path) -> str | None:
    ext = path.suffix.lower()
    if ext == ".npy":
        return NPY
    if ext == ".npz":
        return NPZ
    if ext in IMAGE_EXTS:
        return IMAGE
    return None


def _scan(root: Path) -> tuple[list[Path], str, list[str]]:
    """Data files under ``root`` (recursively, sorted by relative path), their kind, and
    the names of files that were skipped (manifests, notes, hidden files)."""
    if root.is_file():
        kind = _classify(root)
        if kind is None:
            raise InputError(f"{root}: not a calibration file (.npy, .npz or an image)")
        return [root], kind, []
    if not root.is_dir():
        raise InputError(f"{root}: no such calibration folder")
    found: dict[str, list[Path]] = {NPY: [], NPZ: [], IMAGE: []}
    ignored = []
    for p in sorted(root.rglob("*"), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        if p.name in LABEL_FILES:
            continue    # read by _read_labels
        kind = _classify(p)
        if kind is None:
            ignored.append(rel.as_posix())
        else:
            found[kind].append(p)
    kinds = [k for k, v in found.items() if v]
    if not kinds:
        extra = f" (it has {', '.join(ignored[:5])}{', ...' if len(ignored) > 5 else ''})" \
            if ignored else ""
        raise InputError(f"{root}: no calibration files (.npy, .npz, or "
                         f"{'/'.join(e[1:] for e in IMAGE_EXTS)} images){extra}")
    if len(kinds) > 1:
        mix = ", ".join(f"{len(found[k])} {k}" for k in kinds)
        raise InputError(f"{root}: mixes kinds of calibration files ({mix}); use one kind "
                         "per folder")
    return found[kinds[0]], kinds[0], ignored


def check_preprocess_applies(source) -> None:
    """A --preprocess given for data that is not images would be ignored: refused."""
    if isinstance(source, (str, os.PathLike)):
        kind = _scan(Path(source))[1]
        if kind != IMAGE:
            raise InputError(f"--preprocess says how images become inputs; {source} holds "
                             f"{kind} files, which are inputs already")


def check_set_values(source, values: dict, where: str = "--calib") -> None:
    """Samples (a folder of .npz files, or an iterable of feeds) that carry an input
    --set-input made a constant must hold the value set: a sample of another value is one
    the written model never runs (optimum's merged decoder fed use_cache_branch false where
    it was set true), so calibrating or verifying on it would judge the wrong branch. Only
    those keys are read; unreadable files are left to the loader's errors."""
    if isinstance(source, (str, os.PathLike)):
        files, kind, _ = _scan(Path(source))
        if kind != NPZ:
            return
        samples: Iterator = ((str(p), _set_keys(p, values)) for p in files)
    elif isinstance(source, (list, tuple)):
        samples = ((f"{where} sample {j}", d) for j, d in enumerate(source)
                   if isinstance(d, dict))
    else:
        return
    for place, feed in samples:
        for name in set(feed) & set(values):
            given, want = np.asarray(feed[name]), np.asarray(values[name])
            if given.shape != want.shape or not np.array_equal(given, want):
                raise InputError(f"{place} gives {name} another value than --set-input "
                                 f"{name} sets ({_shown(given)}, not {_shown(want)}): the "
                                 "written model runs only the value set; drop one")


def _set_keys(path: Path, values: dict) -> dict:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {n: z[n] for n in values if n in z.files}
    except Exception:  # noqa: BLE001 - the loader says what is wrong with the file
        return {}


def _shown(a: np.ndarray) -> str:
    flat = a.ravel()
    return str(flat[0]) if flat.size and (flat == flat[0]).all() else f"an array {list(a.shape)}"


def class_indices(labels, where: str) -> np.ndarray:
    """``labels`` as int64 class indices, or InputError: a 1.5 was taken as class 1, a -1
    as a class no output picks (each a sample judged wrong, unsaid), 1e30 an OverflowError
    and "a" a ValueError (exit 3)."""
    try:
        given = np.asarray(labels)
        with np.errstate(invalid="ignore"):
            values = given.astype(np.int64).ravel()
    except (TypeError, ValueError, OverflowError) as e:
        raise InputError(f"{where}: class indices (integers), not {labels!r:.60}: {e}") from None
    bad = values < 0
    if given.dtype.kind in "fc":
        bad |= values != given.ravel()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"{where}: class indices are integers >= 0; label {i} is "
                         f"{given.ravel()[i].item()!r}")
    return values


def _read_labels(root: Path, files: list[Path], batch_size: int,
                 n_files: int) -> np.ndarray | None:
    """The labels file beside the samples (``labels.txt``: one integer per line;
    ``labels.json``: a list, or {relative file name: label}; ``labels.npy``), or None.
    ``files``: the samples read (the first of ``n_files`` under a limit); a list must
    hold one label per file, no more, no fewer."""
    folder = root if root.is_dir() else root.parent
    found = [folder / f for f in LABEL_FILES if (folder / f).is_file()]
    if not found:
        return None
    path, by_name = found[0], False
    try:
        if path.suffix == ".txt":
            values = class_indices([int(x) for x in path.read_text().split()],
                                   str(path)).tolist()
        elif path.suffix == ".npy":   # 1.5 was read as class 1
            values = class_indices(np.load(path, allow_pickle=False), str(path)).tolist()
        else:
            import json
            raw = json.loads(path.read_text())
            by_name = isinstance(raw, dict)
            if by_name:
                values = [raw[p.relative_to(folder).as_posix()] for p in files]
            else:
                values = raw
            values = class_indices(values, str(path)).tolist()
    except (ValueError, KeyError, TypeError, OSError) as e:
        raise InputError(f"{path}: cannot read labels ({type(e).__name__}: {e})") from None
    if batch_size != 1:
        raise InputError(f"{path}: labels need one sample per feed (batch size 1)")
    if not by_name and len(values) != n_files:   # an extra one shifted none, silently
        raise InputError(f"{path}: {len(values)} labels for {n_files} samples")
    return np.asarray(values[:len(files)], dtype=np.int64)


def load_calibration(source, model: onnx.ModelProto | str | os.PathLike,
                     preprocess: Preprocess | dict | None = None,
                     limit: int | None = None, batch_size: int = 1,
                     labels=None, input_shapes: dict | None = None) -> CalibrationData:
    """Calibration samples for ``model``, validated up front, loaded lazily.

    ``source`` is one of:

    * a folder (or a single file) of ``.npy`` files, one array per file with its batch
      dimension (single-input models only);
    * ``.npz`` files, one batch per file, keys = input names (extra keys are ignored);
    * images (jpg, png, bmp, webp, tif), one sample per file, made into the model's single
      image input by ``preprocess`` (a :class:`Preprocess` or the plan's mapping);
    * an iterable of ``{input_name: array}`` dicts (the Python API). A list or tuple is kept
      as is; another iterable is read once, up to ``limit``.
    * a :class:`CalibrationData` (``limit`` applies).

    Folders are searched recursively; files are taken in sorted order of their relative
    path; hidden files and other kinds (``manifest.json``, notes) are skipped. A mix of
    kinds, an empty folder, an unreadable file or a wrong dtype, rank or static dim is an
    :class:`InputError` naming the file and the expected shape. Symbolic dims take any size.

    Labels (class indices, for judging task accuracy): ``labels.txt``, ``labels.json`` or
    ``labels.npy`` beside a folder's samples, one per sample in reading order, or
    ``labels`` (a sequence) with an iterable.

    ``input_shapes`` ({name: dims}, as --input-shape; the name may be empty for a single
    input) sizes images where the input's H and W are symbolic and ``preprocess`` has no size.

    ``limit`` keeps the first ``limit`` items (files, images or dicts). ``batch_size`` > 1
    concatenates that many items per feed, which needs a symbolic first dim on every input;
    for images a static batch dim B sets the batch size (leftover images are dropped).
    """
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise InputError(f"calibration limit must be a positive integer, got {limit!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"calibration batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(source, CalibrationData):
        return source.limit(limit)
    if labels is not None:
        labels = class_indices(labels, "labels")
    model = _proto(model)
    inputs = _model_inputs(model)
    names = [i.name for i in inputs]

    if isinstance(source, (str, os.PathLike)):
        root = Path(source)
        if labels is not None:   # dropped for the folder's own, silently (the API round)
            raise InputError(f"labels are given for {root}, a folder: its labels are a "
                             f"file beside its samples ({', '.join(LABEL_FILES)})")
        files, kind, ignored = _scan(root)
        n_files = len(files)
        files = files[:limit] if limit is not None else files
        drop_last = False
        if kind == IMAGE:
            if len(inputs) != 1:
                raise InputError(f"{root}: an image folder needs a single-input model; "
                                 f"inputs: {names}")
            shapes = input_shapes or {}
            given = shapes.get(names[0], shapes.get(""))
            reader = _ImageReader(inputs[0], Preprocess.from_dict(preprocess), given)
            b0 = inputs[0].dims[0]
            if b0 is not None:
                if batch_size not in (1, b0):
                    raise InputError(f"batch_size {batch_size} does not fit input '{names[0]}' "
                                     f"{inputs[0].shape_text()}")
                batch_size, drop_last = b0, True
                if len(files) < b0:
                    raise InputError(f"{root}: {len(files)} image(s), the model's batch "
                                     f"dimension needs {b0}")
            for p in files:
                reader.check_header(p)
            load: Callable = reader
        else:
            _check_batching(inputs, batch_size)
            if kind == NPY:
                if len(inputs) != 1:
                    raise InputError(f"{root}: .npy files need a single-input model; inputs: "
                                     f"{names}; use .npz files with one key per input")
                for p in files:
                    _check_header(inputs[0], *_read_npy(p, True), p)
                load = lambda p: {names[0]: _read_npy(p, False)}
            else:
                for p in files:
                    for spec, (shape, dtype) in zip(inputs, _read_npz(p, names, True).values()):
                        _check_header(spec, shape, dtype, p)
                load = lambda p: _read_npz(p, names, False)
        labels = _read_labels(root, files, batch_size, n_files)
        return CalibrationData(files, kind, inputs, load, batch_size, drop_last, str(root),
                               ignored, labels)

    if isinstance(source, dict):
        raise InputError("calibration data: expected an iterable of {input_name: array} "
                         "dicts, got one dict (wrap it in a list)")
    try:
        it = iter(source)
    except TypeError:
        raise InputError(f"calibration data: expected a folder path or an iterable of dicts, "
                         f"got {type(source).__name__}") from None
    items = list(source) if isinstance(source, (list, tuple)) else list(itertools.islice(it, limit))
    given = len(items)   # all of a list's samples; a generator's read up to the limit
    items = items[:limit] if limit is not None else items
    if not items:
        raise InputError("calibration data: the iterable gave no samples")
    _check_batching(inputs, batch_size)
    checked = []
    for j, d in enumerate(items):
        if not isinstance(d, dict):
            raise InputError(f"calibration sample {j}: expected a dict {{input_name: array}}, "
                             f"got {type(d).__name__}")
        missing = [n for n in names if n not in d]
        if missing:
            raise InputError(f"calibration sample {j}: missing input(s) {missing}; has "
                             f"{sorted(map(str, d))}")
        feed = {n: np.asarray(d[n]) for n in names}
        for spec in inputs:
            spec.check(feed[spec.name], f"calibration sample {j}")
        checked.append(feed)
    # A list's labels are all its samples' (12 labels for 8 samples passed: labels of other
    # samples, or shifted ones); a generator may hold more than the limit read of it.
    whole = isinstance(source, (list, tuple))
    if labels is not None and (len(labels) != given if whole else len(labels) < len(checked)):
        raise InputError(f"{len(labels)} labels for {given if whole else len(checked)} "
                         "calibration samples")
    return CalibrationData(checked, "api", inputs, lambda d: d, batch_size,
                           labels=None if labels is None else labels[:len(checked)])


def _check_batching(inputs: list[_Input], batch_size: int) -> None:
    if batch_size > 1:
        fixed = [i.name for i in inputs if not i.dims or i.dims[0] is not None]
        if fixed:
            raise InputError(f"batch_size {batch_size} concatenates samples along the first "
                             f"dim, but input(s) {fixed} have a static first dim")


def _check_header(spec: _Input, shape: tuple, dtype: np.dtype, path: Path) -> None:
    # A zero-size stand-in array carries dtype and shape through the same check as a feed.
    spec.check(np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, [0] * len(shape)),
               str(path))


def held_out_count(n: int) -> int:
    """How many of ``n`` samples the planner and --verify hold out for evaluation (the same
    rule in both, so the plan the planner measured is the plan that gets verified)."""
    return max(4, min(128, n // 3))
