"""The step-time model responds to each mechanism the way the physics says it must."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kilocard.config.schema import ClusterConfig, ModelConfig, ParallelConfig, PrecisionConfig, RunConfig, TrainerConfig
from kilocard.layout import compute_layout
from kilocard.perf.efficiency import FITTED
from kilocard.perf.flops import flops_per_iteration
from kilocard.perf.predict import hardware_for, predict, predict_prepared, prepare
from kilocard.perf.steptime import (
    Features,
    all_to_all_time,
    chunk_queue_exposed,
    deepep_logical_ratio,
    dense_params_per_gpu,
    dp_bucket_params,
    dp_comm,
    expected_slowest,
    op_recompute_gemm_share,
    remote_domains_per_token,
    ring_bandwidth,
)

H100 = ClusterConfig(
    name="dgx",
    gpu="h100-sxm5-80gb",
    nodes=8,
    gpus_per_node=8,
    nvlink_domain_size=8,
    intra_node_bandwidth_gbs=450.0,
    inter_node_bandwidth_gbs=50.0,
)


def _cfg(**par) -> RunConfig:
    m = ModelConfig(
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        num_query_groups=8,
        seq_length=8192,
        max_position_embeddings=8192,
        vocab_size=128256,
        gated_linear_unit=True,
        activation="swiglu",
        position_embedding_type="rope",
        share_embeddings_and_output_weights=False,
    )
    p = ParallelConfig(
        **{
            "tensor_model_parallel_size": 2,
            "pipeline_model_parallel_size": 4,
            "sequence_parallel": True,
            "use_distributed_optimizer": True,
            **par,
        }
    )
    return RunConfig(
        model=m,
        parallel=p,
        precision=PrecisionConfig(bf16=True),
        cluster=H100,
        trainer=TrainerConfig(micro_batch_size=1, global_batch_size=128),
    )


def test_prediction_names_convention_and_peak():
    p = predict(_cfg())
    assert p.convention == "megatron_current" and p.peak_dtype == "bf16" and p.peak_flops == 989e12
    assert p.tflops_per_gpu == pytest.approx(flops_per_iteration(_cfg()) / p.step_time_s / 64 / 1e12)
    assert p.mfu == pytest.approx(p.tflops_per_gpu * 1e12 / 989e12)
    assert 0.2 < p.mfu < 0.7
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time_s, rel=0.02)


def test_pipeline_bubble_is_p_minus_1_over_v_m_stage_passes():
    plain = predict(_cfg())
    inter = predict(_cfg(virtual_pipeline_model_parallel_size=2))
    assert inter.breakdown["bubble"] == pytest.approx(plain.breakdown["bubble"] / 2, rel=1e-6)
    m = 128 // (1 * 8)  # micro-batches per DP rank (DP = 64 / (2 * 4))
    b = plain.breakdown
    rest = b["bubble"] + b["pp_p2p"] + b["dp_comm"] + b["optimizer"] + b["param_passes"] + b["logits"] + b["straggler"]
    middle_stage = (plain.step_time_s - rest) / m
    assert b["bubble"] == pytest.approx(3 * middle_stage, rel=1e-6)  # (P - 1) / V stage passes, P = 4


def test_full_recompute_adds_a_forward():
    none, full = (
        predict(_cfg()),
        predict(_cfg(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)),
    )
    assert full.breakdown["gemm"] == pytest.approx(none.breakdown["gemm"] * 4 / 3, rel=1e-6)
    assert 1.2 < full.step_time_s / none.step_time_s < 1.4


def test_overlaps_only_ever_help():
    base = predict(_cfg())
    for flag in ("tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm"):
        assert predict(_cfg(**{flag: True})).step_time_s <= base.step_time_s, flag
    assert predict(_cfg(tp_comm_overlap=True)).step_time_s < base.step_time_s


def test_tp_across_nodes_is_slower_than_inside_nvlink():
    """TP over two 4-GPU domains runs its rings over 4 NICs each, TP over four 2-GPU domains over 2: each
    halving of the domain slows the collectives (the fitted NVLink rate, 0.48 of the link, is 4.6 NICs)."""
    inside = predict(_cfg(tensor_model_parallel_size=8, pipeline_model_parallel_size=1))
    narrow = replace(
        _cfg(tensor_model_parallel_size=8, pipeline_model_parallel_size=1),
        cluster=replace(H100, gpus_per_node=4, nodes=16, nvlink_domain_size=4),
    )
    narrower = replace(narrow, cluster=replace(H100, gpus_per_node=2, nodes=32, nvlink_domain_size=2))
    assert predict(narrow).breakdown["tp_comm"] > 1.1 * inside.breakdown["tp_comm"]
    assert predict(narrower).breakdown["tp_comm"] > 1.9 * predict(narrow).breakdown["tp_comm"]


def test_ring_across_domains_runs_one_nic_per_member_of_a_domain():
    """A ring collective leaving the NVLink domain gets the NICs of the group's members in a domain:
    8 (capped by NVLink) for a TP=1 DP group, 1 for a DP group of TP=8 ranks."""
    hw = hardware_for(H100)
    nvlink, nic = (
        hw.nvlink_bandwidth * FITTED.network.nvlink_efficiency,
        hw.network_bandwidth * FITTED.network.network_efficiency,
    )
    assert ring_bandwidth(1, 8, hw, FITTED) == nvlink
    assert ring_bandwidth(8, 16, hw, FITTED) == pytest.approx(nic)
    assert ring_bandwidth(2, 16, hw, FITTED) == pytest.approx(min(nvlink, 4 * nic))
    assert ring_bandwidth(1, 64, hw, FITTED) == pytest.approx(min(nvlink, 8 * nic))


def test_expert_all_to_all_inside_an_nvl72_domain_is_nvlink_only():
    """EP=16 leaves an 8-GPU NVLink domain (half its tokens cross NICs) but not a 72-GPU one."""
    hw8 = hardware_for(H100)
    hw72 = replace(hw8, nvlink_domain=72)
    volume = 1e9
    across = all_to_all_time(volume, 1, 16, hw8, FITTED)
    inside = all_to_all_time(volume, 1, 16, hw72, FITTED)
    assert inside == pytest.approx(volume * 15 / 16 / (hw8.nvlink_bandwidth * FITTED.network.nvlink_efficiency))
    assert across == pytest.approx(volume * 8 / 16 / (hw8.network_bandwidth * FITTED.network.network_efficiency))
    assert across > 2.0 * inside  # half the tokens over NICs, each 1/4.6 of the fitted NVLink rate


def test_fp8_is_faster_but_lower_mfu_against_fp8_peak():
    bf16 = predict(_cfg())
    fp8 = predict(replace(_cfg(), precision=PrecisionConfig(bf16=True, fp8="hybrid")))
    assert fp8.step_time_s < bf16.step_time_s
    assert fp8.peak_dtype == "fp8" and fp8.mfu < bf16.mfu


def test_moe_expert_parallel_pays_all_to_all():
    cfg = _cfg(expert_model_parallel_size=8, tensor_model_parallel_size=1)
    cfg = replace(cfg, model=replace(cfg.model, num_moe_experts=8, moe_router_topk=2))
    p = predict(cfg)
    assert p.breakdown["ep_comm"] > 0
    dense_ep1 = replace(cfg, parallel=replace(cfg.parallel, expert_model_parallel_size=1))
    assert predict(dense_ep1).breakdown.get("ep_comm", 0.0) == 0.0


def test_unknown_gpu_is_a_one_line_error():
    with pytest.raises(ValueError, match="cluster.gpu: unknown GPU 'v100'"):
        predict(replace(_cfg(), cluster=replace(H100, gpu="v100")))


def test_every_parameter_is_named_and_physical():
    from kilocard.perf.efficiency import FITTED, PHYSICAL_RANGES, flat

    for name, value in flat(FITTED).items():
        lo, hi = PHYSICAL_RANGES[name.split(".")[-1]]
        assert lo <= value <= hi, f"{name} = {value} outside [{lo}, {hi}]"


def test_prediction_json_names_convention_and_peak():
    import json

    doc = json.loads(json.dumps(predict(_cfg()).to_json()))
    assert doc["convention"] == "megatron_current" and doc["peak_dtype"] == "bf16"
    assert doc["mfu"] == pytest.approx(doc["tflops_per_gpu"] * 1e12 / doc["peak_flops"])


def _paced(p) -> float:
    """The pipeline's own time (micro-batches and bubble): what the straggler term scales."""
    b = p.breakdown
    return p.step_time_s - b["straggler"] - b["dp_comm"] - b["optimizer"] - b["param_passes"] - b["pp_p2p"]


def test_a_step_waits_for_the_slowest_gpu():
    """The straggler term: zero on one GPU, growing with the GPU count like the largest of N normal draws."""
    assert expected_slowest(1) == 0.0
    assert 0 < expected_slowest(8) < expected_slowest(128) < expected_slowest(16384) < 4.5
    spread = FITTED.network.gpu_speed_spread
    assert spread > 0
    for nodes in (8, 64):
        p = predict(replace(_cfg(), cluster=replace(H100, nodes=nodes)))
        assert p.breakdown["straggler"] == pytest.approx(spread * expected_slowest(8 * nodes) * _paced(p), rel=1e-9)


def _moe(ep: int, **par) -> RunConfig:
    cfg = _cfg(expert_model_parallel_size=ep, tensor_model_parallel_size=1, **par)
    return replace(cfg, model=replace(cfg.model, num_moe_experts=64, moe_router_topk=2))


def test_moe_overhead_is_per_local_expert():
    """Fewer experts per GPU (larger EP): less fixed per-expert time."""
    per_expert = FITTED.network.expert_overhead_s
    assert per_expert > 0
    wide, narrow = predict(_moe(8)), predict(_moe(2))
    layers_per_gpu, micro = 32 / 4, 128 // (1 * 16)
    expected = (64 // 2 - 64 // 8) * per_expert * 3 * layers_per_gpu
    assert narrow.breakdown["overhead"] - wide.breakdown["overhead"] == pytest.approx(expected * micro, rel=1e-9)


def test_mxfp8_gemms_run_at_their_own_ratio_on_blackwell():
    b200 = ClusterConfig(
        name="b200",
        gpu="b200-sxm-180gb",
        nodes=8,
        gpus_per_node=8,
        nvlink_domain_size=8,
        intra_node_bandwidth_gbs=900.0,
        inter_node_bandwidth_gbs=50.0,
    )
    tensorwise = replace(
        _cfg(), cluster=b200, precision=PrecisionConfig(bf16=True, fp8="hybrid", fp8_recipe="tensorwise")
    )
    mx = replace(tensorwise, precision=replace(tensorwise.precision, fp8_recipe="mxfp8"))
    ratio = FITTED.gpu["blackwell"].mxfp8_gemm_ratio
    assert ratio < 1
    assert predict(mx).breakdown["gemm"] == pytest.approx(predict(tensorwise).breakdown["gemm"] / ratio, rel=1e-9)


def test_one_gradient_bucket_stays_exposed_and_grows_with_dp():
    """Megatron-Core's buckets hold max(40M, 1M x DP) parameters; the last one reduces after the backward."""
    hw = hardware_for(H100)
    ft = Features(gbs=4096, distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True)
    n_params = 2e9
    exposed = []
    for dp in (8, 512):
        lay = replace(compute_layout(_cfg(tensor_model_parallel_size=8, pipeline_model_parallel_size=1)), dp=dp)
        full = dp_comm(
            n_params, lay, replace(ft, overlap_grad_reduce=False, overlap_param_gather=False), hw, FITTED, 1e3
        )
        exposed.append(dp_comm(n_params, lay, ft, hw, FITTED, 1e3) / full)  # a long backward hides all it can
    assert exposed[0] == pytest.approx(dp_bucket_params(8) / n_params)
    assert exposed[1] == pytest.approx(dp_bucket_params(512) / n_params) and exposed[1] > 10 * exposed[0]


def test_each_model_chunks_collective_hides_behind_the_passes_after_it():
    """Interleaved 1F1B: chunk c's gradients are ready c x PP chunk-passes before the first stage's last
    backward (its weights needed as long after its first forward), and the chunks' collectives queue on one
    communicator. One chunk: the work less one micro-batch's pass, as without interleaving."""
    assert chunk_queue_exposed(1.0, 0.4, chunks=1, pp=4) == pytest.approx(0.6)
    assert chunk_queue_exposed(0.3, 0.4, chunks=1, pp=4) == 0.0
    # 8 chunks on PP 6: chunk 7 starts 42 chunk-passes (5.25 micro-batch passes) early; 1.0 s of work over a
    # 0.4 s pass is late only by what chunk 0 (the last to run) cannot hide: 1/8 s less 0.05 s
    assert chunk_queue_exposed(1.0, 0.4, chunks=8, pp=6) == pytest.approx(0.125 - 0.05)
    # work beyond everything the passes offer stays exposed: 8 s against 7 chunks x 6 x 0.05 s + 0.05 s
    assert chunk_queue_exposed(8.0, 0.4, chunks=8, pp=6) == pytest.approx(8.0 - 7 * 6 * 0.05)
    more = [chunk_queue_exposed(2.0, 0.4, chunks=v, pp=4) for v in (1, 2, 4, 8)]
    assert more == sorted(more, reverse=True) and more[0] > 2 * more[-1]  # deeper interleaving hides more


def test_output_layer_stays_in_bf16_in_fp8_runs():
    """Megatron-Core's output layer is outside Transformer Engine's FP8 autocast: same logits time."""
    bf16 = predict(_cfg())
    fp8 = predict(replace(_cfg(), precision=PrecisionConfig(bf16=True, fp8="hybrid")))
    assert fp8.breakdown["gemm"] < 0.8 * bf16.breakdown["gemm"]
    assert fp8.breakdown["logits"] == pytest.approx(bf16.breakdown["logits"], rel=1e-12)


def test_flex_dispatcher_sends_one_copy_per_domain_at_deepep_logical_bandwidth():
    """EP=32 over 8-GPU domains, top-8: the all-to-all dispatcher sends 8 x 24/32 copies of a token over
    the NIC. DeepEP/HybridEP (``flex``) sends one per domain holding one of its experts (about 3.6, its
    own domain included) at the logical RDMA bandwidth DeepEP's README states for 4 nodes (58 GB/s
    dispatch, 57 combine, on 50 GB/s NICs), not at the NIC's fitted efficiency."""
    hw = hardware_for(H100)
    assert remote_domains_per_token(8, 4) == pytest.approx(3 * (1 - 0.75**8))
    assert remote_domains_per_token(8, 1) == 0.0
    assert deepep_logical_ratio(4) == pytest.approx(57.5 / 50) and deepep_logical_ratio(2) == pytest.approx(43 / 50)
    assert deepep_logical_ratio(16) == deepep_logical_ratio(8) == pytest.approx(50.5 / 50)
    cfg = _cfg(expert_model_parallel_size=32, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    cfg = replace(cfg, model=replace(cfg.model, num_moe_experts=64, moe_router_topk=8))
    flex = replace(cfg, model=replace(cfg.model, moe_token_dispatcher_type="flex"))
    nic = hw.network_bandwidth * FITTED.network.network_efficiency
    per_token = 8192 * 4096 * 2  # tokens of one micro-batch x hidden x bf16
    share = 1.0 - FITTED.network.ep_overlap
    layers, micro = 32, 128 // 64
    plain_s, flex_s = predict(cfg).breakdown["ep_comm"], predict(flex).breakdown["ep_comm"]
    assert plain_s == pytest.approx(2 * 2 * per_token * 8 * 24 / 32 / nic * share * layers * micro, rel=1e-9)
    logical = per_token * 4 * (1 - 0.75**8) / (57.5 / 50 * hw.network_bandwidth)
    assert flex_s == pytest.approx(2 * 2 * logical * share * layers * micro, rel=1e-9)
    # Slower than the NIC would carry the copies for other domains: NVLink forwarding and the kernels
    # behind the stated figure.
    assert flex_s > 2 * 2 * per_token * remote_domains_per_token(8, 4) / nic * share * layers * micro * 1.05


def test_flex_dispatcher_inside_one_domain_sends_one_copy_per_rank():
    """EP=8 inside one 8-GPU node, top-8: the all-to-all dispatcher sends a token's 8 routed copies (7/8
    of them to other GPUs) over NVLink; DeepEP sends it once to each other rank holding one of its
    experts (``is_token_in_rank``): 7 x (1 - (7/8)^8), about 4.6 copies."""
    hw = hardware_for(H100)
    cfg = _cfg(expert_model_parallel_size=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    cfg = replace(cfg, model=replace(cfg.model, num_moe_experts=64, moe_router_topk=8))
    flex = replace(cfg, model=replace(cfg.model, moe_token_dispatcher_type="flex"))
    nvlink = hw.nvlink_bandwidth * FITTED.network.nvlink_efficiency
    per_token = 8192 * 4096 * 2
    share = 1.0 - FITTED.network.ep_overlap
    layers, micro = 32, 128 // 64
    plain_s, flex_s = predict(cfg).breakdown["ep_comm"], predict(flex).breakdown["ep_comm"]
    assert plain_s == pytest.approx(2 * 2 * per_token * 8 * 7 / 8 / nvlink * share * layers * micro, rel=1e-9)
    copies = 7 * (1 - (7 / 8) ** 8)
    assert flex_s == pytest.approx(2 * 2 * per_token * copies / nvlink * share * layers * micro, rel=1e-9)


def test_torchtitan_op_recompute_redoes_every_other_projection_and_keeps_attention():
    """torchtitan's op-level checkpointing (parallelize_llama.py ``_custom_policy``) saves every second
    ``mm`` of a block and the attention core: for Llama 3 8B it recomputes wk, wo and w3, 36.5% of the
    forward GEMM FLOPs, and all elementwise work."""
    inputs = prepare(_cfg())
    assert op_recompute_gemm_share(inputs.shape) == pytest.approx(
        (1024 + 4096 + 14336) / (2 * 4096 + 2 * 1024 + 3 * 14336)
    )
    none = predict_prepared(inputs)
    op = predict_prepared(replace(inputs, features=replace(inputs.features, recompute="op")))
    assert op.breakdown["gemm"] == pytest.approx(none.breakdown["gemm"] * (3 + 0.3654) / 3, rel=1e-3)
    assert op.breakdown["attention"] == pytest.approx(none.breakdown["attention"], rel=1e-9)
    assert op.breakdown["elementwise"] == pytest.approx(none.breakdown["elementwise"] * 4 / 3, rel=1e-9)


def test_expert_tp_gathers_and_scatters_the_routed_tokens():
    """With expert TP the dispatcher all-gathers each GPU's routed copies over the ETP group before the
    experts and reduce-scatters after them (Megatron-Core ``MoEAlltoAllTokenDispatcher``), on NVLink, even
    with EP 1; ETP 1 has none of it."""
    hw = hardware_for(H100)
    cfg = _cfg(tensor_model_parallel_size=4, pipeline_model_parallel_size=1)
    cfg = replace(cfg, model=replace(cfg.model, num_moe_experts=8, moe_router_topk=2))
    etp4 = replace(cfg, parallel=replace(cfg.parallel, expert_tensor_parallel_size=4))
    etp1 = replace(cfg, parallel=replace(cfg.parallel, expert_tensor_parallel_size=1))
    assert predict(etp1).breakdown.get("ep_comm", 0.0) == 0.0
    routed = 8192 / 4 * 2 * 4096 * 2  # one GPU's tokens (SP shard) x top-2 x hidden x bf16
    nvlink = hw.nvlink_bandwidth * FITTED.network.nvlink_efficiency
    share = 1.0 - FITTED.network.ep_overlap
    layers, micro = 32, 128 // 16
    expected = 2 * 2 * 3 * routed / nvlink * share * layers * micro  # (AG + RS) x (forward + backward)
    assert predict(etp4).breakdown["ep_comm"] == pytest.approx(expected, rel=1e-9)


def test_flash_attention_2_runs_at_its_ratio_of_the_fused_kernels():
    """``attention_backend: flash`` (FlashAttention-2) is slower than cuDNN's fused attention on Hopper by
    the stated ratio; on Ampere FlashAttention-2 is the fast kernel (ratio 1)."""
    fused, fa2 = predict(_cfg()), predict(replace(_cfg(), model=replace(_cfg().model, attention_backend="flash")))
    ratio = FITTED.gpu["hopper"].fa2_attention_ratio
    assert 0.5 < ratio < 0.7
    assert fa2.breakdown["attention"] == pytest.approx(fused.breakdown["attention"] / ratio, rel=1e-9)
    assert FITTED.gpu["ampere"].fa2_attention_ratio == 1.0


def test_sliding_window_shortens_the_attention_core_by_its_band():
    """A window on half the layers (GPT-OSS: 128 tokens on every other layer) leaves the fused attention
    core the keys the kernels compute: the full layers' s/2 per query, the windowed ones' band; the GEMMs
    and the convention's FLOPs stay. A window as long as the sequence is full attention."""
    base = _cfg()
    s = base.model.seq_length
    half = replace(base, model=replace(base.model, window_size=[128, 0], window_attn_skip_freq=2))
    full, windowed = predict(base), predict(half)
    band = 129 * (1 - 129 / (2 * s))
    ratio = (s / 2 + band) / 2 / (s / 2)
    assert windowed.breakdown["attention"] == pytest.approx(full.breakdown["attention"] * ratio, rel=1e-9)
    assert windowed.breakdown["gemm"] == full.breakdown["gemm"]
    assert windowed.step_time_s < full.step_time_s
    assert flops_per_iteration(half) == flops_per_iteration(base)
    spanning = replace(base, model=replace(base.model, window_size=[s, 0]))
    assert predict(spanning).step_time_s == full.step_time_s


def test_cuda_graphs_remove_the_launch_overhead_of_what_they_capture():
    """Megatron-Core's ``cuda_graph_impl``/``cuda_graph_scope``: a local (whole-layer or whole-step) graph
    removes a layer pass's fixed overhead, a Transformer Engine graph of ``attn`` the attention block's
    share of it; the router and preprocessing scopes are not split out of the model's overhead."""
    net = FITTED.network
    passes = 32 / 4 * 128 / 8 * 3  # layers per stage x micro-batches (GBS / DP 8) x (forward + 2 backward)
    plain = predict(_cfg()).breakdown["overhead"]
    assert plain == pytest.approx(net.layer_overhead_s * passes, rel=1e-9)

    def graphed(impl: str, scope: list[str]) -> float:
        cfg = _cfg()
        return predict(replace(cfg, model=replace(cfg.model, cuda_graph_impl=impl, cuda_graph_scope=scope))).breakdown[
            "overhead"
        ]

    assert graphed("local", ["full_iteration"]) == 0.0
    assert graphed("transformer_engine", []) == 0.0
    assert graphed("transformer_engine", ["attn"]) == pytest.approx(plain * (1 - net.attn_overhead_share), rel=1e-9)
    assert graphed("transformer_engine", ["attn", "mlp"]) == pytest.approx(0.0, abs=1e-12)
    assert graphed("transformer_engine", ["moe_router", "moe_preprocess"]) == pytest.approx(plain, rel=1e-9)


def test_each_step_zeroes_the_gradient_buffer_and_casts_fp8_weights_once():
    """Per step, not per micro-batch: Megatron-Core zeroes the gradient buffer of every local parameter
    (``grad_bytes`` each), and an FP8 run refreshes Transformer Engine's FP8 weight cache (cast + transpose, 4 bytes
    per GEMM weight) on the first micro-batch only; the bf16 embedding and output layer are not cast."""
    fp8 = replace(_cfg(), precision=PrecisionConfig(bf16=True, fp8="hybrid"))
    inputs = prepare(fp8)
    lay, shape, hw = inputs.layout, inputs.shape, inputs.hardware
    n = dense_params_per_gpu(shape, lay, inputs.features)
    hbm = hw.hbm_bandwidth * FITTED.for_family(hw.family).hbm_efficiency
    weights = n - shape.vocab * shape.hidden / lay.tp
    zero = n * inputs.features.grad_bytes
    assert predict(_cfg()).breakdown["param_passes"] == pytest.approx(zero / hbm, rel=1e-9)
    assert predict(fp8).breakdown["param_passes"] == pytest.approx((zero + weights * 4) / hbm, rel=1e-9)
    twice = replace(fp8, trainer=replace(fp8.trainer, global_batch_size=256))
    assert predict(twice).breakdown["param_passes"] == predict(fp8).breakdown["param_passes"]
    current = replace(fp8, precision=replace(fp8.precision, fp8_recipe="tensorwise"))
    assert predict(current).breakdown["param_passes"] == pytest.approx((zero + weights * 6) / hbm, rel=1e-9)


def test_fp8_runs_gather_sequence_parallel_inputs_in_fp8():
    """Transformer Engine all-gathers the FP8 GEMM inputs over TP (forward, and the backward's re-gather
    for the weight gradient): those all-gathers carry half the bytes; the reduce-scatters and the
    backward's gradient all-gathers stay bf16. Without sequence parallelism (all-reduces) nothing changes."""
    bwd = 1.0 - FITTED.network.tp_bwd_overlap
    ratio = (0.75 + bwd * (1 + 0.5 * 0.5)) / (1 + bwd * (1 + 0.5))
    fp8 = PrecisionConfig(bf16=True, fp8="hybrid")
    for sp, expected in ((True, ratio), (False, 1.0)):
        bf16 = predict(_cfg(sequence_parallel=sp))
        quantized = predict(replace(_cfg(sequence_parallel=sp), precision=fp8))
        assert quantized.breakdown["tp_comm"] == pytest.approx(expected * bf16.breakdown["tp_comm"], rel=1e-9)
