#!/usr/bin/env bash
# Install the suite on an offline machine from wheels made by benchmarks/offline_wheels.sh.
#
#   benchmarks/offline_install.sh WHEEL_DIR
#
# Into the current python3's environment (the one holding PyTorch), from WHEEL_DIR only
# (--no-index): pip keeps every package the environment already satisfies and installs the
# rest, then installs this checkout in editable mode. zeus goes in with --no-deps (its amdsmi
# requirement is for AMD GPUs; see offline_wheels.sh).
# If that environment's site-packages is not writable, or KAREUS_SITE is set, everything goes to
# a target folder instead, ${KAREUS_SITE:-/tmp/kareus-site}: only the distributions the environment lacks (so
# nothing shadows its own packages), and the caller must `export PYTHONPATH=<that folder>`.
# Exit status non-zero, with pip's message, if something is missing.
set -eu -o pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 WHEEL_DIR (a folder made by benchmarks/offline_wheels.sh)" >&2
    exit 2
fi
WHEELS="$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."

pip_install() {
    python3 -m pip install -q --no-index --find-links "$WHEELS" --no-cache-dir \
        --disable-pip-version-check "$@"
}

if [ -z "${KAREUS_SITE:-}" ] && python3 -c "import os, sys, sysconfig; sys.exit(not os.access(sysconfig.get_paths()['purelib'], os.W_OK))"; then
    zeus_wheel=$(ls "$WHEELS"/zeus-*.whl)
    # zeus's requirements other than amdsmi (read from the wheel), so the resolver checks them.
    zeus_reqs=$(python3 - "$zeus_wheel" <<'PY'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    msg = Parser().parsestr(z.read(meta).decode())
for req in msg.get_all("Requires-Dist") or []:
    if "extra ==" not in req and not req.lower().startswith("amdsmi"):
        print(req.split(";")[0].strip())
PY
)
    # shellcheck disable=SC2086
    pip_install $zeus_reqs
    pip_install --no-deps "$zeus_wheel"
    pip_install -e .
    python3 -c "import kareus, zeus.device, pymoo, lowtime; print('kareus suite installed (offline) under', kareus.__path__[0])"
else
    SITE="${KAREUS_SITE:-/tmp/kareus-site}"
    mkdir -p "$SITE"
    # The wheels whose distribution this environment lacks (names normalised as in PEP 503).
    missing=$(python3 - "$WHEELS" <<'PY'
import re, sys
from importlib import metadata
from pathlib import Path
have = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower() for d in metadata.distributions()}
for whl in sorted(Path(sys.argv[1]).glob("*.whl")):
    name = re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
    if name not in have and name not in ("setuptools", "wheel"):
        print(whl)
PY
)
    # shellcheck disable=SC2086
    [ -z "$missing" ] || pip_install --no-deps --target "$SITE" $missing
    pip_install --no-deps --target "$SITE" .
    PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" python3 -c "import kareus, zeus.device, pymoo, lowtime, workloads, baselines; print('kareus suite installed (offline) in $SITE')"
    echo "installed into $SITE (not the environment's site-packages); export PYTHONPATH=$SITE"
fi
