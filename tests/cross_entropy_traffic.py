"""HBM bytes per logit that Megatron-Core's eager vocab-parallel cross-entropy moves (run as a script).

Runs ``megatron.core.tensor_parallel.vocab_parallel_cross_entropy`` (the path with
``cross_entropy_loss_fusion`` off), forward and backward, on bf16 logits on one CPU rank of torch's fake
process group (``FakeStore`` + backend ``fake``: the TP all-reduces are no-ops, as they are for TP 1)
under a ``TorchDispatchMode`` that adds up, per aten kernel, the bytes of the tensors it reads and
writes. Views move nothing; gathers and scatters at one index per token move the indexed elements only.
The vocabulary is large against the tokens, so per-token tensors (max, sum, loss, targets) are small.
Prints the bytes divided by the number of logits.
"""

from __future__ import annotations

import warnings
from typing import Any

#: Gathers/scatters of one element per token: they touch the indexed elements, not the whole tensor.
_INDEXED = ("aten::index.", "aten::index_put")


def _nbytes(tensors: Any) -> int:
    import torch
    from torch.utils._pytree import tree_leaves

    return sum(t.numel() * t.element_size() for t in tree_leaves(tensors) if isinstance(t, torch.Tensor))


def measure(tokens: int = 16, vocab: int = 32768) -> float:
    """Bytes per logit of one forward + backward of the eager cross-entropy on ``tokens x vocab`` logits."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torch.utils._python_dispatch import TorchDispatchMode

    class Traffic(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            name = str(func._schema.name) + "." + func._overloadname
            if func.is_view:
                return out
            if name.startswith(_INDEXED):
                indexed = args[2] if "index_put" in name else out  # the values written, or the gathered ones
                self.bytes += 2 * _nbytes(indexed)
            else:  # reads every input (an out= argument is written, not read), writes its result
                reads = {k: v for k, v in (kwargs or {}).items() if k != "out"}
                self.bytes += _nbytes((args, reads)) + _nbytes(out)
            return out

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    ps.initialize_model_parallel(create_gloo_process_groups=False)
    try:
        logits = torch.randn(tokens, 1, vocab, dtype=torch.bfloat16, requires_grad=True)
        target = torch.randint(0, vocab, (tokens, 1))
        with Traffic() as traffic:
            loss = vocab_parallel_cross_entropy(logits, target)
            torch.autograd.grad(loss, logits, torch.ones_like(loss))
        return traffic.bytes / (tokens * vocab)
    finally:
        ps.destroy_model_parallel()
        dist.destroy_process_group()


if __name__ == "__main__":
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        print(measure())
