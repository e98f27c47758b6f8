#!/usr/bin/env bash
# Run THERE, on a lent GPU (the device tool), from the repository root, with .whl carried
# (scripts/gpu_wheels.sh, run here first). One call measures the course's GPU performance goals
# (helpers.course.goals, keyed by notebook: 07.scaled_mm, ...), then captures the notebooks with what is
# left of the budget:
#   bash scripts/gpu_capture.sh                 # goals (360 s), then every notebook, 540 s in all
#   BUDGET_S=300 bash scripts/gpu_capture.sh 06 # a shorter window, or a chosen notebook
#   GOALS_BUDGET_S=0 bash scripts/gpu_capture.sh  # notebooks only
# helpers.course.goals runs first (GOALS_BUDGET_S, default 360; 0 skips it) and writes $OUT/goals.json.
# helpers.course.capture orders the notebooks (no reference first, then the oldest), starts one only if its
# estimate fits what is left, stops one that overruns, and packs each as it finishes, so what
# finished comes back even if the call is cut. $OUT gets: gpu.txt, capture.log, goals.json, capture-<k>.tgz.
# Back here: python -m helpers.course.capture import <files_at>/capture-*.tgz  (see results/README.md).
set -uo pipefail
OUT="${OUT:-runs/gpu_capture}"
PROFILE="${PROFILE:-full}"
BUDGET_S="${BUDGET_S:-540}"
GOALS_BUDGET_S="${GOALS_BUDGET_S:-360}"
START_S=$(date +%s)
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
status=0
if [ "${GOALS_BUDGET_S%.*}" -gt 0 ]; then  # the goals first: one goals.json, rewritten after each goal
    python3 -m helpers.course.goals run --out "$OUT" --cache-dir "${TMPDIR:-/tmp}/goals-cache" --budget-s "$GOALS_BUDGET_S" \
        --profile "$PROFILE" 2>&1 | tee "$OUT/capture.log"
    status=${PIPESTATUS[0]}
fi
LEFT_S=$(( ${BUDGET_S%.*} - ($(date +%s) - START_S) ))
if ! python3 -c "import papermill, ipykernel" 2>/dev/null; then
    echo "no papermill/ipykernel here: carry .whl (scripts/gpu_wheels.sh); notebooks not captured" | tee -a "$OUT/capture.log"
    status=1
elif [ "$LEFT_S" -gt 30 ]; then  # the notebooks with what is left (capture keeps 25 s of it for packing)
    python3 -m helpers.course.capture run --out "$OUT" --budget-s "$LEFT_S" --profile "$PROFILE" "$@" 2>&1 | tee -a "$OUT/capture.log"
    nb_status=${PIPESTATUS[0]}
    [ "$nb_status" -ne 0 ] && status=$nb_status
else
    echo "no time left for notebooks: ${LEFT_S} s of BUDGET_S=${BUDGET_S} after the goals" | tee -a "$OUT/capture.log"
fi
ls -la "$OUT"
exit "$status"
