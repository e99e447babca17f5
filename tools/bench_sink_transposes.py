"""Time sink-transposes on a long chain of NHWC blocks, tf2onnx's HardSwish in miniature.

    python tools/bench_sink_transposes.py [--blocks 1000 2000] [--runs 3]

Each block is Transpose(NCHW->NHWC) -> Add(3) -> Relu -> Mul(with the Transpose) ->
Transpose(NHWC->NCHW): 5 nodes whose first Transpose has two readers, which
sink-transposes splits, moves and cancels. Prints nodes before -> after and the median
seconds of ``--runs`` runs of the pass alone (``rewriter.rewrite(m, ["sink-transposes"])``,
no verification). The numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def build(blocks: int):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, cur = [], "x"
    for i in range(blocks):
        nodes += [helper.make_node("Transpose", [cur], [f"t{i}"], perm=[0, 2, 3, 1]),
                  helper.make_node("Add", [f"t{i}", "k3"], [f"a{i}"]),
                  helper.make_node("Relu", [f"a{i}"], [f"b{i}"]),
                  helper.make_node("Mul", [f"t{i}", f"b{i}"], [f"c{i}"]),
                  helper.make_node("Transpose", [f"c{i}"], [f"d{i}"], perm=[0, 3, 1, 2])]
        cur = f"d{i}"
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     [1, 4, 8, 8])],
                          [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [1, 4, 8, 8])],
                          [numpy_helper.from_array(np.float32(3.0), "k3")])
    return onnx.helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                                  ir_version=8)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, nargs="+", default=[1000, 2000])
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    import rewriter

    for blocks in a.blocks:
        m = build(blocks)
        times, after = [], None
        for _ in range(a.runs):
            t0 = time.perf_counter()
            out, _ = rewriter.rewrite(m, ["sink-transposes"])
            times.append(time.perf_counter() - t0)
            after = len(out.graph.node)
        print(f"{blocks} blocks: {len(m.graph.node)} -> {after} nodes, "
              f"median {statistics.median(times):.2f} s of {a.runs} "
              f"({', '.join(f'{t:.2f}' for t in times)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
