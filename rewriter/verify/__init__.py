"""Verification: feeds, metrics (one module), and the verifier that runs the original once."""

from rewriter.verify.feeds import (load_inputs, make_feeds, parse_shape_args,
                                   parse_value_args, real_inputs)
from rewriter.verify.metrics import OutputMetrics, compare, judge
from rewriter.verify.verifier import Verifier, layer_divergence

__all__ = ["OutputMetrics", "Verifier", "compare", "judge", "layer_divergence", "load_inputs",
           "make_feeds", "parse_shape_args", "parse_value_args", "real_inputs"]
