"""Real inputs for calibration and evaluation: photo crops and rendered text lines.

Random N(0,1) tensors are fine for checking that a rewrite is exact, but they say little
about quantisation: activation ranges, and so scales and top-1 agreement, depend on real
image statistics. This module turns the real photos that ship inside the scikit-image wheel
(``skimage.data``: astronaut, coffee, chelsea, rocket, Hubble deep field, ...; no network,
no pooch) into deterministic streams of model inputs, and renders text lines with Pillow for
the OCR orientation classifier.

Use them for calibration *and* evaluation with **held-out seeds**: calibrate on one seed
(e.g. ``seed=0``) and measure agreement on another (e.g. ``seed=1``). Be aware that both
streams are random crops, flips and rescalings of the same 13 photos, so the held-out set is
new crops rather than new scenes; report results as such.

Functions
---------
``image_crops(n, size=(h, w), seed)``
    yields float32 CHW arrays in [0, 1] (3 channels, or 1 with ``channels=1``).
``write_calib_dir(dir, n, shape, mean, std)``
    writes normalised ``.npy`` batches plus a ``manifest.json``.
``text_crops(n, size=(48, 192), seed)``
    yields (float32 CHW array in [0, 1], label) pairs, label 0 for an upright line and 1 for
    one rotated by 180 degrees: the input and labels of ``ch_ppocr_mobile_v2.0_cls_infer.onnx``
    (normalise with mean 0.5, std 0.5).

Needs scikit-image (which brings Pillow along); text rendering needs only Pillow.
"""

from __future__ import annotations

import functools
import json
import math
import string
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

# Photos in the scikit-image wheel itself (checked for 0.26): loading them never downloads.
PHOTOS_RGB = (
    "astronaut",
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
)
PHOTOS_GRAY = ("camera", "moon", "coins", "grass", "gravel", "brick")

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Printable characters the default Pillow font draws; the OCR model was trained on Chinese
# and Latin text, Latin alone is enough for an orientation check.
_TEXT_CHARS = string.ascii_letters + string.digits + "     .,:;-+/()%$#"


def _require_pillow():
    try:
        from PIL import Image, ImageDraw, ImageFont
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("tools/calib_images.py needs Pillow: pip install pillow") from exc
    return Image, ImageDraw, ImageFont


@functools.lru_cache(maxsize=1)
def photos() -> tuple[np.ndarray, ...]:
    """The source photos as HxWx3 uint8 arrays (grey ones replicated to 3 channels)."""
    try:
        from skimage import data
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tools/calib_images.py needs scikit-image: pip install scikit-image"
        ) from exc
    out = []
    for name in PHOTOS_RGB + PHOTOS_GRAY:
        img = np.asarray(getattr(data, name)())
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        out.append(np.ascontiguousarray(img[:, :, :3].astype(np.uint8)))
    return tuple(out)


def _to_chw(rgb: np.ndarray, channels: int) -> np.ndarray:
    x = rgb.astype(np.float32) / np.float32(255.0)
    if channels == 1:
        # ITU-R BT.601 luma, what PIL's convert("L") uses.
        x = x @ np.array([0.299, 0.587, 0.114], np.float32)
        return x[None]
    if channels != 3:
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def image_crops(
    n: int,
    size: tuple[int, int] = (224, 224),
    seed: int = 0,
    *,
    channels: int = 3,
    scale: tuple[float, float] = (0.1, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
) -> Iterator[np.ndarray]:
    """Yield ``n`` float32 arrays of shape (channels, h, w) with values in [0, 1].

    Each is a random-resized crop of one of the photos: a crop covering a fraction in
    ``scale`` of the photo's area with an aspect ratio in ``ratio`` (log-uniform), resized
    bilinearly to ``size``, mirrored left-right with probability 0.5 when ``flip``. The
    stream depends only on ``seed`` (and the scikit-image/Pillow versions): use different
    seeds for calibration and evaluation.
    """
    Image, _, _ = _require_pillow()
    h_out, w_out = size
    rng = np.random.default_rng(seed)
    pics = photos()
    for _ in range(n):
        img = pics[int(rng.integers(len(pics)))]
        ih, iw = img.shape[:2]
        area = ih * iw * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        # Aspect of the crop follows the output's, jittered by ``aspect``.
        cw = min(iw, max(8, round(math.sqrt(area * aspect * w_out / h_out))))
        ch = min(ih, max(8, round(math.sqrt(area / aspect * h_out / w_out))))
        top = int(rng.integers(ih - ch + 1))
        left = int(rng.integers(iw - cw + 1))
        mirror = flip and rng.random() < 0.5
        crop = Image.fromarray(img[top : top + ch, left : left + cw])
        crop = crop.resize((w_out, h_out), Image.Resampling.BILINEAR)
        arr = np.asarray(crop)
        if mirror:
            arr = arr[:, ::-1]
        yield _to_chw(arr, channels)


def normalize(x: np.ndarray, mean, std) -> np.ndarray:
    """(x - mean) / std per channel (scalars or one value per channel), as float32."""
    c = x.shape[-3]
    m = np.broadcast_to(np.asarray(mean, np.float32).reshape(-1), (c,)).reshape(c, 1, 1)
    s = np.broadcast_to(np.asarray(std, np.float32).reshape(-1), (c,)).reshape(c, 1, 1)
    return ((x - m) / s).astype(np.float32)


def write_calib_dir(
    directory: str | Path,
    n: int,
    shape: Sequence[int],
    mean=IMAGENET_MEAN,
    std=IMAGENET_STD,
    *,
    seed: int = 0,
    prefix: str = "batch",
) -> list[Path]:
    """Write ``n`` normalised photo crops as ``.npy`` batches into ``directory``.

    ``shape`` is (B, C, H, W) (or (C, H, W) for B = 1); each file ``<prefix>_00000.npy``
    holds one float32 array of exactly that shape, so a model with a fixed batch dimension
    can take every file; ``n`` is rounded up to a whole number of batches. ``mean`` and
    ``std`` are in [0, 1] units (ImageNet's by default; PaddleOCR models use 0.5 and 0.5).
    A ``manifest.json`` records the settings. Returns the batch paths in order.
    """
    shape = tuple(int(d) for d in shape)
    if len(shape) == 3:
        shape = (1, *shape)
    if len(shape) != 4 or min(shape) < 1:
        raise ValueError(f"shape must be (B, C, H, W) or (C, H, W), got {shape}")
    bsz, c, h, w = shape
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    n_files = max(1, math.ceil(n / bsz))
    crops = image_crops(n_files * bsz, (h, w), seed, channels=c)
    paths = []
    for i in range(n_files):
        batch = np.stack([normalize(next(crops), mean, std) for _ in range(bsz)])
        path = out / f"{prefix}_{i:05d}.npy"
        np.save(path, batch)
        paths.append(path)
    manifest = {
        "source": "tools/calib_images.py image_crops (scikit-image photos)",
        "photos": list(PHOTOS_RGB + PHOTOS_GRAY),
        "seed": seed,
        "n": n_files * bsz,
        "shape": list(shape),
        "mean": np.asarray(mean, float).reshape(-1).tolist(),
        "std": np.asarray(std, float).reshape(-1).tolist(),
        "files": [p.name for p in paths],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return paths


@functools.lru_cache(maxsize=16)
def _font(px: int):
    _, _, ImageFont = _require_pillow()
    try:
        # Pillow >= 10.1 bundles a scalable font: the same glyphs on every machine.
        return ImageFont.load_default(size=px)
    except TypeError:  # pragma: no cover - older Pillow: bitmap font only
        return ImageFont.load_default()


def text_crops(
    n: int,
    size: tuple[int, int] = (48, 192),
    seed: int = 0,
    *,
    rotate_fraction: float = 0.5,
    hard: bool = False,
) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``n`` (float32 array (3, h, w) in [0, 1], label) pairs of rendered text lines.

    Each line is a random string drawn in Pillow's bundled font at a random size, with
    random dark-on-light (sometimes light-on-dark) colours, a little pixel noise, and
    rotated by 180 degrees with probability ``rotate_fraction`` (label 1; upright is
    label 0). Preprocessing follows PaddleOCR's text classifier: resize to height h keeping
    the aspect ratio, width capped at w, and pad on the right with 0.5, which is 0 after
    normalising with mean 0.5 and std 0.5.

    ``hard`` makes the lines small, faint, blurred and noisy (:func:`_degrade`): inputs on
    which even the FP32 model is often unsure, where quantisation decides the outcome.
    """
    Image, ImageDraw, _ = _require_pillow()
    h_out, w_out = size
    rng = np.random.default_rng(seed)
    for _ in range(n):
        length = int(rng.integers(3, 25))
        text = "".join(_TEXT_CHARS[int(i)] for i in rng.integers(len(_TEXT_CHARS), size=length))
        text = text.strip() or "text"
        px = int(rng.integers(10, 19)) if hard else int(rng.integers(18, 41))
        font = _font(px)
        fg_dark = rng.random() < 0.85
        bg, fg = _colours(rng, fg_dark, hard, gap=(40, 100))
        pad_x, pad_y = int(rng.integers(2, 12)), int(rng.integers(2, 10))
        left, top, right, bottom = font.getbbox(text)
        canvas = Image.new("RGB", (right - left + 2 * pad_x, bottom - top + 2 * pad_y),
                           tuple(int(v) for v in bg))
        ImageDraw.Draw(canvas).text((pad_x - left, pad_y - top), text, font=font,
                                    fill=tuple(int(v) for v in fg))
        label = int(rng.random() < rotate_fraction)
        if label:
            canvas = canvas.transpose(Image.Transpose.ROTATE_180)
        cw, ch = canvas.size
        new_w = min(w_out, max(1, math.ceil(h_out * cw / ch)))
        line = canvas.resize((new_w, h_out), Image.Resampling.BILINEAR)
        line = (_degrade(line, rng, blur=(0.3, 0.9), noise=(5, 14)) if hard
                else np.asarray(line, np.float32))
        line = line + rng.normal(0.0, 4.0, line.shape)
        out = np.full((h_out, w_out, 3), 127.5, np.float32)
        out[:, :new_w] = np.clip(line, 0, 255)
        yield np.ascontiguousarray((out / 255.0).transpose(2, 0, 1)).astype(np.float32), label


def _colours(rng, fg_dark: bool, hard: bool, gap=(25, 70)):
    """Background and text colour; ``hard``: low contrast (faint text, ``gap`` levels)."""
    if not hard:
        bg = rng.integers(170, 256, 3) if fg_dark else rng.integers(0, 90, 3)
        fg = rng.integers(0, 80, 3) if fg_dark else rng.integers(180, 256, 3)
        return bg, fg
    base = rng.integers(90, 200)
    gap = int(rng.integers(*gap)) * (-1 if fg_dark else 1)
    bg = np.clip(base + rng.integers(-10, 11, 3), 0, 255)
    fg = np.clip(bg + gap + rng.integers(-8, 9, 3), 0, 255)
    return bg, fg


def _degrade(im, rng, blur=(0.6, 1.6), noise=(8, 22)) -> np.ndarray:
    """Blur, then strong pixel noise: what a phone photo of small print looks like."""
    from PIL import ImageFilter

    im = im.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(*blur))))
    a = np.asarray(im, np.float32)
    return a + rng.normal(0.0, float(rng.uniform(*noise)), a.shape)


def text_pages(
    n: int,
    size: tuple[int, int] = (224, 224),
    seed: int = 0,
    *,
    hard: bool = False,
) -> Iterator[tuple[np.ndarray, int]]:
    """Yield ``n`` (float32 array (3, h, w) in [0, 1], k) pairs: a page of text lines
    rotated by k x 90 degrees counter-clockwise, k uniform in 0..3 (the document-orientation
    task). ``hard``: small, faint, blurred, noisy text, as :func:`text_crops`."""
    Image, ImageDraw, _ = _require_pillow()
    h_out, w_out = size
    rng = np.random.default_rng(seed)
    for _ in range(n):
        side = 448
        fg_dark = rng.random() < 0.9
        bg, fg = _colours(rng, fg_dark, hard)
        page = Image.new("RGB", (side, side), tuple(int(v) for v in bg))
        draw = ImageDraw.Draw(page)
        px = int(rng.integers(12, 20)) if hard else int(rng.integers(18, 34))
        font = _font(px)
        y = int(rng.integers(4, 30))
        while y < side - px:
            length = int(rng.integers(8, 40))
            text = "".join(_TEXT_CHARS[int(i)] for i in rng.integers(len(_TEXT_CHARS),
                                                                     size=length))
            draw.text((int(rng.integers(4, 40)), y), text.strip() or "text", font=font,
                      fill=tuple(int(v) for v in fg))
            y += int(px * rng.uniform(1.3, 2.2))
        k = int(rng.integers(4))
        page = page.rotate(90 * k, expand=True).resize((w_out, h_out),
                                                      Image.Resampling.BILINEAR)
        arr = _degrade(page, rng) if hard else np.asarray(page, np.float32) + rng.normal(
            0.0, 3.0, (h_out, w_out, 3))
        yield np.ascontiguousarray((np.clip(arr, 0, 255) / 255.0).transpose(2, 0, 1)).astype(
            np.float32), k


def main(argv: Sequence[str] | None = None) -> int:
    """``python tools/calib_images.py OUT -n 64 --size 320x320 [--seed S] [--kind photos|pages]``
    writes PNG images (what ``--calib OUT --preprocess FILE`` reads). ``--help`` used to print
    nothing and exit 0: the module had no command line (twentieth round)."""
    import argparse

    p = argparse.ArgumentParser(
        prog="calib_images.py",
        description="Write calibration/evaluation images from scikit-image's bundled photos "
                    "(random crops, flips, rescalings) or rendered text pages, as PNG files. "
                    "Use a different --seed for held-out data. The model's normalisation goes "
                    "in rewrite's --preprocess FILE (docs/calibration.md).")
    p.add_argument("out", help="folder to write (created)")
    p.add_argument("-n", type=int, default=64, help="number of images (default 64)")
    p.add_argument("--size", default="224x224", help="HxW (default 224x224)")
    p.add_argument("--seed", type=int, default=0, help="stream seed (default 0)")
    p.add_argument("--kind", choices=("photos", "pages"), default="photos",
                   help="photo crops (default) or pages of text lines (text detectors)")
    p.add_argument("--gray", action="store_true", help="one-channel images")
    a = p.parse_args(argv)
    try:
        h, w = (int(v) for v in a.size.lower().split("x"))
    except ValueError:
        p.error(f"--size: HxW, e.g. 320x320, got {a.size!r}")
    if a.n < 1 or h < 8 or w < 8:
        p.error("-n must be at least 1 and each side at least 8")
    Image = _require_pillow()[0]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.kind == "pages":
        arrays = (x.mean(0, keepdims=True) if a.gray else x
                  for x, _ in text_pages(a.n, (h, w), a.seed))
    else:
        arrays = image_crops(a.n, (h, w), a.seed, channels=1 if a.gray else 3)
    for i, x in enumerate(arrays):
        px = (np.clip(x, 0, 1) * 255).round().astype(np.uint8)
        px = px[0] if px.shape[0] == 1 else px.transpose(1, 2, 0)
        Image.fromarray(px).save(out / f"{a.kind}_{i:05d}.png")
    print(f"wrote {a.n} {a.kind} {h}x{w} (seed {a.seed}) to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
