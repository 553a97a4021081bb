"""The CUDA the runtime image is built for, read from its lock, and the driver branch that CUDA needs.

PyPI's Linux torch wheels carry their CUDA user-space libraries as ``nvidia-*`` wheels, so the
image's CUDA is whatever ``requirements/image.txt`` (``make lock``) pins ``nvidia-cuda-runtime`` to;
the kernel driver comes from the host. NVIDIA's minor-version compatibility runs every release of a
CUDA major on any driver of that major's first branch or later, and on none older: a host whose
driver is older loads it, then fails the runtime's first CUDA call. So a stack's
``drivers.driver_branch`` is refused at load below the branch the image needs, and the host's
driver check (``templates/install-nvidia.sh.j2``) refuses an AMI's older driver the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache

from frontier_settings import FieldProblem

from frontier import project
from frontier.config.schema import Settings

IMAGE_LOCK = "requirements/image.txt"
# The first driver branch of each CUDA major (CUDA Toolkit release notes, "CUDA Driver" table:
# minor-version compatibility from 450.80 for 11.x, 525.60 for 12.x, 580 for 13.x).
MIN_DRIVER_BRANCH = {11: 450, 12: 525, 13: 580}
_RUNTIME_PIN = re.compile(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class ImageCuda:
    major: int
    minor: int

    @property
    def min_driver_branch(self) -> int:
        known = [major for major in MIN_DRIVER_BRANCH if major <= self.major]
        if not known:
            raise ValueError(f"CUDA {self} is older than any release this table knows")
        return MIN_DRIVER_BRANCH[max(known)]

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def cuda_of(lock_text: str) -> ImageCuda:
    """The CUDA release a lock file pins; ValueError where it pins none."""
    found = _RUNTIME_PIN.search(lock_text)
    if found is None:
        raise ValueError("the lock pins no nvidia-cuda-runtime: it is not a CUDA image's lock")
    return ImageCuda(int(found.group(1)), int(found.group(2)))


@cache
def image_cuda() -> ImageCuda:
    """The CUDA of the runtime image this checkout builds."""
    return cuda_of((project.root() / IMAGE_LOCK).read_text())


def driver_problems(s: Settings, cuda: ImageCuda | None = None) -> Iterator[FieldProblem]:
    """A GPU stack's driver branch older than what the image's CUDA needs."""
    if not any(group.accelerator == "gpu" for group in s.node_groups):
        return
    cuda = cuda or image_cuda()
    if int(s.drivers.driver_branch) < cuda.min_driver_branch:
        yield FieldProblem(
            "drivers.driver_branch",
            s.drivers.driver_branch,
            f"must be {cuda.min_driver_branch} or later: the runtime image's torch is built for CUDA {cuda} "
            f"({IMAGE_LOCK}), which no older driver runs",
        )
