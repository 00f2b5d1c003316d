"""A real slurmctld accepts the batch script of every production recipe (``sbatch --test-only``).

The controller declares each cluster profile as simulated nodes (``State=CLOUD``, no slurmd): one
partition per profile, as many nodes as its largest recipe (62,500 DGX H100 nodes for moe_10t)
and that profile's GPUs, CPUs and memory per node. It runs beside the local cluster (own config
file, port and state directory) because a 60k-node config makes every slurmd slow to start.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from conftest import run_slurm_script, slurm_skip_reason
from kilocard.config.compose import compose, recipe_catalog, to_run_config
from kilocard.launch.render import render_script
from kilocard.plan import build_plan

PRODUCTION = sorted(name for name, path in recipe_catalog().items() if path.parent.name != "tiny")
BASE = "/tmp/kilocard-slurm-plan"
MEM_MB = 2_000_000  # mem_per_node "0" (all of it): any size the profile's nodes have


@pytest.fixture(scope="module")
def plan_cluster(all_recipes):
    """slurmctld with one State=CLOUD partition per cluster profile used by a production recipe."""
    reason = slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    shapes = {}
    for name in PRODUCTION:
        c = all_recipes[name].cluster
        nodes = max(c.nodes, 2048 if c.name == "h100_dgx" else 0, shapes.get(c.name, (0,))[0])
        shapes[c.name] = (nodes, c.gpus_per_node, c.cpus_per_node)
    cloud = " ".join(f"{p}:{n}:{g}:{cpu}:{MEM_MB}" for p, (n, g, cpu) in sorted(shapes.items()))
    env = {
        "KILOCARD_SLURM_NODES": "0",
        "KILOCARD_SLURM_BASE": BASE,
        "KILOCARD_SLURM_CONF_DIR": f"{BASE}/etc",
        "KILOCARD_SLURM_PORT": "16917",
        "KILOCARD_SLURM_CLOUD": cloud,
    }
    run_slurm_script("slurm-up.sh", env, timeout=400)
    yield {"SLURM_CONF": f"{BASE}/etc/slurm.conf", "shapes": shapes}
    run_slurm_script("slurm-down.sh", env, timeout=120)


def sbatch_test_only(plan_cluster, script: Path, partition: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLURM_CONF": plan_cluster["SLURM_CONF"]}
    return subprocess.run(
        ["timeout", "120", "sbatch", "--test-only", f"--partition={partition}", str(script)],
        env=env,
        capture_output=True,
        text=True,
    )


def render_to(tmp_path: Path, rc) -> Path:
    script = tmp_path / "submit.sbatch"
    script.write_text(render_script(rc, build_plan(rc), tmp_path / "run"))
    return script


@pytest.mark.slurm
@pytest.mark.parametrize("name", PRODUCTION)
def test_controller_accepts_recipe(plan_cluster, all_recipes, tmp_path, name):
    """The rendered script of ``name`` gets a start time on exactly its nodes."""
    rc = all_recipes[name]
    proc = sbatch_test_only(plan_cluster, render_to(tmp_path, rc), rc.cluster.name)
    answer = proc.stdout + proc.stderr
    assert proc.returncode == 0, answer
    m = re.search(r"to start at \S+ using (\d+) processors on nodes (\S+) in partition", answer)
    assert m, answer
    assert node_count(m.group(2)) == rc.cluster.nodes, answer
    assert int(m.group(1)) == rc.cluster.nodes * rc.cluster.cpus_per_node  # --exclusive: whole nodes


def node_count(nodelist: str) -> int:
    """Nodes in a Slurm host list such as ``h100dgx00001`` or ``h100dgx[00001-00128]``."""
    m = re.fullmatch(r"[a-z0-9]+\[(\d+)-(\d+)\]", nodelist)
    return int(m.group(2)) - int(m.group(1)) + 1 if m else 1


@pytest.mark.slurm
def test_controller_accepts_405b_on_2048_nodes_and_refuses_more_than_it_has(plan_cluster, tmp_path):
    """16,384 GPUs fit the declared DGX H100 partition; one node more than declared is refused."""
    rc = to_run_config(compose(["recipe=llama31_405b", "cluster=h100_dgx", "cluster.nodes=2048"]))
    proc = sbatch_test_only(plan_cluster, render_to(tmp_path, rc), "h100_dgx")
    assert proc.returncode == 0 and "h100dgx[00001-02048]" in proc.stderr, proc.stderr
    declared = plan_cluster["shapes"]["h100_dgx"][0]
    rc = to_run_config(compose(["recipe=llama31_405b", "cluster=h100_dgx", f"cluster.nodes={declared + 1}"]))
    proc = sbatch_test_only(plan_cluster, render_to(tmp_path, rc), "h100_dgx")
    assert proc.returncode != 0 and "Requested node configuration is not available" in proc.stderr, proc.stderr
