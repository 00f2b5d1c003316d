"""Hugging Face checkpoints in (``hf-to-mcore``) and out (``mcore-to-hf``).

``hf-to-mcore HF_DIR OUT_DIR [recipe=NAME] [overrides]`` writes a committed kilocard checkpoint
(``OUT_DIR/step_0000000`` in torch_dist + ``trainer_state.json`` marked model-only + manifest, and
``OUT_DIR/latest_committed.txt``) that a run starts from with ``checkpoint.load=OUT_DIR``.
``mcore-to-hf CHECKPOINT OUT_DIR`` writes ``config.json``, ``generation_config.json``, safetensors shards
(world-readable as the umask allows, like any other output) and the tokenizer (``kilocard.convert.tokenizer``)
from a committed step (a step directory, or a checkpoint directory meaning its newest committed step). The
import keeps the model folder's tokenizer in ``OUT_DIR/tokenizer/``.

On import the model comes from the recipe, every field a ``config.json`` disagrees with named in one line;
without ``recipe=`` it is derived from ``config.json`` (``kilocard.convert.families``), as
Megatron-Bridge's AutoBridge does, and ``model.yaml`` plus ``recipe.yaml`` (a recipe of that model starting from the
imported weights: ``kilocard run recipe=OUT_DIR/recipe.yaml``) are written beside the checkpoint. On export
the model comes from the checkpoint's saved model config; a tensor that disagrees is refused. Output is
written into a hidden sibling directory and renamed into place only when complete, so a failed
conversion leaves nothing behind and a partial output never looks committed. The verb is ``kilocard.commands.convert``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from kilocard.config.domains import outside
from kilocard.config.schema import ModelConfig, RunConfig
from kilocard.convert import families, fp8, maps, st_io
from kilocard.convert import tokenizer as tk
from kilocard.convert.maps import ConvertError, ConvertUsageError, Slot
from kilocard.layout import compute_layout, of_sizes
from kilocard.rundir import checkpoint as ck
from kilocard.rundir import targets
from kilocard.rundir.names import MANIFEST, MODEL_ONLY, STATE, TRACKER

_WIDENING = {(torch.bfloat16, torch.float32), (torch.float16, torch.float32)}
"""Casts that are exact for every value."""


# --- output directory -----------------------------------------------------------------------------


def check_output(out: Path) -> None:
    """Refuse an output kilocard may not write (``kilocard.rundir.targets.output_dir``): inside a checkpoint step
    or any checkpoint directory, a symlink, a file, a directory that is not empty."""
    targets.output_dir("OUT_DIR", str(out))


@contextlib.contextmanager
def staging(out: Path) -> Iterator[Path]:
    """A hidden sibling of ``out`` to write into; renamed to ``out`` on success, removed on failure.

    ``out`` must be a new path or an empty directory outside any checkpoint tree, not a symlink (dangling
    or not: the rename would fail after the whole conversion, or write where the link points); its parent
    a directory (``check_output``).
    """
    check_output(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise ConvertUsageError(
            f"{out}: cannot create the output directory ({e.strerror}); choose another path"
        ) from None
    try:
        yield tmp
        if out.is_dir():
            out.rmdir()
        os.replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConvertError(f"{out}: cannot write the output ({e.strerror}); nothing was left behind") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# --- import -----------------------------------------------------------------------------------------


RECIPE_FILE = "recipe.yaml"
"""Written beside an import without ``recipe=``: a recipe (``recipe=OUT/recipe.yaml``) of the derived model
that starts from the imported weights (``checkpoint.load``)."""
MODEL_FILE = "model.yaml"
"""Written beside it too: the derived model alone, a ``model/<name>.yaml`` for a site config directory."""


def _value(v: Any) -> str:
    """A Hydra override value: JSON's spelling for numbers, booleans and null."""
    return json.dumps(v)


def derived_overrides(hf_cfg: dict[str, Any], family: str, name: str, names: set[str] | None = None) -> list[str]:
    """The overrides of a run whose model is the one ``config.json`` describes (no recipe given), with what the
    stored tensor ``names`` decide (``Family.tensor_fields``: DeepSeek-V3's MTP layers)."""
    fields = {"name": name, **maps.model_from_config(hf_cfg, family)}
    if names is not None:
        fields.update(families.get(family).tensor_fields(hf_cfg, names))
    return [f"recipe={families.get(family).base_recipe}", *(f"model.{k}={_value(v)}" for k, v in fields.items())]


def stored_names(hf_dir: Path) -> set[str]:
    """The stored tensors' names (none where the weights cannot be read: refused later, after ``config.json``)."""
    try:
        return set(st_io.headers(st_io.shard_files(hf_dir)))
    except ConvertError:
        return set()


def _run_config(
    overrides: Sequence[str], hf_cfg: dict[str, Any], family: str, hf_dir: Path, name: str
) -> tuple[RunConfig, bool]:
    """The run config of the import and whether its model was derived from ``config.json`` (and the tensors)."""
    from kilocard.config.compose import compose, to_run_config

    derived = not any(o.startswith("recipe=") for o in overrides)
    base = derived_overrides(hf_cfg, family, name, stored_names(hf_dir)) if derived else []
    run_cfg = to_run_config(compose([*base, *overrides]))
    bad = outside(run_cfg)  # before anything is built from it (num_layers=1e9 grew without bound)
    if bad:
        field, value, why = bad[0]
        source = "config.json" if derived and field.startswith("model.") else "the recipe or overrides"
        raise ConvertError(f"{field}={value!r} (from {source}) {why}; fix {source}")
    return run_cfg, derived


def write_recipe(tmp: Path, out: Path, run_cfg: RunConfig, family: str, hf_dir: Path) -> None:
    """``MODEL_FILE`` and ``RECIPE_FILE`` of a derived model into the staging directory ``tmp`` (final: ``out``)."""
    import yaml

    model = dataclasses.asdict(run_cfg.model)
    note = f"# Written by kilocard convert hf-to-mcore from {hf_dir.resolve()}/config.json ({family}).\n"
    (tmp / MODEL_FILE).write_text(note + yaml.safe_dump(model, sort_keys=False))
    recipe = {
        "defaults": [{"override /cluster": "local_cpu"}, {"override /data": "mock"}, "_self_"],
        "recipe": {"name": model["name"], "family": "converted", "description": f"{family} from {hf_dir.name}"},
        "model": model,
        "checkpoint": {"load": str(out.resolve())},
    }
    (tmp / RECIPE_FILE).write_text("# @package _global_\n" + note + yaml.safe_dump(recipe, sort_keys=False))


def check_tensors(slots: list[Slot], found: dict[str, st_io.Header], recipe: str) -> None:
    """Refuse missing or unexpected tensors (listed), a wrong shape or a dtype kilocard cannot hold."""
    wanted = {s.hf: s for s in slots}
    present = [n for n in found if not n.endswith(maps.IGNORED_SUFFIXES)]
    missing = [n for n in wanted if n not in found]
    unexpected = sorted(n for n in present if n not in wanted)
    if missing or unexpected:
        parts = [
            f"{label} ({len(names)}): {_listed(names)}"
            for label, names in (("missing", missing), ("unexpected", unexpected))
            if names
        ]
        raise ConvertError(f"the tensors do not match recipe {recipe}'s model: " + "; ".join(parts))
    for s in slots:
        h = found[s.hf]
        if h.shape != s.shape:
            raise ConvertError(
                f"{h.file.name}: tensor {s.hf} has shape {list(h.shape)}, recipe {recipe}'s model needs {list(s.shape)}"
            )
        st_io.torch_dtype(h)


def _listed(names: list[str], most: int = 12) -> str:
    shown = ", ".join(names[:most])
    return shown + (f", ... and {len(names) - most} more" if len(names) > most else "")


def cast(t: torch.Tensor, dtype: torch.dtype, name: str) -> torch.Tensor:
    """``t`` as ``dtype``; refuses a cast that would change any value."""
    if t.dtype == dtype or (t.dtype, dtype) in _WIDENING:
        return t.to(dtype)
    out = t.to(dtype)
    if not torch.equal(out.to(t.dtype), t):
        src, dst = (str(x).removeprefix("torch.") for x in (t.dtype, dtype))
        raise ConvertError(
            f"tensor {name}: its {src} values do not fit {dst} (the recipe's parameter dtype) exactly; "
            f"convert with precision=fp32 (or a precision that holds {src})"
        )
    return out


def fill(
    model: Any,
    slots: list[Slot],
    files: list[Path],
    m: ModelConfig,
    scales: dict[str, st_io.Header] | None = None,
    block: tuple[int, int] | None = None,
) -> None:
    """Stream every Hugging Face tensor into its place in ``model``; vocabulary padding rows become zero. A block-scaled
    FP8 weight (``scales``, ``block``: ``kilocard.convert.fp8``) is dequantized and rounded to the parameter dtype."""
    from kilocard.convert import model as mm

    params = mm.tensors(model, keep_vars=True)
    uncovered = sorted(set(params) - {name for s in slots for name in maps.mcore_names(s)})
    if uncovered:  # a map that misses a Megatron-Core tensor is a kilocard bug, not bad input
        raise RuntimeError(f"the {m.name} map does not cover Megatron-Core tensors {uncovered}")
    by_name = {s.hf: s for s in slots}
    filled: dict[tuple[str, str], str] = {}  # a Megatron-Core region -> the first tensor put there
    with torch.no_grad():
        for s in slots:
            if s.part == "rows":
                params[s.mcore][s.shape[0] :].zero_()
        for name, tensor in st_io.stream(files, set(by_name), scales, block):
            s, quantized = by_name[name], name in (scales or {})
            dtype = params[maps.mcore_names(s)[0]].dtype
            t = tensor.to(dtype) if quantized else cast(tensor, dtype, name)
            first = filled.setdefault((s.mcore, s.part), name)
            if first == name:
                maps.put(params, s, m, t)
            elif not torch.equal(maps.take(params, s, m), t):
                raise ConvertError(
                    f"tensor {name} differs from {first}; Megatron-Core holds one tensor ({s.mcore}) for both"
                )


def hf_to_mcore(hf_dir: Path, out: Path, overrides: Sequence[str]) -> list[str]:
    """Import a Hugging Face model directory as a committed, model-only kilocard checkpoint; return what of it the
    model has no place for and the import left out (``Family.left_out``: DeepSeek-V3's MTP layers without MTP)."""
    from kilocard.convert import model as mm
    from kilocard.perf.params import padded_vocab_size

    check_output(out)  # before any work
    hf_cfg = st_io.read_config(hf_dir)
    family = maps.family_of_config(hf_cfg)
    run_cfg, derived = _run_config(overrides, hf_cfg, family, hf_dir, out.resolve().name)
    m, recipe = run_cfg.model, run_cfg.recipe.name
    maps.check_model(family, m)
    maps.check_config(hf_cfg, family, m, recipe)
    block = fp8.block_size(hf_cfg)
    files = st_io.shard_files(hf_dir)
    slots = maps.slots(family, m)
    found, scales = fp8.dequantized_headers(st_io.headers(files), block)
    skipped, dropped = families.get(family).left_out(m, set(found))
    check_tensors(slots, {n: h for n, h in found.items() if n not in skipped}, recipe)
    padded = padded_vocab_size(m, compute_layout(run_cfg).tp)
    one = mm.single_rank_config(run_cfg, padded)
    with staging(out) as tmp, mm.single_rank():
        model = mm.build(one)
        fill(model, slots, files, m, scales, block)
        sdir = ck.step_dir(tmp, 0)
        mm.save(model, sdir)
        source = {"format": "huggingface", "family": family, "dir": str(hf_dir.resolve()), "recipe": recipe}
        state = ck.TrainerState(
            step=0,
            consumed_samples=0,
            scheduler={},
            model=dataclasses.asdict(m),
            layout=of_sizes(1).to_json(),
            padded_vocab_size=padded,
            extra={MODEL_ONLY: True, "source": source},
        )
        (sdir / STATE).write_text(json.dumps(dataclasses.asdict(state), indent=1) + "\n")
        ck.commit_step(tmp, 0, keep_last=1)  # manifest (every file), then the tracker
        tk.keep_import_tokenizer(hf_dir, tmp)  # beside the steps: an export of the import writes it out
        if derived:
            write_recipe(tmp, out, run_cfg, family, hf_dir)
    return dropped


# --- export -----------------------------------------------------------------------------------------


def committed_step_dir(src: Path) -> Path:
    """``src`` if it is a step directory, else the newest committed step of the checkpoint directory ``src``."""
    if (src / STATE).is_file() or (src / MANIFEST).is_file():
        return src
    step = ck.latest_committed(src) if src.is_dir() else None
    if step is None:
        raise ConvertUsageError(f"{src}: neither a committed step directory nor a checkpoint directory with {TRACKER}")
    return ck.step_dir(src, step)


def saved_model(state: ck.TrainerState) -> ModelConfig:
    """The model config a step was saved with (fields the schema no longer has are dropped)."""
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    return ModelConfig(**{k: v for k, v in state.model.items() if k in known})


def mcore_to_hf(
    src: Path, out: Path, max_shard_bytes: int, adapter_only: bool = False
) -> tuple[Path | None, list[str]]:
    """Export a committed kilocard step as a Hugging Face model directory (config.json + safetensors, and the
    tokenizer of the run or import that made it: ``kilocard.convert.tokenizer``); return the tokenizer's source
    folder (``None``: no Hugging Face tokenizer was recorded) and what the family's layout could not hold and
    the export left out (``Family.dropped``: DeepSeek-V3's MTP layers).

    Every tensor is written in the weights' dtype (the word embedding's), as Hugging Face checkpoints
    are: a bf16 run keeps its torch norms in fp32, and those are cast down. A LoRA step is merged into
    its base (``W + (alpha / dim) * B @ A``), or with ``adapter_only`` written alone in the PEFT library's
    format (``kilocard.convert.peft_io``).
    """
    from kilocard.convert import model as mm
    from kilocard.convert import peft_io
    from kilocard.train import lora

    check_output(out)  # before any work
    sdir = committed_step_dir(src)
    ck.verify_step(sdir)
    state = ck.read_state(sdir)
    tokenizer = tk.export_tokenizer_source(sdir)
    m = saved_model(state)
    peft, base = peft_io.lora_of(state, sdir)
    if adapter_only and (peft is None or base is None):
        raise ConvertUsageError(
            f"{sdir}: --adapter-only needs a LoRA step (a run with peft=lora); this one holds a whole model"
        )
    family = state.extra.get("source", {}).get("family") or maps.family_of_model(m)
    maps.check_model(family, m)
    slots = maps.slots(family, m)
    by_name = {s.hf: s for s in slots}
    uses = collections.Counter(s.mcore for s in slots)
    shared = {t for t, n in uses.items() if n > 1}  # written twice (DeepSeek-V3's MTP embedding): copies
    dropped = families.get(family).dropped(m)
    with staging(out) as tmp, mm.single_rank():
        dtype = mm.saved_dtype(base or sdir)
        model = mm.build(mm.single_rank_config(mm.run_config_for(m, dtype, peft), state.padded_vocab_size))
        if base is None:
            mm.load(model, sdir)
        else:
            mm.load(model, base, lora.base_part)
            mm.load(model, sdir, lora.adapter_part)
        if adapter_only and peft is not None and base is not None:
            peft_io.write_adapter(tmp, model.state_dict(), m, peft, family, base)
            if tokenizer is not None:
                tk.copy_files(tokenizer, tmp)
            return tokenizer, dropped
        lora.merge(model)
        tensors = mm.tensors(model)
        st_io.write_sharded(
            tmp,
            list(by_name),
            lambda n: maps.take(tensors, by_name[n], m).to(dtype, copy=by_name[n].mcore in shared),
            lambda n: by_name[n].shape,
            dtype.itemsize,
            max_shard_bytes,
        )
        (tmp / st_io.CONFIG).write_text(json.dumps(maps.hf_config(family, m, dtype), indent=2) + "\n")
        tk.write_generation_config(tokenizer, tmp)
        if tokenizer is not None:
            tk.copy_files(tokenizer, tmp)
    return tokenizer, dropped
