#!/usr/bin/env bash
# Run THERE, on a lent GPU (the device tool), from the repository root, with .whl carried
# (scripts/gpu_wheels.sh, run here first). One call, in this order:
#   0. the smoke pass: every notebook at smoke sizes on the GPU, 4 at a time (SMOKE_BUDGET_S, default 240;
#      0 skips it): tools.capture.gpu_smoke writes $OUT/smoke.tgz (gpu-smoke.json, failed notebooks' copies);
#   1. the performance goals (GOALS_BUDGET_S, default: what the smoke pass left of BUDGET_S, ~300 s; 0 skips
#      them): tools.capture.goals, $OUT/goals.json;
#   2. full-profile references with what is left of BUDGET_S (default 540): tools.capture.capture orders the
#      notebooks (no reference first, then the oldest), starts one only if its estimate fits, stops one
#      that overruns, and packs each as it finishes into $OUT/capture-<k>.tgz.
# With 15 minutes of device time, two calls (results/README.md):
#   bash scripts/gpu_capture.sh                                   # call 1: smoke pass + goals (540 s)
#   SMOKE_BUDGET_S=0 GOALS_BUDGET_S=0 BUDGET_S=260 bash scripts/gpu_capture.sh   # call 2: references
# $OUT gets: gpu.txt, capture.log, smoke.tgz, goals.json, capture-<k>.tgz (at most 8 files).
# Back here: python -m tools.capture.gpu_smoke import <files_at>/smoke.tgz
#            python -m tools.capture.capture import <files_at>/capture-*.tgz  (see results/README.md).
set -uo pipefail
OUT="${OUT:-runs/gpu_capture}"
PROFILE="${PROFILE:-full}"
BUDGET_S="${BUDGET_S:-540}"
GOALS_BUDGET_S="${GOALS_BUDGET_S:-rest}"  # rest: BUDGET_S less what the smoke pass took
SMOKE_BUDGET_S="${SMOKE_BUDGET_S:-240}"
# every budget is a whole number of seconds (GOALS_BUDGET_S may also be "rest"): anything else is one line, exit 2
for name in BUDGET_S SMOKE_BUDGET_S GOALS_BUDGET_S; do
    value="${!name}"
    [ "$name" = GOALS_BUDGET_S ] && [ "$value" = rest ] && continue
    [[ "$value" =~ ^[0-9]+$ ]] || { echo "gpu_capture.sh: $name=$value must be a whole number of seconds" >&2; exit 2; }
done
START_S=$(date +%s)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 MPLBACKEND=Agg
# one cache for the whole capture, outside $OUT (only the listed files come back): the trained models the goals
# and the notebooks load (helpers.gpt.pretrained), Inductor's compiled graphs and Triton's kernels, so that a
# graph or model one step made is not made again by the next (while the machine stays warm between calls too)
export COURSE_CACHE_DIR="${COURSE_CACHE_DIR:-${TMPDIR:-/tmp}/course-cache}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$COURSE_CACHE_DIR/inductor}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$COURSE_CACHE_DIR/triton}"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "installing the carried wheels failed"; exit 1; }
    export PATH="/tmp/site/bin:$PATH"
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"  # helpers/ and tools/ without an install
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1;
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } \
  > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
status=0
: > "$OUT/capture.log"
if [ "$SMOKE_BUDGET_S" -gt 0 ]; then  # step 0: does every notebook run on this GPU at all?
    if python3 -c "import papermill, ipykernel" 2>/dev/null; then
        python3 -m tools.capture.gpu_smoke run --out "$OUT" --budget-s "$SMOKE_BUDGET_S" --jobs "${SMOKE_JOBS:-4}" \
            2>&1 | tee -a "$OUT/capture.log"
        smoke_status=${PIPESTATUS[0]}
        [ "$smoke_status" -ne 0 ] && status=$smoke_status
    else
        echo "no papermill/ipykernel here: carry .whl (scripts/gpu_wheels.sh); smoke pass not run" | tee -a "$OUT/capture.log"
        status=1
    fi
fi
if [ "$GOALS_BUDGET_S" = rest ]; then
    GOALS_BUDGET_S=$(( BUDGET_S - ($(date +%s) - START_S) ))
    [ "$GOALS_BUDGET_S" -lt 0 ] && GOALS_BUDGET_S=0
fi
if [ "$GOALS_BUDGET_S" -gt 30 ]; then  # then the goals: one goals.json, rewritten after each goal
    python3 -m tools.capture.goals run --out "$OUT" --cache-dir "$COURSE_CACHE_DIR" --budget-s "$GOALS_BUDGET_S" \
        --profile "$PROFILE" 2>&1 | tee -a "$OUT/capture.log"
    goals_status=${PIPESTATUS[0]}
    [ "$goals_status" -ne 0 ] && status=$goals_status
fi
LEFT_S=$(( BUDGET_S - ($(date +%s) - START_S) ))
if ! python3 -c "import papermill, ipykernel" 2>/dev/null; then
    echo "no papermill/ipykernel here: carry .whl (scripts/gpu_wheels.sh); notebooks not captured" | tee -a "$OUT/capture.log"
    status=1
elif [ "$LEFT_S" -gt 30 ]; then  # the notebooks with what is left (capture keeps 25 s of it for packing)
    python3 -m tools.capture.capture run --out "$OUT" --budget-s "$LEFT_S" --profile "$PROFILE" "$@" 2>&1 | tee -a "$OUT/capture.log"
    nb_status=${PIPESTATUS[0]}
    [ "$nb_status" -ne 0 ] && status=$nb_status
else
    echo "no time left for notebooks: ${LEFT_S} s of BUDGET_S=${BUDGET_S} after the goals" | tee -a "$OUT/capture.log"
fi
ls -la "$OUT"
exit "$status"
