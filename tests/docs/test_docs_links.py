"""The documentation holds together: README.md, docs/**/*.md and BENCHMARKS.md link only to files (and headings)
that exist, the README keeps CI's test command, and its map of the code lists exactly what src/vlmgym/ and
stages/ hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = sorted([README, REPO / "BENCHMARKS.md", *(REPO / "docs").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target), with an optional "title"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks and code spans, where a link is a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids of a markdown file (lower case, punctuation dropped, spaces as '-', repeats '-1'...)."""
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t, re.I)]


def test_the_pages_are_found():
    names = {str(p.relative_to(REPO)) for p in PAGES}
    assert {"README.md", "docs/index.md", "docs/pipeline.md", "docs/results.md", "docs/writing-an-env.md",
            "docs/envs/README.md"} <= names
    assert len(relative_links(README)) >= 10  # the link pattern finds the README's links to docs/


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(REPO) if REPO in resolved.parents else resolved}")
        elif not resolved.is_relative_to(REPO):
            broken.append(f"{target}: outside the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_reachable_from_the_readme():
    reached, todo = set(), [README.resolve()]
    while todo:
        page = todo.pop()
        if page in reached or page.suffix != ".md" or not page.is_file():  # a broken link fails the test above
            continue
        reached.add(page)
        for target in relative_links(page):
            file_part = target.partition("#")[0]
            if file_part:
                todo.append((page.parent / file_part).resolve())
    unreached = [str(p.relative_to(REPO)) for p in PAGES if p.resolve() not in reached]
    assert not unreached, f"pages no link leads to from README.md: {unreached}"


def test_readme_keeps_the_ci_test_command():
    assert "make test" in README.read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M), ".ci/run no longer runs the README's `make test`"


def code_map() -> dict[str, set[str]]:
    """The README's map of the code: top-level entry names under `stages/` and `src/vlmgym/`."""
    section = README.read_text().split("\n## Map of the code\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```\n(.*?)^```$", section, re.S | re.M).group(1)
    groups: dict[str, set[str]] = {}
    current = None
    for line in block.splitlines():
        name = line.split()[0]
        if not line.startswith(" "):
            current = groups.setdefault(name.rstrip("/"), set())
        elif not line.startswith("   "):  # deeper lines continue the entry above
            current.add(name.split("/")[0])
    return groups


def test_readme_code_map_matches_the_tree():
    def tree(folder: Path, pattern: str) -> set[str]:
        return {p.name for p in folder.glob(pattern) if p.name != "__pycache__" and not p.name.startswith(".")}

    groups = code_map()
    assert set(groups) == {"stages", "src/vlmgym"}
    assert groups["stages"] == tree(REPO / "stages", "*.py")
    assert groups["src/vlmgym"] == tree(REPO / "src" / "vlmgym", "*")


REPO_PATH = re.compile(r"`((?:src|stages|tests|scripts|configs)/[^`\s]*)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_quoted_repository_paths_exist(page):
    """A path in code quotes (`src/vlmgym/eval/blind.py`, `tests/rl/test_ppo.py::test_x`) names a real file."""
    text = FENCE.sub("", page.read_text())
    paths = {m.split("::")[0] for m in REPO_PATH.findall(text) if not re.search(r"[<>*{}$]", m)}
    missing = sorted(p for p in paths if not (REPO / p).exists())
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {missing}"
