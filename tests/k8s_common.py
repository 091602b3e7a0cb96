"""Shared pieces of the deploy/ manifest tests (tests/test_k8s_manifests.py,
tests/test_kuberay_manifest.py): where the manifests are, and the round trip through the
official Kubernetes client's models that checks their field names and types."""
from __future__ import annotations

import json
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def round_trip(doc: dict, model: str) -> dict:
    """``doc`` read into a Kubernetes client model and written back: unknown fields vanish."""
    from kubernetes.client import ApiClient
    api = ApiClient()
    return api.sanitize_for_serialization(api.deserialize(json.dumps(doc), model,
                                                          "application/json"))
