#!/usr/bin/env bash
# Rehearse the lent-GPU capture HERE, on a CPU: a bare virtual environment holding only what the H200
# image has (torch, triton, numpy, matplotlib) plus the carried wheels, the smoke profile, then the
# import into a throw-away results folder. Exits non-zero if any step fails.
#   scripts/rehearse_capture.sh            # every notebook
#   scripts/rehearse_capture.sh 00 05      # a few
set -euo pipefail
cd "$(dirname "$0")/.."
WORK="$(mktemp -d /tmp/rehearse-capture.XXXX)"
trap 'rm -rf "$WORK"' EXIT
PYVER="$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
python3 -m venv "$WORK/venv"
# what the H200 image holds (device KINDS.md): torch, triton, numpy, matplotlib and a few common packages
"$WORK/venv/bin/pip" install -q torch==2.13.0 triton numpy matplotlib attrs certifi charset-normalizer click idna \
    packaging psutil pygments python-dateutil pyyaml requests tqdm typing-extensions urllib3
PYVER="$PYVER" PY=.venv/bin/python scripts/gpu_wheels.sh
# the device tool's copy: tracked files plus the carried wheels, nothing installed
mkdir "$WORK/tree" && git ls-files -z | xargs -0 cp --parents -t "$WORK/tree" && cp -r .whl "$WORK/tree/"
(cd "$WORK/tree" && PATH="$WORK/venv/bin:$PATH" OUT="$WORK/out" PROFILE=smoke BUDGET_S="${BUDGET_S:-900}" \
    bash scripts/gpu_capture.sh "$@")
ls "$WORK/out"
test "$(ls "$WORK/out" | wc -l)" -le 8
.venv/bin/python -m helpers.capture import "$WORK"/out/capture-*.tgz --into "$WORK/results"
cat "$WORK"/results/*/README.md
echo "rehearsal passed"
