"""Write a large Conv+BN / MLP model with external data, one tensor at a time.

    python tools/make_big_model.py --out DIR --gb 2.5 [--channels 1024] [--hw 4] [--check]

The model is a wide stack of K x (Conv 3x3 CxC + BatchNormalization + Relu) on a small
[N, C, hw, hw] input, then GlobalAveragePool, Flatten and an MLP (Gemm CxC + Relu, twice,
then Gemm C->1000). K is chosen so that the float32 weights total about ``--gb`` GB
(10^9 bytes). Every conv is followed by a BN, so a Conv+BN fusion pass has work to do at
the >2 GB scale where a ModelProto can no longer be serialised in one piece.

Why not ``onnx.save_model(..., save_as_external_data=True)``: that needs the whole model,
weights included, in memory first, and a >2 GB ModelProto cannot even be serialised. Here
each weight is drawn, appended to ``<name>.onnx.data`` (offsets aligned to 4096 bytes so
readers can mmap), and referenced from a TensorProto with ``data_location = EXTERNAL`` and
``location/offset/length`` entries, exactly what ``save_as_external_data=True,
all_tensors_to_one_file=True`` writes. Peak memory stays about one tensor above the
interpreter's baseline (one conv weight is C*C*9*4 bytes: 38 MB at C=1024).

Weights are seeded and He-scaled after the BN scale, like models/make_models.py, so the
activations stay O(1) through the stack. ``--check`` runs onnx.checker (by path, which
handles external data) and one onnxruntime inference; at 2.5 GB that loads the weights.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
BN_EPS = 1e-5
ALIGN = 4096
# Tensors below this many bytes stay inline, as onnx.save_model's size_threshold does.
INLINE_BELOW = 1024


class _ExternalWriter:
    """Appends tensors to one data file and returns TensorProtos that point into it."""

    def __init__(self, f, location: str):
        self.f = f
        self.location = location  # relative to the model's folder, as the spec asks
        self.offset = 0
        self.written = 0

    def tensor(self, name: str, array: np.ndarray) -> onnx.TensorProto:
        array = np.ascontiguousarray(array, dtype=np.float32)
        if array.nbytes < INLINE_BELOW:
            return numpy_helper.from_array(array, name)
        pad = -self.offset % ALIGN
        if pad:
            self.f.write(b"\0" * pad)
            self.offset += pad
        # Write the array's own buffer (no bytes copy); ONNX external data is little-endian,
        # as is every platform this runs on.
        self.f.write(array.data)
        t = onnx.TensorProto(name=name, data_type=TensorProto.FLOAT, dims=array.shape)
        t.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", self.offset),
                           ("length", array.nbytes)):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        self.offset += array.nbytes
        self.written += array.nbytes
        return t


def plan(gb: float, channels: int, classes: int = 1000) -> tuple[int, int]:
    """(number of conv blocks, total weight bytes) for a target of ``gb`` * 1e9 bytes."""
    c = channels
    conv = (c * c * 9 + 4 * c) * 4  # conv weight and BN's four vectors (biases not counted)
    mlp = (2 * (c * c + c) + classes * c + classes) * 4
    k = max(1, round((gb * 1e9 - mlp) / conv))
    return k, k * conv + mlp


def write_big_model(
    out_dir: str | Path,
    gb: float,
    *,
    channels: int = 1024,
    hw: int = 4,
    classes: int = 1000,
    seed: int = 0,
    name: str = "big_convbn",
    progress: bool = False,
) -> Path:
    """Write ``<out_dir>/<name>.onnx`` and ``<name>.onnx.data``; return the model path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_path = out / f"{name}.onnx"
    data_path = out / f"{name}.onnx.data"
    rng = np.random.default_rng(seed)
    k, _ = plan(gb, channels, classes)
    c = channels
    nodes, inits = [], []
    x = "input"
    with open(data_path, "wb") as f:
        writer = _ExternalWriter(f, data_path.name)
        for i in range(k):
            p = f"block{i}"
            gamma = rng.uniform(0.5, 1.5, c)
            beta = rng.normal(0.0, 0.1, c)
            mean = rng.normal(0.0, 0.1, c)
            var = rng.uniform(0.5, 2.0, c)
            scale = (gamma / np.sqrt(var + BN_EPS)).astype(np.float32)
            # float32 draws: no float64 copy of a multi-MB tensor.
            w = rng.standard_normal((c, c, 3, 3), dtype=np.float32)
            w *= np.float32(math.sqrt(2.0 / (c * 9)))
            w /= scale.reshape(-1, 1, 1, 1)
            conv_in = [x, f"{p}.conv.weight"]
            inits.append(writer.tensor(f"{p}.conv.weight", w))
            del w
            if i % 2 == 1:  # some convs with bias, some without
                inits.append(writer.tensor(f"{p}.conv.bias", rng.normal(0.0, 0.1, c)))
                conv_in.append(f"{p}.conv.bias")
            nodes.append(helper.make_node("Conv", conv_in, [f"{p}.conv_y"], name=f"{p}.conv",
                                          kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
            bn_in = [f"{p}.conv_y"]
            for key, val in (("weight", gamma), ("bias", beta), ("running_mean", mean),
                             ("running_var", var)):
                inits.append(writer.tensor(f"{p}.bn.{key}", val))
                bn_in.append(f"{p}.bn.{key}")
            nodes.append(helper.make_node("BatchNormalization", bn_in, [f"{p}.bn_y"],
                                          name=f"{p}.bn", epsilon=BN_EPS))
            nodes.append(helper.make_node("Relu", [f"{p}.bn_y"], [f"{p}.relu_y"], name=f"{p}.relu"))
            x = f"{p}.relu_y"
            if progress and (i % 8 == 7 or i == k - 1):
                print(f"  block {i + 1}/{k}: {writer.written / 1e9:.2f} GB", flush=True)
        nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool_y"], name="pool"))
        nodes.append(helper.make_node("Flatten", ["pool_y"], ["flat_y"], name="flatten", axis=1))
        x = "flat_y"
        for j, (cout, relu) in enumerate(((c, True), (c, True), (classes, False))):
            p = f"fc{j}"
            cin = c
            w = rng.standard_normal((cout, cin), dtype=np.float32)
            w *= np.float32(math.sqrt((2.0 if relu else 1.0) / cin))
            inits.append(writer.tensor(f"{p}.weight", w))
            inits.append(writer.tensor(f"{p}.bias", rng.normal(0.0, 0.1, cout)))
            y = "logits" if not relu else f"{p}_y"
            nodes.append(helper.make_node("Gemm", [x, f"{p}.weight", f"{p}.bias"], [y],
                                          name=p, transB=1))
            if relu:
                nodes.append(helper.make_node("Relu", [y], [f"{p}.relu_y"], name=f"{p}.relu"))
                y = f"{p}.relu_y"
            x = y

    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", c, hw, hw])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="rewrite-make-big-model", producer_version="1",
                              doc_string=f"make_big_model gb={gb} channels={c} hw={hw} seed={seed}")
    model.ir_version = IR_VERSION
    # The tensors carry no raw_data, so this proto is small whatever --gb says.
    onnx.save_model(model, model_path)
    return model_path


def check(model_path: Path, hw: int) -> dict:
    """onnx.checker by path (follows external data) and one onnxruntime run on N(0,1)."""
    import onnxruntime as ort

    onnx.checker.check_model(str(model_path), full_check=True)
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    c = sess.get_inputs()[0].shape[1]
    x = np.random.default_rng(0).standard_normal((2, c, hw, hw)).astype(np.float32)
    y = sess.run(None, {"input": x})[0]
    return {"finite": bool(np.isfinite(y).all()), "std": float(y.std()), "shape": list(y.shape)}


def _peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--gb", type=float, default=2.5, help="weight size target, 1e9 bytes")
    ap.add_argument("--channels", type=int, default=1024)
    ap.add_argument("--hw", type=int, default=4, help="input height and width")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default="big_convbn", help="file stem")
    ap.add_argument("--check", action="store_true", help="checker + one onnxruntime run")
    args = ap.parse_args(argv)
    if args.gb <= 0 or args.channels < 1 or args.hw < 1:
        ap.error("--gb, --channels and --hw must be positive")

    k, total = plan(args.gb, args.channels)
    print(f"{k} Conv+BN+Relu blocks at C={args.channels} + MLP: {total / 1e9:.3f} GB of weights")
    t0 = time.perf_counter()
    path = write_big_model(args.out, args.gb, channels=args.channels, hw=args.hw,
                           seed=args.seed, name=args.name, progress=True)
    data = path.with_name(path.name + ".data")
    print(f"wrote {path} ({path.stat().st_size / 1e3:.1f} kB) and {data.name} "
          f"({data.stat().st_size / 1e9:.3f} GB) in {time.perf_counter() - t0:.1f} s, "
          f"peak RSS {_peak_rss_mb():.0f} MB")
    if args.check:
        print("check:", check(path, args.hw), f"peak RSS {_peak_rss_mb():.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
