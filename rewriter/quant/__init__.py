"""Mixed precision: plans (plan), calibration data (data), ranges (ranges, through
ort_calibration) and the planner (planner). Names shared with the CLI live here, so that
building the argument parser imports nothing heavy."""

METHODS = ("minmax", "percentile", "entropy", "mse")   # calibration methods
# Histogram bins at most: num_bins x 8 bytes per tensor of a chunk (64 tensors: 0.5 GiB at
# this cap), and entropy's search is quadratic in them; a plan's `num_bins: 1e12` was taken,
# asking for 8 TB of counts.
MAX_BINS = 1 << 20
WEIGHT_FORMS = ("auto", "axis", "mul")                 # where per-channel weight scales go
