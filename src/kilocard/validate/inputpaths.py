"""Inputs checked before anything is submitted: the data blend's weights and the paths a run reads.

The verbs ``validate``, ``run`` and ``sbatch`` add these issues to the report
(``kilocard.commands.common.check_config``), so a run that would
fail on its first step for want of an input is refused on the submitting machine instead of after
its wait in the queue:

- ``data.data_path`` in the weighted form ``[w1, p1, w2, p2]`` must pair each weight with a prefix,
  every weight a finite number >= 0, together a positive sum (Megatron normalises by the sum);
- ``checkpoint.load`` must be an existing directory (relative paths are from the current directory,
  as the run directory freezes them);
- every ``data.data_path`` prefix needs its ``.bin``/``.idx`` pair (``validate.paths``), and the
  tokenizer file must load and fit the padded vocabulary (``validate.tokenizer``);
- every prefix's record (``PREFIX.meta.json``) must name the run's tokenizer and ids the padded
  vocabulary holds, and the split must give it a validation document when evaluation is on
  (``validate.datarecord``).

The blend rules read only the config. The path rules read this machine's filesystem, unlike the
pure ``validate``: where a path exists only on the cluster, ``--skip-path-checks`` or the cluster
profile's ``check_paths: false`` turns them off, and a warning names each path left unchecked.
"""

from __future__ import annotations

import math
from pathlib import Path

from kilocard.config.schema import CheckpointConfig, DataConfig, RunConfig
from kilocard.data.paths import is_number
from kilocard.validate.datarecord import data_record_issues
from kilocard.validate.issues import Issue, error, warning
from kilocard.validate.paths import check_paths
from kilocard.validate.tokenizer import BYTES_TOKENIZER, tokenizer_issues

SKIP_HINT = "--skip-path-checks (or cluster.check_paths=false) when the path exists only on the cluster"
WEIGHTED_FORM = "data.data_path=[w1,p1,w2,p2] (weights >= 0 with a positive sum) or [p1,p2] without weights"


def input_path_issues(cfg: RunConfig, skip_paths: bool = False) -> list[Issue]:
    """Every blend and input-path issue of ``cfg``; path existence only when path checks are on."""
    issues = blend_issues(cfg.data)
    paths = input_paths(cfg)
    if not paths:
        return issues
    if skip_paths or not cfg.cluster.check_paths:
        return [*issues, _not_checked(paths, "--skip-path-checks" if skip_paths else "cluster.check_paths=false")]
    found = checkpoint_load_issues(cfg.checkpoint) + tokenizer_issues(cfg)
    if not issues:  # a malformed blend is reported once, by blend_issues
        found += check_paths(cfg) + data_record_issues(cfg)
    return once([*issues, *found])


def once(issues: list[Issue]) -> list[Issue]:
    """``issues`` without a repeat of an earlier issue's field and message: two checks that read the same file
    (the tokenizer and its chat template both read ``tokenizer_config.json``) say its fault once, the first's way."""
    seen: set[tuple[str, str]] = set()
    out = []
    for i in issues:
        if (i.field, i.message) not in seen:
            seen.add((i.field, i.message))
            out.append(i)
    return out


def input_paths(cfg: RunConfig) -> dict[str, str]:
    """The input paths the path rules check, by field (unset fields left out)."""
    out = {}
    if cfg.data.type == "indexed" and cfg.data.data_path:
        out["data.data_path"] = " ".join(str(p) for p in cfg.data.data_path)
    if cfg.data.tokenizer and cfg.data.tokenizer != BYTES_TOKENIZER:
        out["data.tokenizer"] = cfg.data.tokenizer
    if cfg.checkpoint.load:
        out["checkpoint.load"] = cfg.checkpoint.load
    return out


def _not_checked(paths: dict[str, str], why: str) -> Issue:
    listed = ", ".join(f"{field}={value!r}" for field, value in paths.items())
    return warning(
        "PATHS_NOT_CHECKED",
        "cluster.check_paths",
        why,
        f"input paths not checked on this machine ({why}): {listed}",
        "make sure they exist where the job runs; drop --skip-path-checks or set cluster.check_paths=true "
        "to check them here",
    )


def checkpoint_load_issues(ckpt: CheckpointConfig) -> list[Issue]:
    """``checkpoint.load`` names an existing directory."""
    if not ckpt.load:
        return []
    path = Path(ckpt.load).expanduser().absolute()
    if path.is_dir():
        return []
    what = "is not a directory" if path.exists() else "does not exist"
    return [
        error(
            "CHECKPOINT_LOAD_MISSING",
            "checkpoint.load",
            ckpt.load,
            f"checkpoint.load {path} {what} on this machine: the run could not resume from it",
            f"checkpoint.load=<a checkpoint directory of an earlier run>, checkpoint.load=null to start fresh, or "
            f"{SKIP_HINT}",
        )
    ]


def blend_issues(data: DataConfig) -> list[Issue]:
    """The weighted ``data.data_path`` form pairs weights with prefixes; the weights sum to a positive number."""
    items = [str(x) for x in data.data_path]
    if data.type != "indexed" or not items:
        return []
    if not is_number(items[0]):
        numbers = [x for x in items if is_number(x)]
        if numbers:
            return [_blend_error("DATA_BLEND_PAIRS", items, f"mixes prefixes with weights {numbers}")]
        return []
    if len(items) % 2:
        return [_blend_error("DATA_BLEND_PAIRS", items, f"has {len(items)} entries: a weight without its prefix")]
    for weight, prefix in zip(items[0::2], items[1::2], strict=True):
        if not is_number(weight) or is_number(prefix):
            return [_blend_error("DATA_BLEND_PAIRS", items, f"pair ({weight!r}, {prefix!r}) is not (weight, prefix)")]
    return _weight_issues(items, [float(w) for w in items[0::2]])


def _weight_issues(items: list[str], weights: list[float]) -> list[Issue]:
    bad = [w for w in weights if not math.isfinite(w) or w < 0]
    if bad:
        return [_blend_error("DATA_BLEND_WEIGHTS", items, f"weights {bad} are not finite numbers >= 0")]
    if sum(weights) <= 0:
        return [_blend_error("DATA_BLEND_WEIGHTS", items, f"weights {weights} sum to {sum(weights)}, not above 0")]
    return []


def _blend_error(code: str, items: list[str], what: str) -> Issue:
    return error(code, "data.data_path", items, f"data.data_path {what}", WEIGHTED_FORM)


__all__ = ["input_path_issues", "blend_issues", "checkpoint_load_issues", "input_paths"]
