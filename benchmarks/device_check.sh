#!/usr/bin/env bash
# The device check: one prepared run on one lent GPU (an H200), at most 8 minutes, rerunnable from
# any phase. Never changes the card: every NVML setter raises for the whole run (zeus's included),
# and the card's settings are compared before and after (any difference fails the run loudly).
#
#   benchmarks/device_check.sh OUTDIR [--only P,Q | --from P] [--fake] [--models a,b]
#
# Phases (one JSON each under OUTDIR, written atomically the moment the phase ends, so a kill
# keeps what finished): env power fault pytest workload contention, then summary.json and
# log.txt -- 8 files at most. A phase whose record exists is skipped; --only reruns phases.
# --fake: the dry run on the CPU with a fake NVML card (tests/test_device_check.py runs it).
# Limit: DEVICE_CHECK_LIMIT_S (default 480) seconds, then exit status 124.
# Exit status: 0 every phase ok and settings unchanged; 1 otherwise; 2 bad input / no GPU.
set -u -o pipefail

usage="usage: $0 OUTDIR [--only P,Q | --from P] [--fake] [--models a,b]"
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
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
unset KAREUS_ALLOW_CLOCK_CONTROL
unset ZEUSD_SOCK_PATH ZEUSD_HOST_PORT ZEUSD_TOKEN  # zeus's daemon (a socket or TCP) would set clocks past the NVML guard
export KAREUS_NVML_GUARD=1
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
exec timeout --signal=TERM --kill-after=20 "${DEVICE_CHECK_LIMIT_S:-480}" \
    "$PY" -m benchmarks.device_check.phases --out "$OUT" "$@"
