#!/usr/bin/env bash
# Run HERE (a machine with PyPI) before a lent-GPU call: fetch, into .whl/, the wheels the course's
# notebook runner needs but the lent H200's image lacks (papermill, a Jupyter kernel, ipywidgets and
# their dependencies, bitsandbytes and torchao), for that image's Python. The device call then names .whl in `carry`, and
# scripts/gpu_capture.sh installs them there. See results/README.md.
#   scripts/gpu_wheels.sh            # for Python 3.12 (the H200 image's)
#   PYVER=3.11 scripts/gpu_wheels.sh # for another Python (e.g. to rehearse on this machine)
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${PYVER:-3.12}"
PY="${PY:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}"
# already on the H200 image ("Python packages already there" in the device tool's KINDS.md):
# carrying a second copy of these would only shadow the image's own
PRESENT="attrs certifi charset-normalizer click idna packaging psutil pygments python-dateutil pyyaml requests tqdm
typing-extensions urllib3"
# optional for a headless kernel (ipykernel and IPython import them only when present), and 10 MB that
# bitsandbytes needs under the 64 MiB carry limit
SKIP="debugpy jedi"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir .whl
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_12_x86_64 manylinux2010_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
"$PY" -m pip download --quiet --only-binary=:all: --python-version "$PYVER" --implementation cp "${plat[@]}" \
    -d .whl papermill ipykernel ipywidgets matplotlib-inline nbformat
# the libraries notebooks 07 and 08 check themselves against (torch, numpy and packaging, their only
# requirements, are on the image): bitsandbytes ~43 MB, torchao ~3 MB
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp "${plat[@]}" \
    -d .whl "bitsandbytes>=0.50" "torchao==0.18.0"
for whl in .whl/*.whl; do
    name=$(basename "$whl" | cut -d- -f1 | tr 'A-Z_' 'a-z-')
    if printf '%s\n' $PRESENT $SKIP | grep -qx "$name"; then rm "$whl"; fi
done
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1), in .whl/ for Python $PYVER"
# the device tool carries at most 64 MiB in all
if [ "$(du -sm .whl | cut -f1)" -ge 62 ]; then echo "WARNING: .whl/ is over 62 MiB: too large to carry" >&2; fi
