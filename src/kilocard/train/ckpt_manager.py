"""One rank's checkpoint manager: save, commit, background finalisation, resume (cf. torchtitan's
``CheckpointManager``). The trainer calls ``save``, ``finalize`` and ``load`` and nothing else.

``save(step, consumed)`` writes the step on every rank with ``megatron.core.dist_checkpointing``
(torch_dist; in the background on GPUs with ``checkpoint.async_save``) plus this rank's RNG file and,
on rank 0, the trainer state; once every rank has written, rank 0 commits it between two barriers
(``checkpoint.commit_step``: manifest, tracker, prune). A save that fails for want of space becomes
``DiskFull``. ``load()`` lets rank 0 choose the step (own save directory first, then
``checkpoint.load``; verified against its manifest, with ``checkpoint.fallback_to_previous``), refuses
a model of another shape, and restores model, optimizer, scheduler and RNG on every rank.

With ``peft=lora`` a step holds the adapters, their optimizer state and the trainer state only; its
``extra`` names the base step and its content digest (``names.PEFT``; a base replaced at that path is
refused, ``ck.lora_base``). The first start reads the base weights from
``checkpoint.load`` (an import, or any step's weights) and starts the adapters at step 0; a resume reads
the base from that recorded step (verified again), then the adapters and optimizer from its own step.

With ``checkpoint.non_persistent_save_interval``, ``save_local(step, consumed)`` also writes every rank's
own copy to node-local storage (``kilocard.train.local_ckpt``), and ``load()`` first asks every rank for
the newest local step they all hold intact: it is restored when it is newer than the newest committed
persistent step, otherwise (or when a rank's copy is missing or fails its sha256) the persistent one is,
and why is logged. ``drop_local()`` removes the local copies once the run ends committed.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kilocard.base.safe_read import open_regular
from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.perf.params import padded_vocab_size
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import events
from kilocard.rundir.names import MODEL_ONLY, PEFT, STATE
from kilocard.train import ckpt_state as cs
from kilocard.train import local_ckpt as lc
from kilocard.train import lora
from kilocard.train.signals import Watchdog

NEARLY_FULL_BYTES = 1 << 20
"""A save that fails with less than this free under the checkpoint directory failed for want of space."""


def _is_disk_full(e: BaseException | None) -> bool:
    """Whether ``e`` or anything it wraps is ENOSPC (the torch_dist writer re-raises it wrapped)."""
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left on device" in str(e):
            return True
        e, seen = (e.__cause__ or e.__context__), seen + 1
    return False


class CheckpointManager:
    """Saves, commits and loads the checkpoints of one rank's run (collective: every rank calls the same)."""

    def __init__(
        self,
        run_cfg: RunConfig,
        layout: Layout,
        run_dir: Path,
        config_sha256: str,
        built: Any,
        use_cuda: bool,
        watchdog: Watchdog,
        log: Callable[[str], None],
    ) -> None:
        from megatron.core import parallel_state as ps

        c = run_cfg.checkpoint
        self.cfg, self.layout, self.sha, self.built, self.run_dir = run_cfg, layout, config_sha256, built, run_dir
        self.save_root = ck.checkpoint_root(run_dir, run_cfg)
        """Where this run's steps are committed."""
        self.owner = ck.run_id(run_dir)
        """This run as the owner of ``save_root`` (recorded in its owner file and every manifest)."""
        self.load_root = Path(c.load) if c.load else None
        """``checkpoint.load``: where a run without committed steps of its own starts from."""
        self.use_async = c.async_save and use_cuda
        self.last_saved: int | None = None
        """The newest step saved (or loaded): saving it again is a no-op."""
        self.rank = dist.get_rank()
        self._ps, self._watchdog, self._log = ps, watchdog, log
        self._async_queue: Any = None
        self.local = self._local_tier(run_dir)
        """The node-local tier (``None`` when ``checkpoint.non_persistent_save_interval`` is null)."""
        self.resumed_tier: str | None = None
        """Tier of the step ``load`` restored (``events.LOCAL`` / ``events.PERSISTENT``; ``None``: fresh start)."""
        self.lora = run_cfg.peft.type == "lora"
        """``peft=lora``: steps hold the adapters only, on the frozen base of ``self.base``."""
        self.base: Path | None = None
        """The step directory the frozen base weights were read from (``peft=lora``)."""
        self.base_digest: str | None = None
        """Its ``ck.content_digest``, recorded in every LoRA step: a base replaced at the same path is refused."""

    def _local_tier(self, run_dir: Path) -> lc.LocalTier | None:
        c = self.cfg.checkpoint
        if c.non_persistent_save_interval is None:
            return None
        root = Path(c.non_persistent_local_ckpt_dir) if c.non_persistent_local_ckpt_dir else lc.default_root(os.environ)
        return lc.LocalTier(root, run_dir)

    # --- resume --------------------------------------------------------------------------------

    def load(self) -> ck.TrainerState | None:
        """Restore the newest committed step (own save dir first, then checkpoint.load); ``None`` on a fresh start.

        Raises ``ck.CheckpointError`` (on every rank) when no usable step passes its integrity check and
        ``ck.ModelMismatch`` when the step holds another model shape.
        """
        self._watchdog.beat("finding the checkpoint to resume from")
        self._own_save_root()
        local = self._newest_local()
        if local is not None:
            self.resumed_tier = events.LOCAL
            return self._restore_local(local)
        sdir = self._choose()
        if sdir is None and self.lora:
            raise ck.CheckpointError(
                "peft=lora trains adapters on frozen base weights, and there are none: set checkpoint.load to the "
                "base checkpoint (kilocard convert hf-to-mcore writes one)"
            )
        state = None if sdir is None else self._restore(sdir)
        if self.local is not None:
            self.local.discard_after(state.step if state is not None else 0)
        self.resumed_tier = None if state is None else events.PERSISTENT
        return state

    def _own_save_root(self) -> None:
        """Rank 0 claims ``save_root`` for this run and recovers a lost tracker (``ck.claim_owner``,
        ``ck.recover_tracker``); every rank raises the same error when it cannot (collective)."""
        verdict: list[Any] = [None, None]
        if self.rank == 0:
            try:
                inside = not ck.outside(self.save_root, self.run_dir)
                ck.claim_owner(self.save_root, self.owner, inside)
                note = ck.recover_tracker(self.save_root)
                if note:
                    self._log(f"warning: {note}")
            except ck.ForeignCheckpoint as e:
                verdict = ["foreign", str(e)]
            except ck.CheckpointError as e:
                verdict = ["damaged", str(e)]
        dist.broadcast_object_list(verdict, src=0)
        kind, message = verdict
        if kind == "foreign":
            raise ck.ForeignCheckpoint(message)
        if kind == "damaged":
            raise ck.CheckpointError(message)

    def _newest_persistent(self) -> int:
        """The newest committed persistent step (unverified; 0 when none), read on rank 0 and broadcast."""
        c, found = self.cfg.checkpoint, [0]
        if self.rank == 0:
            found = [ck.newest_committed(self.save_root, self.load_root, c.ckpt_step, self.lora)]
        dist.broadcast_object_list(found, src=0)
        return int(found[0])

    def _newest_local(self) -> int | None:
        """The local step to resume from: the newest every rank holds intact, when newer than the persistent one
        (collective); logs why a newer local step is not used."""
        if self.local is None:
            return None
        step, notes = self.local.newest()
        persistent = self._newest_persistent()
        if step is not None and step > persistent:
            return step
        if notes:
            self._log(
                f"local tier not used ({'; '.join(notes)}); resuming from the persistent tier (step {persistent})"
            )
        return None

    def _choose(self) -> Path | None:
        """The step directory to resume from, decided (and verified) on rank 0 and broadcast."""
        decision: list[Any] = [None, None, None]
        if self.rank == 0:
            c = self.cfg.checkpoint
            try:
                root, step = ck.load_root_and_step(
                    self.save_root, self.load_root, c.fallback_to_previous, c.ckpt_step, say=self._log
                )
                decision = [str(root) if root else None, step, None]
            except ck.CheckpointError as e:
                decision = [None, None, str(e)]
        dist.broadcast_object_list(decision, src=0)
        root, step, err = decision
        if err:
            raise ck.CheckpointError(err)
        return None if step is None else ck.step_dir(Path(root), step)

    def _restore(self, sdir: Path) -> ck.TrainerState:
        from megatron.core import dist_checkpointing

        self._watchdog.beat(f"loading {sdir}")
        state = ck.read_state(sdir)
        self._check_model(sdir, state)
        part = self._peft_base(sdir, state)
        if state.extra.get(MODEL_ONLY) or (self.lora and part is None):
            return self._restore_model_only(sdir, state)
        if self.cfg.trainer.skip_train:
            return self._restore_for_eval(sdir, state, part)
        b = self.built
        cs.init_optimizer_states(b.optimizer)
        sd = cs.unsaved_moments_dropped(cs.sharded_state_dict(b.model, b.optimizer, is_loading=True, part=part), sdir)
        loaded = dist_checkpointing.load(sd, str(sdir))
        self._apply(loaded, state, part)
        self.last_saved = state.step
        saved = Layout.from_json(state.layout)
        if saved.same_ranks(self.layout) and cs.rng_file(sdir, self.rank).is_file():
            with open_regular(cs.rng_file(sdir, self.rank), limit=None) as f:  # the manifest verified it
                cs.set_rng_state(torch.load(f, weights_only=False))
            rng = "restored"
        else:
            rng = "re-seeded (layout changed)"
        self._log(f"resumed from {sdir} (step {state.step}, {state.consumed_samples} samples; RNG {rng})")
        return state

    def _peft_base(self, sdir: Path, state: ck.TrainerState) -> cs.Part | None:
        """For a LoRA step (``names.PEFT`` in its extra): check its adapters fit the config, load the base weights
        it names into every chunk, and return the part of the state dict the step holds (the adapters).
        ``None`` for any other step; refuses a LoRA step without ``peft=lora``."""
        saved = state.extra.get(PEFT)
        if saved is None:
            return None
        diffs = ck.peft_differences(state, self.cfg.peft)
        if diffs == [ck.LORA_ONLY]:
            raise ck.ModelMismatch(
                f"checkpoint {sdir} {ck.LORA_ONLY}; continue it with peft=lora, or export it merged into the base "
                f"with kilocard convert mcore-to-hf"
            )
        if diffs:
            raise ck.ModelMismatch(f"checkpoint {sdir} holds adapters of another shape or scale: {'; '.join(diffs)}")
        base = Path(saved["base"])
        self._verify_base(sdir, state)
        self._load_base(base)
        return lora.adapter_part

    def _verify_base(self, sdir: Path, state: ck.TrainerState) -> None:
        """Rank 0 verifies the base step the LoRA step ``sdir`` names (``ck.lora_base``: its manifest, and that it
        is still the base the adapters were trained on); every rank raises the same error."""
        err: list[Any] = [None]
        if self.rank == 0:
            try:
                ck.lora_base(state, sdir)
            except ck.CheckpointError as e:
                err = [f"the base weights of this LoRA run: {e}"]
        dist.broadcast_object_list(err, src=0)
        if err[0]:
            raise ck.CheckpointError(err[0])

    def _load_base(self, base: Path) -> None:
        """The frozen base weights of every chunk from step directory ``base`` (the adapters left as they are)."""
        from megatron.core import dist_checkpointing

        self._watchdog.beat(f"loading the base weights of {base}")
        loaded = dist_checkpointing.load(cs.model_sharded_state_dict(self.built.model, lora.base_part), str(base))
        self._load_model_chunks(loaded, lora.base_part)
        self.base = base.resolve()
        self.base_digest = ck.content_digest(base)

    def _apply(self, loaded: dict[str, Any], state: ck.TrainerState, part: cs.Part | None = None) -> None:
        """Model chunks (``part`` of them) and optimizer from ``loaded``, the LR scheduler from ``state``."""
        b = self.built
        self._load_model_chunks(loaded, part)
        with torch.no_grad():
            b.optimizer.load_state_dict(loaded["optimizer"])
        b.scheduler.load_state_dict(state.scheduler)

    def _restore_local(self, step: int) -> ck.TrainerState:
        """Restore local ``step`` on every rank: model, optimizer, scheduler, this rank's RNG."""
        assert self.local is not None
        self._watchdog.beat(f"loading local step {step}")
        loaded, rank_state = self.local.load(self.built.model, self.built.optimizer)
        state = ck.TrainerState(**rank_state["trainer_state"])
        self._check_model(self.local.directory, state)
        if self.lora and PEFT in state.extra:  # the local tier holds the whole model: the base is recorded only
            self.base = Path(state.extra[PEFT]["base"])
            self.base_digest = state.extra[PEFT].get(ck.BASE_DIGEST)
        self._apply(loaded, state)
        cs.set_rng_state(rank_state["rng"])
        self.local.discard_after(step)
        self._log(
            f"resumed from local step {state.step} ({self.local.directory.parent}, "
            f"{state.consumed_samples} samples; RNG restored)"
        )
        return state

    def _load_model_chunks(self, loaded: dict[str, Any], part: cs.Part | None = None) -> None:
        """Load every model chunk (``model`` or ``model0``, ``model1``..) strictly from ``loaded``: every tensor
        of the chunk, or with ``part`` exactly those of that part."""
        model = self.built.model
        keys = ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]
        for m, k in zip(model, keys, strict=True):
            if part is None:
                m.module.load_state_dict(loaded[k], strict=True)
                continue
            wanted = set(part(m.module.state_dict()))
            result = m.module.load_state_dict(loaded[k], strict=False)
            missing = wanted & set(result.missing_keys)
            if missing or result.unexpected_keys:
                raise ck.CheckpointError(
                    f"checkpoint tensors do not match the model: missing {sorted(missing)[:5]}, "
                    f"unexpected {sorted(result.unexpected_keys)[:5]}"
                )

    def _restore_model_only(self, sdir: Path, state: ck.TrainerState) -> ck.TrainerState:
        """Start at step 0 from a model-only step (an import): weights only; fresh optimizer, schedule, RNG."""
        from megatron.core import dist_checkpointing

        if self.lora:
            self._load_base(sdir)
            note = f"started LoRA adapters on the frozen base weights of {sdir} (fresh adapters, optimizer and LR"
        else:
            loaded = dist_checkpointing.load(cs.model_sharded_state_dict(self.built.model), str(sdir))
            self._load_model_chunks(loaded)
            note = f"started from the model weights of {sdir} (model-only: fresh optimizer and LR"
        self.built.optimizer.reload_model_params()  # fp32 main copies (bf16/fp16, distributed optimizer) follow
        self._log(f"{note} schedule, step 0)")
        return dataclasses.replace(state, step=0, consumed_samples=0)

    def _restore_for_eval(self, sdir: Path, state: ck.TrainerState, part: cs.Part | None = None) -> ck.TrainerState:
        """``trainer.skip_train``: the step's model weights (``part`` of them) only, in any layout (an evaluation
        needs no optimizer state, whose sharding may differ between layouts); the step and position stay."""
        from megatron.core import dist_checkpointing

        loaded = dist_checkpointing.load(cs.model_sharded_state_dict(self.built.model, part), str(sdir))
        self._load_model_chunks(loaded, part)
        self._log(f"loaded the model weights of {sdir} (step {state.step}) to evaluate (trainer.skip_train)")
        return state

    def _check_model(self, sdir: Path, state: ck.TrainerState) -> None:
        """Raise ``ck.ModelMismatch`` naming every shape field the step's model differs in."""
        diffs = ck.state_differences(state, self.cfg.model, self.layout.tp)
        if diffs:
            raise ck.ModelMismatch(
                f"checkpoint {sdir} holds another model shape; differing fields: "
                + "; ".join(diffs)
                + ". Resume with the saved model config or start a new run"
            )

    # --- save ----------------------------------------------------------------------------------

    def save(self, step: int, consumed: int) -> None:
        """Save and commit ``step`` (``consumed`` samples); a full disk becomes ``ck.DiskFull`` naming the
        step, the free bytes and the committed step that is still intact."""
        from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

        try:
            self._save(step, consumed)
        except (Exception, CheckpointException) as e:
            full = self._disk_full(e, step)
            if full is None:
                raise
            raise full from None

    def _disk_full(self, e: BaseException, step: int) -> ck.DiskFull | None:
        """``e`` as ``DiskFull`` when the save failed for want of space, else ``None``."""
        try:
            free = shutil.disk_usage(self.save_root).free
        except OSError:
            return None
        # torch.save's C++ stream reports ENOSPC only as "basic_ios::clear: iostream error"
        if not (_is_disk_full(e) or free < NEARLY_FULL_BYTES):
            return None
        last = ck.latest_committed(self.save_root)
        kept = f"the last committed step {last} is intact" if last is not None else "no step was committed yet"
        return ck.DiskFull(
            f"saving step {step} under {self.save_root} failed: the disk is full ({free} bytes free); {kept}"
        )

    def _save(self, step: int, consumed: int) -> None:
        """Write ``step`` on every rank, then commit it (at once, or when the background save finalises)."""
        from megatron.core import dist_checkpointing

        if self.last_saved == step:
            return
        self.finalize(blocking=True)  # at most one save in flight
        self._watchdog.beat(f"saving step {step}")
        t0, sdir = time.monotonic(), ck.step_dir(self.save_root, step)
        if self.rank == 0:
            if sdir.exists():  # an uncommitted leftover of an interrupted save of this step
                shutil.rmtree(sdir)
            sdir.mkdir(parents=True)
        dist.barrier()
        b = self.built
        part = lora.adapter_part if self.lora else None  # LoRA: the adapters; the base stays in checkpoint.load
        sd = cs.sharded_state_dict(b.model, b.optimizer, is_loading=False, part=part)
        request = dist_checkpointing.save(
            sd, str(sdir), sharded_strategy=self._save_strategy(), async_sharded_save=self.use_async
        )
        self._write_rank_state(sdir, step, consumed)
        self.last_saved = step
        if not self.use_async:
            self._commit(sdir, step, t0)
            return
        from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

        request.add_finalize_fn(lambda: self._commit(sdir, step, t0))
        if self._async_queue is None:
            self._async_queue = AsyncCallsQueue()
        self._async_queue.schedule_async_request(request)

    def finalize(self, blocking: bool) -> None:
        """Commit background saves whose writes every rank has finished (collective; no-op when sync)."""
        if self._async_queue is not None:
            self._async_queue.maybe_finalize_async_calls(blocking=blocking)

    def _write_rank_state(self, sdir: Path, step: int, consumed: int) -> None:
        """This rank's RNG file, and on rank 0 the trainer state (data position, scheduler, model config)."""
        cs.rng_file(sdir, self.rank).parent.mkdir(exist_ok=True)
        torch.save(cs.rng_state(), cs.rng_file(sdir, self.rank))
        if self.rank == 0:
            (sdir / STATE).write_text(json.dumps(vars(self._trainer_state(step, consumed)), indent=1) + "\n")

    def _trainer_state(self, step: int, consumed: int) -> ck.TrainerState:
        """The non-tensor state of ``step``: data position, LR scheduler, model config, layout."""
        return ck.TrainerState(
            step=step,
            consumed_samples=consumed,
            scheduler=self.built.scheduler.state_dict(),
            model=asdict(self.cfg.model),
            layout=self.layout.to_json(),
            padded_vocab_size=padded_vocab_size(self.cfg.model, self.layout.tp),
            config_sha256=self.sha,
            extra={PEFT: {**asdict(self.cfg.peft), "base": str(self.base), ck.BASE_DIGEST: self.base_digest}}
            if self.lora
            else {},
        )

    def save_local(self, step: int, consumed: int) -> None:
        """Save ``step`` to the local tier on every rank and record its duration (``commit``, tier ``local``)."""
        if self.local is None:
            return
        self._watchdog.beat(f"saving local step {step}")
        t0 = time.monotonic()
        rank_state = {"trainer_state": vars(self._trainer_state(step, consumed)), "rng": cs.rng_state()}
        self.local.save(step, self.built.model, self.built.optimizer, rank_state)
        seconds = time.monotonic() - t0
        if self.rank == 0:
            events.append(self.run_dir, "commit", step=step, seconds=seconds, tier=events.LOCAL)
        self._log(f"saved local step {step} in {seconds * 1000:.0f} ms ({self.local.directory.parent})")

    def drop_local(self) -> None:
        """Remove this rank's local copies: the run ended with its last step committed persistently."""
        if self.local is not None:
            dist.barrier()  # every rank is past its last local load or save
            self.local.remove()

    def _commit(self, sdir: Path, step: int, t0: float) -> None:
        """After every rank has written: ``ck.commit_step`` on rank 0, between barriers (collective)."""
        dist.barrier()
        if self.rank == 0:
            ck.commit_step(self.save_root, step, self.cfg.checkpoint.keep_last, owner=self.owner)
        dist.barrier()
        seconds = time.monotonic() - t0
        if self.rank == 0:
            events.append(self.run_dir, "commit", step=step, seconds=seconds, tier=events.PERSISTENT)
        self._log(f"committed step {step} in {seconds:.1f}s ({sdir})")

    def _save_strategy(self) -> Any:
        if not self.cfg.checkpoint.fully_parallel_save or self._ps.get_data_parallel_world_size() == 1:
            return None
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

        return FullyParallelSaveStrategyWrapper(
            get_default_save_sharded_strategy(), self._ps.get_data_parallel_group(with_context_parallel=True)
        )
