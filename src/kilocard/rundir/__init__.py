"""The run directory: what ``launch`` writes and ``train`` fills, the one place where the two meet.

Modules: ``names`` (file and variable names; imports nothing), ``freeze`` (the frozen config and its
sha256), ``lock`` (one writer per run directory: the OS lock; rank 0 claims it in ``train.claim``),
``events`` (events.jsonl), ``metrics`` (metrics.jsonl: writer and reader, TFLOP/s and MFU),
``checkpoint`` (the checkpoint protocol: manifest, tracker, verify, which step to resume),
``progress`` (live line, summary table) and ``goodput_report`` (time lost, from the run's records).
``launch`` and ``train`` both sit above this package and never import each other. Nothing here
imports torch: the launchers read what the ranks write.
"""
