"""Test aid: on PYTHONPATH, makes the serving stack (fastapi, pydantic, starlette, uvicorn)
unimportable in this process and its children, as on the bare GPU image (tests/gpu must still
collect there; tests/test_gpu_check.py)."""
import importlib.abc
import sys

BLOCKED = {"fastapi", "pydantic", "pydantic_core", "pydantic_settings", "starlette", "uvicorn"}


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, _Blocked())
