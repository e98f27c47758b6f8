#!/usr/bin/env bash
# Run THERE, on a lent GPU (the device tool), from the repository root, with .whl carried
# (see scripts/gpu_wheels.sh):
#   bash scripts/gpu_check.sh check       # 1. helpers.flash_check, torch and Triton only (about 3-4 min)
#   bash scripts/gpu_check.sh notebooks   # 2. notebook 06, PROFILE=full, papermill from .whl (about 6-9 min)
#   bash scripts/gpu_check.sh             # both, one after the other
# One device command may run 10 minutes, so run the two steps as two calls (estimates, not yet
# measured: results/flash_triton_plan.md).
# 1 checks the compiled Triton kernels in fp16/bf16/fp32 and times them against SDPA's kernels
# (issue 5's goal); 2 records the notebooks' full-profile results. Each step has its own time
# limit (CHECK_SECONDS, NOTEBOOK_SECONDS), so what a step finished still comes back. $OUT gets at
# most six files: gpu.txt; flash_check.log and the two flash_check_*.json records (step 1);
# run.log and run.tgz, the run folder with executed notebooks, records and report (step 2).
set -uo pipefail
STEP="${1:-all}"
case "$STEP" in check|notebooks|all) ;; *) echo "usage: $0 [check|notebooks|all]"; exit 2 ;; esac
OUT="${OUT:-runs/gpu_check}"
PROFILE="${PROFILE:-full}"
NOTEBOOKS="${NOTEBOOKS:-06}"  # 06 measures its own ceilings without 00; NOTEBOOKS="00 06" in a longer call
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
if [ "$STEP" != notebooks ]; then
    timeout "${CHECK_SECONDS:-300}" python3 -m helpers.flash_check --out "$OUT" 2>&1 | tee "$OUT/flash_check.log"
    echo "flash_check exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/flash_check.log"
fi
[ "$STEP" = check ] && exit 0
python3 -c "import papermill, ipykernel" 2>/dev/null || { echo "no papermill/ipykernel here: carry .whl (scripts/gpu_wheels.sh)"; exit 1; }
rm -rf runs/gpu_run
timeout "${NOTEBOOK_SECONDS:-540}" python3 -m helpers.run $NOTEBOOKS --profile "$PROFILE" --out runs/gpu_run \
    2>&1 | tee "$OUT/run.log"
echo "runner exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/run.log"
tar -czf "$OUT/run.tgz" -C runs gpu_run && ls -la "$OUT"
