"""Shuffled test order (``--shuffle-seed N`` or ``SAGE_TEST_SHUFFLE_SEED=N``; docs/testing.md "Test order"): a test
whose result depends on what ran before it in the process shows up as a failure in some order.

The order is permuted at every level that keeps fixtures shared as pytest shares them: the files, then within a file
the groups of tests that share a module- or class-scoped fixture's parameter (or a class), then the tests of each
group. A fixture of a wider scope is set up once per file or group as in the plain order, so a shuffled run costs the
same time. One seed gives one order, on every machine (the items' node ids are sorted before the permutation).
"""

import os
import random
from collections import defaultdict
from typing import Dict, List, Optional

SEED_ENV = "SAGE_TEST_SHUFFLE_SEED"


def shuffle_seed(option: Optional[str]) -> Optional[int]:
    """The seed of ``--shuffle-seed`` or, without it, of ``SAGE_TEST_SHUFFLE_SEED`` (None: pytest's own order)."""
    value = option if option is not None else os.environ.get(SEED_ENV, "").strip() or None
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"the test shuffle seed must be a non-negative integer (--shuffle-seed or {SEED_ENV}), "
                         f"got {value!r}")
    return int(value)


def _group_key(item) -> tuple:
    """What the item shares with its neighbours: its class and the parameters of its wider-scoped fixtures."""
    callspec = getattr(item, "callspec", None)
    shared = []
    if callspec is not None:
        definitions = item._fixtureinfo.name2fixturedefs
        for name, index in sorted(callspec.indices.items()):
            scope = definitions[name][-1].scope if name in definitions else "function"
            if scope != "function":
                shared.append((name, index))
    cls = getattr(item, "cls", None)
    if cls is None and not shared:
        return ("alone", item.nodeid)  # nothing shared: a group of its own
    return (cls.__qualname__ if cls is not None else "", tuple(shared))


def shuffled(items: List, seed: int) -> List:
    """``items`` permuted by ``seed`` file by file, group by group (module docstring)."""
    rng = random.Random(seed)
    files: Dict[str, Dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    for item in sorted(items, key=lambda i: i.nodeid):
        files[item.nodeid.split("::")[0]][_group_key(item)].append(item)
    order = []
    names = sorted(files)
    rng.shuffle(names)
    for name in names:
        groups = list(files[name].values())
        rng.shuffle(groups)
        for group in groups:
            rng.shuffle(group)
            order += group
    return order
