"""Tiny random Hugging Face models twinned with the tiny_llama / tiny_mixtral / tiny_qwen2 / tiny_qwen3 /
tiny_qwen3_moe / tiny_deepseek_v3 / tiny_gpt_oss recipes.

Made with ``transformers`` in the test (no download) and saved with ``save_pretrained`` in small
safetensors shards, so the index path is the one exercised. Norm weights, biases and attention sinks are
perturbed: a wrong norm, bias or sink mapping would otherwise hide behind their default ones/zeros.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=258)

LLAMA31_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
"""Llama 3.1's RoPE scaling (transformers 5 ``rope_parameters``); recipe side: ``model.rope_scaling=true``."""


def hf_config(kind: str, **changes):
    """The transformers config of ``kind`` (llama, llama31, mixtral, qwen2, qwen3, qwen3_moe) matching its tiny
    recipe."""
    from transformers import LlamaConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    c = dict(COMMON, max_position_embeddings=64)
    if kind in ("llama", "llama31"):
        rope = LLAMA31_ROPE if kind == "llama31" else {"rope_type": "default", "rope_theta": 10000.0}
        c.update(intermediate_size=128, rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=False)
        return LlamaConfig(**{**c, **changes})
    if kind == "mixtral":
        c.update(intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5)
        c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        return MixtralConfig(**{**c, **changes})
    if kind in ("qwen3", "qwen3_moe"):  # head_dim 32: twice hidden / heads, as Qwen3-30B-A3B's 128 is
        c.update(intermediate_size=96, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=kind == "qwen3")
        c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
        if kind == "qwen3":
            return Qwen3Config(**{**c, **changes})
        c.update(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, norm_topk_prob=True)
        return Qwen3MoeConfig(**{**c, "router_aux_loss_coef": 0.001, **changes})
    if kind == "deepseek_v3":
        return deepseek_v3_config(c, changes)
    if kind == "gpt_oss":
        return gpt_oss_config(c, changes)
    c.update(intermediate_size=160, rms_norm_eps=1e-6, tie_word_embeddings=True)
    c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    return Qwen2Config(**{**c, **changes})


def deepseek_v3_config(c: dict, changes: dict):
    """A tiny DeepSeek-V3: MLA (ranks 32/16, 16 + 8 query-key dims, 16 value dims), one dense layer then MoE
    layers of 4 experts (top-2 of 2 groups, one group per token, scaled by 2.5) with one shared expert."""
    from transformers import DeepseekV3Config

    c = {**c, "num_hidden_layers": 3, "num_key_value_heads": 4}
    c.update(intermediate_size=256, moe_intermediate_size=64, n_routed_experts=4, n_shared_experts=1)
    c.update(num_experts_per_tok=2, n_group=2, topk_group=1, routed_scaling_factor=2.5, first_k_dense_replace=1)
    c.update(q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    c.update(rms_norm_eps=1e-6, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    return DeepseekV3Config(**{**c, **changes})


def gpt_oss_config(c: dict, changes: dict):
    """A tiny GPT-OSS: 4 layers, windowed (8 tokens, the query included) and full in turn, head_dim 16, 4 experts
    (top-2) of 32, plain RoPE (``GptOssConfig`` defaults to YaRN, which kilocard refuses) and a SwiGLU limit of
    0.3, low enough that the clamp cuts a share of the tiny model's expert inputs (7.0 would cut none)."""
    from transformers import GptOssConfig

    c = {**c, "num_hidden_layers": 4, "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4}
    c.update(num_experts_per_tok=2, sliding_window=8, swiglu_limit=0.3, rms_norm_eps=1e-5, tie_word_embeddings=False)
    c.update(rope_parameters={"rope_type": "default", "rope_theta": 150000.0}, router_aux_loss_coef=0.01)
    return GptOssConfig(**{**c, **changes})


def model_class(kind: str):
    """The transformers CausalLM class of ``kind``."""
    import transformers

    names = {"llama": "Llama", "llama31": "Llama", "mixtral": "Mixtral", "qwen2": "Qwen2", "qwen3": "Qwen3"}
    name = {**names, "qwen3_moe": "Qwen3Moe", "deepseek_v3": "DeepseekV3", "gpt_oss": "GptOss"}[kind]
    return getattr(transformers, f"{name}ForCausalLM")


def make(kind: str, path: Path, dtype: torch.dtype = torch.float32, seed: int = 0, **changes):
    """Save a tiny random ``kind`` model under ``path`` (sharded safetensors); return it in eval mode."""
    torch.manual_seed(seed)
    model = model_class(kind)(hf_config(kind, **changes)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
            if name.endswith("sinks"):  # GPT-OSS's sink logits: their 0.02 initialisation would barely show
                p.add_(torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's expert bias: zeros would hide a wrong map
                b.copy_(0.1 * torch.randn_like(b))
    model = model.to(dtype)
    model.save_pretrained(path, max_shard_size="40KB")
    return model


def recipe_of(kind: str) -> list[str]:
    """The recipe (and overrides) an import of ``kind`` uses."""
    return ["recipe=tiny_llama", "model.rope_scaling=true"] if kind == "llama31" else [f"recipe=tiny_{kind}"]


RUNNER = """
import json, sys
from kilocard.cli import main
print(json.dumps([main(a) for a in json.loads(sys.argv[1])]))
"""


def convert_all(*argvs: list[str], timeout: int = 600) -> list[int]:
    """Run ``kilocard convert ARGV`` for each argv in one fresh interpreter (as users do, one import of
    Megatron-Core for all); return the exit codes. Fails with the output when the runner itself fails."""
    return convert_output(*argvs, timeout=timeout)[0]


def convert_output(*argvs: list[str], timeout: int = 600) -> tuple[list[int], list[str]]:
    """``convert_all``'s exit codes and the lines the conversions printed (standard output, then kilocard's lines on
    standard error)."""
    args = [["convert", *a] for a in argvs]
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", RUNNER, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    said = [line for line in proc.stderr.splitlines() if line.startswith("kilocard ")]
    return json.loads(lines[-1]), lines[:-1] + said


TOLERANCE = 1e-4
"""Largest |logit difference| allowed between Megatron-Core and transformers in fp32 (every family's)."""


def round_trip(kind: str, root: Path, tag: str = "", **changes) -> tuple[Path, Any]:
    """Make a tiny ``kind`` model (with config ``changes``) in ``root/{tag}hf``, import it without a recipe into
    ``root/{tag}ck`` and export that to ``root/{tag}back`` (one interpreter, both exiting 0); return ``root`` and
    the transformers model."""
    hf, ck, back = (str(root / f"{tag}{name}") for name in ("hf", "ck", "back"))
    model = make(kind, Path(hf), **changes)
    assert convert_all(["hf-to-mcore", hf, ck], ["mcore-to-hf", ck, back]) == [0, 0]
    return root, model


def hf_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved Hugging Face directory, read with safetensors."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def forward_plan(root: Path, tmp_path: Path, models: dict, layouts: list[tuple[str, str, int, int, int]]) -> list[dict]:
    """The ``mcore_forward.py`` plan of ``layouts`` (name of the model in ``models``, checkpoint directory under
    ``root``, TP, PP, EP): one token batch for all, transformers' logits of each model as its reference."""
    tokens = torch.randint(0, 258, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.save(tokens, tmp_path / "tokens.pt")
    plan = []
    for kind, ckpt, tp, pp, ep in layouts:
        ref = tmp_path / f"ref_{kind}.pt"
        if not ref.exists():
            with torch.no_grad():
                torch.save(models[kind](tokens).logits.float(), ref)
        name = f"{ckpt}_tp{tp}_pp{pp}_ep{ep}"
        case = dict(name=name, ckpt=str(root / ckpt), tp=tp, pp=pp, ep=ep, tokens=str(tmp_path / "tokens.pt"))
        plan.append({**case, "reference": str(ref)})
    return plan


def run_forward(plan: list[dict], tmp_path: Path) -> Path:
    """Run ``mcore_forward.py`` on two gloo ranks over ``plan``; return the folder of its per-case results."""
    from kilocard.base.net import free_port

    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "out"
    out.mkdir()
    worker = Path(__file__).with_name("mcore_forward.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), "KILOCARD_BACKEND": "cpu"}
    launch = [sys.executable, "-W", "ignore", "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    launch += ["--master-addr", "127.0.0.1", f"--master-port={free_port()}"]
    proc = subprocess.run(
        [*launch, str(worker), str(tmp_path / "plan.json"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


def assert_logits_match(plan: list[dict], out: Path, tolerance: float) -> None:
    """Every rank of every case of ``plan`` reported logits of the test batch's shape within ``tolerance`` of
    transformers' (``run_forward``'s results in ``out``)."""
    for case in plan:
        results = [json.loads(p.read_text()) for p in out.glob(f"{case['name']}.rank*.json")]
        assert results, f"{case['name']}: no rank reported logits"
        for r in results:
            assert r["shape"] == [2, 16, 258]
            assert r["max_abs_diff"] <= tolerance, (case["name"], r)
