"""Figures the documentation quotes from a command's output, compared with that output (tests/unit/test_doc_figures.py
checks the markers and the comparison itself; tests/e2e/test_doc_figures_run.py runs the commands).

A page marks what it quotes with an HTML comment the rendered page does not show, a terminal transcript: ``$ `` lines
are the shell that prints the output (expanded by bash as the documented blocks are, tests/doc_commands_support.py),
the other lines are lines of that output with each quoted figure in braces::

    <!-- figures
    $ source scripts/post_train/reference_flags.sh && reference_flags ./outputs/grpo
    $ python -m sage_grpo.plan --world_size 8 --gpu_memory_gb 80 "${REFERENCE_FLAGS[@]}" --drift_guard warn
    peak per GPU: {66.65} GB
    | drift proxy | {23.34} |
    -->
    At the reference launch `--drift_guard warn` ... (peak 66.65 GB; its own phase 23.34 GB) ...

Each quoted line must be a line of the command's output (spaces aside) with the figures the braces hold, and each
figure must appear in the paragraph after the comment (other figures comments may stand between). A comment without
quoted lines stands before a fenced block (with its ``<!-- check: skip: ... -->`` marker) that is the whole output,
line for line. So a figure goes stale in neither place: a changed command output, or a paragraph edited without its
comment, fails.
"""

import contextlib
import io
import re
import runpy
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from doc_commands_support import REPO_ROOT, Block, CommandFailed, _entry_context, doc_files, record_commands

START, END = "<!-- figures", "-->"
FIGURE = re.compile(r"\{([^{}]+)\}")
FENCE = re.compile(r"^```")


@dataclass(frozen=True)
class Quote:
    path: str  # relative to the repository
    line: int  # the comment's first line, from 1
    shell: str  # the ``$`` lines
    quoted: Tuple[str, ...]  # the output lines quoted, figures in braces; empty: the fenced block is the output
    text: str  # the paragraph after the comment, or the fenced block's content

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def _quoting_text(lines: Sequence[str], index: int) -> Tuple[str, bool]:
    """The paragraph (or the fenced block, with True) that follows line ``index``, past blank lines and other
    figures comments."""
    while index < len(lines):
        line = lines[index].strip()
        if not line:
            index += 1
        elif line.startswith(START):
            index = next((i for i in range(index, len(lines)) if lines[i].strip() == END), len(lines)) + 1
        else:
            break
    if index < len(lines) and lines[index].strip().startswith("<!-- check:") and index + 1 < len(lines) \
            and FENCE.match(lines[index + 1]):
        end = next((i for i in range(index + 2, len(lines)) if lines[i].strip() == "```"), len(lines))
        return "\n".join(lines[index + 2:end]), True
    end = next((i for i in range(index, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[index:end]), False


def read_quotes(path: Path, text: Optional[str] = None, root: Path = REPO_ROOT) -> Tuple[List[Quote], List[str]]:
    """The figures comments of a Markdown page, and what is wrong with them."""
    name = str(path.relative_to(root)) if path.is_absolute() else str(path)
    lines = (path.read_text() if text is None else text).splitlines()
    quotes, problems = [], []
    for index, line in enumerate(lines):
        if line.strip() != START:
            continue
        where = f"{name}:{index + 1}"
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == END), None)
        if end is None:
            problems.append(f"{where}: a figures comment that is never closed ({END} on a line of its own)")
            continue
        body = [item.strip() for item in lines[index + 1:end] if item.strip()]
        shell = [item[2:] for item in body if item.startswith("$ ")]
        quoted = tuple(item for item in body if not item.startswith("$ "))
        after, fenced = _quoting_text(lines, end + 1)
        if not shell:
            problems.append(f"{where}: a figures comment without the command ('$ ' lines)")
        elif quoted and not all(FIGURE.search(item) for item in quoted):
            problems.append(f"{where}: every quoted line marks its figures in braces, e.g. "
                            "'peak per GPU: {64.71} GB'")
        elif not quoted and not fenced:
            problems.append(f"{where}: a figures comment without quoted lines must precede the fenced block of the "
                            "output (with its check marker)")
        else:
            quotes.append(Quote(name, index + 1, "\n".join(shell), quoted, after))
    return quotes, problems


def all_quotes() -> Tuple[List[Quote], List[str]]:
    """The figures comments of README.md, ckpts/README.md and docs/*.md, and what is wrong with them."""
    pages = [read_quotes(path) for path in doc_files()]
    return [quote for found, _ in pages for quote in found], [problem for _, wrong in pages for problem in wrong]


_OUTPUTS: Dict[Tuple[str, str], str] = {}  # (shell, cwd) -> output: pages quoting the same command run it once


def command_output(shell: str, cwd: Path = REPO_ROOT) -> str:
    """What ``shell`` (one ``python SCRIPT`` or ``python -m MODULE`` command after its setup) prints on stdout, run
    in this process as the documented commands are; exit status 0 or 1 (a plan that does not fit) counts as run."""
    key = (shell, str(cwd))
    if key not in _OUTPUTS:
        commands = record_commands(Block("figures", 0, "bash", shell, "run", ""), cwd)
        if len(commands) != 1 or commands[0].argv[0] != "python":
            raise CommandFailed(f"{shell!r}: a figures comment runs exactly one python command")
        argv = commands[0].argv[1:]
        script, args = (f"-m {argv[1]}", argv[2:]) if argv[0] == "-m" else (argv[0], argv[1:])
        output = io.StringIO()
        try:
            with _entry_context(script, args, cwd, commands[0].env, parse_only=False), \
                    contextlib.redirect_stdout(output), contextlib.redirect_stderr(io.StringIO()):
                if script.startswith("-m "):
                    runpy.run_module(script[3:], run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(str(cwd / script), run_name="__main__")
        except SystemExit as done:
            if done.code not in (0, 1, None):
                raise CommandFailed(f"python {shlex.join(argv)}: exit status {done.code}") from None
        _OUTPUTS[key] = output.getvalue()
    return _OUTPUTS[key]


def _squeeze(line: str) -> str:
    return " ".join(line.split())


def _figure_in(value: str, text: str) -> bool:
    """``value`` in ``text`` as a whole number (66.65 is not in 166.65 or 66.657)."""
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", text) is not None


def check_quote(quote: Quote, output: str) -> List[str]:
    """What ``quote`` gets wrong against the command's ``output`` (empty: every figure holds)."""
    command = quote.shell.splitlines()[-1]
    printed = [_squeeze(line) for line in output.splitlines()]
    if not quote.quoted:
        shown = [_squeeze(line) for line in quote.text.splitlines()]
        if shown != printed:
            first = next((i for i, (a, b) in enumerate(zip(shown, printed)) if a != b), min(len(shown), len(printed)))
            have = shown[first] if first < len(shown) else "(the block ends)"
            now = printed[first] if first < len(printed) else "(the output ends)"
            return [f"{quote.id}: the block quotes {have!r} where `{command}` now prints {now!r} (line {first + 1})"]
        return []
    problems = []
    for line in quote.quoted:
        figures = FIGURE.findall(line)
        parts = FIGURE.split(_squeeze(line))[::2]
        pattern = re.compile(r"(\S+)".join(re.escape(part) for part in parts))
        match = next((m for m in map(pattern.fullmatch, printed) if m), None)
        if match is None:
            problems.append(f"{quote.id}: `{command}` prints no line like {line!r}")
            continue
        for figure, now in zip(figures, match.groups()):
            if figure != now:
                problems.append(f"{quote.id}: quotes {figure} where `{command}` now prints {now} "
                                f"({match.group(0)!r})")
            elif not _figure_in(figure, quote.text):
                problems.append(f"{quote.id}: the figure {figure} ({line!r}) is not in the paragraph after the "
                                "comment")
    return problems
