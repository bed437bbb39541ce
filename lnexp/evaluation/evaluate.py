"""``lnexp evaluate``: test-set BLEU of trained runs, as papers report it.

    lnexp evaluate RUN [RUN ...] [--split test|valid | --src FILE --ref FILE [--name NAME]]
                   [--checkpoint best|last|avgN] [--beam B] [--lenpen L] [--batch-size N]
                   [--device auto|cpu|cuda] [--json]

Beam and length penalty default to the run's dataset values (the paper's: IWSLT14 5/1.2, WMT14
4/0.6). Prints sacreBLEU on detokenised text with its signature, the tokenised BLEU where the
corpus is kept tokenised (as ``valid_bleu_tok``), chrF, and the stock ``fairseq-generate`` command
that reproduces the hypotheses. Writes RUN/eval/SET.CHECKPOINT.beamB.lenpenL/ (hyps.txt and
refs.txt, which ``sacrebleu refs.txt -i hyps.txt`` scores identically; hyps.tok for tokenised
corpora; record.json).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lnexp.errors import ArgumentParser, UserError, at_least, finite
from lnexp.evaluation.runinfo import RunInfo, open_run, run_folders
from lnexp.exit_status import Exit
from lnexp.plural import count
from lnexp.results import RECORD, record_dir
from lnexp.runtime.progress import DecodeProgress


def parser(prog: str, description: str) -> ArgumentParser:
    """Options ``evaluate`` and ``translate`` share: checkpoint, decoding, device."""
    ap = ArgumentParser(prog=prog, description=description)
    ap.add_argument("--checkpoint", default="best",
                    help="best (lowest valid loss), last, or avgN: the average of the last N epoch "
                         "checkpoints (train with checkpoint.keep_last_epochs=N); default best")
    ap.add_argument("--beam", type=at_least(1), help="beam size (default: the run's dataset value)")
    ap.add_argument("--lenpen", type=finite, help="length penalty (default: the run's dataset value)")
    ap.add_argument("--batch-size", type=at_least(1), help="sentences per batch (default: the run's "
                    "eval.max_sentences)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    return ap


def decoding(run: RunInfo, args: argparse.Namespace) -> tuple[int, float, int, str]:
    """(beam, lenpen, batch size, device) from the run and the command line, checked."""
    from lnexp.runtime.host import resolve_device

    beam = int(args.beam if args.beam is not None else run.setting("beam", "beam"))
    lenpen = float(args.lenpen if args.lenpen is not None else run.setting("lenpen", "lenpen"))
    batch = int(args.batch_size if args.batch_size is not None
                else run.config.get("eval", {}).get("max_sentences") or 128)
    if beam < 1 or batch < 1:
        raise UserError(f"--beam {beam} / --batch-size {batch}: both must be >= 1")
    return beam, lenpen, batch, resolve_device(SimpleNamespace(device=args.device))


def fairseq_command(data_dir: str, ckpt: Path, split: str, raw: bool, data, beam: int,
                    lenpen: float, batch: int, device: str) -> str:
    """The stock fairseq-generate call (with lnexp's --user-dir) that prints the same hypotheses
    at the text level (hyps.tok for tokenised corpora, else hyps.txt), one per line in order."""
    from lnexp import fairseq_adapter as fa
    from lnexp.fairseq_plugin import USER_DIR

    flags = dict(user_dir=USER_DIR, path=ckpt, task="translation", source_lang=data.src,
                 target_lang=data.tgt, gen_subset=split, dataset_impl="raw" if raw else None,
                 beam=beam, lenpen=lenpen, max_len_a=fa.MAX_LEN_A, max_len_b=fa.MAX_LEN_B,
                 batch_size=batch, required_batch_size_multiple=fa.GENERATE_BATCH_MULTIPLE,
                 seed=fa.GENERATE_SEED, post_process=data.subword, cpu=device == "cpu")
    return shlex.join(["fairseq-generate", *fa.flags_to_argv(data_dir, flags)]) + \
        " 2>/dev/null | grep ^H- | sort -V | cut -f3-"


def checkpoint_stamp(ckpt: Any) -> list[list[Any]]:
    """What hypotheses were decoded from: each checkpoint file read (an avgN's epoch checkpoints),
    with its size and time, so that a record is reused only while they are the same files."""
    return [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in (ckpt.averaged or [ckpt.path])]


def scored(run: RunInfo, args: argparse.Namespace) -> dict[str, Any] | None:
    """The record of an earlier ``evaluate`` of the run's split that decoding it again would give
    anew: the same prepared data, checkpoint files and decoding settings, its files still there
    (``lnexp compare`` reuses it); None where there is none."""
    from lnexp.evaluation import checkpoints
    from lnexp.rundir import read_json

    if args.src:
        return None
    beam, lenpen, batch, device = decoding(run, args)
    ckpt = checkpoints.resolve(run.dir, args.checkpoint)
    record = read_json(record_dir(run.dir, args.split, ckpt.label, beam, lenpen) / RECORD)
    want = {"split": args.split, "src": None, "data_key": run.data.key, "beam": beam,
            "lenpen": lenpen, "batch_size": batch, "device": device,
            "checkpoint_stamp": checkpoint_stamp(ckpt)}
    if not isinstance(record, dict) or any(record.get(k) != v for k, v in want.items()):
        return None
    return record if all(Path(str(record.get(k))).is_file() for k in ("hyps", "refs")) else None


def evaluate(run: RunInfo, args: argparse.Namespace) -> dict[str, Any]:
    import sacrebleu

    from lnexp import fairseq_adapter as fa
    from lnexp.decoding import BleuScorer, generate
    from lnexp.evaluation import checkpoints
    from lnexp.evaluation.inputs import prepare_test_set
    from lnexp.rundir import write_json
    from lnexp.rundir import write_text as write_atomic

    beam, lenpen, batch, device = decoding(run, args)
    ckpt = checkpoints.resolve(run.dir, args.checkpoint)
    set_name = args.name or (Path(args.src).name.split(".")[0] if args.src else args.split)
    out = record_dir(run.dir, set_name, ckpt.label, beam, lenpen)
    data, split, raw = run.data, args.split, False
    if args.src:
        data, split, raw = prepare_test_set(run, Path(args.src), Path(args.ref), out), "test", True
    t0 = time.perf_counter()
    model, task = checkpoints.load(ckpt, data.bin_dir, device, "raw" if raw else None)
    task.load_dataset(split, combine=False, epoch=1)
    scorer = BleuScorer(task, data, beam, lenpen, batch, 0, split)
    progress = DecodeProgress(f"{set_name} of {run.dir.name}", scorer.n,
                              fa.source_tokens(task, split, range(scorer.n)))
    batches = with_progress(fa.generate_batches(task, split, model, batch, range(scorer.n)), progress)
    hyps_tok = generate(task, model, split, device, beam, lenpen, batch, scorer.decode,
                        range(scorer.n), batches)
    score, hyps = scorer.score_translations(hyps_tok)
    chrf = sacrebleu.metrics.CHRF()
    chrf_score = chrf.corpus_score(hyps, [scorer.refs]).score
    files = {"hyps": out / "hyps.txt", "refs": out / "refs.txt"}
    if data.tokenized:
        files["hyps_tok"] = out / "hyps.tok"
    out.mkdir(parents=True, exist_ok=True)
    for key, lines in (("hyps", hyps), ("refs", scorer.refs), ("hyps_tok", hyps_tok)):
        if key in files:
            write_atomic(files[key], "".join(x + "\n" for x in lines))
    record = {
        "run": str(run.dir), "set": set_name, "split": split,
        "src": str(args.src) if args.src else None, "ref": str(args.ref) if args.ref else None,
        "data_key": run.data.key,  # the prepared data the run trained on (and read here)
        "checkpoint": ckpt.label, "checkpoint_path": str(ckpt.path),
        "averaged": [str(p) for p in ckpt.averaged] or None, "checkpoint_stamp": checkpoint_stamp(ckpt),
        "beam": beam, "lenpen": lenpen, "batch_size": batch, "device": device, "n": scorer.n,
        "bleu": score.bleu, "signature": score.signature, "bleu_tok": score.bleu_tok,
        "chrf": chrf_score, "chrf_signature": str(chrf.get_signature()),
        **{k: str(v) for k, v in files.items()},
        "fairseq_command": fairseq_command(data.bin_dir, ckpt.path, split, raw, data, beam, lenpen,
                                           batch, device),
        "fairseq_output": "hyps_tok" if data.tokenized else "hyps",
        "wall_s": round(time.perf_counter() - t0, 2), "time": time.strftime("%FT%T"),
    }
    write_json(out / RECORD, record)
    return record


def with_progress(batches: Iterable[dict[str, Any]], progress: DecodeProgress
                  ) -> Iterator[dict[str, Any]]:
    """fairseq's batches, each counted as decoded when the next one is asked for."""
    for sample in batches:
        yield sample
        progress.step(len(sample["id"]), int(sample["net_input"]["src_lengths"].sum()))


def report(r: dict[str, Any]) -> str:
    lines = [f"{r['run']}: {r['set']} ({count(r['n'], 'sentence')}), checkpoint {r['checkpoint']}, "
             f"beam {r['beam']}, lenpen {r['lenpen']:g}",
             f"  BLEU     {r['bleu']:.2f}  {r['signature']}"]
    if r["bleu_tok"] is not None:
        lines.append(f"  BLEU_tok {r['bleu_tok']:.2f}  (Moses-tokenised text, tokenize=none: "
                     "multi-bleu, as valid_bleu_tok)")
    lines += [f"  chrF     {r['chrf']:.2f}  {r['chrf_signature']}",
              f"  hyps {r['hyps']}", f"  refs {r['refs']}",
              f"  fairseq  {r['fairseq_command']}"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = parser("lnexp evaluate", __doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders (or sweep folders)")
    ap.add_argument("--split", default="test", choices=("test", "valid"),
                    help="a split of the run's prepared corpus (default test)")
    ap.add_argument("--src", help="a raw test set's source side (instead of --split)")
    ap.add_argument("--ref", help="its reference translations, line-aligned with --src")
    ap.add_argument("--name", help="name of a --src test set in RUN/eval (default: --src's stem)")
    ap.add_argument("--json", action="store_true",
                    help="also print each record as one JSON object on its own (last) line")
    args = ap.parse_args(argv)
    if bool(args.src) != bool(args.ref):
        raise UserError("--src and --ref go together: pass the source file and its references")
    if args.name and ("/" in args.name or args.name.startswith(".")):
        raise UserError(f"--name {args.name!r} must be a plain name, e.g. newstest2014")
    quiet()
    dirs = run_folders(args.runs)
    failed = 0
    for run_dir in dirs:
        try:
            record = evaluate(open_run(run_dir), args)
        except UserError as e:
            if len(dirs) == 1:
                raise
            failed += 1  # a sweep's failed run has no checkpoint: report it, evaluate the others
            print(f"lnexp evaluate: error: {e}", file=sys.stderr, flush=True)
            continue
        print(report(record), flush=True)
        if args.json:
            print(json.dumps(record), flush=True)
    return Exit.BAD_INPUT if failed else Exit.OK


def quiet() -> None:
    import logging
    import warnings

    for category in (UserWarning, FutureWarning, DeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # its paired tests' INFO chatter
