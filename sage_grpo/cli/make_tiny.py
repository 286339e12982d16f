"""Write a tiny random-weight HunyuanVideo-1.5 checkpoint (same classes and layout as the real one) for CPU tests.

    sage-grpo make-tiny --output ckpts/tiny [--seed 0] [--versions 480p_t2v 720p_t2v 480p_i2v]
    python scripts/make_tiny_checkpoint.py --output ckpts/tiny ...       (the same command)

An image-to-video version (480p_i2v, ...) adds the tiny SigLIP image encoder and its processor.

    python scripts/make_tiny_checkpoint.py --output /tmp/real8 --real_width_blocks 8 [--vae real|narrow]

writes instead HunyuanVideo-1.5's real-width transformer with 8 of its 54 blocks, the released VAE configuration
(``narrow``: its latent shapes on narrow layers) and tiny text encoders of the real widths, in bf16
(sage_grpo/models/real_width.py; 1.4 GB for 8 blocks, 2.5 GB more for the real VAE), for the benchmarks'
``--checkpoint_root``.

    sage-grpo make-tiny --output ckpts/tiny --eval_scorers

also writes tiny random-weight CLIP and PickScore models (clip-vit-large-patch14/, PickScore_v1/ and its processor
CLIP-ViT-H-14-laion2B-s32B-b79K/) for ``python -m sage_grpo.evaluate --metrics clipscore,pickscore``.

Takes a few seconds and a few MB per transformer version; a seed always gives identical files. See ckpts/README.md.
An ``--output`` that already holds a model this command did not write (the downloaded weights in ``ckpts/``, the
default) is refused before anything is written: random weights would replace them.
"""

import argparse
import sys
import time
from pathlib import Path

from sage_grpo.models import layout
from sage_grpo.models.layout import DEFAULT_TRANSFORMER_VERSION
from sage_grpo.models.real_width import VAE_CONFIGS, write_real_width_hunyuan
from sage_grpo.models.tiny import write_tiny_hunyuan


def write_tiny_reward(root: Path, seed: int) -> bool:
    """Hook: the tiny VideoReward model (``<root>/VideoReward``), written by ``sage_grpo.rewards.tiny`` if present."""
    try:
        from sage_grpo.rewards.tiny import write_tiny_video_reward
    except ImportError:
        return False
    write_tiny_video_reward(root, seed=seed)
    return True


MARKER = ".written_by_make_tiny"  # a root this command wrote: writing it again replaces only random weights
MODEL_FOLDERS = {component.subdir.split("/")[0] for component in (
    layout.VAE, layout.SCHEDULER, layout.VIDEO_REWARD, *layout.TEXT_COMPONENTS, *layout.IMAGE_COMPONENTS)} | {
    layout.TRANSFORMER_DIR, layout.VARIANTS_DIR}


def check_output(output: Path) -> None:
    """Refuse an ``--output`` that is a file, or that holds a model's folders this command did not write."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output {output} is a file; pass a folder")
    if not output.is_dir() or (output / MARKER).is_file():
        return
    found = sorted(path.name for path in output.iterdir() if path.name in MODEL_FOLDERS)
    if found:
        raise ValueError(f"--output {output} already holds a model that make-tiny did not write ({', '.join(found)}): "
                         "its weights would be replaced by random ones. Choose a new folder, e.g. --output ckpts/tiny")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="ckpts", help="checkpoint root to write (created if needed)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument("--versions", nargs="+", default=[DEFAULT_TRANSFORMER_VERSION],
                        help="transformer versions to write under transformer/")
    parser.add_argument("--no_reward", action="store_true", help="skip the tiny VideoReward model")
    parser.add_argument("--eval_scorers", action="store_true",
                        help="also write the tiny CLIPScore and PickScore models (sage_grpo/rewards/tiny.py)")
    parser.add_argument("--real_width_blocks", type=int, default=None,
                        help="write the real-width transformer with this many dual-stream blocks instead")
    parser.add_argument("--vae", choices=tuple(VAE_CONFIGS), default="real",
                        help="VAE of a --real_width_blocks checkpoint: the released configuration or the narrow one")
    args = parser.parse_args(argv)
    try:
        check_output(Path(args.output))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    Path(args.output).mkdir(parents=True, exist_ok=True)
    (Path(args.output) / MARKER).write_text("written by sage-grpo make-tiny\n")  # first: a rerun may finish it
    start = time.perf_counter()
    if args.real_width_blocks is not None:
        root = write_real_width_hunyuan(args.output, num_layers=args.real_width_blocks, seed=args.seed,
                                        versions=tuple(args.versions), vae_config=VAE_CONFIGS[args.vae])
        if not args.no_reward:
            write_tiny_reward(root, args.seed)
        print(f"wrote real-width checkpoint ({args.real_width_blocks} blocks, {args.vae} VAE) to {root} in "
              f"{time.perf_counter() - start:.1f} s")
        return 0
    root = write_tiny_hunyuan(args.output, seed=args.seed, versions=tuple(args.versions))
    reward = False if args.no_reward else write_tiny_reward(root, args.seed)
    if args.eval_scorers:
        from sage_grpo.rewards.tiny import write_tiny_clip_scorers

        write_tiny_clip_scorers(root, seed=args.seed)
    extras = (", VideoReward" if reward else "") + (", CLIP, PickScore" if args.eval_scorers else "")
    print(f"wrote tiny checkpoint to {root} ({', '.join(args.versions)}{extras}) in {time.perf_counter() - start:.1f} s")
    return 0

