"""The Moses text tools the community's preparation scripts use, in Python (sacremoses).

The fairseq scripts ``prepare-iwslt14.sh`` and ``prepare-wmt14en2de.sh`` pipe text through four
perl scripts of mosesdecoder; here is what each becomes:

* ``normalize-punctuation.perl -l L``: ``sacremoses.MosesPunctNormalizer(L, perl_parity=True)``
  (perl_parity keeps the script's own substitutions, ``’`` -> ``"`` included).
* ``remove-non-printing-char.perl``: every character of Unicode category C becomes a space
  (the script's ``s/\\p{C}/ /g``).
* ``tokenizer.perl [-a] -l L``: ``sacremoses.MosesTokenizer(L).tokenize(line, escape=True,
  aggressive_dash_splits=a)``; like the script it escapes ``& | < > ' " [ ]``.
* ``clean-corpus-n.perl -ratio R CORPUS L1 L2 OUT MIN MAX``: :func:`clean_corpus`, the same tests
  in the same order (``|`` removal unless factored, whitespace squeezing, empty sides, token
  counts by single spaces, the ratio both ways, the 1000-character word limit).
* ``lowercase.perl``: ``str.lower``.

Long inputs are processed by a pool of worker processes in order-preserving chunks (the perl
scripts' ``-threads``), with progress logged every 20k lines.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import IO

from lnexp.errors import DataError

log = logging.getLogger("lnexp.data")

STEPS = ("normalize", "nonprint", "tokenize", "tokenize_a", "lowercase")
CHUNK = 2_000
PARALLEL_MIN = 20_000  # below this, worker start-up costs more than it saves
MAX_WORD_LENGTH = 1000  # clean-corpus-n.perl's default -max-word-length


# --- reading ------------------------------------------------------------------------------------


def iter_lines(fh: IO[bytes], name: str) -> Iterator[str]:
    """Decode a binary stream line by line (split on ``\\n`` only, as perl reads); errors name
    ``name:line``."""
    for n, raw in enumerate(fh, 1):
        try:
            yield raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise DataError(f"{name}:{n}: not UTF-8 text ({e.reason}); re-encode the file as UTF-8"
                            ) from None


def count_lines(path: Path) -> int:
    """Number of lines as :func:`iter_lines` would yield them, without decoding."""
    n, last = 0, b"\n"
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


# --- the per-line tools -------------------------------------------------------------------------


@cache
def _normalizer(lang: str):
    from sacremoses import MosesPunctNormalizer

    return MosesPunctNormalizer(lang=lang, perl_parity=True)


@cache
def _tokenizer(lang: str):
    from sacremoses import MosesTokenizer

    class Tokenizer(MosesTokenizer):
        """sacremoses rebuilds two ~100k-character sets on every call of these; same answers."""

        _alpha = frozenset(MosesTokenizer.IsAlpha)
        _lower = frozenset(MosesTokenizer.IsLower)

        def isanyalpha(self, text: str) -> bool:
            return not self._alpha.isdisjoint(text)

        def islower(self, text: str) -> bool:
            return self._lower.issuperset(text)

    return Tokenizer(lang=lang)


@cache
def _non_printing():
    import regex  # sacremoses' own dependency; Python's re has no \p{C}

    return regex.compile(r"\p{C}")


def apply(line: str, steps: tuple[str, ...], lang: str) -> str:
    for step in steps:
        if step == "normalize":
            line = _normalizer(lang).normalize(line)
        elif step == "nonprint":
            line = _non_printing().sub(" ", line)
        elif step == "tokenize":
            line = _tokenizer(lang).tokenize(line, escape=True, return_str=True)
        elif step == "tokenize_a":
            line = _tokenizer(lang).tokenize(line, aggressive_dash_splits=True, escape=True,
                                             return_str=True)
        elif step == "lowercase":
            line = line.lower()
        else:
            raise ValueError(f"unknown step {step!r}; use one of {STEPS}")
    return line


def _apply_chunk(args: tuple[list[str], tuple[str, ...], str]) -> list[str]:
    lines, steps, lang = args
    return [apply(line, steps, lang) for line in lines]


def _chunks(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    buf: list[str] = []
    for line in lines:
        buf.append(line)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def workers() -> int:
    env = os.environ.get("LNEXP_WORKERS")
    if env:
        return max(1, int(env))
    return max(1, min(8, len(os.sched_getaffinity(0))))


def run(lines: Iterable[str], steps: tuple[str, ...], lang: str, label: str,
        total: int | None = None, every: int = 20_000) -> Iterator[str]:
    """``steps`` applied to every line, in order; parallel when ``total`` is large."""
    n_workers = workers() if total is not None and total >= PARALLEL_MIN else 1
    start, done, next_log = time.monotonic(), 0, every
    if n_workers > 1:
        import multiprocessing

        # fork: the workers run only sacremoses, and fork needs no importable __main__.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        pool = multiprocessing.get_context(method).Pool(n_workers)
        results = pool.imap(_apply_chunk, ((c, steps, lang) for c in _chunks(lines, CHUNK)))
    else:
        pool = None
        results = (_apply_chunk((c, steps, lang)) for c in _chunks(lines, CHUNK))
    try:
        for out in results:
            yield from out
            done += len(out)
            if done >= next_log:
                next_log += every
                rate = done / max(time.monotonic() - start, 1e-9)
                of = f"/{total} ({100 * done / total:.0f}%)" if total else ""
                log.info("%s: %d%s lines, %.0f lines/s", label, done, of, rate)
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()


# --- clean-corpus-n -----------------------------------------------------------------------------

_SPACES = re.compile(r"\s+")
_LONG_WORD = re.compile(r"[^\s|]{" + str(MAX_WORD_LENGTH + 1) + "}")


def _squeeze(line: str, factored: bool) -> str:
    if not factored:
        line = line.replace("|", "")
    line = _SPACES.sub(" ", line)
    line = line[1:] if line.startswith(" ") else line
    return line[:-1] if line.endswith(" ") else line


def clean_pair(a: str, b: str, min_len: int, max_len: int, ratio: float,
               factored: bool = False) -> tuple[str, str] | None:
    """clean-corpus-n.perl on one pair: the cleaned pair, or None when the pair is dropped."""
    a, b = _squeeze(a, factored), _squeeze(b, factored)
    if not a or not b:
        return None
    na, nb = len(a.split(" ")), len(b.split(" "))
    if na > max_len or nb > max_len or na < min_len or nb < min_len:
        return None
    if na / nb > ratio or nb / na > ratio:
        return None
    if _LONG_WORD.search(a) or _LONG_WORD.search(b):
        return None
    return a, b


def clean_corpus(src: Iterable[str], tgt: Iterable[str], min_len: int = 1, max_len: int = 175,
                 ratio: float = 1.5) -> Iterator[tuple[str, str]]:
    """The pairs clean-corpus-n.perl keeps (both iterables must have the same length)."""
    factored = None
    for a, b in zip(src, tgt, strict=True):
        if factored is None:  # the script decides from the first pair
            factored = "|" in a or "|" in b
        kept = clean_pair(a, b, min_len, max_len, ratio, factored)
        if kept is not None:
            yield kept
