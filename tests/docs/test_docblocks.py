"""The docs-command convention (docs/README.md) as the parser reads it: pure functions on Markdown text."""

from __future__ import annotations

from pathlib import Path

from docblocks import blocks, commands, files, untagged_commands

PAGE = """\
Intro.

```bash
kilocard validate recipe=tiny_gpt                      # fine
kilocard validate recipe=x \\
    cluster.nodes=2   # exit 1: a reason
# a comment line is not a command
echo '# not a comment' | cat
```

```console
$ kilocard show cluster=h100    # exit 2
kilocard show: error: ... did you mean 'h100_dgx'?
```

   ```bash
   # not run by the docs test: needs a GPU cluster
   kilocard sbatch recipe=llama3_70b --submit
   ```

```
kilocard recipes
```

```yaml
# @package _global_
# site/recipes/a/b.yaml (a file)
x: 1
```
"""


def _page(tmp_path: Path) -> Path:
    p = tmp_path / "page.md"
    p.write_text(PAGE)
    return p


def test_commands_exit_codes_and_continuations(tmp_path: Path) -> None:
    bash, console, opted, untagged, yaml = blocks(_page(tmp_path))
    got = [(c.line, c.argv(), c.exit_code) for c in commands(bash)]
    assert got == [
        (4, ["kilocard", "validate", "recipe=tiny_gpt"], 0),
        (5, ["kilocard", "validate", "recipe=x", "cluster.nodes=2"], 1),
        (8, ["echo", "# not a comment", "|", "cat"], 0),
    ]
    (shown,) = commands(console)
    assert (shown.text.split("#")[0].strip(), shown.exit_code) == ("kilocard show cluster=h100", 2)
    assert shown.output == ("kilocard show: error: ... did you mean 'h100_dgx'?",)


def test_opt_out_untagged_and_files(tmp_path: Path) -> None:
    _, _, opted, untagged, yaml = blocks(_page(tmp_path))
    assert opted.opt_out == "needs a GPU cluster" and commands(opted) == []
    assert untagged_commands(untagged) == ["kilocard recipes"]
    path, text = files(yaml) or ("", "")
    assert path == "site/recipes/a/b.yaml" and text.startswith("# @package _global_\n") and "x: 1" in text
