"""Every command block of the documentation, checked: tests/unit/test_doc_commands.py (markers, parsing, dry runs)
and tests/e2e/test_doc_commands_run.py (the blocks run for real).

Each fenced block of README.md, CONTRIBUTING.md, ckpts/README.md and docs/*.md has a marker on the line before it
saying how it is checked (docs/testing.md, "Documented commands"):

    <!-- check: run -->              its commands run for real on the CPU (tests/e2e), cheaply: post_train.py runs get
                                     RUN_OVERRIDES (one step, small videos) and ckpts/tiny is the session's tiny root
    <!-- check: dry-run -->          launchers run in their dry-run mode off a cluster (DRY_RUN=1, SAGE_DRY_RUN=1,
                                     ``sbatch --nodes N`` as SLURM_JOB_NUM_NODES=N) and the post_train.py command
                                     lines they print are parsed; other commands are parsed
    <!-- check: parse: REASON -->    every command parsed, not run: a Python entry point's argument parser and config
                                     validation accept it, a shell script exists and ``bash -n`` accepts it
    <!-- check: skip: REASON -->     not a command (output, a CSV, a module map, a Python session)
    <!-- check: file PATH -->        the content of file PATH, written into the sandbox of the page's commands
    <!-- check: line FILE TABLE -->  the block's lines, inserted into FILE (of the sandbox) as the first entries of the
                                     table literal TABLE (a line ``TABLE ... = {``): a recipe's one table line
    <!-- check: message NAME -->     the one-line message a user meets (docs/faq.md), ``…`` standing for its variable
                                     parts: tests/unit/test_faq.py produces message NAME and matches it
    <!-- check: copy-run -->         run for real by bash, as written, in a sandbox holding its own copy of the
                                     package with the page's file and line blocks applied (the contributor recipes:
                                     a new module plus a table line, then a tiny run that uses it; tests/e2e)

The block's shell text is expanded by bash itself (variables, ``source``, loops, quoting) with python, torchrun, bash,
sbatch and pip replaced by functions that record their argv and environment (PATH is empty, so nothing else runs);
the recorded commands are then checked in-process.
"""

import argparse
import contextlib
import io
import os
import re
import runpy
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple
from unittest import mock

from procs import run_group

REPO_ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- check: (run|dry-run|parse|skip|file|line|copy-run|message)(?::? (.*?))? -->$")
FENCE = re.compile(r"^```(\S*)\s*$")
INDENTED_COMMAND = re.compile(r"^    (python3?|bash|torchrun|sbatch|pip|[A-Z_]+=\S*) ")
# post_train.py flags that make a documented run cheap: one step on small videos, nothing else written
# (one thread: two spin on a busy 2-core machine, 10x the CPU time of a tiny step)
RUN_OVERRIDES = ["--max_steps", "1", "--save_interval", "1", "--validation_interval", "0", "--grpo_sampling_steps", "2",
                 "--sample_n_frames", "5", "--rollout_height", "16", "--rollout_width", "16", "--save_rollout_videos",
                 "false", "--quiet", "true", "--cpu_threads", "1"]
LAUNCHERS = ("run_post_train.sh", "run_post_train_multinode.sh", "scripts/post_train/train_grpo.sh",
             "scripts/post_train/pdsh_train.sh", "scripts/post_train/slurm_train.sbatch")
LAUNCH_VARS = ("NODE_LIST", "NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "NPROC_PER_NODE", "OUTPUT_DIR",
               "RESUME", "TORCHRUN", "DRY_RUN", "SAGE_DRY_RUN", "RDZV_ENDPOINT", "RDZV_ID")
# Entry points whose own parser leaves the other flags to a config's (parse_known_args), and that config
FORWARDED = {"benchmarks/benchmark_step.py": "sage_grpo.config.train:TrainConfig",
             "benchmarks/benchmark_generate.py": "sage_grpo.config.generate:GenerateConfig"}
RECORDED = ("python", "python3", "torchrun", "bash", "sbatch", "pip")
RECORDER = r"""
__record() {
  { printf 'CMD\0'; printf '%s\0' "$@"; printf 'ENV\0'; /usr/bin/env -0; printf 'END\0'; } >> "$DOC_RECORD"
}
for __name in """ + " ".join(RECORDED) + r"""; do eval "$__name() { __record $__name \"\$@\"; }"; done
timeout() { shift; "$@"; }
taskset() { shift 2; "$@"; }
"""
SHELL_NOISE = {"_", "SHLVL", "PWD", "OLDPWD", "DOC_RECORD"}


class CommandFailed(AssertionError):
    """A documented command that does not work: the message names the block and says what failed."""


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository
    line: int  # the opening fence's line, from 1
    lang: str
    text: str
    mode: str
    detail: str  # the reason (parse, skip) or the file's path (file)

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Command:
    argv: List[str]
    env: Dict[str, str] = field(default_factory=dict)  # what the block set (assignments, export)


def doc_files(root: Path = REPO_ROOT) -> List[Path]:
    pages = [root / "README.md", root / "CONTRIBUTING.md", root / "ckpts" / "README.md"]
    return [page for page in pages if page.is_file()] + sorted((root / "docs").glob("*.md"))


def read_blocks(path: Path, text: Optional[str] = None, root: Path = REPO_ROOT) -> Tuple[List[Block], List[str]]:
    """The fenced blocks of a Markdown file with their markers, and what is wrong with the file's blocks."""
    name = str(path.relative_to(root)) if path.is_absolute() else str(path)
    lines = (path.read_text() if text is None else text).splitlines()
    blocks, problems, index = [], [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            if INDENTED_COMMAND.match(lines[index]) and index > 0 and not lines[index - 1].strip():
                problems.append(f"{name}:{index + 1}: an indented command: fence it (```bash) and put a check "
                                "marker on the line before")
            elif MARKER.match(lines[index].strip()) and not (index + 1 < len(lines) and FENCE.match(lines[index + 1])):
                problems.append(f"{name}:{index + 1}: a check marker not followed by a fenced block")
            index += 1
            continue
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), None)
        if end is None:
            problems.append(f"{name}:{index + 1}: a fenced block that is never closed")
            break
        marker = MARKER.match(lines[index - 1].strip()) if index > 0 else None
        if marker is None:
            problems.append(f"{name}:{index + 1}: a fenced block without a check marker: put <!-- check: run | dry-run "
                            "| parse: REASON | skip: REASON | file PATH --> on the line before it (tests/"
                            "doc_commands_support.py)")
        elif marker.group(1) in ("parse", "skip", "file", "line", "message") and not marker.group(2):
            what = {"file": "the file's path", "line": "the file and the table",
                    "message": "the message's name"}.get(marker.group(1), "the reason")
            problems.append(f"{name}:{index + 1}: <!-- check: {marker.group(1)} --> needs {what}")
        else:
            blocks.append(Block(name, index + 1, opening.group(1), "\n".join(lines[index + 1:end]), marker.group(1),
                                marker.group(2) or ""))
        index = end + 1
    return blocks, problems


def all_blocks() -> Tuple[List[Block], List[str]]:
    blocks, problems = [], []
    for path in doc_files():
        found, wrong = read_blocks(path)
        blocks += found
        problems += wrong
    return blocks, problems


# ---------------------------------------------------------------- expanding a block with bash
def record_commands(block: Block, cwd: Path) -> List[Command]:
    """The commands ``block`` runs, as bash expands them (its variables, ``source``, loops and quoting)."""
    with tempfile.TemporaryDirectory() as folder:
        record, empty = Path(folder) / "record", Path(folder) / "bin"
        empty.mkdir()
        base = {"PATH": str(empty), "HOME": os.environ.get("HOME", "/tmp"), "DOC_RECORD": str(record)}
        proc = run_group(["/bin/bash", "--noprofile", "--norc", "-e", "-c", RECORDER + block.text], cwd=cwd,
                         env=base, timeout=30)
        if proc.returncode != 0:
            raise CommandFailed(f"{block.id}: bash could not expand the block (only {', '.join(RECORDED)}, timeout "
                                f"and taskset are known): {proc.stderr.strip()[-2000:]}")
        fields = record.read_text().split("\0") if record.is_file() else []
    commands, index = [], 0
    while index < len(fields) and fields[index] == "CMD":
        env_at = fields.index("ENV", index)
        end = fields.index("END", env_at)
        env = dict(item.split("=", 1) for item in fields[env_at + 1:end] if "=" in item)
        changed = {k: v for k, v in env.items() if base.get(k) != v and k not in SHELL_NOISE}
        argv = fields[index + 1:env_at]
        commands.append(Command(["python" if argv[0] == "python3" else argv[0], *argv[1:]], changed))
        index = end + 1
    return commands


# ---------------------------------------------------------------- Python entry points, in-process
class _Parsed(BaseException):
    """Raised where an entry point has parsed and validated its command line (never caught by its own handlers)."""

    def __init__(self, value: Any):
        super().__init__()
        self.value = value


def _raise_parsed(config: Any) -> List[str]:
    raise _Parsed(config)


@contextlib.contextmanager
def _entry_context(script: str, args: Sequence[str], cwd: Path, env: Dict[str, str], parse_only: bool):
    """sys.argv, the working directory, the environment, sys.path (the script's folder, PYTHONPATH) and torch's
    threads as a real start would see them, all restored after; with ``parse_only`` the argument parsers stop the
    entry point right after parsing."""
    import torch

    from sage_grpo.config import schema

    original_parse, original_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside_parse_args = []

    def parse_then_stop(self, args=None, namespace=None):
        inside_parse_args.append(self)
        try:
            parsed = original_parse(self, args, namespace)
        finally:
            inside_parse_args.pop()
        if isinstance(self, schema._OneLineErrorParser):  # parse_cli goes on to build and check the config
            return parsed
        raise _Parsed(parsed)

    def known_then_stop(self, args=None, namespace=None):  # a FORWARDED script's own flags; the rest: below
        parsed = original_known(self, args, namespace)
        if inside_parse_args or script not in FORWARDED:
            return parsed
        raise _Parsed(parsed)

    user_path = [str((cwd / entry).resolve()) for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    extra_path = list(user_path)
    if not script.startswith("-m "):
        extra_path.insert(0, str((cwd / script).resolve().parent))
    threads, before, modules = torch.get_num_threads(), os.getcwd(), set(sys.modules)
    patches = [mock.patch.object(sys, "argv", [script.removeprefix("-m "), *args]),
               mock.patch.object(sys, "path", extra_path + sys.path), mock.patch.dict(os.environ, env)]
    if parse_only:
        patches += [mock.patch.object(argparse.ArgumentParser, "parse_args", parse_then_stop),
                    mock.patch.object(argparse.ArgumentParser, "parse_known_args", known_then_stop),
                    mock.patch.object(schema, "warn_no_effect", _raise_parsed)]
    with contextlib.ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        os.chdir(cwd)
        try:
            yield
        finally:
            os.chdir(before)
            torch.set_num_threads(threads)
            _forget_modules(set(sys.modules) - modules, user_path)


def _forget_modules(names: Iterable[str], user_path: Sequence[str]) -> None:
    """Drop the modules imported from the command's own PYTHONPATH folders (a plug-in in its sandbox), never one
    of the repository or the environment."""
    folders = [folder for folder in user_path if not (REPO_ROOT.resolve() / "x").is_relative_to(folder)
               and not Path(folder).is_relative_to(REPO_ROOT.resolve())]
    for name in names:
        module = sys.modules[name]
        path = getattr(module, "__path__", None)  # a namespace package (mypkg/) has no __file__
        places = [getattr(module, "__file__", None) or "", *(path if isinstance(path, Iterable) else [])]
        if any(place and Path(place).is_relative_to(folder) for place in places for folder in folders):
            del sys.modules[name]


def call_entry(script: str, args: Sequence[str], cwd: Path, env: Dict[str, str], *, parse_only: bool) -> Any:
    """Run ``python SCRIPT ARGS`` (``script`` a path, or ``-m module``) in this process: the parsed configuration
    (``parse_only``), else None once it exits with status 0. A failure raises :class:`CommandFailed` with its
    output."""
    output = io.StringIO()
    try:
        with _entry_context(script, args, cwd, env, parse_only), contextlib.redirect_stdout(output), \
                contextlib.redirect_stderr(output):
            if script.startswith("-m "):
                runpy.run_module(script[3:], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(cwd / script), run_name="__main__")
    except _Parsed as done:
        return done.value
    except SystemExit as done:
        if done.code not in (0, None):
            raise CommandFailed(f"exit status {done.code}: {output.getvalue().strip()[-3000:]}") from None
    except Exception as error:
        raise CommandFailed(f"{type(error).__name__}: {error}\n{output.getvalue().strip()[-3000:]}") from None
    if parse_only:
        raise CommandFailed(f"it never parsed its arguments: {output.getvalue().strip()[-2000:]}")
    return None


def parse_flags(config_class: str, args: Sequence[str]) -> Any:
    """``args`` as the flags of ``config_class`` (``module:Class``), or :class:`CommandFailed` with the parser's
    message."""
    if not args:
        return None
    import importlib

    from sage_grpo.config.schema import parse_cli

    module, _, name = config_class.partition(":")
    output = io.StringIO()
    try:
        with contextlib.redirect_stderr(output):
            return parse_cli(getattr(importlib.import_module(module), name), list(args))
    except SystemExit:
        raise CommandFailed(output.getvalue().strip()) from None


def check_config(config: Any, world_size: int) -> None:
    """The validity rules a run checks before any model loads (post_train.py's, at the launch's world size)."""
    from sage_grpo.config import validate_train_config
    from sage_grpo.config.train import TrainConfig

    if isinstance(config, TrainConfig):
        try:
            validate_train_config(config, world_size)
        except ValueError as error:
            raise CommandFailed(f"the configuration is refused at world size {world_size}: {error}") from None


def python_command(argv: Sequence[str], env: Dict[str, str], cwd: Path, *, run: bool, world_size: int = 1) -> None:
    """``python SCRIPT ARGS`` / ``python -m MODULE ARGS``: run, or parsed and its configuration checked."""
    if argv and argv[0] == "-m":
        script, args = f"-m {argv[1]}", list(argv[2:])
    elif argv and not argv[0].startswith("-"):
        script, args = argv[0], list(argv[1:])
        if not (cwd / script).is_file():
            raise CommandFailed(f"{script}: no such file")
    else:
        raise CommandFailed(f"python {shlex.join(argv)}: only 'python SCRIPT' and 'python -m MODULE' are checked")
    if script == "post_train.py" and run:
        args += RUN_OVERRIDES
    config = call_entry(script, args, cwd, env, parse_only=not run)
    if isinstance(config, tuple):  # parse_known_args: the rest must be the flags of the parser it goes on to
        config, rest = config
        if rest and script not in FORWARDED:
            raise CommandFailed(f"unrecognized arguments: {shlex.join(rest)}")
        parse_flags(FORWARDED[script], rest)  # onto the script's own settings: parsed, not checked alone
        config = None
    if script == "-m sage_grpo.plan" and "--world_size" in args:
        world_size = int(args[args.index("--world_size") + 1])
    check_config(config, world_size)


def torchrun_command(argv: Sequence[str], env: Dict[str, str], cwd: Path) -> None:
    """``torchrun [--option value ...] SCRIPT ARGS``: the script's arguments parsed at nnodes x nproc_per_node."""
    options, index = {}, 0
    while index < len(argv) and argv[index].startswith("--"):
        key, _, value = argv[index][2:].partition("=")
        if not value:
            value, index = argv[index + 1], index + 1
        options[key.replace("-", "_")] = value
        index += 1
    nodes = int(options.get("nnodes", "1").split(":")[-1])
    python_command(argv[index:], env, cwd, run=False, world_size=nodes * int(options.get("nproc_per_node", "1")))


# ---------------------------------------------------------------- shell scripts and launchers
def launch_env(extra: Dict[str, str]) -> Dict[str, str]:
    """This environment without any launcher's or Slurm's variables (off a cluster), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith("SLURM_")}
    env.update(extra)
    return env


def dry_run(script: str, args: Sequence[str], env: Dict[str, str]) -> List[List[str]]:
    """A launcher in its dry-run mode; returns the post_train.py command lines it prints (following pdsh's remote
    command on node 0)."""
    proc = run_group(["bash", script, *args], cwd=REPO_ROOT, env=launch_env({**env, "DRY_RUN": "1",
                                                                             "SAGE_DRY_RUN": "1"}), timeout=60)
    if proc.returncode != 0:
        raise CommandFailed(f"the dry run of {script} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    commands = []
    for line in proc.stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        tokens = shlex.split(line)
        if tokens[0] == "pdsh":  # the command every node runs (after its cd and secrets file): node 0's dry run
            remote = tokens[-1].rsplit("&&", 1)[-1]
            node = run_group(["bash", "-c", remote], cwd=REPO_ROOT, env=launch_env({"NODE_RANK": "0"}), timeout=60)
            if node.returncode != 0:
                raise CommandFailed(f"node 0's dry run of {remote} exited {node.returncode}: {node.stderr}")
            commands += [shlex.split(text) for text in node.stdout.splitlines() if "post_train.py" in text]
        elif "post_train.py" in tokens:
            commands.append(tokens)
    if not commands:
        raise CommandFailed(f"the dry run of {script} printed no post_train.py command: {proc.stdout.strip()}")
    return commands


def sbatch_command(argv: Sequence[str], env: Dict[str, str], mode: str) -> None:
    """``sbatch [--option value ...] SCRIPT ARGS`` off a cluster: the script's dry run, --nodes as Slurm sets it."""
    options, index = {}, 0
    while index < len(argv) and argv[index].startswith("-"):
        key, _, value = argv[index].lstrip("-").partition("=")
        if not value:
            value, index = argv[index + 1], index + 1
        options[key] = value
        index += 1
    script, args = argv[index], argv[index + 1:]
    if mode == "parse":
        return shell_syntax(script)
    nodes = options.get("nodes", options.get("N", "1"))
    for tokens in dry_run(script, args, {**env, "SLURM_JOB_NUM_NODES": nodes}):
        torchrun_command(tokens[1:], {}, REPO_ROOT)


def shell_syntax(script: str) -> None:
    if not (REPO_ROOT / script).is_file():
        raise CommandFailed(f"{script}: no such file")
    proc = run_group(["bash", "-n", script], cwd=REPO_ROOT, timeout=30)
    if proc.returncode != 0:
        raise CommandFailed(f"bash -n {script}: {proc.stderr.strip()}")


def bash_command(argv: Sequence[str], env: Dict[str, str], mode: str, cwd: Path) -> None:
    """``bash SCRIPT ARGS``: a launcher's dry run (run, dry-run); other scripts run (run) or ``bash -n`` (else)."""
    script, args = argv[0], argv[1:]
    if script in LAUNCHERS and mode != "parse":
        for tokens in dry_run(script, args, env):
            torchrun_command(tokens[1:], {}, REPO_ROOT)
    elif mode == "run":
        proc = run_group(["bash", script, *args], cwd=cwd, env={**os.environ, **env}, timeout=120)
        if proc.returncode != 0:
            raise CommandFailed(f"bash {shlex.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    else:
        shell_syntax(script)


def pip_command(argv: Sequence[str]) -> None:
    """``pip install -e .[extras]``: not run (it installs); the project and the extras it names must exist."""
    import tomllib

    if argv[:2] != ["install", "-e"] or len(argv) != 3:
        raise CommandFailed(f"pip {shlex.join(argv)}: only 'pip install -e .[extras]' is checked")
    target = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", argv[2])
    if target is None:
        raise CommandFailed(f"pip install -e {argv[2]}: install the repository, '.' or '.[extras]'")
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    unknown = [name for name in (target.group(1) or "").split(",") if name and name not in extras]
    if unknown:
        raise CommandFailed(f"pip install -e {argv[2]}: pyproject.toml has no extra {unknown}; it has {sorted(extras)}")


def check_block(block: Block, cwd: Path = REPO_ROOT) -> int:
    """Check every command of ``block`` as its marker says; returns how many there were. Raises
    :class:`CommandFailed` naming the block and the command."""
    if block.mode in ("skip", "message"):  # a message is matched by tests/unit/test_faq.py
        return 0
    if block.mode == "file":
        if block.detail.endswith(".py"):
            compile(block.text, block.detail, "exec")  # a SyntaxError names the file and line
        return 0
    if block.mode == "line":
        insert_table_lines(cwd, block, dry_run=True)  # the file and its table exist
        return 0
    if block.mode == "copy-run":  # it needs its page's recipes in a copy of the package: run in tests/e2e
        proc = run_group(["/bin/bash", "-n", "-c", block.text], timeout=30)
        if proc.returncode:
            raise CommandFailed(f"{block.id}: bash -n: {proc.stderr.strip()}")
        return 1
    commands = record_commands(block, cwd)
    if not commands:
        raise CommandFailed(f"{block.id}: a {block.mode} block without a command (mark it skip, with the reason)")
    for command in commands:
        program, argv = command.argv[0], command.argv[1:]
        try:
            if program == "python":
                python_command(argv, command.env, cwd, run=block.mode == "run")
            elif program == "torchrun":
                torchrun_command(argv, command.env, cwd)
            elif program == "bash":
                bash_command(argv, command.env, block.mode, cwd)
            elif program == "sbatch":
                sbatch_command(argv, command.env, block.mode)
            else:
                pip_command(argv)
        except CommandFailed as error:
            raise CommandFailed(f"{block.id}: {shlex.join(command.argv)}\n  {error}") from None
    return len(commands)


def insert_table_lines(root: Path, block: Block, dry_run: bool = False) -> None:
    """Insert a ``line FILE TABLE`` block's lines into ``root/FILE`` right after the line opening the table literal
    ``TABLE`` (its first entries); :class:`CommandFailed` when the file or the table is not there."""
    file, _, table = block.detail.partition(" ")
    path = root / file
    if not path.is_file() or not table:
        raise CommandFailed(f"{block.id}: <!-- check: line {block.detail} --> names no file of the repository")
    lines = path.read_text().splitlines(keepends=True)
    opening = re.compile(rf"^{re.escape(table)}\b[^=]*=.*[{{(\[]\s*(#.*)?$")
    found = [i for i, text in enumerate(lines) if opening.match(text)]
    if len(found) != 1:
        raise CommandFailed(f"{block.id}: {file} has {len(found)} lines opening the table {table}, not one")
    if not dry_run:
        path.write_text("".join(lines[:found[0] + 1]) + block.text.rstrip("\n") + "\n" + "".join(lines[found[0] + 1:]))


def page_sandbox(folder: Path, block: Block, blocks: Sequence[Block], tiny_root: Path) -> Path:
    """``folder`` as a checkout to run ``block``'s commands in: links to the repository's files, ckpts/tiny the
    session's tiny checkpoint, and the ``file`` blocks of the block's page written in. A ``copy-run`` block gets its
    own copy of the package instead of a link, with its page's ``file`` and ``line`` blocks applied."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = block.mode == "copy-run"  # python puts a script's real folder first on the path: entry scripts copied too
    for entry in REPO_ROOT.iterdir():
        if copy and entry.name == "sage_grpo":
            shutil.copytree(entry, folder / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif copy and entry.suffix == ".py":
            shutil.copy(entry, folder / entry.name)
        elif entry.name not in (".git", ".venv", "ckpts", "outputs"):
            (folder / entry.name).symlink_to(entry)
    (folder / "ckpts").mkdir()
    (folder / "ckpts" / "tiny").symlink_to(tiny_root)
    for other in blocks:
        if other.path != block.path or other.mode not in ("file", "line"):
            continue
        if (folder / other.detail.split("/")[0]).is_symlink():  # a linked folder: never written through
            continue
        if other.mode == "line":
            insert_table_lines(folder, other)
        else:
            (folder / other.detail).parent.mkdir(parents=True, exist_ok=True)
            (folder / other.detail).write_text(other.text + "\n")
    return folder


def run_copied(block: Block, sandbox: Path, timeout: float) -> str:
    """Run a ``copy-run`` block as written, by bash, in ``sandbox`` (its own copy of the package first on the path;
    ``python`` is this interpreter); returns its output, :class:`CommandFailed` on a failure."""
    bin_dir = sandbox / ".doc_bin"
    bin_dir.mkdir(exist_ok=True)
    wrapper = bin_dir / "python"  # a script, not a link: a linked interpreter would not find its virtual environment
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '')}", PYTHONPATH=str(sandbox),
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    proc = run_group(["/bin/bash", "--noprofile", "--norc", "-e", "-c", block.text], cwd=sandbox, env=env,
                     timeout=timeout)
    if proc.returncode:
        raise CommandFailed(f"{block.id}: exit status {proc.returncode}: {(proc.stdout + proc.stderr)[-3000:]}")
    return proc.stdout + proc.stderr
