"""Shared test setup: every test runs from the repository root with a clean AWS environment."""

from __future__ import annotations

import gc
import os
import re
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the runtime's and the gateway's tests run without the toolkit's imports
    from frontier.config.outputs import Ec2Outputs, KubernetesOutputs
    from frontier.config.schema import Settings

REPO = Path(__file__).resolve().parent.parent
ACCOUNT_ID = "123456789012"

# -- tiers ------------------------------------------------------------------------------------------
# The quick tier (``make test-quick``: ``-m "not proc and not e2e and not slow"``) starts no process and
# no server. Every test that does is marked ``proc`` here, at collection: a test whose fixture closure
# holds a fixture of PROC_FIXTURES (``item.fixturenames`` is the closure, so fixtures built on these
# need no entry), and a test of PROC_TESTS that starts one itself (a whole module, or one test).
# "Starts" is a child process (sshd, haproxy, redis-server, a runtime, a gateway, podman, ``fab``,
# bash, python) or a server on a socket (moto's server, the runtime or the gateway under uvicorn in a
# thread, an HTTP stand-in). tests/unit/test_proc_tier.py reads the tree and fails on a fixture or a
# test that starts something and is in neither list, or on an entry that names nothing. A module
# marked e2e whole (``pytestmark``) is out of the quick tier already and is not listed.
# Keys are ``path::fixture`` / ``path`` / ``path::test``; values say what is started.
PROC_FIXTURES: dict[str, str] = {
    "tests/e2e/conftest.py::cluster": "a process",
    "tests/e2e/test_local_alarms.py::cluster": "a process",
    "tests/gateway/conftest.py::redis_url": "redis_server(): a process",
    "tests/gateway/test_migration.py::three_replicas": "start_runtime(): processes",
    "tests/gateway/test_disaggregation_pod_layout.py::pods": "start_pod(): runtime processes",
    "tests/operate/test_release_supply_chain.py::release_tools": "pip, cyclonedx-py and pip-audit processes",
    "tests/operate/test_release_key_grants.py::account": "moto's server",
    "tests/gateway/conftest.py::runtimes": "start_runtime(): a process",
    "tests/gateway/test_disaggregation.py::roles": "start_runtime(): prefill, decode and colocated processes",
    "tests/runtime/server/test_disaggregated_http.py::replicas": "start_server(): runtimes under uvicorn",
    "tests/runtime/server/test_disaggregated_http.py::prefill": "replicas(): a runtime under uvicorn",
    "tests/runtime/server/test_disaggregated_http.py::decode": "replicas(): a runtime under uvicorn",
    "tests/gateway/conftest.py::standins": "StandIn(): an HTTP server",
    "tests/gateway/test_discovery.py::ec2": "moto's server",
    "tests/gateway/test_kubernetes_discovery.py::pods": "StandIn(): HTTP servers",
    "tests/gateway/test_kubernetes_discovery.py::cluster": "FakeApiServer(): an HTTP server",
    "tests/gateway/test_key_reload.py::gateway": "running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_key_reload.py::secrets": "moto's server",
    "tests/gateway/test_key_reload.py::two_pools": "running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::one_trace": "traced_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::runtime": "start_runtime(): a process",
    "tests/gateway/test_traces.py::receiver": "TraceReceiver(): an OTLP receiver on a socket",
    "tests/operate/test_replica_rendezvous.py::account": "start_moto(): moto's server on a socket; the aws CLI",
    "tests/loadtest/test_resource_use.py::runtime": "start_runtime(): a process",
    "tests/operate/test_local_autoscaler_scrape.py::runtime": "start_runtime(): a process",
    "tests/infra/test_closed_doors.py::runtime": "an HTTP server",
    "tests/infra/test_kv_event_doors.py::events_on": "declared(): a fresh python -I",
    "tests/infra/test_kv_event_doors.py::events_off": "declared(): a fresh python -I",
    "tests/infra/test_kv_routing_gateway_role.py::run": "declared(): a fresh python -I",
    "tests/infra/test_quota_store.py::guarded_redis": "redis_server(): a process",
    "tests/kubernetes/test_backend.py::cluster": "FakeApiServer(): an HTTP server",
    "tests/kubernetes/test_backend_pools.py::cluster": "FakeApiServer(): an HTTP server",
    "tests/kubernetes/test_disaggregation_deploy.py::fake": "FakeApiServer(): an HTTP server",
    "tests/kubernetes/test_traffic_share_deploy.py::fake": "FakeApiServer(): an HTTP server",
    "tests/infra/test_traffic_share_edge.py::prod_runs": "the program in a fresh python -I",
    "tests/kubernetes/test_disaggregation_deploy.py::verified": "FakeApiServer(), openai_standin(): HTTP servers",
    "tests/kubernetes/test_canary_gates.py::answers": "openai_standin(): an HTTP server",
    "tests/kubernetes/test_canary_gates.py::cluster": "FakeApiServer(): an HTTP server",
    "tests/kubernetes/test_canary_gates.py::multinode": "FakeApiServer(): an HTTP server",
    "tests/operate/test_canary_gates_ec2.py::world": "openai_standin(): an HTTP server",
    "tests/kubernetes/test_multinode_deploy.py::cluster": "FakeApiServer(): an HTTP server",
    "tests/operate/conftest.py::tiny_model": "make_tiny_model(): a process",
    "tests/operate/test_balancer.py::haproxy": "SlowBackend(): an HTTP server",
    "tests/operate/test_batch.py::cluster": "ScriptedRuntime(): an HTTP server",
    "tests/operate/test_batch.py::runtime_stack": "start_runtime(): a process",
    "tests/operate/test_bootstrap.py::cloud": "a process",
    "tests/operate/test_cloud_init_script.py::host": "Host(): a process",
    "tests/operate/test_deploy_lease.py::endpoint": "moto's server",
    "tests/operate/test_drivers.py::gpu_host": "a process",
    "tests/operate/test_gateway_host.py::certificate": "a process",
    "tests/operate/test_gateway_host.py::cloudwatch": "moto's server",
    "tests/operate/test_gateway_host.py::gateway": "start_gateway(): a process",
    "tests/operate/test_host_supervisor_e2e.py::cluster": "deployed_cluster(): a process",
    "tests/operate/test_iam_enforcement.py::account": "_aws_cli(): a process",
    "tests/operate/test_key_rotation.py::runtimes": "a process",
    "tests/operate/test_key_rotation.py::secrets": "moto's server",
    "tests/operate/test_local_group_e2e.py::cluster": "deployed_cluster(): a process",
    "tests/operate/test_rollout_e2e.py::cluster": "start_cluster(): a process",
    "tests/operate/test_weights_gc.py::endpoint": "moto's server",
    "tests/runtime/server/conftest.py::moto_endpoint": "moto's server",
    "tests/runtime/server/conftest.py::serve": "servers(): the runtime under uvicorn",
    "tests/runtime/server/conftest.py::shared_server": "servers(): the runtime under uvicorn",
    "tests/runtime/server/test_engine_client.py::scripted": "servers(): the runtime under uvicorn",
    "tests/runtime/server/test_fuzz_bodies.py::client": "servers(): the runtime under uvicorn",
    "tests/runtime/server/test_key_reload.py::start": "Runtime(): a process",
    "tests/runtime/server/test_serve_process.py::runtime_process": "Process(): a process",
    "tests/runtime/test_gpu_check_smoke.py::smoke_run": "a process",
    "tests/unit/test_cache_script.py::p5": "FakeDisks(): a process",
    "tests/unit/test_driver_script.py::ami_host": "FakeHost(): a process",
    "tests/unit/test_driver_script.py::host": "FakeHost(): a process",
    "tests/unit/test_haproxy_live.py::backends": "_Backend(): an HTTP server",
    "tests/verify/conftest.py::listener": "a listening socket",
    "tests/verify/conftest.py::moto_endpoint": "moto_server(): a server on a socket",
    "tests/verify/conftest.py::runtime": "start_runtime(): a process",
}
PROC_TESTS: dict[str, str] = {
    "tests/runtime/engine/test_quantized_weights.py::test_torchs_int8_weight_gemm_crashes_on_an_input_width_not_a_multiple_of_16": "python processes calling torch",
    "tests/kubernetes/test_stack_scoped_rules.py": "fired(): promtool evaluating the rules",
    "tests/runtime/server/test_kernel_cache.py": "compile_on_host(): a python process compiling with Triton",
    "tests/gateway/test_disaggregation_pod_layout.py": "start_pod(): a process; running_gateway(): the gateway under uvicorn",
    "tests/runtime/server/test_kv_transfer_flags.py::test_a_colocated_config_served_with_kv_role_prefill_leases_its_blocks_at_the_kv_host": "a process",
    "tests/infra/test_pool_principals.py": "simulate(): node running tools/iam-simulate",
    "tests/infra/test_kv_routing_gateway_role.py::test_the_gateway_role_reads_the_tokenizer_files_and_no_other_weights_object": "simulate(): node running tools/iam-simulate",
    "tests/kubernetes/test_kv_routing_config.py::test_the_gateways_role_reads_the_tokenizer_objects_and_no_weights_shard": "simulate(): node running tools/iam-simulate",
    "tests/infra/test_two_pools_ec2.py::test_pulumi_up_declares_both_pools_in_a_fresh_interpreter": "a fresh python -I",
    "tests/infra/test_release_key_policy.py": "simulate(): node running tools/iam-simulate",
    "tests/infra/test_pod_log_actors.py": "simulate(): node running tools/iam-simulate; a fresh python -I",
    "tests/infra/test_spot_capacity.py::test_the_deploy_role_reads_the_notices_on_its_stacks_queue_as_fab_status_does": "simulate(): node running tools/iam-simulate",
    "tests/infra/test_spot_out_of_service_program.py::test_its_role_may_deregister_from_the_stacks_groups_and_nothing_more": "simulate(): node running tools/iam-simulate",
    "tests/infra/test_spot_out_of_service_program.py::test_pulumi_up_as_the_language_host_runs_it_declares_the_function_its_rule_and_the_grant": "declared(): a fresh python -I",
    "tests/infra/test_spot_capacity.py::test_the_deploy_role_can_neither_take_send_nor_purge_notices_nor_read_another_stacks_queue": "simulate(): node running tools/iam-simulate",
    "tests/unit/test_local_alarms.py::test_a_process_that_is_gone_is_named": "a process",
    "tests/gateway/test_breaker.py::test_a_failing_replica_is_taken_out_and_no_request_fails_after_the_trip": "running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_breaker.py::test_a_recovered_replica_comes_back_through_one_trial_and_the_breaker_closes": "running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_breaker.py::test_with_every_replica_out_the_gateway_answers_503_with_retry_after_at_once": "running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_closed_doors.py": "a process; running_gateway(): the gateway under uvicorn",
    "tests/runtime/engine/test_kv_transfer.py": "a prefill engine's KV transfer listener; a prefill process and a relay",
    "tests/gateway/test_discovery.py::test_gateway_publish_uploads_a_config_that_finds_replicas_by_tag_and_the_wheels": "moto's server",
    "tests/gateway/test_gateway.py": "StandIn(): an HTTP server; running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_offline_pool.py": "StandIn(): an HTTP server; start_runtime(): processes; running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_gateway_runtimes.py": "running_gateway(): the gateway under uvicorn; start_runtime(): a process",
    "tests/gateway/test_hold_queue.py": "running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_migration.py": "start_runtime(): processes; Relay(): a TCP server; running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_kv_index.py::test_a_gap_is_closed_by_replay_and_one_replay_cannot_close_drops_the_entries": "ZMQ sockets listening",
    "tests/gateway/test_pool_rollouts.py::test_a_stack_of_several_models_needs_model_to_roll": "a process",
    "tests/gateway/test_quota_store.py": "running_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::test_a_clients_own_traceparent_does_not_choose_the_trace": "traced_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::test_a_refused_key_ends_the_trace_at_auth_with_401": "traced_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::test_a_sample_ratio_of_zero_exports_nothing_from_gateway_or_runtime": "traced_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::test_a_streamed_answers_upstream_span_lasts_to_the_streams_end": "traced_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::test_the_demo_prints_one_requests_trace_with_every_span": "traced_gateway(): the gateway under uvicorn",
    "tests/gateway/test_traces.py::test_tracing_off_builds_no_exporter_and_loads_no_sdk": "a process",
    "tests/gateway/test_upstream.py": "StandIn(): an HTTP server; a listening socket",
    "tests/gateway/test_upstream_adversarial.py": "Replica(): a raw TCP server",
    "tests/gateway/test_usage_and_batch.py": "StandIn(): an HTTP server; _fab(): a process",
    "tests/infra/test_closed_doors.py::test_the_hosts_haproxy_answers_https_with_the_certificate_made_at_boot": "a process",
    "tests/infra/test_closed_doors.py::test_pulumi_up_as_the_language_host_runs_it_puts_an_internal_balancers_probe_in_the_vpc": "declared(): a fresh python -I",
    "tests/infra/test_language_host.py": "runs(): a process",
    "tests/infra/test_replica_scaling.py::test_the_functions_archive_imports_in_a_bare_interpreter": "a bare interpreter (subprocess)",
    "tests/kubernetes/test_backend.py::test_fab_deploy_history_and_rollback_on_a_kubernetes_stack": "FakeApiServer(): an HTTP server",
    "tests/loadtest/test_client.py": "SseServer(): an HTTP server",
    "tests/loadtest/test_task.py::test_a_step_load_finds_the_knee_plots_it_and_saves_the_baseline": "SseServer(): an HTTP server",
    "tests/operate/test_batch.py::test_a_batch_killed_half_way_and_rerun_has_one_200_per_valid_line": "a process",
    "tests/operate/test_batch.py::test_the_batch_runs_as_the_tenant_at_batch_priority_and_is_metered": "a process",
    "tests/operate/test_bootstrap.py::test_queue_depth_running_requests_and_latency_reach_cloudwatch": "an HTTP server",
    "tests/operate/test_bootstrap.py::test_restarts_are_published_as_the_count_since_the_last_publish": "an HTTP server",
    "tests/operate/test_bootstrap.py::test_the_command_hosts_run_publishes_with_the_real_cli": "an HTTP server",
    "tests/operate/test_bootstrap.py::test_every_series_the_named_alarms_read_on_ec2_is_published_by_the_host": "an HTTP server",
    "tests/operate/test_bootstrap.py::test_each_start_of_the_runtime_is_published_once_phase_by_phase": "an HTTP server",
    "tests/operate/test_host_agent.py::test_prefetch_runs_the_releases_runtime_on_its_config_and_starts_nothing": "cli(): a process; the runtime's prefetch",
    "tests/operate/test_host_agent.py::test_a_prefetch_the_runtime_refuses_fails_with_its_reason_in_the_log_tail": "the runtime's prefetch as a process",
    "tests/unit/test_probe.py": "an HTTP server; a process",
    "tests/infra/test_named_alarms.py::test_every_target_raises_the_same_named_alarms": "ec2_alarms(): a process",
    "tests/operate/test_deploy_lease.py::test_a_killed_holders_lock_lapses_within_the_lease_and_the_next_deploy_takes_it_naming_it": "a process",
    "tests/operate/test_drivers.py::test_the_drivers_task_prints_the_table_and_the_hosts_to_reboot": "a process",
    "tests/operate/test_gateway_host.py::test_a_certificate_without_its_key_is_refused_before_the_gateway_listens": "a process",
    "tests/operate/test_gateway_host.py::test_the_boot_script_makes_the_certificate_once_readable_by_its_owner_only": "a process",
    "tests/operate/test_gateway_host.py::test_the_publisher_puts_each_pools_held_requests_and_the_gateways_answers_into_cloudwatch": "publish(): a process",
    "tests/operate/test_host_agent.py::test_a_config_without_a_field_is_refused_naming_it": "cli(): a process",
    "tests/operate/test_host_agent.py::test_a_runtime_killed_with_sigkill_is_restarted_and_ready_again": "cli(): a process",
    "tests/operate/test_host_agent.py::test_on_a_systemd_host_the_watchdog_restarts_a_unit_that_fails_liveness": "a process",
    "tests/operate/test_host_agent.py::test_terminate_then_kill_kills_a_process_that_ignores_sigterm": "_spawn(): a process",
    "tests/operate/test_host_agent.py::test_terminate_then_kill_leaves_dead_zombie_and_recycled_pids_alone": "_spawn(): a process",
    "tests/operate/test_host_agent.py::test_terminate_then_kill_lets_a_process_exit_on_sigterm_and_reaps_it": "_spawn(): a process",
    "tests/operate/test_host_agent.py::test_the_agent_runs_from_the_files_that_travel_with_it_alone": "a process",
    "tests/operate/test_host_agent.py::test_the_cli_answers_in_json_with_the_phase_and_exit_status": "cli(): a process",
    "tests/operate/test_host_agent.py::test_the_release_order_is_recorded_not_read_from_file_times": "cli(): a process",
    "tests/operate/test_spot_notices.py": "the IMDS stand-in (a server) and the host agent's processes",
    "tests/operate/test_iam_enforcement.py::test_the_host_role_publishes_its_runtime_metrics": "an HTTP server",
    "tests/operate/test_key_rotation.py::test_fab_keys_rotate_refuses_an_overlap_shorter_than_the_stack_reload_interval": "a process",
    "tests/operate/test_multinode_boot.py::test_a_workers_leader_proxy_answers_every_probe_with_its_leaders_own_status": "LeaderServer(): an HTTP server",
    "tests/operate/test_multinode_boot.py::test_the_leader_proxy_configuration_is_valid_haproxy_once_the_leader_is_named": "a process",
    "tests/operate/test_rollout_e2e.py::test_deploy_then_rollback_restores_the_previous_digest_and_config_byte_for_byte": "a process",
    "tests/operate/test_rollout_e2e.py::test_status_and_history_tasks_print_what_each_host_runs": "a process",
    "tests/operate/test_services.py::test_a_taken_port_is_refused_naming_it": "a listening socket",
    "tests/operate/test_services.py::test_sshd_starts_is_found_by_a_later_command_and_stops": "public_key(): a process",
    "tests/runtime/test_backend_registries.py::test_the_table_and_the_stack_check_that_reads_it_load_without_torch": "a process",
    "tests/runtime/engine/test_affinity.py::test_binding_pins_the_calling_thread_and_each_pool_thread_to_its_core": "a process",
    "tests/runtime/engine/test_engine_sizing.py::test_the_engine_runs_without_the_server_or_boto3": "a process",
    "tests/runtime/engine/test_kv_events.py::test_an_engine_with_kv_events_on_publishes_its_prompts_blocks": "ZMQ sockets listening",
    "tests/runtime/engine/test_kv_events.py::test_the_wire_frames_are_topic_sequence_payload_and_a_replay_resends_from_a_sequence": "ZMQ sockets listening",
    "tests/runtime/engine/test_kernel_variants.py::test_every_prebuilt_variant_this_cpu_runs_gives_the_numbers_torch_gives": "probe(): a process",
    "tests/runtime/engine/test_kernel_variants.py::test_a_cpu_with_avx512_bf16_loads_the_bf16_variant_and_its_gemm_gives_torchs_numbers": "probe(): a process",
    "tests/runtime/engine/test_kernel_variants.py::test_the_bf16_variant_is_never_picked_on_a_cpu_without_the_flag": "probe(): a process",
    "tests/runtime/engine/test_kernel_variants.py::test_the_variant_setting_runs_the_avx512_variant_on_a_bf16_cpu": "probe(): a process",
    "tests/runtime/engine/test_kernel_variants.py::test_the_portable_variant_loads_and_gives_the_numbers_torch_gives": "probe(): a process",
    "tests/runtime/engine/test_kernel_variants.py::test_the_source_compiles_for_aarch64": "a process",
    "tests/runtime/engine/test_kernel_variants.py::test_without_a_compiler_the_prebuilt_kernels_load_and_attend_as_torch_does": "probe(): a process",
    "tests/runtime/engine/test_loading_memory.py::test_peak_memory_of_a_load_stays_near_the_weights_held": "_measure(): a process",
    "tests/runtime/engine/test_multinode.py": "second_node(): a process",
    "tests/runtime/engine/test_expert_parallel.py::test_ep4_over_two_attention_groups_of_tp2_equals_ep1": "LLMEngine(): its ranks' worker processes",
    "tests/runtime/engine/test_pipeline_parallel.py::test_pp2_x_tp2_over_four_processes_equals_transformers": "LLMEngine(): its ranks' worker processes",
    "tests/runtime/engine/test_pipeline_parallel.py::test_pp2_x_ep2_over_four_processes_equals_ep1": "LLMEngine(): its ranks' worker processes",
    "tests/runtime/engine/test_quantized_weights.py::test_int8_model_over_two_tensor_parallel_ranks_equals_one_rank": "LLMEngine(): its ranks' worker processes",
    "tests/operate/test_ec2_host_access.py::test_a_fabric_connection_through_the_proxy_command_reaches_sshd_with_the_pushed_key": "sshd and the aws CLI stand-in: processes",
    "tests/operate/test_ec2_host_access.py::test_an_sshd_that_was_not_given_the_key_refuses_the_connection": "sshd and the aws CLI stand-in: processes",
    "tests/runtime/engine/test_quantized_weights.py::test_quantizing_at_load_never_holds_more_than_the_int8_model_and_one_projection": "a process",
    "tests/runtime/server/test_cold_start_phases.py::test_a_start_logs_and_exports_each_phase": "the runtime under uvicorn",
    "tests/runtime/server/test_engine_client.py": "scripted(): the runtime under uvicorn",
    "tests/runtime/server/test_key_reload.py": "start(): a process",
    "tests/runtime/server/test_serve_process.py::test_weights_that_fail_their_checksum_stop_startup_with_a_clear_error": "the runtime under uvicorn",
    "tests/runtime/server/test_structured_output.py::test_an_output_that_fails_its_check_is_logged_raw_and_counted": "servers(): the runtime under uvicorn",
    "tests/runtime/server/test_traces.py::test_tracing_off_makes_no_tracer_and_loads_no_sdk": "a process",
    "tests/unit/test_cache_script.py::test_a_type_with_no_instance_store_disks_visible_fails_naming_them": "FakeDisks(): a process",
    "tests/unit/test_cache_script.py::test_gp3_where_the_stack_asks_for_ebs": "FakeDisks(): a process",
    "tests/unit/test_driver_script.py::test_a_host_without_nvswitch_needs_no_fabric_manager": "FakeHost(): a process",
    "tests/unit/test_driver_script.py::test_a_missing_gpu_fails_verification": "a process",
    "tests/unit/test_driver_script.py::test_a_stopped_fabric_manager_is_started_on_nvswitch_hosts": "FakeHost(): a process",
    "tests/unit/test_driver_script.py::test_an_amis_driver_older_than_the_images_cuda_needs_fails": "FakeHost(): a process",
    "tests/unit/test_driver_script.py::test_an_ami_driver_installed_but_not_loaded_is_an_error_not_a_second_install": "FakeHost(): a process",
    "tests/unit/test_haproxy_live.py": "a process",
    "tests/unit/test_hostside.py::test_the_bootstrap_runs_from_the_files_that_travel_with_it_alone": "a process",
    "tests/unit/test_render.py::test_cloud_init_scripts_are_valid_bash": "a process",
    "tests/unit/test_render.py::test_driver_script_is_valid_bash": "a process",
    "tests/unit/test_render.py::test_haproxy_config_of_the_local_stack_passes_haproxy_check": "a process",
    "tests/unit/test_render.py::test_haproxy_config_passes_haproxy_check": "a process",
    "tests/unit/test_render.py::test_rendering_does_not_depend_on_hash_seed": "a process",
    "tests/unit/test_stack_rules.py::test_fab_plan_on_a_bad_value_exits_non_zero_naming_the_field": "_fab(): a process",
    "tests/unit/test_stack_rules.py::test_fab_plan_on_a_broken_cross_check_exits_non_zero_naming_the_field": "_fab(): a process",
    # found by the quick tier's watch: processes started through the toolkit's or the runtime's code
    "tests/operate/test_artifact.py::test_an_engine_that_does_not_answer_is_named": "a container engine stand-in",
    "tests/operate/test_artifact.py::test_image_builds_take_podman_where_docker_does_not_answer": "a container engine stand-in",
    "tests/operate/test_artifact.py::test_image_builds_take_podman_where_docker_is_absent": "a container engine stand-in",
    "tests/operate/test_artifact.py::test_the_wheel_carries_the_hostside_names_the_runtime_imports": "pip wheel",
    "tests/operate/test_artifact.py::test_the_wheel_carries_the_settings_reader_its_config_needs": "pip wheel",
    "tests/operate/test_artifact.py::test_two_builds_of_the_same_sources_give_the_same_digest": "pip wheel",
    "tests/operate/test_ec2_host_access.py::test_a_proxy_that_ends_early_is_reported_in_its_own_words_without_waiting_for_a_banner": "sh on an aws stand-in",
    "tests/operate/test_host.py::test_a_tampered_upload_is_never_staged": "the host agent as a process",
    "tests/operate/test_host.py::test_activation_swaps_current_and_remembers_previous": "the host agent as a process",
    "tests/operate/test_host.py::test_on_a_systemd_host_the_release_unit_is_installed_and_restarted": "the host agent as a process",
    "tests/operate/test_host.py::test_prune_keeps_the_newest_releases_and_never_current_or_previous": "the host agent as a process",
    "tests/operate/test_host.py::test_staging_is_verified_and_skipped_when_the_release_is_already_there": "the host agent as a process",
    "tests/operate/test_host.py::test_starting_without_a_release_fails_with_the_reason": "the host agent as a process",
    "tests/operate/test_host_agent.py::test_a_hung_runtime_is_restarted_after_failed_liveness_probes": "the host agent as a process",
    "tests/operate/test_host_agent.py::test_a_supervisor_whose_record_is_gone_stops_its_runtime_and_exits": "the host agent as a process",
    "tests/operate/test_host_agent.py::test_local_down_stops_supervisors_first_and_clears_the_slot": "the host agent as a process",
    "tests/operate/test_host_agent.py::test_restore_brings_back_the_release_that_ran_before": "the host agent as a process",
    "tests/operate/test_host_agent.py::test_start_status_stop_with_a_real_process": "the host agent as a process",
    "tests/operate/test_host_agent.py::test_stopping_the_supervisor_stops_the_runtime_and_restarts_nothing": "the host agent as a process",
    "tests/operate/test_services.py::test_haproxy_refusing_its_config_reports_haproxy_words": "haproxy -c",
    "tests/operate/test_services.py::test_moto_as_a_process_answers_and_stops": "moto's server as a process",
    "tests/runtime/engine/test_expert_parallel.py::test_ep2_on_the_ranks_of_tp2_equals_ep1": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_expert_parallel.py::test_ep2_over_gloo_equals_ep1_on_a_mixtral_checkpoint": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_expert_parallel.py::test_ep2_over_gloo_equals_ep1_on_a_qwen2_moe_checkpoint_with_a_shared_expert": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_kernel_variants.py::test_the_portable_variant_is_built_without_any_target_flag": "g++",
    "tests/runtime/engine/test_model_families.py::test_moe_tp2_over_gloo_equals_transformers": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_interconnect.py::test_two_gloo_ranks_agree_on_one_figure": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_interconnect.py::test_links_slower_than_min_bus_gbps_refuse_the_replica_on_every_rank": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_interconnect.py::test_an_engine_over_two_ranks_reports_its_links_and_refuses_below_the_floor": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_pipeline_parallel.py::test_a_pipeline_keeps_one_step_per_stage_in_flight": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_pipeline_parallel.py::test_an_abort_while_its_step_is_in_flight_drops_that_steps_token": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_pipeline_parallel.py::test_pp2_over_gloo_equals_transformers_with_a_tied_head": "gloo ranks in processes (multiprocessing)",
    "tests/runtime/engine/test_pipeline_parallel.py::test_the_runtime_config_runs_pipeline_parallel_stages": "gloo ranks in processes (multiprocessing)",
    "tests/unit/test_provision_tasks.py::test_preview_runs_pulumi_with_the_policy_pack": "a pulumi stand-in",
    "tests/unit/test_provision_tasks.py::test_up_runs_pulumi_with_the_policy_pack_on_the_checked_stack_file": "a pulumi stand-in",
    "tests/runtime/engine/test_engine_tensor_parallel.py": "gloo ranks in processes (multiprocessing)",
    "tests/unit/test_roofline_cpu.py": "a runtime process: the measured CPU, cached once the first test measures it",
}


@pytest.fixture(autouse=True)
def _no_real_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach a real AWS account: dummy credentials, a fixed region."""
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", os.environ.get("FRONTIER_TEST_KEY", "testing"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


class SavedOutputs:
    """A stack's Pulumi outputs as ``pulumi up`` exports them, saved where ``fab`` reads them."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path, self.monkeypatch = path, monkeypatch

    def _save(self, outputs: Ec2Outputs[str] | KubernetesOutputs[str]) -> None:
        self.path.write_text(outputs.model_dump_json())
        self.monkeypatch.setenv("FRONTIER_STACK_OUTPUTS", str(self.path))

    @staticmethod
    def _common(settings: Settings) -> dict[str, Any]:
        stack, region = settings.stack, settings.region
        weights_bucket, _, weights_prefix = settings.weights_root.removeprefix("s3://").partition("/")
        arn = f"{region}:{ACCOUNT_ID}"
        return {
            "region": region,
            "weights_bucket": weights_bucket,
            "weights_prefix": weights_prefix,
            "history_bucket": f"frontier-{stack}-history-{ACCOUNT_ID}-{region}",
            "history_prefix": f"history/{stack}/",
            "ecr_repository_url": settings.image_repository,
            "api_keys_secret_arn": (
                f"arn:aws:secretsmanager:{arn}:secret:{settings.only_pool.runtime.api_keys_secret}"
                if len(settings.pools) == 1
                else ""
            ),
            "api_keys_secret_arns": {
                model: f"arn:aws:secretsmanager:{arn}:secret:{name}"
                for model, name in settings.api_keys_secrets.items()
            },
            "kms_key_arn": f"arn:aws:kms:{arn}:key/0a1b2c3d",
            "deploy_role_arn": f"arn:aws:iam::{ACCOUNT_ID}:role/{stack}-iam-deploy",
            "runtime_role_arn": f"arn:aws:iam::{ACCOUNT_ID}:role/{stack}-iam-runtime",
        }

    def ec2(self, settings: Settings, **changes: Any) -> Ec2Outputs[str]:
        from frontier.config.outputs import Ec2Outputs

        stack, region = settings.stack, settings.region
        alb = f"{stack}-edge-alb-0a1b2c3.{region}.elb.amazonaws.com"
        outputs = Ec2Outputs[str](
            **self._common(settings),
            endpoint=f"https://{alb}",
            target_group_arn=f"arn:aws:elasticloadbalancing:{region}:{ACCOUNT_ID}:targetgroup/{stack}-tg/0a1b",
            asg_names=[f"{stack}-{group.name}" for group in settings.node_groups],
            alb_dns_name=alb,
            alb_zone_id="Z35SXDOTRQ7X7K",
            alarm_topic_arn=f"arn:aws:sns:{region}:{ACCOUNT_ID}:{stack}-alarms",
            dashboard_name=f"frontier-{stack}",
            vpc_id="vpc-0a1b2c3d",
            private_subnet_ids=["subnet-0a1b2c3d"],
            host_access="bastion" if settings.inventory.ssh_gateway else "ssm",
            bastion_security_group_id="sg-0b" if settings.inventory.ssh_gateway else None,
            monitoring_security_group_id="sg-0c",
        ).model_copy(update=changes)
        self._save(outputs)
        return outputs

    def kubernetes(self, settings: Settings, **changes: Any) -> KubernetesOutputs[str]:
        from frontier.config.outputs import KubernetesOutputs

        k = settings.kubernetes
        assert k is not None
        outputs = KubernetesOutputs[str](
            **self._common(settings),
            endpoint=f"https://{k.ingress.host}",
            cluster_name=k.cluster.name,
            namespace=k.namespace,
            # As the program exports it: the Deployment of the pool listed first (Workload.deployment).
            deployment=f"frontier-{settings.pools[0].name}",
        ).model_copy(update=changes)
        self._save(outputs)
        return outputs


@pytest.fixture
def saved_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SavedOutputs:
    """``saved_outputs.ec2(settings, history_bucket=...)``: the stack's outputs, with changes, saved."""
    return SavedOutputs(tmp_path / "stack-outputs.json", monkeypatch)


def _starts_something(item: pytest.Item) -> bool:
    test = item.nodeid.split("[")[0]
    if test in PROC_TESTS or test.split("::")[0] in PROC_TESTS:
        return True
    info = getattr(item, "_fixtureinfo", None)
    for name in item.fixturenames:
        definitions = info.name2fixturedefs.get(name) if info else None
        if not definitions:
            continue
        function = getattr(definitions[-1].func, "__wrapped__", definitions[-1].func)
        source = Path(function.__code__.co_filename)
        if source.is_relative_to(REPO) and f"{source.relative_to(REPO).as_posix()}::{name}" in PROC_FIXTURES:
            return True
    return False


# -- two workers for the process tier (``make test``: ``-n 2 --dist loadscope``) ------------------------
# The proc tier mostly waits (sshd, HAProxy, runtimes starting, moto), so two workers share it. A
# group runs on one worker, one test after another. Every test that brings up a local stack (the
# e2e tier, the operate room's clusters) is one group: they are all stacks named ``local``, whose
# files under the checkout's .frontier (outputs, artifacts, the image's wheelhouse) they share, and
# the operate clusters listen on fixed ports (127.0.1.x:2222). Every other room is a group of its own
# (the gateway's stand-ins on fixed 127.0.0.x:8000, for one), so at most two rooms run at once.
# The groups are given to xdist's scope scheduler through its scheduler hook: its ``xdist_group``
# marks work by renaming each test's node id, which pytest 9 no longer lets a plugin do.
LOCAL_STACK_ROOMS = ("e2e", "operate")


def worker_group(nodeid: str) -> str:
    room = nodeid.split("::")[0].split("/")[1]
    return "local-stacks" if room in LOCAL_STACK_ROOMS else f"tests/{room}"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ByRoom(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    return ByRoom(config, log)


# Tests marked ``slow`` by their measured time rather than by a decorator each (tests/slow.txt).
SLOW_LIST = REPO / "tests" / "slow.txt"


def _measured_slow() -> frozenset[str]:
    lines = SLOW_LIST.read_text().splitlines()
    return frozenset(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``proc`` and the measured ``slow`` before ``-m`` deselects: only the tiers choose by
    them, ``make test`` runs them all."""
    slow = _measured_slow()
    for item in items:
        if _starts_something(item):
            item.add_marker(pytest.mark.proc)
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
    # On a whole collection (no path, no -k), a listed test that no longer exists is a stale line.
    whole = config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.getoption("keyword")
    stale = slow - {item.nodeid for item in items} if whole else set()
    if stale:
        raise pytest.UsageError(f"{SLOW_LIST.name} names tests that do not exist: {sorted(stale)}")


# -- the quick tier's watch -------------------------------------------------------------------------
# Where a run deselects ``proc``, a test not marked ``proc`` that starts a process (through any code:
# the toolkit's, the runtime's, a library's) or listens on a socket fails, naming what it started and
# where it is to be listed. This sees what the source reading of test_proc_tier.py cannot.
_STARTED: list[str] = []
_WATCHING = False


# A library's one-time probe of the machine is not the test's process: ctypes.util.find_library's
# ldconfig, matplotlib's font cache.
_PROBES = ("ldconfig", "fc-list")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _WATCHING or event not in (
        "subprocess.Popen",
        "os.fork",
        "os.posix_spawn",
        "os.system",
        "os.exec",
        "os.spawn",
    ):
        return
    if event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], list | tuple) else str(args[1]).split()
        if Path(os.fsdecode(args[0] or argv[0])).name in _PROBES:
            return
    _STARTED.append(f"{event} {args[1] if event == 'subprocess.Popen' else args[:1]!r}"[:200])


def pytest_configure(config: pytest.Config) -> None:
    global _WATCHING
    if not re.search(r"\bnot\s+proc\b", config.option.markexpr or "") or _WATCHING:
        return
    _WATCHING = True
    # What the quick tier's modules load (torch, pulumi's providers, boto's models) makes each full
    # garbage-collector pass long, and Python's default thresholds ran one every few tests: a third of
    # the run's CPU. Passes are rarer here, and what test collection loaded is frozen out of them.
    gc.set_threshold(10_000, 50, 100)
    sys.addaudithook(_audit)
    listen = socket.socket.listen

    def watched_listen(self: socket.socket, *args: Any) -> None:
        _STARTED.append(f"a server listening on {self.getsockname()}")
        listen(self, *args)

    socket.socket.listen = watched_listen  # type: ignore[method-assign]
    import multiprocessing.util

    spawn = multiprocessing.util.spawnv_passfds

    def watched_spawn(path: Any, args: Any, passfds: Any) -> int:
        _STARTED.append(f"multiprocessing {args!r}"[:200])
        return spawn(path, args, passfds)

    multiprocessing.util.spawnv_passfds = watched_spawn  # type: ignore[assignment]


def pytest_collection_finish(session: pytest.Session) -> None:  # noqa: ARG001
    if _WATCHING:
        gc.collect()
        gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:  # noqa: ARG001
    gc.unfreeze()  # for the collection at exit: what native extensions hold is freed, not reported leaked


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:  # noqa: ARG001
    _STARTED.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:  # noqa: ARG001
    outcome = yield
    report = outcome.get_result()
    if _WATCHING and report.when == "call" and _STARTED and not item.get_closest_marker("proc"):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} started {sorted(set(_STARTED))[:5]} but is not marked proc: list the fixture "
            "that starts it in PROC_FIXTURES, or the test in PROC_TESTS (tests/conftest.py)"
        )
