"""Pinned weights: the hub commit of every repository a model root was downloaded from, in ``<root>/weights.lock.json``.

``download_weights.sh`` resolves each revision it is asked for (a branch such as ``main``, a tag or a commit) to the
commit the hub serves for it, downloads exactly that commit and records it::

    {"hunyuanvideo-community/HunyuanVideo-1.5-Diffusers-480p_t2v": {"revision": "main", "commit": "3f1c..."}, ...}

``bash download_weights.sh --lock other/weights.lock.json`` downloads the commits a lock file names (a root made
elsewhere, reproduced); repositories the file does not name follow the revision variables. A run records the lock of
its model root in ``run_config.yaml`` (as comment lines, so ``--config`` still reads the file) and in the run
directory, and an export's model card lists the commits (:func:`lock_lines`).

Command line (what the download script calls)::

    python -m sage_grpo.models.revisions resolve REPO REVISION [--lock FILE]   # prints the commit to download
    python -m sage_grpo.models.revisions record ROOT REPO REVISION COMMIT [--lock FILE]   # adds it to the lock
"""

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from sage_grpo.safe_io import read_json_object

LOCK_FILE = "weights.lock.json"


# What a lock may hold: the hub's repository ids, its 40-hex commit ids, and revision names (a branch, tag or commit)
# without spaces, quotes or control characters. A lock is read back into run_config.yaml's comments, the model card
# and download_weights.sh's command lines: a value that fits these patterns is data there, never syntax.
REPO_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
COMMIT_PATTERN = re.compile(r"[0-9a-f]{40}")
REVISION_PATTERN = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9._/+=@-]{0,199}")
MAX_LOCK_BYTES = 1 << 20


def check_entry(repo: Any, revision: Any, commit: Any, source: str) -> None:
    """One lock entry checked like the download script's arguments; ValueError naming ``source`` and the key."""
    if not isinstance(repo, str) or not REPO_PATTERN.fullmatch(repo):
        raise ValueError(f"{source}: {str(repo)[:100]!r} is not a hub repository id (namespace/name)")
    if not isinstance(commit, str) or not COMMIT_PATTERN.fullmatch(commit):
        raise ValueError(f"{source}: {repo}: commit {str(commit)[:100]!r} is not a 40-hex-digit commit id")
    if revision is not None and (not isinstance(revision, str) or not REVISION_PATTERN.fullmatch(revision)):
        raise ValueError(f"{source}: {repo}: revision {str(revision)[:100]!r} is not a branch, tag or commit name "
                         "(letters, digits and ._/+=@-, at most 200)")


def read_lock(path) -> Dict[str, Dict[str, str]]:
    """A lock file's {repo: {"revision", "commit"}} ({} when the file does not exist), every entry checked
    (:func:`check_entry`)."""
    path = Path(path)
    if not path.is_file():
        return {}
    data = read_json_object(path, "the weights lock file", "delete it, or take it again from the run it came from",
                            error=ValueError, max_bytes=MAX_LOCK_BYTES)
    if not all(isinstance(v, dict) and "commit" in v for v in data.values()):
        raise ValueError(f"{path} is not a weights lock file: expected {{repo: {{\"revision\": ..., \"commit\": ...}}}}")
    for repo, entry in data.items():
        check_entry(repo, entry.get("revision"), entry["commit"], str(path))
    return {repo: {key: entry[key] for key in ("revision", "commit") if key in entry} for repo, entry in data.items()}


def record(root, repo: str, revision: str, commit: str, lock_file: Optional[str] = None) -> Path:
    """Add (or replace) ``repo``'s entry in ``<root>/weights.lock.json``; returns the file. A commit taken from
    ``lock_file`` keeps the revision that file names for it."""
    entry = read_lock(lock_file).get(repo) if lock_file else None
    if entry is not None and entry["commit"] == commit:
        revision = entry.get("revision", revision)
    path = Path(root) / LOCK_FILE
    check_entry(repo, revision, commit, str(path))
    lock = read_lock(path)
    lock[repo] = {"revision": revision, "commit": commit}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(lock.items())), indent=2) + "\n")
    return path


def resolve(repo: str, revision: str, lock: Optional[str] = None) -> str:
    """The commit to download for ``repo``: the lock file's when it names the repo, else the hub's commit of
    ``revision`` (``HF_ENDPOINT`` and ``HF_TOKEN`` apply)."""
    if lock:
        entry = read_lock(lock).get(repo)
        if entry is not None:
            return entry["commit"]
    from huggingface_hub import HfApi

    commit = HfApi().model_info(repo, revision=revision).sha
    if not commit:
        raise ValueError(f"the hub gave no commit for {repo} at revision {revision}")
    check_entry(repo, revision, commit, "the hub's answer")
    return commit


def lock_lines(root) -> List[str]:
    """``repo@commit (revision)`` for each repository of ``root``'s lock file ([] without one)."""
    return [f"{repo}@{entry['commit']} ({entry.get('revision', '?')})"
            for repo, entry in read_lock(Path(root) / LOCK_FILE).items()]


def record_run_weights(model_root, run_dir, config_file: Optional[Path] = None) -> List[str]:
    """A run's record of its weights: ``model_root``'s lock file copied into ``run_dir`` and, given
    ``config_file`` (the run's ``run_config.yaml``), its commits appended there as comment lines (YAML readers skip
    them, so ``--config`` still reads the file). Returns the lines ([] for a root without a lock file)."""
    lines = lock_lines(model_root)
    if not lines:
        return []
    source = Path(model_root) / LOCK_FILE
    (Path(run_dir) / LOCK_FILE).write_text(json.dumps(read_lock(source), indent=2) + "\n")  # the checked entries
    if config_file is not None:
        with open(config_file, "a") as handle:
            handle.write(f"# weights, from {source}:\n" + "".join(f"#   {line}\n" for line in lines))
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    resolving = commands.add_parser("resolve", help="print the commit to download")
    resolving.add_argument("repo")
    resolving.add_argument("revision")
    resolving.add_argument("--lock", default=None, help="a lock file whose commit wins for the repos it names")
    recording = commands.add_parser("record", help="add a downloaded commit to ROOT/weights.lock.json")
    for name in ("root", "repo", "revision", "commit"):
        recording.add_argument(name)
    recording.add_argument("--lock", default=None, help="the lock file the commit was taken from")
    args = parser.parse_args(argv)
    try:
        if args.command == "resolve":
            print(resolve(args.repo, args.revision, args.lock))
        else:
            record(args.root, args.repo, args.revision, args.commit, args.lock)
    except Exception as err:  # the hub's errors (not found, offline, auth) and bad lock files: one line
        print(f"error: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from sage_grpo.config.command import run_module  # only here: the download's other steps import no config

    run_module("sage_grpo.models.revisions", main)
