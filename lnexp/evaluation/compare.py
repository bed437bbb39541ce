"""``lnexp compare``: is the BLEU difference between two runs real?

    lnexp compare RUN_A[@CKPT] RUN_B[@CKPT] [--split test|valid] [--checkpoint best|last|avgN]
                  [--beam B] [--lenpen L] [--batch-size N] [--bs-n N] [--ar-n N] [--json]

Both runs are decoded on the same sentences with ``lnexp evaluate``'s pipeline (same record files
under RUN/eval/), then sacreBLEU's own paired tests compare B against the baseline A, for BLEU and
chrF: paired bootstrap resampling (Koehn 2004; sacreBLEU's 1,000 resamples and 95% intervals) and
approximate randomisation (Riezler and Maxwell 2005; 10,000 trials). The printed ``sacrebleu``
command gives the same numbers from the written files. ``RUN@last`` picks a checkpoint per run.

Identical hypotheses (a run against itself, a copied file), and a metric on which two systems score
exactly alike (BLEU 0.00 both), are no difference, p = 1: sacreBLEU's
p-value counts only resamples that beat the observed difference strictly (multeval's convention),
so for two identical systems it gives its smallest value, 1/(n+1), which would read as
significant; and its command line refuses one file given twice. Neither is printed then.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lnexp.errors import UserError, at_least
from lnexp.plural import count

TESTS = {"bs": "paired bootstrap", "ar": "approximate randomisation"}
ALPHA = 0.05  # the significance level the verdict line uses


def split_spec(spec: str, default: str) -> tuple[Path, str]:
    """``RUN@CKPT`` -> (RUN, CKPT); a plain RUN takes ``--checkpoint``."""
    from lnexp.evaluation.checkpoints import AVG

    run, sep, ckpt = spec.rpartition("@")
    if sep and (ckpt in ("best", "last") or AVG.fullmatch(ckpt)):
        return Path(run), ckpt
    return Path(spec), default


def checked(spec: str, default: str) -> tuple[Any, str]:
    """(the run, its checkpoint) of one side, checked before either side is decoded: a mistake in
    B writes nothing into A's folder."""
    from lnexp.evaluation import checkpoints
    from lnexp.evaluation.runinfo import open_run
    from lnexp.rundir import RUN, run_paths

    run_dir, ckpt = split_spec(spec, default)
    if not run_paths(run_dir)["run"].is_file():
        raise UserError(f"{run_dir} is not a run folder (no {RUN}): pass two folders that lnexp "
                        "train wrote, e.g. lnexp compare runs/default runs/placement=pre_ln")
    run = open_run(run_dir)
    checkpoints.resolve(run.dir, ckpt)
    return run, ckpt


def decode(run: Any, ckpt: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side: ``lnexp evaluate``'s record (hypotheses, references, BLEU) for RUN@CKPT; the one
    an earlier ``lnexp evaluate`` wrote where decoding again would give the same (same data,
    checkpoint files and decoding settings: ``evaluate.scored``)."""
    from lnexp.evaluation.evaluate import evaluate, scored

    ns = SimpleNamespace(checkpoint=ckpt, beam=args.beam, lenpen=args.lenpen,
                         batch_size=args.batch_size, device=args.device, split=args.split,
                         src=None, ref=None, name=None)
    record = scored(run, ns)
    if record is None:
        return evaluate(run, ns)
    print(f"{run.dir.name}: {args.split} decoded by lnexp evaluate at {record['time']} with the same "
          "data, checkpoint and settings: its hypotheses are used, not decoded again",
          file=sys.stderr, flush=True)
    return record


def same_references(sides: list[tuple[Any, str]], split: str) -> None:
    """Runs trained on different data are refused before either is decoded: their references of
    ``split`` must be the same sentences (two vocabularies of one corpus are comparable)."""
    (a, _), (b, _) = sides
    if a.data.references(split) != b.data.references(split):
        raise UserError(f"{a.dir} and {b.dir} were trained on different data ({a.data.name} "
                        f"{a.data.key} and {b.data.name} {b.data.key}: their {split} references "
                        "differ): compare runs of one corpus and split")


def read_lines(path: str) -> list[str]:
    from lnexp.data.text import read_lines as read

    return read(Path(path))


def paired_tests(hyps_a: list[str], hyps_b: list[str], refs: list[str], names: tuple[str, str],
                 n: dict[str, int]) -> dict[str, Any]:
    """sacreBLEU's PairedTest, as its command line runs it (``--paired-bs``, ``--paired-ar``)."""
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    out: dict[str, Any] = {"metrics": {}, "signatures": {}}
    for test in TESTS:
        metrics = {"BLEU": BLEU(references=[refs]), "chrF": CHRF(references=[refs])}
        sigs, scores = PairedTest([(names[0], hyps_a), (names[1], hyps_b)], metrics, references=None,
                                  test_type=test, n_samples=n[test])()
        out["signatures"][test] = {k: v.format() for k, v in sigs.items()}
        for metric in (k for k in scores if k != "System"):  # sacreBLEU's names: BLEU, chrF2
            base, system = scores[metric]
            row = out["metrics"].setdefault(metric, {})
            row.update(a=float(base.score), b=float(system.score),
                       diff=float(system.score) - float(base.score))
            row[f"p_{test}"] = float(system.p_value)
            if test == "bs":  # numpy floats from sacreBLEU's resampling
                row.update(a_mean=float(base.mean), a_ci=float(base.ci), b_mean=float(system.mean),
                           b_ci=float(system.ci))
    return out


def no_difference(result: dict[str, Any], identical: bool) -> None:
    """p = 1 where nothing can be told apart: identical systems, or a metric whose observed
    difference is exactly 0 (two different systems that both score BLEU 0.00: every resample
    scores them alike too, none beats the observed difference strictly, and sacreBLEU's p-value
    would be its smallest, 1/(n+1), read as significant; see the module's note)."""
    for row in result["metrics"].values():
        if identical or row["diff"] == 0.0:
            row.update(p_bs=1.0, p_ar=1.0)


def sacrebleu_command(refs: str, hyps_a: str, hyps_b: str, test: str, n: int) -> str:
    flag = {"bs": ["--paired-bs", "--paired-bs-n"], "ar": ["--paired-ar", "--paired-ar-n"]}[test]
    return shlex.join(["sacrebleu", refs, "-i", hyps_a, hyps_b, "-m", "bleu", "chrf",
                       flag[0], flag[1], str(n)])


def compare(args: argparse.Namespace) -> dict[str, Any]:
    sides = [checked(spec, args.checkpoint) for spec in (args.run_a, args.run_b)]
    same_references(sides, args.split)
    a = decode(*sides[0], args)
    same = sides[0][1] == sides[1][1] and sides[0][0].dir.resolve() == sides[1][0].dir.resolve()
    b = a if same else decode(*sides[1], args)  # a run against itself: decoded once
    refs = read_lines(a["refs"])
    if read_lines(b["refs"]) != refs:
        raise UserError(f"{a['run']} and {b['run']} were scored against different references "
                        f"({a['refs']}, {b['refs']}): compare runs of one corpus and split")
    hyps_a, hyps_b = read_lines(a["hyps"]), read_lines(b["hyps"])
    if not len(hyps_a) == len(hyps_b) == len(refs):
        raise UserError(f"{len(hyps_a)} and {len(hyps_b)} hypotheses for {count(len(refs), 'reference')}: "
                        "evaluate both runs again (lnexp evaluate RUN)")
    n = {"bs": args.bs_n, "ar": args.ar_n}
    result = paired_tests(hyps_a, hyps_b, refs, (a["hyps"], b["hyps"]), n)
    identical = hyps_a == hyps_b
    no_difference(result, identical)
    side = ("run", "checkpoint", "beam", "lenpen", "hyps", "bleu", "chrf", "signature")
    commands = {} if identical else {
        t: sacrebleu_command(a["refs"], a["hyps"], b["hyps"], t, n[t]) for t in TESTS}
    return {"a": {k: a[k] for k in side}, "b": {k: b[k] for k in side}, "set": a["set"],
            "n": len(refs), "refs": a["refs"], "n_samples": n, "identical": identical, **result,
            "sacrebleu_commands": commands}


def report(r: dict[str, Any]) -> str:
    a, b = r["a"], r["b"]
    lines = [f"{r['set']} ({count(r['n'], 'sentence')}); baseline A = {a['run']} ({a['checkpoint']}, beam "
             f"{a['beam']}), B = {b['run']} ({b['checkpoint']}, beam {b['beam']})",
             f"  {'metric':<6} {'A':>6} {'B':>6} {'B-A':>6}  {'A mean ± 95% CI':>16}  "
             f"{'B mean ± 95% CI':>16}  {'p (bootstrap)':>13}  {'p (approx. rand.)':>17}"]
    for metric, m in r["metrics"].items():
        lines.append(f"  {metric:<6} {m['a']:6.2f} {m['b']:6.2f} {m['diff']:+6.2f}  "
                     f"{m['a_mean']:7.2f} ± {m['a_ci']:5.2f}   {m['b_mean']:7.2f} ± {m['b_ci']:5.2f}  "
                     f"{m['p_bs']:13.4f}  {m['p_ar']:17.4f}")
    for metric, m in r["metrics"].items():
        real = m["p_bs"] < ALPHA and m["p_ar"] < ALPHA
        lines.append(f"  {metric} difference {m['diff']:+.2f}: " + (
            "no difference: the two systems' hypotheses are identical (p = 1)" if r["identical"]
            else f"significant at p < {ALPHA} by both tests" if real
            else f"not significant at p < {ALPHA} by both tests"))
    for test, sigs in r["signatures"].items():
        lines.append(f"  {TESTS[test]}: " + "; ".join(f"{k} {v}" for k, v in sigs.items()))
    lines += [f"  same numbers: {cmd}" for cmd in r["sacrebleu_commands"].values()]
    if r["identical"]:
        lines.append("  (no sacrebleu command: its paired tests need two different systems)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from lnexp.evaluation.evaluate import parser, quiet

    ap = parser("lnexp compare", __doc__.split("\n\n")[0])
    ap.add_argument("run_a", metavar="RUN_A[@CKPT]", help="the baseline run folder")
    ap.add_argument("run_b", metavar="RUN_B[@CKPT]", help="the run compared against it")
    ap.add_argument("--split", default="test", choices=("test", "valid"),
                    help="a split of the runs' prepared corpus (default test)")
    ap.add_argument("--bs-n", type=at_least(1), default=1000,
                    help="bootstrap resamples (sacreBLEU's 1000)")
    ap.add_argument("--ar-n", type=at_least(1), default=10000,
                    help="approximate-randomisation trials (sacreBLEU's 10000)")
    ap.add_argument("--json", action="store_true", help="also print the result as one JSON line")
    args = ap.parse_args(argv)
    quiet()
    result = compare(args)
    print(report(result), flush=True)
    if args.json:
        print(json.dumps(result), flush=True)
    return 0
