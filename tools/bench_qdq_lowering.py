"""Models quantized by onnxruntime's quantizer, on the installed MIGraphX: how many of their
Q/DQ layers become int8 kernels, and whether they compile and match, as given and after
``rewrite --target migraphx``.

For each model of models/ and each quantize_static configuration below (the forms users'
quantizers write: QDQ and QOperator, uint8 and int8, per channel, int4 weights, weights kept
float behind a QuantizeLinear), it quantizes the model (8 seeded random images to
calibrate), then

* as given: MIGraphX's GPU pass order up to simplify_qdq on the file (rewriter.migraphx.
  lowering, run with migraphx-driver on a CPU build), and a compile on ``ref``;
* rewritten: ``rewriter.rewrite(..., target="migraphx", verify=True)``, which compiles the
  output on ``ref``, compares it with onnxruntime on the quantized model, and counts the
  layers that lower.

    eval "$(../shared/migraphx/install.sh 2.16)"
    python tools/bench_qdq_lowering.py --out /tmp/qdq_2.16.md

Exit code 0 when it ran (whatever it measured); the table goes to stdout and ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {   # name: quantize_static keyword arguments (QuantFormat/QuantType by name)
    "QDQ U8U8 per-tensor": dict(quant_format="QDQ", activation_type="QUInt8",
                                weight_type="QUInt8"),
    "QDQ U8S8 per-channel": dict(quant_format="QDQ", activation_type="QUInt8",
                                 weight_type="QInt8", per_channel=True),
    "QDQ S8S8 per-channel": dict(quant_format="QDQ", activation_type="QInt8",
                                 weight_type="QInt8", per_channel=True),
    "QDQ S8 int4 weights per-channel": dict(quant_format="QDQ", activation_type="QInt8",
                                            weight_type="QInt4", per_channel=True),
    "QDQ S8S8 AddQDQPairToWeight": dict(quant_format="QDQ", activation_type="QInt8",
                                        weight_type="QInt8", per_channel=True,
                                        extra_options={"AddQDQPairToWeight": True}),
    "QOperator U8S8 per-channel": dict(quant_format="QOperator", activation_type="QUInt8",
                                       weight_type="QInt8", per_channel=True),
    "QOperator S8S8 per-channel": dict(quant_format="QOperator", activation_type="QInt8",
                                       weight_type="QInt8", per_channel=True),
}
MODELS = ("resnet_mini.onnx", "mobilenet_mini.onnx")


def quantize(model: Path, out: Path, config: dict) -> None:
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    inp = onnx.load(model, load_external_data=False).graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    x = np.random.default_rng(7).standard_normal([8] + shape).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({inp.name: v} for v in x)

        def get_next(self):
            return next(self.it, None)

    kw = dict(config)
    kw["quant_format"] = QuantFormat[kw["quant_format"]]
    kw["activation_type"] = QuantType[kw["activation_type"]]
    kw["weight_type"] = QuantType[kw["weight_type"]]
    quantize_static(str(model), str(out), Reader(), **kw)


def as_given(path: Path, shapes: dict) -> str:
    """Lowered/planned Q/DQ layers of the file as it is, and whether it compiles on ref."""
    from rewriter.migraphx.backend import refuses
    from rewriter.migraphx.check import check_model
    from rewriter.migraphx.lowering import lower_int8
    err = refuses(path, shapes, "ref")
    low = lower_int8(path, shapes, list(check_model(path).qdq_layers))
    lowered = f"{low.lowered}/{low.planned}" if low.status == "ok" else "throws"
    return (f"{lowered}, " + ("compiles" if err is None
                              else f"{err.stage} fails: {err.message[:60]}"))


def gpu_kernels(path: Path, shapes: dict) -> str:
    """The int8 and float conv/dot instructions of ``path``'s program after MIGraphX's GPU
    passes up to simplify_qdq (an int8 layer with zero points can give two)."""
    import re

    from rewriter.migraphx.lowering import find_driver, run_driver
    rc, out, _ = run_driver(find_driver(), path, shapes)
    if rc:
        return "GPU order fails"
    ops = re.findall(r"= (\w+)", out)
    int8 = sum(ops.count(k) for k in ("quant_convolution", "quant_dot"))
    return f"GPU order: {int8} int8, {sum(ops.count(k) for k in ('convolution', 'dot'))} " \
           "float conv/dot"


def rewritten(path: Path, shapes: dict, tmp: Path) -> str:
    import rewriter
    try:
        _, rep = rewriter.rewrite(path, output=tmp / "out.onnx", target="migraphx",
                                  verify=True, input_shapes=shapes, materialize=False,
                                  migraphx={"device": "ref", "samples": 2})
    except rewriter.RewriteError as e:
        return f"error: {str(e)[:80]}"
    info = rep.extra.get("compile", {})
    low = info.get("lowering") or {}
    lowered = (f"{low.get('lowered')}/{low.get('planned')}" if low.get("status") == "ok"
               else low.get("status") if low else
               # no Q/DQ layer to count (QOperator ops): the program's kernels, GPU order
               "no Q/DQ layer; " + gpu_kernels(tmp / "out.onnx", shapes))
    cos = min((m["cosine"] for m in info.get("metrics", [])), default=float("nan"))
    return f"{lowered}, {info.get('status')}, cosine {cos:.6f}" + (
        "" if info.get("ok") else ", NOT ok")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the table here (markdown)")
    args = ap.parse_args(argv)
    from rewriter.migraphx.lowering import installed_version, show_version
    version = show_version(installed_version())
    rows = [f"MIGraphX {version} (`ref`, GPU pass order for the lowering)", "",
            "| model | quantize_static | as given: lowered, ref | rewritten: lowered, ref, "
            "cosine vs onnxruntime |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in MODELS:
            for label, config in CONFIGS.items():
                q = tmp / f"{Path(name).stem}.q.onnx"
                quantize(ROOT / "models" / name, q, config)
                import onnx
                inp = onnx.load(q, load_external_data=False).graph.input[0]
                shapes = {inp.name: [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]}
                row = (f"| {name} | {label} | {as_given(q, shapes)} | "
                       f"{rewritten(q, shapes, tmp)} |")
                print(row, flush=True)
                rows.append(row)
    text = "\n".join(rows) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
