"""`lnexp figure fig3` and `lnexp figure theory` end to end on tiny settings (real data, real models)."""

from __future__ import annotations

import csv
import json

import pytest

SMALL = ("--override", "dataset.vocab_size=600", "--override", "depth.encoder_layers=2",
         "--override", "depth.decoder_layers=2", "--override", "scale.max_tokens=512",
         "--override", "eval.subset=4")


@pytest.fixture(scope="module")
def cache(tiny_prepared_cache):
    """tiny_multi30k prepared once per session: these figures draw a few batches of it."""
    return tiny_prepared_cache


def _figure(argv, cache, monkeypatch) -> None:
    from lnexp.figures.cli import main

    monkeypatch.setenv("LNEXP_CACHE", str(cache))
    assert main(argv) == 0


def _outputs(out, name):
    for ext in ("csv", "png", "pdf"):
        assert (out / f"{name}.{ext}").stat().st_size > 0
    with open(out / f"{name}_summary.csv", newline="") as f:
        summary = list(csv.DictReader(f))
    with open(out / f"{name}.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return rows, summary, json.loads((out / f"{name}_checks.json").read_text())


def test_fig3_end_to_end(tiny_multi30k, cache, tmp_path, monkeypatch):
    out, runs = tmp_path / "figures", tmp_path / "runs"
    _figure(["fig3", "--seeds", "2", "--depths", "2,3", "--d-model", "32", "--max-tokens", "300",
             "--warmup-updates", "2", "--out", str(out), "--runs-root", str(runs),
             "--override", f"dataset.dir={tiny_multi30k}", *SMALL], cache, monkeypatch)
    rows, summary, checks = _outputs(out, "fig3")
    at_init = [r for r in rows if r["state"] == "init" and r["d_model"] == "32"]
    # per seed and placement: every layer of the 2-2 model (2 stacks x 2 layers x W1/W2) + the
    # last decoder layer's W1/W2 of the 3-3 model
    assert len(at_init) == 2 * 3 * (8 + 2)
    assert {r["placement"] for r in at_init} == {"post_ln", "pre_ln", "peri_ln"}
    assert all(float(r["grad_norm"]) > 0 and int(r["batch_tokens"]) <= 300 for r in rows)
    warm = [r for r in rows if r["series"].startswith("post_ln_after_warmup")]
    assert len(warm) == 2 * 8 and {r["d_model"] for r in warm} == {"128"}
    # the same seed draws the same batch for every placement: same batch size
    by_seed = {(r["seed"], r["batch_tokens"]) for r in rows}
    assert len({s for s, _ in by_seed}) == len(by_seed) == 2
    names = {c["id"] for c in checks["checks"]}
    assert {"post_ln_last_w2_flat_across_depth", "pre_ln_last_w2_falls_with_depth",
            "post_ln_w2_growth_toward_output", "pre_ln_w2_growth_toward_output",
            "post_ln_after_warmup_far_below_init"} <= names
    for c in checks["checks"]:
        assert {"id", "claim", "paper", "ours", "measured", "pass", "required"} == set(c)
        assert "value" in c["measured"]
    assert checks["meta"]["after_warmup"]["updates"] == 2
    s = {(r["series"], r["depth"], r["side"], r["layer"], r["param"]): r for r in summary}
    assert s[("post_ln_init", "3", "decoder", "3", "W2")]["n"] == "2"

    # --replot redraws from the summary CSV and checks JSON alone, without measuring again
    (out / "fig3.png").unlink()
    _figure(["fig3", "--replot", "--out", str(out)], cache, monkeypatch)
    assert (out / "fig3.png").stat().st_size > 0

    # the finished warm-up run is what `lnexp figure theory` may reuse
    from lnexp.figures.theory import _finished_runs
    from lnexp.probes import compose_config

    cfg = compose_config(["placement=post_ln", f"dataset.dir={tiny_multi30k}",
                          *[o for o in SMALL[1::2]]])
    found = _finished_runs(runs, cfg)
    assert [n for n, _ in found[("post_ln", 1.0)]] == [2]


def test_theory_end_to_end(tiny_multi30k, cache, tmp_path, monkeypatch):
    out = tmp_path / "figures"
    _figure(["theory", "--lemma-d", "128", "--lemma-layers", "3", "--lemma-seeds", "3",
             "--lemma-tokens", "64", "--d-model", "32", "--real-seeds", "1", "--max-tokens", "300",
             "--train-updates", "1",
             "--train-tokens", "300", "--placements", "post_ln,rezero,t_fixup",
             "--out", str(out), "--runs-root", str(tmp_path / "runs"),
             "--override", f"dataset.dir={tiny_multi30k}", *SMALL], cache, monkeypatch)
    rows, summary, checks = _outputs(out, "theory")
    c = {c["id"]: c for c in checks["checks"]}
    # the lemmas hold in the simplified setting even at d=128
    assert c["post_ln_pre_last_ln_sq_norm"]["pass"] is True
    assert c["pre_ln_sq_norm_within_bounds"]["pass"] is True
    assert c["ln_jacobian_equals_sqrt_d_over_norm"]["pass"] is True
    settings = {r["setting"] for r in rows}
    assert settings == {"simplified", "ln_jacobian", "real_init", "kan", "zoo_init"}
    # --placements: each scheme's residual stream at init, every layer of both stacks
    zoo = {(r["placement"], r["side"], r["layer"]) for r in summary
           if r["setting"] == "zoo_init" and r["quantity"] == "mean_abs"}
    assert zoo == {(p, s, str(la)) for p in ("post_ln", "rezero", "t_fixup")
                   for s in ("encoder", "decoder") for la in range(3)}
    # ReZero's gates are 0 at init: every layer passes its input through unchanged
    assert checks["meta"]["zoo"]["encoder_mean_abs_last_over_input"]["rezero"] == pytest.approx(1.0)
    kan = {(r["placement"], float(r["residual_scale"]), r["state"]) for r in rows
           if r["setting"] == "kan"}
    assert kan == {(p, dt, s) for p, dt in (("pre_ln", 1.0), ("peri_ln", 1.0), ("pre_ln", 0.1))
                   for s in ("init", "trained")}
    assert "short runs here: 1 update of" in checks["meta"]["kan"]["after_training"]


def test_fig3_whole_zoo(tiny_multi30k, cache, tmp_path, monkeypatch):
    """--placements all: every scheme gets summary rows, the 2020 claims stay, the zoo is drawn."""
    from lnexp.errors import UserError
    from lnexp.names import PLACEMENTS

    out = tmp_path / "figures"
    with pytest.raises(UserError, match="unknown placement nope: choose from all or .*post_ln"):
        _figure(["fig3", "--placements", "pre_ln,nope", "--out", str(out)], cache, monkeypatch)
    _figure(["fig3", "--placements", "all", "--seeds", "1", "--depths", "2,3", "--d-model", "32",
             "--max-tokens", "300", "--warmup-updates", "0", "--out", str(out),
             "--override", f"dataset.dir={tiny_multi30k}", *SMALL], cache, monkeypatch)
    _, summary, checks = _outputs(out, "fig3")
    for p in PLACEMENTS:
        mine = {(r["depth"], r["side"], r["layer"], r["param"]) for r in summary if r["placement"] == p}
        assert {("3", "decoder", "3", "W2"), ("2", "encoder", "1", "W1")} <= mine, p
        means = [float(r["mean"]) for r in summary if r["placement"] == p]
        # ReZero's branches are gated by alpha = 0 at init: its FFN weights get exactly no gradient
        assert all(m == 0 for m in means) if p.startswith("rezero") else all(m > 0 for m in means), p
    assert "post_ln_last_w2_flat_across_depth" in {c["id"] for c in checks["checks"]}
    assert set(checks["meta"]["last_layer_across_depth"]) == set(PLACEMENTS)
