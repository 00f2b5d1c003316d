"""Every command docs/install.md, docs/tracking.md, docs/where.md and docs/finetune.md show runs, with the
exit code the text says (``# exit N`` after it, else 0), in page order in one scratch directory per page;
``<run>`` is the run directory the page's latest ``run dir:`` line printed. A block whose first line is
``# not run by the docs test: REASON`` names the test that runs it instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # docs/where.md trains two steps on a CPU rank

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("install.md", "tracking.md", "where.md", "finetune.md")
EXIT = re.compile(r"#.*?\bexit (\d+)\b")
OPT_OUT = "# not run by the docs test:"


def commands(page: Path) -> list[str]:
    """The command lines of the page's ``bash`` blocks (comment lines and opted-out blocks left out)."""
    out, block, inside = [], [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            if inside and not (block and block[0].startswith(OPT_OUT)):
                out += [c for c in block if c.strip() and not c.lstrip().startswith("#")]
            inside, block = (line.strip() == "```bash"), []
        elif inside:
            block.append(line)
    return out


@pytest.mark.parametrize("name", PAGES)
def test_every_command_of_the_page_exits_as_it_says(name, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    cmds = commands(ROOT / "docs" / name)
    assert cmds, f"docs/{name} shows no command"
    run_dir = None
    for cmd in cmds:
        expected = int(m.group(1)) if (m := EXIT.search(cmd)) else 0
        if "<run>" in cmd:
            assert run_dir, f"{cmd}: no run directory printed before it"
            cmd = cmd.replace("<run>", run_dir)
        proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == expected, f"docs/{name}: {cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr, f"docs/{name}: {cmd}\n{proc.stderr[-2000:]}"
        printed = re.findall(r"^run dir: (\S+)", proc.stdout, re.M)
        run_dir = printed[-1] if printed else run_dir
