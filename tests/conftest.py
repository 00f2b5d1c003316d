"""Shared pytest fixtures."""

import os

import pytest


def pytest_configure(config):
    """The suite tests the shipped configs: a site's KILOCARD_CONFIG_PATH in the caller's shell would add its
    recipes to every catalog test (tests that need a site directory set the variable themselves)."""
    os.environ.pop("KILOCARD_CONFIG_PATH", None)


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
