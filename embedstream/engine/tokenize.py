"""Tokenisation with the Rust fast tokenizer: one text (or pair) in, token ids out, limits enforced.

A text over the model's limit is an error unless truncation was asked for; then the item is
marked truncated so the reply can say so. No padding is ever produced here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Encoding, Tokenizer

from embedstream.engine.errors import ConfigError, EngineError


@dataclass(slots=True)
class Tokenized:
    """Token ids of one sequence, ready to be packed into a batch."""

    ids: list[int]
    type_ids: list[int]
    truncated: bool = False
    prompt_tokens: int = 0  # leading tokens that belong to the prompt (pooled only if the model includes them)

    def __len__(self) -> int:
        return len(self.ids)


def load_tokenizer(folder: Path) -> Tokenizer:
    """The folder's tokenizer.json (the fast tokenizer) with padding and truncation switched off."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        # Slow-only tokenizers: let transformers convert once; its fast backend is the same Rust object.
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(folder), use_fast=True)
            backend = tok.backend_tokenizer
        except Exception as exc:  # noqa: BLE001 - report any conversion failure as a config problem
            raise ConfigError(f"{folder}: no tokenizer.json and no convertible tokenizer ({exc})") from exc
    else:
        backend = Tokenizer.from_file(str(path))
    backend.no_padding()
    backend.no_truncation()
    return backend


class TextTokenizer:
    """Checks and tokenises texts for one model, enforcing its token limit."""

    def __init__(self, tokenizer: Tokenizer, max_tokens: int, lowercase: bool = False):
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.lowercase = lowercase
        processor = tokenizer.post_processor
        self.special_single = processor.num_special_tokens_to_add(False) if processor else 0
        self.special_pair = processor.num_special_tokens_to_add(True) if processor else 0
        self._special_ids = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
        self._prompt_tokens: dict[str, int] = {}

    def prompt_tokens(self, prompt: str) -> int:
        """How many leading tokens of a prompted text are the prompt, counted as sentence-transformers
        counts them for ``include_prompt=False``: the prompt tokenised alone with its special tokens,
        less a trailing special one (BERT: ``[CLS]`` and the prompt's words, not ``[SEP]``)."""
        count = self._prompt_tokens.get(prompt)
        if count is None:
            ids = self.tokenizer.encode(prompt.lower() if self.lowercase else prompt).ids
            count = len(ids) - (1 if ids and ids[-1] in self._special_ids else 0)
            self._prompt_tokens[prompt] = count
        return count

    @staticmethod
    def check_text(text: object, field: str = "text", max_bytes: int | None = None) -> str:
        """Reject what cannot be embedded, with a reason a user can act on. ``max_bytes`` bounds the
        work one request can cause before the tokenizer ever sees it."""
        if not isinstance(text, str):
            raise EngineError("not_a_string", f"{field} must be a string, got {type(text).__name__}")
        if max_bytes is not None and len(text) * 4 > max_bytes:  # cheap bound first; exact count only near the limit
            size = len(text.encode("utf-8", "surrogatepass"))
            if size > max_bytes:
                raise EngineError("text_too_large", f"{field} is {size} bytes, over the limit of {max_bytes} bytes")
        if not text.strip():
            raise EngineError("empty_text", f"{field} is empty")
        return text

    def _finish(self, enc: Encoding) -> Tokenized:
        processed = self.tokenizer.post_process(enc) if self.tokenizer.post_processor else enc
        return Tokenized(list(processed.ids), list(processed.type_ids))

    def encode_many(self, texts: list[str], truncate: list[bool]) -> list[Tokenized | EngineError]:
        """Tokenise a batch of already-checked texts (parallel in Rust)."""
        raw = self.tokenizer.encode_batch(
            [t.lower() if self.lowercase else t for t in texts], add_special_tokens=False
        )
        out: list[Tokenized | EngineError] = []
        budget = self.max_tokens - self.special_single
        for enc, may_truncate in zip(raw, truncate):
            length = len(enc.ids) + self.special_single
            if length > self.max_tokens:
                if not may_truncate:
                    out.append(
                        EngineError(
                            "too_long",
                            f"text has {length} tokens, over the model's limit of {self.max_tokens} "
                            f"(chunk it, or ask for truncation)",
                        )
                    )
                    continue
                enc.truncate(budget)
                item = self._finish(enc)
                item.truncated = True
                out.append(item)
            else:
                out.append(self._finish(enc))
        return out

    def encode_pairs(self, pairs: list[tuple[str, str]]) -> list[Tokenized | EngineError]:
        """Tokenise (query, passage) pairs; an over-long passage is cut to fit and flagged."""
        queries = self.tokenizer.encode_batch([q for q, _ in pairs], add_special_tokens=False)
        passages = self.tokenizer.encode_batch([p for _, p in pairs], add_special_tokens=False)
        out: list[Tokenized | EngineError] = []
        for q, p in zip(queries, passages):
            room = self.max_tokens - self.special_pair - len(q.ids)
            if room < 1:
                out.append(
                    EngineError(
                        "too_long",
                        f"query has {len(q.ids)} tokens, leaving no room for a passage within the model's limit "
                        f"of {self.max_tokens}",
                    )
                )
                continue
            truncated = len(p.ids) > room
            if truncated:
                p.truncate(room)
            enc = self.tokenizer.post_process(q, p) if self.tokenizer.post_processor else Encoding.merge([q, p])
            out.append(Tokenized(list(enc.ids), list(enc.type_ids), truncated))
        return out
