"""The commands the README and docs/ show exist: every `irpe COMMAND` written in README.md or
docs/*.md is a subcommand of the CLI, README (the index of the user flows) names every
subcommand, and every `make TARGET` in README.md is a Makefile target."""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Set

from irpe.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
# a command as written to be run: in a code span, after a shell prompt, or after torchrun's flag
IRPE_COMMAND = re.compile(r"(?:`|\$ |--no-python )irpe ([a-z][a-z-]*)")
MAKE_TARGET = re.compile(r"`make ([a-z][a-z-]*)|^\$ make ([a-z][a-z-]*)|^make ([a-z][a-z-]*)", re.M)


def cli_commands() -> Set[str]:
    """Subcommands of `irpe` in this checkout."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def written(pattern: re.Pattern, text: str) -> Set[str]:
    return {next(g for g in m.groups() if g) for m in pattern.finditer(text)}


def test_every_irpe_command_written_in_readme_and_docs_exists():
    commands = cli_commands()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        unknown = sorted(written(IRPE_COMMAND, page.read_text()) - commands)
        assert not unknown, \
            f"{page.relative_to(ROOT)} shows irpe commands that do not exist: {unknown}"


def test_readme_names_every_irpe_command():
    missing = sorted(cli_commands() - written(IRPE_COMMAND, (ROOT / "README.md").read_text()))
    assert not missing, f"README.md's user flows leave out: {missing}"


def test_every_make_target_in_readme_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), re.M))
    shown = written(MAKE_TARGET, (ROOT / "README.md").read_text())
    assert {"run", "test"} <= shown, "README.md must show the two set-up commands"
    unknown = sorted(shown - targets)
    assert not unknown, f"README.md shows make targets the Makefile lacks: {unknown}"


def test_patterns_find_commands_as_written():
    text = ("`irpe export X`\n$ irpe validate m.onnx\ntorchrun --no-python irpe train cls\n"
            "the irpe nope")
    assert written(IRPE_COMMAND, text) == {"export", "validate", "train"}
    assert written(MAKE_TARGET, "make run     # x\n$ make ort-ops\n`make bench` and make nope") == \
        {"run", "ort-ops", "bench"}
