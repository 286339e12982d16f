"""The project speaks of itself alone: no tracked text file cites notes a user does not have (it cites
docs/reference.md), numbers a tracker's issue, or speaks of how a machine was obtained.

The patterns are written so that none matches its own source (a bracket splits each word), so this file is scanned too.
"""

import re
from pathlib import Path

import pytest

from procs import run_group

REPO_ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "notes outside the repository": re.compile(r"reference[_]spec|\b(?:spec|feasibility(?: note)?|reference) [§]\d"),
    "an issue number": re.compile(r"\bissu[e]\s+#?\d+", re.IGNORECASE),
    "how a machine was obtained": re.compile(
        r"\ble[n]t\b|\ble[n]ding\b|\ble[a]se[sd]?\b|device[ ]tools?|not[_]drawn|give[_]back|budget[_]left_s",
        re.IGNORECASE),
}


def voice_breaks(name: str, text: str) -> list[str]:
    """``name:line: what (the words)`` for every forbidden phrase of ``text``."""
    found = []
    for what, pattern in FORBIDDEN.items():
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{name}:{line}: {what} ({match.group(0)!r})")
    return sorted(found)


def tracked_texts(root: Path) -> dict[str, str]:
    """Every file of ``root`` that git tracks or would track (not ignored) and that is UTF-8 text (no NUL byte), by
    its path in the repository."""
    proc = run_group(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root, timeout=60,
                     text=False)
    assert proc.returncode == 0, proc.stderr
    texts = {}
    for name in proc.stdout.decode().split("\0"):
        path = root / name
        if not name or not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue
        try:
            texts[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return texts


@pytest.mark.skipif(not (REPO_ROOT / ".git").exists(), reason="not a git checkout (the device machine's copy)")
def test_no_tracked_file_cites_outside_notes_issue_numbers_or_machine_loans():
    texts = tracked_texts(REPO_ROOT)
    assert "README.md" in texts and "sage_grpo/trainer.py" in texts and "tests/unit/test_own_voice.py" in texts
    assert [line for name, text in texts.items() for line in voice_breaks(name, text)] == []


# Each example's forbidden words are split by a "·" the test removes, so that the scan above passes over them.
@pytest.mark.parametrize("text, what", [
    ("Layout (reference_·spec ·§2.2).", "notes outside the repository"),
    ("accumulation (spec ·§10.20); the trainer", "notes outside the repository"),
    ("the options of generate.py (reference ·§1.4)", "notes outside the repository"),
    ("diffusers test configs (feasibility note ·§2):", "notes outside the repository"),
    ("Part B of issue· 23 shrinks these", "an issue number"),
    ("with issue· 36's 2 replayed steps", "an issue number"),
    ("Fixed in Issue· #33.", "an issue number"),
    ("then (issue·\n    36) the reward", "an issue number"),
    ("the machine le·nt to this task", "how a machine was obtained"),
    ("fits in the 15-minute le·ase", "how a machine was obtained"),
    ("the device· tool's reply holds the end", "how a machine was obtained"),
    ("status says not·_drawn", "how a machine was obtained"),
])
def test_each_kind_of_break_is_named_with_its_line(text, what):
    text = text.replace("·", "")
    words = FORBIDDEN[what].search(text).group(0)
    assert voice_breaks("f.py", "first line\n" + text) == [f"f.py:2: {what} ({words!r})"]


def test_ordinary_words_pass():
    text = ("The release of the lock; a silent server; silently; equivalent; tissues 3; the paper's §3.2.2; "
            "docs/reference.md#d20; [D16](reference.md#d16); issues one scalar all-reduce; the session's checkpoint")
    assert voice_breaks("f.md", text) == []
