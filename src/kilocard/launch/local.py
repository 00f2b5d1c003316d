"""``kilocard run``: validate, write a run directory, train on local ranks with torchrun, summarise.

With ``launcher.max_restarts`` > 0 the ranks are started by NVRx's ``ft_launcher`` instead
(``kilocard.launch.ftlaunch``): a rank that dies or stops sending heartbeats gets every rank
restarted in the same launch, at most that many times, each attempt resuming from the newest
committed step; the hang guard below restarts its clock at every new attempt.

CPU ranks use gloo when there is no GPU. Every launch gets ``OMP_NUM_THREADS=1`` (unless set), a
per-run ``TMPDIR`` inside the run directory, a free rendezvous port and a hang guard: when the
metrics stop advancing for ``trainer.hang_timeout_s`` plus a grace period, the ranks are killed
and the run ends with FAULT. Rank output goes to ``<run_dir>/logs/train.log``, each line labelled
``[rankN]: `` (the launcher's ``--tee``, as on Slurm); the terminal shows rank 0's step and evaluation
lines from there and, at the end, a summary table. The verb itself (arguments, validation, the
run directory, printing, exit codes before launch) is ``kilocard.commands.run``.

The ranks get the run's environment (``kilocard.plan``: layout defaults, ``cluster.env``,
``launcher.env``; secrets by name). The launcher holds the run directory's lock
(``kilocard.rundir.lock``) while the ranks run, so a second ``kilocard run --resume`` of the same
directory is refused. TERM or INT to the launcher asks the ranks to save and stop; it waits for
them (bounded by the save time plus a margin) and no rank outlives it.
"""

from __future__ import annotations

import contextlib
import glob
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from kilocard import exitcodes
from kilocard.base.lifeline import parent_death_preexec
from kilocard.base.net import free_port
from kilocard.base.quiet import with_launcher_filter
from kilocard.base.safe_read import MiB, read_tail
from kilocard.config.schema import RunConfig
from kilocard.launch import ftlaunch
from kilocard.launch.logs import Reader, rank0_progress
from kilocard.launch.render import LOG_DIR
from kilocard.plan import build_plan
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import events
from kilocard.rundir import lock as runlock
from kilocard.rundir.checkpoint import checkpoint_root
from kilocard.rundir.metrics import read_evals, read_metrics
from kilocard.rundir.names import EXIT_DIR_ENV
from kilocard.rundir.progress import STEP_LINE, summary_table
from kilocard.rundir.reproduction import summary_lines
from kilocard.validate.slurm import expected_save_time_s

"""When set, every rank writes its exit code to ``$KILOCARD_EXIT_DIR/rank_<N>`` (torchrun hides them)."""

GRACE_S = 120.0
"""Extra seconds the launcher waits beyond trainer.hang_timeout_s before it kills silent ranks."""
STOP_MARGIN_S = 120.0
"""Seconds beyond the expected save time that ranks asked to stop (TERM/INT) may take: the step in flight."""
TORCHRUN_MARGIN_S = 30.0
"""Seconds torchrun may take to end after its ranks' stop time before the launcher kills the whole group."""
SOCKET_TMPDIR_MAX = 60
"""Longest ``TMPDIR`` for ft_launcher: it binds Unix sockets there (``_ft_launcher<pid>_to_rmon.socket``),
and a socket's path must fit 107 bytes."""
SHORT_TMP_ROOT = "/tmp"
"""Where a short link to a deep run directory's ``tmp`` is made for ft_launcher's sockets."""


QUICK_EXIT = "kilocard.base.quickexit"
"""``python -m QUICK_EXIT MODULE ARGS``: torchrun's main, then an exit without the interpreter's teardown of the
torch it imported (``kilocard.base.quickexit``)."""


def torchrun_command(
    run_dir: Path, nproc: int, port: int, max_restarts: int = 0, shutdown_timeout_s: float = 30.0
) -> list[str]:
    """The torchrun command line for ``nproc`` local ranks of ``run_dir``.

    With ``max_restarts`` > 0 torchrun restarts every rank after a failure; each restart resumes
    from the last committed step (``python -m kilocard.train`` always does). On TERM torchrun
    passes it to the ranks and waits ``shutdown_timeout_s`` for them before it SIGKILLs them. Each line a
    rank writes reaches the log with its rank in front (``ftlaunch.TEE``, ``ftlaunch.LINE_PREFIX``).
    """
    return [
        sys.executable,
        "-m",
        QUICK_EXIT,
        "torch.distributed.run",
        f"--nproc-per-node={nproc}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={port}",
        f"--max-restarts={max_restarts}",
        f"--shutdown-timeout={math.ceil(shutdown_timeout_s)}",
        ftlaunch.TEE,  # every line of a rank labelled with its rank (LINE_PREFIX, set by rank_env)
        "-m",
        "kilocard.train",
        str(run_dir),
    ]


def ft_command(run_dir: Path, run_cfg: RunConfig, nproc: int, port: int, stop_wait_s: float) -> list[str]:
    """The ``ft_launcher`` command line for ``nproc`` local ranks of ``run_dir`` (in-job restarts,
    ``kilocard.launch.ftlaunch``, its forks tied to it): rendezvous on ``127.0.0.1:port``; on TERM it passes TERM
    to the ranks and waits ``stop_wait_s`` for their save before it SIGKILLs them."""
    args = ftlaunch.ft_launcher_args(
        run_cfg, nnodes="1", nproc=nproc, rdzv_endpoint=f"127.0.0.1:{port}", term_timeout_s=stop_wait_s
    )
    return [sys.executable, "-m", ftlaunch.TIED_MODULE, *args, ftlaunch.TEE, "-m", "kilocard.train", str(run_dir)]


#: The device files of NVIDIA's driver: a machine without any has no CUDA device, and torch need not be imported
#: to say so (``kilocard validate`` imports no torch).
NVIDIA_DEVICES = "/dev/nvidia[0-9]*"


def local_gpus() -> list[str]:
    """The names of this machine's CUDA devices (empty without a GPU or a CUDA build of torch)."""
    if not glob.glob(NVIDIA_DEVICES):
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def machine_mismatch(run_cfg: RunConfig, gpus: list[str]) -> str | None:
    """Why the cluster profile of ``run_cfg`` does not describe this machine with CUDA devices ``gpus``, or ``None``.

    ``kilocard run`` trains here: on CPU ranks (``cluster.gpu=cpu``, the ``local_cpu`` profile), or on this
    machine's GPUs when the profile asks for one node of at most as many GPUs of its model (the model's
    family, e.g. ``h100`` of ``h100-sxm5-80gb``, in the device's name). Anything else is a cluster's
    profile: it belongs to ``kilocard sbatch``.
    """
    c = run_cfg.cluster
    fix = "use cluster=local_cpu to train on CPU ranks here, or kilocard sbatch to run on that cluster"
    if c.nodes > 1:
        return f"cluster.nodes={c.nodes}: kilocard run trains on this machine only (one node); {fix}"
    if c.gpu == "cpu":
        return None
    family = c.gpu.split("-")[0].lower()
    wanted = f"cluster={c.name} asks for {c.gpus_per_node} {c.gpu} GPU(s)"
    if not gpus:
        return f"{wanted}; this machine has no GPU: {fix}"
    matching = [g for g in gpus if family in g.lower()]
    if len(matching) < c.gpus_per_node:
        have = ", ".join(sorted(set(gpus)))
        return f"{wanted}; this machine has {len(matching)} of that model ({len(gpus)} GPU(s): {have}): {fix}"
    return None


def unavailable(run_cfg: RunConfig) -> str | None:
    """Why this machine cannot run ``run_cfg`` locally as configured (one line naming the field), or ``None``."""
    mismatch = machine_mismatch(run_cfg, local_gpus() if run_cfg.cluster.gpu != "cpu" else [])
    return mismatch or restart_problem(run_cfg)


def restart_problem(run_cfg: RunConfig) -> str | None:
    """Why the in-job restarts ``run_cfg`` asks for cannot run here (NVRx missing or not matching
    megatron-core), or ``None`` (also when it asks for none)."""
    if not ftlaunch.in_job(run_cfg):
        return None
    versions = ftlaunch.installed_restart_support()  # which megatron-core works with which NVRx
    if versions:
        return versions.replace("launcher.max_restarts:", f"launcher.max_restarts={run_cfg.launcher.max_restarts}:", 1)
    if not ftlaunch.available():
        return (
            f"launcher.max_restarts={run_cfg.launcher.max_restarts}: in-job restarts need NVIDIA Resiliency "
            "Extension (nvidia-resiliency-ext), which does not import here; install it with "
            "pip install 'kilocard[resiliency]', or set launcher.max_restarts=0"
        )
    return None


def rank_env(run_dir: Path, run_cfg: RunConfig, lock_token: str) -> dict:
    """Environment of the ranks: the caller's, then the run's (``kilocard.plan``), a per-run TMPDIR.

    The same precedence as the batch script: the layout's defaults (they yield to a variable the
    caller's shell already set; ``OMP_NUM_THREADS=1`` unless set), then ``cluster.env``, then
    ``launcher.env``, which override it. Secrets (``launcher.secret_env``) pass by name from the
    caller's environment and are never written. The ranks' exit codes go to the run dir, and the
    launcher's lock token tells rank 0 who holds the run directory.
    """
    plan = build_plan(run_cfg)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    for name, value in plan.env.items():
        if name in run_cfg.cluster.env or name in run_cfg.launcher.env:
            env[name] = value
        else:
            env.setdefault(name, value)
    tmp = run_dir / "tmp"
    exit_dir = run_dir / LOG_DIR / "exit"
    for d in (tmp, exit_dir):
        d.mkdir(parents=True, exist_ok=True)
    for f in exit_dir.glob("rank_*"):
        f.unlink()
    env["TMPDIR"] = str(tmp)
    env[EXIT_DIR_ENV] = str(exit_dir)
    env[runlock.TOKEN_ENV] = lock_token
    env["PYTHONUNBUFFERED"] = "1"
    env[ftlaunch.LINE_PREFIX_ENV] = ftlaunch.LINE_PREFIX  # the launcher's --tee labels each line: [rankN]:
    env["PYTHONWARNINGS"] = with_launcher_filter(env.get("PYTHONWARNINGS"))  # torchrun imports torch.cuda too
    if ftlaunch.in_job(run_cfg):
        env.update(ftlaunch.rank_env(run_cfg))
    return env


@contextlib.contextmanager
def socket_tmpdir(tmp: Path) -> Iterator[Path]:
    """``tmp``, or while in use a short link to it under ``SHORT_TMP_ROOT`` when ``tmp`` is too long to hold
    ft_launcher's Unix sockets (a deep run directory); the link is removed afterwards."""
    if len(str(tmp.absolute())) <= SOCKET_TMPDIR_MAX:  # NVRx makes the path absolute
        yield tmp
        return
    holder = Path(tempfile.mkdtemp(prefix="kilocard-", dir=SHORT_TMP_ROOT))
    link = holder / "tmp"
    link.symlink_to(tmp.resolve(), target_is_directory=True)
    try:
        yield link
    finally:
        link.unlink()
        holder.rmdir()


def stop_wait_s(run_cfg: RunConfig) -> float:
    """How long the ranks may take to stop after TERM: the step in flight, the save, a margin."""
    return expected_save_time_s(run_cfg) + STOP_MARGIN_S


def launch(run_dir: Path, nproc: int, max_restarts: int = 0) -> int:
    """Take the run directory's lock (and the checkpoint directory's, when ``checkpoint.save`` lies outside
    the run directory), train on ``nproc`` local ranks, print the summary.

    A directory another writer holds is refused at once (exit 1), naming the holder.
    """
    from kilocard.rundir.freeze import load_verified

    run_cfg, _ = load_verified(run_dir)  # the verb has checked the secrets (kilocard.commands.run)
    locks: list[runlock.RunLock] = []
    try:
        for directory, what in _locked_dirs(run_dir, run_cfg):
            held = _lock(directory, locks[0].token if locks else None, what)
            if isinstance(held, int):
                return held
            if held is not None:
                locks.append(held)
        return _train(run_dir, run_cfg, nproc, max_restarts, locks[0].token if locks else "", [l.fd for l in locks])
    finally:
        for lock in reversed(locks):
            lock.release()


def _locked_dirs(run_dir: Path, run_cfg: RunConfig) -> list[tuple[Path, str]]:
    """The run directory, and the checkpoint directory when it lies outside it (created here), each with
    what it is."""
    root = ck.checkpoint_root(run_dir, run_cfg)
    if not ck.outside(root, run_dir):
        return [(run_dir, "run directory")]
    root.mkdir(parents=True, exist_ok=True)
    return [(run_dir, "run directory"), (root, "checkpoint directory")]


def _lock(directory: Path, token: str | None, what: str) -> runlock.RunLock | int | None:
    """The lock of ``directory`` (with the token of the launcher's first lock), ``None`` where the filesystem
    has no flock (warned), or the exit code after saying why it is refused."""
    try:
        return runlock.acquire(directory, token, what)
    except runlock.RunDirBusy as e:
        print(f"kilocard run: error: {e}", file=sys.stderr)
        return exitcodes.CRASH  # exit 1: refused; nothing was started
    except runlock.LockUnsupported as e:
        print(f"kilocard run: warning: {e}", file=sys.stderr)
        return None
    except OSError as e:
        print(f"kilocard run: error: {directory}: cannot lock the directory ({e.strerror})", file=sys.stderr)
        return exitcodes.CRASH


def _train(
    run_dir: Path, run_cfg: RunConfig, nproc: int, max_restarts: int, lock_token: str, lock_fds: list[int]
) -> int:
    """Start the ranks' launcher (torchrun, or ft_launcher for in-job restarts), show progress, forward
    TERM/INT, guard against hangs; the run's exit code. The launcher inherits the locks (``lock_fds``): they
    are held until it is gone too."""
    env = rank_env(run_dir, run_cfg, lock_token)
    log = run_dir / LOG_DIR / "train.log"
    start_step = len(read_metrics(run_dir))
    stop_wait = stop_wait_s(run_cfg)
    tmp = Path(env["TMPDIR"])
    tmp_in_use: contextlib.AbstractContextManager[Path]
    if ftlaunch.in_job(run_cfg):
        cmd, tmp_in_use = ft_command(run_dir, run_cfg, nproc, free_port(), stop_wait), socket_tmpdir(tmp)
    else:
        cmd = torchrun_command(run_dir, nproc, free_port(), max_restarts, shutdown_timeout_s=stop_wait)
        tmp_in_use = contextlib.nullcontext(tmp)
    with open(log, "ab") as out, tmp_in_use as tmpdir:
        env["TMPDIR"] = str(tmpdir)
        proc = subprocess.Popen(  # dies with this process, and each rank with it (kilocard.base.lifeline)
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=parent_death_preexec(),
            pass_fds=lock_fds,
        )
        try:
            with StopForwarder(proc, stop_wait) as stop:
                code = _watch(proc, run_dir, run_cfg.trainer.hang_timeout_s + GRACE_S, stop)
        finally:
            _end_group(proc.pid)
    code = exitcodes.from_exit_dir(str(run_dir / LOG_DIR / "exit"), proc.returncode if code is None else code)
    events.append(run_dir, "end", code=code)  # the run's code, every rank's combined (kilocard runs reads it)
    print(end_summary(run_dir, run_cfg, code, start_step), flush=True)
    if code == exitcodes.DONE:
        print("\n".join(summary_lines(run_dir)), flush=True)
    if code not in (exitcodes.DONE, exitcodes.RETRY):
        _print_tail(log)
    return code


def end_summary(run_dir: Path, run_cfg: RunConfig, code: int, start_step: int) -> str:
    """The summary table of this launch: its steps' records and the run's newest committed step, read where
    the trainer commits them (``checkpoint_root``: ``checkpoint.save`` when set)."""
    records = read_metrics(run_dir)
    ckpt_root = checkpoint_root(run_dir, run_cfg)
    return summary_table(
        records, run_dir, code, ckpt_root=ckpt_root, first_new_step=start_step, evals=read_evals(run_dir)
    )


class StopForwarder:
    """While active, TERM and INT to ``kilocard run`` ask the ranks to save and stop instead of orphaning them.

    The first one is forwarded as TERM to torchrun (or ft_launcher), which passes it to every rank and
    SIGKILLs any that has not ended after ``stop_wait`` s; the ranks stop at the same step boundary, commit a
    save and exit RETRY. Later signals only say that the launcher is still waiting: a second
    Ctrl-C never leaves ranks behind while they save.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, proc: subprocess.Popen, stop_wait: float) -> None:
        self.proc = proc
        self.stop_wait = stop_wait
        self.since: float | None = None
        """``time.monotonic()`` of the first forwarded signal, or ``None``."""
        self._previous: dict[int, signal._HANDLER] = {}

    def __enter__(self) -> StopForwarder:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def overdue(self) -> bool:
        """Whether the ranks have had their stop time (plus torchrun's own margin) and are still there."""
        return self.since is not None and time.monotonic() - self.since > self.stop_wait + TORCHRUN_MARGIN_S

    def _handle(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self.since is None:
            self.since = time.monotonic()
            print(f"\nkilocard run: {name}: asking the ranks to save and stop", file=sys.stderr, flush=True)
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        else:
            print(
                f"\nkilocard run: {name}: still waiting for the ranks to save and stop "
                f"(at most {self.stop_wait + TORCHRUN_MARGIN_S:.0f}s after the first signal)",
                file=sys.stderr,
                flush=True,
            )


def _watch(proc: subprocess.Popen, run_dir: Path, silence_s: float, stop: StopForwarder) -> int | None:
    """Show rank 0's step lines until the ranks exit; kill them and return FAULT if they go silent or overstay
    a stop.

    The terminal shows the step and evaluation lines rank 0 writes to ``train.log`` (one stream: the same
    lines a Slurm job log and ``kilocard logs`` carry). Silence is counted from the newest metrics record,
    evaluation or launch attempt (a ``start`` in events.jsonl): ranks restarted in-job get the whole
    allowance again for their start-up.
    """
    tty = sys.stdout.isatty()
    reader = Reader(run_dir).skip_existing()
    shown, seen, attempts, last_change = False, 0, _attempts(run_dir), time.monotonic()
    evals_seen = len(read_evals(run_dir))
    while True:
        done = proc.poll() is not None  # read once more after the ranks end: their last lines
        for line in rank0_progress(reader.new_lines()):
            shown = _show(line, tty, shown)
        if done:
            break
        time.sleep(0.5)
        records, evals = read_metrics(run_dir), read_evals(run_dir)
        now_attempts = _attempts(run_dir)
        if now_attempts != attempts or len(records) != seen or len(evals) != evals_seen:
            attempts, seen, evals_seen, last_change = now_attempts, len(records), len(evals), time.monotonic()
        elif time.monotonic() - last_change > silence_s:
            print(f"\nkilocard run: no progress for {silence_s:.0f}s; stopping the ranks (FAULT)", file=sys.stderr)
            _kill(proc)
            return exitcodes.FAULT
        if stop.overdue():
            print(f"\nkilocard run: the ranks did not stop within {stop.stop_wait:.0f}s; killing them (FAULT)")
            _kill(proc)
            return exitcodes.FAULT
    if shown:
        print()
    return None


def _show(line: str, tty: bool, open_line: bool) -> bool:
    """Print rank 0's ``line``; on a terminal a step line is rewritten in place and an evaluation line stays
    (``open_line``: a step line is showing without its newline). Returns whether one now is."""
    if not tty:
        print(line, flush=True)
        return False
    if STEP_LINE.match(line):
        print("\r" + line, end="", flush=True)
        return True
    print(("\n" if open_line else "") + line, flush=True)
    return False


def _attempts(run_dir: Path) -> int:
    """Launch attempts recorded so far (``start`` events in events.jsonl)."""
    return sum(1 for e in events.read(run_dir) if e["event"] == "start")


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _end_group(pgid: int) -> None:
    """SIGKILL what is left of the ranks' process group (nothing after a clean exit): no rank outlives the launcher."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


LOG_NOISE = ("UserWarning", "warnings.warn", "NVML", "pynvml")
"""Lines of the training log never shown on the terminal: library warnings, and NVRx's and torch's notes
that the NVIDIA management library is missing (every start without a GPU)."""


#: How much of the end of the training log ``_print_tail`` reads (a long run's log may be gigabytes).
TAIL_BYTES = 8 * MiB

OWN_ERROR = re.compile(r"kilocard\.train: (error|crashed|no progress)")
"""The trainer's own line for a rank that fails (``kilocard.train.entry``, the watchdog)."""
RAISED = re.compile(r"^(\[rank ?\d+\]: )?([A-Za-z_][\w.]*)?(Error|Exception|Interrupt)\b[^:]*: \S")
"""The last line of a rank's traceback (``[rank3]: RuntimeError: ...``, ``ModuleNotFoundError: ...``): a rank
that fails before the trainer's own handler (an import, a library's start-up) still names its error."""


def _print_tail(log: Path, lines: int = 30) -> None:
    """The ranks' own error lines (once each), else the log's last lines without ``LOG_NOISE`` (torchrun's
    report hides them)."""
    text = read_tail(log, TAIL_BYTES).splitlines()
    own = [l for l in text if OWN_ERROR.search(l)]  # the trainer's line says it (its traceback is in the log)
    errors = list(dict.fromkeys(own or [l for l in text if RAISED.match(l)]))
    keep = errors or [l for l in text if not any(noise in l for noise in LOG_NOISE)][-lines:]
    print(f"--- from {log} ---", file=sys.stderr)
    print("\n".join(keep), file=sys.stderr)
