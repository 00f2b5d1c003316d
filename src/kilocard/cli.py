"""The ``kilocard`` command: verbs and exit codes only; each verb's work lives in its own module.

Exit codes: 0 success; 1 the config composed but is invalid (or the verb's job failed);
2 the config or the command line cannot be understood. Bad input never prints a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from kilocard.config.compose import ComposeError

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2

#: The CLI surface, frozen by tests/commands/test_cli_surface.py: add a verb there on purpose, not by accident.
VERBS = ("recipes", "show", "validate", "run", "preprocess", "sbatch", "baselines", "plan", "convert")


def _add_config_args(p: argparse.ArgumentParser, multirun: bool = True) -> None:
    p.add_argument("overrides", nargs="*", help="Hydra overrides: recipe=NAME, a.b=v, +a.new=v, ~a.b, group=option")
    if multirun:
        p.add_argument("-m", "--multirun", action="store_true", help="one config per sweep point (a=1,2)")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kilocard", description="Recipe -> validated Megatron-Core run on Slurm.")
    sub = ap.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True

    p = sub.add_parser("recipes", help="table of the recipes: model, params, GPUs, precision, baseline")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("show", help="print the composed config")
    _add_config_args(p)
    p.add_argument("-c", "--cfg", choices=("job", "hydra", "all"), default="job", help="Hydra's --cfg")
    p.add_argument("--resolve", action="store_true", help="resolve interpolations (Hydra's --resolve)")
    p.add_argument("-p", "--package", default=None, help="print only this node (Hydra's --package)")

    p = sub.add_parser("validate", help="check layout, batch, precision, topology and memory")
    _add_config_args(p)
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("run", help="validate, write a run dir and train on local ranks (torchrun)")
    _add_config_args(p, multirun=False)
    p.add_argument("--nproc", type=int, default=None, help="local ranks (default: launcher.nproc)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="continue a stopped run")

    p = sub.add_parser("preprocess", help="turn JSONL text into Megatron .bin/.idx")
    p.add_argument("--input", required=True, help="JSONL file, one {'text': ...} per line")
    p.add_argument("--output-prefix", required=True, help="output prefix (writes PREFIX_text_document.bin/.idx)")
    p.add_argument("--tokenizer", default="kilocard-bytes", help="kilocard-bytes or a kilocard-bpe JSON file")

    p = sub.add_parser("sbatch", help="validate and render (optionally submit) a Slurm batch script")
    _add_config_args(p)
    p.add_argument("--submit", action="store_true", help="submit with sbatch --parsable")
    p.add_argument("--chain", type=int, default=1, help="submit N jobs that continue one another")

    p = sub.add_parser("baselines", help="published MFU baselines vs the performance model")
    p.add_argument("--file", default=None, help="a baselines YAML in the same format")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("plan", help="rank the layouts that fit by predicted throughput")
    _add_config_args(p, multirun=False)
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--plot", default=None, metavar="PNG")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("convert", help="Hugging Face checkpoint <-> kilocard (Megatron-Core) checkpoint")
    p.add_argument("direction", choices=("hf-to-mcore", "mcore-to-hf"))
    p.add_argument("src", help="HF model directory, or a kilocard checkpoint (step) directory")
    p.add_argument("dst", help="output directory (must not exist or be empty)")
    _add_config_args(p, multirun=False)
    p.add_argument("--max-shard-size", default="5GB", help="mcore-to-hf: largest safetensors shard (e.g. 5GB)")
    return ap


def cmd_recipes(args: argparse.Namespace) -> int:
    from kilocard.recipes import print_recipe_table

    return print_recipe_table(fmt=args.format)


def cmd_show(args: argparse.Namespace) -> int:
    from omegaconf import OmegaConf

    from kilocard.config.compose import compose, expand_sweeps

    for combo in expand_sweeps(args.overrides, args.multirun):
        cfg = compose(combo, return_hydra_config=args.cfg in ("hydra", "all"))
        if args.multirun:
            print(f"# overrides: {' '.join(combo)}")
        node = cfg
        if args.cfg == "job" or args.cfg == "all":
            OmegaConf.set_struct(cfg, False)
            hydra_node = cfg.pop("hydra", None)
            absent = object()
            node = cfg if args.package is None else OmegaConf.select(cfg, args.package, default=absent)
            if node is absent:
                raise ComposeError(
                    f"{args.package}: no such node for --package (expected a group or field path, e.g. model or "
                    "model.hidden_size)",
                    field=args.package,
                )
            if OmegaConf.is_config(node):
                print(OmegaConf.to_yaml(node, resolve=args.resolve), end="")
            else:  # a single field: print its value as YAML would
                print(OmegaConf.to_yaml({"v": node}).split(": ", 1)[1], end="")
            if hydra_node is not None:
                print(OmegaConf.to_yaml({"hydra": hydra_node}, resolve=args.resolve), end="")
        else:
            print(OmegaConf.to_yaml({"hydra": cfg.hydra}, resolve=args.resolve), end="")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from kilocard.validate.cli import validate_command

    return validate_command(args.overrides, multirun=args.multirun, fmt=args.format)


def cmd_run(args: argparse.Namespace) -> int:
    from kilocard.launch.local import run_command

    return run_command(args.overrides, nproc=args.nproc, resume=args.resume)


def cmd_preprocess(args: argparse.Namespace) -> int:
    from kilocard.data.preprocess import preprocess_command

    return preprocess_command(args.input, args.output_prefix, tokenizer=args.tokenizer)


def cmd_sbatch(args: argparse.Namespace) -> int:
    from kilocard.launch.sbatch import sbatch_command

    return sbatch_command(args.overrides, multirun=args.multirun, submit=args.submit, chain=args.chain)


def cmd_baselines(args: argparse.Namespace) -> int:
    from kilocard.perf.baselines import baselines_command

    return baselines_command(file=args.file, fmt=args.format)


def cmd_plan(args: argparse.Namespace) -> int:
    from kilocard.perf.planner import plan_command

    return plan_command(args.overrides, top=args.top, plot=args.plot, fmt=args.format)


def cmd_convert(args: argparse.Namespace) -> int:
    from kilocard.convert.command import main as convert_main

    return convert_main(args)


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {v: globals()[f"cmd_{v}"] for v in VERBS}


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line; flags and Hydra overrides may come in any order.

    argparse stops collecting the ``overrides`` positional at the first flag; overrides after a
    flag (``recipe=x --multirun a=1,2``) come back as unknown tokens and are appended here.
    """
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    unknown = [t for t in extra if t.startswith("-")]
    if unknown or (extra and not hasattr(args, "overrides")):
        parser.error(f"unrecognized arguments: {' '.join(unknown or extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kilocard`` console script."""
    args = parse_args(list(argv) if argv is not None else sys.argv[1:])
    try:
        return COMMANDS[args.verb](args)
    except ComposeError as e:
        print(f"kilocard {args.verb}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"kilocard {args.verb}: interrupted", file=sys.stderr)
        return 130


def _entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    _entry()


__all__: list[str] = ["main", "VERBS", "EXIT_OK", "EXIT_INVALID", "EXIT_USAGE"]
