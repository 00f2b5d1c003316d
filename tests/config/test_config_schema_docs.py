"""Every field of every schema dataclass carries a docstring (the string literal under it).

Parsed with ``ast`` so the check sees the source as written, not what a decorator leaves behind.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kilocard.config.schema as schema


def undocumented(source: str) -> list[str]:
    """``Class.field`` for every annotated dataclass field not followed by a string literal."""
    missing = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        if not ast.get_docstring(node):
            missing.append(f"{node.name} (class docstring)")
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                nxt = body[i + 1] if i + 1 < len(body) else None
                documented = (
                    isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str) and nxt.value.value.strip()
                )  # fmt: skip
                if not documented:
                    missing.append(f"{node.name}.{stmt.target.id}")
    return missing


def test_every_schema_field_has_a_docstring() -> None:
    assert undocumented(Path(schema.__file__).read_text()) == []


def test_the_check_finds_an_undocumented_field() -> None:
    src = 'class A:\n    """A."""\n\n    x: int = 1\n    """X."""\n    y: int = 2\n'
    assert undocumented(src) == ["A.y"]
