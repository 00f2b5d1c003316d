"""The validator accepts exactly the layouts Megatron-Core 0.16.1 accepts (world size <= 8).

Megatron-Core is the real thing here: ``tests/mcore_accepts.py`` runs ``initialize_model_parallel``,
``TransformerConfig`` and ``GPTModel`` construction (and one training-mode ``MoELayer.forward``)
as the first rank of every pipeline stage, on torch's fake process group in one subprocess.
Only the rules Megatron-Core itself enforces are compared (``kilocard.validate.MCORE_CODES``);
topology, memory, batch and Megatron-LM-only rules are kilocard's and are tested elsewhere.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kilocard.config.schema import ClusterConfig, ModelConfig, ParallelConfig, PrecisionConfig, RunConfig, TrainerConfig
from kilocard.validate import MCORE_CODES, validate

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

N_CASES = 200
HERE = Path(__file__).resolve().parents[1]


def _case(rng: random.Random) -> dict:
    """A layout near the valid region: each knob is off most of the time, so both verdicts occur."""
    tp, pp, cp = rng.choice([(t, p, c) for t in (1, 2, 4) for p in (1, 2, 3, 4) for c in (1, 2) if t * p * c <= 8])
    mp = tp * pp * cp
    world = rng.choice([w for w in range(1, 9) if w % mp == 0]) if rng.random() < 0.85 else rng.randint(1, 8)
    heads = rng.choice([2, 4, 4, 8, 8, 6])
    vp = rng.choice([2, 3]) if rng.random() < 0.2 else None
    layers = pp * (vp or 1) * rng.randint(1, 2) if rng.random() < 0.7 else rng.randint(1, 8)
    first = rng.randint(1, layers) if rng.random() < 0.1 else None
    last = rng.randint(1, layers - (first or 0)) if rng.random() < 0.1 and layers - (first or 0) >= 1 else None
    experts = rng.choice([2, 4, 4, 6]) if rng.random() < 0.35 else None
    rg = rng.choice(["full", "selective"]) if rng.random() < 0.25 else None
    rm = (
        (rng.choice([None, "uniform", "block"]) if rng.random() < 0.3 else ("uniform" if rg == "full" else None))
        if rg
        else None
    )
    rn = (rng.choice([None, 1, 2]) if rng.random() < 0.3 else (1 if rg == "full" else None)) if rg else None
    split_set = first is not None or last is not None
    layout = _layout(rng, layers, pp, vp) if rng.random() < (0.05 if split_set else 0.15) else None
    return dict(
        world=world,
        tp=tp,
        pp=pp,
        cp=cp,
        vp=vp,
        ep=rng.choice([2, 4]) if rng.random() < 0.3 else 1,
        etp=rng.choice([1, 2]) if rng.random() < 0.2 else None,
        layers=layers,
        hidden=8 * heads,
        heads=heads,
        groups=rng.choice([g for g in (1, 2, 3, 4) if heads % g == 0]) if rng.random() < 0.3 else None,
        sp=(tp > 1 and rng.random() < 0.9) if experts else rng.random() < 0.3,
        experts=experts,
        first=first,
        last=last,
        acc_emb=rng.random() < (0.02 if layout else 0.08) and first is None,
        acc_loss=rng.random() < (0.02 if layout else 0.08) and last is None,
        layout=layout,
        rg=rg,
        rm=rm,
        rn=rn,
        bf16=rng.random() < 0.1,
        fp16=rng.random() < 0.03,
        tp_pp_dp=rng.random() < 0.25,  # Megatron-LM's --use-tp-pp-dp-mapping order
    )


def _layout(rng: random.Random, layers: int, pp: int, vp: int | None) -> str:
    """A ``pipeline_model_parallel_layout`` near the valid region: ``layers`` transformer layers cut at random
    into PP x VP virtual stages (empty ones allowed), the embedding first and the loss last; now and then
    one stage too many or too few, a layer too many or too few, or the embedding or loss missing."""
    chunks = max(1, pp * (vp or 1) + (rng.choice([-1, 1]) if rng.random() < 0.1 else 0))
    n = max(0, layers + (rng.choice([-1, 1]) if rng.random() < 0.1 else 0))
    cuts = sorted(rng.randint(0, n) for _ in range(chunks - 1))
    stages = ["t" * (b - a) for a, b in zip([0, *cuts], [*cuts, n], strict=True)]
    stages[0] = ("" if rng.random() < 0.05 else "E") + stages[0]
    stages[-1] += "" if rng.random() < 0.05 else "L"
    return "|".join(stages)


def _run_config(c: dict) -> RunConfig:
    return dataclasses.replace(
        RunConfig(),
        model=ModelConfig(
            num_layers=c["layers"],
            hidden_size=c["hidden"],
            num_attention_heads=c["heads"],
            num_query_groups=c["groups"],
            seq_length=16,
            max_position_embeddings=16,
            position_embedding_type="rope",
            num_moe_experts=c["experts"],
            moe_router_topk=1 if c["experts"] else 2,
        ),
        parallel=ParallelConfig(
            tensor_model_parallel_size=c["tp"],
            pipeline_model_parallel_size=c["pp"],
            virtual_pipeline_model_parallel_size=c["vp"],
            context_parallel_size=c["cp"],
            expert_model_parallel_size=c["ep"],
            expert_tensor_parallel_size=c["etp"],
            sequence_parallel=c["sp"],
            num_layers_in_first_pipeline_stage=c["first"],
            num_layers_in_last_pipeline_stage=c["last"],
            account_for_embedding_in_pipeline_split=c["acc_emb"],
            account_for_loss_in_pipeline_split=c["acc_loss"],
            pipeline_model_parallel_layout=c["layout"],
            recompute_granularity=c["rg"],
            recompute_method=c["rm"],
            recompute_num_layers=c["rn"],
            overlap_p2p_comm=True,
            use_tp_pp_dp_mapping=c["tp_pp_dp"],
        ),
        precision=PrecisionConfig(bf16=c["bf16"], fp16=c["fp16"]),
        cluster=ClusterConfig(gpu="cpu", nodes=1, gpus_per_node=c["world"]),
        trainer=TrainerConfig(micro_batch_size=1, global_batch_size=c["world"] * 4),
    )


def test_validator_agrees_with_megatron_core(tmp_path):
    rng = random.Random(16_1)
    cases = [_case(rng) for _ in range(N_CASES)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, str(HERE / "mcore_accepts.py")],
        input=json.dumps(cases),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    verdicts = json.loads(out.stdout.strip().splitlines()[-1])
    disagreements, accepted, codes = [], 0, Counter()
    for case, theirs in zip(cases, verdicts, strict=False):
        ours = [i for i in validate(_run_config(case)).errors if i.code in MCORE_CODES]
        codes.update({i.code for i in ours})
        accepted += theirs is None
        if (theirs is None) != (not ours):
            disagreements.append((case, theirs, [i.code for i in ours]))
    print(
        f"{len(cases)} layouts: Megatron-Core accepted {accepted}, rejected {len(cases) - accepted}; "
        f"{len(disagreements)} disagreements; rejections by code: {dict(codes)}"
    )
    split = [(c, v) for c, v in zip(cases, verdicts, strict=False) if c["layout"] or c["acc_emb"] or c["acc_loss"]]
    split_accepted = sum(v is None for _, v in split)
    print(f"pipeline-split settings (layout, embedding/loss accounting): {len(split)}, accepted {split_accepted}")
    assert not disagreements, "\n".join(map(str, disagreements[:10]))
    assert 0.2 * len(cases) < accepted < 0.8 * len(cases)
    assert split_accepted >= 5 and len(split) - split_accepted >= 5  # both verdicts on the split settings
