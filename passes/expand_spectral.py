"""expand-spectral: DFT and STFT, which MIGraphX does not parse, as a MatMul or a Conv
against constant cos/sin matrices.

MIGraphX 2.15 and 2.16 register neither DFT (opset 17 and 20) nor STFT (opset 17), and
neither has an ONNX function body (expand-functions cannot write them out), so an audio
front-end (STFT -> magnitude -> mel) is refused at parse. Both are linear in the signal:

    DFT <axis=a, inverse, onesided> (x [..., n, c], dft_length=L)
        =>  Transpose(Reshape(MatMul(Reshape(Transpose(x), [..., n*c]), W), [..., m, 2]))
    STFT <onesided> (x [b, len, c], frame_step=s, window w, frame_length=L)
        =>  Reshape(Transpose(Conv <strides=[s]> (Transpose(x) [b, c, len], K)), [b, F, m, 2])
        (a [b, len] signal, torch's form, which onnxruntime reads as real: Unsqueeze(x, 1))

with theta = 2*pi*((t*k) mod L)/L, sigma = -1 (forward) or +1 (inverse), m = L//2 + 1 when
onesided else L, and, for a complex input (c = 2, real and imaginary parts):

    Re Y[k] = g * sum_t (Re x[t] cos theta - sigma Im x[t] sin theta)
    Im Y[k] = g * sum_t (sigma Re x[t] sin theta + Im x[t] cos theta)

g = 1/L for the inverse, else 1. W holds those coefficients ([n*c, 2m], the output's real
and imaginary parts interleaved as the DFT writes them); its rows past L are zero (the
signal truncated to dft_length) and rows for t >= n are absent (zero padding). K is the
same for each frame with the window folded in ([2m, c, L], times w[t]; a computed window is
a Mul). The Transposes move the DFT's axis next to the complex one and back (none when it is
there). The matrices are computed in float64 and cast to the input's type; the sums are
the same up to float rounding (onnxruntime runs an FFT for a power-of-two length):
Numerics.CLOSE. For other lengths onnxruntime (1.32) sums with twiddles of float accuracy,
about 2.7e-7 * n off numpy's float64 FFT (2.7e-4 at n = 1000, a 1000-point rfft; the
rewrite is 4e-7 off), more than --verify's 1e-4: the verifier therefore runs every DFT and
STFT in float64, in the original and in each candidate alike
(rewriter.verify.verifier.spectral_in_double), so what it judges is the rewrite.

Skipped with a reason: a dft_length, axis, frame_step or frame_length that is not a
constant (non-constant-*); an input whose rank or last dimension is not known
(unknown-shape), whose transformed length is not (unknown-length), an STFT whose frame
length neither frame_length nor a window of known length gives (unknown-frame-length), or
whose computed window's length is not known though frame_length is (unknown-window-length:
a window of one sample would broadcast in the Mul where onnxruntime refuses it); a
last dimension other than 1 or 2 (not-real-or-complex); an axis outside [0, rank - 2]
(invalid-axis); a dft_length, frame_step or frame_length below 1 (invalid-dft-length,
invalid-frame); a onesided DFT of a complex input or a onesided inverse of a real one
(onesided-complex, onesided-inverse: onnxruntime's shape inference refuses both); a
onesided inverse whose dft_length wants other than n bins (irfft-length: onnxruntime's
output is then not numpy's irfft); a window whose length is not frame_length
(window-length); a double STFT (double-stft: onnxruntime has no double Conv, so the
rewrite would neither run nor be verified); float16 and bfloat16 inputs (half-type:
onnxruntime has no bfloat16 DFT, and the float16 rewrite was not verified); other types
(unknown-type); a matrix over MAX_MATRIX_BYTES (matrix-too-large: a 4096-point complex
DFT in float would be 256 MiB). In the default pipeline only when MIGraphX is the target:
elsewhere the one node (onnxruntime's FFT) is the better model.
"""

from __future__ import annotations

import numpy as np
import onnx_graphsurgeon as gs

from rewriter.core.graph import iter_graphs, np_dtype, peek_values
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase

# The largest cos/sin matrix (or Conv kernel) written: 64 MiB, which a 2048-point complex
# DFT in float just fits (2048*2 rows x 2048*2 columns x 4 bytes).
MAX_MATRIX_BYTES = 64 << 20

_STANDARD = (None, "", "ai.onnx")


class ExpandSpectral(Pass):
    name = "expand-spectral"
    phase = Phase.FOLD
    numerics = Numerics.CLOSE
    summary = "DFT and STFT, which MIGraphX does not parse, as a MatMul / Conv against " \
              "constant cos/sin matrices"
    shape_ops = ("DFT", "STFT")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        opset = int(graph.opset or 1)
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.domain in _STANDARD and node.op in ("DFT", "STFT"):
                    expand = _dft if node.op == "DFT" else _stft
                    res.outcome(expand(node, g, opset, ctx), f"expanded-{node.op}")
        return res


def _const(t: gs.Tensor) -> np.ndarray | None:
    """The value of ``t`` when it is a constant (an initializer or a Constant node's)."""
    if isinstance(t, gs.Constant):
        return np.asarray(peek_values(t))
    if len(t.inputs) == 1 and t.inputs[0].op == "Constant":
        attrs = t.inputs[0].attrs
        if isinstance(attrs.get("value"), gs.Constant):
            return np.asarray(attrs["value"].values)
        for key in ("value_int", "value_ints"):
            if key in attrs:
                return np.asarray(attrs[key], np.int64)
    return None


def _given(node: gs.Node, i: int) -> gs.Tensor | None:
    return node.inputs[i] if len(node.inputs) > i and node.inputs[i].name else None


def _scalar(node: gs.Node, i: int, what: str) -> int | str | None:
    """The int of the scalar input ``i``: None when it is not given, ``non-constant-<what>``
    when it is computed."""
    t = _given(node, i)
    if t is None:
        return None
    v = _const(t)
    if v is None or v.size != 1 or v.dtype.kind not in "iu":
        return f"non-constant-{what}"
    return int(v.reshape(-1)[0])


def _float_type(t: gs.Tensor) -> np.dtype | str:
    if t.dtype is None:
        return "unknown-type"
    dt = np_dtype(t.dtype)
    if dt in (np.float32, np.float64):
        return dt
    if dt == np.float16 or dt.name == "bfloat16":
        return "half-type"
    return "unknown-type"


def _angles(times: int, bins: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2*pi*t*k/length, [times, bins], in float64; t*k is reduced mod length
    in integers first, so a long transform loses no precision in the angle."""
    tk = np.outer(np.arange(times, dtype=np.int64), np.arange(bins, dtype=np.int64)) % length
    theta = 2.0 * np.pi * tk / length
    return np.cos(theta), np.sin(theta)


def _node(g: gs.Graph, ctx: Context, base: str, op: str, inputs: list, attrs=None,
          out: gs.Tensor | None = None, dtype=None) -> gs.Tensor:
    """Append ``op`` to ``g``; its output is ``out`` or a fresh tensor named from ``base``."""
    if out is None:
        out = gs.Variable(ctx.namer(f"{base}_{op.lower()}"), dtype=dtype)
    g.nodes.append(gs.Node(op, ctx.namer(f"{base}_{op.lower()}"), attrs or {}, inputs, [out]))
    return out


def _ints(ctx: Context, base: str, tag: str, values) -> gs.Constant:
    return gs.Constant(ctx.namer(f"{base}_{tag}"), np.asarray(values, np.int64))


def _detach(node: gs.Node) -> gs.Tensor:
    """Clear ``node`` (the manager's cleanup drops it); its output, for the last new node."""
    out = node.outputs[0]
    node.inputs.clear()
    node.outputs.clear()
    return out


def _dft(node: gs.Node, g: gs.Graph, opset: int, ctx: Context) -> str | None:
    x = node.inputs[0]
    dt = _float_type(x)
    if isinstance(dt, str):
        return dt
    if x.shape is None or len(x.shape) < 2 or not isinstance(x.shape[-1], int):
        return "unknown-shape"
    r, c = len(x.shape), x.shape[-1]
    if c not in (1, 2):
        return "not-real-or-complex"
    if opset >= 20:   # the axis an input (-2 when not given), before an attribute
        axis = _scalar(node, 2, "axis")
        axis = -2 if axis is None else axis
    else:
        axis = int(node.attrs.get("axis", 1))
    if isinstance(axis, str):
        return axis
    a = axis + r if axis < 0 else axis
    if not 0 <= a <= r - 2:
        return "invalid-axis"
    n = x.shape[a]
    if not isinstance(n, int):
        return "unknown-length"
    length = _scalar(node, 1, "dft-length")
    if isinstance(length, str):
        return length
    onesided, inverse = int(node.attrs.get("onesided", 0)), int(node.attrs.get("inverse", 0))
    # onesided inverse: x holds the first bins of a conjugate-symmetric spectrum, the
    # output is real ([..., L, 1]) and L is 2 * (n - 1) unless given (onnx's irfft case)
    c2r = bool(onesided and inverse)
    if c2r and c == 1:
        return "onesided-inverse"
    if onesided and c == 2 and not inverse:
        return "onesided-complex"
    length = (2 * (n - 1) if c2r else n) if length is None else length
    if length < 1:
        return "invalid-dft-length"
    if c2r and n != length // 2 + 1:
        # more or fewer bins than the spectrum has: onnxruntime's output is then not
        # numpy's irfft (0.14 apart for 6 bins, L = 9), and no spec says which is right
        return "irfft-length"
    m, parts = (length, 1) if c2r else (length // 2 + 1 if onesided else length, 2)
    if n * c * m * parts * dt.itemsize > MAX_MATRIX_BYTES:
        return "matrix-too-large"

    w = np.zeros((n, c, m, parts))
    if c2r:
        # y[t] = (1/L) sum over all L bins of Re(X[k] e^{i theta}); bin L-k is bin k's
        # conjugate, so each bin but 0 and L/2 counts twice
        bins = n
        cos, sin = _angles(bins, m, length)
        twice = np.where((np.arange(bins) == 0) | (2 * np.arange(bins) == length), 1.0, 2.0)
        w[:bins, 0, :, 0] = twice[:, None] * cos / length
        w[:bins, 1, :, 0] = -twice[:, None] * sin / length
    else:
        sigma, gain = (1.0, 1.0 / length) if inverse else (-1.0, 1.0)
        used = min(n, length)   # rows past dft_length stay zero (the signal is truncated)
        cos, sin = _angles(used, m, length)
        w[:used, 0, :, 0], w[:used, 0, :, 1] = gain * cos, sigma * gain * sin
        if c == 2:
            w[:used, 1, :, 0], w[:used, 1, :, 1] = -sigma * gain * sin, gain * cos
    base = node.name or node.outputs[0].name
    out = _detach(node)
    perm = [i for i in range(r) if i not in (a, r - 1)] + [a, r - 1]
    if perm != list(range(r)):
        x = _node(g, ctx, base, "Transpose", [x], {"perm": perm}, dtype=dt)
    # 0 keeps a dimension: the batch and other axes may be symbolic
    flat = _node(g, ctx, base, "Reshape", [x, _ints(ctx, base, "flat", [0] * (r - 2) +
                                                   [n * c])], dtype=dt)
    y = _node(g, ctx, base, "MatMul",
              [flat, gs.Constant(ctx.namer(f"{base}_basis"), w.reshape(n * c, m * parts)
                                 .astype(dt))], dtype=dt)
    shape = _ints(ctx, base, "shape", [0] * (r - 2) + [m, parts])
    if perm == list(range(r)):
        _node(g, ctx, base, "Reshape", [y, shape], out=out)
    else:
        y = _node(g, ctx, base, "Reshape", [y, shape], dtype=dt)
        _node(g, ctx, base, "Transpose", [y], {"perm": [perm.index(i) for i in range(r)]},
              out=out)
    return None


def _stft(node: gs.Node, g: gs.Graph, opset: int, ctx: Context) -> str | None:
    x = node.inputs[0]
    dt = _float_type(x)
    if isinstance(dt, str):
        return dt
    # onnxruntime reads a [batch, len] signal as real, as torch's exporter writes it
    if x.shape is None or len(x.shape) not in (2, 3) or (
            len(x.shape) == 3 and not isinstance(x.shape[2], int)):
        return "unknown-shape"
    c = 1 if len(x.shape) == 2 else x.shape[2]
    if c not in (1, 2):
        return "not-real-or-complex"
    step = _scalar(node, 1, "frame-step")
    if isinstance(step, str) or step is None:
        return step or "non-constant-frame-step"
    length = _scalar(node, 3, "frame-length")
    if isinstance(length, str):
        return length
    window = _given(node, 2)
    wlen = window.shape[0] if window is not None and window.shape is not None and len(
        window.shape) == 1 and isinstance(window.shape[0], int) else None
    if window is not None and wlen is None:
        # a computed window must have a known length to be multiplied in (and checked);
        # with frame_length given, it is the window's length that is not known
        return "unknown-frame-length" if length is None else "unknown-window-length"
    if length is not None and wlen is not None and wlen != length:
        return "window-length"
    length = length if length is not None else wlen
    if length is None:
        return "unknown-frame-length"
    if step < 1 or length < 1:
        return "invalid-frame"
    if window is not None and window.dtype is not None and np_dtype(window.dtype) != dt:
        return "unknown-type"
    if dt == np.float64:
        return "double-stft"   # onnxruntime has no double Conv: the rewrite would not run
    m = length // 2 + 1 if int(node.attrs.get("onesided", 1)) else length
    if 2 * m * c * length * dt.itemsize > MAX_MATRIX_BYTES:
        return "matrix-too-large"

    # Conv's output channel 2k + p is bin k's real (p = 0) or imaginary (p = 1) part, the
    # forward transform (sigma = -1); a frame's sample t is the kernel's tap t.
    cos, sin = _angles(length, m, length)
    k = np.zeros((m, 2, c, length))
    k[:, 0, 0], k[:, 1, 0] = cos.T, -sin.T
    if c == 2:
        k[:, 0, 1], k[:, 1, 1] = sin.T, cos.T
    wvals = _const(window) if window is not None else None
    if wvals is not None:
        k = k * wvals.astype(np.float64)
    base = node.name or node.outputs[0].name
    kernel = gs.Constant(ctx.namer(f"{base}_basis"), k.reshape(2 * m, c, length).astype(dt))
    out = _detach(node)
    if window is not None and wvals is None:
        kernel = _node(g, ctx, base, "Mul", [kernel, window], dtype=dt)
    if c == 1 and len(x.shape) == 2:
        x = _node(g, ctx, base, "Unsqueeze", [x, _ints(ctx, base, "axes", [1])], dtype=dt)
    else:
        x = _node(g, ctx, base, "Transpose", [x], {"perm": [0, 2, 1]}, dtype=dt)
    y = _node(g, ctx, base, "Conv", [x, kernel],
              {"kernel_shape": [length], "strides": [step], "pads": [0, 0]}, dtype=dt)
    y = _node(g, ctx, base, "Transpose", [y], {"perm": [0, 2, 1]}, dtype=dt)
    _node(g, ctx, base, "Reshape", [y, _ints(ctx, base, "shape", [0, 0, m, 2])], out=out)
    return None
