"""``fab verify`` on the local stack the way ``make demo`` leaves it (moto, sshd host slots, HAProxy,
release A deployed; tests/e2e/conftest.py's cluster): on the fresh stack it runs every case it can
and exits 0, its golden cases not yet recorded; ``--record`` keeps release A's outputs in the
stack's history and the golden cases then pass; a broken set is refused naming file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from fab_program import fab

from frontier.targets import backend_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_fab_verify_on_a_fresh_stack_then_record_then_a_golden_pass(capsys, cluster):
    code, out, err = fab(capsys, "verify", "-s", "local")
    assert code == 0, out + err
    assert "verify: cases=16 passed=14 failed=0 not_recorded=2 pass_rate=1.000" in out
    assert "not yet recorded — run `fab verify --record`" in out

    code, out, err = fab(capsys, "verify", "-s", "local", "--record")
    assert code == 0, out + err
    store = backend_for(cluster.settings).history_store()
    where = f"s3://{store.bucket}/{store.prefix}releases/{cluster.release_a}/verify/default.golden.json"
    assert f"recorded 2 golden output(s) of release {cluster.release_a} to {where}" in out
    assert "verify: cases=16 passed=16 failed=0 not_recorded=0 pass_rate=1.000" in out

    code, out, err = fab(capsys, "verify", "-s", "local")
    assert code == 0, out + err
    assert f"equal to release {cluster.release_a}" in out
    assert "verify: cases=16 passed=16 failed=0 not_recorded=0 pass_rate=1.000" in out


def test_a_set_with_broken_cases_is_refused_on_the_stack_naming_file_line_and_field(capsys, cluster):
    source = Path(cluster.settings.source)
    broken = source.parent / "broken-set.yaml"
    broken.write_text(
        "cases:\n"
        "  - {name: fine, kind: bad_input, raw: '[', expect: {status: 400}}\n"
        "  - name: hopes\n"
        "    kind: normal\n"
        "    request: {messages: [{role: user, content: hi}]}\n"
        "    expect: {}\n"
    )
    original = source.read_text()
    document = yaml.safe_load(original)
    document["config"]["frontier:verify"] = {"file": str(broken)}
    source.write_text(yaml.safe_dump(document, sort_keys=False))
    try:
        code, out, err = fab(capsys, "verify", "-s", "local")
    finally:
        source.write_text(original)
    assert code == 2
    assert f"{broken}:6: cases[1].expect: names no check" in out + err
