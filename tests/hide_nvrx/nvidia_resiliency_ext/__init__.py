"""Hides NVRx from the megatron-core 0.19.2 pass of scripts/test.sh (this folder is first on its PYTHONPATH).

megatron-core 0.19 asserts at import that an installed nvidia-resiliency-ext is at least 0.6.0
(``dist_checkpointing/strategies/nvrx.py``); 0.6.0 needs Python >= 3.12, and 0.4.1 (the ``resiliency``
extra, the newest for Python 3.11) is what this venv has. That pass re-runs the trainer, checkpoint and
Megatron-Core differential tests, none of which use NVRx; the in-job restart tests run in the main pass
(megatron-core 0.16.1). A regular package here wins over NVRx's namespace package in site-packages.
"""

raise ImportError("nvidia_resiliency_ext is hidden in the megatron-core 0.19.2 pass (see this file)")
