#!/usr/bin/env bash
# GPU check for a shared machine: installs nothing, never changes clocks or power limits (both
# steps run under the NVML guard, kareus.backends.gpu.guarded: every NVML setter raises).
#
#   benchmarks/gpu_check.sh OUTDIR [extra args for python3 -m kareus.backends.gpu.check]
#
# 1. python3 -m pytest -m gpu -q         (the CUDA tests; clocks untouched unless
#                                         KAREUS_ALLOW_CLOCK_CONTROL=1, which this script unsets)
# 2. python3 -m kareus.backends.gpu.check (one GPU: measure the default Megatron-LM plan and a
#                                         nanobatched plan of qwen3-1.7b cut to 4 layers, TP1 PP1,
#                                         MBS 4, seq 2048, 4 microbatches; print the simulator's
#                                         prediction for the same run at the card's current SM
#                                         clock and the error)
# Writes OUTDIR/pytest_gpu.log, OUTDIR/gpu_check.json, OUTDIR/gpu_check.log, OUTDIR/summary.txt.
# Limits: GPU_CHECK_PYTEST_LIMIT_S (default 180) and GPU_CHECK_LIMIT_S (240) seconds; a step
# cut at its limit reports exit status 124.
# Exit status: 0 if both steps pass; 2 if this machine cannot run the check (no CUDA GPU, no
# NVML, a card no preset describes: the one-line message says what is missing); 1 otherwise.
# Expected runtime on one H200: 2-4 minutes.
set -u -o pipefail

usage="usage: $0 OUTDIR [check options]"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    echo "$usage"
    exit 0
fi
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "$usage" >&2
    exit 2
fi
OUT="$1"
shift
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"   # the script works from the repository root
cd "$(dirname "$0")/.."
unset KAREUS_ALLOW_CLOCK_CONTROL
unset ZEUSD_SOCK_PATH ZEUSD_HOST_PORT ZEUSD_TOKEN  # zeus's daemon (a socket or TCP) would set clocks past the NVML guard
export KAREUS_NVML_GUARD=1
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
PY="${PYTHON:-python3}"   # the interpreter that holds the CUDA build of torch
# Each step has a wall-clock limit (s), so a hung NCCL init or kernel cannot eat a GPU lease;
# NCCL explains its own failures in the logs.
PYTEST_LIMIT_S="${GPU_CHECK_PYTEST_LIMIT_S:-180}"
CHECK_LIMIT_S="${GPU_CHECK_LIMIT_S:-240}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"

start=$(date +%s)
echo "== pytest -m gpu" | tee "$OUT/summary.txt"
timeout "$PYTEST_LIMIT_S" "$PY" -m kareus.backends.gpu.guarded pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log"
pytest_rc=${PIPESTATUS[0]}
echo "pytest -m gpu exit status: $pytest_rc" | tee -a "$OUT/summary.txt"

echo "== measured vs simulated (python -m kareus.backends.gpu.check)" | tee -a "$OUT/summary.txt"
timeout "$CHECK_LIMIT_S" "$PY" -m kareus.backends.gpu.guarded kareus.backends.gpu.check --out "$OUT" "$@" 2>&1 | tee -a "$OUT/summary.txt"
check_rc=${PIPESTATUS[0]}
echo "check exit status: $check_rc" | tee -a "$OUT/summary.txt"
echo "elapsed: $(( $(date +%s) - start )) s" | tee -a "$OUT/summary.txt"

if [ "$check_rc" -ne 0 ]; then
    exit "$check_rc"    # 2: no GPU / NVML / preset for this card (the message says what to fix)
fi
if [ "$pytest_rc" -ne 0 ]; then
    exit 1
fi
exit 0
