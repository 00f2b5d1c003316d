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
    assert gpu_spec("mi300x").peak("bf16") == 1307e12 and gpu_spec("mi300x").peak("fp8") == 2615e12
    assert gpu_spec("h100-pcie-80gb").peak("bf16") == 756e12
    assert gpu_spec("cpu").hbm_bytes == 8 << 30 and "nominal" in gpu_spec("cpu").note
    assert gpu_spec("v100") is None and len(GPU_TABLE) == 9
    with pytest.raises(KeyError, match="no fp4 peak"):
        h100.peak("fp4")


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
