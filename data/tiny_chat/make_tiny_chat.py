"""Make ``data/tiny_chat``: a tiny chat tokenizer (with a chat template) and conversations, for ``tiny_llama_sft``.

- ``tokenizer.json``: a byte-level BPE of 320 ids trained on the tiny corpus with Hugging Face
  ``tokenizers``: ``<|endoftext|>`` (0, end of document), ``<pad>`` (1), the chat markers
  ``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|end|>``, the 256 byte symbols, then merges.
- ``tokenizer_config.json``: its ``chat_template`` (``<|role|>`` newline, content, ``<|end|>``; the
  generation prompt is ``<|assistant|>`` newline), ``eos_token`` and ``pad_token``.
- ``conversations.jsonl``: one conversation per tiny-corpus paragraph: the user gives its first
  sentence, the assistant answers with the second; every third has a system turn, every fifth is in
  the ``{"prompt", "completion"}`` form.

Deterministic: the shipped files are what this script writes.

    python data/tiny_chat/make_tiny_chat.py
    kilocard preprocess --chat --input data/tiny_chat/conversations.jsonl --tokenizer data/tiny_chat \\
        --output-prefix data/tiny_chat/tiny_chat
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "tiny_corpus" / "tiny_corpus.jsonl"
VOCAB_SIZE = 320
SPECIAL_TOKENS = ["<|endoftext|>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
SYSTEM = "You continue short stories, one sentence at a time."


def texts() -> list[str]:
    """The tiny corpus's paragraphs."""
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines if line.strip()]


def train(documents: list[str]) -> Tokenizer:
    """The tiny corpus's byte-level BPE recipe, with the chat markers as special tokens."""
    sys.path.insert(0, str(HERE.parent / "tiny_corpus"))
    from train_tokenizer import train as train_bpe

    return train_bpe(documents, VOCAB_SIZE, SPECIAL_TOKENS)


def conversations(documents: list[str]) -> list[dict]:
    """One conversation per paragraph with at least two sentences."""
    out: list[dict] = []
    for text in documents:
        sentences = re.split(r"(?<=[.!?])\s+", text.strip())
        if len(sentences) < 2:
            continue
        k = len(out)
        if k % 5 == 4:
            out.append({"prompt": sentences[0], "completion": sentences[1]})
            continue
        messages = [{"role": "system", "content": SYSTEM}] if k % 3 == 0 else []
        messages += [{"role": "user", "content": sentences[0]}, {"role": "assistant", "content": sentences[1]}]
        out.append({"messages": messages})
    return out


def main() -> None:
    documents = texts()
    train(documents).save(str(HERE / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "eos_token": "<|endoftext|>",
        "pad_token": "<pad>",
        "model_max_length": 4096,
    }
    (HERE / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    rows = conversations(documents)
    (HERE / "conversations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {HERE}: tokenizer ({VOCAB_SIZE} ids), {len(rows)} conversations")


if __name__ == "__main__":
    main()
