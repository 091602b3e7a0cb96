"""The results file of ``irpe tune``: every finished measurement and accuracy check as one
JSON line, keyed by the candidate's canonical configuration, the stage, the model file, the
loads and the machine, so a tune run again (interrupted, or with a larger budget) reuses what
it already measured and measures only the rest.

The whole file is rewritten through irpe.atomic after each record (it holds tens of lines): an
interrupted tune leaves the records finished before the interrupt, never half a line.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

from irpe.atomic import write_text

__all__ = ["ResultStore"]


class ResultStore:
    """JSON-lines records by key; ``path`` None keeps them in memory only (tests)."""

    def __init__(self, path: Optional[Path], context: str) -> None:
        self.path = path
        self.context = context
        self.records: Dict[str, Dict[str, Any]] = {}
        if path is not None and path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except ValueError:  # not ours, or damaged: measured again
                    continue
                if isinstance(record, dict) and "key" in record:
                    self.records[record["key"]] = record

    def key(self, *parts: Any) -> str:
        """The key of a record: ``parts`` (candidate digest, stage, ...) in this context."""
        import hashlib
        text = "|".join(map(str, (*parts, self.context)))
        return hashlib.sha256(text.encode()).hexdigest()[:20]

    def get(self, key: str) -> Optional[Dict[str, Any]]:
        """The finished record of ``key``, or None."""
        return self.records.get(key)

    def put(self, key: str, record: Dict[str, Any]) -> None:
        """Record ``record`` under ``key`` and rewrite the file."""
        self.records[key] = {**record, "key": key}
        if self.path is not None:
            write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n"
                                          for r in self.records.values()))

    def all(self) -> List[Dict[str, Any]]:
        """Every record, in the order first written."""
        return list(self.records.values())
