"""Generate the project's synthetic test models, deterministically.

Every model here is built with ``onnx.helper`` from weights drawn with
``numpy.random.default_rng(seed)``: the same call gives the same bytes on every run (no
timestamps, fixed tensor order, fixed names), so the committed ``resnet_mini.onnx`` and
``mobilenet_mini.onnx`` can be compared byte for byte with a fresh build in the tests.

All models use opset 17, IR version 8, a graph input called ``input`` and a symbolic batch
dimension ``N`` on the input and on every output.

Models
------
``resnet_mini()``
    ResNet-shaped classifier, input [N,3,64,64] -> logits [N,10]: stem Conv 7x7/2 (with bias)
    + BN + Relu + MaxPool, a basic block, a basic block with a projection shortcut, two
    bottleneck blocks (projection and identity shortcut), GlobalAveragePool, Flatten, Gemm.
``mobilenet_mini()``
    MobileNet-shaped classifier, input [N,3,64,64] -> logits [N,10]: depthwise-separable
    blocks (depthwise Conv group=C + BN + Relu6, pointwise Conv + BN + Relu), Relu6 written as
    Clip(x, min, max) with min/max as shared scalar initializers, one block with HardSwish and
    a residual Add, one squeeze-excite (GlobalAveragePool, Conv, Relu, Conv, HardSigmoid, Mul).
``conv_bn_relu_chain(n_blocks, channels=8, hw=8)``
    N x (Conv 3x3 + BN + Relu) for scaling benchmarks (N = 1000..4000); not committed.
``resnet50_like()``
    ResNet-50 v1.5 layer shapes and real-sized weights (25.6M parameters, ~100 MB) with
    unfused BN, input [N,3,224,224] -> logits [N,1000]; not committed.

Weights and conditioning
------------------------
BatchNormalization statistics are deliberately non-trivial (gamma ~ U(0.5,1.5),
beta ~ N(0,0.1), mean ~ N(0,0.1), var ~ U(0.5,2)): an identity BN would let a broken
Conv+BN fusion pass unnoticed. Random deep networks can be chaotic, which would make a
numeric equivalence check blame a correct pass, so the conv weights are drawn *after* the BN
parameters and divided per output channel by the BN scale g/sqrt(v+eps). The folded conv
(the one a Conv+BN fusion produces) then has He-scaled weights,

    W' = W * g / sqrt(v + eps)  ~  N(0, gain^2 / fan_in),

and activations stay O(1) through the depth. The last conv of each residual branch uses a
smaller gain so that the sums do not grow block after block. In ``conv_bn_relu_chain`` the BN
statistics are instead measured on a probe batch (data-dependent init): every BN really
renormalises, so thousands of blocks neither explode nor vanish.

Run ``python models/make_models.py --check`` to print the per-output std on N(0,1) input.
"""

from __future__ import annotations

import argparse
import collections
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
BN_EPS = 1e-5
BATCH_DIM = "N"
INPUT_NAME = "input"
PRODUCER = "rewrite-make-models"

# Seeds are part of the committed files' identity: changing one changes the bytes.
RESNET_MINI_SEED = 1234
MOBILENET_MINI_SEED = 5678
CHAIN_SEED = 42
RESNET50_SEED = 50

COMMITTED = ("resnet_mini", "mobilenet_mini")


class _Builder:
    """Accumulates nodes and initializers for one graph, with one seeded generator.

    Draw order is fixed by the order of the calls, which is what makes the output
    deterministic; never draw from ``rng`` conditionally on anything but the arguments.
    """

    def __init__(self, seed: int, *, float32_draws: bool = False):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: set[str] = set()
        # Large models draw directly in float32 to keep peak memory near one tensor.
        self.float32_draws = float32_draws

    # -- naming and plumbing -------------------------------------------------------------
    def _claim(self, name: str) -> str:
        if name in self._names:
            raise ValueError(f"duplicate tensor name {name!r}")
        self._names.add(name)
        return name

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), self._claim(name)))
        return name

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        out = self._claim(f"{name}_y")
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def normal(self, shape, std: float) -> np.ndarray:
        if self.float32_draws:
            return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        return self.rng.normal(0.0, std, shape)

    # -- layers ----------------------------------------------------------------------------
    def bn_params(self, c: int):
        gamma = self.rng.uniform(0.5, 1.5, c)
        beta = self.rng.normal(0.0, 0.1, c)
        mean = self.rng.normal(0.0, 0.1, c)
        var = self.rng.uniform(0.5, 2.0, c)
        return gamma, beta, mean, var

    def bn(self, x: str, name: str, params) -> str:
        gamma, beta, mean, var = (p.astype(np.float32) for p in params)
        ins = [
            x,
            self.init(f"{name}.weight", gamma),
            self.init(f"{name}.bias", beta),
            self.init(f"{name}.running_mean", mean),
            self.init(f"{name}.running_var", var),
        ]
        return self.node("BatchNormalization", ins, name, epsilon=BN_EPS)

    def conv(
        self,
        x: str,
        name: str,
        cin: int,
        cout: int,
        k: int,
        *,
        stride: int = 1,
        group: int = 1,
        bias: bool = False,
        gain: float = math.sqrt(2.0),
        out_scale: np.ndarray | None = None,
    ) -> str:
        """Conv with He-scaled weights; ``out_scale`` divides each output channel's weights
        so that a following BN with that per-channel scale restores the He scale."""
        fan_in = cin // group * k * k
        w = self.normal((cout, cin // group, k, k), gain / math.sqrt(fan_in))
        if out_scale is not None:
            w = w / out_scale.reshape(-1, 1, 1, 1).astype(w.dtype)
        ins = [x, self.init(f"{name}.weight", w.astype(np.float32))]
        if bias:
            ins.append(self.init(f"{name}.bias", self.rng.normal(0.0, 0.1, cout).astype(np.float32)))
        attrs = {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [k // 2] * 4}
        if group != 1:
            attrs["group"] = group
        return self.node("Conv", ins, name, **attrs)

    def conv_bn(self, x: str, name: str, cin: int, cout: int, k: int, **kw) -> str:
        """Conv + BN whose fused form is He-scaled (see the module docstring)."""
        params = self.bn_params(cout)
        gamma, _, _, var = params
        scale = gamma / np.sqrt(var + BN_EPS)
        y = self.conv(x, f"{name}.conv", cin, cout, k, out_scale=scale, **kw)
        return self.bn(y, f"{name}.bn", params)

    def relu(self, x: str, name: str) -> str:
        return self.node("Relu", [x], name)

    def gemm_head(self, x: str, cin: int, classes: int) -> str:
        """GlobalAveragePool + Flatten + Gemm (transB, like a PyTorch Linear)."""
        x = self.node("GlobalAveragePool", [x], "avgpool")
        x = self.node("Flatten", [x], "flatten", axis=1)
        w = self.normal((classes, cin), 1.0 / math.sqrt(cin))
        # Pooled Relu features share a positive mean; zero-sum rows cancel that common part,
        # so less of each logit is a fixed class offset. (Per-channel offsets remain: on
        # photos the argmax still falls on a few classes; use the trained models for top-1.)
        w = w - w.mean(axis=1, keepdims=True)
        b = self.rng.normal(0.0, 0.1, classes)
        ins = [x, self.init("fc.weight", w.astype(np.float32)), self.init("fc.bias", b.astype(np.float32))]
        # The Gemm output is the graph output; name it plainly.
        self.nodes.append(helper.make_node("Gemm", ins, ["logits"], name="fc", transB=1))
        self._claim("logits")
        return "logits"

    # -- model -------------------------------------------------------------------------------
    def model(self, graph_name: str, in_shape, outputs, doc: str) -> onnx.ModelProto:
        inp = helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, [BATCH_DIM, *in_shape])
        outs = [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [BATCH_DIM, *shape])
            for name, shape in outputs
        ]
        graph = helper.make_graph(self.nodes, graph_name, [inp], outs, initializer=self.inits)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER,
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        return model


# ---------------------------------------------------------------------------------------------
# resnet_mini


def _basic_block(b: _Builder, x: str, name: str, cin: int, cout: int, stride: int) -> str:
    y = b.relu(b.conv_bn(x, f"{name}.1", cin, cout, 3, stride=stride), f"{name}.relu1")
    # A gain below He on the branch's last conv keeps the residual sum from growing.
    y = b.conv_bn(y, f"{name}.2", cout, cout, 3, gain=0.8)
    if stride != 1 or cin != cout:
        x = b.conv_bn(x, f"{name}.downsample", cin, cout, 1, stride=stride, bias=True, gain=0.8)
    return b.relu(b.node("Add", [y, x], f"{name}.add"), f"{name}.relu2")


def _bottleneck(
    b: _Builder, x: str, name: str, cin: int, mid: int, cout: int, stride: int, *, gain3: float = 0.8
) -> str:
    y = b.relu(b.conv_bn(x, f"{name}.1", cin, mid, 1), f"{name}.relu1")
    # ResNet v1.5: the stride sits on the 3x3 conv.
    y = b.relu(b.conv_bn(y, f"{name}.2", mid, mid, 3, stride=stride), f"{name}.relu2")
    y = b.conv_bn(y, f"{name}.3", mid, cout, 1, gain=gain3)
    if stride != 1 or cin != cout:
        x = b.conv_bn(x, f"{name}.downsample", cin, cout, 1, stride=stride, gain=gain3)
    return b.relu(b.node("Add", [y, x], f"{name}.add"), f"{name}.relu3")


def resnet_mini(seed: int = RESNET_MINI_SEED) -> onnx.ModelProto:
    """ResNet-shaped classifier: [N,3,64,64] -> logits [N,10] (33,834 parameters)."""
    b = _Builder(seed)
    x = b.conv_bn(INPUT_NAME, "stem", 3, 16, 7, stride=2, bias=True)  # 32x32
    x = b.relu(x, "stem.relu")
    x = b.node("MaxPool", [x], "stem.maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    x = _basic_block(b, x, "layer1.0", 16, 16, 1)  # 16x16, identity shortcut
    x = _basic_block(b, x, "layer2.0", 16, 32, 2)  # 8x8, projection shortcut (1x1 conv, bias)
    x = _bottleneck(b, x, "layer3.0", 32, 16, 64, 2)  # 4x4, projection shortcut
    x = _bottleneck(b, x, "layer3.1", 64, 16, 64, 1)  # identity shortcut
    out = b.gemm_head(x, 64, 10)
    doc = f"resnet_mini from models/make_models.py, seed {seed}: synthetic weights, not trained."
    return b.model("resnet_mini", [3, 64, 64], [(out, [10])], doc)


# ---------------------------------------------------------------------------------------------
# mobilenet_mini


def _relu6(b: _Builder, x: str, name: str) -> str:
    # Relu6 the way PyTorch exports it at opset >= 11: Clip with min/max as inputs. The two
    # scalars are shared by every Clip, as in exported models (a pass must not assume a
    # constant input has one consumer).
    return b.node("Clip", [x, "relu6.min", "relu6.max"], name)


def _dw_separable(
    b: _Builder, x: str, name: str, cin: int, cout: int, stride: int, *, pw_bias: bool = False
) -> str:
    y = b.conv_bn(x, f"{name}.dw", cin, cin, 3, stride=stride, group=cin)
    y = _relu6(b, y, f"{name}.dw.relu6")
    y = b.conv_bn(y, f"{name}.pw", cin, cout, 1, bias=pw_bias)
    return b.relu(y, f"{name}.pw.relu")


def _squeeze_excite(b: _Builder, x: str, name: str, c: int, r: int = 4) -> str:
    s = b.node("GlobalAveragePool", [x], f"{name}.pool")
    # Pooled activations are small; larger gains make the gate actually vary by channel.
    s = b.relu(b.conv(s, f"{name}.fc1", c, c // r, 1, bias=True, gain=4.0), f"{name}.relu")
    s = b.conv(s, f"{name}.fc2", c // r, c, 1, bias=True, gain=6.0)
    # PyTorch's hardsigmoid is relu6(x + 3) / 6, i.e. alpha = 1/6 (ONNX's default is 0.2).
    s = b.node("HardSigmoid", [s], f"{name}.hsigmoid", alpha=1.0 / 6.0, beta=0.5)
    return b.node("Mul", [x, s], f"{name}.scale")


def mobilenet_mini(seed: int = MOBILENET_MINI_SEED) -> onnx.ModelProto:
    """MobileNet-shaped classifier: [N,3,64,64] -> logits [N,10] (7,908 parameters)."""
    b = _Builder(seed)
    b.init("relu6.min", np.array(0.0, np.float32))
    b.init("relu6.max", np.array(6.0, np.float32))
    x = _relu6(b, b.conv_bn(INPUT_NAME, "stem", 3, 16, 3, stride=2), "stem.relu6")  # 32x32
    x = _dw_separable(b, x, "block1", 16, 24, 1, pw_bias=True)
    x = _dw_separable(b, x, "block2", 24, 32, 2)  # 16x16
    # block3: HardSwish activations and a residual Add (inverted-residual style).
    y = b.node("HardSwish", [b.conv_bn(x, "block3.dw", 32, 32, 3, group=32)], "block3.dw.hswish")
    # HardSwish passes about half of a small input: gains above He compensate.
    y = b.conv_bn(y, "block3.pw", 32, 32, 1, gain=1.6)
    x = b.node("HardSwish", [b.node("Add", [y, x], "block3.add")], "block3.hswish")
    # block4: depthwise stride 2, squeeze-excite, then the pointwise projection.
    y = b.conv_bn(x, "block4.dw", 32, 32, 3, stride=2, group=32, gain=2.0)
    y = _squeeze_excite(b, _relu6(b, y, "block4.dw.relu6"), "block4.se", 32)
    x = b.relu(b.conv_bn(y, "block4.pw", 32, 64, 1, gain=2.5), "block4.pw.relu")  # 8x8
    out = b.gemm_head(x, 64, 10)
    doc = f"mobilenet_mini from models/make_models.py, seed {seed}: synthetic weights, not trained."
    return b.model("mobilenet_mini", [3, 64, 64], [(out, [10])], doc)


# ---------------------------------------------------------------------------------------------
# conv_bn_relu_chain


def _conv3x3_np(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """Reference 3x3, stride 1, pad 1 convolution in float64 (for the probe statistics)."""
    _, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.stack([xp[:, :, i : i + h, j : j + wd] for i in range(3) for j in range(3)], axis=2)
    y = np.einsum("ock,nckhw->nohw", w.reshape(w.shape[0], c, 9), cols)
    return y if bias is None else y + bias.reshape(1, -1, 1, 1)


def conv_bn_relu_chain(
    n_blocks: int,
    channels: int = 8,
    hw: int = 8,
    seed: int = CHAIN_SEED,
    *,
    off_center_std: float = 0.01,
    relu_margin: float = 4.0,
) -> onnx.ModelProto:
    """``n_blocks`` x (Conv 3x3 + BN + Relu): input [N,C,hw,hw] -> output [N,C,hw,hw].

    For scaling benchmarks of graph optimisers (N = 1000..4000), built to stay
    well-conditioned at any depth, because a random deep chain is chaotic (a 1e-4 change of
    the input swamps the output after ~100 He-initialised blocks, and magnitudes drift
    apart for inputs other than the one the statistics came from):

    * each 3x3 kernel is "orthogonal-ish": a random orthogonal CxC matrix on the centre tap
      plus small N(0, ``off_center_std``) off-centre taps, so the conv nearly preserves norms;
    * the BN running statistics are measured on a fixed probe batch pushed through the chain
      (with a random factor in [0.8, 1.25] on the variance, so the BN is not an exact
      normaliser), gamma ~ U(0.8, 1.2) and beta ~ U(m - 0.5, m + 0.5) with m =
      ``relu_margin``: each BN renormalises, and the Relu input sits about m sigma above
      zero, so the Relu clips rarely and the chain stays close to an isometry on
      perturbations instead of forgetting or amplifying them. Measured: with m = 4 a 1e-4
      input change stays ~1e-4 after 4000 blocks; with m = 2 it reaches 0.2 after 1000.

    What remains is float32 round-off, which adds up like a random walk: folding every BN
    in float64 changes the output by ~2e-5 (1000 blocks) and ~5e-5 (4000 blocks) relative
    to its largest value. Every third conv has a bias. Outputs are O(1) with mean about m.
    """
    if n_blocks < 1:
        raise ValueError("n_blocks must be >= 1")
    b = _Builder(seed)
    probe = b.rng.standard_normal((4, channels, hw, hw))
    x, p = INPUT_NAME, probe
    for i in range(n_blocks):
        name = f"block{i}"
        q, r = np.linalg.qr(b.rng.standard_normal((channels, channels)))
        q = q * np.sign(np.diag(r))  # a uniformly random orthogonal matrix
        w = b.rng.normal(0.0, off_center_std, (channels, channels, 3, 3))
        w[:, :, 1, 1] = q
        bias = b.rng.normal(0.0, 0.1, channels) if i % 3 == 0 else None
        gamma = b.rng.uniform(0.8, 1.2, channels)
        beta = b.rng.uniform(relu_margin - 0.5, relu_margin + 0.5, channels)
        jitter = b.rng.uniform(0.8, 1.25, channels)
        # The probe runs through the float32-rounded weights the model will hold.
        w32 = w.astype(np.float32)
        b32 = None if bias is None else bias.astype(np.float32)
        y = _conv3x3_np(p, w32.astype(np.float64), None if b32 is None else b32.astype(np.float64))
        mean = y.mean(axis=(0, 2, 3))
        var = y.var(axis=(0, 2, 3)) * jitter
        ins = [x, b.init(f"{name}.conv.weight", w32)]
        if b32 is not None:
            ins.append(b.init(f"{name}.conv.bias", b32))
        x = b.node("Conv", ins, f"{name}.conv", kernel_shape=[3, 3], strides=[1, 1], pads=[1] * 4)
        x = b.bn(x, f"{name}.bn", (gamma, beta, mean, var))
        x = b.relu(x, f"{name}.relu")
        s = (gamma / np.sqrt(var + BN_EPS)).reshape(1, -1, 1, 1)
        p = np.maximum((y - mean.reshape(1, -1, 1, 1)) * s + beta.reshape(1, -1, 1, 1), 0.0)
    # The last Relu's output is the graph output.
    b.nodes[-1].output[0] = "output"
    doc = f"conv_bn_relu_chain({n_blocks}, channels={channels}, hw={hw}) seed {seed}: synthetic."
    return b.model(
        f"conv_bn_relu_chain_{n_blocks}", [channels, hw, hw], [("output", [channels, hw, hw])], doc
    )


# ---------------------------------------------------------------------------------------------
# resnet50_like


def resnet50_like(seed: int = RESNET50_SEED) -> onnx.ModelProto:
    """ResNet-50 v1.5 shapes with unfused BN: [N,3,224,224] -> logits [N,1000].

    25.6M parameters (~100 MB of float32), 53 Conv + 53 BatchNormalization, 16 bottlenecks
    in stages of [3, 4, 6, 3]. Synthetic weights (see the module docstring), for benchmarks.
    """
    b = _Builder(seed, float32_draws=True)
    x = b.relu(b.conv_bn(INPUT_NAME, "stem", 3, 64, 7, stride=2), "stem.relu")
    x = b.node("MaxPool", [x], "stem.maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)
    cin = 64
    for stage, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), start=1):
        for i in range(blocks):
            stride = 2 if (i == 0 and stage > 1) else 1
            # A small gain on the branch output, as with zero-init-residual training, keeps
            # 16 residual additions from compounding.
            x = _bottleneck(b, x, f"layer{stage}.{i}", cin, width, width * 4, stride, gain3=0.5)
            cin = width * 4
    out = b.gemm_head(x, 2048, 1000)
    doc = f"resnet50_like from models/make_models.py, seed {seed}: synthetic weights, not trained."
    return b.model("resnet50_like", [3, 224, 224], [(out, [1000])], doc)


# ---------------------------------------------------------------------------------------------
# helpers for the CLI, the README and the tests


def op_histogram(model: onnx.ModelProto) -> dict[str, int]:
    """Node counts by op type, most frequent first."""
    return dict(collections.Counter(n.op_type for n in model.graph.node).most_common())


def param_count(model: onnx.ModelProto) -> int:
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer)


def output_stats(model: onnx.ModelProto, batch: int = 2, seed: int = 0) -> dict[str, float]:
    """Per-output std when fed N(0,1) input, via onnxruntime with graph optimisations off."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    shape = [batch] + [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim[1:]]
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    outs = sess.run(None, {INPUT_NAME: x})
    return {o.name: float(np.std(v)) for o, v in zip(sess.get_outputs(), outs)}


BUILDERS = {
    "resnet_mini": resnet_mini,
    "mobilenet_mini": mobilenet_mini,
    "resnet50_like": resnet50_like,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                    help="output folder (default: the models/ folder beside this script)")
    ap.add_argument("--model", action="append", choices=sorted(BUILDERS),
                    help=f"model to write (repeatable; default: {', '.join(COMMITTED)})")
    ap.add_argument("--chain", type=int, action="append", default=[], metavar="N",
                    help="also write conv_bn_relu_chain_N.onnx (repeatable)")
    ap.add_argument("--check", action="store_true",
                    help="print per-output std on N(0,1) input (needs onnxruntime)")
    args = ap.parse_args(argv)

    names = args.model or ([] if args.chain else list(COMMITTED))
    jobs = [(name, BUILDERS[name]) for name in names]
    jobs += [(f"conv_bn_relu_chain_{n}", lambda n=n: conv_bn_relu_chain(n)) for n in args.chain]
    args.out.mkdir(parents=True, exist_ok=True)
    for name, build in jobs:
        model = build()
        path = args.out / f"{name}.onnx"
        data = model.SerializeToString()
        path.write_bytes(data)
        line = f"{path}: {len(data) / 1024:.1f} KiB, {param_count(model):,} params, ops {op_histogram(model)}"
        if args.check:
            line += f", output std {output_stats(model)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
