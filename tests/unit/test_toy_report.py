"""The toy study's report (scripts/toy_study.py -> sage_grpo.studies.study.write_report): a re-run rewrites
only the generated sections and keeps every hand-written line (the verdict, the "Time to reward" section)."""

from pathlib import Path

import pytest

from sage_grpo.studies.study import check_report, write_report

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _outside_generated(text: str) -> str:
    """The document with each generated section's body dropped (the markers kept)."""
    kept, inside = [], False
    for line in text.split("\n"):
        if line.startswith("<!-- end generated:"):
            inside = False
        if not inside:
            kept.append(line)
        if line.startswith("<!-- generated:"):
            inside = True
    return "\n".join(kept)


def test_a_rerun_keeps_the_hand_written_sections(tmp_path):
    report = tmp_path / "toy_study.md"
    committed = (DOCS / "toy_study.md").read_text()
    report.write_text(committed)
    check_report(report)
    write_report(report, {"header": "# Toy study: new header", "results": "## SDE type\n\nnew table"})
    text = report.read_text()
    assert "# Toy study: new header" in text and "new table" in text
    assert "Measured on 2026-11-23" not in text and "## Analytic part" not in text  # the old generated text went
    assert _outside_generated(text) == _outside_generated(committed)  # every hand-written line, byte for byte
    hand_tail = committed[committed.index("## Time to reward"):]
    assert text.endswith(hand_tail) and "## Verdict on the paper's claims" in text
    write_report(report, {"header": "# Toy study: new header", "results": "## SDE type\n\nnew table"})
    assert report.read_text() == text  # idempotent


def test_a_new_report_then_a_hand_edit_survives(tmp_path):
    report = tmp_path / "quick.md"
    write_report(report, {"header": "# Quick", "results": "table 1"})
    report.write_text(report.read_text() + "\n## Time to reward\n\nby hand\n")
    write_report(report, {"header": "# Quick", "results": "table 2"})
    text = report.read_text()
    assert "table 2" in text and "table 1" not in text and text.endswith("## Time to reward\n\nby hand\n")
    assert "<!-- verdict: written by hand" in text


def test_a_report_without_markers_is_refused_untouched(tmp_path):
    report = tmp_path / "toy_study.md"
    report.write_text("# Toy study\n\n## Time to reward\n\nby hand\n")
    with pytest.raises(ValueError, match=r"toy_study.md has no generated section 'header'.*add the two lines"):
        check_report(report)
    with pytest.raises(ValueError, match="no generated section"):
        write_report(report, {"header": "x", "results": "y"})
    assert report.read_text() == "# Toy study\n\n## Time to reward\n\nby hand\n"
    check_report(tmp_path / "absent.md")  # nothing to keep: a new report is written
