"""Releases are immutable and content-addressed: the id derives from the digest and every file."""

from __future__ import annotations

import pytest

from frontier.errors import FrontierError
from frontier.release.artifact import Artifact
from frontier.release.release import (
    Release,
    ReleaseError,
    check_release_id,
    release_from_manifest,
)
from frontier.render.release import build_release
from frontier.targets import load_stack

DIGEST_A = "sha256:" + "a" * 64
DIGEST_B = "sha256:" + "b" * 64


def wheel(digest: str = DIGEST_A) -> Artifact:
    return Artifact(digest=digest, kind="wheel", filename="frontier_runtime-0.1.0-py3-none-any.whl", size=10)


def test_the_same_digest_and_settings_name_the_same_release():
    settings = load_stack("local")
    first, second = build_release(settings, settings.only_pool, wheel()), build_release(settings, settings.only_pool, wheel())
    assert first.id == second.id and first.manifest() == second.manifest()
    check_release_id(first.id)


def test_a_changed_file_or_digest_names_a_new_release():
    base = Release(wheel(), {"runtime.yaml": "a: 1\n"})
    assert Release(wheel(), {"runtime.yaml": "a: 2\n"}).id != base.id
    assert Release(wheel(DIGEST_B), {"runtime.yaml": "a: 1\n"}).id != base.id
    assert Release(wheel(), {"runtime.yaml": "a: 2\n"}).config_hash != base.config_hash


@pytest.mark.parametrize("tag", ["latest", "frontier-runtime:latest", "sha256:abc", "SHA256:" + "a" * 64, ""])
def test_mutable_tags_and_malformed_digests_are_refused(tag):
    with pytest.raises(FrontierError, match="immutable digest"):
        build_release(local := load_stack("local"), local.only_pool, wheel(tag))


def test_a_stored_release_with_an_altered_file_is_refused():
    release = Release(wheel(), {"runtime.yaml": "a: 1\n", "unit.service": "[Unit]\n"})
    assert release_from_manifest(release.manifest(), dict(release.files)).id == release.id
    with pytest.raises(ReleaseError, match="do not match"):
        release_from_manifest(release.manifest(), {"runtime.yaml": "a: 2\n", "unit.service": "[Unit]\n"})


def test_a_malformed_release_id_is_refused():
    with pytest.raises(ReleaseError, match="malformed"):
        check_release_id("../../etc")
