"""download_weights.sh --eval_scorers against a fake `hf` and a local endpoint (no network): the CLIP and PickScore
repos are fetched at their pinned commits with only safetensors and processor files, into the folders the
evaluation resolves, and a second run downloads nothing."""

import http.server
import json
import os
import shutil
import threading
from pathlib import Path

from download_support import QuietHubHandler, fake_commit
from procs import run_group

from sage_grpo.rewards.clip_score import resolve_model_folder

REPO_ROOT = Path(__file__).resolve().parents[2]
# fake `hf download REPO --revision REV --local-dir DIR [--include GLOB]...`: copies the matching top-level files of
# $FAKE_HUB/<owner>__<name>/ and logs the call
FAKE_HF = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_HUB/calls.log"
repo=$2; shift 2; dir=; includes=()
while [ $# -gt 0 ]; do
  case $1 in --local-dir) dir=$2; shift 2 ;; --include) includes+=("$2"); shift 2 ;; *) shift ;; esac
done
src="$FAKE_HUB/${repo//\//__}"
[ -d "$src" ] || { echo "404: $repo" >&2; exit 1; }
mkdir -p "$dir"
for pattern in "${includes[@]}"; do for f in "$src"/$pattern; do [ -e "$f" ] && cp "$f" "$dir/"; done; done
exit 0
"""


def test_eval_scorers_are_fetched_pinned_and_once(tiny_root, tmp_path):
    from sage_grpo.rewards.tiny import write_tiny_clip_scorers

    made = write_tiny_clip_scorers(tmp_path / "made")
    hub = tmp_path / "hub"
    for folder, repo in (("clip-vit-large-patch14", "openai__clip-vit-large-patch14"),
                         ("PickScore_v1", "yuvalkirstain__PickScore_v1"),
                         ("CLIP-ViT-H-14-laion2B-s32B-b79K", "laion__CLIP-ViT-H-14-laion2B-s32B-b79K")):
        shutil.copytree(made / folder, hub / repo)
    (hub / "laion__CLIP-ViT-H-14-laion2B-s32B-b79K" / "model.safetensors").write_bytes(b"large CLIP-H weights")
    (hub / "openai__clip-vit-large-patch14" / "pytorch_model.bin").write_bytes(b"a pickle, never fetched")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "hf").write_text(FAKE_HF)
    (bin_dir / "hf").chmod(0o755)
    root = tmp_path / "ckpts"
    shutil.copytree(tiny_root, root)
    handler = type("Handler", (QuietHubHandler,), {"hub": hub})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # huggingface_hub reads either variable as offline mode (the revision resolution goes through it)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_HUB=str(hub),
               HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}")
    command = ["bash", "download_weights.sh", "--model_root", str(root), "--no_reward", "--eval_scorers"]
    try:
        first = run_group(command, cwd=REPO_ROOT, env=env, timeout=120)
        second = run_group(command, cwd=REPO_ROOT, env=env, timeout=120)
    finally:
        server.shutdown()
    assert first.returncode == 0, first.stderr[-2000:]
    calls = (hub / "calls.log").read_text().splitlines()
    assert len(calls) == 3, " || ".join(c[:60] for c in calls)
    # each pinned revision is resolved to the commit the hub serves for it, downloaded at that commit and locked
    pins = {"openai/clip-vit-large-patch14": "32bd64288804d66eefd0ccbe215aa642df71cc41",
            "yuvalkirstain/PickScore_v1": "a4e4367c6dfa7288a00c550414478f865b875800",
            "laion/CLIP-ViT-H-14-laion2B-s32B-b79K": "1c2b8495b28150b8a4922ee1c8edee224c284c0c"}
    for repo, pin in pins.items():
        assert any(f"{repo} --revision {fake_commit(repo, pin)} " in c + " " for c in calls), (repo, calls)
    lock = json.loads((root / "weights.lock.json").read_text())
    assert {repo: lock[repo]["revision"] for repo in pins} == pins
    assert (root / "clip-vit-large-patch14" / "model.safetensors").is_file()
    assert not (root / "clip-vit-large-patch14" / "pytorch_model.bin").exists()
    assert not (root / "CLIP-ViT-H-14-laion2B-s32B-b79K" / "model.safetensors").exists()  # the processor only
    assert resolve_model_folder("yuvalkirstain/PickScore_v1", root, "--pickscore_model") == root / "PickScore_v1"
    assert second.returncode == 0 and "nothing to download" in second.stdout
    assert len((hub / "calls.log").read_text().splitlines()) == 3
