"""Test-wide settings: never touch the hub, keep thread counts small on the 2-core CI machine."""
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

torch.set_num_threads(2)

# Test tiers (README "Tests"): pick one with -m, e.g. `bash scripts/test.sh -m unit` for the fast loop.
TIERS = {
    "unit": "fast in-process tests of one module on tiny real-class configs (every test not marked otherwise)",
    "e2e": "whole-loop runs of the real entry points (post_train.py, generate.py, the download and export scripts)",
    "distributed": "multi-process runs under torchrun on gloo (2 and 4 processes on the CPU)",
}


def pytest_configure(config):
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if not any(item.get_closest_marker(name) for name in ("e2e", "distributed")):
            item.add_marker(pytest.mark.unit)


# ---------------------------------------------------------------- the tiny checkpoint, shared by every test module
import pytest  # noqa: E402

from model_fixtures import TINY_TEXT, tiny_checkpoint, tiny_i2v_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_i2v_root(tmp_path_factory):
    return tiny_i2v_checkpoint(tmp_path_factory)


@pytest.fixture(scope="module")
def tiny_components(tiny_root):
    from sage_grpo.models import load_components

    return load_components(tiny_root, dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny_encoder(tiny_components):
    from sage_grpo.models import PromptEncoder

    return PromptEncoder.from_components(tiny_components, TINY_TEXT)
