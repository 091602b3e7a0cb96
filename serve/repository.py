"""The model-repository file of ``irpe serve`` (YAML or TOML): parsed, with its paths made
relative to its own folder, so a repository moves with its model files. The lowest-priority
source of :class:`serve.config.ServeSettings`."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from irpe.errors import InvalidInput, MissingFile

__all__ = ["read_repository"]

# a model's keys that name files (relative: to the repository's folder)
_PATH_KEYS = ("path", "metadata", "ort_ops_library", "ov_ops_library")


def read_repository(path: Path) -> Dict[str, Any]:
    """Parse a YAML/TOML repository file; model paths become relative to its folder."""
    data = _parse(path)
    if not isinstance(data, dict):
        raise InvalidInput(f"{path}: expected a mapping at the top level")
    models = data.get("models", [])
    if not isinstance(models, list):
        raise InvalidInput(f"{path}: 'models' must be a list")
    base = path.resolve().parent
    data["models"] = [_relative_to(m, base) if isinstance(m, dict) else m for m in models]
    for key in ("ort_ops_library", "ov_ops_library"):
        library = data.get(key)
        if isinstance(library, str) and not Path(library).is_absolute():
            data[key] = str(base / library)
    return data


def _parse(path: Path) -> Any:
    not_repo = f"{path} is not a YAML/TOML repository file"
    if path.suffix.lower() not in (".toml", ".yaml", ".yml"):
        raise InvalidInput(f"{not_repo} (expected .yaml, .yml or .toml)")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MissingFile(f"model repository not found: {path}") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{not_repo} (not UTF-8 text)") from None
    if path.suffix.lower() == ".toml":
        import tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InvalidInput(f"{path}: invalid TOML: {exc}") from None
    import yaml
    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{path}: invalid YAML: {exc}".replace("\n", " ")) from None


def _relative_to(model: Dict[str, Any], base: Path) -> Dict[str, Any]:
    out = dict(model)
    for key in _PATH_KEYS:
        if isinstance(out.get(key), str) and not Path(out[key]).is_absolute():
            out[key] = str(base / out[key])
    if isinstance(out.get("labels"), str) and not Path(out["labels"]).is_absolute():
        out["labels"] = str(base / out["labels"])
    if isinstance(out.get("plugins"), list):
        out["plugins"] = [str(base / p) if isinstance(p, str) and not Path(p).is_absolute()
                          else p for p in out["plugins"]]
    return out
