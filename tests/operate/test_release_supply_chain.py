"""Each artifact's SBOM (CycloneDX, by cyclonedx-py) and audit (pip-audit), as ``fab release.build``
makes them, keeps them beside the artifact, and a deploy's history record carries them.

The tools are the real ones, installed from requirements/release-tools.txt with --require-hashes
into their own venv (the tests that run them start processes: tests/conftest.py lists them). The
audit asks PyPI's vulnerability service; where that service cannot be reached for every package,
the audit says it did not run and why, never zero.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from frontier.release.artifact import Artifact
from frontier.release.history import HistoryStore
from frontier.release.release import Release
from frontier.release.sbom import (
    Audit,
    Finding,
    SupplyChainError,
    ensure_tools,
    get_supply_chain,
    lock_for,
    make_sbom,
    put_supply_chain,
    read_audit,
    refusal,
    run_audit,
)
from frontier.rollout.deploy import _supply_chain_fields

WHEEL = Artifact("sha256:" + "5" * 64, "wheel", "frontier_runtime-0.1.0-py3-none-any.whl", 1234)


def locked_packages(lock: Path) -> int:
    return sum(1 for line in lock.read_text().splitlines() if line[:1].isalnum())


@pytest.fixture
def store():
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="frontier-test-history")
        yield HistoryStore(s3, "frontier-test-history", "test")


@pytest.fixture(scope="module")
def release_tools() -> Path:
    return ensure_tools()


# --- reading pip-audit's report, and what a stack refuses --------------------------------------------


def test_an_audit_whose_service_skipped_a_package_did_not_run_and_says_why():
    report = {
        "dependencies": [
            {"name": "a", "version": "1", "vulns": []},
            {"name": "b", "skip_reason": "Dependency not found on PyPI and could not be audited: b (2)"},
        ]
    }
    audit = read_audit(report)
    assert not audit.ran
    assert audit.summary() == (
        "audit: not run (1 of 2 packages could not be audited, e.g. "
        "Dependency not found on PyPI and could not be audited: b (2))"
    )


def test_an_audit_that_asked_about_every_package_counts_its_findings_by_severity():
    report = {
        "dependencies": [
            {"name": "a", "version": "1", "vulns": [{"id": "PYSEC-1", "fix_versions": ["2"]}]},
            {"name": "b", "version": "3", "vulns": []},
        ]
    }
    audit = read_audit(report)
    assert audit.ran and audit.findings == (Finding("a", "1", "PYSEC-1", ("2",), "unknown"),)
    assert audit.summary() == "audit: 1 known vulnerabilities in 2 packages (1 unknown)"
    assert read_audit({"dependencies": [{"name": "b", "version": "3", "vulns": []}]}).summary() == (
        "audit: 0 known vulnerabilities in 1 packages"
    )


def test_a_stack_that_refuses_nothing_takes_any_audit():
    assert refusal(Audit(ran=False, reason="offline"), "none", "prod") is None


def test_a_threshold_refuses_an_audit_that_did_not_run():
    refused = refusal(Audit(ran=False, reason="offline"), "high", "prod")
    assert refused == (
        "stack prod refuses releases with known vulnerabilities at or above high, and this release's "
        "audit: not run (offline)"
    )


def test_a_threshold_refuses_findings_at_or_above_it_and_those_of_unknown_severity():
    low = Finding("a", "1", "GHSA-low", severity="low")
    high = Finding("b", "2", "GHSA-high", severity="high")
    unknown = Finding("c", "3", "PYSEC-x")
    assert refusal(Audit(ran=True, packages=3, findings=(low,)), "medium", "prod") is None
    assert "b 2 GHSA-high (high)" in (refusal(Audit(True, "", 3, (low, high)), "high", "prod") or "")
    assert "c 3 PYSEC-x (unknown)" in (refusal(Audit(True, "", 3, (unknown,)), "critical", "prod") or "")


def test_the_threshold_is_a_stack_setting_with_its_allowed_values_named():
    from frontier.config.schema import Releases

    assert Releases().refuse_vulnerabilities_at == "none"
    allowed = r"(?s)refuse_vulnerabilities_at.*'none', 'low', 'medium', 'high' or 'critical'.*'severe'"
    with pytest.raises(ValueError, match=allowed):
        Releases(refuse_vulnerabilities_at="severe")


# --- the real tools ----------------------------------------------------------------------------------


def test_the_sbom_lists_every_locked_package_and_the_wheel_as_its_component_reproducibly(release_tools):
    lock = lock_for(WHEEL)
    first, second = make_sbom(WHEEL, lock, release_tools), make_sbom(WHEEL, lock, release_tools)
    assert first.digest == second.digest  # no timestamp, no random serial number
    data = json.loads(first.document)
    assert data["bomFormat"] == "CycloneDX" and data["specVersion"] == "1.6"
    assert first.components == len(data["components"]) == locked_packages(lock)
    described = data["metadata"]["component"]
    assert described["name"] == "frontier-runtime"
    assert described["hashes"] == [{"alg": "SHA-256", "content": "5" * 64}]
    purls = {c["purl"].split("@")[0] for c in data["components"]}
    assert "pkg:pypi/torch" in purls and "pkg:pypi/fastapi" in purls


def test_the_audit_asked_about_every_locked_package_or_says_it_did_not_run(release_tools):
    lock = lock_for(WHEEL)
    audit = run_audit(lock, release_tools)
    if audit.ran:
        assert audit.packages == locked_packages(lock)
    else:
        assert audit.summary().startswith("audit: not run (") and audit.reason
        assert "0 known" not in audit.summary()


# --- kept beside the artifact, and in the deploy's record ------------------------------------------


def test_the_sbom_and_audit_are_kept_beside_the_artifact_and_a_deploy_record_carries_their_counts(store):
    from frontier.release.sbom import Sbom

    sbom = Sbom(document=b'{"components": [{"name": "a"}, {"name": "b"}]}\n', components=2)
    audit = Audit(ran=False, reason="PyPI's vulnerability service not reachable")
    artifact = Artifact(WHEEL.digest, "wheel", WHEEL.filename, WHEEL.size, sbom=sbom.digest)
    store.put_artifact(artifact, None)
    put_supply_chain(store, artifact, sbom, audit)
    kept = get_supply_chain(store, store.get_artifact(artifact.digest))
    assert kept is not None and (kept.components, kept.sbom_digest) == (2, sbom.digest)
    fields = _supply_chain_fields(store, Release(artifact))
    assert fields == {
        "sbom": sbom.digest,
        "sbom_components": 2,
        "audit": "not run (PyPI's vulnerability service not reachable)",
    }


def test_the_sbom_digest_is_in_the_release_manifest_that_the_release_key_signs():
    artifact = Artifact(WHEEL.digest, "wheel", WHEEL.filename, WHEEL.size, sbom="sha256:" + "7" * 64)
    manifest = json.loads(Release(artifact, {"runtime.yaml": "x\n"}).manifest())
    assert manifest["artifact"]["sbom"] == "sha256:" + "7" * 64
    assert "sbom" not in json.loads(Release(WHEEL, {"runtime.yaml": "x\n"}).manifest())["artifact"]


def test_a_stored_sbom_that_differs_from_its_record_is_refused(store):
    from frontier.release.sbom import Sbom

    sbom = Sbom(document=b'{"components": []}\n', components=0)
    artifact = Artifact(WHEEL.digest, "wheel", WHEEL.filename, WHEEL.size, sbom=sbom.digest)
    put_supply_chain(store, artifact, sbom, Audit(ran=False, reason="x"))
    key = f"{store.artifacts_prefix}artifacts/{artifact.digest.replace(':', '-')}/sbom.cdx.json"
    store.s3.put_object(Bucket=store.bucket, Key=key, Body=b'{"components": [{"name": "extra"}]}\n')
    with pytest.raises(SupplyChainError, match="the stored SBOM is sha256:.*its record says"):
        get_supply_chain(store, artifact)


def test_a_record_of_an_artifact_built_before_sboms_says_so(store):
    assert _supply_chain_fields(store, Release(WHEEL)) == {
        "sbom_components": None,
        "audit": "no SBOM: built before SBOMs were made",
    }
