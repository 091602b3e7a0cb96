"""The maps match the tree, both ways: README.md's Layout table lists every top-level folder and
every folder of the packages irpe/, serve/, export/, plugins/, and nothing that is not there;
plugins/README.md's map lists every entry of plugins/; every folder README's module table names
every source file of its folder (and of its subfolders without a README of their own) and only
files that exist; every markdown table row is inside a table; NOTICE names exactly the files
that point to it; README.md stays an index (at most 250 lines). The tree is `git ls-files`
(tracked files present in the working tree), so build outputs, caches and ignored files never
count."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("irpe", "serve", "export", "plugins")
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")
SOURCES = (".py", ".c", ".cpp", ".cu", ".cuh", ".h")  # what a folder README's table must name
MODULE_HEADERS = ("module", "file", "path")  # first header cell of a module table
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
NAME = re.compile(r"`([^`\s]+)`")


def tracked_files() -> List[str]:
    """Tracked files of the checkout that exist in the working tree, as posix paths."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"not a git checkout: {exc}")
    return [name for name in listed if name and (ROOT / name).is_file()]


def folders(files: List[str]) -> Set[str]:
    """Every folder holding a tracked file, directly or below, as 'a/b/'."""
    return {"/".join(parts[:i]) + "/" for parts in (f.split("/") for f in files)
            for i in range(1, len(parts))}


def section(text: str, heading: str) -> str:
    """The body of the markdown section ``## heading`` (up to the next level-2 heading)."""
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert found, f"no '## {heading}' section"
    return found.group(1)


def table(text: str) -> Dict[str, str]:
    """``| `path` | what |`` rows -> {path: what}; a path listed twice is an error."""
    rows: Dict[str, str] = {}
    for line in text.splitlines():
        row = ROW.match(line)
        if row:
            assert row.group(1) not in rows, f"{row.group(1)} listed twice"
            rows[row.group(1)] = row.group(2)
    return rows


def required_folders(files: List[str]) -> Set[str]:
    """Top-level folders, and every folder of the packages (README's Layout must list them)."""
    every = folders(files)
    return {f for f in every if f.count("/") == 1 or f.split("/")[0] in PACKAGES}


def test_readme_layout_lists_every_folder_and_only_real_ones():
    files = tracked_files()
    listed = table(section((ROOT / "README.md").read_text(), "Layout"))
    assert listed, "README's Layout section has no | `folder/` | what | rows"
    missing = sorted(required_folders(files) - set(listed))
    assert not missing, f"folders missing from README's Layout section: {missing}"
    absent = sorted(set(listed) - folders(files))
    assert not absent, f"README's Layout lists folders the tree does not have: {absent}"
    blank = sorted(path for path, what in listed.items() if not what)
    assert not blank, f"README's Layout rows without a description: {blank}"


README_MAX_LINES = 250  # the agreed ceiling: README is the index, the reference lives in docs/


def test_readme_stays_an_index():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (f"README.md has {lines} lines (at most {README_MAX_LINES}):"
                                       " move reference detail into docs/ and link it")


def test_plugins_readme_maps_every_entry_of_plugins():
    files = [f[len("plugins/"):] for f in tracked_files() if f.startswith("plugins/")]
    entries = {f.split("/")[0] + ("/" if "/" in f else "") for f in files} - {"README.md"}
    listed = table(section((ROOT / "plugins" / "README.md").read_text(), "Map"))
    missing = sorted(entries - set(listed))
    assert not missing, f"plugins/README.md's map leaves out: {missing}"
    absent = sorted(set(listed) - entries)
    assert not absent, f"plugins/README.md's map lists what plugins/ does not have: {absent}"


def test_layout_check_catches_drift_both_ways():
    """The checks above fail on a missing folder and on a listed folder that does not exist."""
    files = ["irpe/a.py", "irpe/new/b.py", "top/c.txt", "tests/gpu/d.py",
             "benchmarks/results/x/y.md"]
    assert required_folders(files) == {"irpe/", "irpe/new/", "top/", "tests/", "benchmarks/"}
    listed = table("| `irpe/` | math |\n| `gone/` | old |\n")
    assert required_folders(files) - set(listed) == {"irpe/new/", "top/", "tests/", "benchmarks/"}
    assert set(listed) - folders(files) == {"gone/"}
    with pytest.raises(AssertionError, match="listed twice"):
        table("| `irpe/` | a |\n| `irpe/` | b |\n")


# ------------------------------------------------------------------------ folder READMEs

def tables(text: str) -> Iterator[Tuple[int, List[str]]]:
    """Each run of ``|`` lines outside code fences: (its first line number, its lines)."""
    block: List[str] = []
    start, fenced = 0, False
    for number, line in enumerate(text.splitlines() + [""], 1):
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            start = start if block else number
            block.append(line)
        elif block:
            yield start, block
            block = []


def cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def module_rows(text: str) -> List[Tuple[List[str], str]]:
    """The module table's rows as (names of the first cell, the rest of the row): the first
    table whose header starts with one of MODULE_HEADERS."""
    for _, lines in tables(text):
        if cells(lines[0])[0].lower() in MODULE_HEADERS:
            return [(NAME.findall(cells(row)[0]), " | ".join(cells(row)[1:]))
                    for row in lines[2:]]
    return []


def norm(folder: str, name: str) -> str:
    """``name`` of a README in ``folder`` ('a/b/') as a repository path (a folder ends in /)."""
    path = os.path.normpath(folder + name).replace(os.sep, "/")
    return path + "/" if name.endswith("/") else path


def readme_drift(folder: str, text: str, files: List[str]) -> Tuple[List[str], List[str]]:
    """(source files the module table of ``folder``'s README leaves out, names it lists that do
    not exist). Required: the folder's sources and those of its subfolders without a README
    of their own (named in the subfolder's row), ``__init__.py`` excepted (the READMEs name the
    modules; a package marker is named only where it holds more). A subfolder with a README
    covers itself."""
    every, dirs = set(files), folders(files)
    readme_dirs = {f.rsplit("/", 1)[0] + "/" for f in files if f.endswith("/README.md")}
    required = {f for f in files if f.startswith(folder) and f.endswith(SOURCES)
                and not f.endswith("__init__.py")
                and not any(d != folder and d.startswith(folder) and f.startswith(d)
                            for d in readme_dirs)}
    named, absent = set(), []
    for names, rest in module_rows(text):
        for name in names:
            path = norm(folder, name)
            if path not in every and path not in dirs:
                absent.append(name)
            named.add(path)
            if name.endswith("/"):  # a folder's row names its files
                for inner in NAME.findall(rest):
                    if inner.endswith(SOURCES):
                        inner_path = norm(path, inner)
                        named.add(inner_path)
                        if inner_path not in every:
                            absent.append(name + inner)
                if path in readme_dirs:
                    named.update(f for f in every if f.startswith(path))
    return sorted(required - named), sorted(absent)


def folder_readmes(files: List[str]) -> List[str]:
    return sorted(f for f in files if f.endswith("/README.md"))


def test_every_folder_readme_names_its_sources_and_only_real_files():
    files = tracked_files()
    assert folder_readmes(files), "no folder README.md tracked"
    for readme in folder_readmes(files):
        folder, text = readme[:-len("README.md")], (ROOT / readme).read_text()
        assert module_rows(text), f"{readme} has no module table (| module/file/path | what |)"
        missing, absent = readme_drift(folder, text, files)
        assert not missing, f"{readme}'s module table leaves out: {missing}"
        assert not absent, f"{readme}'s module table names what does not exist: {absent}"


def test_every_markdown_table_row_is_inside_a_table():
    """A table is a header row, a |---| separator, then rows; a lone row (text between it and
    its table) renders as text."""
    for name in (f for f in tracked_files() if f.endswith(".md")):
        for start, lines in tables((ROOT / name).read_text()):
            assert len(lines) >= 2 and SEPARATOR.match(lines[1]), \
                f"{name}:{start}: table row outside a table: {lines[0][:60]}"


def test_readme_check_catches_drift_both_ways():
    """The folder-README check fails on a source file without a row, on a subfolder file its
    row does not name, and on a listed name the tree does not have; __init__.py and a
    subfolder with a README of its own are not required."""
    files = ["pkg/README.md", "pkg/__init__.py", "pkg/a.py", "pkg/b.cpp", "pkg/data.json",
             "pkg/sub/x.py", "pkg/sub/y.h", "pkg/own/README.md", "pkg/own/z.cu"]
    text = ("| module | what |\n|---|---|\n| `a.py`, `b.cpp` | a, b |\n"
            "| `sub/` | `x.py`: x; `y.h` |\n| `own/` | [own/README.md](own/README.md) |\n")
    assert readme_drift("pkg/", text, files) == ([], [])
    assert readme_drift("pkg/", text.replace("`a.py`, ", ""), files) == (["pkg/a.py"], [])
    assert readme_drift("pkg/", text.replace("; `y.h`", ""), files) == (["pkg/sub/y.h"], [])
    assert readme_drift("pkg/", text + "| `gone.py` | old |\n| `sub/` | `w.py` |\n",
                        files) == ([], ["gone.py", "sub/w.py"])
    assert readme_drift("pkg/", "| what | x |\n|---|---|\n| `a.py` | a |\n", files)[0] == [
        "pkg/a.py", "pkg/b.cpp", "pkg/sub/x.py", "pkg/sub/y.h"]  # no module table at all
    lone = list(tables("| h | x |\n|---|---|\n| `a` | b |\n\ntext\n| `c` | d |\n"))
    assert [(start, len(lines)) for start, lines in lone] == [(1, 3), (6, 1)]


def test_notice_names_exactly_the_files_that_point_to_it():
    """NOTICE lists the files that follow another project's code; each of them, and no other
    source file, says so at its top ("see NOTICE")."""
    notice = (ROOT / "NOTICE").read_text()
    named = set(re.findall(r"^\s+- (\S+)\s", notice, re.M))
    assert named, "NOTICE lists no file"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"NOTICE names files the tree does not have: {missing}"
    pointing = {f for f in tracked_files() if f.endswith(SOURCES)
                and "see NOTICE" in (ROOT / f).read_text(errors="replace")[:300]}
    assert pointing == named, (f"listed but not pointing: {sorted(named - pointing)}; "
                               f"pointing but not listed: {sorted(pointing - named)}")
