"""Mixed precision: plans (plan), calibration data (data), ranges (ranges, through
ort_calibration) and the planner (planner). Names shared with the CLI live here, so that
building the argument parser imports nothing heavy."""

METHODS = ("minmax", "percentile", "entropy", "mse")   # calibration methods
WEIGHT_FORMS = ("auto", "axis", "mul")                 # where per-channel weight scales go
