"""The host agent's start check: a runtime port another process listens on is named before the
runtime is started (which would fail only after loading its weights, as a readiness timeout)."""

from __future__ import annotations

import socket

import pytest
from frontier_hostside.agent import AgentError
from test_host_agent import config, host, release, staged  # noqa: F401 - fixtures


def test_a_runtime_port_another_process_listens_on_is_refused_before_anything_starts(host, config):  # noqa: F811
    host.activate(staged(host, release(config, 1)).id)
    # Another process holds the runtime's port (bound is enough: the runtime's bind is what fails).
    with socket.socket() as holder, pytest.raises(AgentError) as refused:
        holder.bind((config.address, config.port))
        host.start()
    assert str(refused.value) == (
        f"start: port = {config.port} on {config.address} is in use by another process: the runtime "
        "could not listen there; stop that process, or give the stack another runtime.port"
    )
    assert not host.is_running() and not host.pid_file.exists()
