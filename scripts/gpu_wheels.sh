#!/usr/bin/env bash
# Download, here where pip works, the wheels the GPU machine's image lacks, into .whl/ (ignored by git): the device
# tool's `run` carries them (carry: [".whl"]) and scripts/gpu_session.py installs them into /tmp/site there.
#
#   bash scripts/gpu_wheels.sh
#
# The image (docs/gpu_runbook.md): Python 3.12, torch 2.11.0+cu130, transformers 5.17.0, accelerate 1.15.0,
# huggingface_hub 1.33.0, safetensors 0.8.0, tokenizers 0.23.2, numpy 2.5.2, peft (version not known), imageio,
# einops, pyyaml, tqdm, tensorboard, pytest, regex, requests, filelock, pillow; no diffusers, no imageio-ffmpeg.
# Each wheel is fetched with --no-deps and its needs were checked by hand against that list (Requires-Dist):
#   diffusers 0.42.1      needs huggingface-hub>=1.32 (1.33.0 there), safetensors>=0.8 (0.8.0), numpy, regex, requests,
#                         filelock, Pillow (there), importlib_metadata (imported only on Python < 3.8: not carried)
#   peft 0.21.2           the image's version is unknown; needs transformers, accelerate>=0.21, torch, psutil,
#                         safetensors, huggingface_hub, pyyaml, tqdm, packaging, numpy (all there)
#   imageio-ffmpeg 0.6.0  only with SAGE_GPU_WHEELS_FFMPEG=1: the ffmpeg binary behind imageio's mp4 writer and reader
#                         (generate.py, VideoAlign on files), which none of gpu_session.py's parts uses; no Python
#                         needs. 0.6.0 (29 MB) rather than 0.8.1 (68 MB, over the 64 MiB carry limit).
# transformers is not carried: the unit tier passes with the image's 5.17.0 (docs/gpu_runbook.md).
# It prints each wheel's needs, the wheels' total size and the repository's (git ls-files), and fails when the two
# together reach LIMIT_MIB (default 60; the tool's limit for the working tree plus carried paths is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
LIMIT_MIB=${LIMIT_MIB:-60}
WHEELS=(diffusers==0.42.1 peft==0.21.2)
if [[ ${SAGE_GPU_WHEELS_FFMPEG:-0} != 0 ]]; then
    WHEELS+=(imageio-ffmpeg==0.6.0)
fi
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
           manylinux2010_x86_64 manylinux1_x86_64)

rm -rf .whl
mkdir -p .whl
platform_flags=()
for platform in "${PLATFORMS[@]}"; do
    platform_flags+=(--platform "$platform")
done
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platform_flags[@]}" -d .whl "${WHEELS[@]}"

for wheel in .whl/*.whl; do
    needs=$(unzip -p "$wheel" '*.dist-info/METADATA' \
            | awk '/^Requires-Dist: / && !/extra ==/ {sub(/^Requires-Dist: /, ""); print}' | paste -sd ';' -)
    echo "$(basename "$wheel"): $(du -b "$wheel" | cut -f1) bytes; needs: ${needs:-nothing}"
done
count=$(find .whl -type f -name '*.whl' | wc -l)
if ((count != ${#WHEELS[@]})); then
    echo "error: ${#WHEELS[@]} wheels asked for, $count in .whl/ (two versions of one stop the install there)" >&2
    exit 1
fi
wheel_bytes=$(du -cb .whl/*.whl | tail -1 | cut -f1)
repo_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
total=$((wheel_bytes + repo_bytes))
printf 'wheels %.1f MiB + repository (git ls-files) %.1f MiB = %.1f MiB (limit %d MiB)\n' \
    "$(bc -l <<<"$wheel_bytes / 1048576")" "$(bc -l <<<"$repo_bytes / 1048576")" "$(bc -l <<<"$total / 1048576")" \
    "$LIMIT_MIB"
if ((total >= LIMIT_MIB * 1048576)); then
    echo "error: wheels and repository reach ${LIMIT_MIB} MiB; leave imageio-ffmpeg out (SAGE_GPU_WHEELS_FFMPEG=0)" >&2
    exit 1
fi
