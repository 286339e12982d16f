"""Check a checkpoint root against the expected layout (for ``download_weights.sh`` and humans).

    python -m sage_grpo.cli.verify --model_root ckpts [--transformer_versions 480p_t2v 720p_t2v] [--reward]
    python -m sage_grpo.cli.verify --model_root ckpts --missing_components [--reward]
    python -m sage_grpo.cli.verify --published --transformer_versions 480p_t2v 720p_t2v

Prints ``complete`` (exit 0) or every missing file (exit 1). ``--reward`` also checks ``VideoReward/`` the way the
reward loader does (model_config.json, a checkpoint-N/ with its weights, and the base model it names).
``--missing_components`` prints, one per line, the component folders that are incomplete (``transformer/<version>``,
``vae``, ..., ``VideoReward``, and the optional per-version sampling configs ``variants/<version>/guider`` and
``variants/<version>/scheduler``) and exits 0: the download script fetches exactly those.
``--published`` only checks that every version is one published in diffusers format (exit 2 with one line naming
those that are, before the download script fetches anything). The table is
:mod:`sage_grpo.models.layout`.
"""

import argparse
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from sage_grpo.models.layout import (DEFAULT_TRANSFORMER_VERSION, REWARD_DIR, MissingCheckpointError, check_layout,
                                     check_published_versions, missing_files, required_layouts,
                                     variant_config_layouts)


def reward_problems(root: Path) -> List[str]:
    """What the VideoReward loader would report missing under ``root`` (empty when it can load)."""
    from sage_grpo.rewards.videoalign_checkpoint import resolve_checkpoint

    try:
        resolve_checkpoint(root)
    except FileNotFoundError as err:
        return [str(err)]
    return []


def missing_components(root: Path, versions: Sequence[str], reward: bool) -> List[str]:
    """Component folders (layout subdirs) that are absent or incomplete, the versions' optional sampling configs
    included (the loader does without them; a download fetches them)."""
    layouts = required_layouts(versions, reward=False) + [c for v in versions for c in variant_config_layouts(v)]
    incomplete = [spec.subdir for spec in layouts if missing_files(root, spec)]
    if reward and reward_problems(root):
        incomplete.append(REWARD_DIR)
    return incomplete


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Check a HunyuanVideo-1.5 checkpoint root against the layout.")
    parser.add_argument("--model_root", default="./ckpts")
    parser.add_argument("--transformer_versions", nargs="+", default=[DEFAULT_TRANSFORMER_VERSION])
    parser.add_argument("--reward", action="store_true", help="also require a loadable VideoReward/")
    parser.add_argument("--missing_components", action="store_true",
                        help="print the incomplete component folders, one per line, and exit 0")
    parser.add_argument("--published", action="store_true",
                        help="only check that every version is published in diffusers format (exit 2 if not)")
    args = parser.parse_args(argv)
    if args.published:
        try:
            check_published_versions(args.transformer_versions)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        return 0
    root = Path(args.model_root)
    if args.missing_components:
        for component in missing_components(root, args.transformer_versions, args.reward):
            print(component)
        return 0
    try:
        check_layout(root, required_layouts(args.transformer_versions))
    except MissingCheckpointError as err:
        print(err, file=sys.stderr)
        for problem in reward_problems(root) if args.reward else []:
            print(problem, file=sys.stderr)
        return 1
    problems = reward_problems(root) if args.reward else []
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    parts = list(args.transformer_versions) + (["VideoReward"] if args.reward else [])
    print(f"{args.model_root}: complete ({', '.join(parts)})")
    return 0


if __name__ == "__main__":
    from sage_grpo.config.command import run_module

    run_module("sage_grpo.cli.verify", main)
