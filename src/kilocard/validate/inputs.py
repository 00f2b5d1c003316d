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
from kilocard.config.domains import SEED_MAX
from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.paths import MAX_NAME_BYTES
from kilocard.validate.issues import Issue, error

#: Samples one run may read (``train_iters * global_batch_size``). Megatron-Core's dataset keeps a
#: shuffle index (8 bytes) and a sample index (16 bytes) per sample on every rank: 2**36 samples is a
#: 1.5 TiB index, and 2**36 x 8192 tokens is 40 times Llama 3's 15T-token pre-training. Above it the
#: iterator cannot be built (it only hangs in the index build until the hang guard fires).
MAX_TRAIN_SAMPLES = 2**36
#: Tokens the run reads must fit Megatron-Core's int64 token counters.
INT64_MAX = 2**63 - 1

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
    """``trainer.seed`` plus 100 per pipeline stage fits numpy's 32-bit seed."""
    high, field, v = SEED_MAX - 100 * (max(lay.pp, 1) - 1), "trainer.seed", cfg.trainer.seed
    if v > high:
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


RULES = (
    rule_finite_numbers,
    rule_seed_range,
    rule_train_samples,
    rule_launcher_time,
    rule_profile_steps,
    rule_nsys_window,
    rule_run_name,
    rule_script_values,
    rule_secret_names,
)
