"""A GPU stack's driver branch is held to what the runtime image's CUDA needs, read from its lock."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from frontier.config.image_cuda import ImageCuda, cuda_of, driver_problems, image_cuda
from frontier.errors import StackError
from frontier.targets import load_stack


def test_the_image_lock_names_its_cuda_release():
    cuda = image_cuda()
    assert cuda.major >= 12
    assert cuda.min_driver_branch in (525, 580)


def test_cuda_13_needs_branch_580_and_cuda_12_branch_525():
    assert cuda_of("nvidia-cuda-runtime==13.0.96 \\\n    --hash=sha256:00\n").min_driver_branch == 580
    assert cuda_of("nvidia-cuda-runtime-cu12==12.8.90 \\\n").min_driver_branch == 525


def test_a_lock_without_cuda_is_not_a_cuda_images_lock():
    with pytest.raises(ValueError, match="pins no nvidia-cuda-runtime"):
        cuda_of("torch==2.13.0+cpu\n")


def test_every_gpu_stack_runs_a_driver_the_image_can_use():
    for stack in ("dev", "staging", "prod", "prod-multinode", "moe-prod", "eks-prod", "eks-gateway"):
        assert list(driver_problems(load_stack(stack))) == [], stack


def test_an_older_branch_is_refused_at_load_naming_the_needed_one(tmp_path):
    document = yaml.safe_load(Path(load_stack("staging").source).read_text())
    document["config"]["frontier:drivers"]["driver_branch"] = "550"
    path = tmp_path / "Pulumi.staging.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    with pytest.raises(StackError, match=r"drivers.driver_branch = '550': must be 580 or later"):
        load_stack("staging", path=path)


def test_a_cpu_stack_has_no_driver_to_hold():
    assert list(driver_problems(load_stack("local"), ImageCuda(13, 0))) == []
