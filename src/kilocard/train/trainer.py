"""The step loop: forward/backward through Megatron-Core's schedule, optimizer and LR step, metrics,
checkpoint commit/resume and the stop decision at every step boundary.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kilocard.backends import Backend
from kilocard.config.schema import RunConfig
from kilocard.perf.params import padded_vocab_size
from kilocard.train import checkpoint as ck
from kilocard.train import megatron_adapter as ma
from kilocard.train.metrics import MetricsWriter, Throughput, peak_memory_bytes
from kilocard.train.signals import StopFlag, Watchdog

_T0 = time.monotonic()


class NonFiniteLoss(Exception):
    """The loss became NaN or infinite (exit CRASH)."""


class DiskFull(Exception):
    """A checkpoint could not be written: no space left (exit CRASH; the last committed step is intact)."""


NEARLY_FULL_BYTES = 1 << 20
"""A save that fails with less than this free under the checkpoint directory failed for want of space."""


def _is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` or anything it wraps is ENOSPC (the torch_dist writer re-raises it wrapped)."""
    import errno

    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left on device" in str(e):
            return True
        e, seen = (e.__cause__ or e.__context__), seen + 1
    return False


@dataclass
class _InFlight:
    """A finished step whose (loss, stop flag) all-reduce may still be running."""

    step: int
    """The step number."""
    consumed: int
    """Samples consumed up to and including this step."""
    values: torch.Tensor
    """[loss sum over last-stage ranks, stop votes], reduced in place."""
    work: Any
    """The collective's handle (``dist.all_reduce(..., async_op=True)``)."""
    result: dict[str, Any]
    """``train_step``'s figures of this step (grad norm, lr)."""
    started: float
    """``time.perf_counter()`` when the step began."""


class Trainer:
    """One rank's training run over a built Megatron-Core model."""

    def __init__(
        self,
        run_cfg: RunConfig,
        run_dir: Path,
        config_sha256: str,
        backend: Backend,
        stop: StopFlag,
        watchdog: Watchdog,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.cfg, self.run_dir, self.sha, self.backend = run_cfg, run_dir, config_sha256, backend
        self.stop, self.watchdog = stop, watchdog
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.ps = ps
        watchdog.beat("building the model")
        self.built = ma.build(run_cfg, backend)
        c = run_cfg.checkpoint
        self.save_root = Path(c.save) if c.save else run_dir / "checkpoints"
        self.load_root = Path(c.load) if c.load else None
        self.step, self.consumed = 0, 0
        self.last_saved: int | None = None
        t = run_cfg.trainer
        self.dp = ps.get_data_parallel_world_size()
        self.num_micro = t.global_batch_size // (t.micro_batch_size * self.dp)
        self._last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        self._loss_ranks = self.world // ps.get_pipeline_model_parallel_world_size()
        self._device = torch.device("cuda") if backend.is_cuda else torch.device("cpu")
        self.throughput = Throughput.for_run(run_cfg, self.world)
        self.resumed_from: str | None = None
        self._async_queue: Any = None
        self.log(f"built model ({self.num_micro} micro-batches per step, world {self.world}, backend {backend.name})")

    def log(self, msg: str) -> None:
        """A rank-0 line in the training log, stamped with seconds since the process started."""
        if self.rank == 0:
            print(f"[{time.monotonic() - _T0:7.1f}s] kilocard.train: {msg}", flush=True)

    # --- resume --------------------------------------------------------------------------------

    def resume(self) -> None:
        """Load the newest committed step (own save dir first, then checkpoint.load), if any."""
        self.watchdog.beat("finding the checkpoint to resume from")
        decision: list[Any] = [None, None, None]
        if self.rank == 0:
            try:
                root, step = ck.load_root_and_step(
                    self.save_root,
                    self.load_root,
                    self.cfg.checkpoint.fallback_to_previous,
                    self.cfg.checkpoint.ckpt_step,
                )
                decision = [str(root) if root else None, step, None]
            except ck.CheckpointError as e:
                decision = [None, None, str(e)]
        dist.broadcast_object_list(decision, src=0)
        root, step, err = decision
        if err:
            raise ck.CheckpointError(err)
        if step is None:
            return
        self._load(ck.step_dir(Path(root), step))

    def _load(self, sdir: Path) -> None:
        self.watchdog.beat(f"loading {sdir}")
        state = ck.TrainerState(**json.loads((sdir / ck.STATE).read_text()))
        diffs = ck.model_differences(state.model, self.cfg.model)
        vocab = padded_vocab_size(self.cfg.model, self.cfg.parallel.tensor_model_parallel_size)
        if not diffs and vocab != state.padded_vocab_size:
            diffs = [
                f"model.vocab_size: padded to {state.padded_vocab_size} at save, {vocab} with "
                f"tensor_model_parallel_size={self.cfg.parallel.tensor_model_parallel_size}"
            ]
        if diffs:
            raise ck.ModelMismatch(
                f"checkpoint {sdir} holds another model shape; differing fields: "
                + "; ".join(diffs)
                + ". Resume with the saved model config or start a new run"
            )
        from megatron.core import dist_checkpointing

        if state.extra.get(ck.MODEL_ONLY):
            self._load_model_only(sdir)
            return
        b = self.built
        ck.init_optimizer_states(b.optimizer)
        sd = ck.sharded_state_dict(b.model, b.optimizer, is_loading=True)
        loaded = dist_checkpointing.load(sd, str(sdir))
        keys = ["model"] if len(b.model) == 1 else [f"model{i}" for i in range(len(b.model))]
        for m, k in zip(b.model, keys, strict=False):
            m.module.load_state_dict(loaded[k], strict=True)
        with torch.no_grad():
            b.optimizer.load_state_dict(loaded["optimizer"])
        b.scheduler.load_state_dict(state.scheduler)
        self.step, self.consumed, self.last_saved = state.step, state.consumed_samples, state.step
        if state.layout == ck.layout_of(self.cfg, self.world) and ck.rng_file(sdir, self.rank).is_file():
            ck.set_rng_state(torch.load(ck.rng_file(sdir, self.rank), weights_only=False))
            rng = "restored"
        else:
            rng = "re-seeded (layout changed)"
        self.resumed_from = str(sdir)
        self.log(f"resumed from {sdir} (step {self.step}, {self.consumed} samples; RNG {rng})")

    def _load_model_only(self, sdir: Path) -> None:
        """Start at step 0 from a model-only step (an import): weights only, fresh optimizer, schedule and RNG."""
        from megatron.core import dist_checkpointing

        b = self.built
        loaded = dist_checkpointing.load(ck.model_sharded_state_dict(b.model), str(sdir))
        keys = ["model"] if len(b.model) == 1 else [f"model{i}" for i in range(len(b.model))]
        for m, k in zip(b.model, keys, strict=True):
            m.module.load_state_dict(loaded[k], strict=True)
        b.optimizer.reload_model_params()  # fp32 main copies (bf16/fp16, distributed optimizer) follow the weights
        self.resumed_from = str(sdir)
        self.log(f"started from the model weights of {sdir} (model-only: fresh optimizer and LR schedule, step 0)")

    # --- save ----------------------------------------------------------------------------------

    def save(self) -> None:
        """``_save``, turning a full disk into ``DiskFull`` naming the step, the free bytes and the intact step."""
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

        try:
            self._save()
        except (Exception, CheckpointException) as e:
            import shutil

            try:
                free = shutil.disk_usage(self.save_root).free
            except OSError:
                raise e from None
            # torch.save's C++ stream reports ENOSPC only as "basic_ios::clear: iostream error"
            if not (_is_disk_full(e) or free < NEARLY_FULL_BYTES):
                raise
            last = ck.latest_committed(self.save_root)
            kept = f"the last committed step {last} is intact" if last is not None else "no step was committed yet"
            raise DiskFull(
                f"saving step {self.step} under {self.save_root} failed: the disk is full ({free} bytes free); {kept}"
            ) from None

    def _save(self) -> None:
        """Write the current step on every rank, then commit it (manifest, tracker) and prune.

        With ``checkpoint.async_save`` on GPUs the tensors are written in the background and the
        commit runs when Megatron-Core's async queue finalises the save (``finalize_saves``).
        """
        from megatron.core import dist_checkpointing

        if self.last_saved == self.step:
            return
        self.finalize_saves(blocking=True)  # at most one save in flight
        self.watchdog.beat(f"saving step {self.step}")
        t0, step = time.monotonic(), self.step
        sdir = ck.step_dir(self.save_root, step)
        if self.rank == 0:
            if sdir.exists():  # an uncommitted leftover of an interrupted save of this step
                import shutil

                shutil.rmtree(sdir)
            sdir.mkdir(parents=True)
        dist.barrier()
        b = self.built
        sd = ck.sharded_state_dict(b.model, b.optimizer, is_loading=False)
        use_async = self.cfg.checkpoint.async_save and self.backend.is_cuda
        request = dist_checkpointing.save(
            sd, str(sdir), sharded_strategy=self._save_strategy(), async_sharded_save=use_async
        )
        self._write_rank_state(sdir)
        self.last_saved = step
        if not use_async:
            self._commit(sdir, step, t0)
            return
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        request.add_finalize_fn(lambda: self._commit(sdir, step, t0))
        if self._async_queue is None:
            self._async_queue = AsyncCallsQueue()
        self._async_queue.schedule_async_request(request)

    def finalize_saves(self, blocking: bool) -> None:
        """Commit background saves whose writes every rank has finished (collective; no-op when sync)."""
        if self._async_queue is not None:
            self._async_queue.maybe_finalize_async_calls(blocking=blocking)

    def _write_rank_state(self, sdir: Path) -> None:
        """This rank's RNG file, and on rank 0 the trainer state (data position, scheduler, model config)."""
        ck.rng_file(sdir, self.rank).parent.mkdir(exist_ok=True)
        torch.save(ck.rng_state(), ck.rng_file(sdir, self.rank))
        if self.rank == 0:
            b = self.built
            state = ck.TrainerState(
                step=self.step,
                consumed_samples=self.consumed,
                scheduler=b.scheduler.state_dict(),
                model=asdict(self.cfg.model),
                layout=ck.layout_of(self.cfg, self.world),
                padded_vocab_size=padded_vocab_size(self.cfg.model, self.cfg.parallel.tensor_model_parallel_size),
                config_sha256=self.sha,
            )
            (sdir / ck.STATE).write_text(json.dumps(state.__dict__, indent=1) + "\n")

    def _commit(self, sdir: Path, step: int, t0: float) -> None:
        """After every rank has written: manifest, then tracker, then prune (rank 0); collective."""
        dist.barrier()
        if self.rank == 0:
            ck.write_manifest(sdir)
            ck._fsync_write(self.save_root / ck.TRACKER, f"{step}\n")
            ck.prune(self.save_root, self.cfg.checkpoint.keep_last, step)
        dist.barrier()
        self.log(f"committed step {step} in {time.monotonic() - t0:.1f}s ({sdir})")

    def _save_strategy(self) -> Any:
        if not self.cfg.checkpoint.fully_parallel_save or self.dp == 1:
            return None
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

        return FullyParallelSaveStrategyWrapper(
            get_default_save_sharded_strategy(), self.ps.get_data_parallel_group(with_context_parallel=True)
        )

    # --- steps ---------------------------------------------------------------------------------

    def _iterators(self) -> list[Any]:
        from kilocard.data import build_train_iterator

        self.watchdog.beat("building the data iterator")
        dp_rank = self.ps.get_data_parallel_rank()
        return [
            build_train_iterator(
                self.cfg,
                dp_rank=dp_rank,
                dp_size=self.dp,
                consumed_samples=self.consumed,
                cache_dir=str(self.run_dir / "data_cache"),
                create_attention_mask=False,
            )  # GPT attention is causal: Megatron builds the mask
            for _ in self.built.model
        ]

    def train_step(self, iterators: list[Any]) -> dict[str, Any]:
        """One optimizer step; returns the loss (averaged over data-parallel ranks) and optimizer figures."""
        b, t = self.built, self.cfg.trainer
        for m in b.model:
            m.zero_grad_buffer()
        b.optimizer.zero_grad()
        out = b.forward_backward(
            forward_step_func=ma.forward_step,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=b.model,
            num_microbatches=self.num_micro,
            seq_length=self.cfg.model.seq_length,
            micro_batch_size=t.micro_batch_size,
            forward_only=False,
        )
        ok, grad_norm, _ = b.optimizer.step()
        b.scheduler.step(increment=1)
        # Stays on the device: _start_reduce sends it with the stop flag; _settle reads both back.
        local = torch.stack([o["lm loss"].float() for o in out]).mean() if out else None
        return {"local_loss": local, "grad_norm": grad_norm, "update_ok": ok, "lr": b.optimizer.param_groups[0]["lr"]}

    def _start_reduce(self, r: dict[str, Any], t0: float) -> _InFlight:
        """Start the all-reduce of (loss, stop flag) for the step just taken; read back one step later.

        Two float64 values on the device: the mean loss over last-stage ranks and whether any rank
        got a stop signal. The collective runs in the background (``async_op``) while the next step
        computes, so the step loop never waits on it: the host reads it (``_settle``) after the next
        step, or at once before a checkpoint save, a stop or the end of the run.
        """
        t = torch.zeros(2, dtype=torch.float64, device=self._device)
        local = r["local_loss"]
        if self._last_stage and local is not None:
            t[0] = local.to(self._device, torch.float64)
        if self.stop.requested:
            t[1] = 1.0
        return _InFlight(
            step=self.step,
            consumed=self.consumed,
            values=t,
            work=dist.all_reduce(t, async_op=True),
            result=r,
            started=t0,
        )

    def _settle(self, f: _InFlight, writer: MetricsWriter | None, next_start: float | None) -> bool:
        """Read step ``f.step``'s all-reduce: check the loss, write its record; returns whether to stop.

        Every rank settles the same steps in the same order, so all agree on the step they stop at
        (USR1 on one rank only stops all of them, one step later). The step time is the period from
        this step's start to the next one's (``next_start``), or to now when nothing follows yet.
        """
        f.work.wait()
        loss_sum, stops = f.values.tolist()
        loss = loss_sum / self._loss_ranks
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"step {f.step}: loss is {loss}; lower optim.lr or check the data")
        if writer is not None:
            dt = (next_start if next_start is not None else time.perf_counter()) - f.started
            writer.write(self._record(f.step, f.consumed, loss, f.result, dt))
        return stops > 0

    def run(self, writer: MetricsWriter | None) -> str:
        """Train until train_iters or a stop request; returns ``"done"`` or ``"stopped"``."""
        t = self.cfg.trainer
        if self.step >= t.train_iters:
            return "done"
        iterators = self._iterators()
        self.log(f"data ready; training steps {self.step + 1}..{t.train_iters}")
        interval = self.cfg.checkpoint.save_interval
        pending: _InFlight | None = None  # the previous step, its all-reduce still in flight
        while self.step < t.train_iters:
            self.watchdog.beat(f"step {self.step + 1}")
            t0 = time.perf_counter()
            r = self.train_step(iterators)
            self.step += 1
            self.consumed += t.global_batch_size
            current = self._start_reduce(r, t0)
            stop = self._settle(pending, writer, next_start=t0) if pending is not None else False
            pending = current
            if stop or self.step >= t.train_iters or (interval and self.step % interval == 0):
                # a step is checked (finite loss) and recorded before it is saved
                stop = self._settle(pending, writer, next_start=None) or stop
                pending = None
                self.save()
                if stop:
                    self.finalize_saves(blocking=True)
                    return "stopped"
            self.finalize_saves(blocking=False)
        self.finalize_saves(blocking=True)
        return "done"

    def _record(self, step: int, consumed: int, loss: float, r: dict[str, Any], dt: float) -> dict[str, Any]:
        gn = r["grad_norm"]
        rec = {
            "step": step,
            "loss": loss,
            "lr": r["lr"],
            "grad_norm": float(gn) if gn is not None else None,
            "step_time_s": dt,
            "consumed_samples": consumed,
        }
        rec.update(self.throughput.figures(dt))
        rec["peak_mem_bytes"] = peak_memory_bytes()
        rec["train_iters"] = self.cfg.trainer.train_iters
        rec["mfu_peak"] = self.throughput.peak_name
        return rec
