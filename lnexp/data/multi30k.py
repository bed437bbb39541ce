"""Multi30k de-en (Elliott et al., 2016), shipped in ``data/multi30k`` as the offline default.

Raw text goes straight to a joint sentencepiece model: BLEU is then sacreBLEU on detokenised
output against the untouched references.
"""

from __future__ import annotations

from pathlib import Path

from lnexp.data.corpus import PreparedData, build_from_text
from lnexp.data.text import read_parallel, write_lines

FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def default_dir() -> Path:
    """The shipped copy: a link to the top-level data/multi30k in a checkout, the files themselves
    in an installed wheel."""
    return (Path(__file__).parent / "multi30k_corpus").resolve()


def eval_text(lines: list[str], lang: str) -> list[str]:
    """Raw sentences -> the text level of ``text/`` (every split, so any raw test set too)."""
    return [x.strip() for x in lines]


def prepare(raw_dir: Path | None = None, src: str = "de", tgt: str = "en",
            subword: str = "sentencepiece", vocab_size: int = 8000,
            root: Path | None = None) -> PreparedData:
    raw_dir = Path(raw_dir or default_dir())
    inputs = [raw_dir / f"{stem}.{lang}.gz" for stem in FILES.values() for lang in (src, tgt)]

    def make_text(out: Path) -> None:
        for split, stem in FILES.items():
            s, t = read_parallel(raw_dir / f"{stem}.{src}.gz", raw_dir / f"{stem}.{tgt}.gz")
            write_lines(out / f"{split}.{src}", eval_text(s, src))
            write_lines(out / f"{split}.{tgt}", eval_text(t, tgt))

    return build_from_text(f"multi30k_{src}_{tgt}", src, tgt, make_text, inputs,
                           {"raw": "strip"}, subword, vocab_size, tokenized=False, root=root)
