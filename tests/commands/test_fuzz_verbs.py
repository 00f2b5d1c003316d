"""Every verb, driven with hostile files where it reads one (issue 24): the error boundary holds.

For each place a verb reads a file (a recipe, a site config directory, a run directory's config,
events, metrics and logs, a checkpoint's tracker, manifest and state, a Hugging Face config and index,
a tokenizer, a baselines file, a site baselines file, preprocess input) or writes one (a plot) the file
is made a FIFO, a directory, a broken
symlink, binary junk, latin-1 text, an empty file, a secret (``.netrc``, an SSH key, a ``.env``), a
JSON error around a secret, or arbitrary bytes (Hypothesis). The verb runs in this process through
``kilocard.commands.main`` and must:

* end within 60 s (a FIFO read used to block forever) with an exit code of ``DOCUMENTED_EXITS``,
  never through the boundary's "internal error" line (that is a bug the input reached);
* on exit 2 print exactly one line on stderr, and never a traceback;
* never print the planted secret;
* leave nothing half-written: no ``.partial-``/``.tmp-`` file, no run directory, no converted output.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_files import KINDS, SECRET, finishes, make
from kilocard.base.shell import IMAGE_REFERENCE
from kilocard.commands import DOCUMENTED_EXITS, VERBS, exits, main
from kilocard.config.compose import compose
from kilocard.rundir import events
from kilocard.rundir.freeze import write_frozen

pytestmark = (
    pytest.mark.integration
)  # every verb in-process with hostile files: some verbs (preprocess, convert) import the training stack; ~60 s

ENV = "KILOCARD_CONFIG_PATH"


def _frozen(rd: Path) -> Path:
    """A run directory with tiny_gpt's frozen config, a start event, one metrics record and one log."""
    rd.mkdir(parents=True, exist_ok=True)
    write_frozen(compose(["recipe=tiny_gpt"]), rd)
    events.append(rd, "start", when=10.0, world_size=1)
    (rd / "metrics.jsonl").write_text(json.dumps({"step": 1, "time": 11.0, "step_time_s": 1.0}) + "\n")
    (rd / "logs").mkdir()
    (rd / "logs" / "slurm-1.out").write_text("0: hello\n")
    return rd


def _replace(path: Path, kind: str | bytes) -> Path:
    """Put a bad file of ``kind`` (or these bytes) at ``path``, replacing what is there."""
    if path.is_dir() and not path.is_symlink():
        for p in path.iterdir():
            p.unlink()
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    if isinstance(kind, bytes):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(kind)
        return path
    return make(kind, path)


def _step(ck: Path, name: str, kind: str | bytes) -> Path:
    """A committed-looking step 0 whose ``name`` file is bad (the manifest lists the state as it is)."""
    sdir = ck / "step_0000000"
    sdir.mkdir(parents=True)
    (ck / "latest_committed.txt").write_text("0\n")
    state = _replace(sdir / "trainer_state.json", kind) if name == "state" else sdir / "trainer_state.json"
    if name != "state":
        state.write_text("{}")
    files = {}
    if state.is_file():
        data = state.read_bytes()
        files["trainer_state.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (sdir / "manifest.json").write_text(json.dumps({"step": 0, "files": files}))
    if name == "manifest":
        _replace(sdir / "manifest.json", kind)
    if name == "tracker":
        _replace(ck / "latest_committed.txt", kind)
    return ck


def _hf(world: Path, name: str, kind: str | bytes) -> Path:
    hf = world / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64}))
    _replace(hf / name, kind)
    return hf


#: slot -> (world, bad kind) -> argv; each builds what the verb needs around one bad file.
SLOTS: dict[str, Callable[[Path, str | bytes], list[str]]] = {
    "show recipe": lambda w, k: ["show", f"recipe={_replace(w / 'x.yaml', k)}"],
    "validate recipe": lambda w, k: ["validate", f"recipe={_replace(w / 'x.yaml', k)}"],
    "plan recipe": lambda w, k: ["plan", f"recipe={_replace(w / 'x.yaml', k)}", "--top", "1"],
    "budget recipe": lambda w, k: ["budget", f"recipe={_replace(w / 'x.yaml', k)}", "gpus=64", "days=1"],
    "sbatch recipe": lambda w, k: ["sbatch", f"recipe={_replace(w / 'x.yaml', k)}", f"cluster.shared_fs={w}/runs"],
    "validate site file": lambda w, k: (
        _replace(w / "site" / "model" / "m.yaml", k),
        ["validate", "recipe=tiny_gpt", f"hydra.searchpath=[{w}/site]"],
    )[1],
    "recipes site recipe": lambda w, k: (_replace(w / "site" / "recipes" / "f" / "r.yaml", k), ["recipes"])[1],
    "run --resume config": lambda w, k: ["run", "--resume", str(_bad_config(w, k))],
    "preprocess input": lambda w, k: [
        "preprocess",
        "--input",
        str(_replace(w / "in.jsonl", k)),
        "--output-prefix",
        f"{w}/out",
    ],
    "preprocess tokenizer": lambda w, k: [
        "preprocess",
        "--input",
        str(_jsonl(w)),
        "--output-prefix",
        f"{w}/out",
        "--tokenizer",
        str(_replace(w / "tok" / "tokenizer.json", k)),
    ],
    "baselines file": lambda w, k: ["baselines", "--file", str(_replace(w / "rows.yaml", k))],
    "baselines site file": lambda w, k: [
        "baselines",
        "--site",
        str(_replace(w / "site.yaml", k)),
        "--add",
        str(_steady(w / "rd")),
    ],
    "validate site baselines": lambda w, k: [
        "validate",
        "recipe=tiny_gpt",
        f"perf.site_baselines={_replace(w / 'site.yaml', k)}",
    ],
    "report plot": lambda w, k: ["report", str(_steady(w / "rd")), "--plot", str(_replace(w / "p.png", k))],
    "budget plot": lambda w, k: [
        "budget",
        "recipe=tiny_gpt",
        "gpus=8",
        "days=10",
        "--plot",
        str(_replace(w / "p.svg", k)),
    ],
    "plan plot": lambda w, k: ["plan", "recipe=tiny_gpt", "--top", "1", "--plot", str(_replace(w / "p.pdf", k))],
    "logs log": lambda w, k: ["logs", str(_bad_in_run(w, "logs/slurm-1.out", k))],
    "logs --rank config": lambda w, k: ["logs", str(_bad_in_run(w, "config.yaml", k)), "--rank", "0"],
    "goodput events": lambda w, k: ["goodput", str(_bad_in_run(w, "events.jsonl", k))],
    "goodput metrics": lambda w, k: ["goodput", str(_bad_in_run(w, "metrics.jsonl", k)), "--format", "json"],
    "goodput config": lambda w, k: ["goodput", str(_bad_in_run(w, "config.yaml", k))],
    "report metrics": lambda w, k: ["report", str(_bad_in_run(w, "metrics.jsonl", k)), "--format", "json"],
    "report config": lambda w, k: ["report", str(_bad_in_run(w, "config.yaml", k))],
    "runs config": lambda w, k: ["runs", str(_bad_in_run(w, "config.yaml", k))],
    "runs events": lambda w, k: ["runs", str(_bad_in_run(w, "events.jsonl", k)), "--format", "json"],
    "runs metrics": lambda w, k: ["runs", str(_bad_in_run(w, "metrics.jsonl", k))],
    "runs jobs": lambda w, k: ["runs", str(_bad_in_run(w, "jobs.json", k))],
    "runs lock": lambda w, k: ["runs", str(_bad_in_run(w, ".lock", k))],
    "runs tracker": lambda w, k: ["runs", str(_bad_in_run(w, "checkpoints/latest_committed.txt", k))],
    "runs root": lambda w, k: (_bad_in_run(w, "events.jsonl", k), ["runs", str(w), "--format", "json"])[1],
    "convert hf config": lambda w, k: (
        ["convert", "hf-to-mcore", str(_hf(w, "config.json", k)), f"{w}/out"] + ["recipe=tiny_llama"]
    ),
    "convert hf index": lambda w, k: (
        ["convert", "hf-to-mcore", str(_hf(w, "model.safetensors.index.json", k))] + [f"{w}/out", "recipe=tiny_llama"]
    ),
    "convert hf shard": lambda w, k: (
        ["convert", "hf-to-mcore", str(_hf(w, "model.safetensors", k)), f"{w}/out"] + ["recipe=tiny_llama"]
    ),
    "validate checkpoint tracker": lambda w, k: [
        "validate",
        "recipe=tiny_gpt",
        f"checkpoint.load={_step(w / 'ck', 'tracker', k)}",
    ],
    "convert tracker": lambda w, k: ["convert", "mcore-to-hf", str(_step(w / "ck", "tracker", k)), f"{w}/out"],
    "convert manifest": lambda w, k: ["convert", "mcore-to-hf", str(_step(w / "ck", "manifest", k)), f"{w}/out"],
    "convert state": lambda w, k: ["convert", "mcore-to-hf", str(_step(w / "ck", "state", k)), f"{w}/out"],
}


#: Slots whose verb's job is to print the file it reads (a log): the secret may appear there.
PRINTS_THE_FILE = {"logs log"}


def _jsonl(w: Path) -> Path:
    (w / "in.jsonl").write_text('{"text": "hello"}\n')
    return w / "in.jsonl"


def _steady(rd: Path) -> Path:
    """A run directory with ten steps of metrics: ``report`` and ``baselines --add`` get past reading it."""
    _frozen(rd)
    records = [
        {"step": s, "time": 10.0 + s, "step_time_s": 0.5, "tflops_per_gpu": 1.0, "loss": 5.0} for s in range(1, 11)
    ]
    (rd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return rd


def _bad_in_run(w: Path, name: str, kind: str | bytes) -> Path:
    rd = _frozen(w / "rd")
    _replace(rd / name, kind)
    return rd


def _bad_config(w: Path, kind: str | bytes) -> Path:
    """A run directory whose config.yaml is bad but hashed as it is (the check passes on a regular file)."""
    rd = _bad_in_run(w, "config.yaml", kind)
    cfg = rd / "config.yaml"
    digest = hashlib.sha256(cfg.read_bytes()).hexdigest() if cfg.is_file() and not cfg.is_symlink() else "0"
    (rd / "config.sha256").write_text(f"{digest}  config.yaml\n")
    return rd


def leftovers(world: Path) -> list[Path]:
    """Half-written things: staging and temporary files, run directories, converted or preprocessed output."""
    out = [p for p in world.rglob("*") if ".partial-" in p.name or ".tmp-" in p.name]
    out += [p for p in (world / "runs").glob("*")] if (world / "runs").is_dir() else []
    return out + [p for p in world.glob("out*")]


def check(slot: str, kind: str | bytes) -> None:
    """Run the verb of ``slot`` with a bad file of ``kind`` and assert the boundary's guarantees."""
    import contextlib
    import io

    with tempfile.TemporaryDirectory(prefix="kc-fuzz-") as tmp:
        world = Path(tmp)
        argv = SLOTS[slot](world, kind)
        site = world / "site"
        old = os.environ.get(ENV)
        if site.is_dir():
            os.environ[ENV] = str(site)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                result = finishes(lambda: main(argv))
        finally:
            if old is None:
                os.environ.pop(ENV, None)
            else:
                os.environ[ENV] = old
        assert "error" not in result, f"{slot} / {kind!r}: {result.get('error')!r}"
        rc, o, e = result["value"], out.getvalue(), err.getvalue()
        assert rc in DOCUMENTED_EXITS, (slot, kind, rc, e)
        assert "Traceback" not in o + e and "internal error" not in e, (slot, kind, e)  # no bug reached
        if slot not in PRINTS_THE_FILE:
            assert SECRET not in o + e, (slot, kind, e)
        if rc == exits.USAGE:
            assert len(e.strip().splitlines()) == 1 and e.startswith(f"kilocard {argv[0]}: error: "), (slot, kind, e)
        if rc != exits.OK:
            assert leftovers(world) == [], (slot, kind, leftovers(world))


def test_every_verb_has_a_slot():
    """The fuzzing reaches every verb that reads a file (``image`` reads none: its references below)."""
    assert {s.split()[0] for s in SLOTS} | {"image"} == set(VERBS)


@pytest.mark.parametrize("kind", ["fifo", "dir", "broken", "netrc"])
@pytest.mark.parametrize("slot", list(SLOTS))
def test_every_slot_with_files_that_are_not_config(slot, kind):
    """The deterministic sweep: every slot with the kinds that used to hang, crash or echo."""
    check(slot, kind)


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    slot=st.sampled_from(sorted(SLOTS)),
    kind=st.one_of(st.sampled_from(KINDS), st.binary(max_size=300)),
)
def test_hostile_files_anywhere_a_verb_reads(slot, kind):
    check(slot, kind)


@pytest.mark.parametrize("kind", ["fifo", "dir", "broken", "binary", "latin1"])
@pytest.mark.parametrize("name", ["events.jsonl", "metrics.jsonl", "config.sha256", "checkpoints/latest_committed.txt"])
def test_runs_lists_the_readable_runs_of_a_root_beside_a_damaged_one(tmp_path, capsys, name, kind):
    """``kilocard runs ROOT``: a run that cannot be read is one ``skipped`` line on stderr and the others are
    listed (exit 0), whatever file of it is damaged; the damaged run alone is refused in one line (exit 2)."""
    _frozen(tmp_path / "root" / "good")
    bad = _frozen(tmp_path / "root" / "bad")
    (bad / "checkpoints").mkdir()
    (bad / "checkpoints" / "latest_committed.txt").write_text("1\n")
    _replace(bad / name, kind)
    capsys.readouterr()
    code = finishes(lambda: main(["runs", str(tmp_path / "root"), "--format", "json"]))["value"]
    out, err = capsys.readouterr()
    listed = [Path(r["run_dir"]).name for r in json.loads(out)]
    skipped = [line for line in err.splitlines() if line.startswith(f"kilocard runs: skipped {bad}: ")]
    assert code == exits.OK and "good" in listed, (code, out, err)
    assert "bad" in listed or len(skipped) == 1, err
    code = finishes(lambda: main(["runs", str(bad)]))["value"]
    err = capsys.readouterr().err
    assert code in (exits.OK, exits.USAGE) and "Traceback" not in err and len(err.strip().splitlines()) <= 1, err


AS_USER = """
import os, sys
from kilocard.commands import main  # imported first: the interpreter's own files may be root's only
if os.geteuid() == 0:
    os.setgid(65534); os.setuid(65534)  # root reads and writes anywhere: run as nobody
sys.exit(main(sys.argv[1:]))
"""


def as_user(*argv: str) -> tuple[int, str, str]:
    """``kilocard ARGV`` as an ordinary user, in a fresh interpreter: (exit code, stdout, stderr)."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HOME": "/tmp"}
    proc = subprocess.run([sys.executable, "-c", AS_USER, *argv], capture_output=True, text=True, timeout=120, env=env)
    return proc.returncode, proc.stdout, proc.stderr


def test_folders_kilocard_may_not_enter_or_write_are_one_line_each():
    """No permission: a run whose checkpoints folder cannot be entered is one skipped line of ``runs ROOT`` (the
    others listed), and a site file in a read-only folder is refused naming the file and the fix (no errno
    text, no temporary file named, nothing left behind)."""
    import shutil

    world = Path(tempfile.mkdtemp(prefix="kc-perm-"))
    try:
        root = world / "runs"
        _steady(root / "good")
        locked = _steady(root / "locked")
        (locked / "checkpoints").mkdir()
        (world / "ro").mkdir()
        for p in [world, *world.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        (locked / "checkpoints").chmod(0)
        (world / "ro").chmod(0o555)

        code, out, err = as_user("runs", str(root), "--format", "json")
        assert code == exits.OK and [Path(r["run_dir"]).name for r in json.loads(out)] == ["good"], (out, err)
        assert err.splitlines() == [
            f"kilocard runs: skipped {locked}: {locked}/checkpoints/latest_committed.txt: cannot be read "
            "(Permission denied)"
        ]
        code, out, err = as_user("baselines", "--site", str(world / "ro" / "site.yaml"), "--add", str(root / "good"))
        assert code == exits.USAGE and err.splitlines() == [
            f"kilocard baselines: error: --site: {world}/ro/site.yaml: cannot be written (Permission denied); "
            "fix: choose a writable folder"
        ], err
        assert list((world / "ro").iterdir()) == []
    finally:
        (world / "runs" / "locked" / "checkpoints").chmod(0o755)
        shutil.rmtree(world, ignore_errors=True)


PATH_TEXT = st.builds(
    "".join,
    st.lists(
        st.sampled_from(
            ["a", "b", ".", "/", "-", " ", ",", ":", "~", "\\", "\n", "*", "$", ".png", ".svg", ".pdf", ".txt"]
        ),
        max_size=8,
    ),
)


@settings(max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=PATH_TEXT, verb=st.sampled_from(["budget", "report"]))
def test_a_plot_path_is_written_exactly_as_named_or_refused(name, verb):
    """Any ``--plot`` text: the verb writes that one file (and nothing else), or refuses it in one line (exit 2)."""
    import contextlib
    import io

    with tempfile.TemporaryDirectory(prefix="kc-fuzz-") as tmp:
        world = Path(tmp)
        argv = (
            ["budget", "recipe=tiny_gpt", "gpus=8", "days=10"]
            if verb == "budget"
            else ["report", str(_steady(world / "rd"))]
        )
        before = {p for p in world.rglob("*")}
        target = (world / "w" / name) if name else None
        (world / "w").mkdir()
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([*argv, "--plot", str(target) if target else ""])
        e = err.getvalue()
        assert rc in DOCUMENTED_EXITS and "internal error" not in e and "Traceback" not in e, (name, e)
        made = {p for p in world.rglob("*")} - before - {world / "w"}
        if rc == exits.USAGE:
            assert len(e.strip().splitlines()) == 1 and made == set(), (name, e, made)
        else:
            assert target is not None and {p.resolve() for p in made} <= {target.resolve()}, (name, made)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(flag=st.sampled_from(["--tag", "--base"]), value=st.text(max_size=40))
def test_image_never_accepts_what_is_not_an_image_reference(flag, value):
    """Anything that is not a reference is refused before a wheel is built or a file written."""
    if IMAGE_REFERENCE.fullmatch(value) and value:
        return  # a valid reference would build a wheel: the image tests cover that path
    with tempfile.TemporaryDirectory(prefix="kc-fuzz-") as tmp:
        import contextlib
        import io

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["image", "--output", f"{tmp}/ctx", flag, value])
        assert rc == exits.USAGE and len(err.getvalue().strip().splitlines()) == 1
        assert not Path(tmp, "ctx").exists()


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 258,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
"""A tiny Llama's ``config.json`` (no weights: the derived config is checked before any is read)."""

HF_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 10**9, 1e-300, "", "x", None, True, [], {}]),
    st.text(max_size=12),
)


def convert_derived(config: dict) -> tuple[int, str]:
    """``convert hf-to-mcore`` of a folder holding only ``config``, without a recipe (the model derived from it)."""
    import contextlib
    import io

    with tempfile.TemporaryDirectory(prefix="kc-fuzz-") as tmp:
        world = Path(tmp)
        (world / "hf").mkdir()
        (world / "hf" / "config.json").write_text(json.dumps(config, allow_nan=True))
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            result = finishes(lambda: main(["convert", "hf-to-mcore", str(world / "hf"), f"{world}/out"]), seconds=60)
        assert "error" not in result, result.get("error")
        e = err.getvalue()
        assert "Traceback" not in e and "internal error" not in e, (config, e)
        assert result["value"] in DOCUMENTED_EXITS and result["value"] != exits.OK, (config, e)
        assert leftovers(world) == [], leftovers(world)
        return result["value"], e


@settings(max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(set(LLAMA_CONFIG) - {"architectures", "model_type"})), value=HF_VALUES)
def test_a_hugging_face_config_with_any_value_is_refused_in_one_line(key, value):
    """A derived config is built from ``config.json``'s numbers: any value (huge, negative, NaN, a string) is refused
    in one line before anything is written or built (``num_hidden_layers: 1e9`` grew to 6 GB and hung)."""
    convert_derived({**LLAMA_CONFIG, key: value})


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("num_hidden_layers", 10**9, "model.num_layers=1000000000 (from config.json) is out of range"),
        ("rms_norm_eps", -1, "model.layernorm_epsilon=-1.0 (from config.json) is out of range"),
        ("num_hidden_layers", "2", 'config.json: num_hidden_layers is "2", expected a whole number'),
        ("rms_norm_eps", float("nan"), "config.json: rms_norm_eps is NaN, expected a finite number"),
    ],
)
def test_a_derived_model_outside_its_fields_domains_is_refused_before_writing(key, value, says):
    """``num_hidden_layers: 1000000000`` grew convert to 6 GB and hung; ``rms_norm_eps: -1`` was written into the
    recipe, which validate then refused: the derived config is checked against the domain table first."""
    rc, err = convert_derived({**LLAMA_CONFIG, key: value})
    assert rc == exits.INVALID and says in err and len(err.strip().splitlines()) == 1, err


def _document_ids(prefix: Path) -> list[int]:
    """The token ids of a one-document Megatron-Core dataset (its ``.idx`` header's dtype code, then the ``.bin``)."""
    import numpy

    code = prefix.with_suffix(".idx").read_bytes()[17]  # after the 9-byte magic and the u64 version
    dtype = {1: numpy.uint8, 3: numpy.int16, 4: numpy.int32, 5: numpy.int64, 8: numpy.uint16}[code]
    return [int(i) for i in numpy.frombuffer(prefix.with_suffix(".bin").read_bytes(), dtype=dtype)]


CHAT_MARKERS = [
    "<|endoftext|>",
    "<|end|>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "<pad>",
    "\ue000",
    "\ue0011\ue001",
]
"""The tiny chat tokenizer's special tokens and the slot characters its encoder renders with."""


@settings(max_examples=20, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parts=st.lists(st.one_of(st.sampled_from(CHAT_MARKERS), st.text(max_size=8)), min_size=1, max_size=6),
    role=st.sampled_from(["user", "assistant"]),
)
def test_chat_content_is_plain_text_whatever_it_spells(parts, role):
    """Whatever a message's text spells (special tokens, the encoder's own slot characters), ``preprocess --chat``
    writes the template's markers and the end of document as the only special ids of the conversation."""
    import contextlib
    import io

    from kilocard.paths import data_dir

    chat = data_dir("conf").parent / "data" / "tiny_chat"
    content = "".join(parts)
    messages = [{"role": "user", "content": content if role == "user" else "q"}]
    messages.append({"role": "assistant", "content": content if role == "assistant" else "a"})
    with tempfile.TemporaryDirectory(prefix="kc-fuzz-") as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text(json.dumps({"messages": messages}) + "\n", encoding="utf-8")
        argv = ["preprocess", "--chat", "--input", str(src), "--tokenizer", str(chat), "--output-prefix", f"{tmp}/o"]
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            result = finishes(lambda: main(argv))
        assert result.get("value") == exits.OK, (content, err.getvalue(), result.get("error"))
        ids = _document_ids(Path(f"{tmp}/o_text_document"))
    specials = json.loads((chat / "tokenizer_config.json").read_text()).get("added_tokens_decoder", {})
    special_ids = {int(k) for k in specials} or set(range(6))
    assert [i for i in ids if i in special_ids] == [3, 5, 4, 5, 0], (content, ids)
