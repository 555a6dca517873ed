"""The docs are in four parts, and each page says who it is for.

The site's pages are grouped by what their reader is doing: learning (the tutorial), getting a
task done (how-to guides), looking something up (reference) and understanding why (discussions).
``docs/conf.py`` lists them in ``PARTS``; every page of ``docs/`` belongs to one part or to the
project's own pages, and the README's map of the docs links each page of the four parts. The
benchmarks page keeps one current table per workload and stays short: earlier runs and their
reasoning are in ``bench/log/``.

No database: the files are read as text.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from .tree import reads_the_tree

ROOT = Path(__file__).resolve().parent.parent

pytestmark = reads_the_tree

FOUR_PARTS = ["Tutorial", "How-to guides", "Reference", "Discussions"]
BENCH_README_MAX_BYTES = 15_000


def _conf_value(name: str) -> object:
    """A literal assigned at the top of docs/conf.py, read without running it (it sets Django up)."""
    tree = ast.parse((ROOT / "docs" / "conf.py").read_text(encoding="utf-8"))
    for node in tree.body:
        names = [target.id for target in getattr(node, "targets", []) if isinstance(target, ast.Name)]
        if isinstance(node, ast.Assign) and name in names:
            return ast.literal_eval(node.value)
    raise AssertionError(f"docs/conf.py assigns no {name}")


def _parts() -> dict[str, list[str]]:
    parts = _conf_value("PARTS")
    assert isinstance(parts, dict)
    return parts


def _first_paragraph(page: str) -> str:
    text = (ROOT / f"{page}.md").read_text(encoding="utf-8")
    title, _, rest = text.partition("\n\n")
    assert title.startswith("# "), f"{page}.md starts with its title"
    return rest.split("\n\n", 1)[0]


def test_the_site_has_its_four_parts() -> None:
    parts = _parts()
    assert list(parts) == FOUR_PARTS
    for part, pages in parts.items():
        assert pages, part
        for page in pages:
            assert (ROOT / f"{page}.md").is_file(), f"{part}: {page}.md"


def test_every_page_of_docs_is_in_one_part() -> None:
    """A new page must say which part it is in (or that it is the project's own)."""
    project = _conf_value("PROJECT")
    assert isinstance(project, list)
    listed = [page for pages in _parts().values() for page in pages] + project
    assert len(listed) == len(set(listed)), "a page is in two parts"
    pages = {f"docs/{path.stem}" for path in (ROOT / "docs").glob("*.md")}
    unlisted = sorted(pages - set(listed))
    assert not unlisted, f"add these pages to PARTS or PROJECT in docs/conf.py: {unlisted}"


def test_each_page_says_who_it_is_for_in_its_first_lines() -> None:
    pages = [page for pages in _parts().values() for page in pages] + ["docs/contributing", "docs/site"]
    unsaid = [page for page in pages if not _first_paragraph(page).startswith("For ")]
    assert not unsaid, f"start these pages' first paragraph with whom they are for ('For ...'): {unsaid}"


def test_the_readme_maps_the_four_parts() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    docs_map = readme.split("\n## Documentation\n", 1)[1].split("\n## ", 1)[0]
    for part in FOUR_PARTS:
        assert f"**{part}**" in docs_map, part
    linked = set(re.findall(r"\]\(([\w/.-]+)\.md(?:#[\w-]+)?\)", docs_map))
    missing = [page for pages in _parts().values() for page in pages if page not in linked]
    assert not missing, f"the README's Documentation section links no {missing}"


def test_the_benchmarks_page_is_short() -> None:
    size = len((ROOT / "bench" / "README.md").read_bytes())
    assert size < BENCH_README_MAX_BYTES, (
        f"bench/README.md is {size} bytes: keep one current table per workload, its command and how "
        "to read it, and move earlier runs and their reasoning to bench/log/"
    )
