"""How int8-friendly is each conv input of a quant_eval task, and would a rotation help?

    python tools/quant_tensor_sqnr.py --task cls-photo [--n 64] [--seed 0]

For every conv input tensor of the task's model, on ``--n`` calibration samples: the SQNR
(dB) of per-tensor symmetric int8 with its best clip (a 33-point grid of the max), of the
same after each channel is divided by its own max (what ideal cross-layer equalization
gives), and after a random orthogonal rotation of the channels (QuaRot-style: exact only on
a linear residual stream, between a producer and a consumer that both absorb it). ``stream``
marks the tensors of a residual stream (a residual Add's inputs and output, every producer
a BatchNormalization or an Add), the ones a rotation could be folded into.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import quant_eval as qe  # noqa: E402


def sqnr(x: np.ndarray) -> float:
    """Per-tensor symmetric int8 at the best of 33 clips from 0.2 to 1 times the max."""
    top, sig, best = float(np.abs(x).max()), float((x ** 2).mean()), -np.inf
    for f in np.linspace(0.2, 1.0, 33):
        sc = top * f / 127
        err = float(((np.clip(np.round(x / sc), -127, 127) * sc - x) ** 2).mean())
        best = max(best, 10 * np.log10(sig / max(err, 1e-30)))
    return best


def main() -> int:
    import onnx

    from rewriter.core import ort

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=list(qe.TASKS), required=True)
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    m = onnx.load(str(qe.CACHE / qe.TASKS[a.task][0]))
    g = m.graph
    const = {i.name for i in g.initializer} | {o for n in g.node if n.op_type == "Constant"
                                               for o in n.output}
    prod = {o: n for n in g.node for o in n.output}
    stream = set()
    for n in g.node:
        if n.op_type == "Add" and all(i not in const and i in prod and prod[i].op_type in
                                      ("BatchNormalization", "Add") for i in n.input):
            stream |= set(n.input) | set(n.output)
    convs = [n for n in g.node if n.op_type == "Conv"]
    names = list(dict.fromkeys(n.input[0] for n in convs))
    probed = onnx.ModelProto()
    probed.CopyFrom(m)
    probed.graph.output.extend(onnx.helper.make_empty_tensor_value_info(t) for t in names)
    sess = ort.session(probed)
    feed = sess.get_inputs()[0].name
    xs, _ = qe.task_data(a.task, a.n, a.seed)
    runs = [dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {feed: x[None]})))
            for x in xs]
    rng = np.random.default_rng(a.seed)
    print(f"{a.task}: {a.n} samples, seed {a.seed}; SQNR dB of per-tensor int8")
    print(f"{'tensor':32s} stream    C  tensor  per-channel  rotated")
    for t in names:
        x = np.concatenate([r[t] for r in runs])
        if x.ndim != 4 or x.shape[1] < 4:
            continue
        c = x.shape[1]
        top = np.abs(x).max(axis=(0, 2, 3)).clip(1e-12)
        q, _ = np.linalg.qr(rng.standard_normal((c, c)))
        print(f"{t[:32]:32s} {'yes' if t in stream else '':6s} {c:4d} {sqnr(x):7.1f} "
              f"{sqnr(x / top[None, :, None, None]):12.1f} "
              f"{sqnr(np.einsum('dc,nchw->ndhw', q, x)):8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
