"""Names of the files and environment variables the trainer shares with its launchers.

Imports nothing, so the launchers (``kilocard.launch``) and the progress table read the same names
the ranks write without importing torch.
"""

CHECKPOINTS_DIR = "checkpoints"
"""Checkpoint directory inside the run directory when ``checkpoint.save`` is not set."""
TRACKER = "latest_committed.txt"
"""Tracker file in the checkpoint directory: the newest committed step (temp file + fsync + rename)."""
OWNER = "owner.json"
"""Owner file in the checkpoint directory: the run (its run directory) whose steps it holds."""
MANIFEST = "manifest.json"
"""Per-step integrity manifest (relative path -> size, sha256 of every other file of the step)."""
STATE = "trainer_state.json"
"""Per-step trainer state: step, data position, LR scheduler, model config, layout."""
METRICS_FILE = "metrics.jsonl"
"""One JSON object per optimizer step, in the run directory."""
EXIT_DIR_ENV = "KILOCARD_EXIT_DIR"
"""When set, every rank writes its exit code to ``$KILOCARD_EXIT_DIR/rank_<RANK>`` (torchrun reports only 0/1)."""
MODEL_ONLY = "model_only"
"""``TrainerState.extra`` key marking a step that holds model weights only (``kilocard convert hf-to-mcore``):
a run starts from it at step 0 with a fresh optimizer and LR schedule."""
PEFT = "peft"
"""``TrainerState.extra`` key of a LoRA step (``peft=lora``): the ``peft`` config it was trained with and
``base``, the step directory of the frozen base weights, and ``base_digest``, that step's content digest (a base
replaced at that path is refused); the step itself holds the adapters only."""
EVENTS_FILE = "events.jsonl"
"""One JSON object per run event (launch attempt, resume, committed checkpoint, exit), each with ``time``
(unix seconds), in the run directory; appended by rank 0 (``kilocard.rundir.events``)."""
BLOCKLIST = "nodes/blocklist.tsv"
"""Nodes kept out of the run's Slurm jobs, one line each: node, reason, job, time (tab-separated); appended by
the node health check (``kilocard.train.health``); the batch script of an in-job run excludes them."""
FAILED_RANKS = "nodes/failed_ranks.tsv"
"""Which node hosted the failed rank of each in-job restart, one line each: node, ranks, job, attempt, time."""
UNHEALTHY_NODES_ENV = "KILOCARD_FAULT_UNHEALTHY_NODES"
"""Fault injection (tests): comma-separated node names whose health check fails as if the node were bad."""
STEP_DELAY_ENV = "KILOCARD_FAULT_STEP_DELAY_S"
"""Fault injection (tests): seconds every rank sleeps before each training step, outside the timed step: a
slow run that costs no CPU (a test that needs a run to outlast a Slurm signal waits instead of computing)."""
