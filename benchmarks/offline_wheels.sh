#!/usr/bin/env bash
# Download the wheels the suite needs on an offline GPU machine that already has PyTorch.
#
#   benchmarks/offline_wheels.sh DEST [PYTHON_VERSION]        (default PYTHON_VERSION: 3.12)
#
# Run it where PyPI is reachable; carry DEST to the GPU machine and install there with
# `benchmarks/offline_install.sh DEST`. CUDA images with PyTorch already hold the scientific stack
# (numpy, scipy, pandas, matplotlib, scikit-learn and their compiled parts: about 90 MB of wheels),
# so those are left out and the rest of the closure of pymoo, lowtime and zeus travels (about
# 17 MB for CPython 3.12 on x86-64). offline_install.sh resolves against what the machine has, so
# a missing package shows up there as a pip resolution error naming it.
# `amdsmi` (a zeus requirement for AMD GPUs) is left out: on NVIDIA machines zeus uses NVML, and
# importing amdsmi without AMD's library raises KeyError, which breaks other packages (ray).
set -eu -o pipefail

usage="usage: $0 DEST [PYTHON_VERSION]"
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    echo "$usage"
    exit 0
fi
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
    echo "$usage" >&2
    exit 2
fi
DEST="$1"
PYVER="${2:-3.12}"
cd "$(dirname "$0")/.."
mkdir -p "$DEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64; do
    platforms+=(--platform "$p")
done

# The requirement lines come from pyproject.toml (core + gpu extra), minus torch.
reqs=$(python3 - <<'PY'
import tomllib
meta = tomllib.load(open("pyproject.toml", "rb"))["project"]
for r in meta["dependencies"] + meta["optional-dependencies"]["gpu"]:
    if not r.startswith("torch"):
        print(r)
PY
)
# shellcheck disable=SC2086
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${platforms[@]}" -d "$tmp" $reqs "setuptools>=68" wheel

skip='^(numpy|scipy|pandas|matplotlib|scikit_learn|pillow|fonttools|contourpy|kiwisolver|amdsmi)-'
n=0
for f in "$tmp"/*.whl; do
    name=$(basename "$f")
    if ! [[ "$name" =~ $skip ]]; then
        cp "$f" "$DEST/"
        n=$((n + 1))
    fi
done
echo "$n wheels for CPython $PYVER in $DEST ($(du -sh "$DEST" | cut -f1))"
