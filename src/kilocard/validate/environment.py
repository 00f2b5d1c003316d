"""Reserved environment names: ``cluster.env``, ``launcher.env`` and ``launcher.secret_env`` may not set them.

The batch script (``slurm/train.sbatch.tmpl``) exports the config's environment before its own
logic runs, and the ranks inherit it: a ``+launcher.env.RUN_DIR=/other`` or ``MAX_REQUEUES`` would
change where the job runs or how often it requeues, ``IFS`` or ``PATH`` how the script itself
parses and finds ``srun``, ``SLURM_RESTART_COUNT`` or ``RANK`` where a rank thinks it sits,
``HOSTALIASES`` what ``MASTER_ADDR`` resolves to. Every name the script assigns or reads, the trainer
reads, the shell treats specially, or glibc counts as unsecure (``GLIBC_UNSECURE``) is refused.
``tests/validate/test_validate_environment.py`` checks that every variable the template assigns is here.
"""

from __future__ import annotations

from collections.abc import Iterable

from kilocard.config.schema import RunConfig
from kilocard.layout import Layout
from kilocard.validate.issues import Issue, error

#: Names the batch script assigns or reads for its own logic.
SCRIPT_NAMES = frozenset(
    {
        "RUN_DIR",
        "CHAIN_LENGTH",
        "CHAIN_LINK",
        "REQUEUE",
        "MAX_REQUEUES",
        "EXIT_DONE",
        "EXIT_RETRY",
        "EXIT_FAULT",
        "EXIT_BUSY",
        "GOT_TERM",
        "rc",
        "prc",
        "VIRTUAL_ENV",
        "PYTHONPATH",  # the snapshot of kilocard's code goes first on it (launcher.packaging=snapshot)
    }
)
#: Names torch.distributed / torchrun and the trainer read to place a rank.
RANK_NAMES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK"})
#: Shell variables that change how bash parses, finds commands or starts (PATH-like and specials).
SHELL_NAMES = frozenset(
    {
        "IFS",
        "PATH",
        "CDPATH",
        "ENV",
        "SHELLOPTS",
        "GLOBIGNORE",
        "PS4",
        "PWD",
        "OLDPWD",
        "HOME",
        "UID",
        "EUID",
        "PPID",
        "RANDOM",
        "SECONDS",
        "LINENO",
        "OPTIND",
        "OPTARG",
        "OPTERR",
        "EXECIGNORE",  # bash skips matching commands: EXECIGNORE='*/srun' is `srun: command not found`
        "POSIXLY_CORRECT",  # bash and GNU tools switch to POSIX mode
        "FUNCNEST",
        "GLOBSORT",
        "TMOUT",
        "TMPDIR",  # `kilocard run` gives each run its own; under Slurm the node's own
    }
)
#: Prefixes of names the dynamic loader reads (``LD_PRELOAD``, ``LD_LIBRARY_PATH``, ``LD_AUDIT``...),
#: plus glibc's own start-up switches.
LOADER_PREFIXES = ("LD_", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "MALLOC_")
#: glibc's unsecure-environment list (``UNSECURE_ENVVARS``, sysdeps/generic/unsecvars.h): what the C library
#: strips from a set-user-ID program because it redirects loaded code, name resolution (``HOSTALIASES``,
#: ``RES_OPTIONS``, ``LOCALDOMAIN``: what ``MASTER_ADDR`` resolves to), message catalogs or time zones.
GLIBC_UNSECURE = frozenset(
    {
        "GCONV_PATH",
        "GETCONF_DIR",
        "GLIBC_TUNABLES",
        "HOSTALIASES",
        "LD_AUDIT",
        "LD_DEBUG",
        "LD_DEBUG_OUTPUT",
        "LD_DYNAMIC_WEAK",
        "LD_HWCAP_MASK",
        "LD_LIBRARY_PATH",
        "LD_ORIGIN_PATH",
        "LD_PRELOAD",
        "LD_PROFILE",
        "LD_SHOW_AUXV",
        "LD_USE_LOAD_BIAS",
        "LOCALDOMAIN",
        "LOCPATH",
        "MALLOC_TRACE",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TMPDIR",
        "TZDIR",
    }
)
#: ``PYTHON*`` names that only change Python's output or diagnostics; every other ``PYTHON*``
#: (``PYTHONHOME``, ``PYTHONSTARTUP``, ``PYTHONSAFEPATH``, ``PYTHONINSPECT``...) changes which code
#: runs or how the interpreter starts, and is reserved.
PYTHON_VETTED = frozenset(
    {"PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONWARNINGS", "PYTHONDONTWRITEBYTECODE", "PYTHONTRACEMALLOC"}
)
#: Prefixes of names owned by kilocard, Slurm (job facts and srun/sbatch input variables), the
#: rendezvous, torchrun, PMI and bash itself (BASH_ENV, BASH_FUNC_*, BASH_XTRACEFD...).
RESERVED_PREFIXES = (
    "KILOCARD_",
    "SLURM_",
    "SRUN_",
    "SBATCH_",
    "SALLOC_",
    "MASTER_",
    "TORCHELASTIC_",
    "PMI_",
    "PMIX_",
    "BASH",
)


def reserved_reason(name: str) -> str | None:
    """Why ``name`` may not be set from the config, or ``None`` when it may."""
    if name in SCRIPT_NAMES:
        return "the batch script assigns it for its own logic"
    if name in RANK_NAMES:
        return "torchrun / the batch script set it to place each rank"
    if name in SHELL_NAMES:
        return "the shell uses it to parse the script and find commands"
    if name in GLIBC_UNSECURE:
        return (
            "the C library reads it in every process of the job (it is on glibc's unsecure-environment list: it "
            "redirects loaded code, name resolution, message catalogs or time zones)"
        )
    prefix = next((p for p in RESERVED_PREFIXES if name.startswith(p)), None)
    if prefix:
        return f"names starting with {prefix} belong to kilocard, Slurm, the rendezvous or the shell"
    if name.startswith(LOADER_PREFIXES):
        return "the dynamic loader (or the C library) reads it when every process of the job starts"
    if name.startswith("PYTHON") and name not in PYTHON_VETTED:
        return "it changes how the Python interpreter starts or which code it runs; allowed: " + ", ".join(
            sorted(PYTHON_VETTED)
        )
    return None


def _configured_names(cfg: RunConfig) -> Iterable[tuple[str, str]]:
    """``(field, name)`` of every variable the config would set in the ranks' environment."""
    for group, env in (("cluster", cfg.cluster.env), ("launcher", cfg.launcher.env)):
        for name in env:
            yield f"{group}.env.{name}", str(name)
    for i, name in enumerate(cfg.launcher.secret_env):
        yield f"launcher.secret_env[{i}]", str(name)


def rule_reserved_env(cfg: RunConfig, lay: Layout) -> Iterable[Issue]:
    """``RESERVED_ENV``: no configured variable overrides one the script, the trainer or the shell owns."""
    for field, name in _configured_names(cfg):
        why = reserved_reason(name)
        if why:
            yield error(
                "RESERVED_ENV",
                field,
                name,
                f"{name} is reserved: {why}; setting it would override kilocard's own value",
                f"remove {name} from launcher.secret_env" if "secret" in field else f"remove it ('~{field}')",
            )


RULES = (rule_reserved_env,)
