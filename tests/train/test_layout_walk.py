"""One layout from recipe to rank: a composed recipe's parallel sizes reach Megatron-Core's
``initialize_model_parallel`` through one form, ``kilocard.layout.Layout``.

The walk: recipe -> ``kilocard sbatch`` (frozen config, ``plan.json`` holding ``Layout.to_json()``) -> the
rank's ``build_trainer`` (one ``compute_layout`` of the frozen config) -> ``init_parallel_state`` ->
``parallel_state_kwargs`` (the one Layout -> Megatron-names function) -> ``initialize_model_parallel``.
No process group is started: ``initialize_model_parallel`` is replaced by a recorder (its real signature is
checked), as are the seeding and the model build, which need one; the real call on 8 ranks is
``tests/train/test_train_rank_order.py``.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from megatron.core import parallel_state as ps

from kilocard.cli import main
from kilocard.config.compose import compose, to_run_config
from kilocard.layout import MEGATRON_NAMES, Layout, compute_layout, megatron_sizes, of_sizes
from kilocard.rundir import checkpoint as ck
from kilocard.rundir.freeze import load_verified
from kilocard.train import entry
from kilocard.train import megatron_adapter as ma

pytestmark = pytest.mark.integration  # imports Megatron-Core


def _sbatch_run_dir(tmp_path: Path, capsys, *overrides: str) -> Path:
    assert main(["sbatch", *overrides, f"cluster.shared_fs={tmp_path}", "--skip-path-checks"]) == 0
    out = capsys.readouterr().out
    return Path(next(line for line in out.splitlines() if line.startswith("run dir: "))[len("run dir: ") :])


def test_recipe_layout_reaches_initialize_model_parallel_through_the_one_form(tmp_path, capsys, monkeypatch):
    run_dir = _sbatch_run_dir(tmp_path, capsys, "recipe=deepseek_v3")  # TP2 PP16 EP64, expert TP 1
    frozen, sha = load_verified(run_dir)
    lay = compute_layout(frozen)
    assert Layout.from_json(json.loads((run_dir / "plan.json").read_text())["layout"]) == lay

    seen: dict[str, object] = {}
    one_function, real = ma.parallel_state_kwargs, inspect.signature(ps.initialize_model_parallel)

    def spy_kwargs(layout, timeout_minutes):
        seen["layout"] = layout
        seen["kwargs"] = one_function(layout, timeout_minutes)
        return seen["kwargs"]

    monkeypatch.setattr(ma, "parallel_state_kwargs", spy_kwargs)
    monkeypatch.setattr(ps, "initialize_model_parallel", lambda **kw: seen.setdefault("called", kw))
    monkeypatch.setattr(ma, "seed_all", lambda seed: None)
    monkeypatch.setattr("torch.distributed.get_world_size", lambda group=None: lay.world_size)
    monkeypatch.setattr("kilocard.train.trainer.Trainer", lambda run_cfg, layout, *rest: ("trainer", layout))

    built = entry.build_trainer(run_dir, frozen, sha, None, None, None, timeout_minutes=7)

    assert seen["layout"] == lay and built == ("trainer", seen["layout"]), "one Layout: Megatron's and the trainer's"
    called = seen["called"]
    assert called == seen["kwargs"], "initialize_model_parallel gets exactly parallel_state_kwargs(layout)"
    assert set(called) <= set(real.parameters), set(called) - set(real.parameters)
    assert {k: called[k] for k in MEGATRON_NAMES.values()} == megatron_sizes(lay)
    p = frozen.parallel
    for short, name in MEGATRON_NAMES.items():  # the recipe's value under Megatron's own name, resolved once
        recipe_value = getattr(p, name)
        expected = lay.tp if short == "etp" and recipe_value is None else recipe_value
        assert called[name] == expected, name
    assert called["order"] == lay.order and called["distributed_timeout_minutes"] == 7


def test_checkpoint_state_holds_the_layout_and_reads_the_older_dict():
    cfg = to_run_config(
        compose(["recipe=tiny_gpt", "cluster.gpus_per_node=4", "parallel.tensor_model_parallel_size=2"])
    )
    lay = compute_layout(cfg)
    state = ck.TrainerState(
        step=1, consumed_samples=8, scheduler={}, model={}, layout=lay.to_json(), padded_vocab_size=512
    )
    assert Layout.from_json(json.loads(json.dumps(state.layout))) == lay
    # trainer_state.json as steps committed before the layout was one object recorded it
    older = {
        "world_size": 4,
        "tp": 2,
        "pp": 1,
        "vp": None,
        "cp": 1,
        "ep": 1,
        "etp": None,
        "distributed_optimizer": True,
    }
    read = Layout.from_json(older)
    assert read.same_ranks(lay) and read.dp == lay.dp == 2 and read.etp == 2
    assert not Layout.from_json({**older, "tp": 1}).same_ranks(lay)
    assert not Layout.from_json({**older, "world_size": 8}).same_ranks(lay)
    assert of_sizes(1).to_json()["world_size"] == 1 and Layout.from_json(of_sizes(1).to_json()) == of_sizes(1)
