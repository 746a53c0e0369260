"""Real English text available offline on every machine: the Python standard library's docstrings.

Benchmarks, exactness tests and the demo need thousands of real texts with a realistic length mix
and nothing can be downloaded, so we harvest them from the stdlib's own documentation (parsed with
``ast``, never imported), in two kinds:

* prose paragraphs (:func:`stdlib_paragraphs`), cut to target token lengths;
* API reference entries (:func:`stdlib_api_entries`): a public function, class or method's qualified
  name, signature, one-line summary and the rest of its docstring: short records full of identifiers.
"""

from __future__ import annotations

import ast
import json
import os
import random
import sys
import re
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

_WS = re.compile(r"\s+")
_PROSE = re.compile(r"[A-Za-z][a-z]+")
SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")  # a sentence boundary in the harvested prose


def _is_prose(paragraph: str) -> bool:
    """Keep sentences, drop code samples, tables and signatures."""
    if len(paragraph) < 40 or ">>>" in paragraph or paragraph.count("|") > 2:
        return False
    words = paragraph.split()
    return len(_PROSE.findall(paragraph)) >= 0.6 * len(words) and paragraph.rstrip()[-1:] in ".:)"


@lru_cache(maxsize=1)
def stdlib_paragraphs() -> tuple[str, ...]:
    """Deduplicated prose paragraphs from the stdlib's docstrings, in a stable order (cached on disk)."""
    return tuple(_disk_cached("stdlib-paragraphs", lambda: _harvest(Path(sysconfig.get_paths()["stdlib"]))))


@lru_cache(maxsize=4)
def package_paragraphs(package: str) -> tuple[str, ...]:
    """Deduplicated prose paragraphs from an installed package's docstrings (``numpy``: another corpus than the
    stdlib's, other authors and another field), in a stable order (cached on disk per package version)."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(f"package {package!r} is not installed")
    version = importlib.metadata.version(package)
    return tuple(_disk_cached(f"{package}-{version}-paragraphs", lambda: _harvest(Path(spec.origin).parent)))


def _disk_cached(name: str, harvest) -> list:
    """``harvest()``'s JSON-able result, kept in ~/.cache/embedstream per Python minor version."""
    cache = Path.home() / ".cache" / "embedstream" / f"{name}-{sys.version_info[0]}.{sys.version_info[1]}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    out = harvest()
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, cache)
    return out


def _stdlib_trees(root: Path):
    """(path, parsed module) of every stdlib source file, in path order (tests, IDLE, lib2to3 and
    site-packages left out)."""
    for path in sorted(root.rglob("*.py")):
        if any(part in ("test", "tests", "idlelib", "site-packages", "lib2to3") for part in path.relative_to(root).parts):
            continue
        try:
            yield path, ast.parse(path.read_text(encoding="utf-8", errors="ignore"))
        except (SyntaxError, ValueError):
            continue


def _harvest(root: Path) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for _, tree in _stdlib_trees(root):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if not doc:
                    continue
                for para in doc.split("\n\n"):
                    text = _WS.sub(" ", para).strip()
                    if _is_prose(text) and text not in seen:
                        seen.add(text)
                        out.append(text)
    return out


@dataclass(frozen=True)
class ApiEntry:
    """One API reference entry: ``name`` (qualified: ``json.JSONDecoder.decode``), ``signature``
    (the parameters as written, without ``self``), ``summary`` (the docstring's first line) and
    ``body`` (the docstring's prose after it, whitespace folded; empty when there is none)."""

    name: str
    signature: str
    summary: str
    body: str


@lru_cache(maxsize=1)
def stdlib_api_entries() -> tuple[ApiEntry, ...]:
    """Public functions, classes and methods of the public stdlib modules that have a docstring, in a
    stable order (module path, then source order; cached on disk)."""
    return tuple(ApiEntry(*fields) for fields in _disk_cached("stdlib-api", _harvest_api))


def _harvest_api() -> list[tuple[str, str, str, str]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out: list[tuple[str, str, str, str]] = []
    for path, tree in _stdlib_trees(root):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts or any(part.startswith("_") for part in parts):
            continue
        module = ".".join(parts)
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            members = [node]
            if isinstance(node, ast.ClassDef):
                members += [m for m in node.body if isinstance(m, ast.FunctionDef) and not m.name.startswith("_")]
            for member in members:
                entry = _api_entry(module, node, member)
                if entry is not None:
                    out.append((entry.name, entry.signature, entry.summary, entry.body))
    return out


def _api_entry(module: str, top: ast.AST, member: ast.AST) -> ApiEntry | None:
    doc = ast.get_docstring(member)
    if not doc:
        return None
    first, _, rest = doc.strip().partition("\n\n")
    summary = _WS.sub(" ", first).strip()
    body = " ".join(_WS.sub(" ", para).strip() for para in rest.split("\n\n") if _is_prose(_WS.sub(" ", para).strip()))
    name = f"{module}.{top.name}" + (f".{member.name}" if member is not top else "")
    args = member.args if isinstance(member, ast.FunctionDef) else next(
        (m.args for m in member.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
    signature = ""
    if args is not None:
        args = ast.arguments(**{field: getattr(args, field) for field in args._fields})  # a copy, self dropped
        for positional in ("posonlyargs", "args"):
            names = getattr(args, positional)
            if names and names[0].arg in ("self", "cls"):
                setattr(args, positional, names[1:])
                break
        signature = ast.unparse(args)
    return ApiEntry(name, signature, summary, body)


def sentence_chunks(paragraph: str, chunk_words: int) -> list[str]:
    """A paragraph cut at sentence boundaries into chunks of at most ``chunk_words`` words (a run-on
    sentence over twice that is cut by words); a short paragraph stays whole."""
    if len(paragraph.split()) <= chunk_words:
        return [paragraph]
    chunks: list[str] = []
    current: list[str] = []
    for sentence in SENTENCE.split(paragraph):
        words = sentence.split()
        if current and len(current) + len(words) > chunk_words:
            chunks.append(" ".join(current))
            current = []
        current.extend(words)
        while len(current) > 2 * chunk_words:  # a run-on "sentence": cut by words
            chunks.append(" ".join(current[:chunk_words]))
            current = current[chunk_words:]
    if current:
        chunks.append(" ".join(current))
    return chunks


def long_text(seed: int, chars: int = 20_000) -> str:
    """About ``chars`` characters of real prose: random paragraphs (seeded) separated by blank lines."""
    paras = stdlib_paragraphs()
    rng = random.Random(seed)
    out: list[str] = []
    while sum(len(p) + 2 for p in out) < chars:
        out.append(rng.choice(paras))
    return "\n\n".join(out)


def edit_sentence(text: str, seed: int, new: str | None = None) -> str:
    """``text`` with one sentence near its middle replaced by ``new``, ``new`` inserted before it, or it
    deleted (by ``seed`` % 3); every other character is kept. A local edit, as a person makes one."""
    sentences, gaps = SENTENCE.split(text), SENTENCE.findall(text)
    at = min(len(sentences) - 1, max(0, len(sentences) // 2 + seed % 7 - 3))
    new = new or f"Revision {seed} rewrote this sentence to say something else entirely."
    if seed % 3 == 0 or len(sentences) < 2:
        sentences[at] = new
    elif seed % 3 == 1:
        sentences.insert(at, new)
        gaps.insert(at, " ")
    else:
        del sentences[at]
        del gaps[min(at, len(gaps) - 1)]
    return sentences[0] + "".join(gap + sentence for gap, sentence in zip(gaps, sentences[1:]))


def documents(count: int, seed: int = 7, min_paragraphs: int = 2, max_paragraphs: int = 12) -> list[dict]:
    """Synthetic multi-paragraph documents (for the producer/chunker demo) made of real prose."""
    paras = stdlib_paragraphs()
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        k = rng.randint(min_paragraphs, max_paragraphs)
        start = rng.randrange(0, max(1, len(paras) - k))
        docs.append({"doc_id": f"doc-{i:06d}", "text": "\n\n".join(paras[start : start + k]), "metadata": {"source": "python-stdlib-docstrings", "n": i}})
    return docs


def mixed_length_texts(
    count: int, count_tokens, max_tokens: int, seed: int = 13, query_share: float = 0.3, tail_share: float = 0.1
) -> list[str]:
    """A traffic-like mix: short queries (8-32 tokens), chunks (64-256), a tail up to ``max_tokens``.

    ``count_tokens(text) -> int`` is the model's token counter (special tokens included), so
    target lengths are exact for the model being measured.
    """
    paras = stdlib_paragraphs()
    rng = random.Random(seed)
    texts: list[str] = []
    chunk_hi = min(256, max_tokens)
    while len(texts) < count:
        r = rng.random()
        if r < query_share:
            target = rng.randint(8, 32)
        elif r < 1 - tail_share or max_tokens <= chunk_hi:
            target = rng.randint(min(64, chunk_hi), chunk_hi)
        else:
            target = rng.randint(chunk_hi, max_tokens)
        start = rng.randrange(len(paras))
        words: list[str] = []
        j = start
        while len(words) < target * 2 and j < start + 40:
            words.extend(paras[j % len(paras)].split())
            j += 1
        text = _fit(words, target, count_tokens)
        if text and count_tokens(text) >= 8:
            texts.append(text)
    return texts


def _fit(words: list[str], target: int, count_tokens) -> str:
    """Longest word prefix whose token count is <= target (binary search on words)."""
    lo, hi = 1, len(words)
    best = ""
    while lo <= hi:
        mid = (lo + hi) // 2
        text = " ".join(words[:mid])
        if count_tokens(text) <= target:
            best, lo = text, mid + 1
        else:
            hi = mid - 1
    return best
