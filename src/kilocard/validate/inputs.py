"""Rules on the input surface: numbers in range, launcher fields well formed, names and values safe.

Every verb (``validate``, ``run``, ``sbatch``) runs these, so a config that cannot be launched
anywhere is refused before anything is written: a negative ``trainer.train_iters``, a learning
rate below zero, ``checkpoint.keep_last`` below one, a malformed ``launcher.time``, a port out of
range, a run name that is not a plain directory name, or a value with a control character (a
newline would start a new line in the batch script). The checks of values that reach a batch
script are the renderer's own (``kilocard.base.shell``), applied here to the config alone.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from functools import partial

from kilocard.base import shell
from kilocard.base.slurmtime import time_limit_problem
from kilocard.config.schema import WANDB_MODES, RunConfig
from kilocard.layout import Layout
from kilocard.paths import MAX_NAME_BYTES
from kilocard.validate.issues import Issue, error

#: (field, lowest allowed value, whether the lowest is allowed, what it means): numbers with a floor.
FLOORS: tuple[tuple[str, float, bool, str], ...] = (
    ("trainer.train_iters", 1, True, "optimizer steps to train"),
    ("trainer.log_interval", 1, True, "steps between log lines"),
    ("trainer.eval_interval", 1, True, "steps between evaluations (null = no evaluation)"),
    ("trainer.eval_iters", 1, True, "global batches of the validation split per evaluation"),
    ("trainer.rank_time_interval", 0, True, "steps between per-rank step-time gathers (0 = off)"),
    ("trainer.hang_timeout_s", 0, True, "seconds without progress before a rank is declared hung (0 = off)"),
    ("trainer.seed", 0, True, "the seed of model init, dropout and data order (numpy takes 0 .. 2**32 - 1)"),
    ("data.random_seed", 0, True, "the seed of Megatron-Core's dataset shuffle (numpy takes 0 .. 2**32 - 1)"),
    ("optim.lr", 0, True, "the peak learning rate"),
    ("optim.min_lr", 0, True, "the learning rate at the end of the decay"),
    ("optim.weight_decay", 0, True, "the decoupled weight decay"),
    ("checkpoint.keep_last", 1, True, "committed steps kept (the newest is never removed)"),
    ("checkpoint.save_interval", 0, True, "steps between saves (0 = only at the end and on a stop)"),
    ("checkpoint.ckpt_step", 0, True, "the step of checkpoint.load to start from"),
    ("checkpoint.expected_save_time_s", 0, True, "a measured save time in seconds"),
    ("cluster.cpus_per_node", 1, True, "CPU cores per node"),
    ("cluster.fs_write_bandwidth_gbs", 0, False, "the shared filesystem's write bandwidth in GB/s"),
    ("launcher.nproc", 1, True, "local ranks"),
    ("launcher.signal_lead_s", 0, True, "seconds between USR1 and the time limit"),
    ("launcher.max_restarts", 0, True, "in-job restarts after a rank fault"),
    ("launcher.max_requeues", 0, True, "times a job may requeue itself"),
    ("launcher.max_excluded_nodes", 0, True, "nodes a run may exclude after failed health checks"),
)

#: Highest seed: numpy's ``RandomState`` takes 0 .. 2**32 - 1, and each pipeline stage adds 100 to it.
SEED_MAX = 2**32 - 1
#: Samples one run may read (``train_iters * global_batch_size``). Megatron-Core's dataset keeps a
#: shuffle index (8 bytes) and a sample index (16 bytes) per sample on every rank: 2**36 samples is a
#: 1.5 TiB index, and 2**36 x 8192 tokens is 40 times Llama 3's 15T-token pre-training. Above it the
#: iterator cannot be built (it only hangs in the index build until the hang guard fires).
MAX_TRAIN_SAMPLES = 2**36
#: Tokens the run reads must fit Megatron-Core's int64 token counters.
INT64_MAX = 2**63 - 1

#: Probability fields: 0 <= p < 1.
PROBABILITIES = ("model.hidden_dropout", "model.attention_dropout")

#: Free-text fields that must stay on one line (they reach logs, paths or the batch script).
ONE_LINE = (
    "launcher.job_name",
    "cluster.shared_fs",
    "cluster.venv",
    "cluster.container_image",
    "checkpoint.save",
    "checkpoint.load",
    "data.tokenizer",
    "data.path_to_cache",
)

#: ``#SBATCH`` values, the pattern kind each must match (``kilocard.base.shell.SBATCH_PATTERNS``) and
#: whether the field may be unset (null or empty: the directive is left out).
SBATCH_FIELDS = (
    ("launcher.job_name", "name", True),
    ("cluster.mem_per_node", "memory", False),
    ("cluster.partition", "name", True),
    ("cluster.account", "name", True),
    ("cluster.qos", "name", True),
    ("launcher.dependency", "dependency", True),
)


def get(cfg: RunConfig, dotted: str) -> object:
    """The value of a dotted field (``None`` when a section has no such field)."""
    node: object = cfg
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node


def rule_number_ranges(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Counts, rates and durations at or above their floor; dropouts in [0, 1)."""
    for field, low, inclusive, what in FLOORS:
        v = get(cfg, field)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue  # a non-finite number is NOT_FINITE (rule_finite_numbers)
        if v < low or (v == low and not inclusive):
            op = ">=" if inclusive else ">"
            yield error(
                "OUT_OF_RANGE",
                field,
                v,
                f"{field}={v} is out of range: {what} must be {op} {low:g}",
                f"set {field} to a value {op} {low:g}",
            )
    for field in PROBABILITIES:
        v = get(cfg, field)
        if isinstance(v, (int, float)) and not 0 <= v < 1:
            yield error(
                "OUT_OF_RANGE",
                field,
                v,
                f"{field}={v} is a probability and must be in [0, 1)",
                f"set {field}=0.0 (or e.g. 0.1)",
            )


def float_fields(cfg: RunConfig) -> Iterable[tuple[str, float]]:
    """``(dotted field, value)`` of every float in the config's sections."""
    for section in dataclasses.fields(cfg):
        node = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(node):
            continue
        for f in dataclasses.fields(node):
            v = getattr(node, f.name)
            if isinstance(v, float):
                yield f"{section.name}.{f.name}", v


def rule_finite_numbers(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``NOT_FINITE``: no float field is nan or infinite (a rate, a time or a bandwidth is a real number)."""
    for field, v in float_fields(cfg):
        if not math.isfinite(v):
            yield error(
                "NOT_FINITE",
                field,
                v,
                f"{field}={v} is not a finite number",
                f"set {field} to a finite number (the schema default is a good start)",
            )


def rule_seed_range(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``trainer.seed`` (plus 100 per pipeline stage) and ``data.random_seed`` fit numpy's 32-bit seed."""
    top = {"trainer.seed": SEED_MAX - 100 * (max(lay.pp, 1) - 1), "data.random_seed": SEED_MAX}
    for field, high in top.items():
        v = get(cfg, field)
        if isinstance(v, int) and v > high:
            yield error(
                "OUT_OF_RANGE",
                field,
                v,
                f"{field}={v} is out of range: numpy seeds are 0 .. 2**32 - 1 (and each pipeline stage adds 100)",
                f"set {field} to a value <= {high}, e.g. 1234",
            )


def rule_train_samples(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``TRAIN_SAMPLES``: ``train_iters * global_batch_size`` samples (and their tokens) can be indexed."""
    t = cfg.trainer
    if t.train_iters < 1 or t.global_batch_size < 1:
        return  # OUT_OF_RANGE / the batch rules name it
    samples = t.train_iters * t.global_batch_size
    tokens = samples * (max(cfg.model.seq_length, 1) + 1)
    if samples <= MAX_TRAIN_SAMPLES and tokens <= INT64_MAX:
        return
    most = max(1, min(MAX_TRAIN_SAMPLES, INT64_MAX // (max(cfg.model.seq_length, 1) + 1)) // t.global_batch_size)
    yield error(
        "TRAIN_SAMPLES",
        "trainer.train_iters",
        t.train_iters,
        f"trainer.train_iters({t.train_iters}) x trainer.global_batch_size({t.global_batch_size}) = {samples} "
        f"samples; Megatron-Core's dataset index holds at most 2**36 = {MAX_TRAIN_SAMPLES} samples "
        "(24 bytes each on every rank) and int64 tokens",
        f"set trainer.train_iters <= {most}",
    )


def rule_launcher_time(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``launcher.time`` is a positive Slurm time (``HH:MM:SS``, ``D-HH:MM:SS``, ``MM``...)."""
    problem = time_limit_problem(str(cfg.launcher.time))
    if problem:
        yield error(
            "LAUNCHER_TIME",
            "launcher.time",
            cfg.launcher.time,
            f"launcher.time={cfg.launcher.time!r}: {problem}",
            "set launcher.time=04:00:00",
        )


def rule_profile_steps(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``trainer.profile_steps`` is empty or ``[a, b]`` with 1 <= a <= b <= trainer.train_iters."""
    steps, iters = list(cfg.trainer.profile_steps), cfg.trainer.train_iters
    if not steps or (len(steps) == 2 and 1 <= steps[0] <= steps[1] <= iters):
        return
    yield error(
        "PROFILE_STEPS",
        "trainer.profile_steps",
        steps,
        f"trainer.profile_steps={steps} is not a window of steps [first, last] within 1..{iters}",
        f"set trainer.profile_steps=[a,b] with 1 <= a <= b <= {iters}, e.g. [2,3], or [] for no trace",
    )


def rule_nsys_window(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``trainer.nsys`` captures the ``trainer.profile_steps`` window: it needs one."""
    if cfg.trainer.nsys and not cfg.trainer.profile_steps:
        yield error(
            "NSYS_WINDOW",
            "trainer.nsys",
            True,
            "trainer.nsys=true captures the steps of trainer.profile_steps, which is empty",
            "set trainer.profile_steps=[a,b] (e.g. [10,12]) or trainer.nsys=false",
        )


def rule_master_port(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``launcher.master_port``, when fixed, is a TCP port 1..65535."""
    port = cfg.launcher.master_port
    if port is not None and not 1 <= port <= 65535:
        yield error(
            "OUT_OF_RANGE",
            "launcher.master_port",
            port,
            f"launcher.master_port={port} is not a TCP port (1..65535)",
            "set launcher.master_port=null (derived from the job id) or e.g. 29500",
        )


def rule_run_name(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``launcher.run_name``, when set, is one plain directory name (letters, digits, ``. _ + -``)."""
    name = cfg.launcher.run_name
    if name is None:
        return
    pattern, expected = shell.SBATCH_PATTERNS["name"]
    if not pattern.fullmatch(str(name)):
        yield error(
            "RUN_NAME",
            "launcher.run_name",
            name,
            f"launcher.run_name={name!r} is not a plain directory name; expected {expected}",
            "set launcher.run_name=my-run-1 (or leave it null for <job_name>-<UTC time>)",
        )
    elif len(str(name).encode()) > MAX_NAME_BYTES:
        yield error(
            "RUN_NAME",
            "launcher.run_name",
            f"{str(name)[:40]}...",
            f"launcher.run_name is {len(str(name).encode())} bytes long; a directory name may have at most "
            f"{MAX_NAME_BYTES} (file systems allow 255)",
            f"a launcher.run_name of at most {MAX_NAME_BYTES} characters",
        )


def _value_issue(e: shell.ShellValueError) -> Issue:
    return error(
        "SCRIPT_VALUE",
        e.field,
        "<hidden>" if "secret" in e.field else e.value,
        str(e),
        f"change {e.field} to a value of the expected form",
    )


def script_value_issues(cfg: RunConfig) -> list[Issue]:
    """Values the batch script (or a log line) would carry: one line each, ``#SBATCH`` values checked."""
    out: list[Issue] = []
    for field in ONE_LINE:
        v = get(cfg, field)
        if v is not None and shell.CONTROL.search(str(v)):
            out.append(_value_issue(shell.ShellValueError(field, v, "a single line without control characters")))
    checks: list[tuple[str, Callable[[], object]]] = [
        (f, partial(shell.optional_sbatch if o else shell.sbatch_value, f, get(cfg, f), k)) for f, k, o in SBATCH_FIELDS
    ]
    checks += [
        (f"launcher.extra_sbatch[{i}]", partial(shell.extra_sbatch, f"launcher.extra_sbatch[{i}]", o))
        for i, o in enumerate(cfg.launcher.extra_sbatch)
    ]
    for group in ("cluster", "launcher"):
        env: dict[str, str] = getattr(cfg, group).env
        for name, value in env.items():
            f = f"{group}.env.{name}"
            checks.append((f, partial(shell.env_name, f, name)))
            checks.append((f, partial(shell.quote, f, value)))
    for i, m in enumerate(cfg.cluster.container_mounts):
        f = f"cluster.container_mounts[{i}]"
        checks.append((f, partial(shell.quote, f, m)))
    seen = {i.field for i in out}
    for field, check in checks:
        if field in seen:
            continue
        try:
            check()
        except shell.ShellValueError as e:
            out.append(_value_issue(e))
            seen.add(field)
    return out


def rule_script_values(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """Validator-rule form of ``script_value_issues``."""
    return script_value_issues(cfg)


def rule_secret_names(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``SECRET_VALUE``: ``launcher.secret_env`` holds variable NAMES (the value stays in the submitting shell)."""
    for i, name in enumerate(cfg.launcher.secret_env):
        if not shell.ENV_NAME.fullmatch(str(name)):
            yield error(
                "SECRET_VALUE",
                f"launcher.secret_env[{i}]",
                "<hidden>",
                "launcher.secret_env holds variable NAMES (the value is read from the submitting shell)",
                "launcher.secret_env=[WANDB_API_KEY] and `export WANDB_API_KEY=...` before submitting",
            )


def rule_wandb_mode(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``trainer.wandb_mode`` is one of ``WANDB_MODES`` (checked whether or not W&B is on: a typo waits otherwise)."""
    mode = cfg.trainer.wandb_mode
    if mode not in WANDB_MODES:
        yield error(
            "WANDB_MODE",
            "trainer.wandb_mode",
            mode,
            f"trainer.wandb_mode={mode!r} is not a W&B mode (expected one of {', '.join(WANDB_MODES)})",
            "trainer.wandb_mode=offline (sync later with wandb sync) or online",
        )


RULES = (
    rule_number_ranges,
    rule_finite_numbers,
    rule_seed_range,
    rule_train_samples,
    rule_launcher_time,
    rule_profile_steps,
    rule_nsys_window,
    rule_master_port,
    rule_run_name,
    rule_script_values,
    rule_secret_names,
    rule_wandb_mode,
)
