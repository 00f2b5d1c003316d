"""``mcore-to-hf`` writes the tokenizer beside the weights, so ``AutoTokenizer.from_pretrained(OUT)`` works.

The tiny Llama twin carries the shipped chat tokenizer (``data/tiny_chat``); ``hf-to-mcore`` keeps it in
``OUT/tokenizer/``. An export takes the run's ``data.tokenizer`` (a run directory's frozen config) first,
then the tokenizer an import kept beside the checkpoint, then the one beside the run's ``checkpoint.load``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_hf import make

from kilocard import cli
from kilocard.config.compose import compose
from kilocard.paths import data_dir
from kilocard.rundir.freeze import write_frozen

pytestmark = pytest.mark.integration  # converts a real checkpoint: torch, Megatron-Core and transformers

DATA = data_dir("conf").parent / "data"
CHAT, CORPUS = DATA / "tiny_chat", DATA / "tiny_corpus"
TEXT = "The heron waits by the mill."


def convert(capsys, *argv: str) -> tuple[int, str]:
    """(exit code, stdout + stderr) of ``kilocard convert ARGV`` in this process."""
    capsys.readouterr()
    code = cli.main(["convert", *argv])
    out, err = capsys.readouterr()
    return code, out + err


def ids(folder: Path) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)(TEXT, add_special_tokens=False)[
        "input_ids"
    ]


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[Path, Path]:
    """(the HF folder with the chat tokenizer, its import)."""
    root = tmp_path_factory.mktemp("tok")
    hf = root / "hf"
    make("llama", hf)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(CHAT / name, hf / name)
    assert cli.main(["convert", "hf-to-mcore", str(hf), str(root / "ck"), "recipe=tiny_llama"]) == 0
    return hf, root / "ck"


def run_dir_of(tmp_path: Path, ck: Path, *overrides: str) -> Path:
    """A run directory (frozen tiny_llama config with ``overrides``) whose checkpoints hold the import's step."""
    run = tmp_path / "run"
    run.mkdir()
    write_frozen(compose(["recipe=tiny_llama", *overrides]), run)
    shutil.copytree(ck / "step_0000000", run / "checkpoints" / "step_0000000")
    shutil.copy(ck / "latest_committed.txt", run / "checkpoints" / "latest_committed.txt")
    return run


def test_an_import_keeps_its_tokenizer_and_its_export_writes_it(imported, tmp_path, capsys):
    hf, ck = imported
    kept = ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    assert sorted(p.name for p in (ck / "tokenizer").iterdir()) == kept
    code, out = convert(capsys, "mcore-to-hf", str(ck), str(tmp_path / "out"))
    assert code == 0 and f"(tokenizer from {ck / 'tokenizer'})" in out, out
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (CHAT / "tokenizer.json").read_bytes()
    assert ids(tmp_path / "out") == ids(hf)


def test_the_runs_data_tokenizer_goes_beside_the_export(imported, tmp_path, capsys):
    """The run trained on data/tiny_corpus's tokenizer: that one is exported, not the import's."""
    _, ck = imported
    run = run_dir_of(tmp_path, ck, f"data.tokenizer={CORPUS}", f"checkpoint.load={ck}")
    code, out = convert(capsys, "mcore-to-hf", str(run / "checkpoints"), str(tmp_path / "out"))
    assert code == 0 and f"(tokenizer from {CORPUS})" in out, out
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (CORPUS / "tokenizer.json").read_bytes()
    assert ids(tmp_path / "out") == ids(CORPUS) != ids(CHAT)


def test_a_run_from_an_import_on_byte_data_exports_the_imports_tokenizer(imported, tmp_path, capsys):
    hf, ck = imported
    run = run_dir_of(tmp_path, ck, f"checkpoint.load={ck}")  # data.tokenizer: kilocard-bytes
    code, out = convert(capsys, "mcore-to-hf", str(run / "checkpoints"), str(tmp_path / "out"))
    assert code == 0 and f"(tokenizer from {ck / 'tokenizer'})" in out, out
    assert ids(tmp_path / "out") == ids(hf)


def test_without_a_recorded_tokenizer_the_export_says_so(imported, tmp_path, capsys):
    _, ck = imported
    run = run_dir_of(tmp_path, ck)  # kilocard-bytes, no checkpoint.load
    code, out = convert(capsys, "mcore-to-hf", str(run / "checkpoints"), str(tmp_path / "out"))
    assert code == 0 and "no Hugging Face tokenizer recorded for this checkpoint" in out, out
    assert not list((tmp_path / "out").glob("tokenizer*"))


def test_named_chat_templates_go_through_the_import_and_the_export(tmp_path, capsys):
    """``additional_chat_templates/NAME.jinja`` (transformers' named templates, ``save_pretrained`` writes them
    there) are part of the tokenizer: the exported folder loads with the same templates as the model's."""
    from transformers import AutoTokenizer

    hf = tmp_path / "hf"
    make("llama", hf)
    shutil.copy(CHAT / "tokenizer.json", hf / "tokenizer.json")
    config = json.loads((CHAT / "tokenizer_config.json").read_text())
    default = config.pop("chat_template")
    (hf / "tokenizer_config.json").write_text(json.dumps(config))
    (hf / "chat_template.jinja").write_text(default)
    (hf / "additional_chat_templates").mkdir()
    (hf / "additional_chat_templates" / "tool_use.jinja").write_text(default + "{# tools #}")
    assert cli.main(["convert", "hf-to-mcore", str(hf), str(tmp_path / "ck"), "recipe=tiny_llama"]) == 0
    code, out = convert(capsys, "mcore-to-hf", str(tmp_path / "ck"), str(tmp_path / "out"))
    assert code == 0, out
    want = AutoTokenizer.from_pretrained(str(hf), local_files_only=True).chat_template
    assert isinstance(want, dict) and set(want) == {"default", "tool_use"}
    assert AutoTokenizer.from_pretrained(str(tmp_path / "out"), local_files_only=True).chat_template == want


@pytest.mark.parametrize("name", ["tokenizer_config.json", "special_tokens_map.json"])
def test_a_tokenizer_file_linked_out_of_its_folder_is_never_copied(name, imported, tmp_path, capsys):
    """A model folder's tokenizer file linked to a ``.netrc`` was copied into the checkpoint on import, and again
    beside the weights on export: both directions refuse it in one line (exit 2) and write nothing."""
    from bad_files import SECRET

    netrc = tmp_path / "home" / ".netrc"
    netrc.parent.mkdir()
    netrc.write_text(f"machine example.com login me password {SECRET}\n")
    hf = tmp_path / "hf"
    shutil.copytree(imported[0], hf)
    (hf / name).unlink(missing_ok=True)
    (hf / name).symlink_to(netrc)
    code, out = convert(capsys, "hf-to-mcore", str(hf), str(tmp_path / "ck"), "recipe=tiny_llama")
    assert code == 2 and "is a symlink to a file outside its folder" in out and SECRET not in out, out
    assert not (tmp_path / "ck").exists() and not list(tmp_path.glob(".ck.partial-*"))
    ck = tmp_path / "ck2"
    shutil.copytree(imported[1], ck)
    (ck / "tokenizer" / name).unlink(missing_ok=True)
    (ck / "tokenizer" / name).symlink_to(netrc)
    code, out = convert(capsys, "mcore-to-hf", str(ck), str(tmp_path / "out"))
    assert code == 2 and "is a symlink to a file outside its folder" in out and SECRET not in out, out
    assert not (tmp_path / "out").exists()


def test_an_export_is_readable_by_everyone_the_umask_allows_and_carries_its_generation_config(
    imported, tmp_path, capsys
):
    """safetensors writes through a private temporary file (0600): the export gets the mode of any other output.
    ``generation_config.json``: the imported model's own, kept beside the import and written out again."""
    import stat

    from transformers import GenerationConfig

    from kilocard.convert.st_io import file_mode

    hf, ck = imported
    out = tmp_path / "out"
    code, text = convert(capsys, "mcore-to-hf", str(ck), str(out))
    assert code == 0, text
    files = [p for p in out.iterdir() if p.is_file()]
    assert {p.name for p in files} >= {"model.safetensors", "config.json", "generation_config.json"}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: file_mode() for p in files}
    assert (hf / "generation_config.json").is_file()  # transformers' save_pretrained wrote one
    assert GenerationConfig.from_pretrained(out).to_diff_dict() == GenerationConfig.from_pretrained(hf).to_diff_dict()


def test_without_a_kept_generation_config_the_export_derives_one_from_the_tokenizer(tmp_path):
    """What ``GenerationConfig.from_model_config`` makes for a config without one, with the tokenizer's EOS id."""
    from transformers import AutoTokenizer, GenerationConfig

    from kilocard.convert.tokenizer import write_generation_config

    write_generation_config(CHAT, tmp_path)
    eos = AutoTokenizer.from_pretrained(str(CHAT), local_files_only=True).eos_token_id
    assert eos is not None and GenerationConfig.from_pretrained(tmp_path).eos_token_id == eos
    bare = tmp_path / "bare"
    bare.mkdir()
    write_generation_config(None, bare)  # no tokenizer recorded: still a file transformers loads
    assert GenerationConfig.from_pretrained(bare).eos_token_id is None
