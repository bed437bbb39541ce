"""``lnexp prepare``: prepare a corpus offline, every stage cached by the content of its inputs.

The sub-commands are the corpora lnexp/data registers (``lnexp prepare NAME --help``: its options).
A second run with the same inputs and settings does nothing and says so.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lnexp import logs
from lnexp.data import registry
from lnexp.data.cache import cache_root, checked_root, writing
from lnexp.data.corpus import STAGES, Corpus
from lnexp.data.subword import SUBWORDS
from lnexp.data.text import SPLITS
from lnexp.errors import ArgumentParser, at_least


def parser() -> ArgumentParser:
    corpora = registry.corpora()
    vocab = ", ".join(f"{name} {registry.default_vocab(name)}" for name in corpora)
    common = ArgumentParser(add_help=False)
    common.add_argument("--subword", choices=SUBWORDS, default="sentencepiece",
                        help="joint subword model: sentencepiece BPE (default) or subword_nmt "
                             "(the reference scripts' tool; --vocab-size is then the merge count)")
    common.add_argument("--vocab-size", type=at_least(1), default=None, metavar="N",
                        help=f"subword vocabulary size (default: vocab_size in the corpus's configs/dataset "
                             f"file: {vocab})")
    common.add_argument("--cache", type=Path, default=None, metavar="DIR",
                        help="where prepared corpora go (default: $LNEXP_CACHE, else ./cache)")
    p = ArgumentParser(prog="lnexp prepare", description=__doc__.split("\n\n")[0],
                       epilog="\n".join(["corpora:", *(_usage(name, c) for name, c in corpora.items())]),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="corpus", required=True, metavar="{" + ",".join(corpora) + "}")
    for name, corpus in corpora.items():
        s = sub.add_parser(name, parents=[common], help=corpus.help, description=corpus.help)
        for o in corpus.options:
            s.add_argument(o.flag, dest=o.dest, type=o.type, required=o.required, default=None,
                           metavar=o.metavar, help=o.help)
    return p


def _usage(name: str, corpus: Corpus) -> str:
    """``lnexp prepare iwslt14 --archive PATH``: one corpus's command line, for the help's end."""
    words = [(o, f"{o.flag} {o.metavar or o.dest.upper()}") for o in corpus.options]
    return f"  lnexp prepare {name} " + " ".join(w if o.required else f"[{w}]" for o, w in words)


@contextmanager
def progress_on_stderr() -> Iterator[None]:
    """lnexp's progress on stderr, short, while the corpus is prepared; fairseq's own INFO chatter
    stays off. Put back as it was afterwards, so that a command run next in the same process
    (tests, notebooks) logs as it would alone."""
    log = logging.getLogger("lnexp")
    saved = (log.level, log.propagate)
    quiet = {name: logging.getLogger(name).level for name in ("fairseq", "fairseq_cli")}
    handler = logs.CurrentStderr()
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", datefmt="%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(saved[0])
        log.propagate = saved[1]
        for name, level in quiet.items():
            logging.getLogger(name).setLevel(level)


def _stamp(stage_dir: Path) -> int | None:
    """When a finished stage's stage.json was written: that of another preparation's where the
    stage was linked (or copied) from there, a new time where it was built."""
    f = stage_dir / "stage.json"
    return f.stat().st_mtime_ns if f.is_file() else None


def run(args: argparse.Namespace):
    """Prepare the chosen corpus; returns (PreparedData, the stages built, not found or linked)."""
    root = checked_root(args.cache, f"--cache {args.cache}", "give --cache a folder") \
        if args.cache else cache_root()
    corpus = registry.get(args.corpus)
    vocab = args.vocab_size or registry.default_vocab(args.corpus)
    before = {(s, _stamp(d / s)) for d in root.iterdir() if d.is_dir()
              for s in STAGES} if root.is_dir() else set()
    with writing("--cache" if args.cache else "LNEXP_CACHE"):
        data = corpus.prepare(**{o.dest: getattr(args, o.dest) for o in corpus.options},
                              subword=args.subword, vocab_size=vocab, root=root)
    rebuilt = [s for s in STAGES if (s, _stamp(data.folder / s)) not in before]
    return data, rebuilt


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    start = time.monotonic()
    with progress_on_stderr():
        data, rebuilt = run(args)
    counts = " / ".join(f"{s} {data.counts[s]:,}" for s in SPLITS)
    print(f"{data.name}: {counts} sentence pairs")
    print(f"binarised data: {data.bin_dir}")
    print(f"text (BLEU references): {data.text_dir}")
    print(f"key: {data.key} (what runs trained on it record)")
    if rebuilt:
        print(f"rebuilt: {', '.join(rebuilt)} ({time.monotonic() - start:.1f} s)")
    else:
        print("up to date, nothing to do")
    return 0
