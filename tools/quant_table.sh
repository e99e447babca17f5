#!/usr/bin/env bash
# The INT8 technique ladder and the peers, on the four tasks of tools/quant_eval.py
# (64 calibration samples, 300 fresh): the table in docs/benchmarks_quant.md.
#   bash tools/quant_table.sh [N_EVAL] [OUT.json]
set -euo pipefail
cd "$(dirname "$0")/.."
R='"rules": [{"match": {"position": "first_conv"}, "precision": "fp16"}, {"match": {"position": "last_conv"}, "precision": "fp16"}, {"match": {"position": "classifier"}, "precision": "fp16"}, {"match": {"op": ["Conv", "MatMul", "Gemm"]}, "precision": "int8"}]'
OFF='"equalize": false, "bias_correction": false, "rounding": "nearest"'
python tools/quant_eval.py --all --n-eval "${1:-300}" --json "${2:-/tmp/quant_table.json}" \
  --qs MinMax --qs Percentile \
  --plan-json "{\"_name\": \"recipe-minmax\", $R, \"int8\": {\"calibration\": {\"method\": \"minmax\"}, $OFF}}" \
  --plan-json "{\"_name\": \"+equalize\", $R, \"int8\": {\"calibration\": {\"method\": \"minmax\"}, \"equalize\": true, \"bias_correction\": false, \"rounding\": \"nearest\"}}" \
  --plan-json "{\"_name\": \"+mse\", $R, \"int8\": {\"calibration\": {\"method\": \"mse\"}, \"equalize\": true, \"bias_correction\": false, \"rounding\": \"nearest\"}}" \
  --plan-json "{\"_name\": \"+bias-corr\", $R, \"int8\": {\"calibration\": {\"method\": \"mse\"}, \"equalize\": true, \"bias_correction\": true, \"rounding\": \"nearest\"}}" \
  --plan default --plan auto
