"""Train the toy-world checkpoint (sage_grpo/studies/pretrain.py): the real HunyuanVideo-1.5 classes in the real layout,
pretrained from scratch on the CPU on videos of one moving disk (sage_grpo/toy).

    python scripts/make_toy_checkpoint.py --output ckpts/toy [--seed 0] [--vae_steps 900 --flow_steps 1000]

Takes a few minutes on 2 cores. The checkpoint is built in a temporary folder next to ``--output`` and moved into
place only when complete (``.complete`` marker), so an interrupted run leaves nothing half-written behind and an
existing complete checkpoint is never touched (pass --force to rebuild it; the old one is replaced only after the new
one is complete); an --output that exists and is not a toy checkpoint is refused before training (it would be
deleted). The evaluation (manifold error and prompt adherence of the model's samples against true toy videos,
VAE reconstructions and a random model) is printed and saved as ``toy_report.json`` in the checkpoint.
"""

import argparse
import json
import shutil
import sys
import time
from dataclasses import fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.studies.pretrain import COMPLETE_MARKER, PretrainSettings, write_toy_checkpoint  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="ckpts/toy", help="checkpoint root to write")
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete checkpoint exists")
    for field in fields(PretrainSettings):
        parser.add_argument(f"--{field.name}", type=type(field.default), default=field.default,
                            help=f"(default {field.default})")
    args = parser.parse_args(argv)
    output = Path(args.output)
    if (output / COMPLETE_MARKER).is_file() and not args.force:
        print(f"{output} already holds a complete toy checkpoint (pass --force to rebuild it)")
        return 0
    if output.exists() and not (output / COMPLETE_MARKER).is_file() and (not output.is_dir() or any(output.iterdir())):
        # the finished checkpoint replaces --output: only a toy checkpoint (or nothing) may be there
        print(f"error: --output {output} exists and is not a toy checkpoint (no {COMPLETE_MARKER}); it would be "
              "deleted and replaced. Choose a new folder, e.g. --output ckpts/toy", file=sys.stderr)
        return 2
    settings = PretrainSettings(**{f.name: getattr(args, f.name) for f in fields(PretrainSettings)})
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    start = time.perf_counter()
    print(f"training the toy checkpoint into {output} (about 4 minutes on 2 cores)", flush=True)
    report = write_toy_checkpoint(staging, settings, log=lambda message: print(message, flush=True))
    if output.exists():
        shutil.rmtree(output)
    staging.rename(output)
    print(json.dumps(report["evaluation"], indent=2))
    print(f"wrote the toy checkpoint to {output} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
