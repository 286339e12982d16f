"""The documentation holds together: every relative link and image of README.md and docs/*.md points to
a file that exists and, with an anchor, to a heading of that file; docs/README.md indexes every file in docs/; the
README stays within 300 lines and links each recipe heading straight from its index."""

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs"
PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "ckpts" / "README.md", *sorted(DOCS.glob("*.md"))]
RECIPES = ("Launch on 8 GPUs", "Resume a run", "Change the reward weights", "Add a custom reward", "Train a LoRA",
           "Evaluate checkpoints", "Export to diffusers")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a ``# comment`` in a bash block is not a heading, nor a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text (code marks dropped, links as their text), lower case, every
    character but letters, digits, spaces, '-' and '_' dropped, spaces as '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in prose_lines(page.read_text()):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(page: Path) -> list[str]:
    prose = re.sub(r"`[^`\n]*`", "``", "\n".join(prose_lines(page.read_text())))  # `[x](y)` is code, not a link
    targets = LINK.findall(prose)  # a link's text may wrap onto the next line
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # http:, https:, mailto: are external


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or REPO_ROOT not in (file, *file.parents):
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with anchor #{anchor} in {file.relative_to(REPO_ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_checker_sees_a_broken_file_and_a_broken_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr(f"{__name__}.REPO_ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Resume a run\n\n```bash\n# not a heading\n```\n")
    page = tmp_path / "b.md"
    page.write_text("[ok](a.md#resume-a-run) [gone](missing.md) [bad](a.md#not-a-heading) "
                    "[web](https://example.com/x.md) `[code](x)`\n```\n[fenced](nowhere.md)\n```\n")
    assert [line.split(":")[0] for line in broken_links(page)] == ["missing.md", "a.md#not-a-heading"]


def test_slugs_follow_github():
    assert slug("Quickstart (CPU, no GPU and no downloads needed)") == "quickstart-cpu-no-gpu-and-no-downloads-needed"
    assert slug("The reference launch simulated (`--simulate`, sp 2)") == \
        "the-reference-launch-simulated---simulate-sp-2"
    assert slug("Using the reference's downloaded weights") == "using-the-references-downloaded-weights"


def test_docs_index_names_every_file_in_docs():
    index = (DOCS / "README.md").read_text()
    listed = {Path(t).name for t in relative_links(DOCS / "README.md") if "/" not in t.partition("#")[0]}
    missing = [p.name for p in sorted(DOCS.iterdir()) if p.name != "README.md" and p.name not in listed]
    assert missing == [] and index.count("\n- [") >= len(list(DOCS.iterdir())) - 1


def test_readme_is_short_and_links_every_recipe_heading():
    readme = REPO_ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 300
    assert any(line.startswith("## Contents") for line in readme.read_text().splitlines())
    linked = {t.partition("#")[2] for t in relative_links(readme) if t.startswith("docs/")}
    assert [recipe for recipe in RECIPES if slug(recipe) not in linked] == []


# docs/reference.md's sections, cited by anchor from code, configs and other pages (`docs/reference.md#d20`): renaming
# one of these headings breaks those citations, so the page keeps them.
REFERENCE_ANCHORS = (
    "overview", "flags-and-defaults", "defaults-that-disagree", "settings-without-a-flag", "the-launch-scripts-flags",
    "sampling-script-flags", "the-training-step", "start-up", "prompt-data-and-the-sampler", "the-outer-loop",
    "the-rollout", "the-schedule-and-the-sde-steps", "decoding", "the-reward", "advantages", "reference-means",
    "shuffle-and-step-order", "the-gradient-norm-equalizer", "the-policy-loss", "the-kl-terms-and-the-controller",
    "the-optimizer-update", "step-metrics", "the-moving-anchor", "optimizer-schedule-and-precision",
    "parallel-execution", "meshes-and-rank-layout", "fsdp2", "sequence-parallelism", "layout-rules",
    "randomness-across-ranks", "collectives-per-step", "outputs-checkpoints-and-validation", "the-run-directory",
    "checkpoints-and-resume", "validation", "logging", "the-sampling-script", "the-rollout-pipeline",
    "the-videoalign-reward-model", "multi-node-launch", "dependencies", "known-defects",
    "what-a-faithful-reimplementation-pins", *(f"d{number}" for number in range(1, 31)))
CITING = ("sage_grpo", "scripts", "tests", "configs", "benchmarks", "docs")


def reference_citations(root: Path) -> list[tuple[str, str]]:
    """(file, anchor) of every ``reference.md#anchor`` in the repository's code, configs and pages."""
    files = [*root.glob("*.md"), *root.glob("*.sh"), *(path for folder in CITING for path in (root / folder).rglob("*")
                                                       if path.suffix in (".py", ".sh", ".yaml", ".md", ".sbatch"))]
    return [(str(path.relative_to(root)), anchor) for path in sorted(files) if path.is_file()
            for anchor in re.findall(r"reference\.md#([\w-]+)", path.read_text())]


def test_the_reference_page_keeps_its_anchors_and_every_citation_resolves():
    headings = anchors(DOCS / "reference.md")
    assert [anchor for anchor in REFERENCE_ANCHORS if anchor not in headings] == []
    this_file = str(Path(__file__).resolve().relative_to(REPO_ROOT))  # its own examples are not citations
    assert [f"{file}: reference.md#{anchor}" for file, anchor in reference_citations(REPO_ROOT)
            if anchor not in headings and file != this_file] == []


def test_a_citation_of_a_missing_reference_section_is_named(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "reference.md").write_text("# The reference\n\n### D20\n")
    (tmp_path / "sage_grpo").mkdir()
    (tmp_path / "sage_grpo" / "fsdp.py").write_text('"""Reduced once (docs/reference.md#d20, reference.md#d99)."""\n')
    assert reference_citations(tmp_path) == [("sage_grpo/fsdp.py", "d20"), ("sage_grpo/fsdp.py", "d99")]
    assert anchors(tmp_path / "docs" / "reference.md") == {"the-reference", "d20"}
