"""Reserved environment names (issue 12, item 6): the config cannot override the batch script's own variables."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.launch.render import render_script
from kilocard.plan import build_plan
from kilocard.validate import validate
from kilocard.validate.environment import reserved_reason
from run_configs import cfg_of

RESERVED = [
    "RUN_DIR",
    "SLURM_RESTART_COUNT",
    "MAX_REQUEUES",
    "EXIT_RETRY",
    "CHAIN_LINK",
    "IFS",
    "PATH",
    "BASH_ENV",
    "KILOCARD_RUN_DIR",
    "MASTER_PORT",
    "RANK",
    "SRUN_CPUS_PER_TASK",
    # names that change how bash, the dynamic loader or Python start (issue 24, item 6):
    "EXECIGNORE",  # EXECIGNORE='*/srun' made the batch script's srun "command not found"
    "POSIXLY_CORRECT",
    "TMPDIR",  # `kilocard run` gives every run its own
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "GLIBC_TUNABLES",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONSAFEPATH",
    "PYTHONINSPECT",
]


@pytest.mark.parametrize("name", RESERVED)
@pytest.mark.parametrize("where", ["launcher.env", "cluster.env", "launcher.secret_env"])
def test_reserved_name_is_refused_naming_the_field(name, where):
    values = {where: [name]} if where.endswith("secret_env") else {where: {name: "x"}}
    report = validate(cfg_of(values))
    field = f"{where}[0]" if where.endswith("secret_env") else f"{where}.{name}"
    assert [(i.code, i.field) for i in report.errors] == [("RESERVED_ENV", field)], report.errors


@pytest.mark.parametrize(
    "name",
    [
        "NCCL_DEBUG",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "WANDB_API_KEY",
        "OMP_NUM_THREADS",
        "PYTHONUNBUFFERED",  # the vetted PYTHON* names only change output and diagnostics
        "PYTHONFAULTHANDLER",
        "PYTHONWARNINGS",
    ],
)
def test_ordinary_names_are_accepted(name):
    assert validate(cfg_of({"launcher.env": {name: "1"}, "launcher.secret_env": [name]})).errors == []


#: glibc's UNSECURE_ENVVARS (sysdeps/generic/unsecvars.h): every one reserved.
GLIBC_UNSECURE_ENVVARS = """GCONV_PATH GETCONF_DIR GLIBC_TUNABLES HOSTALIASES LD_AUDIT LD_DEBUG LD_DEBUG_OUTPUT
LD_DYNAMIC_WEAK LD_HWCAP_MASK LD_LIBRARY_PATH LD_ORIGIN_PATH LD_PRELOAD LD_PROFILE LD_SHOW_AUXV LD_USE_LOAD_BIAS
LOCALDOMAIN LOCPATH MALLOC_TRACE NIS_PATH NLSPATH RESOLV_HOST_CONF RES_OPTIONS TMPDIR TZDIR""".split()


@pytest.mark.parametrize("name", GLIBC_UNSECURE_ENVVARS)
def test_glibcs_whole_unsecure_environment_list_is_reserved(name):
    """``+launcher.env.HOSTALIASES=...`` was exported by the batch script: it can redirect what MASTER_ADDR
    resolves to; ``RES_OPTIONS``, ``NLSPATH`` and ``TZDIR`` passed too."""
    assert reserved_reason(name) is not None
    report = validate(cfg_of({"launcher.env": {name: "/tmp/x"}}))
    assert [(i.code, i.field) for i in report.errors] == [("RESERVED_ENV", f"launcher.env.{name}")], report.errors


def script_names(script: str) -> set[str]:
    """Every variable a batch script assigns (``NAME=``, ``export NAME``) or reads (``$NAME``, ``${NAME``)."""
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    assigned = re.findall(r"(?:^|[\s;{(])(?:export\s+)?([A-Za-z_]\w*)=", code, flags=re.M)
    read = re.findall(r"\$\{?([A-Za-z_]\w*)", code)
    return set(assigned) | set(read)


def test_every_variable_of_the_rendered_script_is_reserved():
    """Rendered with a venv (``$VIRTUAL_ENV``) and a derived port: nothing the script uses is settable."""
    cfg = to_run_config(compose(["recipe=tiny_gpt", "launcher=slurm", "cluster.venv=/opt/venv"]))
    script = render_script(cfg, build_plan(cfg), Path("/srv/runs/r1"))
    names = script_names(script) - {"OMP_NUM_THREADS"}  # the plan's own default, which cluster.env may change
    assert {"RUN_DIR", "MAX_REQUEUES", "GOT_TERM", "SLURM_JOB_ID", "VIRTUAL_ENV", "rc"} <= names
    assert sorted(n for n in names if reserved_reason(n) is None) == []
