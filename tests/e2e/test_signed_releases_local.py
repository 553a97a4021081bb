"""Hosts run only what the stack's release key signed, on the local stack under load.

Two host slots over real sshd, HAProxy, moto enforcing IAM with the stack's release key (made by
``local.up`` as the Foundation makes it on a cloud stack), the real runtime. Release A was signed at
its deploy; each slot holds the key's public half (``<root>/release-key.pub``, read as its host
role). A steady load runs through the balancer while a release whose rendered file was changed
after signing, and one signed by another stack's key, are rolled: the host agent refuses each at
stage, in one line, before anything is switched, so A keeps serving and no request fails.
"""

from __future__ import annotations

import json
import time

import pytest

from frontier.release.release import Release
from frontier.release.sbom import ensure_tools, lock_for, make_sbom, put_supply_chain, run_audit
from frontier.release.signing import SigningError, create_release_key, find_release_key, sign_release
from frontier.rollout.deploy import deploy, rollback
from frontier.targets import backend_for
from frontier.targets.local import cluster as local
from tests.e2e.test_rollout_under_load import report, running_releases, steady_load

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
# A refusal comes before any host is touched, often within a second: the load runs on this long
# after it, so the requests counted cover the old release serving on.
AFTER_S = 2.0


def changed_after_signing(release: Release) -> Release:
    """``release`` with runtime.yaml altered and its old signature kept (release.json matches the files)."""
    files = {**release.files, "runtime.yaml": release.files["runtime.yaml"] + "# changed after signing\n"}
    return Release(release.artifact, files, signature=release.signature)


def test_release_a_was_signed_at_deploy_and_every_slot_holds_the_public_key(cluster):
    settings = cluster.settings
    stored = backend_for(settings).history_store().get_release(cluster.release_a)
    key = find_release_key(local.aws_client(settings, "kms"), settings.stack)
    assert key is not None and stored.signature
    assert json.loads(stored.signature)["key_id"].endswith(key.arn.rsplit("/", 1)[-1])
    for host in settings.inventory.hosts:
        assert (local.host_root(host) / "release-key.pub").read_text().strip() == key.public_key


def test_a_rendered_file_changed_after_signing_is_refused_by_the_host_agent_and_a_keeps_serving(
    cluster, capsys
):
    settings = cluster.settings
    backend = backend_for(settings)
    tampered = changed_after_signing(backend.history_store().get_release(cluster.release_a))
    assert tampered.id != cluster.release_a
    load = steady_load(settings)
    try:
        result = backend.roll(tampered, "deploy", None)
        time.sleep(AFTER_S)  # release A goes on serving after the refusal, under the same load
    finally:
        samples = load.stop()
    failed = [s for s in samples if not s.ok]
    report(
        capsys, f"tampered {tampered.id}: {result.outcome}; requests sent={len(samples)} failed={len(failed)}"
    )
    assert result.outcome != "succeeded"
    assert "does not verify with stack local's release key" in result.reason
    assert failed == [] and len(samples) >= 5
    assert set(running_releases(settings).values()) == {cluster.release_a}


def test_a_release_signed_by_another_stacks_key_is_refused_and_a_keeps_serving(cluster, capsys):
    settings = cluster.settings
    backend = backend_for(settings)
    release_a = backend.history_store().get_release(cluster.release_a)
    # Another stack's release key, signing this stack's next release as its own deploy role would.
    admin = local.aws_client(settings, "kms", actor="admin")
    other = create_release_key(admin, "other-stack")
    unsigned = Release(
        release_a.artifact, {**release_a.files, "runtime.yaml": release_a.files["runtime.yaml"] + "# b\n"}
    )
    foreign = sign_release(admin, other, settings.stack, unsigned)
    load = steady_load(settings)
    try:
        result = backend.roll(foreign, "deploy", None)
        time.sleep(AFTER_S)  # release A goes on serving after the refusal, under the same load
    finally:
        samples = load.stop()
    failed = [s for s in samples if not s.ok]
    report(
        capsys,
        f"foreign-signed {foreign.id}: {result.outcome}; requests sent={len(samples)} failed={len(failed)}",
    )
    assert result.outcome != "succeeded"
    assert "does not verify" in result.reason
    assert failed == []
    assert set(running_releases(settings).values()) == {cluster.release_a}


def test_a_rollback_to_a_release_altered_in_the_history_is_refused_before_any_host(cluster):
    settings = cluster.settings
    backend = backend_for(settings)
    store = backend.history_store()
    tampered = changed_after_signing(store.get_release(cluster.release_a))
    store.put_release(tampered)
    with pytest.raises(
        SigningError, match=r"rollback refused: release r-[0-9a-f]{12}: release.sig does not verify"
    ):
        rollback(backend, to=tampered.id)
    assert set(running_releases(settings).values()) == {cluster.release_a}


def test_each_deploy_record_carries_its_sbom_and_audit_and_fab_history_shows_them(cluster, capsys):
    settings = cluster.settings
    backend = backend_for(settings)
    store = backend.history_store()
    artifact = store.get_artifact(cluster.digest)
    tools = ensure_tools()
    sbom = make_sbom(artifact, lock_for(artifact), tools)
    audit = run_audit(lock_for(artifact), tools)
    from dataclasses import replace

    with_sbom = replace(artifact, sbom=sbom.digest)
    store.put_artifact(with_sbom, None)
    put_supply_chain(store, with_sbom, sbom, audit)
    deploy(backend, cluster.digest)
    record = store.records()[-1]
    assert record["sbom_components"] == sbom.components and record["audit"] == audit.summary().removeprefix(
        "audit: "
    )
    assert record["signed_by"]

    from frontier.cli.ops import history

    history.body(None, stack=settings.stack)
    shown = capsys.readouterr().out
    report(capsys, f"fab history's last row: sbom {sbom.components}, {audit.summary()}")
    assert str(sbom.components) in shown and "sbom" in shown and "audit" in shown
