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

import pytest  # noqa: E402
import torch  # noqa: E402

from order_shuffle import SEED_ENV, shuffle_seed, shuffled  # noqa: E402

TEST_THREADS = 2
torch.set_num_threads(TEST_THREADS)


def _threads_as_found():
    """Puts torch's thread count back as it was found: the thread count decides how CPU sums are split, so the exact
    comparisons (the golden run) depend on it, and code under test sets it (post_train's CPU policy,
    ``apply_cpu_thread_policy``, picks 1 thread; a shuffled order once ran the golden test after such a test)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


# After every test (the suite's 2, or the 1 a module's own fixture sets for all its tests), and after every module (a
# module fixture that runs post_train's entry point leaves 1 thread; the next module would start with it).
_threads_per_test = pytest.fixture(autouse=True, name="_threads_per_test")(_threads_as_found)
_threads_per_module = pytest.fixture(autouse=True, scope="module", name="_threads_per_module")(_threads_as_found)

# The tables a researcher extends (docs/layout.md, "Tables"): a test that adds a line (register_reward, a toy SDE)
# must not leave it for the tests after it, in any order.
PLUGIN_TABLES = (("sage_grpo.rewards.registry", "REWARDS"), ("sage_grpo.rewards.scorers", "HELD_OUT_SCORERS"),
                 ("sage_grpo.sde.registry", "SDE_KERNELS"), ("sage_grpo.rl.kl_controllers", "KL_CONTROLLERS"),
                 ("sage_grpo.pipeline.drift_proxies", "DRIFT_PROXIES"))


@pytest.fixture(autouse=True)
def _plugin_tables_as_found():
    """Puts every loaded plug-in table back as the test found it (in place: modules hold references to them)."""
    found = [(table, dict(table)) for table in _loaded_tables()]
    yield
    for table, entries in found:
        table.clear()
        table.update(entries)


def _loaded_tables() -> list:
    return [getattr(sys.modules[module], name) for module, name in PLUGIN_TABLES
            if module in sys.modules and isinstance(getattr(sys.modules[module], name, None), dict)]


# Test tiers (docs/testing.md, "Tiers"): pick one with -m, e.g. `bash scripts/test.sh -m unit` for the fast loop.
TIERS = {
    "unit": "fast in-process tests of one module on tiny real-class configs (tests/unit/)",
    "e2e": "whole-loop runs of the real entry points (post_train.py, generate.py, the download and export scripts; "
           "tests/e2e/)",
    "distributed": "multi-process runs under torchrun on gloo (2 and 4 processes on the CPU; tests/distributed/)",
    "device": "runs on the device given by --device; CI runs it on the CPU (unit tests marked by hand)",
}


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", help="device of the tests marked 'device': cpu (default), cuda, "
                     "cuda:1; e.g. bash scripts/test.sh --device cuda -m device")
    parser.addoption("--shuffle-seed", default=None, help="run the tests in an order permuted by this seed (default: "
                     "the environment variable SAGE_TEST_SHUFFLE_SEED, else pytest's order; docs/testing.md)")


def parse_test_device(name: str) -> torch.device:
    """The torch.device of ``--device``: the CPU, or a CUDA device that exists here."""
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"--device {name!r} is not a torch device ({error}); use cpu, cuda or cuda:N") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"--device {name!r}: the device tests run on cpu or cuda[:N], not {device.type}")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {name!r} asks for CUDA, which this torch ({torch.__version__}) cannot use on "
                         "this machine; run with --device cpu")
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        raise ValueError(f"--device {name!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())


def pytest_configure(config):
    for name, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {meaning}")
    try:
        config.test_device = parse_test_device(config.getoption("--device"))
        config.shuffle_seed = shuffle_seed(config.getoption("--shuffle-seed"))
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_report_header(config):
    if config.shuffle_seed is not None:
        return f"test order shuffled with seed {config.shuffle_seed} (--shuffle-seed, {SEED_ENV})"
    return None


TESTS_ROOT = Path(__file__).resolve().parent
FOLDER_TIERS = ("unit", "e2e", "distributed")  # tests/<tier>/ holds that tier's tests; `device` is marked per test


def tier_of(path: Path) -> str:
    """The tier of a test file: the tests/ folder it sits in."""
    folder = Path(path).resolve().relative_to(TESTS_ROOT).parts[0]
    if folder not in FOLDER_TIERS:
        raise ValueError(f"{path}: test files live in tests/unit/, tests/e2e/ or tests/distributed/")
    return folder


def pytest_itemcollected(item):
    item.add_marker(getattr(pytest.mark, tier_of(item.path)))


@pytest.hookimpl(trylast=True)  # after -m's selection and pytest's grouping by the fixtures' parameters
def pytest_collection_modifyitems(config, items):
    if config.shuffle_seed is not None:
        items[:] = shuffled(items, config.shuffle_seed)


# ---------------------------------------------------------------- the tiny checkpoint, shared by every test module
from model_fixtures import TINY_TEXT, tiny_checkpoint, tiny_i2v_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    """The device of ``--device`` (default: the CPU), with an index when it is CUDA (tensors report cuda:0)."""
    return pytestconfig.test_device


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_i2v_root(tmp_path_factory):
    return tiny_i2v_checkpoint(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_reward_root(tmp_path_factory):
    """A root holding only the tiny VideoReward checkpoint (legacy key layout, seed 0), shared by every test that
    scores with it; read-only: copy it to change it."""
    from sage_grpo.rewards.tiny import write_tiny_video_reward

    root = tmp_path_factory.mktemp("tiny_reward")
    write_tiny_video_reward(root, seed=0, key_layout="legacy")
    return root


@pytest.fixture(scope="module")
def tiny_components(tiny_root):
    from sage_grpo.models import load_components

    return load_components(tiny_root, dtype=torch.float32)


@pytest.fixture(scope="module")
def tiny_encoder(tiny_components):
    from sage_grpo.models import PromptEncoder

    return PromptEncoder.from_components(tiny_components, TINY_TEXT)


@pytest.fixture
def offline_trackers(tmp_path, monkeypatch):
    """wandb and SwanLab keep everything under tmp_path and never reach the network."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab_home"))
    monkeypatch.delenv("SWANLAB_LOG_DIR", raising=False)
