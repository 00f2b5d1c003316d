"""metrics.jsonl after an interrupted write: a torn last line never blocks the launcher or a resume."""

from __future__ import annotations

import json
from pathlib import Path

from kilocard.rundir.metrics import METRICS_FILE, MetricsWriter, read_metrics


def _records_with_torn_tail(run_dir: Path, steps: int) -> Path:
    """``steps`` whole records, then the first bytes of the next one (a rank killed mid-write)."""
    path = run_dir / METRICS_FILE
    whole = "".join(json.dumps({"step": s, "loss": 10.0 - s}) + "\n" for s in range(1, steps + 1))
    path.write_text(whole + json.dumps({"step": steps + 1, "loss": 1.0})[:9])
    return path


def test_reader_drops_a_torn_last_line(tmp_path):
    _records_with_torn_tail(tmp_path, 5)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5]


def test_resume_drops_the_torn_tail_and_records_past_the_committed_step(tmp_path):
    path = _records_with_torn_tail(tmp_path, 6)
    w = MetricsWriter(tmp_path, tensorboard=False, resume_step=4)
    w.write({"step": 5, "loss": 0.5})
    w.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(tmp_path)] == [(1, 9), (2, 8), (3, 7), (4, 6), (5, 0.5)]
    assert path.read_text().endswith("}\n")


def test_a_huge_damaged_record_file_is_streamed_not_held(tmp_path):
    """A 2 GiB hole of NUL bytes (what a lost write or a hostile file leaves) between whole records: the
    records around it are read, the hole is one skipped line, and the reader never holds the file: its peak
    allocation stays far below the file's size (the whole-file read it replaces took 6 GB for 3 GB)."""
    import tracemalloc

    from kilocard.rundir import events

    path = tmp_path / METRICS_FILE
    with open(path, "wb") as f:
        f.write((json.dumps({"step": 1, "loss": 2.0}) + "\n").encode())
        f.truncate(2 * 1024**3)  # sparse: costs no disk
        f.seek(0, 2)
        f.write(("\n" + json.dumps({"step": 2, "loss": 1.0}) + "\n").encode())
    skipped: list[str] = []
    tracemalloc.start()
    try:
        records = events.json_lines(path, ("step",), skip_bad=skipped.append)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [r["step"] for r in records] == [1, 2]
    assert len(skipped) == 1 and "line 2: longer than 1048576 bytes" in skipped[0], skipped
    assert peak < 64 * 1024**2, peak
