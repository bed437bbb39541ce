"""``lnexp prepare``: prepare a corpus offline, every stage cached by the content of its inputs.

    lnexp prepare multi30k [--dir DIR]                  the shipped corpus (data/multi30k)
    lnexp prepare iwslt14 --archive PATH/de-en.tgz       or the folder it unpacks to
    lnexp prepare wmt14 --dir DIR [--max-train-pairs N]

Common options: --subword {sentencepiece,subword_nmt}, --vocab-size N, --cache DIR.
A second run with the same inputs and settings does nothing and says so.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from lnexp.data.cache import cache_root
from lnexp.data.subword import SUBWORDS
from lnexp.data.text import SPLITS
from lnexp.errors import ArgumentParser, ConfigError, at_least

STAGES = ("text", "subword", "bin")
DEFAULT_VOCAB = {"multi30k": 8000, "iwslt14": 10000, "wmt14": 37000}


def parser() -> ArgumentParser:
    common = ArgumentParser(add_help=False)
    common.add_argument("--subword", choices=SUBWORDS, default="sentencepiece",
                        help="joint subword model: sentencepiece BPE (default) or subword_nmt "
                             "(the reference scripts' tool; --vocab-size is then the merge count)")
    common.add_argument("--vocab-size", type=at_least(1), default=None, metavar="N",
                        help="subword vocabulary size (default: multi30k 8000, iwslt14 10000, "
                             "wmt14 37000)")
    common.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help="where prepared corpora go (default: $LNEXP_CACHE, else ./cache)")
    p = ArgumentParser(prog="lnexp prepare", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="corpus", required=True, metavar="{multi30k,iwslt14,wmt14}")
    m = sub.add_parser("multi30k", parents=[common], help="Multi30k de-en (shipped with lnexp)")
    m.add_argument("--dir", type=Path, default=None,
                   help="folder with {train,val,test_2016_flickr}.{de,en}.gz (default: the shipped "
                        "data/multi30k)")
    i = sub.add_parser("iwslt14", parents=[common], help="IWSLT'14 de-en, as prepare-iwslt14.sh")
    i.add_argument("--archive", type=Path, required=True, metavar="PATH",
                   help="the IWSLT 2014 de-en release: de-en.tgz, or the folder it unpacks to")
    w = sub.add_parser("wmt14", parents=[common], help="WMT'14 en-de, as prepare-wmt14en2de.sh")
    w.add_argument("--dir", type=Path, required=True,
                   help="folder holding europarl-v7, commoncrawl, news-commentary-v9, "
                        "newstest2013 and newstest2014 (searched recursively)")
    w.add_argument("--max-train-pairs", type=at_least(1), default=None, metavar="N",
                   help="use only the first N training pairs (smoke runs)")
    return p


def setup_logging() -> None:
    """Progress on stderr, short; fairseq's own INFO chatter stays off."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("lnexp")
    for h in [h for h in log.handlers if getattr(h, "_lnexp_prepare", False)]:
        log.removeHandler(h)  # a new one writes to the current sys.stderr
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", datefmt="%H:%M:%S"))
    handler._lnexp_prepare = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    for name in ("fairseq", "fairseq_cli"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _stamps(corpus_dir: Path) -> dict[str, int | None]:
    out = {}
    for stage in STAGES:
        f = corpus_dir / stage / "stage.json"
        out[stage] = f.stat().st_mtime_ns if f.is_file() else None
    return out


def _check_multi30k(raw_dir: Path) -> None:
    """Multi30k's input errors, before any stage starts (the files are small)."""
    from lnexp.data.multi30k import FILES
    from lnexp.data.text import read_parallel

    for stem in FILES.values():
        read_parallel(raw_dir / f"{stem}.de.gz", raw_dir / f"{stem}.en.gz")


def run(args: argparse.Namespace):
    """Prepare the chosen corpus; returns (PreparedData, corpus cache folder)."""
    root = (args.cache or cache_root()).resolve()
    vocab = args.vocab_size or DEFAULT_VOCAB[args.corpus]
    if args.corpus == "multi30k":
        from lnexp.data import multi30k

        raw_dir = args.dir or multi30k.default_dir()
        if not raw_dir.is_dir():
            raise ConfigError(f"no such folder: {raw_dir} (--dir: the folder holding the Multi30k "
                              "{train,val,test_2016_flickr}.{de,en}.gz files)")
        _check_multi30k(raw_dir)
        prep = lambda: multi30k.prepare(raw_dir, subword=args.subword, vocab_size=vocab, root=root)
        name = "multi30k_de_en"
    elif args.corpus == "iwslt14":
        from lnexp.data import iwslt14

        prep = lambda: iwslt14.prepare(args.archive, subword=args.subword, vocab_size=vocab,
                                       root=root)
        name = iwslt14.NAME
    else:
        from lnexp.data import wmt14

        prep = lambda: wmt14.prepare(args.dir, max_train_pairs=args.max_train_pairs,
                                     subword=args.subword, vocab_size=vocab, root=root)
        name = wmt14.NAME
    before = _stamps(root / name)
    data = prep()
    after = _stamps(root / name)
    rebuilt = [s for s in STAGES if after[s] != before[s]]
    return data, rebuilt


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    setup_logging()
    start = time.monotonic()
    data, rebuilt = run(args)
    counts = " / ".join(f"{s} {data.counts[s]:,}" for s in SPLITS)
    print(f"{data.name}: {counts} sentence pairs")
    print(f"binarised data: {data.bin_dir}")
    print(f"text (BLEU references): {data.text_dir}")
    if rebuilt:
        print(f"rebuilt: {', '.join(rebuilt)} ({time.monotonic() - start:.1f} s)")
    else:
        print("up to date, nothing to do")
    return 0
