"""Pieces several verbs share: the Hydra override arguments and the one validation call."""

from __future__ import annotations

import argparse

from omegaconf import DictConfig

from kilocard.calibration.site import SiteFit, site_fit
from kilocard.config.compose import to_run_config
from kilocard.config.schema import RunConfig
from kilocard.config.secrets import extract_secret_refs
from kilocard.perf.efficiency import FITTED
from kilocard.rundir import targets
from kilocard.rundir.checkpoint import fresh_save_issues, load_model_issues
from kilocard.validate import validate
from kilocard.validate.inputpaths import input_path_issues
from kilocard.validate.issues import Issue, Report, error


def add_config_args(p: argparse.ArgumentParser, multirun: bool = True) -> None:
    """The Hydra overrides (and ``-m/--multirun`` where a verb takes a sweep)."""
    p.add_argument("overrides", nargs="*", help="Hydra overrides: recipe=NAME, a.b=v, +a.new=v, ~a.b, group=option")
    if multirun:
        p.add_argument("-m", "--multirun", action="store_true", help="one config per sweep point (a=1,2)")


def add_path_check_arg(p: argparse.ArgumentParser) -> None:
    """``--skip-path-checks``: input paths that exist only on the cluster (a warning lists them)."""
    p.add_argument(
        "--skip-path-checks",
        action="store_true",
        help="do not check input paths on this machine (they exist only where the job runs)",
    )


def check_config(cfg: DictConfig, skip_paths: bool = False) -> tuple[RunConfig, Report]:
    """Everything checked before a config is launched: ``validate``, ``run`` and ``sbatch`` call this.

    Secret references are moved to ``launcher.secret_env`` (any other resolver spelling is refused)
    before anything resolves ``cfg``; then the pure ``validate`` and the input checks that read
    files (data prefixes, the tokenizer, ``checkpoint.load``; off with ``skip_paths`` or
    ``cluster.check_paths=false``, said in a warning), that ``checkpoint.save`` holds no other
    run's steps (one owner per checkpoint directory), that it and ``cluster.shared_fs`` lie outside
    every checkpoint tree and the container's mount paths can be carried (``kilocard.rundir.targets``),
    and that ``checkpoint.load`` has the step to start from and that it holds this model.
    """
    run_cfg = typed(cfg)
    site, problem = site_calibration(run_cfg)
    report = validate(run_cfg, site.params_for(run_cfg.cluster.gpu) if site else FITTED)
    report.issues.extend(input_path_issues(run_cfg, skip_paths))
    report.issues.extend([problem] if problem else [])
    report.issues.extend(fresh_save_issues(run_cfg.checkpoint.save))  # a new run owns no committed steps yet
    report.issues.extend(targets.config_issues(run_cfg))  # and writes nowhere kilocard may not
    if not skip_paths and run_cfg.cluster.check_paths:
        report.issues.extend(load_model_issues(run_cfg))  # the base checkpoint holds this model
    return run_cfg, report


def typed(cfg: DictConfig) -> RunConfig:
    """``cfg`` typed, after moving its secret references to ``launcher.secret_env`` (nothing resolves them)."""
    extract_secret_refs(cfg)
    return to_run_config(cfg)


def site_calibration(cfg: RunConfig) -> tuple[SiteFit | None, Issue | None]:
    """The site refit ``perf.site_baselines`` names (``None`` without one), or the issue that it cannot be used."""
    file = cfg.perf.site_baselines
    if not file:
        return None, None
    try:
        return site_fit(file), None
    except ValueError as e:
        fix = "kilocard baselines --site FILE --add RUN_DIR writes one; or perf.site_baselines=null"
        return None, error("SITE_BASELINES", "perf.site_baselines", file, str(e), fix)
