"""What the accelerators of the stacks offer: a small table of GPU specs and instance types, with sources.

Figures are the vendors' datasheet numbers: dense (no 2:4 sparsity) tensor-core FLOP/s, HBM or GDDR
bandwidth, and the per-GPU interconnect bandwidth in ONE direction (NVLink where the GPUs have it,
otherwise the PCIe slot) — the bandwidth a ring all-reduce moves data at. Decimal units: GB = 10^9 B.
The roofline (``roofline.py``) multiplies them by efficiency factors; nothing here is measured.

Prices are AWS on-demand list prices in us-east-1 (per instance-hour, Linux). A stack's own
``node_groups[].price_per_hour`` always wins over this table for the instance type it runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from frontier.errors import FrontierError

TB = 10**12
GBPS = 10**9  # bytes per second
TFLOPS = 10**12


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model, as ``node_groups[].gpu_type`` spells it."""

    name: str
    memory_gb: float
    bandwidth: float  # memory bandwidth, bytes/s
    bf16_flops: float  # dense bf16/fp16 tensor FLOP/s
    fp8_flops: float | None  # dense fp8 tensor FLOP/s; None where the GPU has no fp8 tensor cores
    link_bandwidth: float  # per GPU, one direction, bytes/s
    link: str  # what the link is
    source: str  # datasheet the figures come from

    def flops_for(self, dtype_bytes: int) -> float:
        """Peak dense FLOP/s at the compute dtype: fp8 (1 byte) where supported, else bf16/fp16.

        float32 weights still run on the tensor cores as TF32, at half the bf16 rate.
        """
        if dtype_bytes == 1 and self.fp8_flops is not None:
            return self.fp8_flops
        if dtype_bytes == 4:
            return self.bf16_flops / 2
        return self.bf16_flops


@dataclass(frozen=True)
class InstanceType:
    """A cloud instance type that carries GPUs of one kind."""

    name: str
    gpu: str  # a key of GPUS
    gpus_per_node: int
    nvlink_domain_gpus: int  # GPUs joined by NVLink; 1 where they talk over PCIe only
    price_per_hour: float
    price_source: str
    # The host around the GPUs (AWS's instance type page): what a pod's CPU and memory are sized from.
    vcpus: int
    memory_gib: int

    @property
    def network_bandwidth(self) -> float:
        """Bytes/s one GPU gets of the node's network (EFA where the type has it), one direction."""
        return NETWORK_GBPS[self.name] * 10**9 / 8 / self.gpus_per_node


_PCIE4 = "PCIe Gen4 x16 (no NVLink)"
_PCIE4_BW = 32 * GBPS  # 64 GB/s bidirectional

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec(
            name="A10G-24GB",
            memory_gb=24,
            bandwidth=600 * GBPS,
            bf16_flops=125 * TFLOPS,
            fp8_flops=None,
            link_bandwidth=_PCIE4_BW,
            link=_PCIE4,
            source="NVIDIA A10 Tensor Core GPU datasheet (A10G is AWS's A10: 24 GB GDDR6, 600 GB/s)",
        ),
        GpuSpec(
            name="L4-24GB",
            memory_gb=24,
            bandwidth=300 * GBPS,
            bf16_flops=121 * TFLOPS,
            fp8_flops=242.5 * TFLOPS,
            link_bandwidth=_PCIE4_BW,
            link=_PCIE4,
            source="NVIDIA L4 Tensor Core GPU datasheet (485 TF fp8 / 242 TF bf16 with sparsity, halved)",
        ),
        GpuSpec(
            name="L40S-48GB",
            memory_gb=48,
            bandwidth=864 * GBPS,
            bf16_flops=362.05 * TFLOPS,
            fp8_flops=733 * TFLOPS,
            link_bandwidth=_PCIE4_BW,
            link=_PCIE4,
            source="NVIDIA L40S datasheet (1,466 TF fp8 / 733 TF bf16 with sparsity, halved)",
        ),
        GpuSpec(
            name="A100-SXM4-40GB",
            memory_gb=40,
            bandwidth=1555 * GBPS,
            bf16_flops=312 * TFLOPS,
            fp8_flops=None,
            link_bandwidth=300 * GBPS,
            link="NVLink 3 (600 GB/s bidirectional)",
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB HBM2)",
        ),
        GpuSpec(
            name="A100-SXM4-80GB",
            memory_gb=80,
            bandwidth=2039 * GBPS,
            bf16_flops=312 * TFLOPS,
            fp8_flops=None,
            link_bandwidth=300 * GBPS,
            link="NVLink 3 (600 GB/s bidirectional)",
            source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB HBM2e)",
        ),
        GpuSpec(
            name="H100-SXM-80GB",
            memory_gb=80,
            bandwidth=3350 * GBPS,
            bf16_flops=989.5 * TFLOPS,
            fp8_flops=1979 * TFLOPS,
            link_bandwidth=450 * GBPS,
            link="NVLink 4 (900 GB/s bidirectional)",
            source="NVIDIA H100 Tensor Core GPU datasheet (SXM5; 1,979 TF bf16 / 3,958 TF fp8 with sparsity, halved)",
        ),
        GpuSpec(
            name="H200-SXM-141GB",
            memory_gb=141,
            bandwidth=4800 * GBPS,
            bf16_flops=989.5 * TFLOPS,
            fp8_flops=1979 * TFLOPS,
            link_bandwidth=450 * GBPS,
            link="NVLink 4 (900 GB/s bidirectional)",
            source="NVIDIA H200 Tensor Core GPU datasheet (SXM; 141 GB HBM3e, 4.8 TB/s)",
        ),
    )
}

_AWS = "AWS EC2 on-demand list price, us-east-1, Linux (aws.amazon.com/ec2/pricing/on-demand, 2024)"

INSTANCES: dict[str, InstanceType] = {
    i.name: i
    for i in (
        InstanceType("g5.xlarge", "A10G-24GB", 1, 1, 1.006, _AWS, 4, 16),
        InstanceType("g5.12xlarge", "A10G-24GB", 4, 1, 5.672, _AWS, 48, 192),
        InstanceType("g5.48xlarge", "A10G-24GB", 8, 1, 16.288, _AWS, 192, 768),
        InstanceType("g6.xlarge", "L4-24GB", 1, 1, 0.8048, _AWS, 4, 16),
        InstanceType("g6.12xlarge", "L4-24GB", 4, 1, 4.6016, _AWS, 48, 192),
        InstanceType("g6.48xlarge", "L4-24GB", 8, 1, 13.3504, _AWS, 192, 768),
        InstanceType("g6e.xlarge", "L40S-48GB", 1, 1, 1.861, _AWS, 4, 32),
        InstanceType("g6e.12xlarge", "L40S-48GB", 4, 1, 10.493, _AWS, 48, 384),
        InstanceType("g6e.48xlarge", "L40S-48GB", 8, 1, 30.131, _AWS, 192, 1536),
        InstanceType("p4d.24xlarge", "A100-SXM4-40GB", 8, 8, 32.7726, _AWS, 96, 1152),
        InstanceType("p4de.24xlarge", "A100-SXM4-80GB", 8, 8, 40.9657, _AWS, 96, 1152),
        InstanceType("p5.48xlarge", "H100-SXM-80GB", 8, 8, 98.32, _AWS, 192, 2048),
        InstanceType(
            "p5e.48xlarge",
            "H200-SXM-141GB",
            8,
            8,
            113.0,
            "ESTIMATE: p5e is sold through capacity blocks, not on demand; p5.48xlarge x 1.15 (the H200's "
            "premium in capacity-block prices), rounded",
            192,
            2048,
        ),
    )
}


# The node's network, Gbit/s (AWS's instance type pages: "Network bandwidth"; EFA on p4d/p4de/p5/p5e,
# whose figure is the sum over the node's EFA adapters). What an expert-parallel all-to-all or a
# pipeline stage's send runs at once it leaves the NVLink domain. "Up to" figures are burst ceilings:
# the baseline of the smallest types is lower.
NETWORK_GBPS: dict[str, float] = {
    "g5.xlarge": 10,
    "g5.12xlarge": 40,
    "g5.48xlarge": 100,
    "g6.xlarge": 10,
    "g6.12xlarge": 40,
    "g6.48xlarge": 100,
    "g6e.xlarge": 20,
    "g6e.12xlarge": 100,
    "g6e.48xlarge": 400,
    "p4d.24xlarge": 400,
    "p4de.24xlarge": 400,
    "p5.48xlarge": 3200,
    "p5e.48xlarge": 3200,
}


def gpu_spec(gpu_type: str, field: str = "gpu_type") -> GpuSpec:
    """The spec of a GPU by name; an unknown name is an error naming the field and the known types."""
    try:
        return GPUS[gpu_type]
    except KeyError:
        raise FrontierError(
            f"{field} = {gpu_type!r}: unknown GPU type; known types: {', '.join(sorted(GPUS))} "
            "(add a row with its datasheet to frontier/capacity/gpus.py)"
        ) from None


def instance_type(name: str, field: str = "instance_type") -> InstanceType:
    try:
        return INSTANCES[name]
    except KeyError:
        raise FrontierError(
            f"{field} = {name!r}: unknown instance type; known types: {', '.join(sorted(INSTANCES))}"
        ) from None
