#!/usr/bin/env bash
# Install the suite on an offline machine from wheels made by benchmarks/offline_wheels.sh.
#
#   benchmarks/offline_install.sh WHEEL_DIR
#
# Installs into the current python3's environment (the one holding PyTorch), from WHEEL_DIR
# only (--no-index): pip keeps every package the environment already satisfies and installs the
# rest, then installs this checkout in editable mode. zeus goes in with --no-deps (its amdsmi
# requirement is for AMD GPUs; see offline_wheels.sh). Exit status non-zero, with pip's message,
# if something is missing.
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
zeus_wheel=$(ls "$WHEELS"/zeus-*.whl)
# zeus's requirements other than amdsmi (read from the wheel), so the resolver still checks them.
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
