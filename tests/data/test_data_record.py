"""A tokenizer that matches its data: ``kilocard preprocess`` records what made the data
(``PREFIX.meta.json``) and ``kilocard validate`` compares it with the run, through the real CLI.

The case that used to pass validation and die in the first step with ``IndexError: index 439 is out
of bounds ... size 384``: the shipped corpus preprocessed with its 512-id ``tokenizer.json``, then a
run that keeps the default ``kilocard-bytes`` tokenizer and ``model.vocab_size=258``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kilocard.cli import main
from kilocard.data.record import index_documents, read_record
from kilocard.paths import data_dir

pytestmark = pytest.mark.integration  # preprocess writes Megatron-Core indexed data (imports the training stack)

CORPUS = data_dir("conf").parent / "data" / "tiny_corpus"
TOKENIZER = CORPUS / "tokenizer.json"


def preprocess(tmp_path: Path, name: str, *extra: str, src: Path = CORPUS / "tiny_corpus.jsonl") -> str:
    """``kilocard preprocess`` into ``tmp_path/name``; the dataset prefix."""
    out = tmp_path / name
    assert main(["preprocess", "--input", str(src), "--output-prefix", str(out), *extra]) == 0
    return f"{out}_text_document"


def validate(capsys: pytest.CaptureFixture, *overrides: str) -> tuple[int, str]:
    """``kilocard validate recipe=tiny_gpt data=tiny_corpus OVERRIDES``: (exit code, the issue lines)."""
    capsys.readouterr()
    code = main(["validate", "recipe=tiny_gpt", "data=tiny_corpus", *overrides])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    return code, "\n".join(l for l in text.splitlines() if l.startswith(("ERROR", "WARNING", "no problems")))


@pytest.fixture(scope="module")
def hf_prefix(tmp_path_factory) -> str:
    """The shipped corpus tokenized with its Hugging Face tokenizer.json (512 ids)."""
    return preprocess(tmp_path_factory.mktemp("hf"), "hf", "--tokenizer", str(TOKENIZER))


def test_preprocess_records_what_made_the_data(hf_prefix: str) -> None:
    import hashlib

    record = read_record(hf_prefix)
    assert record is not None
    assert record.tokenizer == str(TOKENIZER)
    assert record.tokenizer_sha256 == hashlib.sha256(TOKENIZER.read_bytes()).hexdigest()
    assert record.vocab_size == 512 and 256 < record.max_token_id < 512
    assert record.documents == index_documents(hf_prefix) == 1040
    assert not list(Path(hf_prefix).parent.glob(".*tmp*")), "a temporary file was left behind"


def test_the_shipped_corpus_carries_its_record() -> None:
    record = read_record(str(CORPUS / "tiny_corpus_text_document"))
    assert record is not None and (record.tokenizer, record.tokenizer_sha256) == ("kilocard-bytes", None)
    assert record.max_token_id < 258 and record.documents == index_documents(str(CORPUS / "tiny_corpus_text_document"))


def test_run_without_the_data_tokenizer_is_refused_naming_both(hf_prefix: str, capsys) -> None:
    code, lines = validate(capsys, f"data.data_path=[{hf_prefix}]")
    assert code == 1, lines
    mismatch, vocab = lines.splitlines()
    assert mismatch.startswith("ERROR DATA_TOKENIZER_MISMATCH: data.tokenizer = 'kilocard-bytes': ")
    assert f"was tokenized with {TOKENIZER} (sha256 " in mismatch and "512 ids" in mismatch
    assert f"fix: set data.tokenizer={TOKENIZER}" in mismatch
    assert vocab.startswith("ERROR DATA_VOCAB: model.vocab_size = 258: ") and "pads to 384" in vocab
    assert "fix: set model.vocab_size=512" in vocab


def test_the_fixes_it_names_make_the_run_valid(hf_prefix: str, capsys) -> None:
    code, lines = validate(
        capsys, f"data.data_path=[{hf_prefix}]", f"data.tokenizer={TOKENIZER}", "model.vocab_size=512"
    )
    assert (code, lines) == (0, "no problems found")


def test_the_same_tokenizer_file_under_another_name_matches(hf_prefix: str, tmp_path: Path, capsys) -> None:
    copy = tmp_path / "renamed.json"
    shutil.copy(TOKENIZER, copy)
    code, lines = validate(capsys, f"data.data_path=[{hf_prefix}]", f"data.tokenizer={copy}", "model.vocab_size=512")
    assert (code, lines) == (0, "no problems found")


def test_every_prefix_of_a_blend_is_compared(hf_prefix: str, capsys) -> None:
    shipped = "data/tiny_corpus/tiny_corpus_text_document"
    code, lines = validate(capsys, f"data.data_path=[0.5,{shipped},0.5,{hf_prefix}]")
    assert code == 1
    assert "data.data_path[3]" in lines and "data.data_path[1]" not in lines


def test_an_old_prefix_without_a_record_still_works_with_a_warning(hf_prefix: str, tmp_path: Path, capsys) -> None:
    old = tmp_path / "old_text_document"
    for ext in ("bin", "idx"):
        shutil.copy(CORPUS / f"tiny_corpus_text_document.{ext}", f"{old}.{ext}")
    code, lines = validate(capsys, f"data.data_path=[{old}]")
    assert code == 0, lines
    assert lines.startswith("WARNING DATA_RECORD_MISSING: data.data_path[0] = ") and "kilocard preprocess" in lines


def test_a_damaged_record_is_one_line_naming_the_file(tmp_path: Path, capsys) -> None:
    prefix = preprocess(tmp_path, "bad")
    Path(f"{prefix}.meta.json").write_text("{not json")
    code, lines = validate(capsys, f"data.data_path=[{prefix}]")
    assert code == 1 and lines.startswith("ERROR DATA_RECORD: data.data_path[0]") and "meta.json" in lines


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("documents", "many", "an integer"),
        ("vocab_size", True, "an integer"),
        ("chat_template_sha256", 5, "a string or null"),
        ("truncated", [1], "an integer or null"),
        ("tokenizer", None, "a string"),
    ],
)
def test_a_record_field_of_another_type_is_one_line_naming_it(field, value, expected, tmp_path: Path, capsys) -> None:
    """A hand-edited or foreign ``.meta.json`` (the shipped chat set's, one field changed): ``DATA_RECORD``
    naming the file and the field, not an internal error where a rule first uses the value."""
    chat = CORPUS.parent / "tiny_chat"
    for path in chat.glob("tiny_chat_text_document*"):
        shutil.copy(path, tmp_path / path.name)
    prefix = tmp_path / "tiny_chat_text_document"
    record = json.loads(Path(f"{prefix}.meta.json").read_text())
    Path(f"{prefix}.meta.json").write_text(json.dumps({**record, field: value}))
    capsys.readouterr()
    code = main(["validate", "recipe=tiny_llama_sft", f"data.data_path=[{prefix}]"])
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.startswith(("ERROR", "kilocard validate:"))]
    assert code == 1 and len(lines) == 1, out.out + out.err
    assert lines[0].startswith("ERROR DATA_RECORD: data.data_path[0]"), lines
    assert f"field {field!r} holds" in lines[0] and expected in lines[0] and "meta.json" in lines[0]


def test_preprocess_again_replaces_the_record(tmp_path: Path) -> None:
    prefix = preprocess(tmp_path, "again", "--tokenizer", str(TOKENIZER))
    assert preprocess(tmp_path, "again") == prefix
    record = json.loads(Path(f"{prefix}.meta.json").read_text())
    assert (record["tokenizer"], record["vocab_size"]) == ("kilocard-bytes", 258)


def test_a_prefix_too_small_for_a_validation_document_is_refused_when_evaluating(tmp_path: Path, capsys) -> None:
    src = tmp_path / "ten.jsonl"
    src.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(10)))
    prefix = preprocess(tmp_path, "ten", src=src)
    code, lines = validate(capsys, f"data.data_path=[{prefix}]", "trainer.eval_interval=5")
    assert code == 1 and lines.startswith("ERROR EVAL_SPLIT_EMPTY: data.split = '969,30,1': ")
    assert "(10 documents) no valid document" in lines
    assert validate(capsys, f"data.data_path=[{prefix}]", "trainer.eval_interval=5", "data.split='80,20,0'")[0] == 0
    assert validate(capsys, f"data.data_path=[{prefix}]")[0] == 0  # no evaluation, no validation split needed


def test_a_publish_cut_off_between_the_files_is_refused_until_preprocess_runs_again(tmp_path: Path, capsys) -> None:
    """Preprocess replaces ``.bin`` and ``.idx`` one after the other: stopped between them (here a real rename
    failure: a directory stands where the new ``.idx`` goes), the new ``.bin`` sits beside the old index. The record
    still says ``publishing``, so validate refuses the prefix (it used to pass, record-less, with a warning);
    a preprocess that finishes clears it."""
    prefix = preprocess(tmp_path, "cut", "--tokenizer", str(TOKENIZER))
    old_index = Path(f"{prefix}.idx").rename(tmp_path / "old.idx")
    Path(f"{prefix}.idx").mkdir()
    (Path(f"{prefix}.idx") / "keep").write_text("")  # a non-empty directory: the rename onto it fails
    capsys.readouterr()
    assert main(["preprocess", "--input", str(CORPUS / "tiny_corpus.jsonl"), "--output-prefix", str(tmp_path / "cut")])
    assert "run preprocess again" in capsys.readouterr().err
    assert read_record(prefix).publishing is True  # type: ignore[union-attr]
    shutil.rmtree(f"{prefix}.idx")
    old_index.rename(f"{prefix}.idx")  # what a crash between the two renames leaves: the new .bin, the old .idx
    code, lines = validate(capsys, f"data.data_path=[{prefix}]")
    assert code == 1 and lines.startswith("ERROR DATA_INCOMPLETE: data.data_path[0] = "), lines
    assert "cut off" in lines and "kilocard preprocess" in lines
    assert preprocess(tmp_path, "cut") == prefix
    assert "publishing" not in json.loads(Path(f"{prefix}.meta.json").read_text())
    assert validate(capsys, f"data.data_path=[{prefix}]")[0] == 0
