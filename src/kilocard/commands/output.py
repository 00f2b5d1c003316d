"""What every verb prints about a problem: one issue printer and one error line.

An issue is one line, the same in every verb (``validate`` on stdout as its report; ``sbatch`` and
``run`` on stderr before refusing)::

    ERROR TP_HEADS: parallel.tensor_model_parallel_size = 3: <message> (fix: <hint>)

A value of a field that holds secrets is never printed. An error that is not about a config field
is one line on stderr: ``kilocard VERB: error: <what, and the fix>``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from kilocard.validate.issues import ERROR, Issue

HIDDEN = "<hidden>"


def issue_line(issue: Issue, label: str = "") -> str:
    """One issue as one line: severity, code, field = value, message and the fix."""
    value = HIDDEN if "secret" in issue.field else repr(issue.value)
    return f"{label}{issue.severity.upper()} {issue.code}: {issue.field} = {value}: {issue.message} (fix: {issue.hint})"


def count_line(issues: Sequence[Issue]) -> str:
    """``N error(s), M warning(s)``."""
    n_err = sum(i.severity == ERROR for i in issues)
    return f"{n_err} error(s), {len(issues) - n_err} warning(s)"


def print_issues(issues: Sequence[Issue], label: str = "", file: TextIO | None = None) -> None:
    """Every issue, one line each (``file`` defaults to stderr)."""
    for i in issues:
        print(issue_line(i, label), file=file or sys.stderr)


def fail(verb: str, message: str, code: int) -> int:
    """Print ``kilocard VERB: error: MESSAGE`` on stderr and return ``code``."""
    print(f"kilocard {verb}: error: {message}", file=sys.stderr)
    return code
