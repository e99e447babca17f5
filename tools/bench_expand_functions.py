"""expand-functions on a chain of RMSNormalization nodes: time and nodes left.

    python tools/bench_expand_functions.py --norms 200 --opsets 23 24 --runs 3

A chain of N RMSNormalization(x[B, T, 64], scale) nodes (what a Llama of N/2 layers has),
rewritten with ``target="migraphx"`` (expand-functions writes each as its ONNX body, the
rest of the pipeline folds the body's shape arithmetic) and verified in onnxruntime. Prints
the median wall time of ``--runs`` runs and the node count per opset: at opset 24 the body
(written for 23) goes through onnx's version converter, at 23 it does not.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import rewriter


def chain(n: int, opset: int):
    nodes, inits, prev = [], [], "x"
    rng = np.random.default_rng(0)
    for i in range(n):
        inits.append(numpy_helper.from_array(
            (1 + 0.1 * rng.standard_normal(64)).astype(np.float32), f"s{i}"))
        nodes.append(helper.make_node("RMSNormalization", [prev, f"s{i}"], [f"r{i}"],
                                      epsilon=1e-5))
        prev = f"r{i}"
    g = helper.make_graph(nodes, "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 64])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT,
                                                         ["B", "T", 64])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--norms", type=int, default=200)
    p.add_argument("--opsets", type=int, nargs="+", default=[23, 24])
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    for opset in a.opsets:
        m = chain(a.norms, opset)
        times, nodes = [], None
        for _ in range(a.runs):
            t = time.perf_counter()
            out, _ = rewriter.rewrite(m, target="migraphx", verify=True)
            times.append(time.perf_counter() - t)
            nodes = len(out.graph.node)
        print(f"opset {opset}: {a.norms} norms -> {nodes} nodes, "
              f"{statistics.median(times):.2f} s (median of {a.runs})", flush=True)


if __name__ == "__main__":
    main()
