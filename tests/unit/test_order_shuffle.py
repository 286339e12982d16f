"""The shuffled test order (tests/order_shuffle.py): one seed, one order; files and the tests that share a wider
fixture's parameter stay together, so a shuffled run sets each fixture up as often as the plain one."""
from types import SimpleNamespace

import pytest

from order_shuffle import shuffle_seed, shuffled


def _item(nodeid: str, shared_param: int | None = None):
    definitions = {"simulated": [SimpleNamespace(scope="module")], "x": [SimpleNamespace(scope="function")]}
    callspec = None if shared_param is None else SimpleNamespace(indices={"simulated": shared_param, "x": 0})
    return SimpleNamespace(nodeid=nodeid, cls=None, callspec=callspec,
                           _fixtureinfo=SimpleNamespace(name2fixturedefs=definitions))


ITEMS = ([_item(f"tests/unit/test_a.py::test_{i}") for i in range(6)]
         + [_item(f"tests/unit/test_b.py::test_{name}[{p}]", p) for p in range(3) for name in ("x", "y", "z")]
         + [_item(f"tests/unit/test_c.py::test_{i}") for i in range(4)])


def test_one_seed_gives_one_order_and_seeds_differ():
    orders = {seed: [i.nodeid for i in shuffled(list(ITEMS), seed)] for seed in range(5)}
    assert [i.nodeid for i in shuffled(list(reversed(ITEMS)), 3)] == orders[3]  # not the collection order's
    assert sorted(orders[0]) == sorted(i.nodeid for i in ITEMS)
    assert len({tuple(order) for order in orders.values()}) == 5


@pytest.mark.parametrize("seed", range(5))
def test_files_and_shared_parameters_stay_together(seed):
    order = [i.nodeid for i in shuffled(list(ITEMS), seed)]
    files = [nodeid.split("::")[0] for nodeid in order]
    assert len([f for k, f in enumerate(files) if k == 0 or files[k - 1] != f]) == 3  # each file in one run
    params = [nodeid[-2] for nodeid in order if "test_b" in nodeid]
    assert len([p for k, p in enumerate(params) if k == 0 or params[k - 1] != p]) == 3  # each parameter once


def test_the_seed_comes_from_the_option_or_the_environment(monkeypatch):
    monkeypatch.delenv("SAGE_TEST_SHUFFLE_SEED", raising=False)
    assert shuffle_seed(None) is None and shuffle_seed("7") == 7
    monkeypatch.setenv("SAGE_TEST_SHUFFLE_SEED", "11")
    assert shuffle_seed(None) == 11 and shuffle_seed("7") == 7
    with pytest.raises(ValueError, match="non-negative integer"):
        shuffle_seed("-1")


@pytest.mark.parametrize("leaves", [1, 3])
def test_every_test_starts_at_the_suites_thread_count(leaves):
    """conftest.py puts torch's thread count back after every test: a test (post_train's CPU policy) that left it at
    1 once moved the golden run's sums when a shuffled order ran it first. Whichever parameter runs second finds the
    suite's count, not the one the first left."""
    import torch

    from conftest import TEST_THREADS

    assert torch.get_num_threads() == TEST_THREADS
    torch.set_num_threads(leaves)  # left for the next test; the fixture restores it
