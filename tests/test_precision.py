"""Mixed precision as fairseq does it, on CPU with fairseq's real Trainer and FP16Optimizer:
an fp16 overflow skips the update and lowers the loss scale, fairseq gives up only at
min_loss_scale; track_norms reads the fp32 gradients the optimizer steps with (bf16 = fp32)."""

from __future__ import annotations

import csv
import math

import pytest
import torch

TINY = ["dataset.vocab_size=600", "depth.encoder_layers=2", "depth.decoder_layers=2",
        "scale.max_tokens=400", "scale.dropout=0", "device=cpu", "threads=1"]


def build(small_multi30k, tmp_path, monkeypatch, precision: str, **extra):
    """lnexp's training objects (the adapter calls of lnexp.train.loop) in ``precision``.

    lnexp refuses bf16/fp16 on CPU (slow, no use); here the fairseq flags are set directly.
    fp16 keeps one fp32 master tensor per parameter (fairseq's flat master copy asks CUDA for its
    device); the flat layout is read the same way by fairseq_adapter.stepped_grads.
    """
    from lnexp import fairseq_adapter as fa
    from lnexp.probes import compose_config as compose
    from lnexp.train import settings

    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    cfg = compose([f"dataset.dir={small_multi30k}", *TINY])
    fcfg = settings.fairseq_config(
        cfg, "cpu", 1, save_dir=str(tmp_path / "ckpt"), no_progress_bar=True,
        disable_validation=True, bf16=precision == "bf16", fp16=precision == "fp16",
        fp16_no_flatten_grads=precision == "fp16", **extra).config
    task, model, _, trainer = fa.build_trainer(fcfg)
    _, epoch_itr, _ = fa.epoch_iterator(fcfg, trainer, None)
    batches = list(fa.grouped(epoch_itr.next_epoch_itr(shuffle=False), fcfg))
    trainer.begin_epoch(1)
    return model, trainer, batches


@pytest.fixture
def cpu_overflow_branch(monkeypatch):
    """fairseq's overflow branch ends with ``torch.tensor(0.0).cuda()`` (a GPU-only line); on a
    CPU-only torch let ``.cuda()`` keep the tensor where it is. Nothing else is replaced."""
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)


def inf_grad(param):
    return param.register_hook(lambda g: torch.full_like(g, math.inf))


def test_fp16_overflow_skips_the_update_and_lowers_the_scale(small_multi30k, tmp_path, monkeypatch,
                                                             cpu_overflow_branch):
    from lnexp import fairseq_adapter as fa

    model, trainer, batches = build(small_multi30k, tmp_path, monkeypatch, "fp16")
    first = fa.train_step(trainer, batches[0])
    assert trainer.get_num_updates() == 1 and math.isfinite(first["loss"])
    scale = first["loss_scale"]
    assert scale == 128.0  # fairseq's --fp16-init-scale
    hook = inf_grad(model.encoder.layers[0].fc1.weight)
    skipped = fa.train_step(trainer, batches[1])
    hook.remove()
    assert skipped == {"overflow": True, "loss_scale": scale / 2}
    assert trainer.get_num_updates() == 1  # no update, as stock fairseq
    after = fa.train_step(trainer, batches[2])
    assert trainer.get_num_updates() == 2
    assert math.isfinite(after["loss"]) and after["loss_scale"] == scale / 2


def test_fp16_gives_up_at_min_loss_scale(small_multi30k, tmp_path, monkeypatch,
                                         cpu_overflow_branch):
    from lnexp import fairseq_adapter as fa

    model, trainer, batches = build(small_multi30k, tmp_path, monkeypatch, "fp16",
                                    fp16_init_scale=4, min_loss_scale=0.5)
    inf_grad(model.encoder.layers[0].fc1.weight)
    steps = [fa.train_step(trainer, batches[i]) for i in range(3)]
    # 4 -> 2 -> 1: skipped; the third overflow would take it to --min-loss-scale: fairseq gives up
    assert steps[:2] == [{"overflow": True, "loss_scale": 2.0}, {"overflow": True, "loss_scale": 1.0}]
    assert steps[2] is None  # FloatingPointError: lnexp marks the run diverged here
    assert trainer.get_num_updates() == 0


def track(model, trainer, batch, path):
    from lnexp import fairseq_adapter as fa
    from lnexp.train.norms import NormTracker

    tracker = NormTracker(model, path, every=1, grad_of=fa.stepped_grads(trainer))
    step = fa.train_step(trainer, batch)
    tracker.after_update(1)
    tracker.close()
    with open(path) as f:
        rows = {(r["side"], r["layer"]): r for r in csv.DictReader(f)}
    return step, rows


def test_bf16_tracks_the_same_gradient_norms_as_fp32(small_multi30k, tmp_path, monkeypatch):
    from lnexp.train.norms import ffn_grad_norms

    norms = {}
    for precision in ("fp32", "bf16"):
        model, trainer, batches = build(small_multi30k, tmp_path / precision, monkeypatch,
                                        precision)
        step, rows = track(model, trainer, batches[0], tmp_path / f"{precision}.csv")
        norms[precision] = (step["gnorm"], rows)
        if precision == "bf16":  # the model's own .grad: the raw sum over the batch's tokens
            raw = ffn_grad_norms(model)
    gnorm32, rows32 = norms["fp32"]
    gnorm16, rows16 = norms["bf16"]
    assert gnorm16 == pytest.approx(gnorm32, rel=1e-2)
    assert len(rows32) == len(rows16) == 4
    for key, r in rows32.items():
        for col in ("w1_grad_norm", "w2_grad_norm"):
            assert float(rows16[key][col]) == pytest.approx(float(r[col]), rel=1e-2), (key, col)
    side, layer = next(iter(rows32))
    assert raw[(side, int(layer), "W1")] > 50 * float(rows32[(side, layer)]["w1_grad_norm"])


def test_fp16_overflow_in_a_run_is_logged_and_the_run_goes_on(small_multi30k, tmp_path,
                                                              monkeypatch, cpu_overflow_branch):
    """lnexp's loop on fairseq's fp16 path: the overflowing update is skipped, counted in
    updates.csv with the lowered loss scale, and the run ends done (it used to end diverged)."""
    import json

    from lnexp import fairseq_adapter as fa
    from lnexp.probes import compose_config
    from lnexp.train import settings
    from lnexp.train.loop import train_run

    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    fp32_flags, build_trainer = settings.fairseq_flags, fa.build_trainer

    def fp16_flags(cfg, updates_per_epoch=None, device="cpu"):  # lnexp refuses fp16 on CPU
        return {**fp32_flags(cfg, updates_per_epoch, device), "fp16": True,
                "fp16_no_flatten_grads": True}

    def with_inf_at_third_backward(fcfg):
        task, model, criterion, trainer = build_trainer(fcfg)
        calls = []

        def hook(g):
            calls.append(1)
            return torch.full_like(g, math.inf) if len(calls) == 3 else g
        model.encoder.layers[0].fc1.weight.register_hook(hook)
        return task, model, criterion, trainer

    monkeypatch.setattr(settings, "fairseq_flags", fp16_flags)
    monkeypatch.setattr(fa, "build_trainer", with_inf_at_third_backward)
    cfg = compose_config([f"dataset.dir={small_multi30k}", *TINY, "max_epoch=1", "max_update=5",
                          "eval.subset=10", "divergence.plateau_epoch=99"])
    status = train_run(cfg, tmp_path / "run")
    assert status["status"] == "stopped" and status["updates"] == 5
    with open(tmp_path / "run" / "updates.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["update"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert [r["overflows"] for r in rows] == ["0", "0", "1", "1", "1"]
    assert [float(r["loss_scale"]) for r in rows] == [128, 128, 64, 64, 64]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["diverged"] is None
