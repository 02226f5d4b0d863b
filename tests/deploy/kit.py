"""The Kubernetes kit in deploy/kubernetes as the tests read it: the files kustomization.yaml lists,
and their documents by (kind, name)."""
from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "deploy" / "kubernetes"
KUSTOMIZATION = KIT / "kustomization.yaml"


def kustomization() -> dict:
    return yaml.safe_load(KUSTOMIZATION.read_text())


def kit_files() -> list[Path]:
    return [KIT / name for name in kustomization()["resources"]]


def kit_documents() -> list[tuple[Path, dict]]:
    """Every document of every listed file, with its file."""
    return [(path, document) for path in kit_files() for document in yaml.safe_load_all(path.read_text())
            if document is not None]


def documents_by_key() -> dict[tuple[str, str], dict]:
    """(kind, name) -> the document; two documents may not share both."""
    loaded = [document for _, document in kit_documents()]
    by_key = {(document["kind"], document["metadata"]["name"]): document for document in loaded}
    assert len(by_key) == len(loaded), "two documents share a kind and name"
    return by_key
