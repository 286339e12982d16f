"""The documentation's ``run`` blocks run for real on the CPU (tests/doc_commands_support.py): post_train.py on the
session's tiny checkpoint for one cheap step, the memory plan, launchers in their dry-run mode. A documented command
that no longer works fails here; tests/unit/test_doc_commands.py parses every other block."""

import json
import sys

import pytest
from doc_commands_support import all_blocks, check_block, page_sandbox, run_copied

BLOCKS, _ = all_blocks()
RUN = {}  # a block documented on several pages runs once
for found in BLOCKS:
    if found.mode == "run":
        RUN.setdefault(found.text, found)
COPY_RUN = [found for found in BLOCKS if found.mode == "copy-run"]


@pytest.mark.parametrize("block", list(RUN.values()), ids=[block.id for block in RUN.values()])
def test_documented_command_runs(block, tiny_root, tmp_path):
    sandbox = page_sandbox(tmp_path / "checkout", block, BLOCKS, tiny_root)
    assert check_block(block, sandbox) >= 1
    if "mypkg.rewards:my_reward" in block.text:  # the custom reward of docs/configuration.md trained a step
        run = sandbox / "outputs" / "tiny_cpu"
        (row,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        score = row["gathered_mypkg.rewards:my_reward_score_reward_mean"]  # the mean pixel value of the videos
        assert row["step"] == 1 and 0.0 < score < 1.0 and row["gathered_avg_reward_mean"] == score  # weight 1.0
        assert (run / "checkpoint-1").is_dir()
        assert not [name for name in sys.modules if name.startswith("mypkg")]  # the plug-in left with its sandbox


@pytest.mark.parametrize("block", COPY_RUN, ids=[block.id for block in COPY_RUN])
def test_documented_recipe_runs_in_a_copy_of_the_package(block, tiny_root, tmp_path):
    """A contributor recipe (a new module plus one table line) applied to a copy of the package, then its run: the
    new entries are used by a tiny training run (CONTRIBUTING.md)."""
    sandbox = page_sandbox(tmp_path / "checkout", block, BLOCKS, tiny_root)
    run_copied(block, sandbox, timeout=600)
