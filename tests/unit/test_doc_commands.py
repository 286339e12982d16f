"""Every command block of README.md, ckpts/README.md and docs/*.md is checked as its marker says
(tests/doc_commands_support.py): here the markers, every command parsed (a Python entry point's argument parser and
config validation accept it; a launcher's dry run, off a cluster, prints post_train.py lines that parse), and the
check itself on deliberately broken examples. tests/e2e/test_doc_commands_run.py runs the ``run`` blocks for real."""

import dataclasses
from pathlib import Path

import pytest
from doc_commands_support import CommandFailed, all_blocks, check_block, read_blocks

BLOCKS, PROBLEMS = all_blocks()
CHECKED = [block if block.mode != "run" else dataclasses.replace(block, mode="dry-run")  # run for real in e2e
           for block in BLOCKS if block.mode in ("run", "dry-run", "parse", "file", "line", "copy-run")]


def test_every_block_is_marked_and_every_command_fenced():
    assert PROBLEMS == []
    modes = [block.mode for block in BLOCKS]
    assert len(BLOCKS) >= 40 and modes.count("run") >= 3 and modes.count("dry-run") >= 8


@pytest.mark.parametrize("block", CHECKED, ids=[block.id for block in CHECKED])
def test_documented_commands_parse(block):
    check_block(block)


BROKEN = """\
<!-- check: parse: GPU -->
```bash
python post_train.py --sde_type sage_grpoo
```

<!-- check: dry-run -->
```bash
bash run_post_train.sh --kl_weigth 1e-5
```

<!-- check: parse: GPU -->
```bash
python post_train.py --config configs/tiny_cpu.yaml --sp_size 3
```

<!-- check: parse: GPU -->
```bash
python generate.py --resolution 540p
```

<!-- check: dry-run -->
```bash
OUTPUT_DIR=./outputs/run1 sbatch --nodes 2 scripts/post_train/no_such.sbatch
```

```bash
python post_train.py --help
```

    python post_train.py --config configs/tiny_cpu.yaml
"""


def test_a_broken_command_fails_the_check():
    """The check on a page of broken commands: each fails with the block's place and what is wrong."""
    blocks, problems = read_blocks(Path("docs/broken.md"), BROKEN)
    assert problems == [
        "docs/broken.md:26: a fenced block without a check marker: put <!-- check: run | dry-run | parse: REASON | "
        "skip: REASON | file PATH --> on the line before it (tests/doc_commands_support.py)",
        "docs/broken.md:30: an indented command: fence it (```bash) and put a check marker on the line before"]
    expected = [
        ("docs/broken.md:2: python post_train.py --sde_type sage_grpoo", "argument --sde_type: invalid choice: "
         "'sage_grpoo' (choose from 'sage_grpo', 'dance_grpo', 'flow_grpo', 'cps')"),
        ("docs/broken.md:7: bash run_post_train.sh --kl_weigth 1e-5", "unrecognized arguments: --kl_weigth 1e-5"),
        ("docs/broken.md:12: python post_train.py --config configs/tiny_cpu.yaml --sp_size 3",
         "the configuration is refused at world size 1: [sp-divides-world] --sp_size 3 must divide the world size 1"),
        ("docs/broken.md:17: python generate.py --resolution 540p", "argument --resolution: invalid choice: '540p'"),
        ("docs/broken.md:22: sbatch --nodes 2 scripts/post_train/no_such.sbatch",
         "the dry run of scripts/post_train/no_such.sbatch exited 127"),
    ]
    assert len(blocks) == len(expected)
    for block, (where, why) in zip(blocks, expected):
        with pytest.raises(CommandFailed) as failed:
            check_block(block)
        assert str(failed.value).startswith(where + "\n  ") and why in str(failed.value), str(failed.value)
