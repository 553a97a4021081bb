"""Rendering: every host file comes from templates/, deterministically, and is valid for its reader."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jinja2
import pytest
import yaml
from frontier_hostside.names import (
    JIT_CACHE_DIR,
    JIT_CACHE_ENV,
    JIT_CACHE_MIB,
    PLACEHOLDER_DIGEST,
    RUNTIME_UID,
    UNIT_NAME,
)
from frontier_runtime.config import RuntimeSettings, parse_config

from frontier import project
from frontier.errors import FrontierError
from frontier.render.alerts import METRICS, render_alerts
from frontier.render.boot import render_cloud_init, render_driver_script
from frontier.render.host import render_release_files, render_runtime_config, runtime_config_for
from frontier.render.stack import render_stack
from frontier.render.templates import ENV
from frontier.targets import backend_for, load_stack
from frontier.targets.local.balancer import render_haproxy
from tests.gateway.stacks import two_model_config, write_stack

STACKS = ["local", "dev", "staging", "prod"]
DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.fixture(scope="module", params=STACKS)
def settings(request):
    return load_stack(request.param)


@pytest.fixture(scope="module")
def prod():
    return load_stack("prod")


@pytest.fixture(scope="module")
def local():
    return load_stack("local")


# --- determinism ----------------------------------------------------------------------------------


def test_same_settings_and_digest_render_the_same_bytes(settings):
    first = render_stack(settings, DIGEST)
    second = render_stack(load_stack(settings.stack), DIGEST)
    assert first == second
    assert list(first) == sorted(first)


def test_rendering_does_not_depend_on_hash_seed():
    # Set and dict iteration order can change with PYTHONHASHSEED; the bytes must not.
    script = (
        "import hashlib, json; from frontier.targets import load_stack; from frontier.render.stack import render_stack; "
        f"files = render_stack(load_stack('local'), {DIGEST!r}); "
        "print(hashlib.sha256(json.dumps(files).encode()).hexdigest())"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            cwd=project.root(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1]


def test_rendered_files_hold_no_timestamps(settings):
    for name, text in render_stack(settings, DIGEST).items():
        assert not re.search(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}", text), name


def test_a_different_digest_changes_only_the_unit(prod):
    a = render_stack(prod, DIGEST)
    b = render_stack(prod, "sha256:" + "f" * 64)
    assert [name for name in a if a[name] != b[name]] == ["release/frontier-runtime.service"]


def test_a_missing_template_value_is_an_error_not_an_empty_string():
    template = ENV.from_string("port: {{ port }}\n")
    with pytest.raises(jinja2.UndefinedError):
        template.render()


def test_the_environment_does_not_escape_config_text():
    assert ENV.from_string("{{ v }}").render(v="a<b & 'c'") == "a<b & 'c'"


# --- runtime.yaml ---------------------------------------------------------------------------------


def test_rendered_runtime_config_parses_back_into_an_equal_model(settings):
    assert parse_config(render_runtime_config(settings, settings.only_pool)) == runtime_config_for(
        settings, settings.only_pool
    )


def test_runtime_config_carries_the_stack_runtime_section_field_for_field(settings):
    config = parse_config(render_runtime_config(settings, settings.only_pool))
    fields = set(RuntimeSettings.model_fields) - {"cpu_kv_cache_bytes"}  # sized from the model unless set
    assert config.model_dump(include=fields) == settings.runtime.model_dump(include=fields)


def test_a_stack_that_sizes_the_cpu_kv_cache_keeps_its_size(local):
    sized = local.with_pool(
        local.only_pool.model_copy(
            update={"runtime": local.runtime.model_copy(update={"cpu_kv_cache_bytes": 1 << 20})}
        )
    )
    assert parse_config(render_runtime_config(sized, sized.only_pool)).cpu_kv_cache_bytes == 1 << 20


def test_runtime_config_carries_the_model_and_probe_paths(settings):
    config = parse_config(render_runtime_config(settings, settings.only_pool))
    assert config.model.name == settings.model.name
    assert config.model.weights_uri == settings.model.weights_uri
    assert config.model.version == settings.model.version
    assert config.model.dtype == settings.model.dtype
    assert config.model.max_seq_len == settings.model.max_seq_len
    assert config.health.readiness_path == settings.health.readiness_path
    assert config.health.liveness_path == settings.health.liveness_path


def test_a_stack_can_pin_its_runtime_threads(local):
    pinned = local.with_pool(
        local.only_pool.model_copy(
            update={"runtime": local.runtime.model_copy(update={"cpu_bind_threads": True})}
        )
    )
    assert parse_config(render_runtime_config(pinned, pinned.only_pool)).cpu_bind_threads is True


def test_cloud_runtime_config_runs_on_cuda_with_the_cache_volume(prod):
    config = parse_config(render_runtime_config(prod, prod.only_pool))
    assert config.device == "cuda"
    assert config.weights_cache_dir == "/var/cache/frontier/weights"


def test_local_runtime_config_runs_on_cpu_with_a_relative_cache(local):
    config = parse_config(render_runtime_config(local, local.only_pool))
    assert config.device == "cpu"
    assert config.weights_cache_dir == "cache/weights"


def test_cpu_kv_cache_holds_max_batch_size_sequences_of_max_seq_len(local):
    config = parse_config(render_runtime_config(local, local.only_pool))
    # tiny-llama: 2 x 4 layers x 4 KV heads x 32 head_dim x 4 bytes (float32) = 4,096 B per token
    assert config.cpu_kv_cache_bytes == 4096 * 16 * 1024


def test_runtime_config_holds_no_secret_value(local):
    text = render_runtime_config(local, local.only_pool)
    assert "api_keys_secret: frontier/local/api-keys" in text
    assert "sk-" not in text


def test_a_config_the_runtime_refuses_is_not_rendered(prod):
    broken = prod.with_pool(
        prod.only_pool.model_copy(update={"runtime": prod.runtime.model_copy(update={"port": 70000})})
    )
    with pytest.raises(
        FrontierError, match=r"the runtime refuses the config of stack 'prod':\n.*port = 70000"
    ):
        render_runtime_config(broken, broken.only_pool)


# --- systemd unit ---------------------------------------------------------------------------------


def _unit(settings, digest=DIGEST) -> str:
    return render_release_files(settings, settings.only_pool, digest)[UNIT_NAME]


def test_release_is_the_runtime_config_and_the_unit(prod):
    assert sorted(render_release_files(prod, prod.only_pool, DIGEST)) == [
        "frontier-runtime.service",
        "runtime.yaml",
    ]


@pytest.mark.parametrize(
    "reference",
    ["latest", "v1.2.3", "sha256:abc", "sha256:" + "A" * 64, "sha256:" + "0" * 63, "sha512:" + "0" * 64],
)
def test_unit_refuses_anything_but_an_immutable_digest(prod, reference):
    with pytest.raises(FrontierError, match=re.escape(repr(reference))):
        render_release_files(prod, prod.only_pool, reference)


def test_unit_runs_the_image_by_digest(prod):
    unit = _unit(prod)
    image = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/frontier-runtime-prod@{DIGEST}"
    assert f"Environment=FRONTIER_IMAGE={image}\n" in unit
    assert "ExecStartPre=/usr/bin/docker pull ${FRONTIER_IMAGE}\n" in unit
    assert ":latest" not in unit


def test_unit_gives_the_container_the_gpus(prod):
    unit = _unit(prod)
    assert "--gpus all" in unit
    assert "--ipc=host" in unit


def test_cpu_unit_asks_for_no_gpus(local):
    unit = _unit(local)
    assert "--gpus" not in unit


def test_unit_runs_the_container_as_the_user_that_owns_the_weights_cache(prod):
    # The image's user owns nothing on the host: without --user, docker runs the image's USER, whose
    # uid the unit must still name so the host can give it the cache (mount-cache.sh chowns it).
    unit = _unit(prod)
    assert f"  --user {RUNTIME_UID}:{RUNTIME_UID} \\\n" in unit
    assert RUNTIME_UID == 10001  # runtime/Dockerfile's useradd --uid


def test_unit_mounts_the_release_read_only_and_references_secrets_by_id_only(prod):
    unit = _unit(prod)
    assert "--read-only" in unit
    assert "source=/opt/frontier/current,target=/etc/frontier/release,readonly" in unit
    assert "--config /etc/frontier/release/runtime.yaml" in unit
    assert "api-keys" not in unit
    assert "AWS_SECRET_ACCESS_KEY" not in unit


def test_unit_gives_the_jit_caches_a_tmpfs_that_allows_exec(prod):
    """docker's --tmpfs mounts noexec,nosuid,nodev and merges what the flag says over that, so /tmp
    is noexec: Triton and inductor load the shared objects they build from their caches, which get a
    tmpfs of their own that says exec (tests/e2e/test_runtime_image.py loads one from each)."""
    unit = _unit(prod)
    assert f"  --tmpfs {JIT_CACHE_DIR}:rw,exec,nosuid,nodev,size={JIT_CACHE_MIB}m \\\n" in unit
    for name, folder in JIT_CACHE_ENV:
        assert folder.startswith(f"{JIT_CACHE_DIR}/")
        assert f"  --env {name}={folder} \\\n" in unit


def test_unit_waits_longer_than_the_drain_before_killing(settings):
    unit = _unit(settings)
    timeout_stop = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))
    docker_grace = int(re.search(r"docker stop --time (\d+)", unit).group(1))
    assert docker_grace >= settings.runtime.drain_timeout_s
    assert timeout_stop > docker_grace


def test_unit_restarts_on_failure(prod):
    assert "\nRestart=on-failure\n" in _unit(prod)


def test_placeholder_digest_is_marked_not_deployable(prod):
    assert "NOT deployable" in _unit(prod, PLACEHOLDER_DIGEST)
    assert "NOT deployable" not in _unit(prod)


# --- node bootstrap -------------------------------------------------------------------------------


def test_driver_script_is_valid_bash(prod, tmp_path):
    script = tmp_path / "install-nvidia.sh"
    script.write_text(render_driver_script(prod, prod.serving_group))
    subprocess.run(["bash", "-n", str(script)], check=True)


def test_driver_script_pins_branch_and_toolkit(prod):
    script = render_driver_script(prod, prod.serving_group)
    assert 'BRANCH="580"' in script
    assert 'TOOLKIT_VERSION="1.17.3"' in script
    assert "nvidia-headless-${BRANCH}-server" in script
    assert 'EXPECTED_GPUS="${FRONTIER_EXPECTED_GPUS:-8}"' in script


def test_cloud_init_is_thin_yaml_that_bootstraps_from_the_history_and_holds_no_secrets(prod):
    text = render_cloud_init(prod, "h100", history_bucket="frontier-prod-history-1-us-east-1")
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    files = {f["path"]: f for f in data["write_files"]}
    env = dict(line.split("=", 1) for line in files["/etc/frontier/node.env"]["content"].splitlines())
    assert (env["FRONTIER_HISTORY_BUCKET"], env["FRONTIER_HISTORY_PREFIX"]) == (
        "frontier-prod-history-1-us-east-1",
        "history/prod/",
    )
    assert (env["FRONTIER_LAUNCH_HOOK"], env["FRONTIER_TERMINATE_HOOK"]) == (
        "frontier-launch",
        "frontier-terminate",
    )
    bootstrap = files["/usr/local/sbin/frontier-bootstrap"]["content"]
    assert "s3://frontier-prod-history-1-us-east-1/history/prod/host/h100/" in bootstrap
    assert 'frontier-bootstrap.py" boot' in bootstrap and "abandon --reason" in bootstrap
    # No package list: nothing (docker.io least of all) is installed beside the AMI's own engine.
    assert "packages" not in data
    assert data["runcmd"][-1] == ["systemctl", "enable", "--now", "--no-block", "frontier-bootstrap.service"]
    assert "api-keys" not in text and "PRIVATE KEY" not in text
    # Well inside EC2's 16 KiB: a group whose replica spans nodes adds its leader proxy's config.
    assert len(text.encode()) < 12 * 1024


def test_cloud_init_logs_docker_into_ecr_with_the_instance_profile(prod):
    data = yaml.safe_load(render_cloud_init(prod, "h100"))
    files = {f["path"]: f for f in data["write_files"]}
    assert yaml.safe_load(files["/root/.docker/config.json"]["content"]) == {
        "credHelpers": {"123456789012.dkr.ecr.us-east-1.amazonaws.com": "ecr-login"}
    }


def test_cloud_init_scripts_are_valid_bash(prod, tmp_path):
    data = yaml.safe_load(render_cloud_init(prod, "h100"))
    for item in data["write_files"]:
        if item["content"].startswith("#!/usr/bin/env bash"):
            script = tmp_path / "script.sh"
            script.write_text(item["content"])
            subprocess.run(["bash", "-n", str(script)], check=True)


def test_cloud_init_of_an_unknown_group_names_the_known_ones(prod):
    with pytest.raises(FrontierError, match=r"no node group 'a100' \(node groups: h100\)"):
        render_cloud_init(prod, "a100")


# --- HAProxy --------------------------------------------------------------------------------------


def _haproxy(settings, **kwargs) -> str:
    backends = [("host-1", "127.0.0.2", 8000), ("host-2", "127.0.0.3", 8000)]
    return render_haproxy(
        settings, backends, bind_port=18080, stats_socket="/tmp/frontier-admin.sock", **kwargs
    )


def test_haproxy_config_passes_haproxy_check(local, tmp_path):
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(_haproxy(local, stats_port=18081))
    result = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


def test_haproxy_config_of_the_local_stack_passes_haproxy_check(local, tmp_path):
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(backend_for(local).rendered_files(DIGEST)["balancer/haproxy.cfg"])
    result = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_haproxy_checks_readiness_with_the_stack_health_settings(local):
    cfg = _haproxy(local)
    assert "option httpchk GET /health/ready" in cfg
    assert "http-check expect status 200" in cfg
    assert "inter 1000ms" in cfg and "fall 2" in cfg and "rise 2" in cfg
    assert "balance leastconn" in cfg
    assert "server host-1 127.0.0.2:8000" in cfg and "server host-2 127.0.0.3:8000" in cfg


def test_haproxy_retries_requests_a_draining_host_refuses(local):
    cfg = _haproxy(local)
    assert "retry-on conn-failure empty-response 503" in cfg
    assert "option http-buffer-request" in cfg  # a request is retried only when wholly buffered
    assert "option redispatch" in cfg


def test_haproxy_exposes_an_admin_socket_for_the_rollout(local):
    assert "stats socket /tmp/frontier-admin.sock mode 600 level admin" in _haproxy(local)


def test_haproxy_timeouts_outlast_a_streamed_answer(prod):
    cfg = _haproxy(prod)
    server_timeout = int(re.search(r"timeout server (\d+)s", cfg).group(1))
    assert server_timeout * 1000 >= prod.slo.p99_latency_ms


def test_haproxy_refuses_duplicate_backend_names(local):
    with pytest.raises(FrontierError, match="distinct names"):
        render_haproxy(local, [("a", "127.0.0.2", 1), ("a", "127.0.0.3", 1)], bind_port=1, stats_socket="/s")


def _two_pool_local(tmp_path, **small_runtime):
    """The local stack as two pools behind a gateway (tests/gateway/stacks.py): its model on host-1
    and host-2, a second one on host-3 with ``small_runtime``; host-4 a spare."""
    document = two_model_config()
    small = document["config"]["frontier:models"][1]
    small["runtime"].update(small_runtime)
    return load_stack("local", path=write_stack(tmp_path, document))


def test_haproxy_lists_each_slot_of_a_two_pool_stack_at_its_own_pools_runtime_port(local, tmp_path):
    two = _two_pool_local(tmp_path, port=8001)
    cfg = backend_for(two).rendered_files(DIGEST)["balancer/haproxy.cfg"]
    servers = [line.split()[1:] for line in cfg.splitlines() if line.startswith("    server ")]
    assert servers == [
        ["host-1", "127.0.0.2:8000"],
        ["host-2", "127.0.0.3:8000"],
        ["host-3", "127.0.0.4:8001"],  # the second pool's slot, at its runtime's port
        ["host-4", "127.0.0.5:8000"],  # a spare slot, listed by no pool: the first pool's port
    ]


def test_haproxy_limits_of_a_two_pool_stack_come_from_each_servers_pool(local, tmp_path):
    two = _two_pool_local(tmp_path, queue={"max_length": 16, "timeout_ms": 9000})
    cfg = backend_for(two).rendered_files(DIGEST)["balancer/haproxy.cfg"]
    # 16 running + 64 queued on each of the first pool's three slots (the spare's too), 16 + 16 on host-3.
    assert "    maxconn 272\n" in cfg
    assert "maxconn 32\n" in cfg  # default-server: no runtime handed more than it admits
    assert "timeout queue 9000ms" in cfg  # the most patient queue


# --- alerts ---------------------------------------------------------------------------------------


def test_alerts_follow_the_slos(prod):
    rules = {r["alert"]: r for r in yaml.safe_load(render_alerts(prod))["groups"][0]["rules"]}
    assert set(rules) == {
        "FrontierTTFTHigh",
        "FrontierLatencyHigh",
        "FrontierErrorRateHigh",
        "FrontierQueueDeep",
        "FrontierKVCacheFull",
        "FrontierHostNotReady",
        "FrontierRuntimeRestarting",
        "FrontierStructuredOutputFailing",
        "FrontierProbeFailing",
    }
    assert rules["FrontierTTFTHigh"]["expr"].endswith("> 1.5")
    assert rules["FrontierLatencyHigh"]["expr"].endswith("> 30.0")
    assert rules["FrontierErrorRateHigh"]["expr"].endswith("> 0.005")
    assert rules["FrontierQueueDeep"]["expr"].endswith("> 400")
    assert "{{ $labels.instance }}" in rules["FrontierQueueDeep"]["annotations"]["summary"]


def test_alerts_use_metric_names_the_runtime_exports():
    from frontier_hostside.names import RUNTIME_METRIC_NAMES

    for name in METRICS.values():
        base = name.removesuffix("_bucket").removesuffix("_total")
        assert base in RUNTIME_METRIC_NAMES, name


# --- the whole stack ------------------------------------------------------------------------------


def test_cloud_stack_renders_release_bootstrap_drivers_and_alerts(prod):
    assert list(render_stack(prod, DIGEST)) == [
        "cloud-init/h100.yaml",
        "drivers/h100/install-nvidia.sh",
        "host/h100/mount-cache.sh",
        "monitoring/alerts.yaml",
        "release/frontier-runtime.service",
        "release/runtime.yaml",
    ]


def test_local_stack_renders_no_driver_script(local):
    assert not any(name.startswith("drivers/") for name in render_stack(local, DIGEST))


def test_the_local_target_adds_its_balancers_config(local):
    assert list(backend_for(local).rendered_files(DIGEST)) == ["balancer/haproxy.cfg"]


def test_the_ec2_target_adds_nothing_to_every_stacks_files(prod):
    assert backend_for(prod).rendered_files(DIGEST) == {}
