"""Figures the pages quote from a command's output (tests/doc_figures_support.py): every figures comment is well
formed, and the comparison itself on deliberately stale pages. tests/e2e/test_doc_figures_run.py runs the commands and
compares every quoted figure of README.md and docs/*.md with what they print now."""

from pathlib import Path

from doc_figures_support import Quote, all_quotes, check_quote, command_output, read_quotes

PLAN = "$ python -m sage_grpo.plan --world_size 8"
OUTPUT = "memory plan: 8 GPUs\n| drift proxy |   23.34 |\npeak per GPU: 69.98 GB\n"


def page(*lines: str) -> Quote:
    """The first figures comment of a page of ``lines``."""
    quotes, problems = read_quotes(Path("docs/fake.md"), "\n".join(lines) + "\n")
    assert problems == []
    return quotes[0]


def test_every_figures_comment_is_well_formed():
    quotes, problems = all_quotes()
    assert problems == []
    by_page = {quote.path for quote in quotes}
    assert {"README.md", "docs/memory.md"} <= by_page and len(quotes) >= 15
    assert [quote.path for quote in quotes if not quote.quoted] == ["docs/memory.md"]  # the plan's whole output


def test_a_figure_the_command_no_longer_prints_fails():
    quote = page("<!-- figures", PLAN, "peak per GPU: {62.57} GB", "| drift proxy | {23.34} |", "-->",
                 "The guard's phase takes 23.34 GB and the launch peaks at 62.57 GB.")
    assert quote.shell == "python -m sage_grpo.plan --world_size 8" and len(quote.quoted) == 2
    assert check_quote(quote, OUTPUT) == [
        "docs/fake.md:1: quotes 62.57 where `python -m sage_grpo.plan --world_size 8` now prints 69.98 "
        "('peak per GPU: 69.98 GB')"]
    assert check_quote(quote, OUTPUT.replace("69.98", "62.57")) == []


def test_a_paragraph_edited_without_its_comment_fails():
    quote = page("<!-- figures", PLAN, "peak per GPU: {69.98} GB", "-->",
                 "<!-- figures", PLAN, "| drift proxy | {23.34} |", "-->",
                 "", "The launch peaks at 70.0 GB (169.98 is another figure).")  # past the second comment
    assert "launch peaks at 70.0 GB" in quote.text
    assert check_quote(quote, OUTPUT) == [
        "docs/fake.md:1: the figure 69.98 ('peak per GPU: {69.98} GB') is not in the paragraph after the comment"]


def test_a_line_the_command_does_not_print_fails():
    quote = page("<!-- figures", PLAN, "| drift guard | {23.34} |", "-->", "Its phase: 23.34 GB.")
    assert check_quote(quote, OUTPUT) == [
        "docs/fake.md:1: `python -m sage_grpo.plan --world_size 8` prints no line like '| drift guard | {23.34} |'"]


def test_a_quoted_output_block_is_compared_line_for_line():
    lines = ["<!-- figures", PLAN, "-->", "<!-- check: skip: the plan's output -->", "```",
             "memory plan: 8 GPUs", "| drift proxy | 23.34 |", "peak per GPU: 64.71 GB", "```"]
    quote = page(*lines)
    assert quote.quoted == () and quote.text.startswith("memory plan")
    assert check_quote(quote, OUTPUT) == [
        "docs/fake.md:1: the block quotes 'peak per GPU: 64.71 GB' where `python -m sage_grpo.plan --world_size 8` "
        "now prints 'peak per GPU: 69.98 GB' (line 3)"]
    assert check_quote(quote, OUTPUT.replace("69.98", "64.71")) == []
    assert check_quote(quote, OUTPUT.replace("69.98", "64.71") + "one more line\n")[0].endswith(
        "the block quotes '(the block ends)' where `python -m sage_grpo.plan --world_size 8` now prints "
        "'one more line' (line 4)")


def test_malformed_comments_are_named():
    text = "\n".join(["<!-- figures", "peak per GPU: {1.0} GB", "-->", "1.0", "",
                      "<!-- figures", PLAN, "peak per GPU: 1.0 GB", "-->", "1.0", "",
                      "<!-- figures", PLAN, "-->", "no block follows", "",
                      "<!-- figures", PLAN])
    quotes, problems = read_quotes(Path("docs/fake.md"), text)
    assert quotes == [] and problems == [
        "docs/fake.md:1: a figures comment without the command ('$ ' lines)",
        "docs/fake.md:6: every quoted line marks its figures in braces, e.g. 'peak per GPU: {64.71} GB'",
        "docs/fake.md:12: a figures comment without quoted lines must precede the fenced block of the output (with "
        "its check marker)",
        "docs/fake.md:17: a figures comment that is never closed (--> on a line of its own)"]


def test_the_command_runs_as_the_page_writes_it():
    """The ``$`` lines are expanded by bash (variables, arrays) and the Python command runs in this process."""
    output = command_output('VERB=--help; ARGS=("$VERB")\npython -m sage_grpo "${ARGS[@]}"')
    assert output.startswith("usage: python -m sage_grpo <verb> [flags...]") and "  plan " in output
