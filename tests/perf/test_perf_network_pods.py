"""Network pods and the rank order: groups that span an oversubscribed layer share its uplinks, and the
rank order decides which groups span it (Llama 3, arXiv 2407.21783, Sections 3.3.1 and 3.3.2)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from kilocard.calibration.baselines import load_rows, row_cluster, row_inputs
from kilocard.config.schema import ClusterConfig
from kilocard.perf.efficiency import FITTED
from kilocard.perf.predict import hardware_for, predict_prepared
from kilocard.perf.steptime import all_to_all_time, ring_bandwidth

ROCE = ClusterConfig(
    gpu="h100-sxm5-80gb",
    nodes=1024,
    gpus_per_node=8,
    nvlink_domain_size=8,
    intra_node_bandwidth_gbs=450.0,
    inter_node_bandwidth_gbs=50.0,
    pod_gpus=3072,
    pod_oversubscription=7.0,
)
NIC = 50e9 * FITTED.network.network_efficiency


def test_a_ring_across_pods_gets_its_members_share_of_the_uplinks():
    pods, flat = hardware_for(ROCE), hardware_for(replace(ROCE, pod_gpus=None))
    # 16 pipeline stages 512 ranks apart: 6 per pod, 6/7 of a NIC each across the 1:7 layer.
    assert ring_bandwidth(512, 16, pods, FITTED) == pytest.approx(6 / 7 * NIC)
    assert ring_bandwidth(512, 16, flat, FITTED) == pytest.approx(NIC)
    # 64 DP replicas 128 apart: 24 per pod, more than 7, so the NIC stays the limit.
    assert ring_bandwidth(128, 64, pods, FITTED) == pytest.approx(NIC)
    # A group inside one pod never sees the aggregation layer.
    assert ring_bandwidth(8, 64, pods, FITTED) == pytest.approx(NIC)


def test_an_all_to_all_across_pods_sends_its_off_pod_bytes_through_the_oversubscribed_layer():
    pods, flat = hardware_for(ROCE), hardware_for(replace(ROCE, pod_gpus=None))
    volume = 1e9
    t_flat = all_to_all_time(volume, 8, 1024, flat, FITTED)
    t_pods = all_to_all_time(volume, 8, 1024, pods, FITTED)
    assert t_flat == pytest.approx(volume * 1023 / 1024 / NIC)
    # 384 of the 1,024 members share a pod: 640/1024 of the bytes leave it, at 1/7 of a NIC.
    assert t_pods == pytest.approx(volume * 640 / 1024 * 7 / NIC)


def test_pods_larger_than_the_run_change_nothing():
    assert hardware_for(replace(ROCE, nodes=256)).pod_gpus == 0
    assert hardware_for(ROCE).pod_gpus == 3072


def _llama(row_id: str, tp_pp_dp: bool, pods: bool) -> float:
    row = next(r for r in load_rows() if r.id == row_id)
    raw = copy.deepcopy(row.raw)
    raw["software"]["use_tp_pp_dp_mapping"] = tp_pp_dp
    if not pods:
        raw.pop("cluster")
    return predict_prepared(row_inputs(replace(row, raw=raw), raw["flops_convention"])).step_time_s


def test_llama3_rows_state_the_papers_network_and_rank_order():
    row = next(r for r in load_rows() if r.id == "llama3-405b-16384")
    assert row.raw["software"]["use_tp_pp_dp_mapping"] is True
    cluster = row_cluster(row.raw)
    assert (cluster.pod_gpus, cluster.pod_oversubscription, cluster.inter_node_bandwidth_gbs) == (3072, 7.0, 50.0)


def test_the_papers_rank_order_keeps_the_pipeline_inside_a_pod():
    """16,384 GPUs, TP 8, PP 16, DP 128: in Megatron-Core's default order the stages sit 1,024 ranks apart
    (3 per pod) and their sends cross the 1:7 layer; in [TP, CP, PP, DP] they sit 8 apart inside a pod
    and the DP rings (24 members per pod) are limited by their NICs, not by the layer."""
    default, paper = _llama("llama3-405b-16384", False, True), _llama("llama3-405b-16384", True, True)
    assert default > paper * 1.005
    assert paper == pytest.approx(_llama("llama3-405b-16384", True, False))
    assert _llama("llama3-405b-16384", False, False) == pytest.approx(paper)


def test_a_rows_cluster_mapping_names_only_cluster_fields(tmp_path):
    f = tmp_path / "rows.yaml"
    f.write_text("rows:\n  - {id: x, gpu: h100-sxm5-80gb, gpus: 8, cluster: {pods: 3}, source: 'a paper, Table 1'}\n")
    with pytest.raises(ValueError, match=r"row x of rows.yaml: cluster: .*ClusterConfig fields") as e:
        load_rows(str(f))
    assert "\n" not in str(e.value)
