"""What a torchtitan run (PyTorch FSDP2, torchao float8, PyTorch SDPA) costs beyond a Megatron-Core one:
FlashAttention-2 kernels, torchao's unfused dynamic-scaling casts, FSDP2's second gather and its root unit."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kilocard.calibration.baselines import load_rows, row_inputs, torchtitan_reshards
from kilocard.config.schema import ClusterConfig, ModelConfig, ParallelConfig, PrecisionConfig, RunConfig, TrainerConfig
from kilocard.perf.efficiency import FITTED
from kilocard.perf.predict import predict_prepared, prepare
from kilocard.perf.steptime import ACT_BYTES, dp_comm_fsdp, fp8_cast_bytes, ring_bandwidth

H, Q, KV, F, L, V = 4096, 4096, 1024, 14336, 32, 128256


def _cluster(gpu: str) -> ClusterConfig:
    return ClusterConfig(
        name="dgx",
        gpu=gpu,
        nodes=4,
        gpus_per_node=8,
        nvlink_domain_size=8,
        intra_node_bandwidth_gbs=900.0,
        inter_node_bandwidth_gbs=50.0,
    )


def _cfg(gpu: str = "h200-sxm-141gb", backend: str = "auto", fp8: bool = False) -> RunConfig:
    """Llama 3 8B on 32 GPUs, data parallel only, one micro-batch of 2 per step (the torchtitan rows)."""
    m = ModelConfig(
        num_layers=L,
        hidden_size=H,
        ffn_hidden_size=F,
        num_attention_heads=32,
        num_query_groups=8,
        seq_length=8192,
        max_position_embeddings=8192,
        vocab_size=V,
        gated_linear_unit=True,
        activation="swiglu",
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
        attention_backend=backend,
    )
    return RunConfig(
        model=m,
        parallel=ParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True),
        precision=PrecisionConfig(
            bf16=True, fp8="hybrid" if fp8 else None, fp8_recipe="tensorwise", grad_reduce_in_fp32=True
        ),
        cluster=_cluster(gpu),
        trainer=TrainerConfig(micro_batch_size=2, global_batch_size=64),
    )


def test_flash_backend_runs_fa2_at_its_stated_share_of_the_fused_kernels_on_hopper():
    """``attention_backend: flash`` (FlashAttention-2; PyTorch SDPA's flash backend) runs the attention
    core at ``fa2_attention_ratio`` (0.62 on Hopper, from the FlashAttention-3 paper's H100 figures) of
    the fused cuDNN kernels Transformer Engine picks by default; families without a measurement keep 1."""
    assert FITTED.gpu["hopper"].fa2_attention_ratio == 0.62
    auto = predict_prepared(prepare(_cfg())).breakdown["attention"]
    flash = predict_prepared(prepare(_cfg(backend="flash"))).breakdown["attention"]
    assert flash == pytest.approx(auto / 0.62, rel=1e-9)
    a100_auto = predict_prepared(prepare(_cfg("a100-sxm4-80gb"))).breakdown["attention"]
    a100_flash = predict_prepared(prepare(_cfg("a100-sxm4-80gb", backend="flash"))).breakdown["attention"]
    assert a100_flash == pytest.approx(a100_auto, rel=1e-12)


def test_torchao_float8_casts_move_two_passes_per_operand_and_transposed_copies():
    """Transformer Engine's fused casts: 1.5 bf16 elements per element of 3h + q + F forward, twice that
    backward. torchao's dynamic tensorwise Float8Linear: amax pass (2 B) + cast pass (3 B) per distinct
    GEMM input forward; per output gradient 7 B (amax, cast, column-major copy) and 2 B per input for its
    transposed copy backward."""
    inputs = prepare(_cfg(fp8=True))
    te = inputs.features
    torchao = replace(te, float8_converter=True)
    assert fp8_cast_bytes(inputs.shape, inputs.layout, te, F) == pytest.approx(
        (1.5 * (3 * H + F + Q) * 2, 2 * 1.5 * (3 * H + F + Q) * 2)
    )
    assert fp8_cast_bytes(inputs.shape, inputs.layout, torchao, F) == pytest.approx(
        (5 * (2 * H + Q + F), 7 * (Q + 2 * KV + 2 * H + 2 * F) + 2 * (2 * H + Q + F))
    )
    assert fp8_cast_bytes(inputs.shape, inputs.layout, replace(torchao, precision="bf16"), F) == (0.0, 0.0)
    # In the step: forward and backward once each (no recompute), every layer, 2 x 8192 tokens.
    hbm = 4.8e12 * FITTED.gpu["hopper"].hbm_efficiency
    extra = (5 * (2 * H + Q + F) - 3 * (3 * H + F + Q)) + (
        7 * (Q + 2 * KV + 2 * H + 2 * F) + 2 * (2 * H + Q + F) - 6 * (3 * H + F + Q)
    )
    slow = predict_prepared(replace(inputs, features=torchao)).breakdown["elementwise"]
    fast = predict_prepared(inputs).breakdown["elementwise"]
    assert slow - fast == pytest.approx(L * 2 * 8192 * extra / hbm, rel=1e-9)


def test_fsdp2_gathers_twice_reduces_every_micro_batch_and_exposes_its_root_unit():
    """FSDP2 with ``reshard_after_forward``: per micro-batch every block is gathered for its forward and,
    but the last, again for its backward, and reduce-scattered; the blocks' traffic hides behind the
    pass it prefetches for, the root unit (embedding + output layer) is gathered first and reduced last."""
    inputs = prepare(_cfg(fp8=True))
    shape, lay, hw = inputs.shape, inputs.layout, inputs.hardware
    ft = replace(inputs.features, fsdp_reshard_after_forward=True)
    bw = ring_bandwidth(1, 32, hw, FITTED)
    frac = 31 / 32
    root = 2 * V * H
    blocks = L * (H * (Q + 2 * KV) + Q * H + 3 * H * F)
    n_params = blocks + V * H  # what dense_params_per_gpu counts: blocks and one vocabulary matrix
    exposed_root = frac * root * (ACT_BYTES + 4) / bw
    assert dp_comm_fsdp(shape, n_params, lay, ft, hw, FITTED, 10.0, 3) == pytest.approx(3 * exposed_root, rel=1e-9)
    everything = frac * (root * ACT_BYTES + blocks * ACT_BYTES * (1 + (L - 1) / L) + (root + blocks) * 4) / bw
    assert dp_comm_fsdp(shape, n_params, lay, ft, hw, FITTED, 0.0, 1) == pytest.approx(everything, rel=1e-9)
    fp8_gather = replace(ft, fp8_param_gather=True)
    saved = frac * blocks * (ACT_BYTES - 1) * (1 + (L - 1) / L) / bw
    assert dp_comm_fsdp(shape, n_params, lay, fp8_gather, hw, FITTED, 0.0, 1) == pytest.approx(
        everything - saved, rel=1e-9
    )
    # The step uses it only for resharded FSDP; the distributed optimizer's one gather is far cheaper.
    zero3 = predict_prepared(replace(inputs, features=ft)).breakdown["dp_comm"]
    assert zero3 > 5 * predict_prepared(inputs).breakdown["dp_comm"]


ROW = (
    "{id: r, gpu: h200-sxm-141gb, gpus: 32, precision: fp8, fp8_recipe: tensorwise, recompute: op,"
    " model: {layers: 32, hidden: 4096, heads: 32, kv_heads: 8, ffn: 14336, gated_mlp: true, vocab: 128256, seq: 8192},"
    " parallel: {tp: 1, pp: %s, vp: null, cp: 1, ep: 1, dp: %s, fsdp: true}, batch: {gbs: 64, mbs: 2},"
    " torchtitan: %s, result: {tokens_per_s_per_gpu: 10000}, flops_convention: six_n, source: test}"
)


def _row(tmp_path, torchtitan: str, pp: int = 1):
    f = tmp_path / "rows.yaml"
    f.write_text("rows:\n  - " + ROW % (pp, 32 // pp, torchtitan) + "\n")
    return load_rows(str(f))


def test_torchtitan_mapping_sets_the_step_time_features(tmp_path):
    """A row's ``torchtitan:`` settings (torchtitan's names) reach the step-time features; ``default``
    resharding holds only without pipeline parallelism (``apply_fsdp``), ``never`` never reshards."""
    (r,) = _row(
        tmp_path, "{fsdp_reshard_after_forward: default, converters: [float8], enable_fsdp_float8_all_gather: true}"
    )
    ft = row_inputs(r, "six_n").features
    assert ft.fsdp_reshard_after_forward and ft.float8_converter and ft.fp8_param_gather and ft.recompute == "op"
    (pp,) = _row(tmp_path, "{fsdp_reshard_after_forward: default}", pp=2)
    assert not torchtitan_reshards(pp.raw)
    (never,) = _row(tmp_path, "{fsdp_reshard_after_forward: never}")
    ft = row_inputs(never, "six_n").features
    assert not ft.fsdp_reshard_after_forward and not ft.float8_converter and not ft.fp8_param_gather


def test_torchtitan_mapping_with_an_unknown_setting_is_one_clear_line(tmp_path):
    with pytest.raises(ValueError) as e:
        _row(tmp_path, "{fsdp_reshard: default}")
    msg = str(e.value)
    assert "\n" not in msg and "row r" in msg and "torchtitan" in msg and "fsdp_reshard_after_forward" in msg


def test_shipped_torchtitan_h200_rows_run_what_their_benchmark_ran():
    """The H200 rows (torchtitan e7c0cae: FSDP2 default resharding, torchao float8 with FP8 all-gather,
    SDPA's flash backend on Hopper) carry every one of those mechanisms."""
    rows = [r for r in load_rows() if r.id.startswith("titan-h200")]
    assert len(rows) == 2
    for r in rows:
        ft = row_inputs(r, "six_n").features
        assert ft.fsdp_reshard_after_forward and ft.float8_converter and ft.fp8_param_gather
        assert ft.attention_backend == "flash" and ft.fp8_recipe == "tensorwise"
        assert ft.gbs == ft.mbs * r.raw["gpus"]  # one micro-batch per step
