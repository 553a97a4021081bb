"""Local services start with health waits, are found again by later commands, and fail clearly."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from frontier.targets.local import services
from frontier.targets.local.services import ServiceError

SSHD_ADDRESS = "127.0.1.8"


def public_key(tmp_path: Path) -> str:
    key = tmp_path / "key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.with_suffix(".pub").read_text()


def test_sshd_starts_is_found_by_a_later_command_and_stops(tmp_path):
    sshd = services.start_sshd(SSHD_ADDRESS, 2222, tmp_path, public_key(tmp_path), name="sshd-t")
    found = services.find(tmp_path, "sshd-t")
    assert found is not None and found.pid == sshd.pid and found.port == 2222

    services.stop(found)

    assert services.find(tmp_path, "sshd-t") is None
    assert not services.port_in_use(SSHD_ADDRESS, 2222)


def test_a_taken_port_is_refused_naming_it(tmp_path):
    with socket.socket() as holder:
        holder.bind((SSHD_ADDRESS, 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServiceError, match=rf"port {SSHD_ADDRESS}:{port} is already taken"):
            services.start_sshd(SSHD_ADDRESS, port, tmp_path, public_key(tmp_path))


def test_a_missing_package_is_named_with_how_to_install_it():
    with pytest.raises(ServiceError, match=r"install the Debian package 'no-such-package'"):
        services.require_binary("no-such-tool", "no-such-package")


def test_haproxy_refusing_its_config_reports_haproxy_words(tmp_path):
    config = tmp_path / "bad.cfg"
    config.write_text(f"frontend f\n    bind 127.0.0.1:{services.free_port()}\n    no-such-keyword on\n")
    with pytest.raises(ServiceError, match="HAProxy refuses"):
        services.start_haproxy(config, tmp_path)


def test_moto_as_a_process_answers_and_stops(tmp_path):
    moto = services.start_moto(0, tmp_path)
    try:
        assert services.find(tmp_path, "moto").pid == moto.pid
    finally:
        services.stop(moto)
    assert not services.port_in_use("127.0.0.1", moto.port)


def test_a_wait_names_what_never_became_ready_and_how_long_it_waited():
    with pytest.raises(ServiceError, match=r"^the thing never appeared within 0s"):
        services.wait_until(lambda: False, 0.2, "the thing never appeared")


def test_a_wait_returns_as_soon_as_its_probe_holds():
    calls = []
    services.wait_until(lambda: calls.append(1) or len(calls) >= 3, 5, "never", poll_s=0.01)
    assert len(calls) == 3
