"""Shared pytest fixtures, and the ``unit`` tier (docs/testing.md).

A test is in the ``unit`` tier unless it carries a marker of ``NOT_UNIT`` or uses a fixture of
``PROCESS_FIXTURES``: the hook below marks it, so ``pytest -m unit`` (``scripts/test.sh --fast``)
selects it. A unit test starts no Python process and imports none of ``HEAVY_MODULES``; the guard
below fails one that does (mark it ``integration``, or import lazily), and ``-m unit`` refuses a
test module that imports one of them at the top (collecting would pay for it).
"""

import functools
import os
import pathlib
import re
import sys

import pytest

NOT_UNIT = ("slow", "slurm", "gpu", "mcore_range", "integration")
"""Markers that keep a test out of the unit tier."""
PROCESS_FIXTURES = frozenset({"local_slurm", "kilocard_run", "finished_tiny_run"})
"""Fixtures that start processes (a Slurm cluster, ``kilocard run``): a test using one is not a unit test."""
HEAVY_MODULES = ("torch", "megatron", "transformers")
"""Imported by no unit test, and by no test module at collection time."""

_python_starts: list[str] = []
"""Command lines of the Python processes started since the current test began (the audit hook fills it)."""


_WHEEL_BUILD = "-m pip wheel"
"""The code snapshot's wheel (``launcher.packaging=snapshot``): the first ``sbatch`` of a session builds it and
kilocard keeps it for the process, so one build per session is allowed to whichever unit test comes first."""
_wheel_builds: list[str] = []


def _audit(event, args):
    """Note each Python interpreter (or ``kilocard``/``torchrun`` script) a test starts."""
    if event == "subprocess.Popen":
        argv = [str(a) for a in (args[1] if isinstance(args[1], list | tuple) else [args[1]])]
        exe = os.path.basename(str(args[0] or (argv[0] if argv else "")))
        if exe.startswith("python") or exe in ("kilocard", "torchrun") or str(args[0]) == sys.executable:
            cmdline = " ".join(argv)
            if _WHEEL_BUILD in cmdline and not _wheel_builds:
                _wheel_builds.append(cmdline)
                return
            _python_starts.append(cmdline[:200])


def pytest_configure(config):
    """The suite tests the shipped configs: a site's KILOCARD_CONFIG_PATH in the caller's shell would add its
    recipes to every catalog test (tests that need a site directory set the variable themselves)."""
    os.environ.pop("KILOCARD_CONFIG_PATH", None)
    _check_expected_mcore()
    sys.addaudithook(_audit)
    global _unit_only
    _unit_only = (config.option.markexpr or "").strip() == "unit"


def _check_expected_mcore():
    """``KILOCARD_EXPECT_MCORE`` (scripts/test.sh's second pass): the megatron-core that this session and every
    process it starts would import is that version, or the session stops before a test runs. Without this check a
    missing ``.oracle/`` ran the megatron-core 0.19.2 pass on 0.16.1 and passed. Read from the files, not imported."""
    expected = os.environ.get("KILOCARD_EXPECT_MCORE")
    if not expected:
        return
    from importlib.metadata import PackageNotFoundError, distribution

    first = next((p for p in sys.path if (pathlib.Path(p or ".") / "megatron/core/__init__.py").is_file()), None)
    try:
        dist = distribution("megatron-core")
        found, home = dist.version, pathlib.Path(str(dist.locate_file("")))
    except PackageNotFoundError:
        found, home = "none", None
    if found != expected or first is None or home is None or pathlib.Path(first or ".").resolve() != home.resolve():
        raise pytest.UsageError(
            f"KILOCARD_EXPECT_MCORE={expected}: megatron-core {found} installed at {home}, imported from {first}; "
            f"fix: bash scripts/install_oracle.sh (megatron-core {expected} into .oracle/), first on PYTHONPATH"
        )


def _heavy_loaded():
    return {m for m in HEAVY_MODULES if m in sys.modules}


def pytest_collectreport(report):
    """Under ``-m unit``: refuse a test module whose import pulled in torch, megatron or transformers."""
    heavy = _heavy_loaded()
    if heavy and report.nodeid.endswith(".py") and _unit_only:
        raise pytest.UsageError(
            f"{report.nodeid} imports {', '.join(sorted(heavy))} when collected: the unit tier must not pay for it; "
            f"fix: import it inside the test or fixture that needs it"
        )


_unit_only = False
"""Whether this session selects the unit tier alone (``-m unit``)."""


def pytest_ignore_collect(collection_path, config):
    """Under ``-m unit``, skip importing a test module whose ``pytestmark`` keeps all its tests out of the tier
    (its imports, torch's among them, would cost the collection seconds for nothing)."""
    if _unit_only and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return bool(_module_marks(collection_path) & set(NOT_UNIT)) or None
    return None


def _module_marks(path):
    """The marker names of a module's top-level ``pytestmark`` (read from its source, not imported)."""
    import ast

    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            return {
                n.attr
                for n in ast.walk(node.value)
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
            }
    return set()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark every test the unit tier holds (before ``-m`` deselects); on a pytest-xdist worker, order the tests
    for the scheduler below."""
    for item in items:
        if not any(item.get_closest_marker(m) for m in NOT_UNIT) and not PROCESS_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.unit)
    if hasattr(config, "workerinput"):
        slow = {worker_group(i.nodeid) for i in items if i.get_closest_marker("slow")}
        items.sort(key=lambda i: 0 if (g := worker_group(i.nodeid)) == SLURM_GROUP else 1 if g in slow else 2)


# --- two workers (scripts/test.sh: pytest-xdist, -n 2) --------------------------------------------
SLURM_GROUP = "slurm"
"""The group of every test that needs a local Slurm controller: one worker runs them all, one after another
(two ``slurm-up.sh`` at once would share and then stop each other's daemons)."""
DOCS_MODULE = "tests/docs/test_docs_commands.py"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's scope scheduler with ``worker_group`` as the scope: a group runs whole, in order, on one
    worker. (``--dist loadgroup`` would do it from ``xdist_group`` marks, but pytest-xdist 3.8 cannot rename the
    test ids of pytest 9, so its groups are lost.) The workers' order is kept: Slurm first, then groups with slow
    tests, so the longest work starts first."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def worker_group(nodeid):
    """``slurm`` for a module marked ``slurm``; one group per page of the docs test (``worker_group`` there);
    otherwise the test's module (module fixtures are made once, and a module keeps its order)."""
    module = nodeid.split("::")[0]
    if module == DOCS_MODULE and (page := re.search(r"\[(.+):\d+\]$", nodeid)):
        return _docs_test().worker_group(page[1])
    return SLURM_GROUP if module in _slurm_modules() else module


@functools.cache
def _slurm_modules():
    """Test modules (paths as in test ids) whose ``pytestmark`` or tests say ``slurm``."""
    root = pathlib.Path(__file__).parent
    return {
        str(p.relative_to(root.parent))
        for p in root.rglob("test_*.py")
        if p.name != pathlib.Path(DOCS_MODULE).name and "pytest.mark.slurm" in p.read_text()
    }


@functools.cache
def _docs_test():
    """The docs test module, loaded by path for its ``worker_group`` (the controller collects nothing)."""
    import importlib.util

    path = pathlib.Path(__file__).parent / "docs" / "test_docs_commands.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("_docs_groups", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
    spec.loader.exec_module(module)
    return module


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """What was loaded before a unit test and its fixtures ran (``_unit_tier_guard`` compares)."""
    if item.get_closest_marker("unit") is not None:
        item.stash[_LOADED_BEFORE] = _heavy_loaded()
        del _python_starts[:]


_LOADED_BEFORE = pytest.StashKey[set]()


@pytest.fixture(autouse=True)
def _unit_tier_guard(request):
    """A unit test that starts a Python process or imports a heavy module fails, naming what it did."""
    yield
    before = request.node.stash.get(_LOADED_BEFORE, None)
    if before is None:
        return
    imported = _heavy_loaded() - before
    if _python_starts or imported:
        did = f"started {_python_starts[0]!r}" if _python_starts else f"imported {', '.join(sorted(imported))}"
        pytest.fail(f"unit test {did}: mark it integration (tests/conftest.py, docs/testing.md)", pytrace=False)


@pytest.fixture(scope="session")
def all_recipes():
    """Every shipped recipe composed once, as ``{name: RunConfig}`` (Hydra composition is slow)."""
    from kilocard.config.compose import recipe_catalog
    from kilocard.recipes import compose_recipes

    names = list(recipe_catalog())
    return dict(zip(names, compose_recipes(names), strict=False))


# --- a real Slurm cluster on this machine (scripts/slurm-up.sh / slurm-down.sh) -------------------
def slurm_skip_reason():
    """Why the local-Slurm tests cannot run here, or ``None``; CI runs as root with apt, so they run."""
    import os
    import shutil

    if os.geteuid() != 0:
        return "needs root: scripts/slurm-up.sh installs Debian's slurm packages and starts slurmctld/slurmd"
    if shutil.which("sbatch") is None and shutil.which("apt-get") is None:
        return "Slurm is not installed and apt-get is not available to install it"
    return None


def run_slurm_script(name, env_extra, timeout=300):
    """Run scripts/<name> with extra environment; fail the test session with its output on error."""
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / name
    proc = subprocess.run(
        ["bash", str(script)], env={**os.environ, **env_extra}, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        pytest.fail(f"{name} failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def local_slurm():
    """Real slurmctld + 6 slurmd nodes (n1..n6, partition ``local``) via scripts/slurm-up.sh; stopped
    at the end of the session unless it was already running before."""
    import subprocess

    reason = slurm_skip_reason()
    if reason:
        pytest.skip(reason)
    env = {"KILOCARD_SLURM_NODES": "6"}
    ping = (
        subprocess.run(["timeout", "10", "scontrol", "ping"], capture_output=True, text=True)
        if __import__("shutil").which("scontrol")
        else None
    )
    was_up = ping is not None and "is UP" in ping.stdout
    run_slurm_script("slurm-up.sh", env)
    yield {"partition": "local", "nodes": 6}
    if not was_up:
        run_slurm_script("slurm-down.sh", env, timeout=120)


# --- the trainer on local CPU ranks (kilocard run / python -m kilocard.train) ----------------------
class KilocardRun:
    """Runs ``kilocard run`` (torchrun, gloo) in a private working directory with a private TMPDIR."""

    def __init__(self, workdir):
        self.workdir = workdir

    def env(self, **extra):
        """Environment for a launch: one thread per rank, TMPDIR inside the test's directory."""
        import os

        tmp = self.workdir / "tmp"
        tmp.mkdir(exist_ok=True)
        return {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp), **extra}

    def start(self, *args, **env):
        """Start ``kilocard run ARGS`` and return the Popen (stdout piped, text)."""
        import subprocess
        import sys

        cmd = [sys.executable, "-m", "kilocard.cli", "run", *args]
        return subprocess.Popen(
            cmd, cwd=self.workdir, env=self.env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def __call__(self, *args, timeout=300, **env):
        """Run ``kilocard run ARGS`` to the end; return (exit code, output, run dir or None)."""
        proc = self.start(*args, **env)
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out, self.run_dir_of(out)

    def run_dir_of(self, out):
        """The run directory printed on the ``run dir:`` line, or None."""
        for line in out.splitlines():
            if line.startswith("run dir: "):
                p = self.workdir / line[len("run dir: ") :].strip()
                return p
        return None


@pytest.fixture
def kilocard_run(tmp_path):
    """Launch ``kilocard run`` on local CPU ranks from a private directory (see ``KilocardRun``)."""
    return KilocardRun(tmp_path)


SHARED_SECRET = ("KC_SHARED_RUN_SECRET", "s3cr3t-v4lue-shared-run")
"""Name and value of the secret the shared run reads from its environment (``launcher.env``, canonical form)."""
SHARED_RUN_ARGS = (
    "recipe=tiny_gpt",
    "trainer.train_iters=3",
    "trainer.tensorboard=false",
    "trainer.profile_steps=[2,3]",
    "checkpoint.save=ckrel",
    f"+launcher.env.{SHARED_SECRET[0]}='${{oc.env:{SHARED_SECRET[0]}}}'",
)
"""One short single-rank run that several tests only inspect or resume: a profiled window, a relative
``checkpoint.save`` and a secret in ``launcher.env``."""


class FinishedRun:
    """A ``kilocard run`` that ended: its launcher (``KilocardRun``), exit code, output and run directory."""

    def __init__(self, launcher, code, out, run_dir):
        self.launcher, self.code, self.out, self.run_dir = launcher, code, out, run_dir


@pytest.fixture(scope="session")
def finished_tiny_run(tmp_path_factory):
    """``kilocard run`` of ``SHARED_RUN_ARGS`` once per session (training a tiny model costs a process, torch
    and Megatron-Core start-up each time). Tests read it or resume it elsewhere; none may change what it wrote."""
    launcher = KilocardRun(tmp_path_factory.mktemp("finished_tiny_run"))
    code, out, run_dir = launcher(*SHARED_RUN_ARGS, **dict([SHARED_SECRET]))
    return FinishedRun(launcher, code, out, run_dir)
