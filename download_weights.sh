#!/usr/bin/env bash
# Download HunyuanVideo-1.5 (diffusers format) and the VideoReward model into the layout sage-grpo loads.
# Run `bash download_weights.sh --help` for the layout and the options.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

MODEL_ROOT=./ckpts
VARIANTS=()
DEFAULT_REPO_PREFIX=hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-
REPO_PREFIX=$DEFAULT_REPO_PREFIX
# VideoReward's hub id: the current name first (the KwaiVGI organisation on the hub is now KlingTeam), then the former
# one, which the reference and VideoAlign's README use (the hub redirects it to the current one).
REWARD_REPOS=(KlingTeam/VideoReward KwaiVGI/VideoReward)
# Revisions (a branch, tag or commit of the hub repo) of every download; pin commits for a reproducible root.
HUNYUAN_REVISION=${HUNYUAN_REVISION:-main}
VIDEOALIGN_REVISION=${VIDEOALIGN_REVISION:-main}
REWARD_BASE_REVISION=${REWARD_BASE_REVISION:-main}
WITH_REWARD=1
# The evaluation's scorers (--eval_scorers; python -m sage_grpo.evaluate --metrics clipscore,pickscore), pinned to the
# commits their public hub snapshots carry: CLIPScore's CLIP ViT-L/14, PickScore_v1 and the CLIP-H processor it uses.
EVAL_SCORERS=0
CLIP_REPO=openai/clip-vit-large-patch14
CLIP_REVISION=${CLIP_REVISION:-32bd64288804d66eefd0ccbe215aa642df71cc41}
PICKSCORE_REPO=yuvalkirstain/PickScore_v1
PICKSCORE_REVISION=${PICKSCORE_REVISION:-a4e4367c6dfa7288a00c550414478f865b875800}
PICKSCORE_PROCESSOR_REPO=laion/CLIP-ViT-H-14-laion2B-s32B-b79K
PICKSCORE_PROCESSOR_REVISION=${PICKSCORE_PROCESSOR_REVISION:-1c2b8495b28150b8a4922ee1c8edee224c284c0c}
VERIFY_ONLY=0
TIMEOUT=8
LOCK=
SHARED_COMPONENTS=(vae text_encoder tokenizer text_encoder_2 tokenizer_2 scheduler)
I2V_COMPONENTS=(image_encoder feature_extractor)  # only the image-to-video repos (variants with _i2v) hold them

usage() {
  cat <<'EOF'
Usage: bash download_weights.sh [options]

Fetches the diffusers-format HunyuanVideo-1.5 checkpoint and the VideoReward reward model from the Hugging Face
Hub with the huggingface_hub CLI (`hf download`, else `huggingface-cli download`), arranges them in the layout
below and checks every expected file with `python -m sage_grpo.cli.verify`. Idempotent: complete components
are skipped without touching the network, and interrupted downloads resume.

Options:
  --model_root DIR     checkpoint root to fill (default ./ckpts)
  --variant NAME       transformer version to fetch; repeat for several (default 480p_t2v). The hub repo is
                       <repo_prefix><NAME>; the published ones: 480p_t2v, 720p_t2v, 480p_t2v_distilled, 480p_i2v,
                       720p_i2v, 480p_i2v_distilled, 720p_i2v_distilled, 480p_i2v_step_distilled (720p_t2v_distilled
                       is not published in diffusers format; another name needs --repo_prefix)
  --repo_prefix TEXT   hub repo prefix (default hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-)
  --reward_repo ID     VideoReward repo (default: KlingTeam/VideoReward, falling back to its former name
                       KwaiVGI/VideoReward when the hub has no repo by the current one)
  --no_reward          skip VideoReward and its base model
  --eval_scorers       also fetch the evaluation's CLIPScore and PickScore models (safetensors and processor files
                       only): openai/clip-vit-large-patch14, yuvalkirstain/PickScore_v1 and the processor of
                       laion/CLIP-ViT-H-14-laion2B-s32B-b79K, each into <model_root>/<repo name>/
  --verify_only        only check the layout of --model_root (exit 0 complete, 1 with the missing files listed)
  --timeout SECONDS    how long to wait for the hub before giving up (default 8)
  --lock FILE          download the commits a weights.lock.json names (e.g. one copied from another machine);
                       repositories it does not name follow the revision variables
  -h, --help           this text

Layout under --model_root (the table lives in sage_grpo/models/layout.py):
  transformer/<variant>/   HunyuanVideo15Transformer3DModel  config.json + diffusion_pytorch_model*.safetensors
  vae/                     AutoencoderKLHunyuanVideo15       config.json + diffusion_pytorch_model*.safetensors
  text_encoder/            Qwen2_5_VLTextModel               config.json + model*.safetensors
  tokenizer/               Qwen2Tokenizer                    tokenizer_config.json + tokenizer.json
  text_encoder_2/          T5EncoderModel (byT5 glyphs)      config.json + model*.safetensors
  tokenizer_2/             ByT5Tokenizer                     tokenizer_config.json
  scheduler/               FlowMatchEulerDiscreteScheduler   scheduler_config.json
  image_encoder/           SiglipVisionModel (i2v variants)  config.json + model*.safetensors
  feature_extractor/       SiglipImageProcessor (i2v)        preprocessor_config.json
  variants/<variant>/      the variant's guider/ (guider_config.json: its CFG scale, 1.0 for the cfg-distilled
                           variants) and scheduler/ (scheduler_config.json: its shift); training and generate.py
                           sample the variant with them unless a flag sets guidance or shift
  VideoReward/             VideoAlign reward                 model_config.json + checkpoint-N/
  Qwen2-VL-2B-Instruct/    the reward's base model (model_config.json's model_name_or_path)
  clip-vit-large-patch14/, PickScore_v1/, CLIP-ViT-H-14-laion2B-s32B-b79K/   with --eval_scorers (CLIPModel
                           config.json + model.safetensors, processor files; the last holds the processor only)
  .hf/<repo>/              the downloaded hub snapshots; the folders above link into them (relative symlinks,
                           so copy the root with `cp -a` or `rsync -a`)

Each hub pipeline repo holds transformer/, vae/, text_encoder/, ... at its top level: its transformer/ becomes
transformer/<variant>/, the shared components are taken from the first variant that needs them (later variants
fetch only transformer/* and their guider/ and scheduler/ configs); the image-to-video variants (480p_i2v, 720p_i2v,
their _distilled and step-distilled versions) add the SigLIP image_encoder/ and feature_extractor/, taken from the
first i2v variant. Sharded weights (*.safetensors.index.json) are
checked shard by shard. Running the script on a root made before variants/ existed fetches just those configs.

Revisions: HUNYUAN_REVISION (the pipeline repos), VIDEOALIGN_REVISION (VideoReward) and REWARD_BASE_REVISION (its
base model) name a branch, tag or commit (default main for all three: no commit is documented upstream). Each is
resolved to the commit the hub serves for it, that commit is downloaded (--revision COMMIT) and recorded in
<model_root>/weights.lock.json ({repo: {"revision", "commit"}}); --lock FILE downloads a lock file's commits instead,
so a root is reproduced exactly. The --eval_scorers repos default to commits (CLIP_REVISION,
PICKSCORE_REVISION, PICKSCORE_PROCESSOR_REVISION override them) and are recorded the same way. Runs record the lock
in run_config.yaml, exports in their model card. A root already complete is not fetched again.

Without hub access (HF_HUB_OFFLINE=1, or no answer within --timeout) the script stops at once with exit status 3:
download on a machine with internet and copy the root here, or point HF_ENDPOINT at a mirror.
Environment: PYTHON (interpreter with sage_grpo's requirements; default .venv/bin/python or python3),
HUNYUAN_REVISION, VIDEOALIGN_REVISION, REWARD_BASE_REVISION, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE.
EOF
}

die() { echo "error: $*" >&2; exit "${EXIT_CODE:-2}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --model_root) MODEL_ROOT=${2:?--model_root needs a value}; shift 2 ;;
    --variant) VARIANTS+=("${2:?--variant needs a value}"); shift 2 ;;
    --repo_prefix) REPO_PREFIX=${2:?--repo_prefix needs a value}; shift 2 ;;
    --reward_repo) REWARD_REPOS=("${2:?--reward_repo needs a value}"); shift 2 ;;
    --no_reward) WITH_REWARD=0; shift ;;
    --eval_scorers) EVAL_SCORERS=1; shift ;;
    --verify_only) VERIFY_ONLY=1; shift ;;
    --timeout) TIMEOUT=${2:?--timeout needs a value}; shift 2 ;;
    --lock) LOCK=${2:?--lock needs a file}; [ -f "$LOCK" ] || die "--lock $LOCK: no such file"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(480p_t2v)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
REWARD_FLAG=()
[ "$WITH_REWARD" = 1 ] && REWARD_FLAG=(--reward)

verify() {
  "$PY" -m sage_grpo.cli.verify --model_root "$MODEL_ROOT" --transformer_versions "${VARIANTS[@]}" \
    "${REWARD_FLAG[@]}"
}

if [ "$VERIFY_ONLY" = 1 ]; then
  verify
  exit $?
fi

# a variant no diffusers-format repo publishes is refused in one line before anything is fetched
if [ "$REPO_PREFIX" = "$DEFAULT_REPO_PREFIX" ]; then
  "$PY" -m sage_grpo.cli.verify --published --transformer_versions "${VARIANTS[@]}" || exit 2
fi
mapfile -t MISSING < <("$PY" -m sage_grpo.cli.verify --model_root "$MODEL_ROOT" \
  --transformer_versions "${VARIANTS[@]}" "${REWARD_FLAG[@]}" --missing_components)
# scorer repos (REPO REVISION FILE-THAT-MARKS-IT-COMPLETE PATTERN...) still to fetch, with --eval_scorers
SCORERS=()
if [ "$EVAL_SCORERS" = 1 ]; then
  [ -f "$MODEL_ROOT/${CLIP_REPO##*/}/model.safetensors" ] || SCORERS+=("$CLIP_REPO")
  [ -f "$MODEL_ROOT/${PICKSCORE_REPO##*/}/model.safetensors" ] || SCORERS+=("$PICKSCORE_REPO")
  [ -f "$MODEL_ROOT/${PICKSCORE_PROCESSOR_REPO##*/}/tokenizer_config.json" ] || SCORERS+=("$PICKSCORE_PROCESSOR_REPO")
fi
if [ ${#MISSING[@]} -eq 0 ] && [ ${#SCORERS[@]} -eq 0 ]; then
  echo "[download_weights] $MODEL_ROOT is complete; nothing to download"
  verify
  exit $?
fi
echo "[download_weights] to fetch: ${MISSING[*]} ${SCORERS[*]}"

# ---------------------------------------------------------------- hub access, checked before any download
ENDPOINT=${HF_ENDPOINT:-https://huggingface.co}
no_hub() {
  EXIT_CODE=3 die "$1
The Hugging Face Hub is not reachable from here, so nothing was downloaded. Either
  1. run this script on a machine with internet access and copy $MODEL_ROOT here (keep the links: cp -a / rsync -a),
  2. or use a hub mirror: HF_ENDPOINT=https://<mirror> bash download_weights.sh ...
Check a copied folder with: bash download_weights.sh --verify_only"
}
case "${HF_HUB_OFFLINE:-0}" in
  1|true|TRUE|yes|YES|on|ON) no_hub "HF_HUB_OFFLINE=${HF_HUB_OFFLINE} forbids downloads." ;;
esac
# any HTTP answer (even an error status) means the endpoint is reachable; DNS/connection failures and silence are not
if ! timeout "$TIMEOUT" "$PY" -c '
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=float(sys.argv[2]))
except urllib.error.HTTPError:
    pass
' "$ENDPOINT/api/models/${REWARD_REPOS[0]}" "$TIMEOUT" >/dev/null 2>&1; then
  no_hub "cannot reach $ENDPOINT (no connection or no answer within ${TIMEOUT}s)."
fi

if command -v hf >/dev/null 2>&1; then HF_CLI=(hf download); INCLUDE_STYLE=repeat
elif [ -x .venv/bin/hf ]; then HF_CLI=(.venv/bin/hf download); INCLUDE_STYLE=repeat
elif command -v huggingface-cli >/dev/null 2>&1; then HF_CLI=(huggingface-cli download); INCLUDE_STYLE=list
else die "neither 'hf' nor 'huggingface-cli' is installed: pip install 'huggingface_hub[cli]'"
fi

# fetch REPO REVISION DIR [PATTERN...]: download REPO at the commit REVISION resolves to (the --lock file's commit
# when it names REPO) into DIR (only PATTERNs when given), resuming what is there, and record the commit in the lock
fetch() {
  local repo=$1 revision=$2 dir=$3; shift 3
  local commit lock_args=()
  [ -n "$LOCK" ] && lock_args=(--lock "$LOCK")
  commit=$("$PY" -m sage_grpo.models.revisions resolve "$repo" "$revision" "${lock_args[@]}") || return 1
  local args=("$repo" --revision "$commit" --local-dir "$dir")
  if [ $# -gt 0 ]; then
    if [ "$INCLUDE_STYLE" = repeat ]; then for p in "$@"; do args+=(--include "$p"); done
    else args+=(--include "$@"); fi
  fi
  echo "[download_weights] ${HF_CLI[*]} ${args[*]}   ($revision)"
  "${HF_CLI[@]}" "${args[@]}" || return 1
  "$PY" -m sage_grpo.models.revisions record "$MODEL_ROOT" "$repo" "$revision" "$commit" "${lock_args[@]}"
}

# link TARGET LINK: make LINK a relative symlink to TARGET (an incomplete real folder is moved aside first)
link() {
  local target=$1 link=$2
  mkdir -p "$(dirname "$link")"
  if [ -e "$link" ] && [ ! -L "$link" ]; then
    local aside="$link.incomplete-$(date +%s)"
    echo "[download_weights] moving the incomplete $link aside to $aside"
    mv "$link" "$aside"
  fi
  ln -sfn "$(realpath --relative-to="$(dirname "$link")" "$target")" "$link"
}

is_missing() { local c; for c in "${MISSING[@]}"; do [ "$c" = "$1" ] && return 0; done; return 1; }

# ---------------------------------------------------------------- HunyuanVideo-1.5 pipeline repos
for variant in "${VARIANTS[@]}"; do
  patterns=()
  is_missing "transformer/$variant" && patterns+=("transformer/*")
  shared=()
  components=("${SHARED_COMPONENTS[@]}")
  case "_$variant" in *_i2v*) components+=("${I2V_COMPONENTS[@]}") ;; esac
  for component in "${components[@]}"; do
    if is_missing "$component"; then patterns+=("$component/*"); shared+=("$component"); fi
  done
  configs=()  # the variant's own sampling configs (guider/, scheduler/) -> variants/<variant>/
  for config in guider scheduler; do
    if is_missing "variants/$variant/$config"; then
      configs+=("$config")
      printf '%s\n' "${patterns[@]}" | grep -qx -- "$config/\*" || patterns+=("$config/*")
    fi
  done
  [ ${#patterns[@]} -gt 0 ] || continue
  repo="$REPO_PREFIX$variant"
  snapshot="$MODEL_ROOT/.hf/${repo##*/}"
  fetch "$repo" "$HUNYUAN_REVISION" "$snapshot" "${patterns[@]}" \
    || die "downloading $repo at revision $HUNYUAN_REVISION failed (is the variant name right? see --help)"
  is_missing "transformer/$variant" && link "$snapshot/transformer" "$MODEL_ROOT/transformer/$variant"
  for component in "${shared[@]}"; do link "$snapshot/$component" "$MODEL_ROOT/$component"; done
  for config in "${configs[@]}"; do
    if [ -d "$snapshot/$config" ]; then link "$snapshot/$config" "$MODEL_ROOT/variants/$variant/$config"
    else echo "[download_weights] $repo has no $config/; $variant is sampled with the flags' defaults"; fi
  done
  kept=()
  for c in "${MISSING[@]}"; do
    case "$c" in "transformer/$variant"|"variants/$variant/"*) continue ;; esac
    printf '%s\n' "${shared[@]}" | grep -qx -- "$c" && continue
    kept+=("$c")
  done
  MISSING=("${kept[@]}")
done

# ---------------------------------------------------------------- VideoReward and its base model
if [ "$WITH_REWARD" = 1 ] && is_missing VideoReward; then
  fetched=
  for reward_repo in "${REWARD_REPOS[@]}"; do
    if fetch "$reward_repo" "$VIDEOALIGN_REVISION" "$MODEL_ROOT/VideoReward"; then fetched=$reward_repo; break; fi
    echo "[download_weights] $reward_repo could not be downloaded at revision $VIDEOALIGN_REVISION"
  done
  [ -n "$fetched" ] || die "downloading VideoReward failed under every name tried (${REWARD_REPOS[*]}) at revision \
$VIDEOALIGN_REVISION; name the repo with --reward_repo ID or set VIDEOALIGN_REVISION"
  echo "[download_weights] VideoReward: $fetched at revision $VIDEOALIGN_REVISION"
  base=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["model_config"]["model_name_or_path"])' \
    "$MODEL_ROOT/VideoReward/model_config.json")
  case "$base" in
    */*/*|/*|.*) echo "[download_weights] the reward's base model $base is a path; place it there yourself" ;;
    */*) fetch "$base" "$REWARD_BASE_REVISION" "$MODEL_ROOT/${base##*/}" \
           || die "downloading the reward base model $base at revision $REWARD_BASE_REVISION failed" ;;
  esac
fi

# ---------------------------------------------------------------- the evaluation's scorers (--eval_scorers)
for repo in "${SCORERS[@]}"; do
  case "$repo" in
    "$CLIP_REPO") revision=$CLIP_REVISION; patterns=("*.json" "*.txt" "model.safetensors") ;;
    "$PICKSCORE_REPO") revision=$PICKSCORE_REVISION; patterns=("*.json" "model.safetensors") ;;
    *) revision=$PICKSCORE_PROCESSOR_REVISION; patterns=("*.json" "*.txt") ;;  # the processor only, no weights
  esac
  fetch "$repo" "$revision" "$MODEL_ROOT/${repo##*/}" "${patterns[@]}" \
    || die "downloading $repo at revision $revision failed"
done

echo "[download_weights] checking $MODEL_ROOT"
verify
