"""Every object of the Kubernetes kit against the Kubernetes API's own JSON schemas, offline: the
schemas come bundled in kubernetes-validate (pyproject's dev extras), so no cluster and no download
is needed. Strict: a field the API does not know (a typo such as `containerport`) fails, as a wrong
type or a missing required field does. Checked at the oldest Kubernetes the kit supports and the
newest the validator knows.

The Gateway API and Inference Extension kinds are CRDs, whose schemas the validator does not ship:
those documents are skipped here, and test_kubernetes_manifests.py checks their fields against the
objects they refer to."""
from __future__ import annotations

import copy

import kubernetes_validate
import pytest
from kit import kit_documents

# grpc probes (the EPP's) are stable from 1.27; Kubernetes supports each release for about 14 months.
OLDEST_KUBERNETES = "1.29"
NEWEST_KUBERNETES = kubernetes_validate.utils.latest_version()
CRD_GROUPS = ("gateway.networking.k8s.io/", "inference.networking.k8s.io/", "inference.networking.x-k8s.io/")
DOCUMENTS = kit_documents()


def validate(document: dict, version: str) -> None:
    kubernetes_validate.validate(document, version, strict=True)


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, NEWEST_KUBERNETES])
@pytest.mark.parametrize(
    "path,document", DOCUMENTS, ids=[f"{path.name}:{doc['kind']}/{doc['metadata']['name']}" for path, doc in DOCUMENTS]
)
def test_every_object_matches_the_kubernetes_schema(path, document, version):
    if document["apiVersion"].startswith(CRD_GROUPS):
        pytest.skip(f"{document['kind']} is a CRD: no bundled schema (test_kubernetes_manifests.py checks its fields)")
    validate(document, version)


def test_the_kit_holds_objects_the_schemas_check():
    checked = {document["kind"] for _, document in DOCUMENTS if not document["apiVersion"].startswith(CRD_GROUPS)}
    assert {"Deployment", "Service", "Job", "ConfigMap", "Secret", "NetworkPolicy"} <= checked


def engine_deployment() -> dict:
    (engine,) = [document for _, document in DOCUMENTS
                 if (document["kind"], document["metadata"]["name"]) == ("Deployment", "loraloom-engine")]
    return copy.deepcopy(engine)


@pytest.mark.parametrize("break_it,error", [
    (lambda spec: spec["template"]["spec"]["containers"][0]["ports"][0].update(containerport=8000), "containerport"),
    (lambda spec: spec.update(replicas="two"), "'two' is not of type 'integer'"),
    (lambda spec: spec["template"]["spec"]["containers"][0].pop("name"), "'name' is a required property"),
], ids=["misspelled field", "wrong type", "missing required field"])
def test_a_broken_manifest_fails_validation(break_it, error):
    broken = engine_deployment()
    break_it(broken["spec"])
    with pytest.raises(kubernetes_validate.ValidationError) as raised:
        validate(broken, OLDEST_KUBERNETES)
    assert error in raised.value.message
