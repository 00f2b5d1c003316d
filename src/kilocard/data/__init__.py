"""kilocard's data path: tokenizers, ``kilocard preprocess`` and the trainer's micro-batch iterator.

Contract with the trainer
-------------------------
``build_train_iterator(run_cfg, *, dp_rank, dp_size, consumed_samples=0, cache_dir=None,
create_attention_mask=True) -> TrainIterator``

* Call it on **every** rank, after ``torch.distributed`` is initialised (or in a single process
  without it). It is collective when torch.distributed is initialised: Megatron-Core's
  ``BlendedMegatronDatasetBuilder`` builds the dataset indices on global rank 0 first, then
  barriers, then the other ranks load them from the cache. Every rank builds its own copy
  (``is_built_on_rank`` is always true); ranks with the same ``dp_rank`` (TP/PP/CP peers) get
  identical batches.
* ``dp_rank``/``dp_size``: this rank's data-parallel coordinates
  (``parallel_state.get_data_parallel_rank()`` / ``get_data_parallel_world_size()``).
* ``consumed_samples``: global samples already trained on (``step * global_batch_size`` at a
  step boundary; saved in the checkpoint). A run resumed with the same value sees exactly the
  micro-batches an uninterrupted run would have seen next.
* ``cache_dir``: where Megatron-Core's dataset index caches go when ``data.path_to_cache`` is
  unset (pass ``<run_dir>/data_cache``: it must be on a filesystem every node sees). With both
  unset, Megatron-Core's default applies: a ``cache/`` folder beside the data prefix.
* The iterator yields micro-batches, ``global_batch_size / (micro_batch_size * dp_size)`` of them
  per optimizer step, each a dict of CPU tensors (Megatron-Core ``GPTModel.forward`` inputs):

  - ``tokens``         int64   ``[micro_batch_size, seq_length]``
  - ``labels``         int64   ``[micro_batch_size, seq_length]`` (tokens shifted left by one)
  - ``loss_mask``      float32 ``[micro_batch_size, seq_length]`` (1.0 = counts toward the loss)
  - ``attention_mask`` bool    ``[micro_batch_size, 1, seq_length, seq_length]`` (True = masked),
    or ``None`` when ``create_attention_mask=False`` (the trainer asks for it only for
    ``data.reset_attention_mask`` on Megatron-Core's local attention: block-diagonal causal)
  - ``position_ids``   int64   ``[micro_batch_size, seq_length]`` (restarting at 0 after every EOD with
    ``data.reset_position_ids``)

  ``seq_length`` is ``model.seq_length``. Sample order follows Megatron-LM's
  ``MegatronPretrainingSampler``: micro step ``k`` (counted from ``consumed_samples``) covers global
  sample indices ``consumed_samples + k*mbs*dp_size + [dp_rank*mbs, (dp_rank+1)*mbs)``.
  The iterator stops after ``trainer.train_iters * global_batch_size`` global samples.
  ``iterator.consumed_samples`` is the global position of the next micro step's batch.
* ``data.type == "mock"``: Megatron-Core's ``MockGPTDataset`` (no files). ``data.type ==
  "indexed"``: ``GPTDataset`` over ``data.data_path`` (prefixes of ``.bin/.idx``, optionally
  weighted ``[w1, p1, w2, p2]``), train split of ``data.split``. A relative prefix is looked up
  in the current directory first, then under kilocard's shipped root (the repository in a source
  checkout, the package in a wheel), so ``data/tiny_corpus/tiny_corpus_text_document`` works from
  anywhere.
* ``data.sft``: ``SFTDataset`` (``kilocard.data.sft``) instead of ``GPTDataset``: the same samples, with
  ``loss_mask`` also 0 on every target that is not an assistant token (the ``PREFIX_loss_mask`` dataset
  of ``kilocard preprocess --chat``, ``kilocard.data.chat``). ``data.packing=false``: ``UnpackedSFTDataset``,
  one conversation per sample, padded (``kilocard.data.sft``).
* The padded vocabulary (``model.vocab_size`` rounded up to ``make_vocab_size_divisible_by * TP``)
  must cover the tokenizer's ids.
* Evaluation (``trainer.eval_interval``): ``build_eval_dataset(run_cfg, split, dp_size=...)`` builds the
  validation or test split of ``data.split`` (``kilocard.data.split``: Megatron-Core's arithmetic, and
  how many samples each split must hold), and ``eval_batches(dataset, run_cfg, start=..., rounds=...,
  dp_rank=..., dp_size=...)`` yields ``rounds`` global batches of it from global sample ``start`` in the
  same order and slices as training reads its split.
* Bad input raises ``DataError`` (one line: field, value, fix), never a bare traceback.

Modules (import each where it is used: the package itself imports nothing, so the torch-free
ones, ``paths`` and ``errors``, stay light for the validator): ``iterator`` (``build_train_iterator``,
``TrainIterator``, ``build_eval_dataset``, ``eval_batches``), ``split`` (``data.split`` arithmetic),
``tokenizer`` (``get_tokenizer(name)``: ``kilocard-bytes``, or a local Hugging
Face ``tokenizer.json``, SentencePiece model or tiktoken BPE file), ``preprocess``
(``preprocess_jsonl``, ``preprocess_chat``, called by the ``kilocard preprocess`` verb), ``chat``
(conversations -> token ids and assistant mask with the tokenizer's chat template), ``sft``
(``SFTDataset``), ``paths``
(``resolve_data_prefix(prefix)``), ``errors`` (``DataError``).
"""
