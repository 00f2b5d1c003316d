"""GPU table and rank placement: which process groups stay inside a node / NVLink domain.

The analytic ``groups_cross`` is checked against brute force (every group enumerated from
Megatron-Core's own ``RankGenerator`` in the pinned 0.16.1) on many small layouts.
"""

from __future__ import annotations

import itertools

import pytest

from kilocard.topology import GPU_TABLE, RANK_ORDER, gpu_spec, groups_cross, rank_coordinates


def test_gpu_table_has_the_datasheet_dense_peaks():
    assert gpu_spec("a100-sxm4-80gb").peak("bf16") == 312e12 and not gpu_spec("a100-sxm4-80gb").has_fp8
    h100 = gpu_spec("h100-sxm5-80gb")
    assert (h100.peak("bf16"), h100.peak("fp8"), h100.has_fp4) == (989e12, 1979e12, False)
    assert gpu_spec("h200-sxm-141gb").peak("bf16") == 989e12 and gpu_spec("h200-sxm-141gb").hbm_bytes > 140e9
    b200, gb200 = gpu_spec("b200-sxm-180gb"), gpu_spec("gb200-nvl72")
    assert (b200.peak("bf16"), b200.peak("fp8"), b200.peak("fp4")) == (2.25e15, 4.5e15, 9e15)
    assert (gb200.peak("bf16"), gb200.peak("fp8"), gb200.peak("fp4"), gb200.nvlink_domain_size) == (
        2.5e15,
        5e15,
        10e15,
        72,
    )
    # GB200 NVL72 specification table, per GPU: 576 TB/s of HBM3e and 130 TB/s of NVLink over 72 GPUs
    # (1.8 TB/s both directions), TF32 2.5 PF sparse.
    assert (gb200.hbm_bandwidth, gb200.nvlink_bandwidth, gb200.peak("tf32")) == (8.0e12, 0.9e12, 1.25e15)
    assert gpu_spec("mi300x").peak("bf16") == 1307e12 and gpu_spec("mi300x").peak("fp8") == 2615e12
    assert gpu_spec("h100-pcie-80gb").peak("bf16") == 756e12
    assert gpu_spec("cpu").hbm_bytes == 8 << 30 and "nominal" in gpu_spec("cpu").note
    assert gpu_spec("v100") is None and len(GPU_TABLE) == 9
    with pytest.raises(KeyError, match="no fp4 peak"):
        h100.peak("fp4")


@pytest.mark.integration  # reads Megatron-Core's default rank order
def test_rank_order_is_megatron_cores_default():
    import inspect

    from megatron.core import parallel_state

    default = inspect.signature(parallel_state.initialize_model_parallel).parameters["order"].default
    assert default == "-".join(RANK_ORDER)
    # tp fastest, then cp, then dp, then pp
    assert rank_coordinates(13, [("tp", 2), ("cp", 2), ("dp", 2), ("pp", 2)]) == {"tp": 1, "cp": 0, "dp": 1, "pp": 1}


def _brute_force_cross(tp, cp, ep, dp, pp, name, unit):
    from megatron.core.parallel_state import RankGenerator

    gen = RankGenerator(tp=tp, ep=ep, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    return any(len({r // unit for r in g}) > 1 for g in gen.get_ranks(name))


@pytest.mark.integration  # Megatron-Core's rank generator
@pytest.mark.parametrize("unit", [2, 4, 6, 8])
def test_analytic_crossing_equals_megatron_rank_generator(unit):
    checked = 0
    for tp, cp, dp, pp in itertools.product([1, 2, 3, 4], [1, 2], [1, 2, 3], [1, 2, 4]):
        world = tp * cp * dp * pp
        for name, size, stride in (
            ("tp", tp, 1),
            ("cp", cp, tp),
            ("dp", dp, tp * cp),
            ("pp", pp, tp * cp * dp),
            ("tp-cp", tp * cp, 1),
        ):
            assert groups_cross(size, stride, unit, world) == _brute_force_cross(tp, cp, 1, dp, pp, name, unit), (
                tp,
                cp,
                dp,
                pp,
                name,
                unit,
            )
            checked += 1
    assert checked == 360


def _layout(tp, cp, dp, pp, unit, tp_pp_dp):
    from kilocard.layout import Layout

    world = tp * cp * dp * pp
    return Layout(
        world_size=world,
        nodes=max(1, world // unit),
        gpus_per_node=unit,
        nvlink_domain_size=unit,
        tp=tp,
        pp=pp,
        vp=None,
        cp=cp,
        ep=1,
        etp=tp,
        dp=dp,
        expert_dp=cp * dp,
        num_microbatches=1,
        use_tp_pp_dp_mapping=tp_pp_dp,
        pod_gpus=2 * unit,
    )


@pytest.mark.integration  # Megatron-Core's rank generator
@pytest.mark.parametrize("tp_pp_dp", [False, True])
@pytest.mark.parametrize("unit", [2, 4, 8])
def test_layout_groups_follow_the_rank_order_megatron_core_builds(unit, tp_pp_dp):
    """``use_tp_pp_dp_mapping`` moves PP inside DP: the layout's groups cross nodes and pods exactly where
    Megatron-Core's ``RankGenerator`` with Megatron-LM's order for it (``tp-cp-ep-pp-dp``) puts them."""
    from megatron.core.parallel_state import RankGenerator

    order = "tp-cp-ep-pp-dp" if tp_pp_dp else "tp-cp-ep-dp-pp"
    checked = 0
    for tp, cp, dp, pp in itertools.product([1, 2, 4], [1, 2], [1, 2, 3], [1, 2, 4]):
        lay = _layout(tp, cp, dp, pp, unit, tp_pp_dp)
        gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order=order)
        for name, token in (("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("dp_cp", "dp-cp")):
            for attr, size in (("within_node", unit), ("within_pod", 2 * unit)):
                theirs = not any(len({r // size for r in g}) > 1 for g in gen.get_ranks(token))
                assert getattr(lay.groups[name], attr) == theirs, (tp, cp, dp, pp, name, attr, order)
                checked += 1
    assert checked == 540


def test_tp_pp_dp_mapping_puts_llama3s_pipeline_inside_a_pod_and_fsdp_across():
    """Llama 3 405B on 8,192 GPUs (TP 8, PP 16, DP 64; arXiv 2407.21783 Table 4) on 3,072-GPU pods: in
    the paper's order [TP, CP, PP, DP] the pipeline stays inside a pod and DP spans pods; Megatron-Core's
    default order does the opposite."""
    from kilocard.layout import Layout

    def lay(tp_pp_dp):
        return Layout(
            world_size=8192, nodes=1024, gpus_per_node=8, nvlink_domain_size=8, tp=8, pp=16, vp=8, cp=1,
            ep=1, etp=8, dp=64, expert_dp=64, num_microbatches=32, use_tp_pp_dp_mapping=tp_pp_dp, pod_gpus=3072,
        )  # fmt: skip

    paper, default = lay(True).groups, lay(False).groups
    assert (paper["pp"].within_pod, paper["dp"].within_pod, paper["pp"].stride, paper["dp"].stride) == (
        True,
        False,
        8,
        128,
    )
    assert (default["pp"].within_pod, default["dp"].within_pod) == (False, True)
