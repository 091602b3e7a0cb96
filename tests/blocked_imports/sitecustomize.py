"""Test aid: with this folder on PYTHONPATH, imports in the process and its children are limited
as on another machine:

- $IRPE_TEST_BLOCKED (comma-separated top-level packages): those cannot be imported, as on a
  machine without them (the bare GPU image has no fastapi/pydantic: tests/gpu must still
  collect; matplotlib is optional for `irpe bench`).
- $IRPE_TEST_ONLY_DISTS (comma-separated distributions): only the files of those distributions
  (and the standard library and the checkout) can be imported, as on a machine where exactly
  those are installed: the lent GPU image plus the wheels `make gpu-carry` sends
  (tests/test_gpu_image.py). A module is judged by the file it would load, so the parts of a
  namespace package (opentelemetry-api vs -sdk) are told apart."""
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys

BLOCKED = {n.strip() for n in os.environ.get("IRPE_TEST_BLOCKED", "").split(",") if n.strip()}
ONLY = {re.sub(r"[-_.]+", "-", n.strip()).lower()
        for n in os.environ.get("IRPE_TEST_ONLY_DISTS", "").split(",") if n.strip()}


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
        return None


def _installed_files():
    """{absolute file: distribution} and {top-level name: its distributions} over every
    installed distribution."""
    owner, tops = {}, {}
    for dist in importlib.metadata.distributions():
        dist_name = re.sub(r"[-_.]+", "-", dist.metadata["Name"] or "").lower()
        for file in dist.files or ():
            owner[os.path.realpath(str(dist.locate_file(file)))] = dist_name
            first = file.parts[0] if file.parts else ""
            if first.endswith((".py", ".so")) or (len(file.parts) > 1 and not first.startswith(
                    ".") and not first.endswith((".dist-info", ".data", ".egg-info"))):
                tops.setdefault(first.split(".")[0], set()).add(dist_name)
    return owner, tops


class _OnlyDists(importlib.abc.MetaPathFinder):
    """Refuses a module whose file belongs to an installed distribution outside ONLY. A
    top-level name only such distributions provide is also set to None in sys.modules, so that
    ``importlib.util.find_spec`` answers None for it as for a package that is not installed
    (torch probes optional packages so)."""

    def __init__(self):
        self.owner, tops = _installed_files()
        for top, dists in tops.items():
            if top and top not in sys.stdlib_module_names and top not in sys.modules \
                    and not dists & ONLY:
                sys.modules[top] = None

    def find_spec(self, name, path=None, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not spec.has_location or not spec.origin:
            return None  # not found, or a namespace folder (its parts are judged one by one)
        dist = self.owner.get(os.path.realpath(spec.origin))
        if dist is not None and dist not in ONLY:
            raise ModuleNotFoundError(f"No module named {name!r} ({dist} is not installed here: "
                                      "blocked by the test)", name=name)
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Blocked())
if ONLY:
    sys.meta_path.insert(0, _OnlyDists())
