"""`irpe` with fault backends registered first (for tests that run `irpe serve` as a process).

    python tests/fault_serve.py '{"slow": {"delay_s": 0.5}}' serve repo.yaml --port 0
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from irpe.cli import main  # noqa: E402
from serve.backends import register_backend  # noqa: E402
from tests.helpers import FaultBackend  # noqa: E402


def _register(faults: dict) -> None:
    for name, options in faults.items():
        register_backend(name, lambda cfg, threads, o=options: FaultBackend(cfg, threads, **o))


if __name__ == "__main__":
    _register(json.loads(sys.argv[1]))
    sys.exit(main(sys.argv[2:]))
