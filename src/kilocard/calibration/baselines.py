"""Published throughput baselines against the performance model (``kilocard baselines``).

Each row of ``baselines/published.yaml`` (or any file in that format) is turned into a RunConfig:
its model, layout, batch and precision as published, on a DGX-style cluster of its GPU (8 GPUs
per node and NVLink domain, one network adapter per GPU). What the row does not state is the
software generation, and that follows one documented rule: rows counted with the SC21 formula ran
the Megatron-LM of 2021 (unfused attention with dropout 0.1, no sequence parallelism, no
communication overlap, gradients all-reduced in fp16 for fp16 runs); every other row runs today's
Megatron-Core defaults for performance (flash attention, sequence parallelism, the distributed
optimizer, gradient/parameter/TP/pipeline overlap). A row may override either with a
``software:`` mapping of ParallelConfig/ModelConfig/PrecisionConfig/OptimConfig field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kilocard.base.safe_read import FileReadError, read_yaml
from kilocard.calibration.unstated import INTERLEAVED, apply_policy
from kilocard.config.schema import (
    ClusterConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PrecisionConfig,
    RunConfig,
    TrainerConfig,
)
from kilocard.paths import data_dir
from kilocard.perf.efficiency import FITTED, PerfModelParams
from kilocard.perf.flops import CONVENTIONS, flops_per_iteration
from kilocard.perf.memory import estimate_memory
from kilocard.perf.predict import PredictionInputs, predict_prepared, prepare, require_gpu
from kilocard.topology import cluster_hbm_bytes

#: Per-GPU network bandwidth (one direction) of the DGX system of each GPU: one NIC per GPU.
DGX_NETWORK_GBS: dict[str, float] = {
    "a100-sxm4-40gb": 25.0,  # DGX A100: 8x HDR 200 Gb/s InfiniBand
    "a100-sxm4-80gb": 25.0,
    "h100-sxm5-80gb": 50.0,  # DGX H100: 8x NDR 400 Gb/s InfiniBand
    "h200-sxm-141gb": 50.0,
    "b200-sxm-180gb": 50.0,
    # DGX GB200: one ConnectX-7 400 Gb/s InfiniBand port per GPU (4 OSFP compute-fabric ports per
    # 4-GPU compute tray: NVIDIA DGX GB200 User Guide, "Networking"; "CX7" in the compute tray of the
    # NVIDIA Multi-Node NVLink Systems tuning guide, "Understanding Your Grace-Blackwell Systems").
    # ConnectX-8 800 Gb/s is GB300's.
    "gb200-nvl72": 50.0,
    "mi300x": 50.0,
    "h100-pcie-80gb": 25.0,
}

UNVERIFIED = "unverified"


@dataclass(frozen=True)
class Row:
    """One published measurement."""

    id: str
    """Row id (``sc21-1.7b``)."""
    raw: dict[str, Any]
    """The row as written, with its unstated facts filled (``kilocard.calibration.unstated``)."""
    complete: bool
    """The row is scored: every fact the model needs is published or filled by the policy (no
    ``unverified``/missing value) and the row is not ``excluded``."""
    missing: list[str]
    """Dotted names of the facts that are unverified or missing."""
    filled: dict[str, Any] = field(default_factory=dict)
    """Unstated facts filled by the policy's defaults (``kilocard.calibration.unstated``), by dotted name."""
    excluded: str = ""
    """Why the row is kept out of the scoring although it is listed (``excluded:`` in the file)."""
    series: str | None = None
    """Name of the scaling series the row belongs to (``series:``: same model, several GPU counts)."""


FIGURES = ("tflops_per_gpu", "mfu", "tokens_per_s_per_gpu", "step_time_s")
"""The published figures a row is scored on (at least one): TFLOP/s per GPU, MFU, tokens/s per GPU, or
the step time of the row's global batch (sources that publish iteration times only)."""

REQUIRED = {
    "model": ("layers", "hidden", "heads", "ffn", "gated_mlp", "vocab", "seq"),
    "parallel": ("tp", "pp", "cp", "dp"),
    "batch": ("gbs", "mbs"),
}


def _missing(raw: dict[str, Any]) -> list[str]:
    out = []
    for key in ("gpu", "gpus", "precision", "recompute", "flops_convention"):
        if raw.get(key) in (None, UNVERIFIED):
            out.append(key)
    for group, keys in REQUIRED.items():
        node = raw.get(group)
        if not isinstance(node, dict):
            out.append(group)
            continue
        out.extend(f"{group}.{k}" for k in keys if node.get(k) in (None, UNVERIFIED))
    par = raw.get("parallel")
    if isinstance(par, dict) and par.get("vp") in (UNVERIFIED, INTERLEAVED):
        out.append("parallel.vp")
    result = raw.get("result") or {}
    if all(result.get(k) is None for k in FIGURES):
        out.append("result")
    return out


def baselines_file(path: str | None = None) -> Path:
    """The baselines file ``path`` names (default: the shipped ``baselines/published.yaml``)."""
    return Path(path) if path else data_dir("baselines") / "published.yaml"


def load_rows(path: str | None = None) -> list[Row]:
    """Rows of a baselines file (default: the shipped ``baselines/published.yaml``)."""
    file = baselines_file(path)
    try:
        doc = read_yaml(file, (dict, list, str, type(None)))
    except FileReadError as e:
        raise ValueError(f"--file: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError(f"--file: {file} has no 'rows:' list (see baselines/published.yaml for the format)")
    return [_row(raw, i, file.name) for i, raw in enumerate(doc["rows"])]


def _row(raw: Any, i: int, file: str) -> Row:
    """One row of a baselines file, its unstated facts filled by the policy."""
    if not isinstance(raw, dict) or "id" not in raw:
        raise ValueError(f"--file: row {i} of {file} has no 'id'")
    where = f"row {raw['id']} of {file}"
    if not str(raw.get("source") or "").strip():
        raise ValueError(f"--file: {where} has no 'source': cite the document, table and release it comes from")
    _check_result(raw.get("result"), where)
    check_torchtitan(raw, where)
    check_cluster(raw, where)
    full, filled = apply_policy(raw, where)
    missing = _missing(full)
    excluded = str(raw.get("excluded") or "")
    series = raw.get("series")
    return Row(
        id=str(raw["id"]),
        raw=full,
        complete=not missing and not excluded,
        missing=missing,
        filled=filled,
        excluded=excluded,
        series=str(series) if series else None,
    )


def _check_result(result: Any, where: str) -> None:
    """Published figures must be numbers (YAML reads ``1e5`` as a string: write ``1.0e+5`` or ``100000``)."""
    for key in FIGURES:
        value = result.get(key) if isinstance(result, dict) else None
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"--file: {where}: result.{key} = {value!r} is not a number (write e.g. 100000 or 1.0e+5)")


def row_cluster(raw: dict[str, Any]) -> ClusterConfig:
    """A DGX-style cluster of the row's GPU, big enough for its GPU count, with the network facts its
    source states (a ``cluster:`` mapping of ClusterConfig fields, e.g. ``pod_gpus``)."""
    spec = require_gpu(raw["gpu"])
    per_node = min(8, int(raw["gpus"]))
    dgx = ClusterConfig(
        name=f"dgx-{spec.name}",
        gpu=spec.name,
        nodes=max(1, int(raw["gpus"]) // per_node),
        gpus_per_node=per_node,
        nvlink_domain_size=max(per_node, spec.nvlink_domain_size if spec.nvlink_domain_size > 8 else per_node),
        intra_node_bandwidth_gbs=spec.nvlink_bandwidth / 1e9,
        inter_node_bandwidth_gbs=DGX_NETWORK_GBS.get(spec.name, 25.0),
    )
    return replace(dgx, **(raw.get("cluster") or {}))


def check_cluster(raw: dict[str, Any], where: str) -> None:
    """A row's ``cluster:`` mapping names only ClusterConfig fields."""
    cl = raw.get("cluster")
    if cl is None:
        return
    known = {f.name for f in fields(ClusterConfig)}
    if not isinstance(cl, dict) or any(k not in known for k in cl):
        raise ValueError(f"--file: {where}: cluster: {cl!r} may only set ClusterConfig fields (e.g. pod_gpus)")


def row_model(raw: dict[str, Any], era_2021: bool) -> ModelConfig:
    """The row's architecture: GPT-style (learned positions, tied embeddings, biases) unless gated
    (Llama-style: RoPE, untied, no biases, SwiGLU); a row's ``rope``/``tied_embeddings``/``bias``/``activation``
    say otherwise, and its ``window_size``/``window_attn_skip_freq`` give sliding-window attention."""
    m = raw["model"]
    gated = bool(m["gated_mlp"])
    rope = bool(m.get("rope", gated))
    tied = bool(m.get("tied_embeddings", not gated))
    experts = m.get("experts")
    return ModelConfig(
        name=str(raw["id"]),
        num_layers=int(m["layers"]),
        hidden_size=int(m["hidden"]),
        num_attention_heads=int(m["heads"]),
        num_query_groups=m.get("kv_heads"),
        ffn_hidden_size=int(m["ffn"]),
        seq_length=int(m["seq"]),
        max_position_embeddings=int(m["seq"]),
        vocab_size=int(m["vocab"]),
        gated_linear_unit=gated,
        activation=str(m.get("activation") or ("swiglu" if gated else "gelu")),
        normalization="RMSNorm" if gated else "LayerNorm",
        add_bias_linear=bool(m.get("bias", not gated)),
        position_embedding_type="rope" if rope else "learned_absolute",
        share_embeddings_and_output_weights=tied,
        kv_channels=m.get("head_dim"),
        num_moe_experts=int(experts) if experts else None,
        moe_router_topk=int(m.get("topk") or 2),
        moe_ffn_hidden_size=m.get("moe_ffn"),
        moe_shared_expert_intermediate_size=m.get("shared_ffn"),
        moe_layer_freq=_moe_layer_freq(m),
        moe_grouped_gemm=bool(experts),
        mtp_num_layers=m.get("mtp") or None,
        window_size=list(m["window_size"]) if m.get("window_size") else None,
        window_attn_skip_freq=m.get("window_attn_skip_freq"),
        **_mla(m),
        hidden_dropout=0.1 if era_2021 else 0.0,
        attention_dropout=0.1 if era_2021 else 0.0,
        attention_backend="local" if era_2021 else "auto",
    )


def _moe_layer_freq(m: dict[str, Any]) -> int | list[int]:
    """Megatron-Core's ``moe_layer_freq``: every layer MoE, or the first ``dense_layers`` dense (DeepSeek-V3)."""
    dense = int(m.get("dense_layers") or 0)
    return [0] * dense + [1] * (int(m["layers"]) - dense) if dense else 1


def _mla(m: dict[str, Any]) -> dict[str, Any]:
    """Multi-latent attention fields from a row's ``mla:`` mapping (Megatron-Core names), if any."""
    mla = m.get("mla")
    return {"multi_latent_attention": True, **mla} if isinstance(mla, dict) else {}


def row_run_config(row: Row) -> RunConfig:
    """The RunConfig a complete row describes (see the module docstring for the software rule)."""
    raw = row.raw
    era_2021 = raw["flops_convention"] == "megatron_sc21"
    p, b = raw["parallel"], raw["batch"]
    tp, vp = int(p["tp"]), p.get("vp")
    modern = not era_2021
    par: dict[str, Any] = dict(
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=int(p["pp"]),
        virtual_pipeline_model_parallel_size=int(vp) if vp else None,
        context_parallel_size=int(p.get("cp") or 1),
        expert_model_parallel_size=int(p.get("ep") or 1),
        expert_tensor_parallel_size=int(p["etp"]) if p.get("etp") else None,
        sequence_parallel=modern and tp > 1,
        use_distributed_optimizer=modern,
        overlap_grad_reduce=modern,
        overlap_param_gather=modern,
        tp_comm_overlap=modern and tp > 1,
        overlap_p2p_comm=modern and bool(vp),
        use_megatron_fsdp=bool(p.get("fsdp")),
        data_parallel_sharding_strategy="optim_grads_params" if p.get("fsdp") else "no_shard",
        recompute_granularity=None if raw["recompute"] in ("none", "op") else raw["recompute"],
        recompute_method="uniform" if raw["recompute"] == "full" else None,
        recompute_num_layers=1 if raw["recompute"] == "full" else None,
    )
    model = row_model(raw, era_2021)
    prec = raw["precision"]
    precision = PrecisionConfig(
        bf16=prec in ("bf16", "fp8", "fp4"),
        fp16=prec == "fp16",
        fp8="hybrid" if prec == "fp8" else None,
        fp8_recipe=str(raw.get("fp8_recipe") or "delayed"),
        fp4="nvfp4" if prec == "fp4" else None,
        grad_reduce_in_fp32=modern or prec == "bf16",  # 2021 Megatron-LM reduced fp16 grads in fp16
        fp8_param=prec == "fp8" and bool((raw.get("torchtitan") or {}).get("enable_fsdp_float8_all_gather")),
    )
    software = dict(raw.get("software") or {})
    optim = OptimConfig()
    for key in list(software):
        if hasattr(model, key):
            model = replace(model, **{key: software.pop(key)})
        elif hasattr(precision, key):
            precision = replace(precision, **{key: software.pop(key)})
        elif hasattr(optim, key):
            optim = replace(optim, **{key: software.pop(key)})
    par.update(software)
    return RunConfig(
        model=model,
        parallel=ParallelConfig(**par),
        precision=precision,
        optim=optim,
        cluster=row_cluster(raw),
        trainer=TrainerConfig(micro_batch_size=int(b["mbs"]), global_batch_size=int(b["gbs"])),
    )


TORCHTITAN_KEYS = {
    "fsdp_reshard_after_forward": "parallelism.fsdp_reshard_after_forward: default | always | never",
    "converters": "model.converters: a list, [float8] for torchao's Float8Linear",
    "enable_fsdp_float8_all_gather": "float8.enable_fsdp_float8_all_gather: true | false",
}
"""The torchtitan settings a row's ``torchtitan:`` mapping may give (torchtitan's own names; those
with no Megatron-Core equivalent reach the step-time model only through ``row_inputs``)."""


def check_torchtitan(raw: dict[str, Any], where: str) -> None:
    """A row's ``torchtitan:`` mapping names only ``TORCHTITAN_KEYS``, with values of their kind."""
    tt = raw.get("torchtitan")
    if tt is None:
        return
    if not isinstance(tt, dict) or any(k not in TORCHTITAN_KEYS for k in tt):
        raise ValueError(f"--file: {where}: torchtitan: {tt!r} may only set {'; '.join(TORCHTITAN_KEYS.values())}")
    if tt.get("fsdp_reshard_after_forward", "default") not in ("default", "always", "never") or not isinstance(
        tt.get("converters", []), list
    ):
        raise ValueError(f"--file: {where}: torchtitan: {tt!r}: use {'; '.join(TORCHTITAN_KEYS.values())}")


def torchtitan_reshards(raw: dict[str, Any]) -> bool:
    """Whether a torchtitan row's FSDP2 blocks are gathered again for the backward: ``always``, or
    ``default`` without pipeline parallelism (``apply_fsdp`` in torchtitan's
    ``models/llama3/parallelize_llama.py`` at e7c0cae; with PP ``default`` keeps them gathered)."""
    tt = raw.get("torchtitan") or {}
    policy = tt.get("fsdp_reshard_after_forward")
    if policy is None or not (raw.get("parallel") or {}).get("fsdp"):
        return False
    return policy == "always" or (policy == "default" and int(raw["parallel"]["pp"]) == 1)


def row_inputs(row: Row, convention: str) -> PredictionInputs:
    """``predict.prepare`` of the row's RunConfig, with what no Megatron-Core setting expresses: a row
    with ``recompute: op`` (torchtitan's op-level selective checkpointing) runs with no recompute in
    its RunConfig and the step-time model's ``op`` recompute; a ``torchtitan:`` mapping's FSDP2
    resharding (``torchtitan_reshards``) and torchao float8 converter set the matching ``Features``."""
    inputs = prepare(row_run_config(row), convention)
    tt = row.raw.get("torchtitan") or {}
    features = replace(
        inputs.features,
        recompute="op" if row.raw.get("recompute") == "op" else inputs.features.recompute,
        fsdp_reshard_after_forward=torchtitan_reshards(row.raw),
        float8_converter="float8" in (tt.get("converters") or []),
        pipeline_flushes=pipeline_flushes(row, inputs.layout.dp or 1),
    )
    return replace(inputs, features=features)


def pipeline_flushes(row: Row, dp: int) -> int:
    """Pipeline schedules per step of a row whose source states a local batch (``batch.lbs``: NeMo
    AutoModel's sequences per GPU per schedule run): ``gbs / (dp x lbs)``, the source's GA; 1 without
    one (Megatron-Core runs a step's micro-batches in one schedule)."""
    b = row.raw["batch"]
    lbs = b.get("lbs")
    if lbs is None:
        return 1
    gbs = int(b["gbs"])
    if not isinstance(lbs, int) or lbs < int(b["mbs"]) or gbs % (dp * lbs):
        raise ValueError(
            f"--file: row {row.id}: batch.lbs: {lbs!r} must be an integer >= mbs whose multiple by "
            f"DP ({dp}) divides gbs ({gbs}); set it to the source's local batch size"
        )
    return gbs // (dp * lbs)


@dataclass(frozen=True)
class Comparison:
    """Published against predicted, for one row."""

    id: str
    """Row id."""
    recipe: str | None
    """Recipe whose ``baseline_id`` is this row (``None`` when none)."""
    convention: str
    """FLOPs convention of the row's figures."""
    published_tflops_per_gpu: float | None
    """As published (derived from MFU and the peak when only MFU was published)."""
    predicted_tflops_per_gpu: float | None
    """Predicted, same convention; ``None`` for incomplete rows."""
    published_mfu: float | None
    """As published (or published TFLOP/s over the peak)."""
    predicted_mfu: float | None
    """Predicted TFLOP/s over the peak."""
    peak_tflops: float | None
    """The dense peak (row's GEMM dtype) the MFUs divide by."""
    rel_error: float | None
    """(predicted - published) / published; ``None`` when excluded."""
    note: str
    """Why the row is excluded from the statistics (empty when included)."""
    cv_rel_error: float | None = None
    """The same error when the row's source is held out of the fit (``kilocard.calibration.crossval``);
    ``None`` when not cross-validated."""
    mem_bytes: int | None = None
    """Estimated memory per GPU of the row's configuration (``kilocard.perf.memory``, what ``validate``
    checks); ``None`` for a row that is not scored."""
    hbm_bytes: int | None = None
    """Memory per GPU of the row's GPU."""


def published(row: Row) -> tuple[float | None, float | None, float | None]:
    """The row's published (TFLOP/s per GPU, MFU, peak TFLOP/s), each derived from the others where the
    source gives only one: MFU times the peak, tokens/s times the FLOPs per token of the row's own
    convention, or that convention's FLOPs per iteration over the step time and the GPU count (sources
    that publish step times or tokens/s, not FLOPs)."""
    result = row.raw.get("result") or {}
    tf, mfu, tokens = result.get("tflops_per_gpu"), result.get("mfu"), result.get("tokens_per_s_per_gpu")
    step = result.get("step_time_s")
    gpu, precision = row.raw.get("gpu"), row.raw.get("precision")
    if gpu in (None, UNVERIFIED) or precision in (None, UNVERIFIED):
        return tf, mfu, None
    spec = require_gpu(gpu)
    peak = spec.peak_flops.get(precision, spec.peak_flops["bf16"]) / 1e12
    conv = row.raw.get("flops_convention")
    if tf is None and mfu is None and tokens and row.complete and conv in CONVENTIONS:
        tf = tokens * flops_per_token(row_run_config(row), str(conv)) / 1e12
    if tf is None and mfu is None and step and row.complete and conv in CONVENTIONS:
        tf = flops_per_iteration(row_run_config(row), str(conv)) / (step * int(row.raw["gpus"])) / 1e12
    tf = tf if tf is not None else (mfu * peak if mfu is not None else None)
    mfu = mfu if mfu is not None else (tf / peak if tf is not None else None)
    return tf, mfu, peak


def compare_row(row: Row, recipes: dict[str, str], params: PerfModelParams = FITTED) -> Comparison:
    """Predict one row and compare it with the published figure."""
    pub_tf, pub_mfu, peak = published(row)
    conv = str(row.raw.get("flops_convention"))
    base: dict[str, Any] = dict(
        id=row.id,
        recipe=recipes.get(row.id),
        convention=conv,
        published_tflops_per_gpu=pub_tf,
        published_mfu=pub_mfu,
        peak_tflops=peak,
    )
    if not row.complete or conv not in CONVENTIONS or pub_tf is None:
        note = row.excluded or "unverified/missing: " + ", ".join(row.missing or ["flops_convention"])
        return Comparison(**base, predicted_tflops_per_gpu=None, predicted_mfu=None, rel_error=None, note=note)
    inputs = row_inputs(row, conv)
    pred = predict_prepared(inputs, params)
    rel = (pred.tflops_per_gpu - pub_tf) / pub_tf
    cfg = row_run_config(row)
    return Comparison(
        **base,
        predicted_tflops_per_gpu=pred.tflops_per_gpu,
        predicted_mfu=pred.mfu,
        rel_error=rel,
        note="",
        mem_bytes=estimate_memory(cfg, inputs.layout).total,
        hbm_bytes=cluster_hbm_bytes(cfg.cluster.hbm_bytes, cfg.cluster.gpu),
    )


def flops_per_token(cfg: RunConfig, convention: str) -> float:
    """Model FLOPs per trained token of a configuration, in ``convention``."""
    return flops_per_iteration(cfg, convention) / (cfg.trainer.global_batch_size * cfg.model.seq_length)


def recipe_index() -> dict[str, str]:
    """Map baseline row id to the recipe that reproduces it (``recipe.baseline_id`` in its own file)."""
    from kilocard.config.compose import recipe_catalog

    out: dict[str, str] = {}
    for name, path in recipe_catalog().items():
        try:
            doc = read_yaml(path, (dict, type(None))) or {}
        except FileReadError as e:
            raise ValueError(f"recipe {name}: {e}") from None
        baseline = (doc.get("recipe") or {}).get("baseline_id") if isinstance(doc, dict) else None
        if baseline:
            out.setdefault(str(baseline), name)
    return out


def error_stats(comparisons: list[Comparison]) -> dict[str, float]:
    """Mean and max absolute relative error over the rows included, in sample and held out (``cv_``)."""
    errs = [abs(c.rel_error) for c in comparisons if c.rel_error is not None]
    held = [abs(c.cv_rel_error) for c in comparisons if c.cv_rel_error is not None]
    nan = float("nan")
    return {
        "mean_abs_rel_error": sum(errs) / len(errs) if errs else nan,
        "max_abs_rel_error": max(errs) if errs else nan,
        "rows_included": len(errs),
        "cv_mean_abs_rel_error": sum(held) / len(held) if held else nan,
        "cv_max_abs_rel_error": max(held) if held else nan,
        "n_scored": len(held),
    }


def compare_all(
    path: str | None = None, params: PerfModelParams = FITTED, recipes: dict[str, str] | None = None
) -> list[Comparison]:
    """Compare every row of a baselines file."""
    index = recipe_index() if recipes is None else recipes
    return [compare_row(r, index, params) for r in load_rows(path)]
