"""``lnexp figure fig3``: gradient norms at initialisation (Xiong et al. 2020, Fig. 3), plus Peri-LN.

(a, b) per layer (encoder 1..L, then decoder 1..L) the Frobenius norm of the gradient of each FFN's
W1 and W2 in a 6+6 model: Pre-LN, Post-LN and Peri-LN at init, Post-LN after warm-up;
(c, d) the gradient norm of the last (decoder) layer's W1 and W2 against depth 6..14.

How it is measured (printed on the figure and stored in fig3_checks.json):
- the paper's model size (d=512, FFN 1024, 4 heads) even at mini scale: nothing is trained for the
  at-init bars; seed s initialises the model (fairseq's init) and draws batch s: random training
  sentences up to ``--max-tokens`` padded tokens. The same batch and the same weights serve every
  placement (paired comparison): Post-, Pre- and Peri-LN have identical initial weights per seed.
- depth-L models are the first L layers of each stack of a freshly initialised 14+14 model (layers
  are independent draws, whatever the depth).
- gradient of the training criterion (label-smoothed cross-entropy) averaged per target token, as
  fairseq normalises it; dropout off (model.eval()): the paper's expected gradient at init.
- "Post-LN after warm-up": the scale's Post-LN model trained for its warm-up length with
  ``lnexp train`` (at mini scale the d=128 mini model, so the figure also shows that model at init),
  measured on the same batches.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lnexp import overrides as override
from lnexp.errors import UserError, at_least
from lnexp.figures import measured
from lnexp.figures.checks import Check, print_checks, read_checks
from lnexp.figures.figure import Figure
from lnexp.names import PAPER_PLACEMENTS
from lnexp.plural import count
from lnexp.rundir import run_paths

FIELDS = ("series", "placement", "state", "arch", "d_model", "depth", "seed", "side", "layer",
          "param", "grad_norm", "loss", "batch_tokens")
SUMMARY_FIELDS = ("series", "placement", "state", "arch", "d_model", "depth", "side", "layer",
                  "param", "mean", "std", "n")
GROWTH = 1.2  # last/first layer ratio above which gradients "grow toward the output layer"
FLAT = 1.3  # max/min ratio across depths up to which a gradient "does not depend on depth"
FAR_BELOW = 0.5  # after warm-up / at init ratio up to which it is "far below"


FIGURE = Figure(
    "fig3", "gradient norms at initialisation (Fig. 3); measures, no training runs needed",
    "Gradient norms at initialisation (Fig. 3)", order=1)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = measured.parser("fig3", __doc__.split("\n")[0],
                        "where the after-warm-up run is trained (reused when finished)")
    p.add_argument("--seeds", type=at_least(1), default=10, help="random seeds (init + batch), default 10")
    p.add_argument("--depths", default="6,8,10,12,14", help="layers per stack for (c, d)")
    p.add_argument("--layers-depth", type=at_least(1), default=None,
                   help="depth of the per-layer panels (a, b); default: the smallest of --depths")
    p.add_argument("--max-tokens", type=at_least(1), default=None,
                   help="padded tokens per measurement batch (default 1024 at mini, the dataset's "
                   "batch size at paper scale)")
    p.add_argument("--d-model", type=at_least(1), default=None,
                   help="model width for the at-init models (default: the paper's model, 512)")
    p.add_argument("--warmup-updates", type=at_least(0), default=None,
                   help="updates of the Post-LN after-warm-up run (default: the scale's warmup; 0 = skip)")
    p.add_argument("--placements", type=measured.placements, default=PAPER_PLACEMENTS,
                   help="comma list of placements, or all (every configs/placement/*.yaml); default "
                   + ",".join(PAPER_PLACEMENTS) + ". Post-, Pre- and Peri-LN share initial weights per "
                   "seed; every other scheme is built at each depth with its own initialisation")
    p.add_argument("--split", default="train", help="dataset split the batches come from")
    p.add_argument("--replot", action="store_true",
                   help="redraw the figure from the summary CSV and checks JSON in --out (no measuring)")
    args = p.parse_args(argv)
    try:
        args.depths = sorted({at_least(1)(d) for d in args.depths.split(",") if d.strip()})
    except argparse.ArgumentTypeError as e:
        p.error(f"--depths {args.depths!r}: {e} (layers per stack, e.g. --depths 6,8,10)")
    if not args.depths:
        p.error("--depths is empty: e.g. --depths 6,8,10")
    if args.layers_depth is None:
        args.layers_depth = args.depths[0]
    if args.layers_depth not in args.depths:
        args.depths = sorted({*args.depths, args.layers_depth})
    return args


def main(argv: list[str]) -> int:
    args = measured.start(parse_args, argv)
    if args.replot:
        return replot(args)
    t0 = time.perf_counter()
    rows, meta = measure(args)
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    summary = summarise(rows)
    meta["last_layer_across_depth"] = across_depth(summary, args)
    checks = contrast_checks(summary, args)
    return measured.finish("fig3", args, FIELDS, rows, SUMMARY_FIELDS, summary, checks, meta,
                           lambda: plot(args, summary, meta))


# --- measurement --------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import torch

    from lnexp import fairseq_adapter as fa
    from lnexp import probes
    from lnexp.data.registry import load_for_training
    from lnexp.model.admin import profile_init
    from lnexp.runtime.host import resolve_device

    cfg = probes.compose_config(["placement=post_ln", f"scale={args.scale}", *args.override])
    if cfg.threads:
        torch.set_num_threads(int(cfg.threads))
    device = resolve_device(cfg)
    max_tokens = args.max_tokens or (1024 if args.scale == "mini" else int(cfg.scale.max_tokens))
    data = load_for_training(cfg.dataset)
    arch = cfg.dataset.paper_arch
    top = max(args.depths)
    base = probes.fairseq_config(cfg, arch=arch, encoder_layers=top, decoder_layers=top,
                                 **measured.model_dims(args.d_model))
    task = fa.setup_task(base, (args.split,))
    seeds = list(range(1, args.seeds + 1))
    batches = {s: probes.sample_batch(task, args.split, max_tokens, s) for s in seeds}
    d_model = int(base.model.encoder_embed_dim)
    rows: list[dict[str, Any]] = []
    timing: dict[str, float] = {}
    t = time.perf_counter()
    paired = [p for p in args.placements if p in PAPER_PLACEMENTS]
    zoo = [p for p in args.placements if p not in PAPER_PLACEMENTS]
    templates = {p: fa.build_model(probes.with_model(base, placement=p), task, 0).to(device).eval()
                 for p in paired if p != "post_ln"}
    for seed in seeds:
        ref = fa.build_model(probes.with_model(base, placement="post_ln"), task, seed)
        criterion = fa.build_criterion(base, task)
        sample = fa.move_to(batches[seed], device)
        state = ref.state_dict()
        models = {"post_ln": ref.to(device).eval()}
        for p, m in templates.items():
            probes.load_init_weights(m, state)
            models[p] = m
        common = {"state": "init", "arch": arch, "d_model": d_model, "seed": seed,
                  "batch_tokens": int(sample["ntokens"])}
        for p in paired:
            for depth in args.depths:
                with probes.truncated(models[p], depth) as m:
                    rows += _measure_one(m, criterion, sample, depth, args.layers_depth, p, common)
        for p in zoo:  # depth-dependent constants and inits (DeepNorm, Mix-LN...): a model per depth
            for depth in args.depths:
                m = fa.build_model(probes.with_model(base, placement=p, encoder_layers=depth,
                                                     decoder_layers=depth), task, seed).to(device)
                profile_init(m, sample["net_input"], seed)  # Admin's gains, as a fresh run sets them
                m.eval()
                rows += _measure_one(m, criterion, sample, depth, args.layers_depth, p, common)
                del m
        print(f"fig3: seed {seed}/{len(seeds)} measured ({time.perf_counter() - t:.0f}s)",
              file=sys.stderr, flush=True)
        del ref, models
    timing["at_init_s"] = round(time.perf_counter() - t, 1)
    warm = _after_warmup(args, cfg, data, batches, device, rows, timing)
    meta = {
        "scale": args.scale, "seeds": len(seeds), "placements": list(args.placements), "depths": args.depths,
        "layers_depth": args.layers_depth, "split": args.split, "max_tokens": max_tokens,
        "batch_tokens_mean": statistics.mean(int(b["ntokens"]) for b in batches.values()),
        "batch_sentences_mean": statistics.mean(int(b["nsentences"]) for b in batches.values()),
        "dataset": cfg.dataset.name, "arch": arch, "d_model": d_model, "device": device,
        "dropout": "off (model.eval())", "criterion": "label-smoothed cross-entropy "
        f"(eps {cfg.scale.label_smoothing}) averaged per target token",
        "batches": "seed s: random sentences of the split (numpy seed s); same batch for every "
        "placement, depth and the after-warm-up model",
        "init": "seed s: fairseq's init of a 14+14 model (torch seed s); Pre-/Peri-LN get the same "
        "weights; depth L = first L layers per stack"
        + ("; the other schemes: their own init of an L+L model (torch seed s; Admin's gains from "
           "its profiling pass on the seed's batch)" if zoo else ""),
        "timing": timing, **warm,
    }
    return rows, meta


def _measure_one(m, criterion, sample, depth: int, layers_depth: int, placement: str,
                 common: dict[str, Any]) -> list[dict[str, Any]]:
    """Gradient norms of one depth-``depth`` model: every FFN at the per-layer panels' depth, else the
    last decoder layer's."""
    from lnexp import probes

    full = depth == layers_depth
    last = m.decoder.layers[-1]
    only = probes.ffn_weights(m) if full else [last.fc1.weight, last.fc2.weight]
    loss = probes.loss_and_grads(m, criterion, sample, only=only)
    return _rows(probes.ffn_grad_norms(m), full, series=f"{placement}_init", placement=placement,
                 depth=depth, loss=loss, **common)


def _rows(grads: dict, full: bool, **common) -> list[dict[str, Any]]:
    out = []
    for (side, layer, param), value in grads.items():
        if full or (side == "decoder" and layer == common["depth"]):
            out.append({**common, "side": side, "layer": layer, "param": param, "grad_norm": value})
    return out


def _after_warmup(args, cfg, data, batches, device, rows, timing) -> dict[str, Any]:
    """Train the scale's Post-LN model for its warm-up (reusing a finished run), then measure it and
    the same architecture at init on the same batches."""
    from lnexp import fairseq_adapter as fa
    from lnexp import probes
    from lnexp.train.loop import train_run

    warmup = int(cfg.warmup) if args.warmup_updates is None else args.warmup_updates
    if warmup <= 0:
        return {"after_warmup": None}
    t = time.perf_counter()
    defaults = ["placement=post_ln", f"scale={args.scale}", f"max_update={warmup}", "seed=1",
                "eval.subset=64"]
    given = {override.key(o) for o in args.override}
    overrides = [o for o in defaults if override.key(o) not in given] + args.override
    wcfg = probes.compose_config(overrides)
    run_dir = args.runs_root / f"fig3_{args.scale}" / f"post_ln_warmup{warmup}"
    status = train_run(wcfg, run_dir)
    timing["warmup_train_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    ckpt = run_paths(run_dir)["last"]
    arch = wcfg.scale.arch
    fcfg = probes.fairseq_config(wcfg, arch=arch)
    task = fa.setup_task(fcfg, ())
    criterion = fa.build_criterion(fcfg, task)
    trained = fa.build_model(fcfg, task, 1)
    trained.load_state_dict(fa.load_checkpoint_state(ckpt)["model"])
    trained.to(device).eval()
    d_model = int(fcfg.model.encoder_embed_dim)
    depth = int(fcfg.model.decoder_layers)
    for seed, batch in batches.items():
        sample = fa.move_to(batch, device)
        fresh = fa.build_model(fcfg, task, seed).to(device).eval()
        for state, model in (("after_warmup", trained), ("init", fresh)):
            loss = probes.loss_and_grads(model, criterion, sample, only=probes.ffn_weights(model))
            rows += _rows(probes.ffn_grad_norms(model), True,
                          series=f"post_ln_{state}_{arch}", placement="post_ln", state=state,
                          arch=arch, d_model=d_model, depth=depth, seed=seed, loss=loss,
                          batch_tokens=int(sample["ntokens"]))
    timing["warmup_measure_s"] = round(time.perf_counter() - t, 1)
    return {"after_warmup": {"run_dir": str(run_dir), "updates": status.get("updates"),
                             "status": status.get("status"), "arch": arch, "d_model": d_model,
                             "lr": float(wcfg.lr), "warmup": int(wcfg.warmup),
                             "train_max_tokens": int(wcfg.scale.max_tokens),
                             "dropout_in_training": float(wcfg.scale.dropout)}}


# --- summary and checks -------------------------------------------------------------------------


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return measured.summarise(rows, SUMMARY_FIELDS[:9], "grad_norm")


class _Lookup:
    def __init__(self, summary: list[dict[str, Any]]) -> None:
        self.t = {(r["series"], r["depth"], r["side"], r["layer"], r["param"]): r for r in summary}

    def mean(self, series, depth, side, layer, param) -> float:
        r = self.t.get((series, depth, side, layer, param))
        return float(r["mean"]) if r else math.nan


def contrast_checks(summary: list[dict[str, Any]], args) -> list[Check]:
    g = _Lookup(summary)
    depths, L = args.depths, args.layers_depth
    checks: list[Check] = []

    def last_w(series: str, depth: int, param: str = "W2") -> float:
        return g.mean(series, depth, "decoder", depth, param)

    def add(name, value, passed, claim, **extra):
        ok = None if passed is None or not math.isfinite(value) else bool(passed)
        checks.append(Check.of_value(name, claim, value, ok, **extra))

    post = [last_w("post_ln_init", d) for d in depths]
    ratio = max(post) / min(post)
    add("post_ln_last_w2_flat_across_depth", ratio, ratio <= FLAT,
        f"Post-LN's last-layer W2 gradient does not depend on depth: max/min over depths "
        f"{depths} <= {FLAT}", threshold=FLAT, values=dict(zip(map(str, depths), post, strict=True)))
    a, b = (depths[1] if len(depths) >= 3 else depths[0]), depths[-1]
    r = last_w("pre_ln_init", b) / last_w("pre_ln_init", a)
    pre = [last_w("pre_ln_init", d) for d in depths]
    add("pre_ln_last_w2_falls_with_depth", r, r < 1.0,
        f"Pre-LN's last-layer W2 gradient falls from {a} to {b} layers (ratio {b}/{a} < 1; "
        f"theory ~ 1/sqrt(L): {math.sqrt(a / b):.3f})", threshold=1.0, depths=[a, b],
        theory=math.sqrt(a / b), values=dict(zip(map(str, depths), pre, strict=True)),
        monotone=all(x > y for x, y in zip(pre[1:], pre[2:], strict=False)))
    for p, want in (("post_ln", True), ("pre_ln", False), ("peri_ln", None)):
        for param in ("W2", "W1"):
            first = g.mean(f"{p}_init", L, "decoder", 1, param)
            last = g.mean(f"{p}_init", L, "decoder", L, param)
            grows = last / first
            enc = g.mean(f"{p}_init", L, "encoder", L, param) / g.mean(f"{p}_init", L, "encoder", 1,
                                                                       param)
            passed = None if want is None or param == "W1" else (grows > GROWTH) == want
            verb = "grow" if want else "do not grow"
            add(f"{p}_{param.lower()}_growth_toward_output", grows, passed,
                f"{p}: decoder {param} gradient, layer {L} / layer 1 "
                + ("(reported)" if passed is None else f"({verb}: {'>' if want else '<='} {GROWTH})"),
                threshold=GROWTH, encoder_ratio=enc)
    for p in ("peri_ln",):
        vals = [last_w(f"{p}_init", d) for d in depths]
        add(f"{p}_last_w2_across_depth", max(vals) / min(vals), None,
            "Peri-LN's last-layer W2 gradient, max/min over depths (reported)",
            values=dict(zip(map(str, depths), vals, strict=True)),
            ratio_deep_over_shallow=last_w(f"{p}_init", b) / last_w(f"{p}_init", a))
    absent = [p for p in PAPER_PLACEMENTS if p not in args.placements]
    # a claim about a placement not measured (--placements) is not made
    checks[:] = [c for c in checks if c.id.split("_ln_")[0] + "_ln" not in absent]
    warm = [r for r in summary if r["state"] == "after_warmup"]
    if warm:
        arch, depth = warm[0]["arch"], warm[0]["depth"]
        after = last_w(f"post_ln_after_warmup_{arch}", depth)
        init_same = last_w(f"post_ln_init_{arch}", depth)
        init_big = last_w("post_ln_init", L)
        add("post_ln_after_warmup_far_below_init", after / init_same, after / init_same <= FAR_BELOW,
            f"Post-LN's last-layer W2 gradient after warm-up / at init, same model ({arch}), "
            f"<= {FAR_BELOW}", threshold=FAR_BELOW, after=after, init_same_model=init_same,
            ratio_to_paper_size_init=after / init_big)
    return checks


def across_depth(summary: list[dict[str, Any]], args) -> dict[str, dict[str, Any]]:
    """Per placement, the last decoder layer's W1/W2 gradient against depth: the values, max/min
    (flat: <= FLAT) and deepest/shallowest; the zoo's answer to (c, d), stored in the checks JSON."""
    g = _Lookup(summary)
    out: dict[str, dict[str, Any]] = {}
    for p in args.placements:
        for param in ("W1", "W2"):
            vals = [g.mean(f"{p}_init", d, "decoder", d, param) for d in args.depths]
            finite = [v for v in vals if math.isfinite(v) and v > 0]
            out.setdefault(p, {})[param] = {
                "values": dict(zip(map(str, args.depths), vals, strict=True)),
                "max_over_min": max(finite) / min(finite) if finite else math.nan,
                "deep_over_shallow": vals[-1] / vals[0] if vals[0] else math.nan,
                "flat": bool(finite) and max(finite) / min(finite) <= FLAT}
    return out


# --- output -------------------------------------------------------------------------------------


def replot(args) -> int:
    for suffix in ("_summary.csv", "_checks.json"):
        if not (args.out / f"{args.name}{suffix}").is_file():
            raise UserError(f"--replot redraws saved measurements, but {args.out / (args.name + suffix)} "
                            "does not exist: run `lnexp figure fig3` (make fig3) first")
    with open(args.out / f"{args.name}_summary.csv", newline="", encoding="utf-8") as f:
        summary = [{**r, "depth": int(r["depth"]), "layer": int(r["layer"]), "d_model": int(r["d_model"]),
                    "mean": float(r["mean"]), "std": float(r["std"]), "n": int(r["n"])}
                   for r in csv.DictReader(f)]
    doc, checks = read_checks(args.out / f"{args.name}_checks.json")
    meta = doc["meta"]
    args.depths, args.layers_depth = meta["depths"], meta["layers_depth"]
    args.placements = tuple(meta.get("placements", PAPER_PLACEMENTS))
    print_checks(checks, measured.MARKS)
    print("fig3: redrew " + ", ".join(str(p) for p in plot(args, summary, meta)))
    return 0


def plot(args, summary, meta) -> list[Path]:
    from lnexp.figures import style

    plt = style.setup()
    if any(p not in PAPER_PLACEMENTS for p in args.placements):
        return plot_zoo(plt, args, summary, meta)
    g = _Lookup(summary)
    L, depths = args.layers_depth, args.depths
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.2))
    series = [(f"{p}_init", p, f"{style.LABELS[p]} (init)", {}) for p in ("pre_ln", "post_ln", "peri_ln")
              if p in args.placements]
    warm = meta.get("after_warmup")
    if warm:
        arch, small = warm["arch"], warm["d_model"] != meta["d_model"]
        size = f", d={warm['d_model']}" if small else ""
        if small:
            series.append((f"post_ln_init_{arch}", "post_ln", f"Post-LN (init{size})",
                           {"fill": False, "hatch": "//", "linewidth": 0.8}))
        series.append((f"post_ln_after_warmup_{arch}", "post_ln", f"Post-LN (after warm-up{size})",
                       {"alpha": 0.45}))
    width = 0.8 / len(series)
    std = {(r["series"], r["depth"], r["side"], r["layer"], r["param"]): r["std"] for r in summary}
    at_init = {f"{p}_init" for p in args.placements}

    def depth_of(name: str) -> int:
        return L if name in at_init else _series_depth(summary, name, L)

    span = max(depth_of(name) for name, *_ in series)
    for ax, param, tag in ((axes[0, 0], "W1", "(a)"), (axes[0, 1], "W2", "(b)")):
        for k, (name, placement, label, kw) in enumerate(series):
            depth = depth_of(name)
            xs, ys, es = [], [], []
            for i, side in enumerate(("encoder", "decoder")):
                for layer in range(1, depth + 1):
                    key = (name, depth, side, layer, param)
                    if key in std:
                        xs.append(i * (span + 1) + layer + (k - (len(series) - 1) / 2) * width)
                        ys.append(g.mean(*key))
                        es.append(std[key])
            color = style.COLORS[placement]
            bar_kw = {"edgecolor": color, **kw} if kw.get("fill") is False else {"color": color, **kw}
            ax.bar(xs, ys, width, yerr=es, label=label, capsize=1.5,
                   error_kw={"elinewidth": 0.7}, **bar_kw)
        ticks = [i * (span + 1) + layer for i in range(2) for layer in range(1, span + 1)]
        ax.set_xticks(ticks, [f"{s}{layer}" for s in ("E", "D") for layer in range(1, span + 1)])
        ax.axvline(span + 1, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel("layer (E = encoder, D = decoder)")
        ax.set_ylabel(f"‖∂L/∂{param}‖_F")
        ax.set_title(f"{tag} gradient norm of {param} per layer, {L}-{L} model")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.4)
        ax.legend(ncol=3, loc="upper center", fontsize=7)
    for ax, param, tag in ((axes[1, 0], "W1", "(c)"), (axes[1, 1], "W2", "(d)")):
        for p in args.placements:
            ys = [g.mean(f"{p}_init", d, "decoder", d, param) for d in depths]
            es = [std.get((f"{p}_init", d, "decoder", d, param), 0.0) for d in depths]
            ax.errorbar(depths, ys, yerr=es, marker="o", ms=4, capsize=2, color=style.COLORS[p],
                        label=f"{style.LABELS[p]} (init)")
        ax.set_xticks(depths, [f"{d}-{d}" for d in depths])
        ax.set_xlabel("model depth (encoder-decoder layers)")
        ax.set_ylabel(f"‖∂L/∂{param}‖_F, last decoder layer")
        ax.set_title(f"{tag} gradient norm of the last layer's {param} vs depth")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return style.save(fig, args.out, args.name, _note(meta))


def _note(meta) -> str:
    warm = meta.get("after_warmup")
    note = (f"{meta['dataset']} {meta['split']}, scale={meta['scale']}: at init d={meta['d_model']} "
            f"(fairseq init), {count(meta['seeds'], 'seed')} (init + batch of <= "
            f"{meta['max_tokens']} tokens, mean {meta['batch_tokens_mean']:.0f} target tokens), "
            "dropout off; error bars: std over seeds.")
    if warm:
        note += (f"\nPost-LN after warm-up: {warm['arch']} (d={warm['d_model']}) trained "
                 f"{count(warm['updates'], 'update')} (lr {warm['lr']:g}, warm-up {warm['warmup']}), "
                 "measured on the same batches"
                 + ("; hatched: that model at init" if warm["d_model"] != meta["d_model"] else ""))
    return note


def plot_zoo(plt, args, summary, meta) -> list[Path]:
    """Many placements: heatmaps, one row per scheme (label in its colour). (a, b) log10 of each
    layer's gradient norm; (c, d) the last layer's gradient at each depth over its value at the
    shallowest depth (1 = flat in depth), numbers in the cells (the gradient itself where it is 0 at
    the shallowest depth: ReZero's gate)."""
    import numpy as np

    from lnexp.figures import style

    g = _Lookup(summary)
    L, depths, places = args.layers_depth, args.depths, list(args.placements)
    fig, axes = plt.subplots(2, 2, figsize=(13, 2.2 + 0.42 * len(places) * 2),
                             gridspec_kw={"width_ratios": (2, 1)})
    layers = [(side, layer) for side in ("encoder", "decoder") for layer in range(1, L + 1)]
    for row, param in enumerate(("W1", "W2")):
        per_layer = np.array([[g.mean(f"{p}_init", L, s, la, param) for s, la in layers] for p in places])
        ax = axes[row, 0]
        with np.errstate(divide="ignore", invalid="ignore"):  # ReZero at init: exactly 0 (gate 0)
            im = ax.imshow(np.ma.masked_invalid(np.log10(per_layer)), aspect="auto", cmap="viridis")
        ax.set_xticks(range(len(layers)), [f"{s[0].upper()}{la}" for s, la in layers])
        ax.axvline(L - 0.5, color="white", lw=1)
        ax.set_xlabel("layer (E = encoder, D = decoder)")
        ax.set_title(f"({'ab'[row]}) log10 ‖∂L/∂{param}‖_F per layer, {L}-{L} model at init")
        fig.colorbar(im, ax=ax, fraction=0.03)
        last = np.array([[g.mean(f"{p}_init", d, "decoder", d, param) for d in depths] for p in places])
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = last / last[:, :1]
            shade = np.ma.masked_invalid(np.log2(rel))
        ax = axes[row, 1]
        im = ax.imshow(shade, aspect="auto", cmap="coolwarm", vmin=-2, vmax=2)
        for i in range(len(places)):
            for j in range(len(depths)):
                text = f"{rel[i, j]:.2f}" if np.isfinite(rel[i, j]) else f"{last[i, j]:.2g}"
                ax.text(j, i, text, ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(depths)), [f"{d}-{d}" for d in depths])
        ax.set_xlabel("model depth (encoder-decoder layers)")
        ax.set_title(f"({'cd'[row]}) last layer's {param} gradient / at {depths[0]}-{depths[0]}")
        fig.colorbar(im, ax=ax, fraction=0.05, label="log2 ratio")
        for ax in axes[row]:
            ax.set_yticks(range(len(places)), [style.LABELS[p] for p in places])
            ax.grid(False)
            for tick, p in zip(ax.get_yticklabels(), places, strict=True):
                tick.set_color(style.COLORS[p])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    note = (_note(meta).replace("(fairseq init)", "(fairseq init; schemes other than Post-/Pre-/Peri-LN: "
                                "their own init at each depth)")
            .replace("error bars: std over seeds", "cells: means over seeds (std in the summary CSV)")
            + ("\nPost-LN after warm-up: in the summary CSV (not drawn here)"
               if meta.get("after_warmup") else ""))
    return style.save(fig, args.out, args.name, note)


def _series_depth(summary, name: str, default: int) -> int:
    depths = {r["depth"] for r in summary if r["series"] == name}
    return max(depths) if depths else default
