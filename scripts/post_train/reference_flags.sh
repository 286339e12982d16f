# The reference's post_train.py launch flags (docs/reference.md#the-launch-scripts-flags), shared by run_post_train.sh
# and scripts/post_train/train_grpo.sh. Source this file, then call `reference_flags OUTPUT_DIR` to fill the
# REFERENCE_FLAGS array (in the reference's order).
reference_flags() {
  REFERENCE_FLAGS=(
    --pretrained_model_root ./ckpts
    --learning_rate 1e-5
    --batch_size 2
    --num_generations 4
    --max_steps 10000
    --output_dir "$1"
    --enable_fsdp
    --enable_gradient_checkpointing
    --sp_size 2
    --reward_checkpoint_mode v3
    --validate_at_step0 False
    --validate_video_length 121
    --validation_timestep_shift 5.0
    --use_grad_balancing True
    --enable_timestep_permutation True
    --sde_type sage_grpo
    --kl_weight 1e-5
    --kl_coef 1e-7
    --use_moving_KL True
    --update_ref_model_step 10
    --use_dual_kl True
    --dual_kl_moving_weight 1.0
    --dual_kl_step_weight 0.1
    --reference_mode_offload True
  )
}

# yield_to_config ARGS...: when ARGS (the user's arguments) hold --config FILE, drop from REFERENCE_FLAGS every flag
# FILE sets, so the order is launcher defaults < config file < flags typed on the command line
# (sage_grpo/config/launcher.py).
yield_to_config() {
  local config=
  while [ $# -gt 0 ]; do
    case "$1" in
      --config) config=${2:-}; shift $(( $# > 1 ? 2 : 1 )) ;;
      --config=*) config=${1#--config=}; shift ;;
      *) shift ;;
    esac
  done
  [ -n "$config" ] || return 0
  local py=${PYTHON:-}
  if [ -z "$py" ]; then
    if [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
  fi
  local kept
  kept=$("$py" -m sage_grpo.config.launcher "$config" "${REFERENCE_FLAGS[@]}") || exit 2
  REFERENCE_FLAGS=()
  [ -z "$kept" ] || mapfile -t REFERENCE_FLAGS <<< "$kept"  # a file that sets them all leaves none
}
