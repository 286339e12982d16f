"""What a lab adopting sage-grpo reads first: CITATION.cff (valid CFF 1.2.0 data, this version, the paper as the
preferred citation) and CHANGELOG.md (Keep a Changelog, its newest release this version), both in step with
``sage_grpo.__version__``."""

import re
from pathlib import Path

import yaml

import sage_grpo

REPO_ROOT = Path(__file__).resolve().parents[2]
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def citation() -> dict:
    return yaml.safe_load((REPO_ROOT / "CITATION.cff").read_text())


def test_citation_names_this_software_and_prefers_the_paper():
    cff = citation()
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software" and cff["title"] == "sage-grpo"
    assert cff["message"].strip() and cff["authors"] == [{"name": "the sage-grpo authors"}]
    assert str(cff["version"]) == sage_grpo.__version__ and cff["license"] == "Apache-2.0"
    paper = cff["preferred-citation"]
    assert paper["type"] == "article" and paper["year"] == 2026
    assert paper["title"] == "Manifold-Aware Exploration for Reinforcement Learning in Video Generation"
    assert "2603.21872" in paper["journal"] and paper["url"] == "https://arxiv.org/abs/2603.21872"
    names = [(author["given-names"], author["family-names"]) for author in paper["authors"]]
    assert len(names) == 12 and names[0] == ("Mingzhe", "Zheng") and names[-1] == ("Harry", "Yang")


def test_changelog_newest_release_is_this_version_and_the_citation_date():
    text = (REPO_ROOT / "CHANGELOG.md").read_text()
    releases = RELEASE.findall(text)
    assert releases[0] == (sage_grpo.__version__, str(citation()["date-released"]))
    assert [version for version, _ in releases] == ["0.2.0", "0.1.0"]
    assert [date for _, date in releases] == sorted((date for _, date in releases), reverse=True)
    assert text.index("## [Unreleased]") < text.index(f"## [{sage_grpo.__version__}]")
    for version, _ in releases:  # every release says what it added
        body = text.split(f"## [{version}]", 1)[1].split("\n## [", 1)[0]
        assert "### Added" in body, version


def test_changelog_speaks_of_the_project_only():
    """The project's own words: no tracker numbers, and its links point at files of the repository."""
    text = (REPO_ROOT / "CHANGELOG.md").read_text()
    assert not re.search(r"[Ii]ssue #?\d+|#\d+\b", text)
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if not target.startswith("https://"):
            assert (REPO_ROOT / target).exists(), target
