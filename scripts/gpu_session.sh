#!/usr/bin/env bash
# The commands of a GPU session for issue 16 (docs/gpu_runbook.md says which `run` call runs which part).
#
#   bash scripts/gpu_session.sh [--cpu] PART [PART ...]   PART: check | tests | kernels | step | generate | extra | all
#
# On the GPU machine (the image's python3: torch 2.11.0+cu130, no diffusers) it first installs the wheels carried in
# .whl/ (made here by scripts/gpu_wheels.sh) into /tmp/site, then prints the device, the versions and nvidia-smi to
# $OUT/env.txt, then runs each PART, writing its output to $OUT/<part>.log and one line per command (part, label, exit
# status, seconds, command) to $OUT/summary.tsv. OUT defaults to ./gpu_out.
#
# Each part has a time budget (seconds, SAGE_GPU_BUDGET_<PART> overrides it) and every command runs
# under `timeout`, cut to what is left of its part's budget, so a hang ends the command and not the session; a command
# that fails or times out is recorded and the next one runs. `timeout` first sends SIGINT, so pytest and the scripts
# unwind (tests/procs.py kills its process groups), then SIGKILL 20 s later.
#
# --cpu (or SAGE_GPU_SESSION_DEVICE=cpu) runs the `check` and `tests` parts on the CPU with SAGE_GPU_PYTHON (default
# .venv/bin/python, else python3) and installs nothing: the runner's own test (tests/unit/test_gpu_session.py).
set -u -o pipefail
cd "$(dirname "$0")/.."

DEVICE=${SAGE_GPU_SESSION_DEVICE:-cuda}
if [[ ${1:-} == --cpu ]]; then
    DEVICE=cpu
    shift
fi
if [[ $# -eq 0 ]]; then
    echo "usage: bash scripts/gpu_session.sh [--cpu] PART [PART ...]; PART: check tests kernels step generate extra" \
         "all" >&2
    exit 2
fi
case $DEVICE in
    cuda) PY=${SAGE_GPU_PYTHON:-python3} ;;
    cpu)
        PY=python3
        [[ -x .venv/bin/python ]] && PY=.venv/bin/python
        PY=${SAGE_GPU_PYTHON:-$PY} ;;
    *) echo "error: SAGE_GPU_SESSION_DEVICE=$DEVICE: use cuda or cpu" >&2; exit 2 ;;
esac
PARTS=()
for arg in "$@"; do
    case $arg in
        check | tests | kernels | step | generate | extra) PARTS+=("$arg") ;;
        all) PARTS+=(check tests kernels step generate extra) ;;
        *) echo "error: unknown part '$arg': use check, tests, kernels, step, generate, extra or all" >&2; exit 2 ;;
    esac
done
for PART in "${PARTS[@]}"; do
    if [[ $DEVICE == cpu && $PART != check && $PART != tests ]]; then
        echo "error: part $PART times the real-width model and needs a GPU; on the CPU run check or tests" >&2
        exit 2
    fi
done

OUT=${OUT:-./gpu_out}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.tsv"
FAILED=0

# docs/gpu_runbook.md: `check tests` (300 s), `kernels` (540 s) and `step generate` (530 s) are one run call each;
# `extra` (540 s) is a fourth call when device time is left
declare -A BUDGET=([check]=${SAGE_GPU_BUDGET_CHECK:-60} [tests]=${SAGE_GPU_BUDGET_TESTS:-240}
                   [kernels]=${SAGE_GPU_BUDGET_KERNELS:-540} [step]=${SAGE_GPU_BUDGET_STEP:-300}
                   [generate]=${SAGE_GPU_BUDGET_GENERATE:-230} [extra]=${SAGE_GPU_BUDGET_EXTRA:-540})
# the 8-block real-width checkpoint the step and generate parts share (written once per machine)
DEFAULT_REAL_CKPT=/tmp/sage_gpu_real8
REAL_CKPT=${SAGE_GPU_REAL_CKPT:-$DEFAULT_REAL_CKPT}

install_wheels() {
    if [[ $DEVICE == cpu ]]; then
        echo "cpu: using $PY as it is (no wheels installed)"
        return 0
    fi
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "error: no wheels in .whl/: run 'bash scripts/gpu_wheels.sh' on the CPU machine and name .whl in the" \
             "run call's carry" >&2
        exit 2
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "error: installing .whl/*.whl into /tmp/site failed" >&2; exit 2; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
}

describe() {
    {
        echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ), host $(hostname), $(nproc) CPUs, device $DEVICE, python $PY"
        echo "git $(git rev-parse --short HEAD 2>/dev/null || echo '?')," \
             "$(git status --porcelain 2>/dev/null | wc -l) changed files"
        timeout 60 "$PY" - <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
for name in ("diffusers", "transformers", "peft", "accelerate", "huggingface_hub", "safetensors", "imageio",
             "imageio_ffmpeg", "einops", "numpy"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"), module.__file__)
    except ImportError as err:
        print(name, "MISSING:", err)
EOF
        if command -v nvidia-smi >/dev/null; then nvidia-smi; else echo "nvidia-smi: not found"; fi
    } 2>&1 | tee -a "$OUT/env.txt"
}

# run_cmd LABEL CAP_SECONDS COMMAND...: COMMAND under timeout min(CAP, what is left of the part's budget)
run_cmd() {
    local label=$1 cap=$2
    shift 2
    local left=$((PART_DEADLINE - SECONDS)) start=$SECONDS rc
    local limit=$((cap < left ? cap : left))
    if ((limit < 15)); then
        echo "=== $PART/$label: SKIPPED, ${left}s left of the part's budget" | tee -a "$LOG"
        printf '%s\t%s\t%s\t%s\t%s\n' "$PART" "$label" skipped 0 "$*" >>"$SUMMARY"
        FAILED=$((FAILED + 1))
        return 0
    fi
    echo "=== $PART/$label (timeout ${limit}s): $*" | tee -a "$LOG"
    timeout -s INT -k 20 "$limit" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    local note=""
    ((rc == 124)) && note=" (timed out)"
    echo "=== $PART/$label: exit $rc after $((SECONDS - start))s$note" | tee -a "$LOG"
    printf '%s\t%s\t%s\t%s\t%s\n' "$PART" "$label" "$rc" "$((SECONDS - start))" "$*" >>"$SUMMARY"
    ((rc == 0)) || FAILED=$((FAILED + 1))
}

part_check() {
    run_cmd gpu_check 60 "$PY" scripts/gpu_check.py --device "$DEVICE"
}

part_tests() {
    # issue 16 item 1: the device tier (tests/conftest.py's --device option and `device` marker) on the GPU
    run_cmd device_tier 150 "$PY" -m pytest tests --device "$DEVICE" -m device -q -rfE -p no:cacheprovider
    # the unit tier on this machine's CPU under its torch (2.11 on the image): what CI would see with these versions
    run_cmd unit_tier_cpu 150 env CUDA_VISIBLE_DEVICES= "$PY" -m pytest tests -m unit -q -rfE -p no:cacheprovider
}

TRANSFORMER=(benchmarks/benchmark_transformer.py --geometry real --device cuda --dtype bf16 --repeats 3)

part_kernels() {
    # issue 16 item 2 (docs/benchmarks.md GPU commands 3 and 4): forward + backward of 4 real-width blocks, MFU and
    # each block's saved bytes against the planner, checkpointing off and on; the most telling runs first
    run_cmd transformer_native_sp1 90 "$PY" "${TRANSFORMER[@]}" --blocks 4 --attention_backend native --sp 1
    run_cmd transformer_native_sp2 60 "$PY" "${TRANSFORMER[@]}" --blocks 4 --attention_backend native --sp 2
    run_cmd transformer_cudnn_sp1 60 "$PY" "${TRANSFORMER[@]}" --blocks 4 --attention_backend _native_cudnn --sp 1
    run_cmd transformer_efficient_sp1 60 "$PY" "${TRANSFORMER[@]}" --blocks 4 --attention_backend _native_efficient \
        --sp 1
    run_cmd attention_cfg 60 "$PY" benchmarks/benchmark_attention.py --geometry real --blocks 4 --device cuda \
        --dtype bf16 --repeats 3
    run_cmd transformer_54_ckpt 90 "$PY" "${TRANSFORMER[@]}" --checkpointing on
    # inductor's compile time on a GPU is unknown: last, with what is left of the budget
    run_cmd transformer_compile_sp1 480 "$PY" "${TRANSFORMER[@]}" --blocks 4 --compile both --sp 1
}

real_checkpoint() {
    # docs/benchmarks.md GPU command 5: written once per machine (CPU work, ~90 s), shared by step and generate
    if [[ -f $REAL_CKPT/.written ]]; then
        echo "=== $PART: reusing $REAL_CKPT" | tee -a "$LOG"
        return 0
    fi
    if [[ -e $REAL_CKPT ]]; then  # a write cut short by its timeout: ours to remove only at the default path
        if [[ $REAL_CKPT != "$DEFAULT_REAL_CKPT" ]]; then
            echo "=== $PART: $REAL_CKPT exists but was not written by this script: remove it or set" \
                 "SAGE_GPU_REAL_CKPT to a new folder" | tee -a "$LOG"
            return 0
        fi
        rm -rf "$REAL_CKPT"
    fi
    run_cmd real_checkpoint 150 bash -c '"$0" scripts/make_tiny_checkpoint.py --output "$1" --real_width_blocks 8 \
        --vae real && touch "$1/.written"' "$PY" "$REAL_CKPT"
}

part_step() {
    # issue 16 item 3 (GPU command 6): one GRPO step at real width, 8 blocks, 81x352x624, time and peak per phase
    # against the planner
    real_checkpoint
    run_cmd step_real_8 280 "$PY" benchmarks/benchmark_step.py --geometry real --checkpoint_root "$REAL_CKPT" \
        --device cuda --repeats 2 --warmup 1
}

part_generate() {
    # issue 16 item 4 (GPU command 7): generate.py's variants that share the loaded models
    real_checkpoint
    run_cmd generate_shared 230 "$PY" benchmarks/benchmark_generate.py --geometry real --checkpoint_root "$REAL_CKPT" \
        --device cuda --steps 20 --repeats 1 --warmup 1 --variants baseline,attention,cfg_distilled,vae_tiling
}

part_extra() {
    # when device time is left: the rest of GPU commands 1, 4 and 7-8
    real_checkpoint
    run_cmd generate_moving 200 "$PY" benchmarks/benchmark_generate.py --geometry real --checkpoint_root "$REAL_CKPT" \
        --device cuda --steps 20 --repeats 1 --warmup 1 \
        --variants baseline,offloading,group_offloading,cache_deepcache,cache_taylorcache,step_distill,sparse_attn
    run_cmd transformer_8 80 "$PY" "${TRANSFORMER[@]}" --blocks 8
    run_cmd rollout_real 150 "$PY" benchmarks/benchmark_rollout.py --geometry real --device cuda --dtype bf16 \
        --batch 1 --steps 8 --repeats 1 --warmup 1 --diffusers_joint_attention
    run_cmd transformer_compile_sp2 240 "$PY" "${TRANSFORMER[@]}" --blocks 4 --compile both --sp 2
}

install_wheels
describe
for PART in "${PARTS[@]}"; do
    LOG="$OUT/$PART.log"
    PART_DEADLINE=$((SECONDS + BUDGET[$PART]))
    echo "##### part $PART (budget ${BUDGET[$PART]}s)" | tee -a "$LOG"
    "part_$PART"
done
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv | tee -a "$OUT/env.txt"  # nothing left running?
fi
echo "summary ($SUMMARY): $FAILED command(s) failed or skipped"
column -t -s $'\t' "$SUMMARY" 2>/dev/null || cat "$SUMMARY"
((FAILED == 0))
