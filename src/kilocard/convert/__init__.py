"""Hugging Face checkpoints in and out of kilocard (``kilocard convert``).

An explicit per-family map (``maps``: Llama 2/3/3.1, Mixtral, Qwen2) between Hugging Face names and
shapes and the trainer's own Megatron-Core model, streamed through safetensors (``st_io``), written and
read as the trainer's torch_dist checkpoints (``model``), behind the verb (``command``).

Why not Megatron-Bridge: Bridge 0.3.1 (the release for megatron-core 0.16) imports Transformer Engine
and Triton unconditionally, so on CPU machines it needs its source patched at import, its declared
dependencies cannot be installed, and it has no Mixtral bridge (``MixtralForCausalLM is not yet
supported``). The explicit maps are small, bit-identical to Bridge's Llama mapping, and each is
checked against ``transformers`` by the tests.

Only the ``convert`` verb (``kilocard.commands.convert``) imports this package.
"""
