"""Files an adversarial user points kilocard at: every kind that is not a regular file, bytes that are not
UTF-8, and secrets that must never be echoed. Shared by the safe-reader, error-boundary and fuzz tests."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

SECRET = "hunter2-do-not-print"
"""A password planted in the files below: no output of kilocard may hold it."""

#: name -> content of secret files a user might pass by mistake (all parse as one YAML string).
SECRET_FILES = {
    "netrc": f"machine example.com login me password {SECRET}\n",
    "id_ed25519": f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SECRET}AAAAB3NzaC1yc2E\n-----END OPENSSH PRIVATE KEY-----\n",
    ".env": f"USER=me\nTOKEN={SECRET}\n",
}
KINDS = ("fifo", "dir", "broken", "binary", "latin1", "empty", "netrc", "id_ed25519", ".env", "secret_json")


def make(kind: str, path: Path) -> Path:
    """Create at ``path`` a file of ``kind`` (see ``KINDS``); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "broken":
        path.symlink_to(path.parent / f"{path.name}.nowhere")
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "latin1":
        path.write_bytes(f"name: caf\xe9 {SECRET}\n".encode("latin-1"))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "secret_json":
        path.write_text(f'{{"token": "{SECRET}", "oops"}}\n')
    else:
        path.write_text(SECRET_FILES[kind])
    return path


def finishes(fn: Callable[[], Any], seconds: float = 60.0) -> dict[str, Any]:
    """Run ``fn`` in a thread; fail (instead of hanging the suite) when it has not returned in time.

    Returns ``{"value": ...}`` or ``{"error": exception}``."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # the caller inspects it
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s (blocked on a FIFO?)"
    return out
