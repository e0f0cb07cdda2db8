#!/usr/bin/env bash
# The GPU check of issue 11 in one command: set-up, `dstk doctor --calibrate` (GEMM sweep, HBM
# bandwidth, layer and step floors; one GPU, so no all-reduce figure), then a ~1B Llama under
# DeepSpeed ZeRO 0/3 with and without recompute (benchmarks/estimate_gpu.py), predicted with the
# catalog's figures and with the calibrated profile next to the measured memory and step time; then
# causal attention forward + backward by SDPA backend and sequence length next to the catalog's
# attention curves (benchmarks/attention_gpu.py).
#
#   here, once (downloads the wheels the device image lacks into build/gpu-wheels, ~5 MB):
#       bash benchmarks/gpu_check.sh --prepare
#   on the device (the lead's call; expected 3-5 minutes on an H200, not run yet; at most 9.5 with
#   every stage at its timeout, 90 + 150 + 210 + 90 + 30 s):
#       run(command="bash benchmarks/gpu_check.sh", carry=["build/gpu-wheels"], timeout_s=600)
#   here, the same stages on CPU ranks (gloo) with a tiny Llama (tests/test_gpu_check.py):
#       bash benchmarks/gpu_check.sh --cpu-smoke [--out DIR]
#
# What the device has (/work/.library/device/KINDS.md, H200.md): python3 3.12 with torch (CUDA),
# transformers, pyyaml, rich, setuptools; no DeepSpeed, pydantic or hjson, and no registry. So the
# set-up installs the carried wheels (DeepSpeed 0.19.8 and what it needs that the image lacks) and
# the repo into one --target directory put first on PYTHONPATH over the image's python. (A venv
# made from the image's python, itself a venv, would not see the image's torch.) If the wheels
# are not there and DeepSpeed is missing, the set-up stage says so and the run stops.
#
# Each stage runs under its own `timeout` (env GPU_CHECK_<STAGE>_S overrides), and its time and
# exit status are printed and kept. Everything printed goes to $OUT/gpu_check.log; the figures to
# $OUT/gpu_check.json (stages, set-up, calibration, cases), $OUT/hardware.yaml (the profile),
# $OUT/calibrate.json (doctor's report) and $OUT/estimate_gpu.json (every case's figures).
# Exit status: 0 when every stage passed.
set -u -o pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
ROOT="$(cd "$(dirname "$SELF")/.." && pwd)"
WHEELS="${GPU_CHECK_WHEELS:-$ROOT/build/gpu-wheels}"

usage() {
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$SELF"
    echo "options: --prepare | --cpu-smoke | --out DIR | --python PY | -h"
}

# --- the set-up stage (run by the main script under its timeout) ------------------------------
if [ "${1:-}" = "--stage-setup" ]; then
    set -e
    echo "machine: $(uname -m), $(nproc) cores; python: $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader || true
    fi
    missing="$("$PY" -c 'import importlib.util as u; print(" ".join(m for m in ("torch", "transformers", "yaml", "rich", "setuptools", "deepspeed", "pydantic", "hjson") if u.find_spec(m) is None))')"
    echo "missing from this python: ${missing:-nothing}"
    for need in torch transformers yaml rich setuptools; do
        case " $missing " in *" $need "*)
            echo "set-up: this python has no $need, and it is not among the carried wheels (the image should hold it)"
            exit 3;;
        esac
    done
    installed_wheels=""
    if [ -n "$missing" ]; then
        shopt -s nullglob
        wheels=("$WHEELS"/*.whl)
        if [ ${#wheels[@]} -eq 0 ]; then
            echo "set-up: $missing missing and no wheels in $WHEELS"
            echo "  fix: run 'bash benchmarks/gpu_check.sh --prepare' on the development machine and carry build/gpu-wheels"
            exit 3
        fi
        echo "installing ${#wheels[@]} carried wheel(s) into $SITE: $(cd "$WHEELS" && ls *.whl | tr '\n' ' ')"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
        installed_wheels="$(cd "$WHEELS" && ls *.whl | tr '\n' ' ')"
    fi
    # The repo, from a clean copy of what pyproject.toml packages (no build/ or egg-info in the tree).
    rm -rf "$WORK/src" && mkdir -p "$WORK/src"
    (cd "$ROOT" && tar --exclude=__pycache__ -cf - pyproject.toml README.md toolkit models templates) | tar -xf - -C "$WORK/src"
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
        --target "$SITE" "$WORK/src"
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    INSTALLED_WHEELS="$installed_wheels" MISSING="$missing" "$PY" - "$WORK/setup.json" <<'EOF'
import json, os, sys
import torch, transformers, deepspeed, dstk
from deepspeed.accelerator import get_accelerator
cuda = torch.cuda.is_available()
info = {"python": sys.version.split()[0], "executable": sys.executable, "torch": torch.__version__,
        "cuda": torch.version.cuda, "device_name": torch.cuda.get_device_name(0) if cuda else None,
        "accelerator": get_accelerator().device_name(), "deepspeed": deepspeed.__version__,
        "transformers": transformers.__version__, "dstk": os.path.dirname(dstk.__file__),
        "missing_from_image": os.environ["MISSING"].split(), "installed_wheels": os.environ["INSTALLED_WHEELS"].split()}
print("set-up: " + ", ".join(f"{k} {v}" for k, v in info.items()))
json.dump(info, open(sys.argv[1], "w"), indent=2)
if os.environ["MODE"] == "gpu" and info["accelerator"] != "cuda":
    sys.exit("set-up: no CUDA GPU for DeepSpeed here (accelerator %r): run with --cpu-smoke on a CPU machine"
             % info["accelerator"])
EOF
    exit 0
fi

MODE=gpu
OUT_DIR="${OUT:-}"
PY="${DSTK_PYTHON:-}"
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) MODE=prepare;;
        --cpu-smoke) MODE=smoke;;
        --out) OUT_DIR="$2"; shift;;
        --python) PY="$2"; shift;;
        -h|--help) usage; exit 0;;
        *) echo "gpu_check.sh: unknown argument $1" >&2; usage >&2; exit 2;;
    esac
    shift
done

# --- here, before the device call: the wheels the device image lacks ---------------------------
if [ "$MODE" = prepare ]; then
    set -e
    PY="${PY:-$ROOT/.venv/bin/python}"
    mkdir -p "$WHEELS"
    rm -f "$WHEELS"/*.whl
    # The versions this repo is tested with (the dev venv's), for the device's CPython 3.12 on x86-64.
    read -r -a pins <<<"$("$PY" -c 'import importlib.metadata as m; print(" ".join(f"{n}=={m.version(n)}" for n in ("pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions", "hjson")))')"
    ds="deepspeed==$("$PY" -c 'import importlib.metadata as m; print(m.version("deepspeed"))')"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "${pins[@]}"
    # DeepSpeed publishes a source distribution only: a pure-Python wheel (ops build just in time).
    "$PY" -m pip wheel -q --no-deps -w "$WHEELS" "$ds"
    ls -l "$WHEELS"
    echo "total $(du -sh "$WHEELS" | cut -f1); carry build/gpu-wheels in the device call:"
    echo '  run(command="bash benchmarks/gpu_check.sh", carry=["build/gpu-wheels"], timeout_s=600)'
    exit 0
fi

if [ "$MODE" = smoke ]; then
    PY="${PY:-$ROOT/.venv/bin/python}"
    OUT_DIR="${OUT_DIR:-$(mktemp -d /tmp/gpu-check-XXXXXX)}"
    T_SETUP="${GPU_CHECK_SETUP_S:-120}" T_CAL="${GPU_CHECK_CALIBRATE_S:-240}" T_EST="${GPU_CHECK_ESTIMATE_S:-180}"
    CAL_ARGS=(--quick --gpu cpu)
    EST_ARGS=(--cpu-smoke)
    ATT_ARGS=(--cpu-smoke)
    T_ATT="${GPU_CHECK_ATTENTION_S:-60}"
else
    PY="${PY:-python3}"
    OUT_DIR="${OUT_DIR:-$ROOT/out/gpu-check}"
    T_SETUP="${GPU_CHECK_SETUP_S:-90}" T_CAL="${GPU_CHECK_CALIBRATE_S:-150}" T_EST="${GPU_CHECK_ESTIMATE_S:-210}"
    CAL_ARGS=(${GPU_CHECK_GPU:+--gpu "$GPU_CHECK_GPU"})
    EST_ARGS=(${GPU_CHECK_GPU:+--gpu "$GPU_CHECK_GPU"})
    ATT_ARGS=(${GPU_CHECK_GPU:+--gpu "$GPU_CHECK_GPU"})
    T_ATT="${GPU_CHECK_ATTENTION_S:-90}"
fi
T_SUMMARY="${GPU_CHECK_SUMMARY_S:-30}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
WORK="$(mktemp -d /tmp/gpu-check-work-XXXXXX)"
# The installed copy and the stage records (gathered into gpu_check.json) go when the script ends.
trap '[ -n "${GPU_CHECK_KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
SITE="$WORK/site"
export PY WORK SITE WHEELS MODE PYTHONUNBUFFERED=1
exec > >(tee "$OUT_DIR/gpu_check.log") 2>&1
echo "gpu_check.sh $MODE: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), output in $OUT_DIR, work in $WORK"

STAGES="$WORK/stages.jsonl"
: >"$STAGES"
# stage NAME LIMIT_S STDOUT_FILE|- CMD...: run CMD under its timeout, print and keep its time and status.
stage() {
    local name="$1" limit="$2" to="$3"
    shift 3
    echo
    echo "=== stage $name (timeout ${limit} s): $*"
    local t0 t1 rc
    t0="$(date +%s.%N)"
    if [ "$to" = - ]; then
        timeout -k 10 "$limit" "$@"
    else
        timeout -k 10 "$limit" "$@" >"$to"
    fi
    rc=$?
    t1="$(date +%s.%N)"
    local seconds
    seconds="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
    local what=ok
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && what="TIMED OUT after ${limit} s"
    [ $rc -ne 0 ] && [ "$what" = ok ] && what="FAILED (exit $rc)"
    echo "=== stage $name: $what, ${seconds} s"
    printf '{"name": "%s", "rc": %d, "seconds": %s, "limit_s": %d}\n' "$name" "$rc" "$seconds" "$limit" >>"$STAGES"
    return $rc
}

status=0
if ! stage setup "$T_SETUP" - bash "$SELF" --stage-setup; then
    echo "set-up failed: nothing else can run"
    status=1
else
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$SITE/bin:$PATH"
    cd "$WORK"  # the ranks' working directory: nothing lands in the repo copy
    if stage calibrate "$T_CAL" "$OUT_DIR/calibrate.json" \
            "$PY" -m dstk doctor --calibrate --num-ranks 1 --output "$OUT_DIR/hardware.yaml" --format json \
            "${CAL_ARGS[@]}"; then
        HW_ARGS=(--hardware "$OUT_DIR/hardware.yaml")
    else
        echo "calibration failed: the cases run with the catalog's figures only (doctor's report: $OUT_DIR/calibrate.json)"
        tail -c 3000 "$OUT_DIR/calibrate.json" 2>/dev/null
        HW_ARGS=()
        status=1
    fi
    [ -f "$OUT_DIR/hardware.yaml" ] && { echo "--- the profile ($OUT_DIR/hardware.yaml):"; cat "$OUT_DIR/hardware.yaml"; }
    stage estimate "$T_EST" - "$PY" "$ROOT/benchmarks/estimate_gpu.py" "${EST_ARGS[@]}" "${HW_ARGS[@]}" \
        --json "$OUT_DIR/estimate_gpu.json" || status=1
    stage attention "$T_ATT" - "$PY" "$ROOT/benchmarks/attention_gpu.py" "${ATT_ARGS[@]}" \
        --json "$OUT_DIR/attention_gpu.jsonl" || status=1
fi
stage summary "$T_SUMMARY" - "$PY" "$ROOT/benchmarks/estimate_gpu.py" --summary "$OUT_DIR" --work "$WORK" \
    --status "$status" || status=1
echo "gpu_check.sh: exit $status; files: $(cd "$OUT_DIR" && ls | tr '\n' ' ')"
exit $status
