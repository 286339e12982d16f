"""Every figure README.md and docs/*.md quote from a command's output (a figures comment, tests/doc_figures_support.py)
is what that command prints now: the memory planner's figures at the reference launch, the plan's whole output on
docs/memory.md. A command that several pages quote runs once."""

import pytest
from doc_figures_support import all_quotes, check_quote, command_output

QUOTES, _ = all_quotes()


@pytest.mark.parametrize("quote", QUOTES, ids=[quote.id for quote in QUOTES])
def test_quoted_figures_are_what_the_command_prints(quote):
    assert check_quote(quote, command_output(quote.shell)) == []
