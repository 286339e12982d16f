"""Train the toy-world checkpoint (sage_grpo/toy): the real HunyuanVideo-1.5 classes in the real layout, pretrained
from scratch on the CPU on videos of one moving disk; or install the committed one (what the demo reads).

    python scripts/make_toy_checkpoint.py --committed --output ckpts/toy     # the committed one, in a second
    python scripts/make_toy_checkpoint.py --output ckpts/toy [--seed 0] [--vae_steps 900 --flow_steps 1000]
    python scripts/make_toy_checkpoint.py --output ckpts/toy_build --commit_to assets/toy_ckpt   # rebuild the committed

--committed checks the committed checkpoint (assets/toy_ckpt: every file against its sha256 in checksums.json) and
writes its full form to --output; run again, it only checks what is there. Training takes a few minutes on 2 cores
and gives a slightly different checkpoint on each machine (so the demo reads the committed one). --commit_to also
writes the committed form of the trained checkpoint (sage_grpo/toy/committed.py), with this command recorded; an
--output that already holds a complete trained checkpoint is packed without training again.

Either way the checkpoint is built in a temporary folder next to ``--output`` and moved into place only when complete
(``.complete`` marker), so an interrupted run leaves nothing half-written behind and an existing complete checkpoint
is never touched (pass --force to rebuild it; the old one is replaced only after the new one is complete); an
--output that exists and is not a toy checkpoint is refused before anything runs (it would be deleted). The
evaluation of a trained checkpoint (manifold error and prompt adherence of the model's samples against true toy
videos, VAE reconstructions and a random model) is printed and saved as ``toy_report.json`` in the checkpoint.
"""

import argparse
import json
import shlex
import shutil
import sys
import time
from dataclasses import asdict, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_grpo.toy.pretrain import COMPLETE_MARKER, PretrainSettings  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="ckpts/toy", help="checkpoint root to write")
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete checkpoint exists")
    parser.add_argument("--committed", action="store_true",
                        help="install the committed checkpoint (assets/toy_ckpt) instead of training one")
    parser.add_argument("--commit_to", default=None,
                        help="also write the committed form of the trained checkpoint here (assets/toy_ckpt)")
    for field in fields(PretrainSettings):
        parser.add_argument(f"--{field.name}", type=type(field.default), default=field.default,
                            help=f"(default {field.default})")
    return parser


def settings_of(args) -> PretrainSettings:
    return PretrainSettings(**{f.name: getattr(args, f.name) for f in fields(PretrainSettings)})


def recorded_command(args, *extra: str) -> str:
    """The command line that trains what ``args`` asks for, every setting spelled out, then ``extra``."""
    words = ["python", "scripts/make_toy_checkpoint.py", "--output", args.output]
    for field in fields(PretrainSettings):
        words += [f"--{field.name}", str(getattr(args, field.name))]
    return " ".join(shlex.quote(w) for w in words + list(extra))


def refuse_commit_to(args, output: Path) -> bool:
    """True (after one line on stderr) when --commit_to would replace something that is not a committed checkpoint,
    or would record settings other than those the complete --output was trained with."""
    from sage_grpo.safe_io import read_json_object
    from sage_grpo.toy.committed import BUILD_FILE
    from sage_grpo.toy.pretrain import REPORT_FILE

    target = Path(args.commit_to)
    if target.exists() and not (target / BUILD_FILE).is_file() and (not target.is_dir() or any(target.iterdir())):
        print(f"error: --commit_to {target} exists and is not a committed toy checkpoint (no {BUILD_FILE}); it would "
              "be replaced. Choose a new folder, e.g. --commit_to assets/toy_ckpt", file=sys.stderr)
        return True
    if (output / COMPLETE_MARKER).is_file() and not args.force:
        trained = read_json_object(output / REPORT_FILE, "the toy report").get("settings")
        if trained != asdict(settings_of(args)):
            print(f"error: {output} was trained with other settings ({trained}) than this command's; pass them, "
                  "or --force to train again", file=sys.stderr)
            return True
    return False


def refuse_foreign_output(output: Path) -> bool:
    """True (after one line on stderr) when --output exists and is not a toy checkpoint: it would be replaced."""
    if output.exists() and not (output / COMPLETE_MARKER).is_file() and (not output.is_dir() or any(output.iterdir())):
        print(f"error: --output {output} exists and is not a toy checkpoint (no {COMPLETE_MARKER}); it would be "
              "deleted and replaced. Choose a new folder, e.g. --output ckpts/toy", file=sys.stderr)
        return True
    return False


def install_committed(output: Path, force: bool) -> int:
    """--committed: check assets/toy_ckpt and write its full form to ``output`` (or check the one there)."""
    from sage_grpo.models.checksums import verify_checksums
    from sage_grpo.safe_io import CheckpointError
    from sage_grpo.toy.committed import COMMITTED, install, is_current_install, is_replaceable_install

    try:
        if is_current_install(output) and not force:
            verify_checksums(output)
            print(f"{output} holds the committed toy checkpoint ({COMMITTED.name}), every file as recorded")
            return 0
        if (output / COMPLETE_MARKER).is_file() and not force and not is_replaceable_install(output):
            print(f"error: {output} holds a toy checkpoint that is not the committed one (trained on this machine, "
                  f"or changed); the demo's numbers are the committed one's: move it away (mv {output} "
                  f"{output}_local) or pass --force to replace it", file=sys.stderr)
            return 2
        start = time.perf_counter()
        install(output, COMMITTED)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote the committed toy checkpoint to {output} in {time.perf_counter() - start:.1f} s")
    return 0


def train(args, output: Path) -> int:
    from sage_grpo.models.checksums import write_checksums
    from sage_grpo.toy.pretrain import write_toy_checkpoint

    output.parent.mkdir(parents=True, exist_ok=True)
    staging = output.parent / f".{output.name}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    start = time.perf_counter()
    print(f"training the toy checkpoint into {output} (about 4 minutes on 2 cores)", flush=True)
    report = write_toy_checkpoint(staging, settings_of(args), log=lambda message: print(message, flush=True))
    write_checksums(staging, f"rebuild it: {recorded_command(args, '--force')}")
    if output.exists():
        shutil.rmtree(output)
    staging.rename(output)
    print(json.dumps(report["evaluation"], indent=2))
    print(f"wrote the toy checkpoint to {output} in {time.perf_counter() - start:.0f} s")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    output = Path(args.output)
    if args.committed and args.commit_to:
        print("error: --committed installs the committed checkpoint and --commit_to rebuilds it; pass one",
              file=sys.stderr)
        return 2
    if refuse_foreign_output(output) or (args.commit_to and refuse_commit_to(args, output)):
        return 2
    if args.committed:
        return install_committed(output, args.force)
    if (output / COMPLETE_MARKER).is_file() and not args.force:
        print(f"{output} already holds a complete toy checkpoint (pass --force to rebuild it)")
    elif train(args, output):
        return 2
    if args.commit_to:
        from sage_grpo.toy.committed import pack

        record = pack(output, Path(args.commit_to), recorded_command(args, "--commit_to", args.commit_to))
        print(f"wrote the committed form of {output} to {args.commit_to} (recorded: {record['command']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
