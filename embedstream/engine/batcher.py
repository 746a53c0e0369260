"""The token-budget batcher: packs sequences by tokens, not by count.

A batch holds at most ``max_batch_tokens`` real tokens and ``max_batch_requests`` sequences.
The workers take FIFO prefixes of their queues (``take_prefix``: log order kept, deletes in place);
``pack`` groups a whole list at once, in order or (``Engine.embed``/``score`` by default) longest
first, so that batches span a narrow band of lengths. Nothing is ever padded: the runner consumes the
packed layout directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from embedstream.engine.errors import ConfigError


@dataclass(frozen=True)
class BatchLimits:
    """Validated batching limits for one model."""

    max_batch_tokens: int
    max_batch_requests: int

    @classmethod
    def for_model(cls, max_batch_tokens: int, max_batch_requests: int, model_max_tokens: int) -> "BatchLimits":
        """Refuse at start a budget that could never fit one full-length sequence (it would hang later)."""
        if max_batch_requests < 1:
            raise ConfigError(f"max_batch_requests must be at least 1, got {max_batch_requests}")
        if max_batch_tokens < model_max_tokens:
            raise ConfigError(
                f"max_batch_tokens={max_batch_tokens} is below the model's max tokens ({model_max_tokens}): "
                f"a full-length text could never be batched; raise max_batch_tokens to at least {model_max_tokens}"
            )
        return cls(max_batch_tokens, max_batch_requests)


def pack(lengths: Sequence[int], limits: BatchLimits, sort_by_length: bool = False) -> list[list[int]]:
    """Group item indices into batches that respect the token and request budgets.

    With ``sort_by_length`` (bulk) items are taken longest first, so each batch spans a narrow
    band of lengths; otherwise (online) arrival order is kept.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i]) if sort_by_length else range(len(lengths))
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i in order:
        n = lengths[i]
        if n > limits.max_batch_tokens:
            raise ConfigError(f"item {i} has {n} tokens, over max_batch_tokens={limits.max_batch_tokens}")
        if current and (tokens + n > limits.max_batch_tokens or len(current) >= limits.max_batch_requests):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += n
    if current:
        batches.append(current)
    return batches


def take_prefix(lengths: Sequence[int], limits: BatchLimits, used_tokens: int = 0, used_requests: int = 0) -> int:
    """How many items from the front of a queue fit in the budget left (streaming batch formation).

    Used by the workers to fill a batch from the online lane first and then top it up from bulk.
    """
    count = 0
    tokens = used_tokens
    for n in lengths:
        if used_requests + count >= limits.max_batch_requests or tokens + n > limits.max_batch_tokens:
            break
        tokens += n
        count += 1
    return count
