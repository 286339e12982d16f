"""The memory plan counts what the rewards and the held-out validation scorers hold (sage_grpo/plan/scorers.py): the
CLIP models exactly (their released sizes, or the parameters of the folder's model), on the SP leaders when trained
on and on rank 0 when held out, nothing twice and nothing when no validation runs."""
import pytest

from sage_grpo.config import parse_cli
from sage_grpo.config.train import TrainConfig
from sage_grpo.models.placement import Placement
from sage_grpo.plan import memory as planner
from sage_grpo.plan.scorers import held_out_rewards, local_rewards
from sage_grpo.rewards.tiny import write_tiny_clip_scorers

from test_plan import REFERENCE_FLAGS

CLIP_L14_PARAMS, CLIP_H14_PARAMS = 427_616_513, 986_109_441  # openai/clip-vit-large-patch14, laion CLIP-ViT-H-14


def components(plan, phase="train"):
    return {c.name: c.bytes for c in next(p for p in plan.phases if p.name == phase).components}


def plan_of(cfg, world_size=8):
    """The plan at the reference launch's own decisions (tests/unit/test_plan.py checks them)."""
    return planner.plan_memory(cfg, planner.sizes_of(cfg), world_size, 80.0, Placement(False, False, "auto", 32))


def test_held_out_scorers_add_their_fp32_weights_on_rank_0_at_the_reference_launch():
    base = plan_of(parse_cli(TrainConfig, REFERENCE_FLAGS))
    cfg = parse_cli(TrainConfig, REFERENCE_FLAGS + ["--validation_metrics", "videoalign,clipscore,pickscore"])
    assert held_out_rewards(cfg) == ["clipscore", "pickscore"]  # videoalign is the training reward already
    plan = plan_of(cfg)
    train = components(plan)
    assert train["held-out scorer clipscore (rank 0)"] == CLIP_L14_PARAMS * 4
    assert train["held-out scorer pickscore (rank 0)"] == CLIP_H14_PARAMS * 4
    assert train["reward model videoalign_local (SP leaders)"] == 2_208_985_600 * 2
    assert plan.peak.bytes - base.peak.bytes == pytest.approx((CLIP_L14_PARAMS + CLIP_H14_PARAMS) * 4)
    # scoring a validation video: the largest forward, PickScore's 64 frames of 257 tokens through one ViT-H layer
    scoring = components(plan, "validation scoring")
    assert scoring["validation scoring forward (rank 0): pickscore"] == 64 * 257 * (4 * 1280 + 5120 + 16 * 257) * 4
    off = parse_cli(TrainConfig, REFERENCE_FLAGS + ["--validation_metrics", "clipscore", "--validation_interval", "0"])
    assert held_out_rewards(off) == [] and "validation scoring" not in {p.name for p in plan_of(off).phases}


def test_a_trained_clip_reward_is_counted_from_its_folder_on_the_sp_leaders(tmp_path):
    from transformers import CLIPModel

    root = write_tiny_clip_scorers(tmp_path, seed=0)
    cfg = parse_cli(TrainConfig, ["--pretrained_model_root", str(root), "--reward_model", "clipscore",
                                  "--reward_weights", "", "--extra_rewards", "target_color=0.5", "--sp_size", "1"])
    assert local_rewards(cfg) == ["clipscore", "target_color"] and not planner.sizes_of(cfg).reward_params
    model = CLIPModel.from_pretrained(root / "clip-vit-large-patch14", local_files_only=True, use_safetensors=True)
    train = components(plan_of(cfg, world_size=1))
    assert train["reward model clipscore (SP leaders)"] == sum(p.numel() for p in model.parameters()) * 4
    assert not any(name.startswith("reward model videoalign") for name in train)
    remote = parse_cli(TrainConfig, ["--remote_reward_url", "http://host:8765", "--sp_size", "1"])
    assert local_rewards(remote) == [] and not any(n.startswith("reward") for n in components(
        plan_of(remote, world_size=1)))
