"""scan-states: a Scan's initial states and its body's next states written by a Reshape to
their own shape, so that MIGraphX parses and compiles it; exact (a Reshape to the same
shape moves no value).

MIGraphX's Scan parser compares each initial state's shape with the body's state input
*including strides* (src/onnx/parse_scan.cpp:103-107 at f729a52; 2.15 alike). A state
computed by an op that MIGraphX writes as a view (a Slice, Split, Transpose or Expand,
and any elementwise op or Identity after one) has the lengths of the body's input but
other strides, and the whole model is refused: "Scan: State input 0 shape {float_type,
{1, 240}, {16000, 1}} does not match corresponding body input shape {float_type, {1, 240},
{240, 1}}" (onnx-asr's WeSpeaker front-end: a frame of the waveform as the first state).
MIGraphX parses a Reshape of a view as a copy into standard strides, so::

    Scan(Slice(x), frames)     =>  Scan(Reshape(Slice(x), [1, 240]), frames)

The body's state outputs need the same: a next state that the body slices out of a longer
frame is a view too, and the loop MIGraphX makes of the Scan then fails to compile
("Invalid module main from compilation", 2.16 ref) where it parses::

    body: next = Slice(frame)  =>  next = Reshape(Slice(frame), [1, 240])

Which ops give a view is MIGraphX's business and differs by version, so every state that a
node computes gets the Reshape (on a standard tensor MIGraphX's reshape is free): states
that are graph inputs, constants or a body's own inputs need none, nor one a Reshape
already computes (which makes the pass idempotent; collapse-chains leaves these Reshapes
alone). The shape is a constant where it is static, else the state's own Shape. Opset 8's
Scan (a sequence_lens input first, batched) is skipped. In the default pipeline only when
MIGraphX is the target, and last. onnx-asr's WeSpeaker front-end (a Kaldi fbank as a Scan
over frames): refused by MIGraphX 2.15 and 2.16 before, compiled and equal to onnxruntime
after.

A Loop's states get the same: its initial states follow the trip count and the condition,
its body's next states the condition output. MIGraphX's `loop` op wants every input in
standard strides (op/loop.hpp), and refuses a Loop that starts from a Slice ("loop: Shapes
are not in standard layout"), as it refused chars2vec's two tf2onnx LSTM Loops; with the
Reshapes a Loop from a Slice, and chars2vec, compile on 2.15 and 2.16. A Transpose stays
refused on 2.16: its Reshape to the same shape is kept there as a view. 0-d states are
skipped (no strides to fix; a Reshape to [] is refused by 2.15 and breaks 2.16's parse).
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from rewriter.core.graph import carried_states, iter_graphs, shape_of
from rewriter.core.pass_base import Context, Numerics, Pass, PassResult, Phase


class ScanStates(Pass):
    name = "scan-states"
    phase = Phase.LAYOUT
    numerics = Numerics.EXACT
    summary = ("a Scan's or Loop's computed initial states and its body's next states through "
               "a Reshape to their own shape (MIGraphX refuses states it holds as views)")

    shape_ops = ("Scan", "Loop")

    def run(self, graph: gs.Graph, ctx: Context) -> PassResult:
        res = PassResult()
        for g in iter_graphs(graph):
            for node in list(g.nodes):
                if node.op not in ("Scan", "Loop") or node.domain not in (None, "", "ai.onnx"):
                    continue
                if node.op == "Scan" and (graph.opset or 0) < 9:
                    res.skip("opset-8-scan")
                    continue
                states = carried_states(node)
                if states is None:
                    res.skip(f"malformed-{node.op.lower()}")
                    continue
                body = node.attrs["body"]
                first_in, first_out = (2, 1) if node.op == "Loop" else (0, 0)
                for i in range(len(states[0])):
                    res.outcome(_reshape_state(node, first_in + i, g, ctx.namer),
                                "reshaped-states")
                    res.outcome(_reshape_next(body, first_out + i, ctx.namer),
                                "reshaped-next-states")
        return res


def _reshape_state(node: gs.Node, i: int, g: gs.Graph, namer) -> str | None:
    """The Scan's i-th initial state read through a Reshape to its own shape."""
    x = node.inputs[i]
    if isinstance(x, gs.Constant) or not x.inputs:
        return "state-not-computed"          # a graph input, an initializer or outer value
    if x.inputs[0].op == "Reshape":
        return "state-already-reshaped"
    if x.shape is None:
        return "state-rank-unknown"
    if not len(x.shape):
        return "state-scalar"        # no strides to fix; 2.15 refuses a Reshape to []
    y = gs.Variable(namer(f"{x.name}_standard"), dtype=x.dtype, shape=x.shape)
    g.nodes.append(gs.Node("Reshape", namer(f"{x.name}_Standard"),
                           inputs=[x, shape_of(x, g, namer)], outputs=[y]))
    node.inputs[i] = y
    return None


def _reshape_next(body: gs.Graph, i: int, namer) -> str | None:
    """The body's i-th state output written by a Reshape of what computed it (the output
    keeps its name: it is the body's)."""
    y = body.outputs[i]
    if isinstance(y, gs.Constant) or not y.inputs:
        return "next-state-not-computed"     # a body input passed through, or a constant
    producer = y.inputs[0]
    if producer.op == "Reshape":
        return "next-state-already-reshaped"
    if y.shape is None:
        return "next-state-rank-unknown"
    if not len(y.shape):
        return "next-state-scalar"
    v = gs.Variable(namer(f"{y.name}_view"), dtype=y.dtype, shape=y.shape)
    producer.outputs[producer.outputs.index(y)] = v
    body.nodes.append(gs.Node("Reshape", namer(f"{y.name}_Standard"),
                              inputs=[v, shape_of(v, body, namer)], outputs=[y]))
    return None
