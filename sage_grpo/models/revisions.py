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
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

LOCK_FILE = "weights.lock.json"


def read_lock(path) -> Dict[str, Dict[str, str]]:
    """A lock file's {repo: {"revision", "commit"}} ({} when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read the lock file {path}: {err}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) and "commit" in v for v in data.values()):
        raise ValueError(f"{path} is not a weights lock file: expected {{repo: {{\"revision\": ..., \"commit\": ...}}}}")
    return data


def record(root, repo: str, revision: str, commit: str, lock_file: Optional[str] = None) -> Path:
    """Add (or replace) ``repo``'s entry in ``<root>/weights.lock.json``; returns the file. A commit taken from
    ``lock_file`` keeps the revision that file names for it."""
    entry = read_lock(lock_file).get(repo) if lock_file else None
    if entry is not None and entry["commit"] == commit:
        revision = entry.get("revision", revision)
    path = Path(root) / LOCK_FILE
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
    (Path(run_dir) / LOCK_FILE).write_text(source.read_text())
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
    sys.exit(main())
