"""The CPU shim: its version guard, and proof that sections are needed (real Megatron-Core, gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from kilocard.backends import cpu_shim

#: Also run on every other supported megatron-core release (scripts/test.sh, second pass).
pytestmark = pytest.mark.mcore_range

# One gloo rank builds a tiny GPTModel with Megatron-Core DDP + optimizer and takes one step.
PROBE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from kilocard.backends import cpu_shim
    print("applied", sorted(cpu_shim.apply()), flush=True)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:" + sys.argv[1])
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    ps.initialize_model_parallel()
    model_parallel_cuda_manual_seed(1)
    print("stage rng ok", flush=True)
    from kilocard.config.compose import compose, to_run_config
    from kilocard.backends import Backend
    from kilocard.train import megatron_adapter as ma
    rc = to_run_config(compose(["recipe=tiny_gpt", "model.num_layers=1"]))
    built = ma.build(rc, Backend(name="cpu", dist_backend="gloo", local_spec=True))
    print("stage optimizer ok", flush=True)
    tokens = torch.randint(0, 256, (2, 65))
    batch = dict(tokens=tokens[:, :-1], labels=tokens[:, 1:], loss_mask=torch.ones(2, 64),
                 position_ids=torch.arange(64).expand(2, -1), attention_mask=None)
    out = built.forward_backward(forward_step_func=ma.forward_step, data_iterator=iter([batch]),
                                 model=built.model, num_microbatches=1, seq_length=64, micro_batch_size=2)
    ok, norm, _ = built.optimizer.step()
    print("stage step ok", ok, float(norm), flush=True)
""")


def _probe(skip: str) -> subprocess.CompletedProcess:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", **{cpu_shim.SKIP_ENV: skip})
    return subprocess.run(
        [sys.executable, "-c", PROBE, str(port)], capture_output=True, text=True, timeout=180, env=env
    )


def test_refuses_unproven_megatron_core_version():
    with pytest.raises(
        cpu_shim.ShimVersionError, match=r"megatron-core 0\.17\.0: the CPU shim was proven only against 0\.16\.1"
    ):
        cpu_shim.check_version("0.17.0")
    cpu_shim.check_version("0.16.1")


def test_installed_version_is_proven():
    assert cpu_shim.megatron_core_version() in cpu_shim.PROVEN_VERSIONS


def test_skip_list_is_parsed_and_checked(monkeypatch):
    monkeypatch.setenv(cpu_shim.SKIP_ENV, "2, 5")
    assert cpu_shim.skipped_from_env() == {2, 5}
    monkeypatch.setenv(cpu_shim.SKIP_ENV, "two")
    with pytest.raises(ValueError, match="KILOCARD_CPU_SHIM_SKIP='two'"):
        cpu_shim.skipped_from_env()


def test_every_section_is_documented():
    doc = cpu_shim.__doc__
    for n in cpu_shim.SECTIONS:
        assert f"\n{n}. " in doc, f"section {n} has no entry in the module docstring"


def test_section_1_rng_tracker_is_needed():
    """Without section 1, Megatron's model-parallel seeding needs CUDA and fails on CPU ranks."""
    r = _probe("1")
    assert r.returncode != 0
    assert "stage rng ok" not in r.stdout
    assert "cuda" in r.stderr.lower() or "nvidia" in r.stderr.lower(), r.stderr[-2000:]


def test_section_6_tensor_type_is_needed():
    """Without section 6 the Megatron optimizer rejects CPU float params (the trainer tests run every section)."""
    r = _probe("6")
    assert r.returncode != 0 and "stage rng ok" in r.stdout and "stage step ok" not in r.stdout
    assert "torch.cuda.FloatTensor" in r.stderr or "TypeError" in r.stderr, r.stderr[-2000:]
    assert "applied [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12]" in r.stdout


JIT_PROBE = textwrap.dedent("""
    import sys
    from kilocard.backends import cpu_shim
    cpu_shim.apply()
    import megatron.core
    from megatron.core import jit
    from megatron.core.transformer.moe import router
    from megatron.core.models.gpt import GPTModel
    print("noop", jit.jit_fuser is jit.noop_decorator, "dynamo", "torch._dynamo" in sys.modules, flush=True)
""")


@pytest.mark.parametrize("skip", ["", "11"])
def test_jit_fuser_section_keeps_torch_compile_out_of_a_rank(skip):
    """Section 11: with it, Megatron-Core's jit_fuser is its no-op and importing Megatron-Core's GPT model and MoE
    router (0.19 compiles ``InferenceTopKRouter``'s routing at import) never imports TorchDynamo (a third of a
    rank's import time); without it, importing Megatron-Core applies torch.compile and imports TorchDynamo."""
    env = dict(os.environ, OMP_NUM_THREADS="1", **{cpu_shim.SKIP_ENV: skip})
    r = subprocess.run([sys.executable, "-c", JIT_PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert ("noop False dynamo True" if skip else "noop True dynamo False") in r.stdout, r.stdout
