"""The step loop: forward/backward through Megatron-Core's schedule, optimizer and LR step, metrics,
the stop decision at every step boundary, evaluation on the validation and test splits (the same
schedule, forward only; ``trainer.eval_interval``), and the calls to the checkpoint manager (save, load).
"""

from __future__ import annotations

import enum
import functools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kilocard.backends import Backend
from kilocard.base.say import say
from kilocard.config.schema import RunConfig
from kilocard.data.split import SPLITS, TEST, VALID
from kilocard.layout import Layout
from kilocard.rundir.metrics import MetricsWriter, Throughput, peak_memory_bytes
from kilocard.rundir.progress import eval_line, log_due, progress_line
from kilocard.train import megatron_adapter as ma
from kilocard.train.ckpt_manager import CheckpointManager
from kilocard.train.dist_env import step_delay
from kilocard.train.profiling import StepProfiler
from kilocard.train.signals import StopFlag, Watchdog
from kilocard.train.straggler import StragglerWatch, spread

_T0 = time.monotonic()


class NonFiniteLoss(Exception):
    """The loss became NaN or infinite (exit CRASH)."""


class Outcome(enum.Enum):
    """How ``Trainer.run`` ended."""

    DONE = "done"
    """Trained to trainer.train_iters (or found the run already there); the last step is committed."""
    STOPPED = "stopped"
    """A stop was requested; every rank saved and committed the same step."""


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
    started_wall: float
    """``time.time()`` when the step began (the record's ``time`` is this plus the step time)."""


def lora_count_line(run_cfg: RunConfig) -> str:
    """``peft=lora``: how many parameters train, of how many (the whole model's, adapters included; counted
    like the memory model, ``kilocard.perf``)."""
    from kilocard.perf.memory import lora_params
    from kilocard.perf.params import count_parameters

    trainable = int(lora_params(run_cfg))
    total = count_parameters(run_cfg.model).total + trainable
    p = run_cfg.peft
    return (
        f"peft=lora: {trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.2f}%; "
        f"adapters of dim {p.dim} on {', '.join(p.target_modules)})"
    )


class Trainer:
    """One rank's training run over a built Megatron-Core model."""

    def __init__(
        self,
        run_cfg: RunConfig,
        layout: Layout,
        run_dir: Path,
        config_sha256: str,
        backend: Backend,
        stop: StopFlag,
        watchdog: Watchdog,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.cfg, self.layout, self.run_dir, self.backend = run_cfg, layout, run_dir, backend
        self.stop, self.watchdog = stop, watchdog
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.ps = ps
        watchdog.beat("building the model")
        self.built = ma.build(run_cfg, backend)
        self._forward_step = functools.partial(ma.forward_step, thd=ma.packed_thd(run_cfg, backend))
        """Megatron-Core's forward step for this run (THD packing on Transformer Engine: ``ma.packed_thd``)."""
        self._attention_mask = ma.dataset_attention_mask(run_cfg, backend)
        """Whether the dataset builds the attention mask (block-diagonal packing on local attention)."""
        self.ckpt = CheckpointManager(
            run_cfg, layout, run_dir, config_sha256, self.built, backend.is_cuda, watchdog, self.log
        )
        """Saves, commits and loads this run's checkpoints."""
        self.step, self.consumed = 0, 0
        assert layout.dp is not None and layout.num_microbatches is not None, "build_trainer refuses others"
        self.dp: int = layout.dp
        self.num_micro: int = layout.num_microbatches
        self._last_stage = ps.is_pipeline_last_stage(ignore_virtual=True)
        self._loss_ranks = self.world // ps.get_pipeline_model_parallel_world_size()
        self._device = torch.device("cuda") if backend.is_cuda else torch.device("cpu")
        self.throughput = Throughput.for_run(run_cfg, self.world)
        self._ready_at: float | None = None
        """``time.perf_counter()`` when this rank last became ready to reduce its gradients."""
        self._own_s = 0.0
        """This rank's own step time (start to gradient reduction) summed since the last gather."""
        self._own_n = 0
        """Steps summed in ``_own_s``."""
        self._stragglers = StragglerWatch()
        self._eval_data: dict[int, Any] = {}
        """Validation and test splits by ``kilocard.data.split`` index (``None``: a test split without documents)."""
        self.profiler = StepProfiler(
            run_dir, list(run_cfg.trainer.profile_steps), self.rank, backend.is_cuda, log=self.log
        )
        """Traces ``trainer.profile_steps``."""
        self._time_grad_reduction()
        self.log(f"built model ({self.num_micro} micro-batches per step, world {self.world}, backend {backend.name})")
        if run_cfg.peft.type == "lora":
            self.log(lora_count_line(run_cfg))

    def _time_grad_reduction(self) -> None:
        """Stamp the moment this rank is ready to reduce gradients (``finalize_model_grads``, called by the
        schedule; see ``kilocard.train.straggler``)."""
        from megatron.core.utils import get_model_config

        config = get_model_config(self.built.model[0])
        inner = config.finalize_model_grads_func

        def timed(*args: Any, **kwargs: Any) -> Any:
            self._ready_at = time.perf_counter()
            return inner(*args, **kwargs)

        config.finalize_model_grads_func = timed

    def _rank_times(self, t0: float) -> dict[str, float | int]:
        """Add this step's own time; every ``trainer.rank_time_interval`` steps all-gather the per-rank means
        (one collective) and return the spread's record fields, warning about a persistent straggler."""
        n = self.cfg.trainer.rank_time_interval
        if not n:
            return {}
        self._own_s += (self._ready_at if self._ready_at is not None else time.perf_counter()) - t0
        self._own_n += 1
        self._ready_at = None
        if self.step % n:
            return {}
        mine = torch.tensor([self._own_s / self._own_n], dtype=torch.float64, device=self._device)
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        self._own_s, self._own_n = 0.0, 0
        s = spread([float(g.item()) for g in gathered])
        warning = self._stragglers.observe(s, self.step)
        if warning:
            self.log(warning)
        return s.record()

    def log(self, msg: str) -> None:
        """A rank-0 line in the training log, stamped with seconds since the process started."""
        if self.rank == 0:
            say(f"[{time.monotonic() - _T0:7.1f}s] kilocard.train: {msg}")

    def resume(self) -> None:
        """Continue from the newest committed step, if any (``CheckpointManager.load``)."""
        state = self.ckpt.load()
        if state is not None:
            self.step, self.consumed = state.step, state.consumed_samples

    # --- steps ---------------------------------------------------------------------------------

    def _iterators(self) -> list[Any]:
        from kilocard.data.iterator import build_train_iterator

        self.watchdog.beat("building the data iterator")
        dp_rank = self.ps.get_data_parallel_rank()
        return [
            build_train_iterator(
                self.cfg,
                dp_rank=dp_rank,
                dp_size=self.dp,
                consumed_samples=self.consumed,
                cache_dir=str(self.run_dir / "data_cache"),
                create_attention_mask=self._attention_mask,
            )  # causal attention without packing: Megatron builds the mask
            for _ in self.built.model
        ]

    def train_step(self, iterators: list[Any]) -> dict[str, Any]:
        """One optimizer step; returns the loss (averaged over data-parallel ranks) and optimizer figures."""
        b, t = self.built, self.cfg.trainer
        for m in b.model:
            m.zero_grad_buffer()
        b.optimizer.zero_grad()
        out = b.forward_backward(
            forward_step_func=self._forward_step,
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
            started_wall=time.time() - (time.perf_counter() - t0),
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
            record = self._record(f.step, f.consumed, loss, f.result, dt, f.started_wall + dt)
            writer.write(record)
            if log_due(f.step, self.cfg.trainer.train_iters, self.cfg.trainer.log_interval):
                say(progress_line(record))
        return stops > 0

    def run(self, writer: MetricsWriter | None) -> Outcome:
        """Train until train_iters or a stop request, saving every ``checkpoint.save_interval`` steps and at the end
        (and every ``checkpoint.non_persistent_save_interval`` steps to the local tier, removed once the run ends
        committed); a profiler window cut short by a stop or an error is written as far as it got."""
        try:
            outcome = self._loop(writer)
        finally:
            self.profiler.finish()
        self.ckpt.drop_local()
        return outcome

    def _loop(self, writer: MetricsWriter | None) -> Outcome:
        """The step loop of ``run``."""
        t = self.cfg.trainer
        if t.skip_train:
            self._build_eval_data()
            self.log(f"trainer.skip_train: evaluating step {self.step} without training")
            self._evaluate_at_end(writer)
            return Outcome.DONE
        if self.step >= t.train_iters:
            return Outcome.DONE
        iterators = self._iterators()
        self._build_eval_data()
        self.log(f"data ready; training steps {self.step + 1}..{t.train_iters}")
        interval, local = self.cfg.checkpoint.save_interval, self.cfg.checkpoint.non_persistent_save_interval
        pending: _InFlight | None = None  # the previous step, its all-reduce still in flight
        delay = step_delay(os.environ)
        while self.step < t.train_iters:
            self.watchdog.beat(f"step {self.step + 1}")
            if delay:
                time.sleep(delay)
            self.profiler.before_step(self.step + 1)
            t0 = time.perf_counter()
            r = self.train_step(iterators)
            self.step += 1
            self.profiler.after_step(self.step)
            r["rank_times"] = self._rank_times(t0)
            self.consumed += t.global_batch_size
            current = self._start_reduce(r, t0)
            stop = self._settle(pending, writer, next_start=t0) if pending is not None else False
            pending = current
            last = self.step >= t.train_iters
            persist = stop or last or bool(interval and self.step % interval == 0)
            evaluate = self._eval_due(self.step)
            if persist or evaluate or (local and self.step % local == 0):
                # a step is checked (finite loss) and recorded before it is evaluated or saved
                stop = self._settle(pending, writer, next_start=None) or stop
                pending = None
                # like Megatron-LM: evaluate, then save the step; a stop waits for the step's evaluations (its
                # resume starts after this step and never evaluates it again; the last step's are the run's last)
                if evaluate:
                    self._evaluate(VALID, writer)
                if last:
                    self._evaluate_at_end(writer, valid_done=evaluate)
                if persist or stop:
                    self.ckpt.save(self.step, self.consumed)
                elif local and self.step % local == 0:
                    self.ckpt.save_local(self.step, self.consumed)
                if stop:
                    self.ckpt.finalize(blocking=True)
                    return Outcome.STOPPED
            self.ckpt.finalize(blocking=False)
        self.ckpt.finalize(blocking=True)
        return Outcome.DONE

    # --- evaluation ----------------------------------------------------------------------------

    def _eval_due(self, step: int) -> bool:
        """Whether step ``step`` ends with a validation evaluation (every ``trainer.eval_interval`` steps)."""
        n = self.cfg.trainer.eval_interval
        return bool(n and step % n == 0)

    def _build_eval_data(self) -> None:
        """The validation and test splits (``None`` for a test split with no document), built once on every
        rank (collective) when ``trainer.eval_interval`` is set."""
        from kilocard.data.iterator import build_eval_dataset

        if not self.cfg.trainer.eval_interval:
            return
        self.watchdog.beat("building the validation and test splits")
        cache = str(self.run_dir / "data_cache")
        for split in (VALID, TEST):
            self._eval_data[split] = build_eval_dataset(
                self.cfg, split, dp_size=self.dp, cache_dir=cache, create_attention_mask=self._attention_mask
            )
        if self._eval_data[TEST] is None:
            self.log(f"data.split {self.cfg.data.split!r} leaves the test split empty: no test evaluation")

    def _evaluate_at_end(self, writer: MetricsWriter | None, valid_done: bool = False) -> None:
        """The end-of-training evaluations: validation (unless step ``self.step`` just had one), then test."""
        if not self.cfg.trainer.eval_interval:
            return
        if not valid_done:
            self._evaluate(VALID, writer)
        if self._eval_data.get(TEST) is not None:
            self._evaluate(TEST, writer)

    def evaluate(self, split: int) -> tuple[float, float]:
        """(loss, seconds) of the model on ``trainer.eval_iters`` global batches of ``split``: forward only,
        no gradients, dropout off, through the same pipeline schedule as training (Megatron-LM's
        ``evaluate``); the loss is the mean over micro-batches and data-parallel ranks, like the train loss."""
        from kilocard.data.iterator import eval_batches
        from kilocard.data.split import valid_start

        t0 = time.perf_counter()
        b, t = self.built, self.cfg.trainer
        interval = t.eval_interval or max(self.step, 1)  # no interval: the one evaluation reads from the start
        start = 0 if split == TEST else valid_start(self.step, interval, t.eval_iters, t.global_batch_size)
        dp_rank = self.ps.get_data_parallel_rank()
        data = self._eval_data[split]
        iterators = [
            eval_batches(data, self.cfg, start=start, rounds=t.eval_iters, dp_rank=dp_rank, dp_size=self.dp)
            for _ in b.model
        ]
        gathers = [m for m in b.model if m.ddp_config.overlap_param_gather]
        for m in gathers:  # Megatron-LM: no param all-gather hook while evaluating
            m.disable_forward_pre_hook()
        for m in b.model:
            m.eval()
        total = torch.zeros(1, dtype=torch.float64, device=self._device)
        try:
            with torch.no_grad():
                for k in range(t.eval_iters):
                    self.watchdog.beat(f"evaluating {SPLITS[split]} round {k + 1} at step {self.step}")
                    out = b.forward_backward(
                        forward_step_func=self._forward_step,
                        data_iterator=iterators if len(iterators) > 1 else iterators[0],
                        model=b.model,
                        num_microbatches=self.num_micro,
                        seq_length=self.cfg.model.seq_length,
                        micro_batch_size=t.micro_batch_size,
                        forward_only=True,
                    )
                    if self._last_stage and out:
                        total += torch.stack([o["lm loss"].double() for o in out]).mean().to(self._device)
        finally:
            for m in b.model:
                m.train()
            for m in gathers:
                m.enable_forward_pre_hook()
        dist.all_reduce(total)
        return total.item() / (self._loss_ranks * t.eval_iters), time.perf_counter() - t0

    def _evaluate(self, split: int, writer: MetricsWriter | None) -> None:
        """Evaluate ``split`` at this step; log it and write its record (``{"step", "split", "loss", ...}``)."""
        loss, seconds = self.evaluate(split)
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"step {self.step}: {SPLITS[split]} loss is {loss}; lower optim.lr or check the data")
        if writer is not None:
            record = {
                "step": self.step,
                "split": SPLITS[split],
                "loss": loss,
                "time": time.time(),
                "eval_time_s": seconds,
                "eval_iters": self.cfg.trainer.eval_iters,
            }
            writer.write(record)
            say(eval_line(record))

    def _record(
        self, step: int, consumed: int, loss: float, r: dict[str, Any], dt: float, ended: float
    ) -> dict[str, Any]:
        """Step ``step``'s metrics line; ``time`` is ``ended``, the unix time at the end of its period."""
        gn = r["grad_norm"]
        rec = {
            "step": step,
            "time": ended,
            "loss": loss,
            "lr": r["lr"],
            "grad_norm": float(gn) if gn is not None else None,
            "step_time_s": dt,
            "consumed_samples": consumed,
            "consumed_tokens": consumed * self.cfg.model.seq_length,
        }
        rec.update(self.throughput.figures(dt))
        rec.update(r.get("rank_times", {}))
        rec["peak_mem_bytes"] = peak_memory_bytes()
        rec["train_iters"] = self.cfg.trainer.train_iters
        rec["mfu_peak"] = self.throughput.peak_name
        return rec
