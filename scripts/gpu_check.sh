#!/usr/bin/env bash
# Run THERE, on a lent GPU (the device tool), from the repository root, as one short command:
#   bash scripts/gpu_check.sh          (with .whl carried; see scripts/gpu_wheels.sh)
# 1. helpers.flash_check: the Triton kernels compiled, checked in fp16/bf16/fp32, and timed against
#    SDPA's kernels (issue 5's goal); needs torch and triton only, a few minutes.
# 2. notebooks 00 and 06 with PROFILE=full through the headless runner (papermill from .whl).
# Everything lands in $OUT (at most 8 files come back): gpu.txt, flash_check.log, the two
# flash_check JSON records, run.log and run.tgz (the run folder: executed notebooks, records, report).
# Each step has its own time limit, so a slow notebook cannot eat the first step's results.
set -uo pipefail
OUT="${OUT:-runs/gpu_check}"
PROFILE="${PROFILE:-full}"
NOTEBOOKS="${NOTEBOOKS:-00 06}"
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
  | tee "$OUT/gpu.txt"
timeout "${CHECK_SECONDS:-300}" python3 -m helpers.flash_check --out "$OUT" 2>&1 | tee "$OUT/flash_check.log"
echo "flash_check exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/flash_check.log"
python3 -c "import papermill, ipykernel" 2>/dev/null || { echo "no papermill/ipykernel here: carry .whl (scripts/gpu_wheels.sh); notebooks not run"; exit 0; }
rm -rf runs/gpu_run
timeout "${NOTEBOOK_SECONDS:-420}" python3 -m helpers.run $NOTEBOOKS --profile "$PROFILE" --out runs/gpu_run --timeout 400 \
    2>&1 | tee "$OUT/run.log"
echo "runner exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
tar -czf "$OUT/run.tgz" -C runs gpu_run 2>/dev/null && ls -la "$OUT"
