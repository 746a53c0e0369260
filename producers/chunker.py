"""Token-budgeted chunking: split a document into pieces the model can embed without truncation.

Sizes are measured with the model's own fast tokenizer, so a chunk never exceeds the model's
limit once the engine adds its special tokens. Cut points prefer paragraph breaks, then sentence
ends, then word boundaries (found through the encoding's character offsets); a run of text with
no boundary at all (a giant URL, base64) is cut between tokens. Chunks are substrings of the
original text (leading/trailing whitespace dropped), so offsets and highlighting stay meaningful.

Cuts are content-defined, so an edit re-chunks only its neighbourhood: every cut that ranks highest
(boundary level, then a hash of the tokens before it) among the cuts within half a chunk either side
is an *anchor*, and chunks always end at anchors; a stretch between two anchors too long for one
chunk is cut into even pieces at its best boundaries. Whether a cut is an anchor depends on the text
around it only, never on where the document or the previous chunk starts, so a sentence edited in
the middle of a long document changes the chunks around it (1-3) and leaves the others as they were
(the greedy token-filled cuts this replaced could move every later boundary).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from tokenizers import Encoding, Tokenizer

from embedstream.engine.tokenize import TextTokenizer, load_tokenizer, st_lowercase
from embedstream.schemas.token_ids import TokenDtype, dtype_for_vocab, encode_token_ids

if TYPE_CHECKING:
    from embedstream.engine.model_spec import ModelSpec

MIN_CHUNK_TOKENS = 16

# Boundary strengths, compared numerically: higher is a better place to cut.
_NONE, _WORD, _LINE, _SENTENCE, _PARAGRAPH = 0, 1, 2, 3, 4
_SENTENCE_END = frozenset(".!?…")
_CJK_SENTENCE_END = frozenset("。！？")
_CLOSERS = "\"')]}»”’"
_PARAGRAPH_GAP = re.compile(r"\n[^\S\n]*\n")
_MAX_REPAIR_ROUNDS = 8
_ANCHOR_CONTEXT = 24  # tokens before a cut whose text ranks it (content-defined cuts)
_HASH_BASE = 0x100000001B3  # the polynomial hash's base (FNV's 64-bit prime)
_ANCHOR_SPACING = 2  # anchors lie more than (chunk - overlap) / this many tokens apart
# The latest results a chunker remembers, by a 16-byte digest of the text (never the text itself): a
# document's spans (13 MB when full of 2-chunk rows, 34 MB of 41-chunk ones), a chunk's wire ids (~0.7 KB at
# 200 tokens: ~12 MB).
# A CDC status flip sends a row's unchanged text again: found here, it is not chunked again (0.35 ms of CPU
# for a 400-character row, measured) nor its chunks tokenized (0.25 ms more); 256 whole texts were kept
# before, so a table of more rows than that missed on every flip.
_RECENT_DOCUMENTS = 65_536
_RECENT_CHUNKS = 16_384

# Tokenizer parts under which text cut at whitespace re-tokenizes to exactly the token slice it
# came from (per-character normalisation, whitespace-splitting pre-tokenisation, per-word models).
_LOCAL_NORMALIZERS = frozenset({"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"})
_WHITESPACE_PRE_TOKENIZERS = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})
_WORD_LOCAL_PRE_TOKENIZERS = _WHITESPACE_PRE_TOKENIZERS | {"Punctuation", "Digits"}
_WORD_MODELS = frozenset({"WordPiece", "BPE", "Unigram", "WordLevel"})


@dataclass(frozen=True, slots=True)
class _Span:
    """Token range [start, end) of one chunk."""

    start: int
    end: int


class Chunker:
    """Splits text into chunks of at most ``chunk_tokens`` tokens, overlapping by ``overlap_tokens``.

    ``special_tokens`` is what the engine adds around a sequence ([CLS]/[SEP]: 2 for BERT); it defaults
    to what the tokenizer's post-processor adds. ``reserved_tokens`` keeps room for a prompt the
    engine prepends (see :meth:`for_model`). Thread-safe: the tokenizer is only read.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        max_tokens: int,
        chunk_tokens: int = 200,
        overlap_tokens: int = 32,
        special_tokens: int | None = None,
        reserved_tokens: int = 0,
    ):
        if special_tokens is None:
            processor = tokenizer.post_processor
            special_tokens = processor.num_special_tokens_to_add(False) if processor else 0
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if special_tokens < 0 or reserved_tokens < 0:
            raise ValueError("special_tokens and reserved_tokens must not be negative")
        if chunk_tokens < MIN_CHUNK_TOKENS:
            raise ValueError(f"chunk_tokens must be at least {MIN_CHUNK_TOKENS}, got {chunk_tokens}")
        self.limit = max_tokens - special_tokens - reserved_tokens
        if self.limit < MIN_CHUNK_TOKENS:
            raise ValueError(
                f"the model leaves room for only {self.limit} text tokens (max_tokens {max_tokens} - "
                f"{special_tokens} special - {reserved_tokens} reserved); at least {MIN_CHUNK_TOKENS} are needed"
            )
        self.chunk_tokens = min(chunk_tokens, self.limit)
        if not 0 <= overlap_tokens < self.chunk_tokens:
            raise ValueError(
                f"overlap_tokens must be in 0..{self.chunk_tokens - 1} (below the chunk size of "
                f"{self.chunk_tokens} tokens{' after clamping to the model limit' if chunk_tokens > self.limit else ''}), "
                f"got {overlap_tokens}"
            )
        self.overlap_tokens = overlap_tokens
        self.max_tokens = max_tokens
        self.special_tokens = special_tokens
        self.reserved_tokens = reserved_tokens
        self.tokenizer = _without_truncation(tokenizer)
        self._whitespace_exact = _cuts_at_whitespace_are_exact(self.tokenizer)
        self._recent = _Recent(_RECENT_DOCUMENTS)  # digest of a text -> its spans, flat (start, end, ...)
        self.ids: ChunkIds | None = None  # set by for_model: chunks then carry the model's token ids

    @classmethod
    def for_model(cls, spec: ModelSpec, chunk_tokens: int = 200, overlap_tokens: int = 32,
                  token_ids: bool = True) -> Chunker:
        """A chunker for a resolved ModelSpec: its tokenizer, limit, and room for its document prompt.

        With ``token_ids`` (the default) :meth:`token_ids_many` gives each chunk's model input, so
        workers serving this model need not tokenize it again."""
        tokenizer = load_tokenizer(spec.path)
        prompt = spec.document_prompt
        reserved = len(tokenizer.encode(prompt, add_special_tokens=False).ids) if prompt else 0
        chunker = cls(tokenizer, spec.max_tokens, chunk_tokens, overlap_tokens, reserved_tokens=reserved)
        if token_ids:
            chunker.ids = ChunkIds(TextTokenizer(tokenizer, spec.max_tokens, st_lowercase(spec.path)), prompt)
        return chunker

    def token_ids_many(self, chunks: Sequence[str]) -> list[str | None]:
        """Per chunk, its ids on the wire (:mod:`embedstream.schemas.token_ids`), or None for a text-only
        chunk: this chunker was not made for a model, or the model would refuse the chunk's text."""
        if self.ids is None:
            return [None] * len(chunks)
        return self.ids.encode(chunks)

    def count_tokens(self, text: str) -> int:
        """Tokens of text without special tokens, as the engine will count them."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def chunk(self, text: str) -> list[str]:
        """The chunks of text, in order; [] for empty or whitespace-only text. Deterministic."""
        return [text[start:end] for start, end in self.spans(text)]

    def chunk_many(self, texts: Sequence[str]) -> list[list[str]]:
        """chunk() for many texts, tokenized as one batch (parallel in Rust, GIL released)."""
        return [[text[a:b] for a, b in spans] for text, spans in zip(texts, self.spans_many(texts))]

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character ranges [start, end) of the chunks in text (for offsets and highlighting)."""
        return self.spans_many([text])[0]

    def spans_many(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """spans() for many texts with one batched tokenizer call (a text chunked lately is not tokenized
        again: a document sent again with new metadata only, a replay)."""
        out: list[list[tuple[int, int]]] = [[] for _ in texts]
        todo = []
        for i, text in enumerate(texts):
            if text and not text.isspace():
                known = self._recent.get(_digest(text))
                if known is None:
                    todo.append(i)
                else:
                    out[i] = list(zip(known[::2], known[1::2]))
        if todo:
            encodings = self.tokenizer.encode_batch([texts[i] for i in todo], add_special_tokens=False)
            for i, encoding in zip(todo, encodings):
                out[i] = self._fit(texts[i], *self._plan_spans(texts[i], 0, encoding, self.chunk_tokens, self.overlap_tokens))
                self._recent.put(_digest(texts[i]), array("I", [x for span in out[i] for x in span]))
        return out

    def _fit(self, text: str, spans: list[tuple[int, int]], checked: list[bool]) -> list[tuple[int, int]]:
        """Re-split chunks whose real token count is over the limit (only those not known to be exact)."""
        for _ in range(_MAX_REPAIR_ROUNDS):
            # A substring can tokenize differently from the token slice it came from (a word cut in
            # two, byte-level BPE's leading space), so unless the cut was provably exact the hard
            # limit is checked on the real text.
            todo = [i for i, ok in enumerate(checked) if not ok]
            if not todo:
                return spans
            encodings = self.tokenizer.encode_batch([text[slice(*spans[i])] for i in todo], add_special_tokens=False)
            over = {i: len(enc.ids) for i, enc in zip(todo, encodings) if len(enc.ids) > self.limit}
            if not over:
                return spans
            repaired: list[tuple[int, int]] = []
            repaired_checked: list[bool] = []
            for i, span in enumerate(spans):
                if i not in over:
                    repaired.append(span)
                    repaired_checked.append(True)
                    continue
                budget = max(1, self.limit - (over[i] - self.limit) - 1)
                part = text[span[0] : span[1]]
                encoding = self.tokenizer.encode(part, add_special_tokens=False)
                sub, sub_checked = self._plan_spans(part, span[0], encoding, budget, min(self.overlap_tokens, budget // 2))
                repaired.extend(sub)
                repaired_checked.extend(sub_checked)
            spans, checked = repaired, repaired_checked
        raise RuntimeError(f"could not split text under {self.limit} tokens per chunk (tokenizer is unstable)")

    def _plan_spans(
        self, part: str, lo: int, encoding: Encoding, budget: int, overlap: int
    ) -> tuple[list[tuple[int, int]], list[bool]]:
        """Chunk spans (offset by lo) of part from its encoding, and per chunk whether its token count is exact."""
        if self._whitespace_exact:  # tokens never contain whitespace: offsets are already tight
            starts = [start for start, _ in encoding.offsets]
            ends = [end for _, end in encoding.offsets]
        else:
            starts, ends = _core_offsets(part, encoding.offsets)
        if not starts:
            return [], []
        levels = _boundary_levels(part, starts, ends)
        ranks = _anchor_ranks(encoding.ids, levels)
        spans: list[tuple[int, int]] = []
        exact: list[bool] = []
        for span in _plan(levels, ranks, len(starts), budget, overlap):
            start, end = starts[span.start], ends[span.end - 1]
            if start < end and not part[start:end].isspace():
                spans.append((lo + start, lo + end))
                exact.append(self._whitespace_exact and levels[span.start] > _NONE and levels[span.end] > _NONE)
        return spans, exact


class ChunkIds:
    """A model's input ids for chunks: its document prompt + the text, tokenized exactly as the engine
    does (the engine's own TextTokenizer: lowercasing, special tokens), with the fingerprint that
    lets a worker trust them. Tokenizing the chunks again costs this producer ~0.3 ms per 200-token
    chunk, once, instead of every worker that embeds it."""

    def __init__(self, tokenizer: TextTokenizer, prompt: str | None):
        self.tokenizer = tokenizer
        self.prompt = prompt or ""
        self.fingerprint = tokenizer.fingerprint(prompt)
        self.dtype: TokenDtype = dtype_for_vocab(tokenizer.vocab_size)
        self._recent = _Recent(_RECENT_CHUNKS)  # digest of a chunk -> its wire ids (an edit leaves most chunks as they were)

    def encode(self, chunks: Sequence[str]) -> list[str | None]:
        """Base64 ids per chunk (None where the engine would refuse the text: empty, over the limit)."""
        out: list[str | None] = [None] * len(chunks)
        live = []
        for i, chunk in enumerate(chunks):
            if chunk.strip():
                known = self._recent.get(_digest(chunk))
                if known is None:
                    live.append(i)
                else:
                    out[i] = known
        encoded = self.tokenizer.encode_many([self.prompt + chunks[i] for i in live], [False] * len(live)) if live else []
        for i, tok in zip(live, encoded):
            if not isinstance(tok, Exception):
                out[i] = encode_token_ids(tok.ids, self.dtype)
                self._recent.put(_digest(chunks[i]), out[i])
        return out


def _digest(text: str) -> bytes:
    """What the caches key a text by: 16 bytes of BLAKE2b (1 µs for 400 characters, 22 µs for 20 KB)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


class _Recent:
    """The latest ``size`` results of a pure function by key, least recently used dropped first; thread-safe."""

    def __init__(self, size: int):
        self._size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            if len(self._items) > self._size:
                self._items.popitem(last=False)


def _without_truncation(tokenizer: Tokenizer) -> Tokenizer:
    """The tokenizer itself, or a copy with truncation/padding off (they would hide tokens from the count)."""
    if tokenizer.truncation is None and tokenizer.padding is None:
        return tokenizer
    clone = Tokenizer.from_str(tokenizer.to_str())
    clone.no_truncation()
    clone.no_padding()
    return clone


def _cuts_at_whitespace_are_exact(tokenizer: Tokenizer) -> bool:
    """Whether text cut at whitespace between two tokens re-tokenizes into exactly those tokens (BERT-style)."""
    try:
        config = json.loads(tokenizer.to_str())
    except (ValueError, TypeError):
        return False

    def kinds(part: dict | None, key: str) -> list[str]:
        if part is None:
            return []
        return [str(p.get("type")) for p in part.get(key, [])] if part.get("type") == "Sequence" else [str(part.get("type"))]

    normalizers = kinds(config.get("normalizer"), "normalizers")
    pre_tokenizers = kinds(config.get("pre_tokenizer"), "pretokenizers")
    return (
        all(kind in _LOCAL_NORMALIZERS for kind in normalizers)
        and bool(pre_tokenizers)
        and pre_tokenizers[0] in _WHITESPACE_PRE_TOKENIZERS
        and all(kind in _WORD_LOCAL_PRE_TOKENIZERS for kind in pre_tokenizers)
        and (config.get("model") or {}).get("type") in _WORD_MODELS
        and not any(any(c.isspace() for c in tok.get("content", "")) for tok in config.get("added_tokens", []))
    )


def _core_offsets(text: str, offsets: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Token character spans with surrounding whitespace removed (byte-level BPE puts the space inside a token)."""
    starts: list[int] = []
    ends: list[int] = []
    for start, end in offsets:
        if start < end and (text[start].isspace() or text[end - 1].isspace()):
            raw = text[start:end]
            stripped = raw.strip()
            if not stripped:  # a whitespace-only token ("\n\n" in GPT-style vocabularies): part of the gap
                start = end
            else:
                start += len(raw) - len(raw.lstrip())
                end = start + len(stripped)
        starts.append(start)
        ends.append(end)
    return starts, ends


def _boundary_levels(text: str, starts: list[int], ends: list[int]) -> list[int]:
    """levels[i]: how good a cut is between token i-1 and token i (0 and n are the text's edges).

    Only whitespace gaps count as boundaries: a gap of characters the normalizer dropped (control
    characters) may join two pieces into one word.
    """
    n = len(starts)
    levels = [_NONE] * (n + 1)
    levels[0] = levels[n] = _PARAGRAPH
    prev_end = ends[0]
    for i in range(1, n):
        start = starts[i]
        if start > prev_end:
            gap = text[prev_end:start]
            if gap == " ":
                levels[i] = _SENTENCE if _ends_sentence(text, prev_end) else _WORD
            elif not gap.isspace():
                pass
            elif "\n" not in gap:
                levels[i] = _SENTENCE if _ends_sentence(text, prev_end) else _WORD
            elif _PARAGRAPH_GAP.search(gap):
                levels[i] = _PARAGRAPH
            else:
                levels[i] = _SENTENCE if _ends_sentence(text, prev_end) else _LINE
        elif start == prev_end and prev_end > 0 and text[prev_end - 1] in _CJK_SENTENCE_END:
            levels[i] = _SENTENCE
        if ends[i] > prev_end:
            prev_end = ends[i]
    return levels


def _ends_sentence(text: str, end: int) -> bool:
    """Whether the text before ``end`` closes a sentence ('.', '!', '?', possibly followed by quotes/brackets)."""
    pos = end - 1
    while pos >= 0 and text[pos] in _CLOSERS:
        pos -= 1
    return pos >= 0 and (text[pos] in _SENTENCE_END or text[pos] in _CJK_SENTENCE_END)


def _anchor_ranks(ids: Sequence[int], levels: list[int]) -> np.ndarray:
    """ranks[i]: how good a place for an anchor the cut before token i is (0: no cut there).

    The boundary level first, then a hash of the ``_ANCHOR_CONTEXT`` token ids before the cut, then
    the earlier cut: a total order that depends on nothing but nearby content, so an edit changes
    the ranks of the cuts within ``_ANCHOR_CONTEXT`` tokens after it and no others.
    """
    n = len(ids)
    tokens = np.asarray(ids, dtype=np.uint64)
    mixed = np.zeros(n + 1, dtype=np.uint64)  # polynomial hash of ids[i - K:i], mod 2**64
    power = 1
    for back in range(1, min(_ANCHOR_CONTEXT, n) + 1):
        mixed[back:] += tokens[: n + 1 - back] * np.uint64(power)
        power = power * _HASH_BASE % (1 << 64)
    for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):  # splitmix64's finaliser
        mixed ^= mixed >> np.uint64(shift)
        mixed *= np.uint64(factor)
    mixed ^= mixed >> np.uint64(31)
    order = np.arange(n + 1, dtype=np.int64)
    ranks = ((np.asarray(levels, dtype=np.int64) << 60) | ((mixed >> np.uint64(28)).astype(np.int64) << 24)
             | ((1 << 24) - 1 - np.minimum(order, (1 << 24) - 1)))
    ranks[np.asarray(levels) == _NONE] = 0
    ranks[0] = ranks[n] = 0
    return ranks


def _anchors(ranks: np.ndarray, radius: int) -> list[int]:
    """The cuts that rank highest among all cuts within ``radius`` tokens either side (ascending).

    Content-defined: whether a cut is an anchor depends on the text within ``radius`` +
    ``_ANCHOR_CONTEXT`` tokens of it, never on where the document or the previous chunk starts, so
    an edit moves only the anchors near it. Anchors lie more than ``radius`` tokens apart and from
    the document's edges (which outrank every cut).
    """
    n = len(ranks) - 1
    edged = ranks.copy()
    edged[0] = edged[n] = np.iinfo(np.int64).max
    # left[x]: the best rank in [x - radius, x], by doubling windows (a sliding-window maximum)
    left, width = edged.copy(), 1
    while 2 * width <= radius + 1:
        left[width:] = np.maximum(left[width:], left[:-width])
        width *= 2
    if width < radius + 1:
        rest = radius + 1 - width
        left[rest:] = np.maximum(left[rest:], left[:-rest])
    best = np.maximum(left, np.concatenate([left[radius:], np.full(min(radius, n + 1), left[n])]))
    found = (ranks > 0) & (ranks == best)
    return np.flatnonzero(found).tolist()


def _plan(levels: list[int], ranks: np.ndarray, n: int, budget: int, overlap: int) -> list[_Span]:
    """Token spans that end at every content-defined anchor (:func:`_anchors`), so a local edit moves
    only the cuts near it. A stretch between two anchors too long for one chunk is cut into even
    pieces, each at the best boundary near its share; each chunk starts ``overlap`` back."""
    room = budget - overlap  # new tokens a chunk surely has room for besides its overlap
    anchors = iter([*_anchors(ranks, max(1, int(room / _ANCHOR_SPACING))), n])
    anchor = next(anchors)
    spans: list[_Span] = []
    start = cut = 0
    while True:
        if anchor - start <= budget:
            end = anchor
        else:
            pieces = -(-(anchor - cut) // room)
            end = _best_cut(levels, cut + (anchor - cut) / pieces, cut + 1, start + budget, max(1, room // 4))
        spans.append(_Span(start, end))
        if end >= n:
            return spans
        start, cut = _overlap_start(levels, start, end, overlap), end
        while anchor <= end:
            anchor = next(anchors)


def _best_cut(levels: list[int], target: float, lo: int, hi: int, slack: int) -> int:
    """The cut in [lo, hi] at the best boundary within ``slack`` of ``target`` (the closest among
    equals, then the earlier); else the best boundary anywhere in [lo, hi]; else ``hi`` (between tokens)."""
    near = range(max(lo, int(target) - slack), min(hi, int(target) + slack) + 1)
    for candidates in (near, range(lo, hi + 1)):
        best = max(candidates, key=lambda e: (levels[e], -abs(e - target), -e), default=None)
        if best is not None and levels[best] > _NONE:
            return best
    return hi


def _overlap_start(levels: list[int], start: int, end: int, overlap: int) -> int:
    """Where the next chunk starts: at most ``overlap`` tokens before ``end``, on a word boundary.

    A sentence start is preferred when it still keeps at least half the overlap.
    """
    first = max(end - overlap, start + 1)
    words = [e for e in range(first, end) if levels[e] > _NONE]
    if not words:
        return end
    sentence = next((e for e in words if levels[e] >= _SENTENCE), None)
    if sentence is not None and end - sentence >= overlap // 2:
        return sentence
    return words[0]
