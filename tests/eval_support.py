"""The evaluation tests' setup: a checkpoint root (the tiny HunyuanVideo-1.5 linked in, plus the tiny VideoReward,
CLIP and PickScore models), two trained-weight checkpoints in two of the formats the project reads, and 4 prompts."""

from pathlib import Path

import torch
from safetensors.torch import save_file

PROMPTS = ("A red ball bounces on a wooden floor", "A cat walks on the grass", "A dog runs along the beach",
           "The camera pans over a city at night")
METRICS = "videoalign,clipscore,pickscore,target_color,toy_red"


def linked_root(folder: Path, *roots: Path) -> Path:
    """``folder`` holding links to every entry of ``roots`` (read-only fixtures combined into one model root)."""
    folder.mkdir(parents=True)
    for root in roots:
        for child in Path(root).iterdir():
            (folder / child.name).symlink_to(child.resolve())
    return folder


def make_eval_setup(tiny_root: Path, tiny_reward_root: Path, folder: Path) -> dict:
    """Files under ``folder``; returns the evaluate flags (without --output) and the paths."""
    from sage_grpo.models import load_transformer
    from sage_grpo.rewards.tiny import write_tiny_clip_scorers

    root = linked_root(folder / "ckpts", tiny_root, tiny_reward_root)
    write_tiny_clip_scorers(root, seed=0)
    state = load_transformer(tiny_root, dtype=torch.float32).state_dict()
    generator = torch.Generator().manual_seed(0)
    run_checkpoint = folder / "run" / "checkpoint-2" / "transformer"  # a full training checkpoint
    run_checkpoint.mkdir(parents=True)
    save_file({k: v + 0.05 * torch.randn(v.shape, generator=generator) for k, v in state.items()},
              run_checkpoint / "model.safetensors")
    weights_file = folder / "other.safetensors"  # a bare weights file
    save_file({k: v + 0.1 * torch.randn(v.shape, generator=generator) for k, v in state.items()}, weights_file)
    prompts = folder / "eval.csv"
    prompts.write_text("prompt\n" + "\n".join(PROMPTS) + "\n")
    args = ["--checkpoints", "base", str(run_checkpoint.parent), str(weights_file), "--prompts", str(prompts),
            "--seeds", "3", "7", "--metrics", METRICS, "--model_path", str(root), "--num_inference_steps", "2",
            "--video_length", "5", "--fixed_size", "16x16", "--text_max_length", "16", "--byt5_max_length", "8",
            "--vision_num_semantic_tokens", "4", "--dtype", "fp32", "--device", "cpu", "--picture_height", "16"]
    return {"root": root, "args": args, "csv": prompts, "checkpoints": ["base", str(run_checkpoint.parent),
                                                                          str(weights_file)]}


def scores_only(results: dict) -> dict:
    """results.json without the timings (which differ from run to run)."""
    return {label: {k: v for k, v in entry.items() if k != "seconds_per_video"}
            for label, entry in results["checkpoints"].items()}
