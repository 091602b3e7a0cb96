"""Shared pieces of the OpenVINO tests: the skip marker (never a skip with CI=true), whether this
CPU runs bf16, and running a compiled model on named numpy feeds."""
from __future__ import annotations

import importlib.util
import os
from typing import Dict

import numpy as np
import pytest


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # tests/blocked_imports raises for a blocked name
        return False


HAVE_OPENVINO = _importable("openvino")
needs_openvino = pytest.mark.skipif(
    not HAVE_OPENVINO and os.environ.get("CI") != "true",
    reason="openvino not installed (pip install 'irpe-deploy[openvino]'; the dev extra has it)")


def cpu_has_bf16() -> bool:
    """Whether OpenVINO's CPU plugin lists BF16 here (bf16 checks run only then)."""
    from irpe.runtime.openvino.core import cpu_capabilities
    return "BF16" in cpu_capabilities()


def run_compiled(compiled, **feeds: np.ndarray) -> Dict[str, np.ndarray]:
    """Outputs of a compiled OpenVINO model by tensor name (copied)."""
    out = compiled.create_infer_request().infer(feeds, share_outputs=False)
    return {o.get_any_name(): out[o] for o in compiled.outputs}
