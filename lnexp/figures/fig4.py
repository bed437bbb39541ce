"""``lnexp figure fig4``: convergence speed, Pre-LN without warm-up vs Post-LN (Xiong et al., Fig. 4).

Reads the runs of ``experiment=fig4_SCALE`` (and, at the paper scale, ``fig4_wmt_paper``) and writes
figures/fig4.{png,pdf}, fig4.csv, fig4_summary.csv and fig4_checks.json.

Required check: Pre-LN without warm-up (Adam) reaches the final valid loss of Post-LN with warm-up
at least 1.5x sooner, in epochs. "Reaches" is the first crossing of the target, linearly
interpolated between evaluated epochs (the whole-epoch value is reported too).
"""

from __future__ import annotations

import math
from typing import Any

from lnexp.figures import runs as R
from lnexp.figures.checks import Check, write_checks
from lnexp.figures.figure import Figure
from lnexp.plural import count
from lnexp.results import Run

FAILED = ("diverged", "plateau")  # the statuses a curve's label names

FIGURE = Figure(
    "fig4", "convergence speed, Pre-LN without warm-up vs Post-LN (Fig. 4), from finished runs",
    "Convergence speed: Pre-LN without warm-up vs Post-LN (Fig. 4)", order=4,
    experiments=lambda scale: [f"fig4_{scale}"] + (["fig4_wmt_paper"] if scale == "paper" else []))


def arm(run: Run) -> str:
    from lnexp.figures.style import LABELS

    p = LABELS.get(str(run.get("placement.name")), str(run.get("placement.name")))
    opt = {"adam": "Adam", "radam": "RAdam", "sgd": "SGD"}.get(str(run.get("optimizer.name")),
                                                            str(run.get("optimizer.name")))
    w = int(run.get("warmup"))
    return f"{p}, {opt}, " + (f"warm-up {w}" if w else "no warm-up") + f", lr {run.get('lr'):g}"


def _pick(runs: list[Run], placement: str, optimizer: str, warm: bool) -> Run | None:
    for r in runs:
        if r.metrics and r.get("placement.name") == placement and r.get("optimizer.name") == optimizer \
                and (int(r.get("warmup")) > 0) == warm:
            return r
    return None


def speedup(pre: Run, post: Run) -> dict[str, Any]:
    target = post.series("valid_loss")[-1]
    e_post = float(post.metrics[-1]["epoch"])
    ep = pre.series("epoch")
    e_pre = R.epochs_to_reach(ep, pre.series("valid_loss"), target)
    whole = next((e for e, v in zip(ep, pre.series("valid_loss"), strict=True)
                  if math.isfinite(v) and v <= target), None)
    ratio = None if not e_pre else e_post / e_pre
    return {"pre_run": pre.name, "post_run": post.name, "target_valid_loss": R.rounded(target),
            "post_epochs": e_post, "pre_epochs_to_target": R.rounded(e_pre), "pre_whole_epoch": whole,
            "speedup": R.rounded(ratio), "speedup_whole_epochs": R.rounded(e_post / whole) if whole else None,
            "pass": bool(ratio is not None and ratio >= 1.5)}


def checks(runs: list[Run]) -> list[Check]:
    post = _pick(runs, "post_ln", "adam", True)
    out = []
    for opt, required in (("adam", True), ("radam", False)):
        pre = _pick(runs, "pre_ln", opt, False)
        if post is None or pre is None:
            out.append(Check(f"fig4_speedup_{opt}", f"Pre-LN ({opt}) without warm-up reaches Post-LN's "
                               "final valid loss >= 1.5x sooner (epochs)", "Pre-LN epoch 9 ~ Post-LN epoch "
                               "15 (1.67x)", {}, "runs missing", None, required))
            continue
        s = speedup(pre, post)
        out.append(Check(
            f"fig4_speedup_{opt}", f"Pre-LN ({'Adam' if opt == 'adam' else 'RAdam'}) without warm-up "
            f"reaches the final valid loss of Post-LN (Adam, warm-up {int(post.get('warmup'))}) >= 1.5x "
            "sooner, in epochs", "Pre-LN's 9th epoch ~ Post-LN's 15th (1.67x; valid loss ~4, BLEU ~34)", s,
            f"target {R.fmt(s['target_valid_loss'])} bits reached at epoch {R.fmt(s['pre_epochs_to_target'])}"
            f" vs {R.fmt(s['post_epochs'], 0)}: {R.fmt(s['speedup'])}x", s["pass"], required))
    pa, pr = _pick(runs, "pre_ln", "adam", False), _pick(runs, "pre_ln", "radam", False)
    if pa and pr:
        dl = (pa.series("valid_loss")[-1] - pr.series("valid_loss")[-1]) / R.BITS_PER_NAT
        db = pa.series("valid_bleu")[-1] - pr.series("valid_bleu")[-1]
        out.append(Check(
            "fig4_pre_ln_adam_vs_radam", "with Pre-LN, Adam vs RAdam makes little difference "
            "(final valid loss within 0.15 nat)", "little difference (Fig. 4)",
            {"delta_valid_loss_nats": R.rounded(dl), "delta_bleu": R.rounded(db)},
            f"Adam - RAdam: {R.fmt(dl)} nat, {R.fmt(db)} BLEU", bool(abs(dl) <= 0.15), required=False))
    prad = _pick(runs, "post_ln", "radam", False)
    if prad and pa:
        lp, lr_ = pa.series("valid_loss")[-1], prad.series("valid_loss")[-1]
        out.append(Check(
            "fig4_pre_ln_vs_post_ln_radam", "Pre-LN (Adam, no warm-up) ends below Post-LN with RAdam "
            "(no warm-up)", "Pre-LN converges faster than Post-LN + RAdam",
            {"pre_ln_valid_loss": R.rounded(lp), "post_ln_radam_valid_loss": R.rounded(lr_)},
            f"{R.fmt(lp)} vs {R.fmt(lr_)} bits", bool(lp < lr_), required=False))
    return out


def draw(panels: list[tuple[str, list[Run]]]):
    from lnexp.figures import style

    plt = style.setup()
    fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.6 * len(panels)), squeeze=False)
    for row, (title, runs) in enumerate(panels):
        for r in runs:
            if not r.metrics:
                continue
            color = style.COLORS.get(str(r.get("placement.name")), "0.3")
            ls = "-" if r.get("optimizer.name") == "adam" else "--"
            marker = "o" if int(r.get("warmup")) == 0 else "^"
            for col, key in enumerate(("valid_loss", "valid_bleu")):
                axes[row][col].plot(r.series("epoch"), r.series(key), ls, color=color, marker=marker,
                                    ms=3, label=arm(r) + (f" [{r.state}]" if r.state in FAILED else ""))
        style.epoch_panels(axes[row][0], axes[row][1], title)
        if runs:
            axes[row][1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    return fig


def main(argv: list[str]) -> int:
    from lnexp.figures import style

    args, exps, found = R.start(FIGURE, "convergence speed: Pre-LN without warm-up vs Post-LN (Fig. 4)", argv)
    main_runs = found[exps[0]]
    R.need_epochs(main_runs, exps[0], args.runs_root, "make fig4")
    all_runs = [r for e in exps for r in found[e]]
    R.write_csvs(args.out, "fig4", all_runs)
    main_runs = [r for r in main_runs if r.metrics]  # failed runs without epochs stay in the CSVs
    cks = checks(main_runs)
    panels = [(f"{main_runs[0].get('dataset.name', '')}", main_runs)]
    if len(exps) > 1 and any(r.metrics for r in found[exps[1]]):
        panels.append(("WMT14 en-de", [r for r in found[exps[1]] if r.metrics]))
    fig = draw(panels)
    note = f"scale={args.scale}; {count(len(all_runs), 'run')}; losses in bits/token"
    paths = style.save(fig, args.out, "fig4", note)
    write_checks(args.out, "fig4", args.scale, cks, {"units": R.UNITS, "experiments": exps,
                                                     "runs": [r.name for r in all_runs]})
    R.print_outputs(cks, paths, args.out, ("fig4.csv", "fig4_summary.csv", "fig4_checks.json"))
    return 0
