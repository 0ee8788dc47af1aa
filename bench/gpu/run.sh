#!/usr/bin/env bash
# The GPU check, one command on a lent GPU machine (bare, offline: CPython 3.12 with torch 2.11, transformers 5.17,
# numpy, pandas, pyarrow, scikit-learn, cupy, numba), from the repository root, with bench/gpu/wheels carried
# (prepared here by `python -m bench.gpu.prepare`):
#
#     bash bench/gpu/run.sh                  # figures -> $OUT/gpu_check.json (OUT: the device tool's output folder)
#     bash bench/gpu/run.sh --install-only   # only the install step
#     bash bench/gpu/run.sh --device cpu --size extract_reps=1 ...   # options after it go to bench.gpu.check
#
# It installs the carried wheels into the image's Python with pip, offline (pip keeps the image's copy of whatever
# already satisfies a requirement; without a usable pip it unpacks the wheels onto PYTHONPATH instead), puts the
# working tree on PYTHONPATH (attnclust is not installed), then runs `python -m bench.gpu.check`: the extract and
# featurize figures on the GPU, no clustering (cuML is not in the image). Everything, install included, stops
# within BUDGET_S seconds (default 450, under 8 minutes); the JSON keeps whatever was measured by then and is
# printed at the end. Exit status: the check's (0 complete, 1 partial, 2 no CUDA device, 130 cut short).
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$SECONDS
BUDGET_S=${BUDGET_S:-450}
WHEELS=bench/gpu/wheels
OUT_DIR=${OUT:-/tmp/attnclust-gpu-check}
JSON="$OUT_DIR/gpu_check.json"
PY=${PYTHON:-$(command -v python3 || command -v python)}
mkdir -p "$OUT_DIR"

if [ ! -d "$WHEELS" ]; then
    echo "no $WHEELS: run 'python -m bench.gpu.prepare' where the registries are reachable and carry bench/gpu/wheels" >&2
    exit 2
fi
echo "# $("$PY" -c 'import sys; print("python", sys.version.split()[0], sys.executable)')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# bench/gpu/requirements.txt as pip lines: those installed with their dependencies, and those marked no-deps
reqs=$(mktemp) && nodeps=$(mktemp)
"$PY" -m bench.gpu.manifest deps > "$reqs" && "$PY" -m bench.gpu.manifest no-deps > "$nodeps" || exit 1

export PIP_NO_INDEX=1 PIP_FIND_LINKS="$PWD/$WHEELS" PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_PROGRESS_BAR=off
if "$PY" -m pip install --quiet -r "$reqs" && "$PY" -m pip install --quiet --no-deps -r "$nodeps"; then
    echo "# carried wheels installed with pip ($((SECONDS - start)) s)"
else
    site=$(mktemp -d)/site
    echo "# pip could not install the carried wheels: unpacking every one of them onto PYTHONPATH ($site)"
    for w in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$w" "$site" || exit 1; done
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false
if [ "${1:-}" = "--install-only" ]; then
    exit 0
fi

left=$((BUDGET_S - (SECONDS - start)))
rc=0
timeout --signal=INT --kill-after=15 "$left" "$PY" -m bench.gpu.check --device cuda --out "$JSON" \
    --model-files "$WHEELS/minilm_shape" --budget-s $((left - 20)) "$@" || rc=$?
echo "# exit status $rc after $((SECONDS - start)) s; $JSON:"
cat "$JSON" 2>/dev/null || echo "(not written)"
exit $rc
