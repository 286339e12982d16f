"""download_weights.sh: the documented layout, a fast clear failure without hub access, layout verification, and the
whole download-and-arrange flow against a fake ``hf`` CLI and a local HTTP endpoint (no network needed): each
variant's guider and scheduler configs, the revisions resolved to commits, downloaded and recorded in the root's
weights.lock.json (and reproduced from a lock file), VideoReward under its current hub name (KlingTeam/VideoReward)
with a fall-back to its former one (KwaiVGI/VideoReward), and a variant no diffusers-format repo publishes refused
in one line."""

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest
from download_support import fake_commit, fake_hub_env
from procs import run_group

from sage_grpo.models.variants import read_variant_sampling


REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "download_weights.sh"
PIPELINE_COMPONENTS = ("vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2", "scheduler")
VARIANTS = ("480p_t2v", "720p_t2v", "480p_t2v_distilled")


def run_script(*args, env=None, timeout=120):
    # huggingface_hub reads either variable as offline mode (the revision resolution goes through it)
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    base.update(env or {})
    return run_group(["bash", str(SCRIPT), *args], cwd=REPO_ROOT, env=base, timeout=timeout)


def test_help_documents_the_layout():
    result = run_script("--help")
    assert result.returncode == 0
    for line in ("transformer/<variant>/", "vae/", "text_encoder/", "tokenizer/", "text_encoder_2/", "tokenizer_2/",
                 "scheduler/", "VideoReward/", "Qwen2-VL-2B-Instruct/", "--verify_only", "--variant", "HF_ENDPOINT",
                 "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-", "KwaiVGI/VideoReward",
                 "default: KlingTeam/VideoReward", "variants/<variant>/", "guider_config.json", "HUNYUAN_REVISION",
                 "VIDEOALIGN_REVISION", "REWARD_BASE_REVISION"):
        assert line in result.stdout, line
    from sage_grpo.models.layout import TRANSFORMER_VERSIONS

    published = " ".join(result.stdout.split("the published ones: ")[1].split("(")[0].split())
    assert published == ", ".join(TRANSFORMER_VERSIONS)
    assert "KlingAIResearch" not in result.stdout  # a GitHub organisation, no hub name of VideoReward


def test_an_unpublished_variant_is_refused_in_one_line_before_anything_is_fetched(tmp_path):
    result = run_script("--model_root", str(tmp_path / "ckpts"), "--variant", "480p_t2v", "--variant",
                        "720p_t2v_distilled", env={"HF_ENDPOINT": _closed_port()})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: --variant '720p_t2v_distilled' is no published HunyuanVideo-1.5 variant "
                                    "(it has no published weights: ")
    assert result.stderr.endswith("published variants: 480p_t2v, 720p_t2v, 480p_t2v_distilled, 480p_i2v, 720p_i2v, "
                                  "480p_i2v_distilled, 720p_i2v_distilled, 480p_i2v_step_distilled\n")
    assert not (tmp_path / "ckpts").exists()


class _SilentServer:
    """A TCP port that accepts connections and never answers (a hub that hangs)."""

    def __enter__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc):
        self.sock.close()


def _closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there once closed


@pytest.mark.parametrize("case", ["offline_env", "refused", "silent"])
def test_without_hub_access_it_fails_fast_and_says_what_to_do(tmp_path, case):
    env = {"HF_HUB_OFFLINE": "1"} if case == "offline_env" else {}
    with _SilentServer() as silent:
        env["HF_ENDPOINT"] = silent if case == "silent" else _closed_port()
        start = time.perf_counter()
        result = run_script("--model_root", str(tmp_path / "ckpts"), "--timeout", "3", env=env, timeout=60)
        elapsed = time.perf_counter() - start
    assert result.returncode == 3, result.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"
    message = result.stderr
    assert "machine with internet access" in message and "HF_ENDPOINT" in message and "--verify_only" in message
    assert ("HF_HUB_OFFLINE=1" if case == "offline_env" else "cannot reach") in message
    assert not (tmp_path / "ckpts" / ".hf").exists()  # nothing was started


def test_verify_only_passes_on_a_complete_root_and_lists_a_removed_file(tiny_root, tmp_path):
    complete = run_script("--verify_only", "--no_reward", "--model_root", str(tiny_root))
    assert complete.returncode == 0 and "complete (480p_t2v)" in complete.stdout
    broken = tmp_path / "broken"
    shutil.copytree(tiny_root, broken)
    (broken / "text_encoder" / "model.safetensors").unlink()
    result = run_script("--verify_only", "--no_reward", "--model_root", str(broken))
    assert result.returncode == 1
    assert "missing 1 required file(s)" in result.stderr
    assert "text_encoder/model.safetensors | text_encoder/model.safetensors.index.json" in result.stderr
    without_reward = run_script("--verify_only", "--model_root", str(tiny_root))  # the reward is required by default
    assert without_reward.returncode == 1 and "VideoReward files are missing" in without_reward.stderr


@pytest.fixture
def fake_hub(tiny_root, tmp_path, monkeypatch):
    """Hub repos built from the tiny checkpoint, an `hf` that copies them, and a local endpoint that answers."""
    from sage_grpo.models.tiny import published_sampling, write_variant_configs
    from sage_grpo.rewards.tiny import write_tiny_video_reward

    hub = tmp_path / "hub"
    for variant in VARIANTS:  # each pipeline repo with its own guider/ and scheduler/, as on the hub
        repo = hub / f"hunyuanvideo-community__HunyuanVideo-1.5-Diffusers-{variant}"
        shutil.copytree(tiny_root / "transformer" / "480p_t2v", repo / "transformer")
        for component in PIPELINE_COMPONENTS:
            if component != "scheduler":
                shutil.copytree(tiny_root / component, repo / component)
        write_variant_configs(repo, variant, *published_sampling(variant))
        for config in ("guider", "scheduler"):
            (repo / "variants" / variant / config).rename(repo / config)
        (repo / "variants" / variant).rmdir()
        (repo / "variants").rmdir()
    write_tiny_video_reward(hub / "reward")
    (hub / "reward" / "VideoReward").rename(hub / "KlingTeam__VideoReward")  # the name the hub resolves today
    with fake_hub_env(hub, tmp_path / "bin") as env:
        yield hub, env


def test_download_arranges_the_layout_links_and_is_idempotent(fake_hub, tmp_path):
    hub, env = fake_hub
    root = tmp_path / "ckpts"
    first = run_script("--model_root", str(root), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "complete (480p_t2v, VideoReward)" in first.stdout
    snapshot = root / ".hf" / "HunyuanVideo-1.5-Diffusers-480p_t2v"
    assert os.readlink(root / "transformer" / "480p_t2v") == "../.hf/HunyuanVideo-1.5-Diffusers-480p_t2v/transformer"
    for component in PIPELINE_COMPONENTS:
        assert (root / component).is_symlink() and (root / component).resolve() == (snapshot / component).resolve()
    assert (root / "VideoReward" / "model_config.json").is_file()
    for config in ("guider", "scheduler"):  # the variant's own sampling configs
        assert os.readlink(root / "variants" / "480p_t2v" / config) == \
            f"../../.hf/HunyuanVideo-1.5-Diffusers-480p_t2v/{config}"
    assert read_variant_sampling(root, "480p_t2v").guidance_scale == 6.0

    calls = (hub / "calls.log").read_text().splitlines()
    for call in calls:  # every download names the commit its revision resolved to
        assert f" --revision {fake_commit(call.split()[1], 'main')} " in call, call
    lock = json.loads((root / "weights.lock.json").read_text())
    assert lock == {repo: {"revision": "main", "commit": fake_commit(repo, "main")} for repo in (
        "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v", "KlingTeam/VideoReward")}
    # VideoReward: the current name, first and only (no other name tried)
    reward_calls = [call.split()[1] for call in calls if "VideoReward" in call]
    assert reward_calls == ["KlingTeam/VideoReward"]
    assert "could not be downloaded" not in first.stdout
    assert "VideoReward: KlingTeam/VideoReward at revision main" in first.stdout
    second = run_script("--model_root", str(root), env=env)
    assert second.returncode == 0 and "nothing to download" in second.stdout
    assert (hub / "calls.log").read_text().splitlines() == calls  # no download at all

    # A second variant fetches only its transformer and its own configs; the shared components stay where they are.
    third = run_script("--model_root", str(root), "--variant", "480p_t2v", "--variant", "720p_t2v", env=env)
    assert third.returncode == 0, third.stdout + third.stderr
    new_calls = (hub / "calls.log").read_text().splitlines()[len(calls):]
    assert len(new_calls) == 1 and "Diffusers-720p_t2v" in new_calls[0]
    assert new_calls[0].count("--include") == 3
    assert all(f"--include {p}/*" in new_calls[0] for p in ("transformer", "guider", "scheduler"))
    assert "complete (480p_t2v, 720p_t2v, VideoReward)" in third.stdout
    assert json.loads((root / "scheduler" / "scheduler_config.json").read_text())["shift"] == 5.0  # the first's
    assert read_variant_sampling(root, "720p_t2v").flow_shift == 9.0  # its own


def test_the_distilled_variant_comes_with_its_guidance_at_pinned_revisions(fake_hub, tmp_path):
    hub, env = fake_hub
    (hub / "KlingTeam__VideoReward").rename(hub / "KwaiVGI__VideoReward")  # a hub that knows only the former name
    env = {**env, "HUNYUAN_REVISION": "0123abc", "VIDEOALIGN_REVISION": "v1.0", "REWARD_BASE_REVISION": "r2"}
    root = tmp_path / "ckpts"
    result = run_script("--model_root", str(root), "--variant", "480p_t2v_distilled", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    variant = read_variant_sampling(root, "480p_t2v_distilled")
    assert (variant.guidance_scale, variant.flow_shift) == (1.0, 5.0)  # no CFG 6.0 for the cfg-distilled variant
    calls = (hub / "calls.log").read_text().splitlines()
    revisions = {call.split()[1]: call.split("--revision ")[1].split()[0] for call in calls}
    pipeline = "hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v_distilled"
    assert revisions == {pipeline: fake_commit(pipeline, "0123abc"),  # the tiny reward's base model is a local folder
                         "KwaiVGI/VideoReward": fake_commit("KwaiVGI/VideoReward", "v1.0")}
    lock = json.loads((root / "weights.lock.json").read_text())
    assert {repo: entry["revision"] for repo, entry in lock.items()} == {pipeline: "0123abc",
                                                                         "KwaiVGI/VideoReward": "v1.0"}
    # the lock file reproduces the root: another root downloads its commits whatever the revision variables say
    again = run_script("--model_root", str(tmp_path / "again"), "--variant", "480p_t2v_distilled", "--lock",
                       str(root / "weights.lock.json"), env={**env, "HUNYUAN_REVISION": "main"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert json.loads((tmp_path / "again" / "weights.lock.json").read_text()) == lock
    assert (hub / "calls.log").read_text().splitlines()[len(calls):][0].split("--revision ")[1].split()[0] == \
        lock[pipeline]["commit"]
    assert "KlingTeam/VideoReward could not be downloaded at revision v1.0" in result.stdout  # then the former name
    assert "VideoReward: KwaiVGI/VideoReward at revision v1.0" in result.stdout


def test_a_root_made_before_variant_configs_fetches_just_them(fake_hub, tmp_path):
    hub, env = fake_hub
    root = tmp_path / "ckpts"
    assert run_script("--model_root", str(root), "--no_reward", env=env).returncode == 0
    shutil.rmtree(root / "variants")
    calls = (hub / "calls.log").read_text().splitlines()
    again = run_script("--model_root", str(root), "--no_reward", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    new_calls = (hub / "calls.log").read_text().splitlines()[len(calls):]
    assert len(new_calls) == 1 and new_calls[0].count("--include") == 2
    assert "--include guider/*" in new_calls[0] and "--include scheduler/*" in new_calls[0]
    assert read_variant_sampling(root, "480p_t2v").guidance_scale == 6.0


def test_an_incomplete_component_is_fetched_again_and_the_partial_folder_kept_aside(fake_hub, tmp_path):
    hub, env = fake_hub
    root = tmp_path / "ckpts"
    (root / "vae").mkdir(parents=True)
    (root / "vae" / "config.json").write_text("{}")  # an interrupted copy: weights missing
    result = run_script("--model_root", str(root), "--no_reward", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (root / "vae").is_symlink() and len(list(root.glob("vae.incomplete-*"))) == 1


def test_an_i2v_variant_brings_the_image_encoder(fake_hub, tiny_i2v_root, tmp_path):
    from sage_grpo.models.tiny import published_sampling, write_variant_configs

    hub, env = fake_hub
    repo = hub / "hunyuanvideo-community__HunyuanVideo-1.5-Diffusers-480p_i2v"
    shutil.copytree(tiny_i2v_root / "transformer" / "480p_i2v", repo / "transformer")
    for component in (*PIPELINE_COMPONENTS, "image_encoder", "feature_extractor"):
        if component != "scheduler":
            shutil.copytree(tiny_i2v_root / component, repo / component)
    write_variant_configs(repo, "480p_i2v", *published_sampling("480p_i2v"))
    for config in ("guider", "scheduler"):
        (repo / "variants" / "480p_i2v" / config).rename(repo / config)
    root = tmp_path / "ckpts"
    result = run_script("--model_root", str(root), "--no_reward", "--variant", "480p_t2v", "--variant", "480p_i2v",
                        env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "complete (480p_t2v, 480p_i2v)" in result.stdout
    calls = (hub / "calls.log").read_text().splitlines()
    t2v_call, i2v_call = calls
    assert "image_encoder" not in t2v_call  # the text-to-video repo has no image encoder
    assert all(f"--include {p}/*" in i2v_call for p in ("transformer", "image_encoder", "feature_extractor"))
    assert "--include vae/*" not in i2v_call  # shared components come from the first variant
    for component in ("image_encoder", "feature_extractor"):
        assert os.readlink(root / component) == f".hf/HunyuanVideo-1.5-Diffusers-480p_i2v/{component}"
    assert read_variant_sampling(root, "480p_i2v").flow_shift == 5.0
