"""The docs as a user reads them, in process (~0 s): the README is a guide of at most 250 lines, every link in
README.md and docs/ leads to a file, and no line is dated (history lives in git and CHANGELOG.md)."""
import re

import pytest

from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b[Ww]ave \d+\b|\b(this|last|next) session\b")


def test_the_readme_is_a_guide_of_at_most_250_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 250


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_page_has_no_dated_line_and_no_dead_link(page):
    text = page.read_text()
    dated = [ln for ln in text.splitlines() if DATED.search(ln)]
    assert not dated, f"{page.name}: dated lines belong in CHANGELOG.md: {dated[:3]}"
    for target in re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", text):
        if not target.startswith(("http://", "https://")):
            assert (page.parent / target).exists(), f"{page.name}: a link to {target}, which is not there"


def test_the_table_of_figures_is_rendered_from_their_one_declaration():
    """A figure is declared once (units.FIGURES: unit, direction, one-line meaning) and docs/records.md's table of
    figures is rendered from it: a new figure without its meaning, or a page not rendered again, fails here (~0 s)."""
    from ablate import units

    records = (REPO / "docs" / "records.md").read_text()
    shown = records.split("<!-- figures: rendered from src/ablate/units.py -->\n")[1].split("<!-- end figures -->")[0]
    assert shown == units.render(), "docs/records.md's figures are stale: python -m ablate.units, pasted between " \
                                    "its figures markers"
