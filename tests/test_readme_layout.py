"""The maps match the tree, both ways: README.md's Layout table lists every top-level folder and
every folder of the packages irpe/, serve/, export/, plugins/, and nothing that is not there;
plugins/README.md's map lists every entry of plugins/. The tree is `git ls-files` (tracked files
present in the working tree), so build outputs, caches and ignored files never count."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("irpe", "serve", "export", "plugins")
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|\s*(.*?)\s*\|\s*$")


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
