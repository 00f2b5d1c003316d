"""The trainer builds Megatron-Core's process groups in the rank order the config names, the one the
layout (and so the validator and the performance model) assumes.

Real Megatron-Core ``initialize_model_parallel`` through kilocard's ``init_parallel_state``, every rank
of an 8-rank world played in turn on torch's fake process group (group creation is real, collectives
are no-ops; it cannot create the gloo side groups, so those are switched off), in a subprocess so that
this process keeps no global parallel state.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kilocard.layout import compute_layout
from run_configs import cfg_of

pytestmark = pytest.mark.integration  # plays the ranks in a subprocess that imports torch and Megatron-Core

SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from megatron.core import parallel_state as ps
from kilocard.layout import compute_layout
from kilocard.train.megatron_adapter import init_parallel_state
sys.path.insert(0, sys.argv[2])
from run_configs import cfg_of

# The fake backend cannot create the gloo side groups: everything else runs as the trainer calls it.
real_init = ps.initialize_model_parallel
ps.initialize_model_parallel = lambda **kw: real_init(**kw, create_gloo_process_groups=False)
cfg = cfg_of(json.loads(sys.argv[1]))
out = {}
for rank in range(8):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=8)
    init_parallel_state(compute_layout(cfg), timeout_minutes=1)
    out[rank] = {
        "pp": dist.get_process_group_ranks(ps.get_pipeline_model_parallel_group()),
        "dp": dist.get_process_group_ranks(ps.get_data_parallel_group()),
    }
    ps.destroy_model_parallel()
    dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.mark.parametrize("tp_pp_dp", [False, True])
def test_trainer_groups_follow_use_tp_pp_dp_mapping(tp_pp_dp, tmp_path):
    values = {
        "cluster.gpus_per_node": 8,
        "parallel.tensor_model_parallel_size": 2,
        "parallel.pipeline_model_parallel_size": 2,
        "parallel.use_tp_pp_dp_mapping": tp_pp_dp,
    }
    tests_dir = str(__import__("pathlib").Path(__file__).resolve().parents[1])
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(values), tests_dir],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    groups = json.loads(run.stdout.strip().splitlines()[-1])
    lay = compute_layout(cfg_of(values))
    assert groups["0"]["pp"] == [0, lay.pp_stride] == ([0, 2] if tp_pp_dp else [0, 4])
    assert groups["0"]["dp"] == [0, lay.dp_stride] == ([0, 4] if tp_pp_dp else [0, 2])
