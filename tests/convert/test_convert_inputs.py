"""``kilocard convert`` on damaged, hostile or odd input: one line, exit 1, nothing written (issue 24).

Each used to be a traceback (SafetensorError, JSONDecodeError, AttributeError, TypeError), a shard
opened outside the model directory, a `.OUT.partial-PID` left behind, or NaN weights imported with
exit 0. A real tiny Llama (transformers ``save_pretrained``) is damaged a different way per case.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_hf import make

from bad_files import finishes
from kilocard import cli

pytestmark = pytest.mark.integration  # builds tiny checkpoints with torch

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A tiny sharded Llama, and a committed kilocard checkpoint imported from it."""
    root = tmp_path_factory.mktemp("pristine")
    make("llama", root / "hf")
    assert cli.main(["convert", "hf-to-mcore", str(root / "hf"), str(root / "ck"), "recipe=tiny_llama"]) == 0
    return root


@pytest.fixture
def hf(pristine, tmp_path):
    shutil.copytree(pristine / "hf", tmp_path / "hf")
    return tmp_path / "hf"


def convert(capsys, *argv):
    capsys.readouterr()
    out = finishes(lambda: cli.main(["convert", *argv]))
    assert "error" not in out, out
    return out["value"], capsys.readouterr().err


def first_shard(hf):
    return hf / json.loads((hf / INDEX).read_text())["weight_map"]["model.embed_tokens.weight"]


def _index(hf, weight_map):
    (hf / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _nan(hf):
    shard = first_shard(hf)
    tensors = load_file(str(shard))
    tensors["model.embed_tokens.weight"][3, 1] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})


DAMAGE = {
    "truncated shard": (
        lambda hf: first_shard(hf).write_bytes(first_shard(hf).read_bytes()[:200]),
        "not a readable safetensors file",
    ),
    "garbage shard": (lambda hf: first_shard(hf).write_bytes(os.urandom(4096)), "not a readable safetensors file"),
    "index not JSON": (lambda hf: (hf / INDEX).write_text('{"weight_map": '), "not valid JSON"),
    "weight_map a list": (lambda hf: _index(hf, ["a.safetensors"]), "field 'weight_map' holds a list"),
    "weight_map leaves the dir": (
        lambda hf: _index(hf, {"model.embed_tokens.weight": "../../../../etc/passwd"}),
        "not a shard file inside",
    ),
    "index a FIFO": (lambda hf: ((hf / INDEX).unlink(), os.mkfifo(hf / INDEX)), "is a FIFO (named pipe)"),
    "config a list": (
        lambda hf: (hf / "config.json").write_text("[1, 2]"),
        "the file holds a list, expected a mapping",
    ),
    "rope_scaling a string": (
        lambda hf: (hf / "config.json").write_text(
            json.dumps({**json.loads((hf / "config.json").read_text()), "rope_scaling": "yes"})
        ),
        "field 'rope_scaling' holds a string, expected a mapping or null",
    ),
    "NaN weight": (_nan, "tensor model.embed_tokens.weight holds NaN or infinite values"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_damaged_model_directory_is_one_line_and_nothing_is_written(case, hf, tmp_path, capsys):
    damage, expected = DAMAGE[case]
    damage(hf)
    code, err = convert(capsys, "hf-to-mcore", str(hf), str(tmp_path / "out"), "recipe=tiny_llama")
    usage = case != "NaN weight"  # a file that cannot be read is unusable input (2); NaN weights a refused model (1)
    assert code == (2 if usage else 1) and len(err.strip().splitlines()) == 1, err
    assert err.startswith("kilocard convert: error: ") and expected in err, err
    assert "root:" not in err  # /etc/passwd was never read
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


@pytest.mark.parametrize("kind", ["dangling symlink", "symlink to an empty dir", "parent is a file"])
def test_an_unusable_output_path_is_refused_and_nothing_is_left(kind, hf, tmp_path, capsys):
    if kind == "dangling symlink":
        out = tmp_path / "out"
        out.symlink_to(tmp_path / "nowhere")
    elif kind == "symlink to an empty dir":
        (tmp_path / "empty").mkdir()
        out = tmp_path / "out"
        out.symlink_to(tmp_path / "empty")
    else:
        (tmp_path / "file").write_text("x")
        out = tmp_path / "file" / "out"
    code, err = convert(capsys, "hf-to-mcore", str(hf), str(out), "recipe=tiny_llama")
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(out) in err, err
    assert not list(tmp_path.glob(".out.partial-*")) and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda m: m.write_text('{"step": 0, "files": '), "not valid JSON"),
        (lambda m: m.write_text('{"step": 0, "files": []}'), "field 'files' holds a list"),
        (
            lambda m: m.write_text('{"step": 0, "files": {"../../x": {"size": 1, "sha256": "0"}}}'),
            "lists a file outside its step directory",
        ),
    ],
    ids=["torn", "files a list", "path outside"],
)
def test_export_of_a_step_with_a_damaged_manifest_is_one_line(damage, expected, pristine, tmp_path, capsys):
    shutil.copytree(pristine / "ck", tmp_path / "ck")
    damage(tmp_path / "ck" / "step_0000000" / "manifest.json")
    code, err = convert(capsys, "mcore-to-hf", str(tmp_path / "ck"), str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    assert not (tmp_path / "out").exists()


def test_finite_weights_still_import(hf, tmp_path, capsys):
    """The NaN check refuses only what is not finite (a pristine model imports, exit 0)."""
    assert torch.isfinite(load_file(str(first_shard(hf)))["model.embed_tokens.weight"]).all()
    code, err = convert(capsys, "hf-to-mcore", str(hf), str(tmp_path / "out"), "recipe=tiny_llama")
    assert code == 0, err
