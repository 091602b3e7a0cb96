"""Shared preconditions of the TensorRT plugin tests: skip with the reason on a user's clone
without TensorRT headers / TensorRT-RTX, but fail under CI=true, where both are guaranteed."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest

from tools import trt_plugin_build

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = ROOT / "build" / "test-trt-plugins"


def require(reason: Optional[str]) -> None:
    """Skip (fail under CI=true) when ``reason`` says what is missing."""
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true but the TensorRT plugin build cannot run: {reason}")
    pytest.skip(reason)


def build_or_skip(**kwargs) -> dict:
    """The TensorRT-RTX plugin library (built once per source state under build/)."""
    require(trt_plugin_build.unavailable_reason())
    return trt_plugin_build.build_plugins(BUILD_DIR, **kwargs)
