"""Test aid: with this folder on PYTHONPATH, the top-level packages named in $IRPE_TEST_BLOCKED
(comma-separated) cannot be imported in the process and its children, as on a machine without
them: the bare GPU image has no fastapi/pydantic (tests/gpu must still collect), and matplotlib
is optional for `irpe bench` (tests/test_gpu_check.py, tests/test_bench_install.py)."""
import importlib.abc
import os
import sys

BLOCKED = {n.strip() for n in os.environ.get("IRPE_TEST_BLOCKED", "").split(",") if n.strip()}


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Blocked())
