"""Node health check: every rank runs it at start, so before training and before each in-job restart.

A node is bad when, on it:
  - the visible GPU count is not ``cluster.gpus_per_node`` (GPU clusters only);
  - NVML (``pynvml``) reports volatile uncorrected ECC errors, a pending or failed row remap, or a
    critical XID raised while the check listens (NVML reports an XID only as an event after a
    registration, so earlier ones, which are in the kernel log, are not seen); GPU only, skipped with
    a logged reason on CPU ranks;
  - a small all-reduce among the node's ranks (a per-node process group) fails or sums wrong;
  - the run directory's filesystem has less free space than one checkpoint (``checkpoint_bytes``);
  - it is named in ``$KILOCARD_FAULT_UNHEALTHY_NODES`` (fault injection, for tests);
  - in an in-job run on Slurm: this job has put it in the blocklist already (``listed_by_job``);
  - at an in-job restart on Slurm: it hosted the failed rank of ``REPEAT_FAILURES`` attempts. The failed rank
    of an attempt is the one that left no exit code in ``$KILOCARD_EXIT_DIR`` (a killed or hung rank;
    the others record FAULT when their collective fails); each rank leaves its node's name there
    (``node_<RANK>``) at start. An attempt whose unrecorded ranks span several nodes is not blamed on
    any (logged): a healthy node is never excluded on a guess.

Every rank learns every node's verdict (two small all-gathers). Rank 0 appends the bad nodes to the
run directory's blocklist (``names.BLOCKLIST``: node, reason, job, time), at most
``launcher.max_excluded_nodes`` nodes in all, and every rank ends with one line and BAD_NODE (77):
the batch script of an in-job run excludes the listed nodes from the job and requeues it. Without
in-job restarts the script has no exclusion step, so the ranks end FAULT (a plain requeue); past the
cap they end CRASH (that many bad nodes is a site problem a person must see).
"""

from __future__ import annotations

import datetime
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from kilocard import exitcodes
from kilocard.base.safe_read import RECORDS_LIMIT, FileReadError, read_text
from kilocard.base.say import say
from kilocard.config.schema import RunConfig
from kilocard.perf.memory import checkpoint_bytes
from kilocard.rundir.names import BLOCKLIST, EXIT_DIR_ENV, FAILED_RANKS, UNHEALTHY_NODES_ENV

REPEAT_FAILURES = 2
"""A node that hosted the failed rank of this many in-job restarts is excluded."""
ALLREDUCE_TIMEOUT_S = 60.0
"""Seconds the node's all-reduce may take before the node counts as bad."""
XID_LISTEN_MS = 20
"""Milliseconds the NVML XID listener waits for a pending critical XID event."""
MAX_XIDS = 8
"""XID events read at most (each one is a finding; more add nothing)."""


def node_name(env: Mapping[str, str]) -> str:
    """Slurm's name of this node (unique in a job even where the hosts share a hostname), else the hostname."""
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def _say(rank: int, msg: str) -> None:
    say(f"[rank {rank}] kilocard.train: node health: {msg}", sys.stderr)


def _size(n: int) -> str:
    """Bytes as GB (MB below one GB)."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _clean(text: str) -> str:
    """One tab-free line (reasons go into tab-separated files)."""
    return " ".join(text.split())


# --- the checks of one node -----------------------------------------------------------------------


def injected_problems(node: str, env: Mapping[str, str]) -> list[str]:
    """Fault injection: the node is bad when ``$KILOCARD_FAULT_UNHEALTHY_NODES`` names it."""
    names = {n.strip() for n in env.get(UNHEALTHY_NODES_ENV, "").split(",") if n.strip()}
    return [f"fault injection: {UNHEALTHY_NODES_ENV} names {node}"] if node in names else []


def gpu_count_problems(expected: int, visible: int) -> list[str]:
    """The visible GPU count differs from the one the job asked for."""
    return [] if visible == expected else [f"{visible} GPU(s) visible, cluster.gpus_per_node={expected}"]


def disk_problems(run_dir: Path, need_bytes: int) -> list[str]:
    """Less free space on the run directory's filesystem than one checkpoint."""
    free = shutil.disk_usage(run_dir).free
    if free >= need_bytes:
        return []
    return [f"{_size(free)} free on the filesystem of {run_dir}; one checkpoint needs {_size(need_bytes)}"]


def nvml_device_problems(nvml: Any, index: int, handle: Any) -> list[str]:
    """Uncorrected volatile ECC errors and pending/failed row remaps of one GPU (unsupported: no finding)."""
    problems = []
    try:
        ecc = nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        if ecc:
            problems.append(f"GPU {index}: {ecc} uncorrected ECC error(s) since the driver loaded")
    except nvml.NVMLError:
        pass  # ECC off or not reported by this GPU
    try:
        _corr, _unc, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
        if failed:
            problems.append(f"GPU {index}: a row remap failed (the GPU needs service)")
        elif pending:
            problems.append(f"GPU {index}: a row remap is pending (the GPU needs a reset)")
    except nvml.NVMLError:
        pass  # row remapping exists from Ampere on
    return problems


def _index(nvml: Any, handle: Any) -> str:
    """The GPU's NVML index (handles are ctypes pointers: equal devices need not be equal objects)."""
    try:
        return str(nvml.nvmlDeviceGetIndex(handle))
    except nvml.NVMLError:
        return "?"


def nvml_xid_problems(nvml: Any, handles: list[Any], listen_ms: int = XID_LISTEN_MS) -> list[str]:
    """Critical XID events NVML delivers while listening ``listen_ms`` (pending ones included)."""
    problems: list[str] = []
    events = nvml.nvmlEventSetCreate()
    try:
        for h in handles:
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, events)
            except nvml.NVMLError:
                continue  # this GPU does not report XID events
        for _ in range(MAX_XIDS):  # an XID storm must not keep the check listening
            try:
                data = nvml.nvmlEventSetWait_v2(events, listen_ms)
            except nvml.NVMLError:
                break  # timeout: no (more) event
            problems.append(f"GPU {_index(nvml, data.device)}: XID {data.eventData}")
        return problems
    finally:
        nvml.nvmlEventSetFree(events)


def nvml_problems() -> tuple[list[str], str | None]:
    """ECC, row-remap and XID findings of every GPU of the node, or (``[]``, why the check was skipped)."""
    try:
        import pynvml as nvml
    except ImportError:
        return [], "pynvml (nvidia-ml-py) is not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        return [], f"NVML unavailable ({e})"
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        problems = [p for i, h in enumerate(handles) for p in nvml_device_problems(nvml, i, h)]
        return problems + nvml_xid_problems(nvml, handles), None
    finally:
        nvml.nvmlShutdown()


def node_problems(cfg: RunConfig, run_dir: Path, on_gpu: bool) -> tuple[list[str], list[str]]:
    """The checks one rank per node runs: (problems, what was checked or skipped, for the log)."""
    need = checkpoint_bytes(cfg)
    problems = disk_problems(run_dir, need)
    notes = [f"a {_size(need)} checkpoint fits"]
    if not on_gpu:
        return problems, notes + ["GPU count and ECC/XID skipped: CPU ranks"]
    problems += gpu_count_problems(cfg.cluster.gpus_per_node, torch.cuda.device_count())
    found, skipped = nvml_problems()
    notes.append(f"ECC/XID skipped: {skipped}" if skipped else "GPU count, ECC/XID checked")
    return problems + found, notes


def allreduce_problems(node_ranks: list[int], on_gpu: bool) -> list[str]:
    """All-reduce a one among the node's ranks in their own process group; any error or a wrong sum is a problem."""
    try:
        group = dist.new_group(
            node_ranks,
            timeout=datetime.timedelta(seconds=ALLREDUCE_TIMEOUT_S),
            use_local_synchronization=True,
        )
        one = torch.ones(1, device="cuda" if on_gpu else "cpu")
        dist.all_reduce(one, group=group)
        dist.destroy_process_group(group)
    except Exception as e:  # noqa: BLE001 - any failure of the node's collective is the finding itself
        return [
            f"all-reduce among the node's {len(node_ranks)} ranks failed: {type(e).__name__}: {_clean(str(e))[:160]}"
        ]
    if int(one.item()) != len(node_ranks):
        return [f"all-reduce among the node's {len(node_ranks)} ranks summed {one.item():g}"]
    return []


# --- the failed rank of the previous in-job attempt -----------------------------------------------


def unrecorded_ranks(exit_dir: Path, world_size: int) -> dict[int, str]:
    """Ranks (below ``world_size``: a file of a larger earlier launch is not this run's) of the previous
    attempt that left their node's name but no exit code: rank -> node."""
    found = {}
    for path in exit_dir.glob("node_*"):
        rank = path.name[len("node_") :]
        if not rank.isdigit() or int(rank) >= world_size:
            continue
        record = exit_dir / f"rank_{rank}"
        code = _small(record) if record.exists() else ""
        if not code.lstrip("-").isdigit():
            found[int(rank)] = _small(path)
    return found


def _small(path: Path, limit: int = 4096) -> str:
    """A record file's text (stripped; empty when it is not a readable regular file)."""
    try:
        return read_text(path, limit, errors="replace").strip()
    except FileReadError:
        return ""


def leave_node_record(exit_dir: Path, rank: int, node: str) -> None:
    """This attempt's record of where ``rank`` runs; its old exit code (a previous attempt's) goes."""
    (exit_dir / f"rank_{rank}").unlink(missing_ok=True)
    (exit_dir / f"node_{rank}").write_text(node + "\n")


def blame_previous_attempt(run_dir: Path, exit_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Record which node hosted the failed rank of the previous attempt (``names.FAILED_RANKS``); return
    {node: reason} for a node that has now hosted it ``REPEAT_FAILURES`` times (rank 0, restarts only)."""
    failed = unrecorded_ranks(exit_dir, int(env.get("WORLD_SIZE", "1")))
    nodes = sorted(set(failed.values()))
    if len(nodes) != 1:
        if nodes:
            _say(0, f"the previous attempt's unrecorded ranks ran on {', '.join(nodes)}: not blamed on any node")
        return {}
    node, attempt = nodes[0], int(env.get("TORCHELASTIC_RESTART_COUNT", "0")) - 1
    ranks = ",".join(str(r) for r in sorted(failed))
    path = run_dir / FAILED_RANKS
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(f"{node}\t{ranks}\t{env.get('SLURM_JOB_ID', 'local')}\t{attempt}\t{_now()}\n")
    times = sum(1 for line in _small(path, RECORDS_LIMIT).splitlines() if line.split("\t", 1)[0] == node)
    _say(0, f"the failed rank(s) {ranks} of attempt {attempt} ran on {node} ({times} time(s) so far)")
    if times < REPEAT_FAILURES:
        return {}
    return {node: f"hosted the failed rank of {times} in-job restarts ({path})"}


# --- the verdict ------------------------------------------------------------------------------------


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def blocklisted(run_dir: Path) -> list[str]:
    """The nodes in the run's blocklist, in the order they were added."""
    path = run_dir / BLOCKLIST
    if not path.exists():
        return []
    nodes = [line.split("\t", 1)[0] for line in _small(path, RECORDS_LIMIT).splitlines() if line.strip()]
    return list(dict.fromkeys(nodes))


def listed_by_job(run_dir: Path, nodes: list[str], job: str) -> dict[str, str]:
    """{node: reason} for each of ``nodes`` that job ``job`` has already put in the run's blocklist.

    An in-job run never trains on such a node: the batch script keeps the blocklist out of a requeued job, so
    the node is in this allocation only when the launcher restarted the ranks after their BAD_NODE, or the
    exclusion's ``scontrol`` failed. Either way the ranks end BAD_NODE again."""
    path = run_dir / BLOCKLIST
    if not path.exists():
        return {}
    found: dict[str, str] = {}
    for line in _small(path, RECORDS_LIMIT).splitlines():
        fields = line.split("\t")
        if len(fields) >= 3 and fields[0] in nodes and fields[2] == job and fields[0] not in found:
            found[fields[0]] = f"in the blocklist since earlier in this job ({fields[1]})"
    return found


def append_blocklist(run_dir: Path, bad: dict[str, list[str]], job: str) -> Path:
    """Append one line per bad node: node, reason, job, time (tab-separated)."""
    path = run_dir / BLOCKLIST
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for node, reasons in sorted(bad.items()):
            f.write(f"{node}\t{_clean('; '.join(reasons))}\t{job}\t{_now()}\n")
    return path


def _gather(obj: object) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def verdict_code(in_job: bool, listed: list[str], bad: list[str], cap: int) -> int:
    """The code every rank ends with: BAD_NODE, or FAULT without in-job restarts, or CRASH past the cap."""
    if len(set(listed) | set(bad)) > cap:
        return exitcodes.CRASH
    return exitcodes.BAD_NODE if in_job else exitcodes.FAULT


def merge_verdicts(verdicts: list[tuple[str, list[str], dict[str, str]]]) -> dict[str, list[str]]:
    """{node: its distinct reasons} from every rank's (node, problems, {repeat-failure node: reason})."""
    bad: dict[str, list[str]] = {}
    for node, problems, repeated in verdicts:
        for n, reason in [(node, p) for p in problems] + list(repeated.items()):
            reasons = bad.setdefault(n, [])
            if reason not in reasons:
                reasons.append(reason)
    return bad


def check(cfg: RunConfig, run_dir: Path, env: Mapping[str, str], on_gpu: bool) -> int | None:
    """Check this rank's node with every other rank (collective); ``None`` when every node is healthy,
    else the exit code every rank ends with (``verdict_code``), after one line on each rank."""
    rank, local_rank = dist.get_rank(), int(env.get("LOCAL_RANK", "0"))
    node = node_name(env)
    exit_dir = Path(env[EXIT_DIR_ENV]) if env.get(EXIT_DIR_ENV) else None
    # the failed rank is counted on Slurm only: there is no other node to run on without a scheduler
    restarted = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0 and "SLURM_JOB_ID" in env
    repeat = blame_previous_attempt(run_dir, exit_dir, env) if rank == 0 and exit_dir and restarted else {}
    nodes = _gather(node)  # rank 0 has read the previous attempt's records: they may be replaced now
    if exit_dir:
        leave_node_record(exit_dir, rank, node)
    notes: list[str] = []
    problems = injected_problems(node, env)
    if local_rank == 0:
        found, notes = node_problems(cfg, run_dir, on_gpu)
        problems += found
    problems += allreduce_problems([r for r, n in enumerate(nodes) if n == node], on_gpu)
    listed = blocklisted(run_dir) if rank == 0 else []
    if rank == 0 and env.get(exitcodes.INJOB_ENV) and "SLURM_JOB_ID" in env:
        repeat = {**listed_by_job(run_dir, nodes, env["SLURM_JOB_ID"]), **repeat}
    verdicts = _gather((node, problems, repeat, listed))
    bad = merge_verdicts([(n, found_on_rank, repeated) for n, found_on_rank, repeated, _ in verdicts])
    if not bad:
        if local_rank == 0:
            _say(rank, f"{node} ok ({len(nodes)} ranks in the job, {nodes.count(node)} here; {'; '.join(notes)})")
        return None
    return conclude(cfg, run_dir, env, rank, node, bad, verdicts[0][3])


def conclude(
    cfg: RunConfig,
    run_dir: Path,
    env: Mapping[str, str],
    rank: int,
    node: str,
    bad: dict[str, list[str]],
    listed: list[str],
) -> int:
    """Blocklist the bad nodes (rank 0), print this rank's line and return its code."""
    cap = cfg.launcher.max_excluded_nodes
    code = verdict_code(bool(env.get(exitcodes.INJOB_ENV)), listed, list(bad), cap)
    names = ", ".join(sorted(bad))
    if code == exitcodes.CRASH:
        action = (
            f"that would exclude {len(set(listed) | set(bad))} nodes, more than launcher.max_excluded_nodes={cap}; "
            "a person must look (or raise the cap)"
        )
    else:
        new = {n: reasons for n, reasons in bad.items() if n not in listed}
        if rank == 0 and new:
            append_blocklist(run_dir, new, env.get("SLURM_JOB_ID", "local"))
        action = f"added to the blocklist {run_dir / BLOCKLIST}; " + (
            "the batch script excludes it and requeues the job"
            if code == exitcodes.BAD_NODE
            else "without in-job restarts (launcher.max_restarts=0) the batch script cannot exclude it: a plain requeue"
        )
    mine = f"; this node {node}: {'; '.join(bad[node])}" if node in bad else ""
    _say(rank, f"node(s) {names} failed the health check{mine}; {action}; exiting {exitcodes_name(code)} ({code})")
    return code


def exitcodes_name(code: int) -> str:
    """The name of a code of ``kilocard.exitcodes`` (for the log line)."""
    return next(n for n in ("BAD_NODE", "FAULT", "CRASH") if getattr(exitcodes, n) == code)
