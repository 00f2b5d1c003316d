"""Rendering of the Slurm batch script: golden files, process layout, environment, containers.

Golden files live in tests/golden/sbatch/; after an intended change regenerate them with
``KILOCARD_UPDATE_GOLDEN=1 pytest tests/launch/test_sbatch_render.py`` and review the diff.
The run directory is a fixed path (``/shared/runs/<case>``), so the scripts need no normalising.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from kilocard.base.shell import ShellValueError
from kilocard.base.slurmtime import time_to_seconds
from kilocard.config.compose import compose, to_run_config
from kilocard.launch.render import render_script
from kilocard.plan import build_plan

GOLDEN = Path(__file__).parents[1] / "golden" / "sbatch"
CASES = {
    "tiny_gpt_local_cpu_2x2": [
        "recipe=tiny_gpt",
        "launcher=slurm",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        "cluster.venv=/opt/kilocard/venv",
        "launcher.time=00:30:00",
        "launcher.signal_lead_s=60",
    ],
    "llama3_70b_h100": ["recipe=llama3_70b", "cluster=h100_dgx"],
    "llama31_405b_h100_2048": [
        "recipe=llama31_405b",
        "cluster=h100_dgx",
        "cluster.nodes=2048",
        "launcher.time=04:00:00",
    ],
    "gpt3_175b_site": [
        "recipe=gpt3_175b",
        "cluster.partition=batch",
        "cluster.account=llm-proj",
        "cluster.qos=high",
        "parallel.pipeline_model_parallel_size=8",
    ],
    "deepseek_v3_gb200": ["recipe=deepseek_v3", "cluster=gb200_nvl72"],
    "moe_10t_62500_nodes": ["recipe=moe_10t"],
    "tiny_gpt_secrets_dependency": [
        "recipe=tiny_gpt",
        "launcher=slurm",
        "launcher.secret_env=[WANDB_API_KEY]",
        "launcher.dependency=afterok:41",
        "launcher.extra_sbatch=['--constraint=h100']",
        "launcher.requeue=false",
        "launcher.master_port=29500",
        "+launcher.env.RUN_TAG='a b'",
    ],
    # kilocard from an image built by `kilocard image`; data and checkpoints outside the profile's mounts
    "llama3_8b_h100_image_data": [
        "recipe=llama3_8b",
        "cluster=h100_dgx",
        "cluster.container_image=/lustre/images/kilocard-0.1.0.sqsh",
        "launcher.packaging=image",
        "data.type=indexed",
        "data.data_path=[0.3,/datasets/web/shard_text_document,0.7,/datasets/code/c_text_document]",
        "checkpoint.save=/lustre/ckpt/llama3_8b",
        "precision=fp8",
    ],
    # in-job restarts: one NVRx ft_launcher per node, the run's code from the ranks' records, bad nodes excluded
    "tiny_gpt_local_cpu_2x2_injob": [
        "recipe=tiny_gpt",
        "launcher=slurm",
        "cluster.nodes=2",
        "cluster.gpus_per_node=2",
        "cluster.venv=/opt/kilocard/venv",
        "launcher.time=00:30:00",
        "launcher.signal_lead_s=60",
        "launcher.max_restarts=2",
    ],
    # in-job restarts in a container on GPUs: the exit-code helper runs inside the image
    "llama3_70b_h100_injob": ["recipe=llama3_70b", "cluster=h100_dgx", "launcher.max_restarts=3"],
    # bare metal, kilocard from the site venv (packaging=none): the preflight still checks it
    "tiny_gpt_venv_none": [
        "recipe=tiny_gpt",
        "launcher=slurm",
        "cluster.venv=/opt/site/venv",
        "launcher.packaging=none",
    ],
}
CHAIN = {"tiny_gpt_secrets_dependency": 3}


def render_case(name: str) -> str:
    rc = to_run_config(compose(CASES[name]))
    return render_script(rc, build_plan(rc), Path(f"/shared/runs/{name}"), CHAIN.get(name, 1))


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_script(name):
    """The rendered script equals its reviewed golden file and is valid bash."""
    text = render_case(name)
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("KILOCARD_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing; run with KILOCARD_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{name}: rendered script differs from {path}"
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def sbatch_opts(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --") :].partition("=")
            out[key] = value
    return out


def test_h100_layout_and_environment():
    """8 ranks and 8 GPUs per node, 14 CPUs per rank, TP>1 on Hopper -> CUDA_DEVICE_MAX_CONNECTIONS=1."""
    text = render_case("llama31_405b_h100_2048")
    opts = sbatch_opts(text)
    assert opts["nodes"] == "2048" and opts["ntasks-per-node"] == "8" and opts["gpus-per-node"] == "8"
    assert opts["cpus-per-task"] == "14" and "exclusive" in opts and opts["signal"] == "USR1@300"
    assert opts["output"].endswith("/logs/slurm-%j.out") and opts["open-mode"] == "append" and "requeue" in opts
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    assert "--ntasks=16384 " in text
    assert "scontrol show hostnames" in text and "MASTER_PORT=$(( 20000 + (SLURM_JOB_ID" in text


@pytest.mark.parametrize("job,restarts", [(1, 0), (1714, 3), (4_294_967_294, 0), (999_999_937, 17)])
def test_derived_master_port_stays_below_the_ephemeral_range(job, restarts):
    """The batch script's own MASTER_PORT is 20000-31999 for any job id: the kernel hands out 32768 and up to
    outgoing connections, which could already hold the port when the rendezvous binds it."""
    (export,) = [line for line in render_case("tiny_gpt_local_cpu_2x2").splitlines() if "MASTER_PORT=" in line]
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": str(job), "SLURM_RESTART_COUNT": str(restarts)}
    out = subprocess.run(["bash", "-c", f"{export}; echo $MASTER_PORT"], env=env, text=True, capture_output=True)
    assert 20000 <= int(out.stdout) < 32000, out


def test_container_through_pyxis_and_bare_metal():
    """A profile with an image runs srun inside it (run root mounted); no image means the venv."""
    h100 = render_case("llama3_70b_h100")
    srun = next(line for line in h100.splitlines() if line.startswith("srun "))
    assert "--container-image=nvcr.io/nvidia/nemo:26.04" in srun
    assert "--container-mounts=/lustre:/lustre,/shared/runs:/shared/runs" in srun
    assert '--container-workdir="$RUN_DIR"' in srun and "source " not in h100
    local = render_case("tiny_gpt_local_cpu_2x2")
    assert "source /opt/kilocard/venv/bin/activate" in local and "--container" not in local


def test_cpu_cluster_requests_no_gpus():
    """On gpu: cpu the ranks are CPU processes: no GRES request, one task per rank."""
    text = render_case("tiny_gpt_local_cpu_2x2")
    opts = sbatch_opts(text)
    assert "gpus-per-node" not in opts and "gres" not in opts
    assert opts["nodes"] == "2" and opts["ntasks-per-node"] == "2"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in text


def test_blackwell_does_not_force_one_connection():
    """GB200 (compute capability 10) needs no CUDA_DEVICE_MAX_CONNECTIONS from the layout."""
    rc = to_run_config(compose(["recipe=deepseek_v3", "cluster=gb200_nvl72"]))
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in build_plan(rc).env
    rc = to_run_config(compose(["recipe=deepseek_v3", "cluster=h100_dgx"]))
    assert build_plan(rc).env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


@pytest.mark.parametrize("gpu", ["h100-sxm5-80gb", "mi300x", "a-gpu-kilocard-does-not-know", "b200-sxm-180gb"])
def test_one_connection_rule_is_one_for_the_plan_and_the_validator(gpu):
    """The launch plan and the validator apply ``topology.one_device_connection`` alike, for an unknown or
    AMD GPU too; a variable the plan sets itself is never a warning; a user's other value is."""
    from kilocard.topology import one_device_connection
    from kilocard.validate import validate

    base = ["recipe=llama3_8b", "cluster=h100_dgx", f"cluster.gpu={gpu}", "parallel.tensor_model_parallel_size=2"]
    rc = to_run_config(compose(base))
    wanted = one_device_connection(gpu, 2, 1)
    assert wanted == (gpu != "b200-sxm-180gb")
    assert build_plan(rc).env.get("CUDA_DEVICE_MAX_CONNECTIONS") == ("1" if wanted else None)
    assert not [i for i in validate(rc).issues if i.code == "CUDA_DEVICE_MAX_CONNECTIONS"]
    other = to_run_config(compose([*base, "+launcher.env.CUDA_DEVICE_MAX_CONNECTIONS=8"]))
    flagged = [i.field for i in validate(other).issues if i.code == "CUDA_DEVICE_MAX_CONNECTIONS"]
    assert flagged == (["launcher.env.CUDA_DEVICE_MAX_CONNECTIONS"] if wanted else [])
    assert build_plan(other).env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"  # the user's value wins, flagged above


def test_env_precedence_launcher_over_cluster():
    """launcher.env overrides cluster.env, which overrides the layout defaults."""
    rc = to_run_config(compose(["recipe=llama3_70b", "+cluster.env.NCCL_DEBUG=INFO", "+launcher.env.NCCL_DEBUG=TRACE"]))
    assert build_plan(rc).env["NCCL_DEBUG"] == "TRACE"
    rc = to_run_config(compose(["recipe=llama3_70b", "+cluster.env.NCCL_DEBUG=INFO"]))
    assert build_plan(rc).env["NCCL_DEBUG"] == "INFO"


def test_secret_names_only_and_chain_comments():
    """Secrets appear by name (a presence check), never by value; chain length is baked in."""
    text = render_case("tiny_gpt_secrets_dependency")
    assert '[ -n "${WANDB_API_KEY+set}" ]' in text
    assert "CHAIN_LENGTH=3" in text and "REQUEUE=0" in text and "export MASTER_PORT=29500" in text
    assert "export RUN_TAG='a b'" in text
    opts = sbatch_opts(text)
    assert opts["dependency"] == "afterok:41" and opts["constraint"] == "h100" and "no-requeue" in opts


def test_exit_code_contract_is_documented_in_the_script():
    """The script's comments carry every code of kilocard.exitcodes."""
    from kilocard import exitcodes

    text = render_case("tiny_gpt_local_cpu_2x2")
    for name in ("DONE", "RETRY", "FAULT", "BAD_CONFIG", "BAD_CKPT", "CRASH"):
        code = getattr(exitcodes, name)
        assert any(line.startswith("#") and f" {code} " in line and name in line for line in text.splitlines()), name


@pytest.mark.parametrize(
    "value,seconds", [("30", 1800), ("01:30", 90), ("04:00:00", 14400), ("1-00", 86400), ("2-01:00:10", 176410)]
)
def test_slurm_time_formats(value, seconds):
    assert time_to_seconds("launcher.time", value) == seconds


def test_bad_time_rejected():
    with pytest.raises(ShellValueError, match="launcher.time"):
        time_to_seconds("launcher.time", "4 hours")


def test_container_mounts_are_derived_and_never_redundant():
    """The profile's /lustre mount covers its own shared_fs, checkpoints and data under it: nothing is added.

    (The run root used to be appended whenever no mount was *equal* to it: /lustre:/lustre plus
    /lustre/fsw/kilocard/runs:/lustre/fsw/kilocard/runs for every job of the DGX profiles.)
    """
    rc = to_run_config(
        compose(["recipe=llama3_70b", "cluster=h100_dgx", "checkpoint.save=/lustre/ckpt/a", "data.type=indexed",
                 "data.data_path=[/lustre/data/web_text_document,/datasets/code/c_text_document]"])
    )  # fmt: skip
    script = render_script(rc, build_plan(rc), Path(rc.cluster.shared_fs) / "run-1")
    mounts = {
        line.split("--container-mounts=")[1].split()[0] for line in script.splitlines() if line.startswith("srun")
    }
    assert mounts == {"/lustre:/lustre,/datasets/code:/datasets/code"}


@pytest.mark.integration  # reads the CPU shim's proven versions (imports torch)
def test_preflight_range_is_kilocards_declared_one():
    """The preflight's megatron-core range is pyproject's, its floor the CPU shim's first proven version."""
    import tomllib

    from kilocard.backends.cpu_shim import PROVEN_VERSIONS

    text = render_case("tiny_gpt_local_cpu_2x2")
    deps = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [r for r in deps if r.startswith("megatron-core")]
    assert f"--mcore-min {PROVEN_VERSIONS[0]} --mcore-below 0.20" in text and ">=0.16.1" in req and "<0.20" in req
    pre, train = text.index('"$RUN_DIR/preflight.py"'), text.index('-m kilocard.train "$RUN_DIR"')
    assert pre < train and text.index('export PYTHONPATH="$RUN_DIR/code/site') < pre


def test_packaging_none_and_image_put_nothing_on_the_path():
    """Only the snapshot mode adds the run's code to PYTHONPATH."""
    for name in ("tiny_gpt_venv_none", "llama3_8b_h100_image_data"):
        assert "PYTHONPATH" not in render_case(name), name


@pytest.mark.parametrize("in_job", [False, True])
def test_nsys_wraps_each_gpu_task_and_captures_the_profiler_range(in_job):
    """``trainer.nsys=true`` on GPUs: every srun task of the training step runs under ``nsys profile``,
    which records only the cudaProfilerApi range the ranks open for ``trainer.profile_steps``."""
    extra = ["launcher.max_restarts=2"] if in_job else []
    on = ["recipe=llama3_70b", "cluster=h100_dgx", "trainer.nsys=true", "trainer.profile_steps=[10,12]", *extra]
    rc = to_run_config(compose(on))
    text = render_script(rc, build_plan(rc), Path("/shared/runs/nsys"), 1)
    (step,) = [line for line in text.splitlines() if line.startswith("srun ") and "kilocard.train" in line]
    assert "nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop" in step
    assert '--output="$RUN_DIR/profile/nsys_node%q{SLURM_NODEID}_task%q{SLURM_PROCID}"' in step
    assert step.index("nsys profile") < step.index("python")
    cpu_on = ["recipe=tiny_gpt", "launcher=slurm", "trainer.nsys=true", "trainer.profile_steps=[2,3]"]
    cpu = to_run_config(compose(cpu_on))
    assert "nsys" not in render_script(cpu, build_plan(cpu), Path("/shared/runs/cpu"), 1)
