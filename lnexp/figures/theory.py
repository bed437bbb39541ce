"""``lnexp figure theory``: Xiong et al.'s lemmas at initialisation, and Kan et al.'s hidden-state growth.

(a) Post-LN: E‖x^{post,5}_l‖²/d, the FFN output plus residual just before each layer's last LN
    (theory: 3/2 at every layer);
(b) Pre-LN: E‖x_l‖²/d after l layers (theory: between 1 + l/2 and 1 + 3l/2), with Peri-LN alongside;
(c) the spectral norm of LayerNorm's Jacobian against √d/‖x‖ (theory: O(√d/‖x‖); exactly
    √d/‖x − mean(x)‖ for LN without affine, so equal for centred x);
(d, e) Kan et al.: mean |x| and variance of the hidden states after each layer, at init and after
    training, for Pre-LN, Peri-LN and Pre-LN with residual step Δt = 0.1.

(a, b) are computed in the paper's simplified setting -- lnexp's real encoder layers with one head,
W_Q = W_K = 0 (uniform attention), Xavier init, zero biases, FFN width d with ReLU, Gaussian input
x ~ N(0, I) -- and reported alongside for the real model at init (fairseq's init, real batch).
Nothing is trained for (a)-(c). For (d, e) "after training" comes from finished runs under
``--runs-root`` if every configuration has one with the same number of updates, else from short
runs trained here (stated on the figure).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from lnexp.errors import at_least
from lnexp.figures import measured
from lnexp.figures.checks import Check
from lnexp.figures.figure import Figure
from lnexp.names import PAPER_PLACEMENTS
from lnexp.plural import count

LEMMA_PLACEMENTS = PAPER_PLACEMENTS
KAN_CONFIGS = (("pre_ln", 1.0), ("peri_ln", 1.0), ("pre_ln", 0.1))
FIELDS = ("setting", "placement", "residual_scale", "state", "seed", "side", "layer", "point",
          "quantity", "value")
SUMMARY_FIELDS = ("setting", "placement", "residual_scale", "state", "side", "layer", "point",
                  "quantity", "mean", "std", "n")
POST_TOL = 0.2  # |E‖x^{post,5}‖²/d − 3/2| allowed at every layer
JAC_TOL = 0.01  # relative deviation of ‖J_LN‖₂ from √d/‖x‖ for centred x


FIGURE = Figure(
    "theory", "the paper's lemmas and hidden-state growth at initialisation",
    "Theory at initialisation (lemmas, hidden-state growth)", order=2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = measured.parser("theory", __doc__.split("\n")[0], "where finished runs for (d, e) are looked for")
    p.add_argument("--lemma-d", type=at_least(1), default=256, help="width in the simplified setting")
    p.add_argument("--lemma-layers", type=at_least(1), default=12, help="layers in the simplified setting")
    p.add_argument("--lemma-seeds", type=at_least(1), default=6, help="initialisations averaged")
    p.add_argument("--lemma-tokens", type=at_least(1), default=32, help="tokens per sequence (x 8 sequences)")
    p.add_argument("--d-model", type=at_least(1), default=None,
                   help="width of the real model at init (default: the paper's model, 512)")
    p.add_argument("--real-seeds", type=at_least(1), default=2, help="initialisations of the real model")
    p.add_argument("--max-tokens", type=at_least(1), default=512, help="padded tokens of the real batch")
    p.add_argument("--train-updates", type=at_least(0), default=20,
                   help="updates of the short runs for (d, e) when no finished runs are found; "
                   "0 = at init only")
    p.add_argument("--train-tokens", type=at_least(1), default=1024, help="batch size of those short runs")
    p.add_argument("--placements", type=measured.placements, default=PAPER_PLACEMENTS,
                   help="comma list of placements, or all: adds (f, g), each one's hidden-state "
                   "growth per layer at init in the model of (d, e) (default " + ",".join(PAPER_PLACEMENTS)
                   + ": not drawn; (a)-(e) keep their placements)")
    p.add_argument("--no-reuse", action="store_true", help="do not look for finished runs")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = measured.start(parse_args, argv)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] = {"scale": args.scale, "timing": {}}
    for name, part in (("lemmas", lemma_rows), ("ln_jacobian", jacobian_rows),
                       ("real_init", real_init_rows), ("kan", kan_rows), ("zoo", zoo_rows)):
        t = time.perf_counter()
        rows += part(args, meta)
        meta["timing"][f"{name}_s"] = round(time.perf_counter() - t, 1)
        print(f"theory: {name} done ({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    summary = summarise(rows)
    checks = lemma_checks(summary, args)
    return measured.finish("theory", args, FIELDS, rows, SUMMARY_FIELDS, summary, checks, meta,
                           lambda: plot(args, summary, checks, meta))


def _stat_rows(summary: dict, **common) -> list[dict[str, Any]]:
    out = []
    for (side, layer, point), stats in summary.items():
        for q in ("sq_norm_per_d", "mean_abs", "var"):
            out.append({**common, "side": side, "layer": layer, "point": point, "quantity": q,
                        "value": stats[q]})
    return out


# --- (a, b) the simplified setting --------------------------------------------------------------


def lemma_rows(args, meta) -> list[dict[str, Any]]:
    import torch

    from lnexp import probes

    rows = []
    for placement in LEMMA_PLACEMENTS:
        for seed in range(1, args.lemma_seeds + 1):
            layers = probes.simplified_layers(placement, args.lemma_d, args.lemma_layers, seed)
            g = torch.Generator().manual_seed(10_000 + seed)
            x = torch.randn(args.lemma_tokens, 8, args.lemma_d, generator=g)
            with probes.HiddenStats({"encoder": layers}, points=("input", "output", "pre_final_ln")) \
                    as hs:
                probes.run_layers(layers, x)
            stats = hs.summary()
            # layer l's output is the input of layer l+1: index the residual stream by layers done
            stream = {("encoder", 0, "stream"): stats[("encoder", 1, "input")]}
            stream.update({("encoder", k[1], "stream"): v for k, v in stats.items()
                           if k[2] == "output"})
            pre5 = {k: v for k, v in stats.items() if k[2] == "pre_final_ln"}
            rows += _stat_rows({**stream, **pre5}, setting="simplified", placement=placement,
                               residual_scale=1.0, state="init", seed=seed)
    meta["simplified"] = {"d": args.lemma_d, "layers": args.lemma_layers, "seeds": args.lemma_seeds,
                          "tokens": args.lemma_tokens * 8, "sequences": 8,
                          "setting": "one head, W_Q=W_K=0, Xavier-normal (var 1/d), zero biases, "
                          "FFN d->d->d ReLU, LN gain 1, x ~ N(0, I), no dropout"}
    return rows


# --- (c) LayerNorm's Jacobian -------------------------------------------------------------------


def jacobian_rows(args, meta) -> list[dict[str, Any]]:
    import torch

    from lnexp import probes

    d = args.lemma_d
    g = torch.Generator().manual_seed(7)
    rows = []
    cases = [(s, 0.0) for s in (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)] + \
        [(1.0, m) for m in (0.5, 1.0, 2.0, 5.0)]
    for i, (scale, offset) in enumerate(cases):
        z = torch.randn(d, generator=g, dtype=torch.float64)
        x = scale * (z - z.mean()) + offset * scale
        jac = probes.ln_jacobian_spectral_norm(x)
        centred = float((x - x.mean()).norm())
        values = {"x_norm": float(x.norm()), "centred_norm": centred, "jac_spectral_norm": jac,
                  "sqrt_d_over_x_norm": math.sqrt(d) / float(x.norm()),
                  "sqrt_d_over_centred_norm": math.sqrt(d) / centred,
                  "mean_offset": offset}
        for q, v in values.items():
            rows.append({"setting": "ln_jacobian", "placement": "", "residual_scale": "",
                         "state": "centred" if offset == 0 else "offset", "seed": i, "side": "",
                         "layer": i, "point": "", "quantity": q, "value": v})
    meta["ln_jacobian"] = {"d": d, "eps": 1e-5, "cases": len(cases),
                           "x": "centred Gaussian x scale (0.1..100), and plus a constant offset"}
    return rows


# --- the real model at init ---------------------------------------------------------------------


def _forward_stats(model, sample, points) -> dict:
    import torch

    from lnexp import probes

    model.eval()
    with probes.HiddenStats(model, points=points) as hs, torch.no_grad():
        net = sample["net_input"]
        model(net["src_tokens"], net["src_lengths"], net["prev_output_tokens"])
    return hs.summary()


def _stream(stats: dict) -> dict:
    """Residual stream indexed by layers done: 0 = input of layer 1, l = output of layer l."""
    out = {}
    for (side, layer, point), v in stats.items():
        if point == "input" and layer == 1:
            out[(side, 0, "stream")] = v
        elif point == "output":
            out[(side, layer, "stream")] = v
        elif point == "pre_final_ln":
            out[(side, layer, point)] = v
    return out


def real_init_rows(args, meta) -> list[dict[str, Any]]:
    from lnexp import fairseq_adapter as fa
    from lnexp import probes

    cfg = probes.compose_config(["placement=post_ln", f"scale={args.scale}", *args.override])
    base = probes.fairseq_config(cfg, arch=cfg.dataset.paper_arch,
                                 **measured.model_dims(args.d_model))
    task = fa.setup_task(base, ("valid",))
    sample = probes.sample_batch(task, "valid", args.max_tokens, 0)
    rows = []
    for placement in LEMMA_PLACEMENTS:
        fcfg = probes.with_model(base, placement=placement)
        for seed in range(1, args.real_seeds + 1):
            model = fa.build_model(fcfg, task, seed)
            stats = _forward_stats(model, sample, ("input", "output", "pre_final_ln"))
            rows += _stat_rows(_stream(stats), setting="real_init", placement=placement,
                               residual_scale=1.0, state="init", seed=seed)
    meta["real_init"] = {"arch": cfg.dataset.paper_arch, "d": int(base.model.encoder_embed_dim),
                         "seeds": args.real_seeds, "dataset": cfg.dataset.name,
                         "batch": f"valid, {int(sample['nsentences'])} sentences, "
                         f"{int(sample['ntokens'])} target tokens", "init": "fairseq's default"}
    return rows


# --- (d, e) Kan et al.: hidden states at init and after training ------------------------------


def _label(placement: str, dt: float) -> str:
    from lnexp.figures.style import LABELS

    return LABELS[placement] + ("" if dt == 1.0 else f", Δt={dt:g}")


def _finished_runs(root: Path, cfg) -> dict[tuple[str, float], list[tuple[int, Path]]]:
    """Finished (not diverged) runs under ``root`` with the same model size, depth, norm and data."""
    from types import SimpleNamespace

    from lnexp.rundir import RUN, read_json, run_paths
    from lnexp.scheme import Norm, placement_of, placement_of_run

    found: dict[tuple[str, float], list[tuple[int, Path]]] = defaultdict(list)
    if not root.is_dir():
        return found
    for run_json in root.glob(f"**/{RUN}"):
        run = read_json(run_json, {}) or {}
        status = read_json(run_paths(run_json.parent)["status"], {}) or {}
        c = run.get("config") or {}
        ckpt = run_paths(run_json.parent)["last"]
        try:
            name = c["placement"]["name"]
            same = (c["scale"]["arch"] == cfg.scale.arch
                    and Norm.from_config(c["norm"]) == Norm.from_config(cfg.norm)
                    and c["depth"] == dict(cfg.depth) and c["dataset"] == dict(cfg.dataset)
                    # the placement's YAML as written (no embedding norm, no switch overridden)
                    and placement_of_run(c["placement"]) == placement_of(SimpleNamespace(placement=name)))
            key = (name, float(c["residual_scale"]))
        except (KeyError, TypeError, AttributeError, ValueError):
            continue
        if same and status.get("status") in ("done", "stopped") and ckpt.is_file():  # ran its length
            found[key].append((int(status.get("updates") or 0), run_json.parent))
    return found


def short_training(cfg, updates: int) -> dict:
    """``updates`` updates of fairseq's Trainer on the training set (no validation, nothing saved);
    returns the model's state dict."""
    import tempfile
    from pathlib import Path

    from lnexp import fairseq_adapter as fa
    from lnexp.train import settings
    from lnexp.train.session import Session

    with tempfile.TemporaryDirectory() as tmp:
        run = Session.build(cfg, Path(tmp), resolved=settings.resolve(cfg, "cpu"))
        fcfg, model, trainer, epoch_itr = run.fcfg, run.model, run.trainer, run.epoch_itr
        while trainer.get_num_updates() < updates:
            itr = fa.grouped(epoch_itr.next_epoch_itr(shuffle=True), fcfg)
            trainer.begin_epoch(epoch_itr.epoch)
            for samples in itr:
                if run.step(trainer, samples) is None:
                    raise FloatingPointError("short training run went non-finite")
                if trainer.get_num_updates() >= updates:
                    break
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def kan_rows(args, meta) -> list[dict[str, Any]]:
    from lnexp import fairseq_adapter as fa
    from lnexp import probes
    from lnexp.rundir import read_json, run_paths

    cfg = probes.compose_config(["placement=pre_ln", f"scale={args.scale}", *args.override])
    base = probes.fairseq_config(cfg, arch=cfg.scale.arch)
    task = fa.setup_task(base, ("valid",))
    sample = probes.sample_batch(task, "valid", args.max_tokens, 0)
    runs: dict[tuple[str, float], Path] = {}
    source = "none (at init only)"
    if not args.no_reuse:
        found = _finished_runs(args.runs_root, cfg)
        common = set.intersection(*({u for u, _ in found.get(k, [])} for k in KAN_CONFIGS))
        if common and max(common) > 0:
            u = max(common)
            runs = {k: next(p for n, p in sorted(found[k]) if n == u) for k in KAN_CONFIGS}
            source = f"finished runs under {args.runs_root} ({count(u, 'update')})"
    trained: dict[tuple[str, float], dict] = {}
    if not runs and args.train_updates > 0:
        for placement, dt in KAN_CONFIGS:
            overrides = [f"placement={placement}", f"residual_scale={dt}", f"scale={args.scale}",
                         "warmup=0", "seed=1", f"scale.max_tokens={args.train_tokens}",
                         *args.override]
            trained[(placement, dt)] = short_training(probes.compose_config(overrides),
                                                      args.train_updates)
        source = (f"short runs here: {count(args.train_updates, 'update')} of <= {args.train_tokens} tokens, "
                  f"Adam lr {cfg.lr:g} (no warm-up), dropout {cfg.scale.dropout:g}, seed 1")
    rows = []
    for placement, dt in KAN_CONFIGS:
        fcfg = probes.with_model(base, placement=placement, residual_scale=dt)
        model = fa.build_model(fcfg, task, 1)
        common = dict(setting="kan", placement=placement, residual_scale=dt, seed=1)
        rows += _stat_rows(_stream(_forward_stats(model, sample, ("input", "output"))),
                           state="init", **common)
        run = runs.get((placement, dt))
        weights = trained.get((placement, dt))
        if run is not None:
            weights = fa.load_checkpoint_state(run_paths(run)["last"])["model"]
        if weights is not None:
            model.load_state_dict(weights)
            rows += _stat_rows(_stream(_forward_stats(model, sample, ("input", "output"))),
                               state="trained", **common)
        del model
    meta["kan"] = {"arch": cfg.scale.arch, "after_training": source,
                   "runs": {_label(*k): {"dir": str(v), "updates": (read_json(
                       run_paths(v)["status"], {}) or {}).get("updates")} for k, v in runs.items()},
                   "batch": f"valid, {int(sample['nsentences'])} sentences",
                   "stats": "per layer output (residual stream), non-padding tokens, eval mode"}
    return rows


def zoo_rows(args, meta) -> list[dict[str, Any]]:
    """Kan et al.'s per-layer statistics at init for every ``--placements`` scheme (its own init,
    seed 1), in the model and on the batch of (d, e); none for the default placements."""
    from lnexp import fairseq_adapter as fa
    from lnexp import probes

    if tuple(args.placements) == PAPER_PLACEMENTS:
        return []
    cfg = probes.compose_config(["placement=pre_ln", f"scale={args.scale}", *args.override])
    base = probes.fairseq_config(cfg, arch=cfg.scale.arch)
    task = fa.setup_task(base, ("valid",))
    sample = probes.sample_batch(task, "valid", args.max_tokens, 0)
    rows = []
    for placement in args.placements:
        model = fa.build_model(probes.with_model(base, placement=placement), task, 1)
        rows += _stat_rows(_stream(_forward_stats(model, sample, ("input", "output"))), setting="zoo_init",
                           placement=placement, residual_scale=1.0, state="init", seed=1)
        del model
    enc = {(r["placement"], r["layer"]): float(r["value"]) for r in rows
           if r["side"] == "encoder" and r["quantity"] == "mean_abs" and r["point"] == "stream"}
    last = max(la for _, la in enc)
    meta["zoo"] = {"arch": cfg.scale.arch, "placements": list(args.placements), "seed": 1,
                   "encoder_mean_abs_last_over_input": {p: enc[(p, last)] / enc[(p, 0)]
                                                        for p in args.placements},
                   "batch": f"valid, {int(sample['nsentences'])} sentences"}
    return rows


# --- summary, checks, output --------------------------------------------------------------------


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return measured.summarise(rows, SUMMARY_FIELDS[:8], "value")


def _series(summary, setting, placement, point, quantity="sq_norm_per_d", side="encoder",
            state="init", dt=1.0) -> tuple[list[int], list[float], list[float]]:
    pts = sorted((r["layer"], r["mean"], r["std"]) for r in summary
                 if r["setting"] == setting and r["placement"] == placement and r["point"] == point
                 and r["quantity"] == quantity and r["side"] == side and r["state"] == state
                 and float(r["residual_scale"]) == dt)
    return [p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts]


def lemma_checks(summary, args) -> list[Check]:
    checks: list[Check] = []
    layers, post, _ = _series(summary, "simplified", "post_ln", "pre_final_ln")
    dev = max(abs(v - 1.5) for v in post)
    checks.append(Check.of_value(
        "post_ln_pre_last_ln_sq_norm",
        f"simplified setting: Post-LN E‖x^(post,5)‖²/d within 3/2 ± {POST_TOL} at every "
        "layer (value: largest deviation)", dev, dev <= POST_TOL, threshold=POST_TOL,
        values=dict(zip(map(str, layers), post, strict=True))))
    layers, pre, _ = _series(summary, "simplified", "pre_ln", "stream")
    inside = {str(la): 1 + la / 2 <= v <= 1 + 1.5 * la for la, v in zip(layers, pre, strict=True)
              if la > 0}  # l = 0 is the N(0, I) input itself
    checks.append(Check.of_value(
        "pre_ln_sq_norm_within_bounds",
        "simplified setting: Pre-LN 1 + l/2 <= E‖x_l‖²/d <= 1 + 3l/2 after l layers",
        f"{sum(inside.values())}/{len(inside)} layers", all(inside.values()),
        values=dict(zip(map(str, layers), pre, strict=True)), inside=inside))
    ratios = [r for r in _jac(summary) if r["state"] == "centred"]
    jdev = max(abs(r["jac_spectral_norm"] / r["sqrt_d_over_x_norm"] - 1) for r in ratios)
    checks.append(Check.of_value(
        "ln_jacobian_equals_sqrt_d_over_norm",
        "‖J_LN(x)‖₂ = √d/‖x‖₂ for centred x (value: largest relative deviation); "
        "√d/‖x − mean‖ in general", jdev, jdev <= JAC_TOL, threshold=JAC_TOL,
        offset_ratios=[r["jac_spectral_norm"] / r["sqrt_d_over_x_norm"] for r in _jac(summary)
                       if r["state"] == "offset"],
        offset_ratios_vs_centred_norm=[r["jac_spectral_norm"] / r["sqrt_d_over_centred_norm"]
                                       for r in _jac(summary) if r["state"] == "offset"]))
    for side in ("encoder", "decoder"):
        la, post, _ = _series(summary, "real_init", "post_ln", "pre_final_ln", side=side)
        checks.append(Check.of_value(
            f"real_init_post_ln_{side}",
            f"real model at init ({side}): Post-LN E‖x^(post,5)‖²/d, largest deviation "
            "from 3/2 (reported)", max(abs(v - 1.5) for v in post) if post else math.nan, None,
            values=dict(zip(map(str, la), post, strict=True))))
        la, pre, _ = _series(summary, "real_init", "pre_ln", "stream", side=side)
        if pre:
            c0 = pre[0]
            inside = {str(la_): c0 + la_ / 2 <= v <= c0 + 1.5 * la_ for la_, v in zip(la, pre, strict=True)
                      if la_ > 0}
            checks.append(Check.of_value(
                f"real_init_pre_ln_{side}",
                f"real model at init ({side}): Pre-LN E‖x_l‖²/d inside c0 + l/2 .. c0 + 3l/2 "
                "(c0 = its input; reported)", f"{sum(inside.values())}/{len(inside)} layers", None,
                values=dict(zip(map(str, la), pre, strict=True)), inside=inside))
    for placement, dt in KAN_CONFIGS:
        for state in ("init", "trained"):
            la, m, _ = _series(summary, "kan", placement, "stream", "mean_abs", state=state, dt=dt)
            _, v, _ = _series(summary, "kan", placement, "stream", "var", state=state, dt=dt)
            if m:
                checks.append(Check.of_value(
                    f"kan_{placement}_dt{dt:g}_{state}_encoder",
                    f"{_label(placement, dt)} ({state}): encoder mean |x|, last layer output "
                    "/ input (reported)", m[-1] / m[0], None,
                    mean_abs=dict(zip(map(str, la), m, strict=True)),
                    var=dict(zip(map(str, la), v, strict=True))))
    return checks


def _jac(summary) -> list[dict[str, Any]]:
    """One dict per Jacobian case (the case number is stored as its 'layer')."""
    by: dict[tuple, dict[str, Any]] = defaultdict(dict)
    for r in summary:
        if r["setting"] == "ln_jacobian":
            by[(r["state"], r["layer"])].update(state=r["state"], **{r["quantity"]: r["mean"]})
    return [by[k] for k in sorted(by, key=lambda k: k[1])]


def plot(args, summary, checks: list[Check], meta) -> list[Path]:
    from lnexp.figures import style

    plt = style.setup()
    zoo = meta.get("zoo")
    fig, axes = plt.subplots(3 if zoo else 2, 3, figsize=(14, 8 + (2 + 0.3 * len(zoo["placements"])
                                                                   if zoo else 0)))
    sim, real = meta["simplified"], meta["real_init"]

    ax = axes[0, 0]
    la, m, sd = _series(summary, "simplified", "post_ln", "pre_final_ln")
    ax.axhspan(1.5 - POST_TOL, 1.5 + POST_TOL, color="0.9", label=f"3/2 ± {POST_TOL}")
    ax.axhline(1.5, color="k", lw=0.8, ls="--", label="theory 3/2")
    ax.errorbar(la, m, yerr=sd, marker="o", ms=4, capsize=2, color=style.COLORS["post_ln"],
                label=f"Post-LN, simplified (d={sim['d']})")
    for side, ls in (("encoder", ":"), ("decoder", "-.")):
        la, m, _ = _series(summary, "real_init", "post_ln", "pre_final_ln", side=side)
        ax.plot(la, m, ls=ls, marker=".", color=style.COLORS["post_ln"], alpha=0.7,
                label=f"Post-LN, real model at init ({side})")
    ax.set_xlabel("layer l")
    ax.set_ylabel("E‖x^(post,5)_l‖² / d")
    ax.set_title("(a) Post-LN before the last LN of each layer")
    ax.set_ylim(0, max(2.2, ax.get_ylim()[1]))
    ax.legend()

    ax = axes[0, 1]
    la, m, sd = _series(summary, "simplified", "pre_ln", "stream")
    ax.fill_between(la, [1 + x / 2 for x in la], [1 + 1.5 * x for x in la], color="0.9",
                    label="theory: 1 + l/2 .. 1 + 3l/2")
    ax.errorbar(la, m, yerr=sd, marker="o", ms=4, capsize=2, color=style.COLORS["pre_ln"],
                label=f"Pre-LN, simplified (d={sim['d']})")
    la, m, sd = _series(summary, "simplified", "peri_ln", "stream")
    ax.errorbar(la, m, yerr=sd, marker="s", ms=3, capsize=2, color=style.COLORS["peri_ln"],
                label="Peri-LN, simplified")
    for p in ("pre_ln", "peri_ln"):
        la, m, _ = _series(summary, "real_init", p, "stream", side="encoder")
        ax.plot(la, m, ls=":", marker=".", color=style.COLORS[p], alpha=0.8,
                label=f"{style.LABELS[p]}, real model at init (encoder)")
    ax.set_xlabel("layers done l (0 = input)")
    ax.set_ylabel("E‖x_l‖² / d")
    ax.set_title("(b) Pre-LN residual stream")
    ax.legend()

    ax = axes[0, 2]
    jac = _jac(summary)
    for state, marker, label in (("centred", "o", "centred x"), ("offset", "^", "x + constant")):
        pts = [r for r in jac if r["state"] == state]
        ax.loglog([r["sqrt_d_over_x_norm"] for r in pts], [r["jac_spectral_norm"] for r in pts],
                  marker, ms=6, ls="none", mfc="none" if state == "offset" else None,
                  color=style.COLORS["pre_ln"], label=label)
    lo = min(r["sqrt_d_over_x_norm"] for r in jac) / 2
    hi = max(max(r["sqrt_d_over_x_norm"], r["jac_spectral_norm"]) for r in jac) * 2
    ax.loglog([lo, hi], [lo, hi], "k--", lw=0.8, label="y = x")
    ax.set_xlabel("√d / ‖x‖₂")
    ax.set_ylabel("‖J_LN(x)‖₂ (exact)")
    ax.set_title(f"(c) LayerNorm Jacobian, d={meta['ln_jacobian']['d']}")
    ax.legend()

    kan = meta["kan"]
    n = max((r["layer"] for r in summary if r["setting"] == "kan"), default=6)
    for ax, quantity, tag, ylabel in ((axes[1, 0], "mean_abs", "(d)", "mean |x|"),
                                      (axes[1, 1], "var", "(e)", "variance of x")):
        for placement, dt in KAN_CONFIGS:
            color = style.COLORS[placement]
            marker = "o" if dt == 1.0 else "x"
            for state, ls in (("init", "--"), ("trained", "-")):
                xs, ys = [], []
                for i, side in enumerate(("encoder", "decoder")):
                    la, m, _ = _series(summary, "kan", placement, "stream", quantity, side=side,
                                       state=state, dt=dt)
                    xs += [i * (n + 2) + x for x in la]
                    ys += m
                    if i == 0 and xs:
                        xs.append(math.nan)
                        ys.append(math.nan)
                if xs:
                    ax.plot(xs, ys, ls=ls, marker=marker, ms=3, color=color,
                            alpha=1.0 if dt == 1.0 else 0.6,
                            label=f"{_label(placement, dt)} ({'init' if state == 'init' else 'trained'})")
        ax.set_xticks([i * (n + 2) + x for i in range(2) for x in range(0, n + 1)],
                      [f"{s}{x}" for s in ("E", "D") for x in range(0, n + 1)])
        ax.set_xlabel("residual stream after layer (E0/D0 = embeddings)")
        ax.set_ylabel(ylabel)
        if quantity == "var":
            ax.set_yscale("log")
        ax.set_title(f"{tag} {ylabel} per layer (Kan et al.), {kan['arch']}")
        ax.legend(fontsize=7)

    ax = axes[1, 2]
    ax.axis("off")
    lines = ["Checks (simplified setting):"]
    for c in checks:
        if c.holds is not None:
            lines.append(f"  {'PASS' if c.holds else 'FAIL'}  {c.id}: {measured.short(c.measured['value'])}")
    lines += ["", "Real model at init (reported):"]
    for c in checks:
        if c.id.startswith("real_init"):
            lines.append(f"  {c.id}: {measured.short(c.measured['value'])}")
    lines += ["", "Kan et al., encoder mean |x| last/input:"]
    for c in checks:
        if c.id.startswith("kan_"):
            lines.append(f"  {c.id[4:]}: {measured.short(c.measured['value'])}")
    ax.text(0, 1, "\n".join(lines), va="top", ha="left", family="monospace", fontsize=7.5,
            transform=ax.transAxes)
    if zoo:
        _zoo_panels(fig, axes[2], summary, zoo)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    note = (f"(a, b) simplified: {sim['setting']}; {count(sim['seeds'], 'init')} x {sim['tokens']} "
            f"tokens; real model: {real['arch']} (d={real['d']}), {real['init']} init, "
            f"{count(real['seeds'], 'seed')}, "
            f"{real['dataset']} {real['batch']}.\n(d, e) after training: {kan['after_training']}; "
            f"statistics on {kan['batch']}, eval mode. scale={meta['scale']}")
    return style.save(fig, args.out, args.name, note)


def _zoo_panels(fig, axes, summary, zoo) -> None:
    """(f, g): heatmaps, one row per scheme (label in its colour), of mean |x| and log10 variance of
    the residual stream after each layer at init."""
    import numpy as np

    from lnexp.figures import style

    places = zoo["placements"]
    n = max(r["layer"] for r in summary if r["setting"] == "zoo_init")
    cols = [(side, la) for side in ("encoder", "decoder") for la in range(0, n + 1)]
    for ax, quantity, tag, title, f in ((axes[0], "mean_abs", "(f)", "mean |x|", lambda a: a),
                                        (axes[1], "var", "(g)", "log10 variance of x", np.log10)):
        grid = np.full((len(places), len(cols)), np.nan)
        for i, p in enumerate(places):
            for side in ("encoder", "decoder"):
                la, m, _ = _series(summary, "zoo_init", p, "stream", quantity, side=side)
                for x, v in zip(la, m, strict=True):
                    grid[i, cols.index((side, x))] = v
        with np.errstate(divide="ignore", invalid="ignore"):
            im = ax.imshow(np.ma.masked_invalid(f(grid)), aspect="auto", cmap="viridis")
        fig.colorbar(im, ax=ax, fraction=0.04)
        ax.set_xticks(range(len(cols)), [f"{s[0].upper()}{x}" for s, x in cols], fontsize=7)
        ax.axvline(n + 0.5, color="white", lw=1)
        ax.set_yticks(range(len(places)), [style.LABELS[p] for p in places], fontsize=7)
        for tick, p in zip(ax.get_yticklabels(), places, strict=True):
            tick.set_color(style.COLORS[p])
        ax.grid(False)
        ax.set_xlabel("residual stream after layer (E0/D0 = embeddings)")
        ax.set_title(f"{tag} {title} per layer at init, {zoo['arch']}")
    axes[2].axis("off")
