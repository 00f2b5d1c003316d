"""Cluster profiles agree with the GPU table and say what a Slurm site needs.

Each profile is composed through Hydra (``cluster=<name>``) and compared with
``kilocard.topology.GPU_TABLE``: the NVLink domain and per-direction NVLink bandwidth of the
profile are the GPU's, and GPU profiles name a container image, mounts and a shared filesystem.
"""

from __future__ import annotations

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.paths import data_dir
from kilocard.topology import GPU_TABLE

PROFILES = sorted(p.stem for p in (data_dir("conf") / "cluster").glob("*.yaml"))
# (GPU key, GPUs per node, NVLink domain, NVLink GB/s per direction, network GB/s per GPU)
EXPECTED = {
    "a100_dgx": ("a100-sxm4-80gb", 8, 8, 300.0, 25.0),
    "h100_dgx": ("h100-sxm5-80gb", 8, 8, 450.0, 50.0),
    "h200_dgx": ("h200-sxm-141gb", 8, 8, 450.0, 50.0),
    "b200_dgx": ("b200-sxm-180gb", 8, 8, 900.0, 50.0),
    "gb200_nvl72": ("gb200-nvl72", 4, 72, 900.0, 50.0),
    "local_cpu": ("cpu", 1, 1, 5.0, 1.0),
}


def test_every_profile_is_described() -> None:
    assert PROFILES == sorted(EXPECTED)


@pytest.mark.parametrize("name", PROFILES)
def test_profile_matches_the_gpu_table(name: str) -> None:
    c = to_run_config(compose([f"cluster={name}"])).cluster
    gpu, per_node, domain, nvlink, network = EXPECTED[name]
    assert (c.name, c.gpu, c.gpus_per_node, c.nvlink_domain_size) == (name, gpu, per_node, domain)
    assert (c.intra_node_bandwidth_gbs, c.inter_node_bandwidth_gbs) == (nvlink, network)
    spec = GPU_TABLE[c.gpu]
    assert c.nvlink_domain_size == spec.nvlink_domain_size
    if spec.vendor == "nvidia":
        assert c.intra_node_bandwidth_gbs * 1e9 == pytest.approx(spec.nvlink_bandwidth)
        # the NeMo framework image ships megatron-core and TE; the NGC PyTorch image lacks megatron-core
        assert c.container_image and c.container_image.startswith("nvcr.io/nvidia/nemo:")
        assert c.container_mounts and all(":" in m for m in c.container_mounts)
        assert c.shared_fs.startswith("/lustre/")
        assert (c.partition, c.account) == (None, None)  # site placeholders, set per site
