#!/usr/bin/env bash
# Rehearse the lent-GPU capture HERE, on a CPU: a bare virtual environment holding only what the H200
# image has (torch, triton, numpy, matplotlib) plus the carried wheels, the smoke profile, then the
# import into a throw-away results folder. Exits non-zero if any step fails.
#   scripts/rehearse_capture.sh            # every notebook
#   scripts/rehearse_capture.sh 00 05      # a few
#   STACK=image PYTHON=python3.12 scripts/rehearse_capture.sh
#       on the image's own versions (Python 3.12, torch 2.11.0, Triton 3.6.0, the newest NumPy, as the
#       device tool's KINDS.md lists them): torch from PyPI is then a CUDA build, about 3 GB to download and unpack.
#       The default (STACK=local) takes this machine's torch 2.13.0 from local disk in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="$(mktemp -d /tmp/rehearse-capture.XXXX)"
trap 'rm -rf "$WORK"' EXIT
PYTHON="${PYTHON:-python3}"
case "${STACK:-local}" in
    local) TORCH_PKGS="torch==2.13.0 triton" ;;
    image) TORCH_PKGS="torch==2.11.0 triton==3.6.0" ;;
    *) echo "STACK must be local or image, not '${STACK}'" >&2; exit 2 ;;
esac
PYVER="$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
"$PYTHON" -m venv "$WORK/venv"
# what the H200 image holds (device KINDS.md): torch, triton, numpy, matplotlib and a few common packages
"$WORK/venv/bin/pip" install -q $TORCH_PKGS numpy matplotlib attrs certifi charset-normalizer click idna \
    packaging psutil pygments python-dateutil pyyaml requests tqdm typing-extensions urllib3
PYVER="$PYVER" PY=.venv/bin/python scripts/gpu_wheels.sh
# the device tool's copy: tracked files plus the carried wheels, nothing installed
mkdir "$WORK/tree" && git ls-files -z | xargs -0 cp --parents -t "$WORK/tree" && cp -r .whl "$WORK/tree/"
# the same order as on the GPU: the smoke pass (a CPU needs more than the GPU's 240 s), the goals, the references
(cd "$WORK/tree" && PATH="$WORK/venv/bin:$PATH" OUT="$WORK/out" PROFILE=smoke BUDGET_S="${BUDGET_S:-900}" \
    SMOKE_BUDGET_S="${SMOKE_BUDGET_S:-900}" bash scripts/gpu_capture.sh "$@")
ls "$WORK/out"
test "$(ls "$WORK/out" | wc -l)" -le 8
.venv/bin/python -c "
import sys
from tools.capture import gpu_smoke
doc = gpu_smoke.read_smoke_pack(sys.argv[1])
bad = {nb: o['status'] for nb, o in doc['notebooks'].items() if o['status'] != 'ok'}
print(f\"smoke pass: {len(doc['notebooks']) - len(bad)} of {len(doc['notebooks'])} ok\", bad or '')
sys.exit(1 if bad else 0)" "$WORK/out/smoke.tgz"
.venv/bin/python -m tools.capture.capture import "$WORK"/out/capture-*.tgz --into "$WORK/results"
cat "$WORK"/results/*/README.md
echo "rehearsal passed"
