"""docs/settings.md lists every environment variable the product reads itself: a walk over the
syntax of irpe/, export/ and serve/ finds each ``os.environ`` / ``os.getenv`` read and its name,
and the table must name exactly those (so neither side can drift)."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("irpe", "export", "serve")
DOC = ROOT / "docs" / "settings.md"
_ROW = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|")


def _is(node: ast.AST, name: str) -> bool:
    """``node`` is ``os.<name>``."""
    return (isinstance(node, ast.Attribute) and node.attr == name
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _constants(tree: ast.Module) -> Dict[str, str]:
    """Module-level ``NAME = "TEXT"`` assignments."""
    out = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            out.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return out


def _literal_calls(tree: ast.Module, function: str) -> List[str]:
    """First arguments, as literals, of every call of ``function`` in the module."""
    return [c.args[0].value for c in ast.walk(tree)
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == function
            and c.args and isinstance(c.args[0], ast.Constant)]


def _names(key: ast.AST, tree: ast.Module, scope: Optional[ast.FunctionDef], where: str
           ) -> List[str]:
    """The variable names a read's key stands for: a literal, a module constant, or a parameter
    of the enclosing function that every call passes as a literal."""
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return [key.value]
    if isinstance(key, ast.Name) and key.id in _constants(tree):
        return [_constants(tree)[key.id]]
    if isinstance(key, ast.Name) and scope is not None and key.id in [
            a.arg for a in scope.args.args]:
        names = _literal_calls(tree, scope.name)
        assert names, f"{where}: {scope.name}({key.id}) is never called with a literal name"
        return names
    raise AssertionError(f"{where}: the variable's name is not a literal or a module constant")


def _reads(path: Path, root: Path = ROOT) -> Set[str]:
    """Names of the environment variables ``path`` reads."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: Set[str] = set()
    for node in ast.walk(tree):
        if not (_is(node, "environ") or _is(node, "getenv")):
            continue
        where, parent = f"{path.relative_to(root)}:{node.lineno}", parents[node]
        scope = parent
        while scope is not None and not isinstance(scope, ast.FunctionDef):
            scope = parents.get(scope)
        grand = parents.get(parent)
        if _is(node, "getenv") and isinstance(parent, ast.Call):
            key = parent.args[0]
        elif isinstance(parent, ast.Subscript):
            key = parent.slice
        elif (isinstance(parent, ast.Attribute) and parent.attr in ("get", "setdefault", "pop")
              and isinstance(grand, ast.Call)):
            key = grand.args[0]
        elif isinstance(parent, ast.Compare) and isinstance(parent.ops[0], (ast.In, ast.NotIn)):
            key = parent.left
        elif isinstance(parent, ast.Call) and getattr(parent.func, "id", "") == "dict":
            continue  # a copy of the whole environment for a child process, not a read
        elif (isinstance(parent, ast.Attribute) and parent.attr == "update"
              and isinstance(grand, ast.Call)):
            continue  # variables set for child processes (Ray's nodes), not a read
        else:
            raise AssertionError(f"{where}: an environment access this test cannot name")
        found.update(_names(key, tree, scope, where))
    return found


def product_reads() -> Dict[str, Set[str]]:
    """Every variable read in the product folders -> the files reading it."""
    reads: Dict[str, Set[str]] = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in _reads(path):
                reads.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return reads


def table_names() -> Set[str]:
    """The variables of the table under "## Environment variables" in docs/settings.md."""
    text = DOC.read_text(encoding="utf-8").split("## Environment variables", 1)[1]
    section = text.split("\n## ", 1)[0]
    return {m.group(1) for line in section.splitlines() if (m := _ROW.match(line))}


def test_the_table_lists_exactly_the_variables_the_product_reads():
    reads, listed = product_reads(), table_names()
    unlisted = {name: sorted(files) for name, files in reads.items() if name not in listed}
    assert not unlisted, f"read but not in docs/settings.md: {unlisted}"
    assert not listed - set(reads), f"in docs/settings.md but read nowhere: {listed - set(reads)}"
    assert {"IRPE_ORT_FUSE", "IRPE_FUSED_ATTENTION", "WORLD_SIZE"} <= listed  # the walk works


def test_the_walk_names_every_kind_of_read(tmp_path):
    """Literals, module constants, parameters called with literals, ``in``, getenv; a name it
    cannot see fails instead of passing unnoticed."""
    src = tmp_path / "m.py"
    src.write_text('import os\nENV = "B"\ndef f(name):\n    return os.environ.get(name)\n'
                   'f("C")\nx = os.environ["A"], os.environ.get(ENV), os.getenv("D"), '
                   '"E" in os.environ, dict(os.environ)\n')
    assert _reads(src, tmp_path) == {"A", "B", "C", "D", "E"}
    src.write_text("import os\nkey = input()\nos.environ.get(key)\n")
    with pytest.raises(AssertionError, match="m.py:3: the variable's name is not a literal"):
        _reads(src, tmp_path)


def test_every_serve_variable_name_is_documented():
    """Each ServeSettings field that took over an older variable names both in the doc."""
    from serve.config import ServeSettings
    text = DOC.read_text(encoding="utf-8")
    for name, field in ServeSettings.model_fields.items():
        alias = field.validation_alias
        for env in getattr(alias, "choices", []):
            assert f"`{env}`" in text, f"{name}: {env} is not in docs/settings.md"
