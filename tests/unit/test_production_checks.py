"""What a production stack may not load with: its canary unverified, or debug logging. Each is one
line naming the field and the value, and the same file without ``production: true`` loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from frontier import project
from frontier.errors import StackError
from frontier.targets import load_stack


def stack_copy(tmp_path: Path, stack: str, section: str, **values: object) -> Path:
    document = yaml.safe_load((project.stacks_dir() / f"Pulumi.{stack}.yaml").read_text())
    document["config"][f"frontier:{section}"].update(values)
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def refusal(stack: str, path: Path) -> str:
    with pytest.raises(StackError) as refused:
        load_stack(stack, path=path)
    return str(refused.value)


@pytest.mark.parametrize("stack", ["prod", "eks-prod"])
def test_a_production_stack_without_canary_verification_is_refused_naming_the_field(tmp_path, stack):
    message = refusal(stack, stack_copy(tmp_path, stack, "rollout", verify_canary=False))
    assert "rollout.verify_canary = False: must be true on a production stack (production: true)" in message
    assert message.count("\n") == 1  # the file's line, then this one problem


def test_debug_logging_on_a_production_stack_is_refused_naming_the_field(tmp_path):
    message = refusal("prod", stack_copy(tmp_path, "prod", "runtime", log_level="debug"))
    assert "runtime.log_level = 'debug': must be info, warning or error on a production stack" in message


def test_debug_logging_loads_on_a_stack_that_is_not_production(tmp_path):
    settings = load_stack("dev", path=stack_copy(tmp_path, "dev", "runtime", log_level="debug"))
    assert settings.runtime.log_level == "debug"


def test_every_production_stack_in_the_repository_verifies_its_canary():
    for path in sorted(project.stacks_dir().glob("Pulumi.*.yaml")):
        settings = load_stack(path.name.removeprefix("Pulumi.").removesuffix(".yaml"))
        if settings.production:
            assert settings.rollout.verify_canary, settings.stack
