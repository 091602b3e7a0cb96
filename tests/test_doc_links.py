"""Every relative link in the project's markdown (README.md, docs/, each folder's README.md)
points at a file or folder of the checkout, and every `#anchor` into a markdown page names one of
its headings, so moving a page or renaming a section cannot leave a dead link behind."""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)")  # [text](target); images are checked too below
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def pages() -> List[Path]:
    """The markdown pages users read: README.md, docs/*.md and every folder's README.md."""
    skip = {".venv", "build", "node_modules", ".git", "results"}
    found = [p for p in ROOT.rglob("*.md") if not skip & set(p.relative_to(ROOT).parts)]
    return sorted(p for p in found if p.parent == ROOT / "docs" or p.name == "README.md")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> Set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> List[Tuple[str, str]]:
    """(kind, target) of every relative link outside code blocks."""
    text = FENCE.sub("", page.read_text())
    text = re.sub(r"`[^`\n]*`", "", text)
    found = [("link", t) for t in LINK.findall(text)] + [("image", t) for t in IMAGE.findall(text)]
    return [(k, t) for k, t in found if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in pages()}
    assert {"README.md", "docs/serve.md", "docs/settings.md", "plugins/README.md"} <= names


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path):
    dead = []
    for kind, target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            dead.append(f"{kind} {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor.lower() not in anchors(dest):
            dead.append(f"{kind} {target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not dead, f"{page.relative_to(ROOT)}: " + "; ".join(dead)


def test_a_dead_link_is_caught(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("# Top\n## A_b\n[ok](#top) [also ok](#a_b) [gone](missing.md) "
                    "`[code](skipped.md)`\n[bad](#nowhere)\n")
    found = links(page)
    assert ("link", "missing.md") in found and ("link", "skipped.md") not in found
    assert {"top", "a_b"} <= anchors(page) and "nowhere" not in anchors(page)
