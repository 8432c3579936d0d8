"""The built-in chat prompt sets (``builtin:chat-train`` / ``builtin:chat-heldout``) for instruction-tuned targets.

Three sources, interleaved so that the first N prompts of a set mix all three:
- **code**: the default target's stdlib function stubs (signature + docstring, ``stdlib_*.jsonl``), asked as
  "complete this function"; held-out stubs come from held-out stdlib files.
- **docs**: paragraphs of the Python language reference as shipped in every Python install
  (``pydoc_data/topics.py``), asked to be explained, summarized or illustrated; built on the machine, a
  paragraph held out by the hash of its text.
- **magpie**: instructions SmolLM2-135M-Instruct wrote itself given only its chat template's user-turn prefix
  (``smollm2_magpie.jsonl``, made by ``python -m draftsmith.data.magpie``); every tenth held out.
"""

from __future__ import annotations

import hashlib
import textwrap
from importlib import resources
from itertools import zip_longest
from pathlib import Path

from draftsmith.data.records import Prompt, read_jsonl

SPLITS = ("train", "heldout")
HELDOUT_PERCENT = 10
CODE_ASK = "Complete the body of this Python function. Reply with the code only.\n\n```python\n{code}\n```"
DOC_ASKS = (
    "Explain this passage from the Python documentation in plain words:\n\n{text}",
    "Summarize this in two sentences:\n\n{text}",
    "Write a short Python example that illustrates this:\n\n{text}",
)
MIN_CHARS, MAX_CHARS = 160, 700


def _file(name: str) -> Path:
    return Path(str(resources.files("draftsmith.data") / "prompts" / name))


def _user(text: str, source: str) -> Prompt:
    return Prompt(messages=({"role": "user", "content": text},), source=source)


def _heldout(key: str) -> bool:
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def code_prompts(split: str) -> list[Prompt]:
    stubs = read_jsonl(_file(f"stdlib_{split}.jsonl"))
    return [_user(CODE_ASK.format(code=textwrap.dedent(p.text).rstrip()), f"code:{p.source}") for p in stubs]


def doc_paragraphs() -> list[tuple[str, str]]:
    """(topic, paragraph) pairs of the language reference: prose paragraphs of MIN_CHARS..MAX_CHARS characters."""
    from pydoc_data.topics import topics

    out = []
    for topic in sorted(topics):
        for para in topics[topic].split("\n\n"):
            para = " ".join(line.strip() for line in para.strip().splitlines())
            if MIN_CHARS <= len(para) <= MAX_CHARS and para[0].isalpha() and "::=" not in para:
                out.append((topic, para))
    return out


def doc_prompts(split: str) -> list[Prompt]:
    rows = [(t, p) for t, p in doc_paragraphs() if _heldout(p) == (split == "heldout")]
    return [_user(DOC_ASKS[i % len(DOC_ASKS)].format(text=p), f"docs:{t}") for i, (t, p) in enumerate(rows)]


def magpie_prompts(split: str) -> list[Prompt]:
    path = _file("smollm2_magpie.jsonl")
    rows = read_jsonl(path) if path.is_file() else []
    return [p for i, p in enumerate(rows) if (i % 10 == 9) == (split == "heldout")]


def chat_prompts(split: str) -> list[Prompt]:
    """The ``split`` set, the three sources interleaved (code, docs, magpie, code, ...)."""
    sources = (code_prompts(split), doc_prompts(split), magpie_prompts(split))
    return [p for group in zip_longest(*sources) for p in group if p is not None]
