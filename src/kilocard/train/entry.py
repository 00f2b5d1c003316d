"""``python -m kilocard.train <run_dir>``: what every rank runs (torchrun locally, srun on Slurm).

Loads the frozen config after checking its sha256, starts torch.distributed and Megatron-Core's
parallel state, resumes from the newest committed step when there is one, trains, and exits with
the code of ``kilocard.exitcodes`` that tells the batch script what to do next.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kilocard import exitcodes
from kilocard.base.say import say
from kilocard.rundir import events
from kilocard.rundir.freeze import FrozenConfigError, load_verified
from kilocard.train.signals import StopFlag, Watchdog, die_with_parent_in_forks, record_exit

if TYPE_CHECKING:  # torch-importing modules: imported where a rank needs them
    from kilocard.backends import Backend
    from kilocard.config.schema import RunConfig
    from kilocard.train.dist_env import RankEnv
    from kilocard.train.trainer import Trainer

PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "DistNetworkError")
"""Text of a collective that failed because another rank's process went away (gloo/NCCL/TCPStore)."""


def peer_lost(e: BaseException) -> bool:
    """Whether ``e`` is a collective failing because another rank died (exit FAULT, not CRASH)."""
    text = f"{type(e).__name__}: {e}"
    return any(marker in text for marker in PEER_LOST)


def _say(rank: int, msg: str) -> None:
    say(f"[rank {rank}] kilocard.train: {msg}", sys.stderr)


def _deterministic(on: bool) -> None:
    import torch

    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def train(run_dir: Path, stop: StopFlag, started: float | None = None) -> int:
    """Train the run in ``run_dir`` on this rank (``stop`` installed; the process began at unix time
    ``started``, default now); return an exit code of ``kilocard.exitcodes``."""
    from kilocard.train.dist_env import resolve

    started = time.time() if started is None else started
    env = resolve(os.environ)
    try:
        run_cfg, sha = load_verified(run_dir)
    except FrozenConfigError as e:
        _say(env.rank, f"error: {e}")
        return exitcodes.BAD_CONFIG
    attempt: dict[str, bool] = {"recorded": False}
    code = _train_verified(run_dir, run_cfg, sha, env, stop, started, attempt)
    if attempt["recorded"]:
        events.append(run_dir, "exit", code=code)
    return code


def _record_start(run_dir: Path, env: RankEnv, started: float, attempt: dict[str, bool]) -> None:
    """Rank 0 (holding the run directory) records this launch attempt in events.jsonl."""
    if env.rank == 0:
        events.append(run_dir, "start", when=started, world_size=env.world_size, **events.attempt_fields(os.environ))
        attempt["recorded"] = True


def _train_verified(
    run_dir: Path, run_cfg: RunConfig, sha: str, env: RankEnv, stop: StopFlag, started: float, attempt: dict[str, bool]
) -> int:
    from torch.distributed.checkpoint.api import CheckpointException

    from kilocard.backends import select
    from kilocard.rundir import checkpoint as ck
    from kilocard.rundir.lock import EARLIER_START_WAIT_S, RunDirBusy
    from kilocard.train import health, heartbeat
    from kilocard.train.claim import claim_run_dir
    from kilocard.train.dist_env import init_process_group
    from kilocard.train.megatron_adapter import UnsupportedConfig
    from kilocard.train.tracking import TrackingUnavailable, check_available
    from kilocard.train.trainer import NonFiniteLoss

    # the watchdog, and under ft_launcher the heartbeats to its rank monitor (kilocard.train.heartbeat)
    watchdog = heartbeat.start(run_cfg.trainer.hang_timeout_s, env.rank, run_dir, os.environ)
    try:
        check_available(run_cfg)  # every rank, before any collective: all stop alike
        backend = select(env.local_rank)
        _deterministic(run_cfg.trainer.deterministic)
        timeout = datetime.timedelta(seconds=max(run_cfg.trainer.hang_timeout_s, 1.0) + 60)
        init_process_group(backend.dist_backend, os.environ, timeout)  # per-attempt store under a restarting launcher
        node = health.node_name(os.environ)  # and the pid: what finds this rank's process for a stack dump
        _say(
            env.rank,
            f"rank {env.rank} of {env.world_size} up on {node} (local rank {env.local_rank}, pid {os.getpid()})",
        )
        # one writer per run directory; a lock taken here lasts until this rank exits
        save_root = ck.checkpoint_root(run_dir, run_cfg)
        outside = save_root if ck.outside(save_root, run_dir) else None  # locked like the run directory
        claim_run_dir(run_dir, wait_s=min(EARLIER_START_WAIT_S, timeout.total_seconds() - 30), save_root=outside)
        _record_start(run_dir, env, started, attempt)
        unhealthy = health.check(run_cfg, run_dir, os.environ, backend.is_cuda)  # every node, every attempt
        if unhealthy is not None:
            return unhealthy
        return _train_in_group(run_dir, run_cfg, sha, backend, stop, watchdog, timeout)
    except RunDirBusy as e:
        if env.rank == 0:
            _say(env.rank, f"error: {e}; exiting BUSY ({exitcodes.BUSY})")
        return exitcodes.BUSY
    except FrozenConfigError as e:
        _say(env.rank, f"error: {e}")
        return exitcodes.BAD_CONFIG
    except (ck.ModelMismatch, ck.ForeignCheckpoint, UnsupportedConfig, TrackingUnavailable) as e:
        _say(env.rank, f"error: {e}")
        return exitcodes.BAD_CONFIG
    except (ck.DiskFull, NonFiniteLoss) as e:  # a person must look, but the message says it all
        _say(env.rank, f"error: {e}")
        return exitcodes.CRASH
    except ck.CheckpointError as e:  # the message names the file, the intact step and how to resume from it
        _say(env.rank, f"error: {e}")
        return exitcodes.BAD_CKPT
    except (Exception, CheckpointException) as e:  # torch's CheckpointException is a BaseException
        if peer_lost(e):  # another rank died mid-collective: the committed steps are intact
            _say(
                env.rank,
                f"error: another rank died or lost its connection ({str(e).splitlines()[0][:160]}); "
                f"the last committed step is intact; exiting FAULT ({exitcodes.FAULT})",
            )
            return exitcodes.FAULT
        # a bug or a resource failure: a person must look
        traceback.print_exc()
        _say(env.rank, f"crashed: {type(e).__name__}: {e}")
        return exitcodes.CRASH
    finally:
        watchdog.stop()
        _shutdown()


def build_trainer(
    run_dir: Path,
    run_cfg: RunConfig,
    sha: str,
    backend: Backend,
    stop: StopFlag,
    watchdog: Watchdog,
    timeout_minutes: int,
) -> Trainer:
    """Megatron-Core's parallel state, the seeds, and this rank's ``Trainer`` (process group already up).

    The layout is computed once, from the frozen config, and passed on: to ``initialize_model_parallel``,
    the trainer (DP, micro-batches) and its checkpoints (the layout they record)."""
    import torch.distributed as dist

    from kilocard.layout import compute_layout
    from kilocard.train import megatron_adapter as ma
    from kilocard.train.trainer import Trainer

    lay = compute_layout(run_cfg)
    if lay.world_size != dist.get_world_size():
        raise ma.UnsupportedConfig(
            f"cluster.nodes({lay.nodes}) * cluster.gpus_per_node({lay.gpus_per_node}) = {lay.world_size} ranks, but "
            f"{dist.get_world_size()} were started; start as many ranks as the frozen config's cluster holds"
        )
    if lay.dp is None or lay.num_microbatches is None:  # the validator refuses such a config before it is frozen
        t = run_cfg.trainer
        raise ma.UnsupportedConfig(
            f"trainer.global_batch_size: {t.global_batch_size} is not a multiple of micro_batch_size"
            f"({t.micro_batch_size}) * dp({lay.dp}) on {lay.world_size} ranks; run `kilocard validate` on the config"
        )
    ma.init_parallel_state(lay, timeout_minutes=timeout_minutes)
    ma.seed_all(run_cfg.trainer.seed)
    return Trainer(run_cfg, lay, run_dir, sha, backend, stop, watchdog)


def _train_in_group(
    run_dir: Path,
    run_cfg: RunConfig,
    sha: str,
    backend: Backend,
    stop: StopFlag,
    watchdog: Watchdog,
    timeout: datetime.timedelta,
) -> int:
    import torch.distributed as dist

    from kilocard.rundir.metrics import MetricsWriter
    from kilocard.train.tracking import Trackers, external
    from kilocard.train.trainer import Outcome

    trainer = build_trainer(
        run_dir, run_cfg, sha, backend, stop, watchdog, timeout_minutes=max(1, int(timeout.total_seconds() // 60))
    )
    trainer.resume()
    writer = None
    if dist.get_rank() == 0:
        trackers = Trackers(run_cfg, run_dir) if external(run_cfg) else None
        writer = MetricsWriter(run_dir, run_cfg.trainer.tensorboard, resume_step=trainer.step, trackers=trackers)
        dropped = writer.superseded or {}
        events.append(
            run_dir,
            "resume",
            step=trainer.step,
            tier=trainer.ckpt.resumed_tier,
            superseded_step=dropped.get("step"),
            superseded_time=dropped.get("time"),
        )
    try:
        outcome = trainer.run(writer)
    finally:
        if writer is not None:
            writer.close()
    if outcome is Outcome.STOPPED:
        if dist.get_rank() == 0:
            say(f"kilocard.train: stop requested; committed step {trainer.step}; exiting RETRY ({exitcodes.RETRY})")
        return exitcodes.RETRY
    if dist.get_rank() == 0:
        say(f"kilocard.train: done at step {trainer.step}")
        from kilocard.rundir.reproduction import summary_lines

        say("\n".join(summary_lines(run_dir)))  # the Slurm log's report; kilocard run prints its own
    return exitcodes.DONE


def _shutdown() -> None:
    import torch.distributed as dist

    try:
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
    except ImportError:
        pass
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None, stop: StopFlag | None = None) -> int:
    """Command line: ``python -m kilocard.train RUN_DIR``; ``stop`` is the flag ``__main__`` installed before
    the heavy imports (it keeps a signal that came early)."""
    started = time.time()
    stop = stop or StopFlag()
    stop.install()  # a USR1/TERM during start-up (imports, rendezvous) must not kill the rank
    die_with_parent_in_forks()  # a killed rank's checkpoint writers must not keep its sockets open
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: python -m kilocard.train RUN_DIR", file=sys.stderr)
        return exitcodes.BAD_CONFIG
    run_dir = Path(argv[0])
    if not run_dir.is_dir():
        print(f"kilocard.train: error: run directory {run_dir} does not exist", file=sys.stderr)
        return exitcodes.BAD_CONFIG
    code = train(run_dir, stop, started)
    record_exit(code)
    return launcher_status(code, os.environ)


def launcher_status(code: int, env: Mapping[str, str]) -> int:
    """The process's exit status for run code ``code``: the code itself, except under a restarting
    launcher (``exitcodes.INJOB_ENV`` set), where only a fault is non-zero (``kilocard.exitcodes``)."""
    if env.get(exitcodes.INJOB_ENV) and code not in exitcodes.RESTART_IN_JOB:
        return 0
    return code
