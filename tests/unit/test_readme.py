"""The README is a short front page whose links all lead to files inside the repository, and the pages
speak of the product as it is."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
README = ROOT / "README.md"
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines: detail belongs in docs/"


def test_readme_links_stay_inside_the_repository() -> None:
    targets = LINK.findall(README.read_text(encoding="utf-8"))
    assert targets, "the README links into docs/"
    root = ROOT.resolve()
    for target in targets:
        if target.startswith("#"):
            continue
        assert "://" not in target and not target.startswith("/"), f"{target}: link a file in the repository"
        path = (ROOT / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(root), f"{target}: leads outside the repository"
        assert path.is_file(), f"{target}: no such file"


def test_readme_shows_the_architecture_diagram() -> None:
    assert "](docs/architecture.svg)" in README.read_text(encoding="utf-8")


def test_pages_speak_of_the_product_not_its_history() -> None:
    """README and docs describe the software as it is: no work-session diary, no issue numbers."""
    diary = re.compile(r"\bsessions? [0-9]|\bissues? #?[0-9]+", re.IGNORECASE)
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            assert not diary.search(line), f"{page.relative_to(ROOT)}:{number}: {line.strip()}"
