"""Seeded fuzzing of the ``rewrite`` command line with hostile and broken model files.

    python tools/fuzz.py --cases 200 --seed 0            # what CI runs (tests/test_fuzz.py)
    python tools/fuzz.py --cases 5000 --seed 7 --jobs 2 --keep-failures /tmp/fuzz-fail

Every case is one model file (with its external data file when the mutation needs one)
made from a seed model by one mutation, then rewritten with
``rewrite IN -o OUT --verify --target none`` (``--cli-args`` sets other options;
``--calib-samples N`` writes N seeded random samples of the unmutated seed model's inputs
per case and adds ``--calib``, for plans), with
``-q`` on even case numbers (nothing
may reach stdout) and without it on odd ones (the report printed to a file, so that its
rendering is tested too). A case ends in exactly one of:

* **verified**: exit 0, the output exists and onnxruntime agreed with the original;
* **clean error**: exit 2, exactly one line on stderr that starts with ``rewrite: error:``,
  no traceback, no output file (with ``--target migraphx``, the output stays written when
  MIGraphX fails the original too, as the contract says);
* **refused** (with a ``--plan`` in ``--cli-args``): exit 1, one ``rewrite: error:`` line,
  no output: ``--verify`` refusing a lossy plan's output, by design (a random 3-class head
  judged on 4 held-out samples, weights a bit flip made 1e30);
* **crash**: anything else: exit 1 (a rewrite that broke the numbers), exit 3 (a bug in a
  pass), a Python traceback, more than one stderr line (onnxruntime's log included), a
  timeout (the per-case time bound), a dead worker, an output left behind by a failure, a
  temp file left in the output folder, or a modified input file.

On top of that, every ``--recheck-every``-th verified case is run again (the two outputs
must be byte-identical) and its output rewritten once more (idempotence: the bytes must not
change); a difference counts as a crash.

The seed models are built here, deterministically: the committed ``models/*.onnx``, a
Conv+BN+Relu+Reshape+Gemm model for every default-domain opset from 7 to the newest onnx
knows, If and Loop bodies around convolutions with outer-scope weights, odd graphs (unused
inputs, an output that is also consumed, a tensor listed twice as output, an input that is
an output, IR-3 initializers listed as inputs, empty node names), a com.microsoft op, a
local function, sequence and optional ops, and external-data models. Trained models from
``tools/fetch_models.py`` join with ``--real`` when they are in the cache.

Mutations: truncation, random bytes, bit flips and overwritten byte runs of the serialized
file; cycles, dangling inputs, wrong initializer sizes, absurd or negative dims, random
opset and IR versions, duplicate node names, deleted nodes, reversed node order, swapped op
types, mutated attributes, missing/duplicated/renamed outputs; external data pointing
outside the folder (``../../etc/passwd``, an absolute path, a symlink out), missing, too
short, with bad offsets.

Cases run in worker processes that import ``rewriter`` once (a fresh interpreter per case
would spend a second on imports); the parent kills a worker that exceeds the time bound and
starts a new one. A case is reproducible from ``(seed, index)`` alone.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import queue
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
MAX_OPSET = onnx.defs.onnx_opset_version()
# -q on even cases only: a verification line that could not render (NaN bounds) was exit
# 3 for users and hidden from the fuzz, which ran every case with -q (seed 61403).
CLI_ARGS = ["--verify", "--target", "none"]
CALIB_SAMPLES = [0]   # --calib-samples: random calibration samples written per case


# --------------------------------------------------------------------------- seed models


@dataclass
class Seed:
    name: str
    model: onnx.ModelProto
    external: bool = False           # save its weights as external data
    args: list[str] = field(default_factory=list)  # extra CLI arguments
    inputs: dict | None = None       # written to inputs.npz and passed with --inputs


def _arr(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _bn(rng, prefix: str, c: int) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), prefix + "g"),
            numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), prefix + "b"),
            numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), prefix + "m"),
            numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), prefix + "v")]


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def conv_bn_model(opset: int, seed: int = 0, c: int = 4) -> onnx.ModelProto:
    """Conv+BN+Relu -> Reshape (constant shape) -> Gemm, valid at ``opset`` (>= 7)."""
    rng = np.random.default_rng(seed)
    bn_attrs = {"epsilon": 1e-5}
    if opset < 9:
        bn_attrs["spatial"] = 1  # opset 7/8 BN; later versions dropped the attribute
    nodes = [
        helper.make_node("Conv", ["x", "W", "B"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"], name="bn",
                         **bn_attrs),
        helper.make_node("Relu", ["bn"], ["r"], name="relu"),
        helper.make_node("Constant", [], ["shape"], name="shape",
                         value=numpy_helper.from_array(np.array([1, -1], np.int64))),
        helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),
        helper.make_node("Gemm", ["flat", "FC", "FB"], ["y"], name="fc", transB=1),
    ]
    inits = [numpy_helper.from_array(_arr(rng, c, c, 3, 3, scale=0.3), "W"),
             numpy_helper.from_array(_arr(rng, c, scale=0.1), "B")] + _bn(rng, "", c) + [
             numpy_helper.from_array(_arr(rng, 3, c * 16, scale=0.1), "FC"),
             numpy_helper.from_array(_arr(rng, 3, scale=0.1), "FB")]
    g = helper.make_graph(nodes, f"convbn{opset}", [_vi("x", [1, c, 4, 4])], [_vi("y", [1, 3])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 3 if opset < 8 else min(onnx.IR_VERSION, _ir_for_opset(opset))
    if m.ir_version < 4:  # IR 3: every initializer is also a graph input
        m.graph.input.extend(_vi(t.name, list(t.dims)) for t in inits)
    return m


def _ir_for_opset(opset: int) -> int:
    for ir, op in ((3, 8), (4, 9), (5, 10), (6, 11), (7, 12), (8, 14), (9, 18), (10, 21)):
        if opset <= op:
            return ir
    return onnx.IR_VERSION


def control_flow_models(seed: int = 1, c: int = 4) -> list[onnx.ModelProto]:
    """If whose branches run Conv+BN on outer-scope x/W, and a Loop around Conv+BN."""
    rng = np.random.default_rng(seed)

    def conv_bn(p, x, out):
        return [helper.make_node("Conv", [x, "W"], [p + "c"], pads=[1, 1, 1, 1]),
                helper.make_node("BatchNormalization", [p + "c", p + "g", p + "b", p + "m",
                                                        p + "v"], [p + "bn"]),
                helper.make_node("Relu", [p + "bn"], [out])]

    w = numpy_helper.from_array(_arr(rng, c, c, 3, 3, scale=0.3), "W")
    then_g = helper.make_graph(conv_bn("t_", "x", "t_out"), "then", [],
                               [_vi("t_out", None)], _bn(rng, "t_", c))
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e_x"])]
                               + conv_bn("o_", "e_x", "e_out"), "else", [], [_vi("e_out", None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)]
    inits = [w, numpy_helper.from_array(np.array(0, np.float32), "zero")] + _bn(rng, "o_", c)
    g = helper.make_graph(nodes, "if_conv", [_vi("x", [1, c, 5, 5])], [_vi("y", [1, c, 5, 5])],
                          inits)
    if_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if_model.ir_version = 8

    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])] + conv_bn("o_", "h", "h_out"),
        "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                 _vi("h", None)],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("h_out", None)])
    inits = [w, numpy_helper.from_array(np.array(3, np.int64), "trip"),
             numpy_helper.from_array(np.array(True), "tcond")] + _bn(rng, "o_", c)
    g = helper.make_graph([helper.make_node("Loop", ["trip", "tcond", "x"], ["y"], body=body)],
                          "loop_conv", [_vi("x", [1, c, 5, 5])], [_vi("y", [1, c, 5, 5])], inits)
    loop_model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    loop_model.ir_version = 8
    return [if_model, loop_model]


def odd_models(seed: int = 2, c: int = 4) -> dict[str, onnx.ModelProto]:
    """Graph shapes that trip naive rewriters; all valid ONNX that onnxruntime runs."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(_arr(rng, c, c, 3, 3, scale=0.3), "W")
    bn = _bn(rng, "", c)
    body = [helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"]),
            helper.make_node("Relu", ["bn"], ["y"]),
            helper.make_node("Identity", ["x"], ["xi"])]
    x, y = _vi("x", [1, c, 5, 5]), _vi("y", [1, c, 5, 5])
    out = {}

    def model(name, inputs, outputs, inits=None, ir=8):
        g = helper.make_graph(body, name, inputs, outputs, [w] + bn if inits is None else inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = ir
        out[name] = m

    model("unused_input", [x, _vi("unused", [3])], [y])
    model("output_also_consumed", [x], [y, _vi("c", [1, c, 5, 5]), _vi("bn", [1, c, 5, 5])])
    model("same_tensor_twice", [x], [y, y])
    model("input_is_output", [x], [y, _vi("x", [1, c, 5, 5]), _vi("xi", [1, c, 5, 5])])
    model("ir3_inits_as_inputs", [x] + [_vi(t.name, list(t.dims)) for t in [w] + bn], [y], ir=3)
    text = """
    <ir_version: 8, opset_import: ["" : 17, "com.microsoft": 1, "local": 1]>
    g (float[1,4,5,5] x) => (float[1,4,5,5] y, float[1,4,5,5] z, int64 n)
    {
      c1 = Constant<value = float[1] {2.0}>()
      a = Mul(x, c1)
      b = com.microsoft.Gelu(a)
      s = SequenceConstruct(a, b)
      n = SequenceLength(s)
      o = Optional(a)
      t = OptionalGetElement(o)
      y = local.twice(t)
      z = Add(b, c1)
    }
    <domain: "local", opset_import: ["" : 17]>
    twice (x) => (y) {
      two = Constant<value = float {2.0}>()
      y = Mul(x, two)
    }
    """
    out["custom_function_sequence"] = onnx.parser.parse_model(text)
    return out


def seed_models(real: bool = False) -> list[Seed]:
    seeds = [Seed(p.stem, onnx.load(str(p))) for p in sorted((ROOT / "models").glob("*.onnx"))]
    seeds += [Seed(f"convbn_opset{op}", conv_bn_model(op, seed=op)) for op in
              range(7, MAX_OPSET + 1)]
    seeds += [Seed("convbn_external", conv_bn_model(17, seed=99, c=16), external=True)]
    seeds += [Seed(m.graph.name, m) for m in control_flow_models()]
    seeds += [Seed(k, m) for k, m in odd_models().items()]
    if real:
        sys.path.insert(0, str(ROOT / "tools"))
        try:
            from fetch_models import model_path
        except Exception:  # noqa: BLE001 - the fetcher is optional here
            model_path = None
        p = model_path("silero_vad") if model_path else None
        if p:
            x = np.random.default_rng(0).standard_normal((1, 512)).astype(np.float32)
            seeds.append(Seed("silero_vad", onnx.load(str(p)), inputs={
                "input": x, "state": np.zeros((2, 1, 128), np.float32),
                "sr": np.array(16000, np.int64)}))
    return seeds


# --------------------------------------------------------------------------- mutations


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))] if len(seq) else None


def _all_nodes(g: onnx.GraphProto):
    for n in g.node:
        yield n
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(a.g)


def m_truncate(rng, m, files):
    b = m.SerializeToString()
    return b[:int(rng.integers(0, max(1, len(b))))]


def m_random_bytes(rng, m, files):
    return rng.bytes(int(rng.integers(0, 4096)))


def m_bitflip(rng, m, files):
    b = bytearray(m.SerializeToString())
    for _ in range(int(rng.integers(1, 9))):
        i = int(rng.integers(len(b)))
        b[i] ^= 1 << int(rng.integers(8))
    return bytes(b)


def m_overwrite(rng, m, files):
    b = bytearray(m.SerializeToString())
    i = int(rng.integers(len(b)))
    n = int(rng.integers(1, 33))
    b[i:i + n] = rng.bytes(n)
    return bytes(b)


def m_cycle(rng, m, files):
    nodes = [n for n in m.graph.node if n.input and n.output]
    if len(nodes) >= 2:
        i, j = sorted(rng.choice(len(nodes), 2, replace=False))
        nodes[i].input[0] = nodes[j].output[0]
    return m


def m_dangling(rng, m, files):
    n = _pick(rng, [n for n in _all_nodes(m.graph) if n.input])
    if n is not None:
        n.input[int(rng.integers(len(n.input)))] = "dangling_" + str(int(rng.integers(1000)))
    return m


def m_init_size(rng, m, files):
    t = _pick(rng, list(m.graph.initializer))
    if t is None:
        return m
    kind = int(rng.integers(3))
    if kind == 0 and t.raw_data:
        t.raw_data = t.raw_data[:int(rng.integers(len(t.raw_data)))]
    elif kind == 1:
        t.raw_data = t.raw_data + rng.bytes(int(rng.integers(1, 64)))
    elif t.dims:
        t.dims[int(rng.integers(len(t.dims)))] += int(rng.integers(1, 4))
    return m


def m_absurd_dims(rng, m, files):
    big = [2**31, 2**40, 2**62, -7, 0, 10**6]
    if rng.random() < 0.5 and m.graph.initializer:
        t = _pick(rng, list(m.graph.initializer))
        if t.dims:
            t.dims[int(rng.integers(len(t.dims)))] = _pick(rng, big)
    else:
        vi = _pick(rng, list(m.graph.input) + list(m.graph.output))
        if vi is not None and vi.type.tensor_type.shape.dim:
            d = _pick(rng, list(vi.type.tensor_type.shape.dim))
            d.dim_value = _pick(rng, big)
    return m


def m_opset(rng, m, files):
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = int(rng.integers(1, MAX_OPSET + 3))
    return m


def m_ir_version(rng, m, files):
    m.ir_version = int(rng.integers(0, onnx.IR_VERSION + 3))
    return m


def m_dup_names(rng, m, files):
    for n in m.graph.node:
        n.name = "same"
    return m


def m_drop_node(rng, m, files):
    if m.graph.node:
        del m.graph.node[int(rng.integers(len(m.graph.node)))]
    return m


def m_reverse(rng, m, files):
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


OPS = ["Relu", "Add", "Conv", "BatchNormalization", "Identity", "Dropout", "Reshape", "Shape",
       "ConstantOfShape", "Gemm", "MatMul", "If", "Loop", "Cast", "Transpose", "Concat",
       "Expand", "Tile", "Range", "QuantizeLinear", "DequantizeLinear", "Unknown"]


def m_op_swap(rng, m, files):
    n = _pick(rng, list(_all_nodes(m.graph)))
    if n is not None:
        n.op_type = _pick(rng, OPS)
    return m


def m_attr(rng, m, files):
    nodes = [n for n in _all_nodes(m.graph) if n.attribute]
    n = _pick(rng, nodes)
    if n is None:
        return m
    a = _pick(rng, list(n.attribute))
    vals = [-1, 0, 1, 2, 3, 2**31 - 1, -(2**31)]
    if a.type == onnx.AttributeProto.INT:
        a.i = _pick(rng, vals)
    elif a.type == onnx.AttributeProto.FLOAT:
        a.f = float(_pick(rng, [-1.0, 0.0, 1e30, float("nan"), float("inf")]))
    elif a.type == onnx.AttributeProto.INTS and len(a.ints):
        a.ints[int(rng.integers(len(a.ints)))] = _pick(rng, vals)
    elif a.type == onnx.AttributeProto.TENSOR and a.t.dims:
        a.t.dims[0] += 1
    return m


def m_outputs(rng, m, files):
    g = m.graph
    kind = int(rng.integers(3))
    if kind == 0 and g.output:
        del g.output[int(rng.integers(len(g.output)))]
    elif kind == 1 and g.output:
        g.output.add().CopyFrom(_pick(rng, list(g.output)))
    elif g.output:
        g.output[0].name = "nowhere"
    return m


def _to_external(m: onnx.ModelProto, files: dict, location="model.onnx.data"):
    """Move every initializer over 64 bytes to one external file; return the tensors moved."""
    data = bytearray()
    moved = []
    for t in m.graph.initializer:
        if t.data_type == TensorProto.STRING:
            continue
        raw = numpy_helper.to_array(t).tobytes()
        if len(raw) <= 64:
            continue
        off = len(data)
        data += raw
        t.ClearField("raw_data")
        for f in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(f)
        t.data_location = TensorProto.EXTERNAL
        del t.external_data[:]
        for k, v in (("location", location), ("offset", str(off)), ("length", str(len(raw)))):
            t.external_data.add(key=k, value=v)
        moved.append(t)
    files["model.onnx.data"] = bytes(data)
    return moved


def m_external(rng, m, files):
    """External data: escaping locations, symlinks out, missing or short files, bad offsets."""
    moved = _to_external(m, files)
    if not moved:
        return m
    t = _pick(rng, moved)
    info = {e.key: e for e in t.external_data}
    kind = int(rng.integers(9))
    if kind == 0:
        info["location"].value = "../../etc/passwd"
    elif kind == 1:
        info["location"].value = "/etc/passwd"
    elif kind == 2:
        files["link.data"] = ("symlink", "/etc/passwd")
        info["location"].value = "link.data"
    elif kind == 3:
        info["location"].value = "sub/../../x.data"
    elif kind == 4:
        files.pop("model.onnx.data")  # missing
    elif kind == 5:
        files["model.onnx.data"] = files["model.onnx.data"][:-int(rng.integers(1, 64))]
    elif kind == 6:
        info["offset"].value = str(int(rng.integers(-10, 10**12)))
    elif kind == 7:
        info["length"].value = _pick(rng, ["-5", "abc", "99999999999", "0"])
    else:
        info["location"].value = ""
    return m


def m_none(rng, m, files):
    return m


MUTATIONS = {
    "none": m_none, "truncate": m_truncate, "random_bytes": m_random_bytes,
    "bitflip": m_bitflip, "overwrite": m_overwrite, "cycle": m_cycle, "dangling": m_dangling,
    "init_size": m_init_size, "absurd_dims": m_absurd_dims, "opset": m_opset,
    "ir_version": m_ir_version, "dup_names": m_dup_names, "drop_node": m_drop_node,
    "reverse": m_reverse, "op_swap": m_op_swap, "attr": m_attr, "outputs": m_outputs,
    "external": m_external,
}


def make_case(seeds: list[Seed], seed: int, index: int, folder: Path) -> dict:
    """Write case ``index`` into ``folder``; return its description."""
    rng = np.random.default_rng([seed, index])
    s = seeds[int(rng.integers(len(seeds)))]
    name = list(MUTATIONS)[int(rng.integers(len(MUTATIONS)))]
    m = onnx.ModelProto()
    m.CopyFrom(s.model)
    files: dict = {}
    if s.external and name != "external":
        _to_external(m, files)
    out = MUTATIONS[name](rng, m, files)
    data = out if isinstance(out, bytes) else out.SerializeToString()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(data)
    for fname, content in files.items():
        p = folder / fname
        if ".." in Path(fname).parts:
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, tuple):
            os.symlink(content[1], p)
        else:
            p.write_bytes(content)
    args = list(s.args)
    if s.inputs is not None:
        np.savez(folder / "inputs.npz", **s.inputs)
        args += ["--inputs", str(folder / "inputs.npz")]
    if CALIB_SAMPLES[0] and _calibration(s, folder / "calib", CALIB_SAMPLES[0]):
        args += ["--calib", str(folder / "calib")]
    return {"index": index, "seed_model": s.name, "mutation": name, "args": args}


def _calibration(s: Seed, folder: Path, n: int) -> bool:
    """``n`` seeded random samples (``verify.make_feeds``) for the unmutated seed model's
    inputs, one .npz each, at its --input-shape sizes; False where none can be made (a
    sequence input, say): the case then runs without --calib."""
    from rewriter.verify import make_feeds, parse_shape_args
    shapes = parse_shape_args([a for k, a in zip(s.args, s.args[1:]) if k == "--input-shape"])
    try:
        feeds = [make_feeds(s.model, shapes or None, seed=i) for i in range(n)]
    except Exception:  # noqa: BLE001 - a seed random inputs cannot feed
        return False
    folder.mkdir(parents=True, exist_ok=True)
    for i, f in enumerate(feeds):
        np.savez(folder / f"sample{i:03d}.npz", **f)
    return True


# --------------------------------------------------------------------------- worker


def worker_main() -> int:
    """Read case folders from stdin, run the CLI in-process, answer one JSON line each."""
    from rewriter import cli

    # Answers go to a private copy of stdout; during a case fds 1 and 2 go to files, so
    # whatever the code under test prints (a library's warnings included) is caught there.
    answers = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        job = json.loads(line)
        err_path = Path(job["stderr"])
        argv = [job["model"], "-o", job["output"]] + job["args"]
        t0 = time.perf_counter()
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(err_path, "wb") as ef, open(job["stdout"], "wb") as of:
            os.dup2(of.fileno(), 1)
            os.dup2(ef.fileno(), 2)
            try:
                code = cli.main(argv)
                raised = None
            except BaseException as e:  # noqa: BLE001 - main() must never raise
                code, raised = None, f"{type(e).__name__}: {e}"
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        answers.write(json.dumps({"code": code, "raised": raised,
                                  "seconds": time.perf_counter() - t0}) + "\n")
        answers.flush()
    return 0


class Worker:
    """One `fuzz.py --worker` process; restarted after a timeout or a crash."""

    def __init__(self):
        self.proc = None

    def start(self):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, cwd=str(ROOT))

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def run(self, job: dict, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self.stop()
            return {"code": None, "raised": "worker died before the case", "seconds": 0.0}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.stop()
            return {"code": None, "raised": f"timeout after {timeout:.0f} s", "seconds": timeout}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return {"code": None, "raised": f"worker died (exit {code})", "seconds": 0.0}
        return json.loads(line)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else ""


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): _sha(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _original_too(line: str) -> bool:
    """``--target migraphx``: MIGraphX fails the original as it failed the written output,
    or, without --verify, the MIGraphX step is the first to run the original and
    onnxruntime cannot (exit 2, the output stays written, docs/robustness.md's contract)."""
    return line.startswith("rewrite: error: MIGraphX") and "original" in line or any(
        line.startswith("rewrite: error: " + s) for s in (
            "onnxruntime cannot run the original model", "onnxruntime cannot load the "
            "original model", "the original model's output"))


def classify(res: dict, folder: Path, out: Path, before: dict,
             quiet: bool = True) -> tuple[str, str]:
    """(verdict, reason) for one finished run (``quiet``: it ran with -q)."""
    if res["code"] is None:   # no run: a worker that died wrote no stderr.txt to read
        return "crash", res["raised"] or "no exit code"
    err_lines = [ln for ln in (folder / "stderr.txt").read_text(errors="replace").splitlines()
                 if ln.strip()]
    stdout = (folder / "stdout.txt").read_text(errors="replace").strip()
    leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(".rewrite-")]
    inputs_now = {k: v for k, v in _snapshot(folder).items()
                  if not k.startswith(("out/", "stderr", "stdout"))}
    if stdout and quiet:  # -q: nothing but errors, and those on stderr
        return "crash", f"output on stdout despite -q: {stdout.splitlines()[0][:120]}"
    if any("Traceback" in ln for ln in err_lines):
        return "crash", "traceback on stderr"
    if leftovers:
        return "crash", f"temp files left: {leftovers}"
    if inputs_now != before:
        return "crash", "input files modified"
    if res["code"] == 0:
        if not out.exists():
            return "crash", "exit 0 without an output"
        if err_lines:
            return "crash", f"exit 0 but stderr: {err_lines[0][:160]}"
        return "verified", ""
    first = err_lines[0][:200] if err_lines else ""
    if res["code"] == 2 and len(err_lines) == 1 and first.startswith("rewrite: error:"):
        if out.exists() and not _original_too(first):
            return "crash", "output written despite the error"
        return "clean_error", first
    if (res["code"] == 1 and len(err_lines) == 1 and first.startswith("rewrite: error:")
            and not out.exists() and "--plan" in CLI_ARGS):
        return "refused", first   # --verify refused a lossy plan's output: by design
    if len(err_lines) != 1:
        return "crash", f"exit {res['code']} with {len(err_lines)} stderr lines: " + \
            " | ".join(ln[:120] for ln in err_lines[:3])
    return "crash", f"exit {res['code']}: {first}"


def run_case(worker: Worker, seeds, seed: int, index: int, base: Path, timeout: float,
             recheck: bool) -> dict:
    folder = base / f"case{index:06d}"
    shutil.rmtree(folder, ignore_errors=True)
    case = make_case(seeds, seed, index, folder)
    (folder / "out").mkdir()
    before = _snapshot(folder)
    job = {"model": str(folder / "model.onnx"), "output": str(folder / "out" / "out.onnx"),
           "stderr": str(folder / "stderr.txt"), "stdout": str(folder / "stdout.txt"),
           "args": case["args"] + CLI_ARGS + ["-q"] * (index % 2 == 0)}
    res = worker.run(job, timeout)
    verdict, reason = classify(res, folder, folder / "out" / "out.onnx", before,
                               quiet=index % 2 == 0)
    if verdict == "verified" and recheck:
        verdict, reason = _recheck(worker, folder, job, timeout)
    case.update(verdict=verdict, reason=reason, code=res["code"],
                seconds=round(res["seconds"], 3))
    return case


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _recheck(worker, folder: Path, job: dict, timeout: float) -> tuple[str, str]:
    """Determinism (same bytes twice) and idempotence (rewriting the output changes nothing).

    Outputs keep the name ``out.onnx`` in every run, because the external data file's name
    (``out.onnx.data``) is written into the model.
    """
    first = _files(folder / "out")
    (folder / "again").mkdir()
    again = worker.run(dict(job, output=str(folder / "again" / "out.onnx")), timeout)
    if again["code"] != 0:
        return "crash", f"second run exit {again['code']} ({again['raised']})"
    if _files(folder / "again") != first:
        return "crash", "two runs gave different bytes"
    # Rewrite the output: copy it (and its data file) into a folder of its own.
    re_dir = folder / "re"
    (re_dir / "out").mkdir(parents=True)
    for name, b in first.items():
        (re_dir / name).write_bytes(b)
    res = worker.run(dict(job, model=str(re_dir / "out.onnx"),
                          output=str(re_dir / "out" / "out.onnx")), timeout)
    if res["code"] != 0:
        return "crash", f"rewriting the output failed (exit {res['code']}: {res['raised']})"
    if _files(re_dir / "out") != first:
        return "crash", "rewriting the output changed it (not idempotent)"
    return "verified", ""


# --------------------------------------------------------------------------- driver


def fuzz(cases: int, seed: int = 0, jobs: int = 0, timeout: float = 30.0,
         recheck_every: int = 10, real: bool = False, keep_failures: Path | None = None,
         progress: bool = False) -> dict:
    """Run ``cases`` cases; return counts and the list of crashes."""
    seeds = seed_models(real=real)
    jobs = jobs or min(4, os.cpu_count() or 1)
    base = Path(tempfile.mkdtemp(prefix="rewrite-fuzz-"))
    todo: queue.Queue = queue.Queue()
    for i in range(cases):
        todo.put(i)
    results: list[dict] = []
    lock = threading.Lock()
    t0 = time.perf_counter()

    def loop():
        w = Worker()
        try:
            while True:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                recheck = recheck_every > 0 and i % recheck_every == 0
                try:
                    case = run_case(w, seeds, seed, i, base, timeout, recheck)
                except Exception as e:  # noqa: BLE001 - a harness bug must not hide cases
                    case = {"index": i, "verdict": "crash", "reason": f"harness: {e!r}"}
                folder = base / f"case{i:06d}"
                if case["verdict"] == "crash" and keep_failures is not None:
                    keep_failures.mkdir(parents=True, exist_ok=True)
                    shutil.copytree(folder, keep_failures / folder.name, symlinks=True,
                                    dirs_exist_ok=True)
                shutil.rmtree(folder, ignore_errors=True)
                with lock:
                    results.append(case)
                    if progress and len(results) % 50 == 0:
                        print(f"  {len(results)}/{cases} cases, "
                              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        finally:
            w.stop()

    threads = [threading.Thread(target=loop) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    shutil.rmtree(base, ignore_errors=True)
    results.sort(key=lambda c: c["index"])
    counts = collections.Counter(c["verdict"] for c in results)
    by_mutation: dict = collections.defaultdict(collections.Counter)
    for c in results:
        by_mutation[c.get("mutation", "?")][c["verdict"]] += 1
    return {
        "cases": cases, "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
        "verified": counts.get("verified", 0), "clean_error": counts.get("clean_error", 0),
        "crash": counts.get("crash", 0), "refused": counts.get("refused", 0),
        "by_mutation": {k: dict(v) for k, v in sorted(by_mutation.items())},
        "slowest": max((c.get("seconds", 0) for c in results), default=0),
        "crashes": [c for c in results if c["verdict"] == "crash"],
        "errors": collections.Counter(_error_kind(c["reason"]) for c in results
                                      if c["verdict"] == "clean_error").most_common(),
    }


def _error_kind(line: str) -> str:
    """The error line without the case-specific parts (paths, names)."""
    s = line.removeprefix("rewrite: error: ")
    s = s.split(": ", 1)[1] if s.startswith("/") else s
    return s.split("(")[0].split("'")[0][:70].strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=0, help="worker processes (default: cores, max 4)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    ap.add_argument("--recheck-every", type=int, default=10, metavar="K",
                    help="determinism + idempotence re-run of every K-th case (0: never)")
    ap.add_argument("--real", action="store_true", help="add cached trained models as seeds")
    ap.add_argument("--keep-failures", type=Path, metavar="DIR", help="copy crashing cases here")
    ap.add_argument("--json", type=Path, help="write the full result here")
    ap.add_argument("--cli-args", default=" ".join(CLI_ARGS),
                    help="the options every case runs with (default: %(default)s); e.g. "
                    "'--target migraphx --migraphx-target ref' compiles on MIGraphX too")
    ap.add_argument("--calib-samples", type=int, default=0, metavar="N",
                    help="write N random calibration samples per case and pass --calib "
                    "(with a --plan in --cli-args)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main()
    import shlex
    CLI_ARGS[:] = shlex.split(args.cli_args)
    CALIB_SAMPLES[0] = args.calib_samples
    r = fuzz(args.cases, args.seed, args.jobs, args.timeout, args.recheck_every, args.real,
             args.keep_failures, progress=True)
    print(f"{r['cases']} cases, seed {r['seed']}, {r['seconds']} s: "
          f"rewritten-and-verified {r['verified']} / clean error {r['clean_error']} / "
          + (f"plan refused by --verify {r['refused']} / " if "--plan" in CLI_ARGS else "")
          + f"crash {r['crash']}")
    for name, c in r["by_mutation"].items():
        print(f"  {name:<14} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    print("  errors: " + "; ".join(f"{k} x{n}" for k, n in r["errors"][:12]))
    for c in r["crashes"][:30]:
        print(f"  CRASH case {c['index']} ({c.get('seed_model')} / {c.get('mutation')}): "
              f"{c['reason']}")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2, default=str) + "\n")
    return 1 if r["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
