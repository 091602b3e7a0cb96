"""The requirements scripts/install.sh installs for a variant, besides torch and the project
itself, read from pyproject.toml: one per line. Used for the image's dependency layer (which then
survives source edits) and for the offline wheelhouse (scripts/docker-wheelhouse.sh).

    python3 scripts/requirements.py cpu|gpu [--build]    # --build: + the build backend's
"""
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# install.sh's extras per variant; gpu adds onnx (the export extra would bring CPU onnxruntime)
EXTRAS = {"cpu": (["serve", "export", "openvino"], []),
          "gpu": (["serve", "gpu"], ["onnx>=1.16"])}


def requirements(variant: str, build: bool = False) -> list:
    """Dependencies + the variant's extras (+ build-system requires), torch left out."""
    config = tomllib.loads(PYPROJECT.read_text())
    project = config["project"]
    extras, extra_reqs = EXTRAS[variant]
    reqs = [r for r in project["dependencies"] if not r.startswith("torch")]
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    reqs += extra_reqs
    if build:
        reqs += config["build-system"]["requires"] + ["wheel"]
    return list(dict.fromkeys(reqs))


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] not in EXTRAS or args[1:] not in ([], ["--build"]):
        sys.exit("usage: requirements.py cpu|gpu [--build]")
    print("\n".join(requirements(args[0], build=args[1:] == ["--build"])))
