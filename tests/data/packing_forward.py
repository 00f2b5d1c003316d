"""Worker (one CPU rank, gloo, the CPU shim): the tiny Llama of ``recipe=tiny_llama_sft`` on packed and unpacked
samples of the shipped chat set, through the trainer's own ``forward_step``; writes what it measured as JSON.

``python packing_forward.py OUT.json CACHE_DIR``. The model is built by ``train.megatron_adapter`` as the
trainer builds it (random weights, seed 1234, eval mode: no dropout). For the first packed samples, every
conversation that begins inside its sample is found again as its own unpacked sample (the same document id)
and the per-token losses of its assistant targets are compared; the same samples packed without
``data.reset_*`` (conversations run on into each other) are the control. Then the tokens of one conversation
of a packed sample are scrambled, and the losses of the sample's other conversations must not move.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import numpy
import torch
import torch.distributed as dist

SAMPLES = 4
"""Packed samples compared."""


def _dataset(cfg, cache: str, packing: bool, reset: bool = True):
    import dataclasses

    from kilocard.data.datasets import build_split_dataset, gpt_dataset_config
    from kilocard.data.split import TRAIN
    from kilocard.data.tokenizer import get_tokenizer

    data = dataclasses.replace(cfg.data, packing=packing, reset_position_ids=reset, reset_attention_mask=reset)
    cfg = dataclasses.replace(cfg, data=data)
    config = gpt_dataset_config(cfg, get_tokenizer(cfg.data.tokenizer), cache, create_attention_mask=True)
    return build_split_dataset(config, TRAIN, SAMPLES, True, packing)


def _losses(model, samples: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token losses ``[b, s]`` of ``samples`` through the trainer's forward step, and their loss masks."""
    from torch.utils.data import default_collate

    from kilocard.train import megatron_adapter as ma

    batch = default_collate(samples)
    with torch.no_grad():
        per_token, _ = ma.forward_step(iter([batch]), model)
    return per_token.float(), batch["loss_mask"]


def _conversations(dataset, k: int, eod: int) -> list[tuple[int, int, int]]:
    """``(document, start, end)`` of every conversation that begins inside packed sample ``k``."""
    text, documents, *_ = dataset._query_document_sample_shuffle_indices(k)  # 0.19: lengths too
    seq = dataset.config.sequence_length
    ends = [j for j in range(seq) if text[j] == eod]
    starts = [0, *[e + 1 for e in ends]]
    inside = dataset._starts_inside(k)
    out = []
    for j, (doc, start) in enumerate(zip(documents, starts, strict=False)):
        if (j == 0 and inside) or start >= seq:
            continue
        out.append((int(doc), start, min(start + int(dataset.dataset.sequence_lengths[doc]), seq)))
    return out


def main(out_path: str, cache: str) -> None:
    os.environ["KILOCARD_BACKEND"] = "cpu"
    from kilocard.backends import select
    from kilocard.config.compose import compose, to_run_config
    from kilocard.data.tokenizer import get_tokenizer
    from kilocard.layout import of_sizes
    from kilocard.train import megatron_adapter as ma

    backend = select(0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    cfg = to_run_config(compose(["recipe=tiny_llama_sft"]))
    ma.init_parallel_state(of_sizes(1, 1, 1), timeout_minutes=5)
    ma.seed_all(1234)
    (model,) = ma.build_model_chunks(cfg, ma.transformer_config(cfg, backend), backend)
    model.eval()
    eod = get_tokenizer(cfg.data.tokenizer).eod
    packed, unpacked = _dataset(cfg, cache, True), _dataset(cfg, cache, False)
    ran_on = _dataset(cfg, cache, True, reset=False)
    samples = [packed[k] for k in range(SAMPLES)]
    loss, mask = _losses(model, samples)
    control, _ = _losses(model, [ran_on[k] for k in range(SAMPLES)])
    where = {int(d): u for u, d in reversed(list(enumerate(unpacked.document_index)))}
    pairs = [(k, c) for k in range(SAMPLES) for c in _conversations(packed, k, eod)]
    alone, alone_mask = _losses(model, [unpacked[where[doc]] for _, (doc, _, _) in pairs])
    a, b, c, restarts = [], [], [], 0
    for i, (k, (_, start, end)) in enumerate(pairs):
        n = end - start
        both = (mask[k, start:end] * alone_mask[i, :n]).bool()
        a.append(loss[k, start:end][both])
        b.append(alone[i, :n][both])
        c.append(control[k, start:end][both])
        restarts += int(samples[k]["position_ids"][start] == 0 and start > 0)
    a_, b_, c_ = torch.cat(a), torch.cat(b), torch.cat(c)
    # scramble the first conversation of a sample where others follow it: they must not move
    k0 = next(k for k in range(SAMPLES) if len(_conversations(packed, k, eod)) > 1)
    (_, s0, e0), *rest = _conversations(packed, k0, eod)
    changed = dict(samples[k0])
    tokens = changed["tokens"].clone()
    tokens[s0 : e0 - 1] = torch.from_numpy(numpy.random.RandomState(0).randint(1, 320, e0 - 1 - s0))
    changed["tokens"] = tokens
    moved, _ = _losses(model, [changed])
    others = torch.cat([(moved[0, s:e] - loss[k0, s:e]).abs() for _, s, e in rest])
    result = {
        "conversations": len(pairs),
        "tokens": int(a_.numel()),
        "restarts": restarts,
        "max_abs_diff": float((a_ - b_).abs().max()),
        "mean_packed": float(a_.mean()),
        "mean_unpacked": float(b_.mean()),
        "control_max_abs_diff": float((c_ - b_).abs().max()),
        "others_of_sample_moved": float(others.max()),
        "others_tokens": int(others.numel()),
        "scrambled_moved": float((moved[0, s0 : e0 - 1] - loss[k0, s0 : e0 - 1]).abs().max()),
    }
    with open(out_path, "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
