"""``kilocard logs``: a run's Slurm output, all of it or one rank's (``srun --label`` prefixes)."""

from __future__ import annotations

import threading
import time

from kilocard.cli import main

JOB_1 = "[kilocard 2026-01-01T00:00:00Z job 7] start\n 0: step 1 loss 9.1\n12: rank twelve\n 3: step 1\n"
JOB_2 = "[kilocard 2026-01-01T01:00:00Z job 9] start\n 3: resumed\n 0: step 2\n"


def run_dir(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "slurm-9.out").write_text(JOB_2)
    (tmp_path / "logs" / "slurm-7.out").write_text(JOB_1)
    return tmp_path


def test_all_lines_in_job_order_and_one_rank(tmp_path, capsys):
    d = run_dir(tmp_path)
    assert main(["logs", str(d)]) == 0
    assert capsys.readouterr().out == JOB_1 + JOB_2
    assert main(["logs", str(d), "--rank", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "[kilocard 2026-01-01T00:00:00Z job 7] start",
        " 3: step 1",
        "[kilocard 2026-01-01T01:00:00Z job 9] start",
        " 3: resumed",
    ]


def test_follow_reads_new_lines_until_the_run_ends(tmp_path, capsys):
    d = run_dir(tmp_path)

    def job():
        time.sleep(1.5)
        with (d / "logs" / "slurm-9.out").open("a") as f:
            f.write(" 3: step 3\n 0: step 3\n")
        (d / "DONE").write_text("now\n")

    t = threading.Thread(target=job)
    t.start()
    assert main(["logs", str(d), "--rank", "3", "--follow"]) == 0
    t.join()
    assert capsys.readouterr().out.splitlines()[-1] == " 3: step 3"


def test_not_a_run_directory_is_one_line(tmp_path, capsys):
    assert main(["logs", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "RUN_DIR" in err and "has no logs/" in err
