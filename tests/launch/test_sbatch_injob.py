"""The batch script's in-job restart path (launcher.max_restarts > 0): what it runs, and that it fits.

The whole script is in tests/golden/sbatch/*_injob.sbatch (tests/launch/test_sbatch_render.py); these
tests name the properties that matter. The path runs for real in tests/launch/test_injob_slurm.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from kilocard import exitcodes
from kilocard.config.compose import compose, to_run_config
from kilocard.launch import ftlaunch
from kilocard.launch.render import render_script
from kilocard.plan import build_plan
from kilocard.validate.environment import reserved_reason

RUN = Path("/srv/runs/r1")


def render(*overrides: str) -> str:
    cfg = to_run_config(compose(["recipe=tiny_gpt", "launcher=slurm", "cluster.venv=/opt/venv", *overrides]))
    return render_script(cfg, build_plan(cfg), RUN)


def training_srun(text: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith("srun ") and "kilocard.train" in x)
    return shlex.split(line)


def test_one_ft_launcher_per_node_with_the_nodes_cpus_and_the_shared_argument_list():
    cfg = to_run_config(
        compose(["recipe=tiny_gpt", "launcher=slurm", "cluster.nodes=2", "cluster.gpus_per_node=2",
                 "cluster.cpus_per_node=8", "launcher.max_restarts=2"])
    )  # fmt: skip
    text = render_script(cfg, build_plan(cfg), RUN)
    argv = training_srun(text)
    sbatch = dict(re.findall(r"#SBATCH --([\w-]+)=(\S+)", text))
    assert argv[1:6] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=8", "--kill-on-bad-exit=1"]
    assert int(sbatch["ntasks-per-node"]) * int(sbatch["cpus-per-task"]) == 8  # the launcher gets the node's CPUs
    launcher = argv.index(ftlaunch.MODULE)
    endpoint = "$MASTER_ADDR:$MASTER_PORT"
    expected = ftlaunch.ft_launcher_args(cfg, nnodes="$SLURM_NNODES", nproc=2, rdzv_endpoint=endpoint)
    assert argv[launcher + 1 : -3] == [*expected, ftlaunch.TEE] and argv[-3:] == ["-m", "kilocard.train", "$RUN_DIR"]
    assert argv[launcher - 2 : launcher] == ["-u", "-m"]  # teed rank lines reach the log as they are written
    assert f"export {ftlaunch.LINE_PREFIX_ENV}='{ftlaunch.LINE_PREFIX}'" in text
    assert argv[argv.index("bash") : argv.index("bash") + 3] == ["bash", "-c", 'trap "" USR1; exec "$@"']


def test_gpu_launcher_step_takes_the_nodes_gpus():
    text = render("cluster=h100_dgx", "recipe=llama3_8b", "launcher.max_restarts=1")
    argv = training_srun(text)
    assert "--gpus-per-node=8" in argv and "--cpus-per-task=112" in argv and "--ntasks-per-node=1" in argv


def test_run_code_comes_from_the_ranks_records_and_bad_node_requeues():
    text = render("launcher.max_restarts=2")
    assert 'export KILOCARD_EXIT_DIR="$RUN_DIR/logs/exit/$SLURM_JOB_ID.${SLURM_RESTART_COUNT:-0}"' in text
    assert f"export {exitcodes.INJOB_ENV}=2" in text
    assert '-m kilocard.exitcodes "$KILOCARD_EXIT_DIR" "$KILOCARD_LAUNCHER_RC"' in text
    assert re.search(rf'^  "{exitcodes.BAD_NODE}"\)\n.*\n    continue_run ;;$', text, flags=re.M)
    assert 'scontrol requeue "$SLURM_JOB_ID" && exclude_blocklisted && exit "$rc"' in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def test_without_restarts_there_is_no_in_job_part():
    text = render()
    for word in ("ft_launcher", "KILOCARD_EXIT_DIR", "exclude_blocklisted", str(exitcodes.BAD_NODE)):
        assert word not in text


def test_every_variable_of_the_in_job_script_is_reserved():
    """Nothing the in-job script assigns or reads can be set from launcher.env / cluster.env."""
    text = render("launcher.max_restarts=2")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    code = code.replace(f"'{ftlaunch.LINE_PREFIX}'", "''")  # single-quoted: ${rank} is the launcher's, not bash's
    assigned = re.findall(r"(?:^|[\s;{(])(?:export\s+)?([A-Za-z_]\w*)=", code, flags=re.M)
    read = re.findall(r"\$\{?([A-Za-z_]\w*)", code)
    names = (set(assigned) | set(read)) - {"OMP_NUM_THREADS"}
    assert {"KILOCARD_EXIT_DIR", "KILOCARD_LAUNCHER_RC", "KILOCARD_EXCLUDE", "SLURM_NNODES"} <= names
    assert sorted(n for n in names if reserved_reason(n) is None) == []


def test_bad_node_wins_over_the_codes_it_causes():
    """A bad node makes other ranks fail (FAULT, CRASH): the run's code is BAD_NODE, so it is excluded."""
    assert exitcodes.combine([exitcodes.BAD_NODE, exitcodes.FAULT, exitcodes.CRASH], 0) == exitcodes.BAD_NODE
    assert exitcodes.combine([exitcodes.BAD_NODE, exitcodes.BAD_CKPT], 0) == exitcodes.BAD_CKPT
    assert exitcodes.BAD_NODE in exitcodes.RETRYABLE and exitcodes.BAD_NODE not in exitcodes.RESTART_IN_JOB


def stand_ins(run_dir: Path, blocklist: str, **tools: str) -> Path:
    """``run_dir/nodes/blocklist.tsv`` with ``blocklist`` and a ``bin`` folder of executable stand-in
    Slurm clients (name -> bash body); returns the folder for PATH."""
    (run_dir / "nodes").mkdir()
    (run_dir / "nodes" / "blocklist.tsv").write_text(blocklist)
    bin_dir = run_dir / "bin"
    bin_dir.mkdir()
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return bin_dir


def test_exclusion_keeps_the_jobs_own_exclusions(tmp_path):
    """``exclude_blocklisted`` sets ExcNodeList to the blocklist plus the job's own (expanded) exclusions.
    A stand-in ``scontrol`` answers ``show job`` and records ``update``: a real controller would need a job
    submitted with ``--exclude`` (the real exclusion runs in tests/launch/test_injob_slurm.py)."""
    text = render("launcher.max_restarts=2")
    function = re.search(r"^exclude_blocklisted\(\) \{\n.*?^\}\n", text, flags=re.M | re.S)
    assert function is not None
    bin_dir = stand_ins(
        tmp_path,
        "n3\tbad\t1\tt\nn1\tbad\t2\tt\nn3\tagain\t3\tt\n",
        scontrol='case "$1 $2" in\n'
        '  "show job") echo "   ReqNodeList=(null) ExcNodeList=$OWN";;\n'
        '  "show hostnames") echo "$3" | sed "s/n\\[5-6\\]/n5 n6/" | tr " " "\\n";;\n'
        '  *) echo "$*" >> "$RUN_DIR/updates";;\n'
        "esac\n",
    )
    calls = 'OWN="(null)" exclude_blocklisted\nOWN="n[5-6]" exclude_blocklisted\n'
    script = "log() { :; }\n" + function.group(0) + calls
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RUN_DIR": str(tmp_path), "SLURM_JOB_ID": "9"}
    subprocess.run(["bash", "-c", script], env=env, check=True)
    assert (tmp_path / "updates").read_text().splitlines() == [
        "update JobId=9 ExcNodeList=n1,n3",
        "update JobId=9 ExcNodeList=n1,n3,n5,n6",
    ]


def test_blocklisted_nodes_are_kept_out_of_the_later_links_of_a_chain(tmp_path):
    """A chain's later links are queued before link 1 runs: after a bad node, ``exclude_from_later_links``
    follows the ``afterany`` dependencies from this job and excludes the blocklist from every pending link.
    Stand-in ``squeue``/``scontrol`` (a real controller would need a node to fail inside a chain; the real
    chain run is in tests/launch/test_injob_slurm.py)."""
    text = render("launcher.max_restarts=2")
    functions = re.search(
        r"^exclude_blocklisted\(\) \{\n.*?^exclude_from_later_links\(\) \{\n.*?^\}\n", text, re.M | re.S
    )
    assert functions is not None
    # job 12 waits on 11 (this job's next link), 13 on 12; 99 on 911 (another chain), 14 on 112
    bin_dir = stand_ins(
        tmp_path,
        "n2\tbad\t9\tt\n",
        squeue='echo "$*" >> "$RUN_DIR/squeue_args"\n'
        "printf '%s\\n' '99 afterany:911(unfulfilled)' '14 afterany:112(unfulfilled)' "
        "'13 afterok:5(unfulfilled),afterany:12(unfulfilled)' '12 afterany:11(unfulfilled)'\n",
        scontrol='case "$1 $2" in\n'
        '  "show job") echo "   ReqNodeList=(null) ExcNodeList=(null)";;\n'
        '  *) echo "$*" >> "$RUN_DIR/updates";;\n'
        "esac\n",
    )
    script = 'log() { echo "$*"; }\n' + functions.group(0) + "exclude_from_later_links\n"
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "RUN_DIR": str(tmp_path),
        "SLURM_JOB_ID": "11",
        "SLURM_JOB_NAME": "tiny",
        "CHAIN_LENGTH": "4",
    }
    out = subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True, text=True).stdout
    assert (tmp_path / "updates").read_text().splitlines() == [
        "update JobId=12 ExcNodeList=n2",
        "update JobId=13 ExcNodeList=n2",
    ]
    assert "excluding node(s) n2 from chain link job 13" in out
    assert "-t PD -n tiny" in (tmp_path / "squeue_args").read_text()


def test_a_chain_link_excludes_the_blocklist_from_the_next_links_before_it_ends():
    """The chain branch of ``continue_run`` calls ``exclude_from_later_links`` (in-job restarts on)."""
    text = render("launcher.max_restarts=2")
    assert 'exclude_from_later_links; log "the next chain link continues the run"' in text
    assert "exclude_from_later_links" not in render("launcher.max_restarts=0")
