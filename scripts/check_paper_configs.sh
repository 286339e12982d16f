#!/usr/bin/env bash
# Launch configs/paper/*.yaml through run_post_train.sh for 1 step on the CPU, its model paths pointed at the tiny
# checkpoint (written to $TINY, default /tmp/sage_grpo_paper_tiny, if absent): each line says whether the file
# launched and wrote checkpoint-1. tests/e2e/test_paper_config_launch.py runs it for one file in the suite; this
# checks all 18 (about 10 s each on 2 cores). Run from anywhere:
#   bash scripts/check_paper_configs.sh [CONFIG.yaml ...]      (default: every configs/paper/*.yaml)
# The interpreter: $PYTHON, else ./.venv/bin/python (scripts/setup_env.sh), else python3 from PATH (an environment
# that has requirements.txt, e.g. a conda env after pip install -e .). torchrun is that interpreter's
# (python -m torch.distributed.run) unless TORCHRUN is set. MASTER_PORT_BASE: the first config's port is one above it.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in sys.argv[1:]))" \
     torch diffusers transformers 2> /dev/null; then
  echo "error: $PY does not have torch, diffusers and transformers: run bash scripts/setup_env.sh (it makes ./.venv)" \
       "or set PYTHON to an interpreter with requirements.txt installed" >&2
  exit 2
fi
TINY=${TINY:-/tmp/sage_grpo_paper_tiny}
OUT=${OUT:-/tmp/sage_grpo_paper_runs}
mkdir -p "$OUT"
if [ -z "${TORCHRUN:-}" ]; then  # the interpreter's own torchrun, whatever bin/ it lives in
  TORCHRUN=$OUT/.torchrun
  printf '#!/usr/bin/env bash\nexec %q -m torch.distributed.run "$@"\n' "$PY" > "$TORCHRUN"
  chmod +x "$TORCHRUN"
fi
export PYTHON=$PY TORCHRUN HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1 NPROC_PER_NODE=1
[ -d "$TINY/transformer" ] || "$PY" scripts/make_tiny_checkpoint.py --output "$TINY" > /dev/null
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(configs/paper/*.yaml)
port=${MASTER_PORT_BASE:-29650} failed=0
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .yaml); port=$((port + 1)); rm -rf "${OUT:?}/$name"; start=$(date +%s)
  MASTER_PORT=$port bash run_post_train.sh --config "$cfg" --pretrained_model_root "$TINY" --output_dir "$OUT/$name" \
    --dtype fp32 --device cpu --sp_size 1 --enable_fsdp false --enable_gradient_checkpointing false --batch_size 2 \
    --num_generations 2 --grpo_sampling_steps 2 --sample_n_frames 5 --rollout_height 16 --rollout_width 16 \
    --text_max_length 16 --byt5_max_length 8 --vision_num_semantic_tokens 4 --max_steps 1 --validation_interval 0 \
    --save_rollout_videos false > "$OUT.$name.log" 2>&1
  rc=$?
  ckpt=$(find "$OUT/$name" -maxdepth 2 -name checkpoint-1 -type d 2>/dev/null | head -1)
  status=written
  [ -n "$ckpt" ] || status=MISSING
  [ $rc -eq 0 ] && [ -n "$ckpt" ] || failed=$((failed + 1))
  echo "$name: exit $rc, checkpoint-1 $status, $(( $(date +%s) - start )) s (log $OUT.$name.log)"
done
echo "$failed of ${#configs[@]} failed"
[ $failed -eq 0 ]
