"""Talk to Slurm: submit a batch script (optionally as a chain of jobs) and record the job ids.

A chain of N jobs: link 1 gets ``launcher.dependency`` (if any), link k > 1 depends on link k-1
with ``afterany`` (it starts whatever way the previous one ended: time limit, cancel, fault).
Each link is told its position (``KILOCARD_CHAIN_LINK``) so only the last link requeues itself.
Secrets are passed by NAME with ``--export=ALL,NAME``: sbatch copies the value from this process's
environment; it never appears on a command line or on disk.

A chain is all or nothing: at most ``MAX_CHAIN`` links, and when link k is refused the k-1 links
already queued are cancelled with ``scancel`` (``ChainError`` says whether that worked; the caller
records the ids in ``jobs.json`` when it did not, so no queued job is ever unrecorded).
"""

from __future__ import annotations

import datetime as _dt
import getpass
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from kilocard.base import shell
from kilocard.base.safe_read import read_json, require_field

JOBS_FILE = "jobs.json"
#: Seconds any Slurm client call may take (a dead controller makes clients retry for minutes).
CLIENT_TIMEOUT_S = 60
JOB_ID = re.compile(r"(\d+)(;\S+)?")
#: The most links one ``--chain`` may submit. Slurm's default MaxJobCount is 10,000 jobs for the
#: whole controller and sites cap a user's queued jobs (MaxSubmitJobs) in the tens to hundreds, so a
#: chain must stay a small share of either; 100 links of a 24 h limit are 100 days of training, and a
#: run that needs more continues with requeues or a later chain from its run directory.
MAX_CHAIN = 100


class SlurmError(RuntimeError):
    """sbatch/scontrol failed or answered something unexpected."""


class ChainError(SlurmError):
    """Link ``link`` of a chain was refused; the links queued before it were cancelled or not."""

    def __init__(self, link: int, chain: int, cause: SlurmError, queued: list[int], cancel_error: str | None):
        self.link, self.chain, self.queued, self.cancel_error = link, chain, queued, cancel_error
        super().__init__(f"link {link} of {chain}: {cause}")

    @property
    def cancelled(self) -> bool:
        """Whether every link queued before the failure was cancelled."""
        return self.cancel_error is None


def export_arg(secret_env: Sequence[str], chain_link: int | None = None) -> str:
    """``--export=ALL[,KILOCARD_CHAIN_LINK=k][,NAME...]``: names only, values come from the environment."""
    parts = ["ALL"]
    if chain_link is not None:
        parts.append(f"KILOCARD_CHAIN_LINK={int(chain_link)}")
    parts += [shell.env_name("launcher.secret_env", n) for n in secret_env]
    return "--export=" + ",".join(parts)


def sbatch_argv(
    script: Path,
    secret_env: Sequence[str] = (),
    chain_link: int | None = None,
    dependency: str | None = None,
    parsable: bool = True,
    test_only: bool = False,
) -> list[str]:
    """The sbatch command line for one job (argument list; never run through a shell)."""
    argv = ["sbatch"]
    if parsable:
        argv.append("--parsable")
    if test_only:
        argv.append("--test-only")
    if chain_link is not None or secret_env:
        argv.append(export_arg(secret_env, chain_link))
    if dependency:
        argv.append("--dependency=" + shell.sbatch_value("launcher.dependency", dependency, "dependency"))
    return argv + [str(script)]


def parse_job_id(stdout: str) -> int:
    """The job id from ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    text = stdout.strip().splitlines()[-1].strip() if stdout.strip() else ""
    m = JOB_ID.fullmatch(text)
    if not m:
        raise SlurmError(f"sbatch --parsable answered {stdout.strip()!r}, expected a job id")
    return int(m.group(1))


def run_client(argv: Sequence[str]) -> subprocess.CompletedProcess:
    """Run a Slurm client with a timeout; raise ``SlurmError`` with its stderr when it fails."""
    try:
        # errors="replace": a client's message in another encoding (latin-1 from a site's job_submit
        # plugin) must not become a UnicodeDecodeError after the job was queued.
        proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=CLIENT_TIMEOUT_S)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: not found; run on a Slurm login node (or start scripts/slurm-up.sh)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]}: no answer from the Slurm controller within {CLIENT_TIMEOUT_S} s") from None
    if proc.returncode != 0:
        said = " ".join((proc.stderr.strip() or proc.stdout.strip()).split())  # one line
        raise SlurmError(f"{' '.join(argv)}: {said} (exit {proc.returncode})")
    return proc


def check_chain(chain: int) -> str | None:
    """Why ``chain`` is not a usable number of links, or ``None``."""
    if not 1 <= chain <= MAX_CHAIN:
        return f"--chain: {chain} is not a usable number of links; use 1 to {MAX_CHAIN} (each link is a queued job)"
    return None


def missing_client(name: str = "sbatch") -> str | None:
    """Why the Slurm client ``name`` cannot be run from here, or ``None`` when it is on the PATH."""
    if shutil.which(name) is None:
        return f"{name}: not found on the PATH; run on a Slurm login node (or start scripts/slurm-up.sh)"
    return None


def cancel_jobs(ids: Sequence[int]) -> str | None:
    """``scancel`` the jobs; ``None`` when that worked, else why not."""
    if not ids:
        return None
    try:
        run_client(["scancel", *(str(int(i)) for i in ids)])
    except SlurmError as e:
        return str(e)
    return None


def missing_secrets(secret_env: Sequence[str]) -> list[str]:
    """Names in ``secret_env`` not set in this process's environment."""
    return [n for n in secret_env if n not in os.environ]


def submit_chain(script: Path, chain: int, secret_env: Sequence[str] = (), dependency: str | None = None) -> list[int]:
    """Submit ``chain`` jobs of ``script`` that continue one another; return their ids in order.

    When a link is refused, the links already queued are cancelled and ``ChainError`` is raised.
    """
    bad_chain = check_chain(chain)
    if bad_chain:
        raise SlurmError(bad_chain)
    missing = missing_secrets(secret_env)
    if missing:
        raise SlurmError(
            f"launcher.secret_env: {', '.join(missing)} not set in this shell; export them before submitting"
        )
    ids: list[int] = []
    for link in range(1, chain + 1):
        dep = dependency if link == 1 else f"afterany:{ids[-1]}"
        argv = sbatch_argv(script, secret_env, chain_link=link if chain > 1 else None, dependency=dep)
        try:
            ids.append(parse_job_id(run_client(argv).stdout))
        except Exception as e:  # whatever went wrong, the links queued so far are cancelled or reported
            cause = e if isinstance(e, SlurmError) else SlurmError(f"{argv[0]} failed ({type(e).__name__})")
            raise ChainError(link, chain, cause, ids, cancel_jobs(ids)) from None
        except KeyboardInterrupt:
            cancel_jobs(ids)
            raise
    return ids


def record_jobs(run_dir: Path, ids: Sequence[int], chain: int, argv: Sequence[str], complete: bool = True) -> Path:
    """Append this submission to ``<run_dir>/jobs.json`` (written via a temp file + rename).

    ``complete=False`` marks a chain that broke off and whose queued links could not be cancelled.
    """
    path = run_dir / JOBS_FILE
    data = read_json(path, dict) if path.exists() else {"submissions": []}
    require_field(path, data, "submissions", list)
    data["submissions"].append(
        {
            "job_ids": list(ids),
            "chain": chain,
            "submitted": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "sbatch": list(argv),
            **({} if complete else {"complete": False}),
        }
    )
    data["job_ids"] = [j for s in data["submissions"] for j in s["job_ids"]]
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path


#: Seconds ``kilocard runs`` waits for ``squeue``/``sacct`` (a listing must not hang on a dead controller).
QUERY_TIMEOUT_S = 10


def _query(argv: Sequence[str]) -> str | None:
    """A Slurm client's stdout, or ``None`` when it is not installed, fails or does not answer in time."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=QUERY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def parse_queue(text: str) -> dict[int, tuple[str, str]]:
    """``squeue --format=%i|%T|%r`` lines as ``{job id: (state, reason)}`` (array or odd lines skipped)."""
    out: dict[int, tuple[str, str]] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0].isdigit():
            out[int(parts[0])] = (parts[1], parts[2])
    return out


def queue_states(ids: Sequence[int]) -> dict[int, tuple[str, str]] | None:
    """``{job id: (state, reason)}`` of those of ``ids`` in Slurm's queue (PENDING, RUNNING, ...); ``None``
    when ``squeue`` cannot be asked here. One call for every job of the user: finished ids are simply absent."""
    if not ids:
        return {}
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container without a passwd entry)
        user = str(os.getuid())
    text = _query(["squeue", "--noheader", f"--user={user}", "--format=%i|%T|%r"])
    if text is None:
        return None
    wanted = set(ids)
    return {i: s for i, s in parse_queue(text).items() if i in wanted}


def accounting_states(ids: Sequence[int]) -> dict[int, str]:
    """``{job id: final state}`` from ``sacct`` (``COMPLETED``, ``TIMEOUT``, ``CANCELLED by 0``...); empty when
    accounting is not kept or cannot be asked."""
    if not ids:
        return {}
    text = _query(["sacct", "--noheader", "-X", "-P", "--format=JobID,State", f"--jobs={','.join(map(str, ids))}"])
    out: dict[int, str] = {}
    for line in (text or "").splitlines():
        job, _, state = line.strip().partition("|")
        if job.isdigit() and state:
            out[int(job)] = state
    return out
