"""download_weights.sh --eval_scorers against a fake `hf` and a local endpoint (no network): the CLIP and PickScore
repos are fetched at their pinned commits with only safetensors and processor files, into the folders the
evaluation resolves, and a second run downloads nothing."""

import json
import os
import shutil
from pathlib import Path

from download_support import fake_commit, fake_hub_env
from procs import run_group

from sage_grpo.rewards.clip_score import resolve_model_folder

REPO_ROOT = Path(__file__).resolve().parents[2]


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
    root = tmp_path / "ckpts"
    shutil.copytree(tiny_root, root)
    # huggingface_hub reads either variable as offline mode (the revision resolution goes through it)
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    command = ["bash", "download_weights.sh", "--model_root", str(root), "--no_reward", "--eval_scorers"]
    with fake_hub_env(hub, tmp_path / "bin") as hub_env:
        env.update(hub_env)
        first = run_group(command, cwd=REPO_ROOT, env=env, timeout=120)
        second = run_group(command, cwd=REPO_ROOT, env=env, timeout=120)
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
