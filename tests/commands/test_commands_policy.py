"""One exit-code policy and one issue printer across the verbs (real composition, real validator).

0 ok, 1 a config that composes but is invalid, 2 input that cannot be used (a bad flag, a config
that does not compose); an issue is printed as the same line by ``validate``, ``sbatch`` and ``run``.
"""

from __future__ import annotations

import pytest

from kilocard.commands import exits, main
from kilocard.commands.output import issue_line
from kilocard.config.compose import compose, to_run_config
from kilocard.validate import validate

BAD_TP = ["recipe=tiny_gpt", "parallel.tensor_model_parallel_size=3"]
CONFIG_VERBS = (["validate"], ["sbatch"], ["run"], ["plan"])


def run_main(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out + err


@pytest.mark.parametrize("verb", [v for v in CONFIG_VERBS if v != ["plan"]], ids=lambda v: v[0])
def test_invalid_config_exits_1_and_prints_the_same_issue_line(verb, tmp_path, capsys):
    """The same issue reads the same in every verb (today: three formats; run exited 2). ``sbatch`` composes
    with ``launcher=slurm``, whose fix is more nodes, not more local ranks."""
    composed = compose((["launcher=slurm"] if verb == ["sbatch"] else []) + BAD_TP)
    (issue,) = [i for i in validate(to_run_config(composed)).errors if i.code == "WORLD_NOT_DIVISIBLE"]
    rc, text = run_main([*verb, *BAD_TP, f"cluster.shared_fs={tmp_path}"], capsys)
    assert rc == exits.INVALID, text
    assert issue_line(issue) in text.splitlines(), text
    assert "Traceback" not in text and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", CONFIG_VERBS, ids=lambda v: v[0])
def test_a_config_that_does_not_compose_exits_2_in_one_line(verb, tmp_path, capsys):
    argv = [*verb, "recipe=tiny_gpt", "trainer.globl_batch_size=1", f"cluster.shared_fs={tmp_path}"]
    rc, text = run_main(argv, capsys)
    assert rc == exits.USAGE
    assert text.strip().splitlines() == [
        f"kilocard {verb[0]}: error: trainer.globl_batch_size: unknown field (got '1'; expected a field of trainer; "
        "did you mean 'global_batch_size' or 'micro_batch_size'?)"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "recipe=tiny_gpt", "--top", "0"],
        ["run", "recipe=tiny_gpt", "--nproc", "0"],
        ["sbatch", "recipe=tiny_gpt", "--chain", "0"],
        ["baselines", "--file", "/nonexistent/rows.yaml"],
    ],
    ids=lambda a: a[0],
)
def test_unusable_flags_exit_2_in_one_line(argv, capsys):
    rc, text = run_main(argv, capsys)
    assert rc == exits.USAGE and len(text.strip().splitlines()) == 1 and text.startswith(f"kilocard {argv[0]}: error: ")


def test_secret_fields_are_never_printed():
    """The one printer hides the value of any field that holds secrets."""
    from kilocard.validate.issues import error

    line = issue_line(error("SECRET_VALUE", "launcher.secret_env[0]", "sk-live-abc", "names only", "use a name"))
    assert "sk-live-abc" not in line and "<hidden>" in line


def test_more_cpu_ranks_than_the_cores_carry_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch):
    """``--nproc 32`` on a 2-core machine started 32 torch processes: refused (CPU_RANKS, exit 1), nothing written,
    whatever the profile says of its cores (the local launch counts this machine's)."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    argv = ["run", "recipe=tiny_gpt", "cluster.cpus_per_node=64", f"cluster.shared_fs={tmp_path}", "--nproc", "32"]
    rc, text = run_main(argv, capsys)
    assert rc == exits.INVALID, text
    assert "CPU_RANKS: launcher.nproc = 32: 32 CPU ranks on this machine's 2 cores: at most 2 ranks per core" in text
    assert "Traceback" not in text and list(tmp_path.iterdir()) == []
    rc, text = run_main(["validate", "recipe=tiny_gpt", "cluster.gpus_per_node=1000"], capsys)
    assert rc == exits.INVALID and "ERROR CPU_RANKS: cluster.gpus_per_node = 1000" in text, text
