"""The tokenizer checks: the padded vocabulary covers the tokenizer's ids; a tokenizer file exists and loads.

``rule_builtin_tokenizer_vocab`` is a pure ``validate()`` rule (``kilocard-bytes``: 258 ids, known
without I/O); ``tokenizer_issues`` reads the file named by ``data.tokenizer`` (real files, built
here with ``tokenizer_files``), as the verbs' input checks do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kilocard.config.compose import compose, to_run_config
from kilocard.validate import validate
from kilocard.validate.tokenizer import BYTES_VOCAB, tokenizer_issues
from run_configs import cfg_of
from tokenizer_files import hf_tokenizer_json, tiktoken_file

TINY = {"model.make_vocab_size_divisible_by": 128, "data.tokenizer": "kilocard-bytes"}


# The tokenizers subclass Megatron-Core's tokenizer base class: a test that loads one imports Megatron-Core and torch.
LOADS_A_TOKENIZER = pytest.mark.integration


@LOADS_A_TOKENIZER
def test_builtin_vocabulary_size_is_the_byte_tokenizers() -> None:
    from kilocard.data.byte_tokenizer import ByteTokenizer

    assert BYTES_VOCAB == ByteTokenizer().vocab_size


@pytest.mark.parametrize(
    "values, valid",
    [
        ({"model.vocab_size": 256}, False),  # padded to 256 < 258
        ({"model.vocab_size": 257}, True),  # padded to 384
        ({"model.vocab_size": 200, "model.make_vocab_size_divisible_by": 64}, False),  # 256
        ({"model.vocab_size": 250, "model.make_vocab_size_divisible_by": 50}, False),  # 250
        (
            {
                "model.vocab_size": 250,
                "model.make_vocab_size_divisible_by": 50,
                "parallel.tensor_model_parallel_size": 2,
            },
            True,
        ),
    ],
)
def test_padded_vocabulary_must_cover_the_byte_tokenizer(values: dict, valid: bool) -> None:
    issues = [i for i in validate(cfg_of({**TINY, **values})).issues if i.code == "TOKENIZER_VOCAB"]
    assert (issues == []) == valid
    for issue in issues:
        assert issue.field == "model.vocab_size" and "258 ids of tokenizer 'kilocard-bytes'" in issue.message
        assert issue.hint == "set model.vocab_size=258"


@LOADS_A_TOKENIZER
def test_tokenizer_issues_names_a_missing_file_and_validate_stays_pure(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope" / "tokenizer.json")
    cfg = cfg_of({**TINY, "model.vocab_size": 258, "data.tokenizer": missing})
    assert [i.code for i in validate(cfg).issues if i.code.startswith("TOKENIZER")] == []  # no I/O there
    (issue,) = tokenizer_issues(cfg)
    assert (issue.severity, issue.code, issue.field, issue.value) == (
        "error",
        "TOKENIZER_FILE",
        "data.tokenizer",
        missing,
    )
    assert "unknown tokenizer" in issue.message and "kilocard-bytes or the path of" in issue.hint


@LOADS_A_TOKENIZER
def test_tokenizer_issues_checks_the_padded_vocabulary_against_the_file(tmp_path: Path) -> None:
    path = str(hf_tokenizer_json(tmp_path, vocab_size=400))
    small = cfg_of({**TINY, "model.vocab_size": 258, "data.tokenizer": path})  # pads to 384 < 400
    (issue,) = tokenizer_issues(small)
    assert (issue.code, issue.field, issue.value, issue.hint) == (
        "TOKENIZER_VOCAB",
        "model.vocab_size",
        258,
        "set model.vocab_size=400",
    )
    assert "= 128 is 384, fewer than the 400 ids" in issue.message
    assert (
        tokenizer_issues(
            cfg_of({**TINY, "model.vocab_size": 258, "data.tokenizer": path, "parallel.tensor_model_parallel_size": 2})
        )
        == []
    )  # pads to 512
    assert tokenizer_issues(cfg_of({**TINY, "model.vocab_size": 258})) == []  # the pure rule covers the built-in


@LOADS_A_TOKENIZER
def test_llama3_cpt_recipe_validates_with_a_llama3_format_tokenizer(tmp_path: Path) -> None:
    """The recipe's own paths exist only after docs/huggingface.md's commands; a stand-in tiktoken file passes."""
    from kilocard.data.tokenizer import get_tokenizer

    default = to_run_config(compose(["recipe=llama3_8b_cpt"]))
    assert validate(default).valid, [i.message for i in validate(default).errors]
    (issue,) = tokenizer_issues(default)
    assert (issue.code, issue.value) == ("TOKENIZER_FILE", "Meta-Llama-3-8B/original/tokenizer.model")
    standin = tiktoken_file(tmp_path)
    cfg = to_run_config(compose(["recipe=llama3_8b_cpt", f"data.tokenizer={standin}"]))
    assert type(get_tokenizer(cfg.data.tokenizer)).__name__ == "TikTokenizer"
    assert validate(cfg).valid and tokenizer_issues(cfg) == []
    assert (cfg.model.vocab_size, cfg.data.type, cfg.checkpoint.load) == (
        128256,
        "indexed",
        "checkpoints/llama3_8b_mcore",
    )
