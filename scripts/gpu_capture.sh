#!/usr/bin/env bash
# Run THERE, on a lent GPU (the device tool), from the repository root, with .whl carried
# (scripts/gpu_wheels.sh, run here first). One call captures the whole course:
#   bash scripts/gpu_capture.sh                 # every notebook, full profile, 540 s budget
#   BUDGET_S=300 bash scripts/gpu_capture.sh 06 # a shorter window, or a chosen notebook
# helpers.capture orders the notebooks (no reference first, then the oldest), starts one only if its
# estimate fits what is left, stops one that overruns, and packs each as it finishes, so what
# finished comes back even if the call is cut. $OUT gets: gpu.txt, capture.log, capture-<k>.tgz.
# Back here: python -m helpers.capture import <files_at>/capture-*.tgz  (see results/README.md).
set -uo pipefail
OUT="${OUT:-runs/gpu_capture}"
PROFILE="${PROFILE:-full}"
BUDGET_S="${BUDGET_S:-540}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 MPLBACKEND=Agg
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels failed"; exit 1; }
    export PATH="/tmp/site/bin:$PATH"
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"  # helpers/ without an install
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1;
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } \
  > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
python3 -c "import papermill, ipykernel" 2>/dev/null || { echo "no papermill/ipykernel here: carry .whl (scripts/gpu_wheels.sh)"; exit 1; }
python3 -m helpers.capture run --out "$OUT" --budget-s "$BUDGET_S" --profile "$PROFILE" "$@" 2>&1 | tee "$OUT/capture.log"
status=${PIPESTATUS[0]}
ls -la "$OUT"
exit "$status"
