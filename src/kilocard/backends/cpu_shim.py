"""Patches that let Megatron-Core train on CPU ranks over gloo (no CUDA, no Apex, no TE).

Imported only by the CPU backend (``kilocard.backends.cpu``); the GPU path never imports it.
``apply()`` installs the sections below once per process, before any Megatron-Core model is
built. It refuses a megatron-core version it was not proven against (``PROVEN_VERSIONS``):
each section reaches into Megatron-Core internals whose names move between releases.

Sections (``KILOCARD_CPU_SHIM_SKIP=2,5`` switches sections off, for experiments and tests):

1. RNG tracker: ``CudaRNGStatesTracker.add`` and the get/set of the "CUDA" RNG state keep the
   tracker's states on the CPU generator (``model_parallel_cuda_manual_seed`` calls
   ``torch.cuda.manual_seed`` otherwise and fails without CUDA).
2. Device redirection: ``device="cuda"``, ``device=torch.cuda.current_device()``, ``t.cuda()``
   and ``t.to("cuda")`` in Megatron-Core (buffers, p2p shapes, grad-norm scratch) become CPU.
3. CUDA runtime no-ops: ``torch.cuda.synchronize``/``Stream``/``Event``/``current_stream``/
   ``record_stream`` used by the p2p batch sync and the alltoall MoE dispatcher's side stream.
4. ``moe_utils.te_general_gemm`` is undefined without Transformer Engine in 0.16 (NameError in
   the router); define it as ``None`` so the non-TE branch runs.
5. alltoall MoE dispatcher: split sizes become numpy only when the tensor ``is_cuda``; on CPU they
   stay tensors and ``all_to_all_single`` raises ``TypeError``. Convert them.
6. ``Tensor.type()`` reports CPU float tensors as ``torch.cuda.*Tensor``: the optimizer, the
   DistributedOptimizer and grad clipping compare against the CUDA type names.
7. ``sequence_parallel`` with torch norms (required for MoE with TP>1): ``WrappedTorchNorm``
   asserts; build the torch norm anyway and mark its params ``sequence_parallel`` so their grads
   are all-reduced over TP by ``finalize_model_grads``.
8. gloo needs equal sizes in ``all_gather``/``reduce_scatter`` over tensor lists; MoE with TP and
   EP sends uneven lists. Emulate them by padding / all_reduce when the sizes differ.
9. DistributedOptimizer on torch Adam (no Apex/TE; not CPU-specific): a ``fully_reshardable``
   load raises ``KeyError: 'step'`` (the checkpoint lacks torch Adam's per-param ``step``), and
   ``load_state_dict`` gives every param the same ``step`` tensor, so Adam bumps it once per
   param per step (silently wrong bias correction). Keep the live ``step`` and un-share it.
10. Synchronous checkpoint saves: the torch_dist writer hands its write results through a queue
    served by a *spawned* multiprocessing Manager, which imports torch when it unpickles the first
    result (about 4 s per rank; 12-15 s for four ranks on two cores, every run). CPU ranks save
    synchronously (the results are put and read in the same process), so an in-process
    ``queue.Queue`` does the same job. Not for async saves (GPU backend only).
11. Megatron-Core applies ``torch.compile`` at import: its ``jit_fuser`` to its fused activations, and
    on 0.19 ``@torch.compile`` to ``InferenceTopKRouter``'s routing. Each import of TorchDynamo and
    Inductor that this pulls in costs a rank CPU time on every start (about 1.4 s of CPU per rank on
    0.16, a third of importing Megatron-Core; on 0.19 the router alone costs 1.1 s), and CPU ranks never
    call those functions (their configs keep the fusions off; the router is for inference). The section
    loads those modules with ``torch.compile`` a no-op decorator while they execute, and makes
    ``jit_fuser`` Megatron-Core's own ``noop_decorator``; installed first, so it must run before
    Megatron-Core is imported (``apply()`` comes before any Megatron-Core import in a rank). Where
    Megatron-Core is already loaded it changes nothing.
12. Multi-latent attention (DeepSeek-V3's): its YaRN rotary embedding (``rope_type: yarn``; ``GPTModel``'s
    with ``position_embedding_type: yarn`` is the same class) is built without
    ``use_cpu_initialization`` and computes its frequencies inside ``torch.device(current_device())``, a
    CUDA device context that no factory redirection reaches: build it with ``use_cpu_initialization``. And
    0.16.1's ``multi_latent_attention`` takes Transformer Engine for present when
    ``megatron.core.extensions.transformer_engine`` imports (which it does without TE, on a ``MagicMock``),
    so ``isinstance(linear_proj, TELinear)`` raises: its ``HAVE_TE`` is set to whether TE imports.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

import torch
import torch.distributed as dist

PROVEN_VERSIONS = ("0.16.1", "0.19.2")
"""megatron-core releases every section below was proven against (tests/backends/test_shim_*.py)."""

SKIP_ENV = "KILOCARD_CPU_SHIM_SKIP"
"""Comma-separated section numbers to leave out (experiments and the tests that prove a section)."""

_applied: frozenset[int] | None = None


def _replace(owner: object, name: str, new: object) -> None:
    """Replace ``owner.name`` with ``new``: each section patches torch or Megatron-Core on purpose (a plain
    assignment to a method or a class, which a type checker rightly flags as a mistake elsewhere)."""
    setattr(owner, name, new)


class ShimVersionError(RuntimeError):
    """The installed megatron-core is not a version the shim was proven against."""


def _patch_rng_tracker() -> None:
    import megatron.core.tensor_parallel.random as rnd

    def add(self: Any, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        self.seeds_.add(seed)
        orig = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(orig)

    _replace(rnd.CudaRNGStatesTracker, "add", add)
    _replace(rnd, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    _replace(rnd, "_set_cuda_rng_state", lambda state, *a, **k: torch.set_rng_state(state))


def _is_cuda(d: object) -> bool:
    return (
        (isinstance(d, int) and not isinstance(d, bool))
        or (isinstance(d, str) and d.startswith("cuda"))
        or (isinstance(d, torch.device) and d.type == "cuda")
    )


def _to_cpu_device(f: Callable, pos: int | None = None) -> Callable:
    @functools.wraps(f)
    def wrapper(*a: Any, **k: Any) -> Any:
        if "device" in k and _is_cuda(k["device"]):
            k["device"] = "cpu"
        if pos is not None and len(a) > pos and _is_cuda(a[pos]):
            a = a[:pos] + ("cpu",) + a[pos + 1 :]
        return f(*a, **k)

    return wrapper


_FACTORIES = (
    "empty",
    "zeros",
    "ones",
    "full",
    "arange",
    "tensor",
    "as_tensor",
    "rand",
    "randn",
    "randint",
    "randperm",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "linspace",
    "eye",
    "empty_strided",
)


def _patch_devices() -> None:
    for name in _FACTORIES:
        _replace(torch, name, _to_cpu_device(getattr(torch, name)))
    for name in ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"):
        _replace(torch.Tensor, name, _to_cpu_device(getattr(torch.Tensor, name)))
    _replace(torch.Tensor, "to", _to_cpu_device(torch.Tensor.to, pos=1))
    _replace(torch.Tensor, "cuda", lambda self, *a, **k: self)
    _replace(torch.cuda, "current_device", lambda: 0)


class _NullEvent:
    """``torch.cuda.Event`` on a CPU rank: every operation is already complete."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def record(self, *a: Any, **k: Any) -> None:
        pass

    def wait(self, *a: Any, **k: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: _NullEvent) -> float:
        return 0.0


class _NullStream(_NullEvent):
    """``torch.cuda.Stream`` on a CPU rank: one stream, nothing to wait for."""

    def wait_stream(self, *a: Any) -> None:
        pass

    def wait_event(self, *a: Any) -> None:
        pass

    def record_event(self, e: _NullEvent | None = None) -> _NullEvent:
        return e or _NullEvent()


def _patch_cuda_runtime() -> None:
    null = _NullStream()
    _replace(torch.cuda, "synchronize", lambda *a, **k: None)
    _replace(torch.cuda, "Stream", _NullStream)
    _replace(torch.cuda, "Event", _NullEvent)
    _replace(torch.cuda, "current_stream", lambda *a, **k: null)
    _replace(torch.cuda, "default_stream", lambda *a, **k: null)
    _replace(torch.cuda, "stream", lambda *a, **k: contextlib.nullcontext())
    _replace(torch.Tensor, "record_stream", lambda self, s: None)


def _patch_te_general_gemm() -> None:
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        _replace(moe_utils, "te_general_gemm", None)


def _patch_alltoall_splits() -> None:
    import megatron.core.transformer.moe.token_dispatcher as td

    _replace(
        td,
        "maybe_move_tensor_to_cpu",
        lambda t, as_numpy=False, record_stream=False: t.numpy() if as_numpy and torch.is_tensor(t) else t,
    )


def _patch_tensor_type() -> None:
    orig_type = torch.Tensor.type
    spoof = {"torch.FloatTensor", "torch.HalfTensor", "torch.BFloat16Tensor"}

    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kw: Any) -> Any:
        if dtype is None and not kw:
            t = orig_type(self)
            return "torch.cuda." + t[6:] if t in spoof else t
        return orig_type(self, dtype, non_blocking, **kw)

    _replace(torch.Tensor, "type", type_)


def _patch_sequence_parallel_norm() -> None:
    import megatron.core.transformer.torch_norm as tn

    def norm_new(cls: type, config: Any, hidden_size: int, eps: float = 1e-5, *a: Any, **k: Any) -> torch.nn.Module:
        kind = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}[config.normalization]
        norm = kind(hidden_size, eps=eps)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm

    _replace(tn.WrappedTorchNorm, "__new__", staticmethod(norm_new))


def _patch_uneven_collectives() -> None:
    all_gather, reduce_scatter = dist.all_gather, dist.reduce_scatter

    def uneven(ts: list[torch.Tensor]) -> bool:
        return len({tuple(t.shape) for t in ts}) > 1

    def all_gather_v(
        tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False
    ) -> Any:
        if not uneven(tensor_list):
            return all_gather(tensor_list, tensor, group=group, async_op=async_op)
        pad = tensor.new_zeros((max(t.shape[0] for t in tensor_list),) + tuple(tensor.shape[1:]))
        pad[: tensor.shape[0]] = tensor
        bufs = [torch.empty_like(pad) for _ in tensor_list]
        all_gather(bufs, pad, group=group)
        for out, b in zip(tensor_list, bufs, strict=False):
            out.copy_(b[: out.shape[0]])

    def reduce_scatter_v(
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: Any = dist.ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        if not uneven(input_list):
            return reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
        full = torch.cat([t.contiguous() for t in input_list])
        dist.all_reduce(full, op=op, group=group)
        start = sum(t.shape[0] for t in input_list[: dist.get_rank(group)])
        output.copy_(full[start : start + output.shape[0]])

    _replace(dist, "all_gather", all_gather_v)
    _replace(dist, "reduce_scatter", reduce_scatter_v)


def _patch_distopt_adam_step() -> None:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as DO

    orig_set_states = DO._set_main_param_and_optimizer_states

    def set_states(self: Any, model_param: torch.nn.Parameter, tensors: dict[str, torch.Tensor]) -> Any:
        gi, go = self.model_param_group_index_map[model_param]
        st = self.optimizer.state.get(self.optimizer.param_groups[gi]["params"][go], {})
        if "step" in st and "step" not in tensors:
            tensors = {**tensors, "step": st["step"].clone()}
        return orig_set_states(self, model_param, tensors)

    orig_load_sd = DO.load_state_dict

    def load_sd(self: Any, state_dict: dict[str, Any]) -> Any:
        out = orig_load_sd(self, state_dict)
        for s in self.optimizer.state.values():
            if torch.is_tensor(s.get("step")):
                s["step"] = s["step"].clone()
        return out

    _replace(DO, "_set_main_param_and_optimizer_states", set_states)
    _replace(DO, "load_state_dict", load_sd)


def _patch_sync_save_results_queue() -> None:
    import queue

    import megatron.core.dist_checkpointing.strategies.filesystem_async as fa

    results: queue.Queue = queue.Queue()
    # 0.16 names it _get_write_results_queue(); 0.19 get_write_results_queue(mp_mode="spawn")
    name = "get_write_results_queue" if hasattr(fa, "get_write_results_queue") else "_get_write_results_queue"
    _replace(fa, name, lambda *args, **kwargs: results)


def _patch_mla() -> None:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding

    init = YarnRotaryEmbedding.__init__

    @functools.wraps(init)
    def cpu_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **{**k, "use_cpu_initialization": True})

    _replace(YarnRotaryEmbedding, "__init__", cpu_init)
    import megatron.core.transformer.multi_latent_attention as mla

    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        _replace(mla, "HAVE_TE", False)


def _no_compile(model: Any = None, **_: Any) -> Any:
    """``torch.compile`` that compiles nothing: ``@_no_compile`` and ``_no_compile(f)`` give ``f`` back."""
    return model if model is not None else (lambda f: f)


class _CompileOff(importlib.abc.MetaPathFinder):
    """Loads the Megatron-Core modules that apply ``torch.compile`` at import with ``torch.compile`` a no-op
    while they execute; ``megatron.core.jit``'s ``jit_fuser`` becomes its ``noop_decorator``."""

    JIT = "megatron.core.jit"
    NAMES = (JIT, "megatron.core.transformer.moe.router")

    def __init__(self) -> None:
        self.done: set[str] = set()

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.NAMES or fullname in self.done:
            return None
        self.done.add(fullname)  # each module once (a finder leaves sys.meta_path alone while it is walked)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            compile_ = torch.compile
            _replace(torch, "compile", _no_compile)
            try:
                load(module)
            finally:
                _replace(torch, "compile", compile_)
            if fullname == self.JIT:
                module.jit_fuser = module.noop_decorator

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch_compile_at_import() -> None:
    loaded = all(name in sys.modules for name in _CompileOff.NAMES)
    if not loaded and not any(isinstance(f, _CompileOff) for f in sys.meta_path):
        sys.meta_path.insert(0, _CompileOff())


SECTIONS: dict[int, Callable[[], None]] = {
    11: _patch_compile_at_import,  # first: the sections below import Megatron-Core
    1: _patch_rng_tracker,
    2: _patch_devices,
    3: _patch_cuda_runtime,
    4: _patch_te_general_gemm,
    5: _patch_alltoall_splits,
    6: _patch_tensor_type,
    7: _patch_sequence_parallel_norm,
    8: _patch_uneven_collectives,
    9: _patch_distopt_adam_step,
    10: _patch_sync_save_results_queue,
    12: _patch_mla,
}
"""Section number -> the function that installs it (numbers as in the module docstring)."""


def megatron_core_version() -> str:
    """The installed megatron-core release (``0.19.2``; a local suffix such as ``+abc123`` dropped)."""
    return metadata.version("megatron-core").split("+", 1)[0]


def check_version(version: str | None = None) -> None:
    """Raise ``ShimVersionError`` unless ``version`` (default: installed) is in ``PROVEN_VERSIONS``."""
    version = version or megatron_core_version()
    if version not in PROVEN_VERSIONS:
        raise ShimVersionError(
            f"megatron-core {version}: the CPU shim was proven only against {', '.join(PROVEN_VERSIONS)}; "
            f"install megatron-core=={PROVEN_VERSIONS[-1]} for CPU ranks, or prove the shim against {version} "
            f"(tests/backends/test_shim_*.py) and add it to PROVEN_VERSIONS"
        )


def skipped_from_env() -> frozenset[int]:
    """Sections named in ``KILOCARD_CPU_SHIM_SKIP``."""
    raw = os.environ.get(SKIP_ENV, "")
    try:
        return frozenset(int(s) for s in raw.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"{SKIP_ENV}={raw!r}: expected comma-separated section numbers, e.g. 2,5") from None


def apply(skip: Iterable[int] | None = None) -> frozenset[int]:
    """Install every section not in ``skip`` (default: from the environment); idempotent.

    Returns the set of installed section numbers.
    """
    global _applied
    if _applied is not None:
        return _applied
    check_version()
    skip = frozenset(skip) if skip is not None else skipped_from_env()
    unknown = skip - SECTIONS.keys()
    if unknown:
        raise ValueError(f"{SKIP_ENV}: unknown section(s) {sorted(unknown)}; sections are 1-{len(SECTIONS)}")
    for number, install in SECTIONS.items():
        if number not in skip:
            install()
    _applied = frozenset(SECTIONS.keys() - skip)
    return _applied
