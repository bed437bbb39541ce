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
# fp16 on a CPU is emulated, several times slower than fp32: the fp16 tests, which check what
# fairseq's loss scaler does (not what a batch's size changes), take batches of half the tokens
FP16_BATCHES = ("scale.max_tokens=200",)


def build(small_multi30k, tmp_path, monkeypatch, precision: str, overrides: tuple[str, ...] = (),
          cfg=None, **extra):
    """lnexp's training objects (the adapter calls of lnexp.train.loop) in ``precision``; ``cfg``:
    the training config of ``overrides`` where the caller has composed it already.

    lnexp refuses bf16/fp16 on CPU (slow, no use); here the fairseq flags are set directly.
    fp16 keeps one fp32 master tensor per parameter (fairseq's flat master copy asks CUDA for its
    device); the flat layout is read the same way by fairseq_adapter.stepped_grads.
    """
    from lnexp import fairseq_adapter as fa
    from lnexp.probes import compose_config as compose
    from lnexp.train import settings

    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    if cfg is None:
        cfg = compose([f"dataset.dir={small_multi30k}", *TINY, *overrides])
    fcfg = settings.fairseq_setup(cfg, {
        **settings.resolve(cfg, "cpu").flags, "save_dir": str(tmp_path / "ckpt"),
        "no_progress_bar": True, "disable_validation": True, "bf16": precision == "bf16",
        "fp16": precision == "fp16", "fp16_no_flatten_grads": precision == "fp16", **extra}).config
    task, model, _, trainer = fa.build_trainer(fcfg)
    _, epoch_itr = fa.epoch_iterator(fcfg, trainer, None)
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

    model, trainer, batches = build(small_multi30k, tmp_path, monkeypatch, "fp16", FP16_BATCHES)
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

    model, trainer, batches = build(small_multi30k, tmp_path, monkeypatch, "fp16", FP16_BATCHES,
                                    fp16_init_scale=4, min_loss_scale=0.5)
    inf_grad(model.encoder.layers[0].fc1.weight)
    steps = [fa.train_step(trainer, batches[i]) for i in range(3)]
    # 4 -> 2 -> 1: skipped; the third overflow would take it to --min-loss-scale: fairseq gives up
    assert steps[:2] == [{"overflow": True, "loss_scale": 2.0}, {"overflow": True, "loss_scale": 1.0}]
    assert steps[2] is None  # FloatingPointError: lnexp marks the run diverged here
    assert trainer.get_num_updates() == 0


def track(model, trainer, batch, path):
    from lnexp import fairseq_adapter as fa
    from lnexp.train.norm_tracking import NormTracker

    tracker = NormTracker(model, path, every=1, grad_of=fa.stepped_grads(trainer))
    step = fa.train_step(trainer, batch)
    tracker.after_update(1)
    tracker.close()
    with open(path) as f:
        rows = {(r["side"], r["layer"]): r for r in csv.DictReader(f)}
    return step, rows


def test_bf16_tracks_the_same_gradient_norms_as_fp32(small_multi30k, tmp_path, monkeypatch):
    from lnexp.train.norm_tracking import ffn_grad_norms

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

    def fp16_flags(*decided):  # lnexp refuses fp16 on CPU
        return {**fp32_flags(*decided), "fp16": True, "fp16_no_flatten_grads": True}

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
    cfg = compose_config([f"dataset.dir={small_multi30k}", *TINY, *FP16_BATCHES, "max_epoch=1",
                          "max_update=5", "eval.subset=10", "divergence.plateau_epoch=99"])
    status = train_run(cfg, tmp_path / "run")
    assert status["status"] == "stopped" and status["updates"] == 5
    with open(tmp_path / "run" / "updates.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["update"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert [r["overflows"] for r in rows] == ["0", "0", "1", "1", "1"]
    assert [float(r["loss_scale"]) for r in rows] == [128, 128, 64, 64, 64]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["diverged"] is None


# --- bf16 autocast on CPU (lnexp.train.precision) ------------------------------------------------

INTEL_AMX = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\n"
             "flags\t\t: fpu sse avx512f avx512_bf16 amx_bf16 amx_tile\n")
AMD_NO_BF16 = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n"


def test_bf16_units_are_detected_from_cpuinfo():
    from lnexp.train.precision import cpu_bf16_flags

    assert cpu_bf16_flags(INTEL_AMX) == ("amx_bf16", "avx512_bf16")
    assert cpu_bf16_flags(AMD_NO_BF16) == ()
    assert cpu_bf16_flags("") == ()
    assert cpu_bf16_flags("Features\t: fp asimd bf16\n") == ()  # an ARM flag is not an x86 unit


def test_precision_auto_takes_bf16_only_with_units_and_a_passing_self_check(monkeypatch):
    from lnexp.errors import ConfigError
    from lnexp.train import precision as P

    fp32 = P.resolve("auto", "cpu", cpuinfo=AMD_NO_BF16)
    assert (fp32.name, fp32.autocast) == ("fp32", False) and "neither amx_bf16 nor" in fp32.why
    monkeypatch.setattr(P, "self_check", lambda: None)
    bf16 = P.resolve("auto", "cpu", cpuinfo=INTEL_AMX)
    assert (bf16.name, bf16.autocast, bf16.fairseq_bf16) == ("bf16", True, False)
    assert "amx_bf16, avx512_bf16" in bf16.why and "self-check passed" in bf16.why
    monkeypatch.setattr(P, "self_check", lambda: "oneDNN reports no bf16 support")
    failed = P.resolve("auto", "cpu", cpuinfo=INTEL_AMX)
    assert failed.name == "fp32" and "oneDNN reports no bf16 support" in failed.why
    with pytest.raises(ConfigError, match="self-check"):  # asked for explicitly: say so, stop
        P.resolve("bf16", "cpu", cpuinfo=INTEL_AMX)
    with pytest.raises(ConfigError, match="needs a GPU"):
        P.resolve("fp16", "cpu")
    assert P.resolve("auto", "cuda").name == "fp32"
    assert P.resolve("bf16", "cuda").fairseq_bf16
    assert P.resolve("fp32", "cpu", cpuinfo=INTEL_AMX) == P.Precision("fp32", False, "fp32")


def test_the_self_check_runs_here():
    """On this machine the real check either passes or names why (never raises)."""
    from lnexp.train.precision import measured_self_check

    result = measured_self_check()
    assert result is None or isinstance(result, str) and result


def test_the_environment_fakes_either_cpu_kind_in_subprocesses_too(tmp_path, monkeypatch):
    """LNEXP_CPUINFO (a file read instead of /proc/cpuinfo) and LNEXP_BF16_SELF_CHECK (pass or
    fail): what tests/conftest.py's --fake-cpu sets, so that a CPU-feature test runs as on an Intel
    Xeon or an AMD EPYC on either machine, in the lnexp processes it starts too."""
    import subprocess
    import sys

    from lnexp.errors import ConfigError
    from lnexp.runtime.host import cpu_model
    from lnexp.train import precision as P

    cpuinfo = tmp_path / "cpuinfo"
    monkeypatch.setenv("LNEXP_CPUINFO", str(cpuinfo))
    cpuinfo.write_text(INTEL_AMX)
    monkeypatch.setenv("LNEXP_BF16_SELF_CHECK", "pass")
    assert P.cpu_bf16_flags() == ("amx_bf16", "avx512_bf16") and cpu_model() == "Intel(R) Xeon(R)"
    assert P.self_check() is None and P.resolve("auto", "cpu").name == "bf16"
    monkeypatch.setenv("LNEXP_BF16_SELF_CHECK", "fail")  # units reported, oneDNN without bf16
    assert P.resolve("auto", "cpu").why == ("fp32 (precision=auto: the bf16 self-check failed: "
                                            "forced by LNEXP_BF16_SELF_CHECK=fail)")
    cpuinfo.write_text(AMD_NO_BF16)
    assert P.cpu_bf16_flags() == () and cpu_model() == "AMD EPYC"
    with pytest.raises(ConfigError, match=r"self-check on this CPU \(forced by LNEXP_BF16_SELF_"):
        P.resolve("bf16", "cpu")
    code = ("from lnexp.train.precision import resolve; from lnexp.runtime.host import cpu_model; "
            "print(cpu_model(), '|', resolve('auto', 'cpu').why)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("AMD EPYC | fp32 (precision=auto: the CPU reports neither "
                                  "amx_bf16 nor avx512_bf16)")
    cpuinfo.write_text(INTEL_AMX)
    monkeypatch.setenv("LNEXP_BF16_SELF_CHECK", "pass")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().startswith("Intel(R) Xeon(R) | bf16 autocast on CPU (precision=auto; "
                                         "amx_bf16, avx512_bf16; self-check passed)")


def test_autocast_keeps_attention_and_norms_fp32_and_matmuls_bf16():
    import torch.nn.functional as F

    from lnexp.train.precision import autocast_context

    x = torch.randn(2, 4, 6, 8, requires_grad=True)
    w = torch.randn(8, 8)
    with autocast_context():
        h = F.linear(x, w)
        att = F.scaled_dot_product_attention(h, h, h)
        ln = F.layer_norm(h, (8,))
        rms = torch.nn.RMSNorm(8)(h)
    assert h.dtype == torch.bfloat16
    assert att.dtype == ln.dtype == rms.dtype == torch.float32
    (att.sum() + ln.sum() + rms.sum()).backward()
    assert x.grad.dtype == torch.float32 and torch.isfinite(x.grad).all()


def losses(run_dir):
    with open(run_dir / "updates.csv") as f:
        return [float(r["loss"]) for r in csv.DictReader(f)]


def test_bf16_autocast_trains_like_fp32_and_says_so(small_multi30k, tmp_path, monkeypatch, caplog):
    """lnexp's loop with precision=bf16 on CPU: 2 updates whose losses equal fp32's to bf16's
    tolerance; weights and optimizer stay fp32; run.json and the first log line say which."""
    import json
    import logging

    from lnexp.probes import compose_config
    from lnexp.train import precision as P
    from lnexp.train.loop import train_run

    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    monkeypatch.setattr(P, "self_check", lambda: None)  # the path itself, on any CPU
    runs = {}
    for precision in ("fp32", "bf16"):
        cfg = compose_config([f"dataset.dir={small_multi30k}", *TINY, "max_epoch=1", "max_update=2",
                              "eval.subset=5", f"precision={precision}"])
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="lnexp.train"):
            status = train_run(cfg, tmp_path / precision)
        assert status["status"] == "stopped" and status["updates"] == 2
        said = [r.getMessage() for r in caplog.records if r.name == "lnexp.train"]
        first = next(m for m in said if not m.startswith("threads:"))  # the run's first line
        runs[precision] = (losses(tmp_path / precision), first,
                           json.loads((tmp_path / precision / "run.json").read_text()))
    (l32, first32, run32), (l16, first16, run16) = runs["fp32"], runs["bf16"]
    assert l16 == pytest.approx(l32, rel=1e-2) and l16 != l32  # bf16 really ran, and agrees
    assert first32 == "precision: fp32" and first16.startswith("precision: bf16 autocast on CPU")
    assert run16["precision"]["autocast"] is True and run32["precision"]["name"] == "fp32"
    assert run16["fairseq_flags"].get("bf16") == "False"  # fairseq's trainer and optimizer: fp32
    assert run16["stock_fairseq_train"] is None  # stock fairseq has no such path
    state = torch.load(tmp_path / "bf16" / "checkpoints" / "checkpoint_last.pt", weights_only=False)
    assert {v.dtype for v in state["model"].values() if v.is_floating_point()} == {torch.float32}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_ngpt_matrices_and_their_fp32_master_copies_stay_on_the_sphere(small_multi30k, tmp_path,
                                                                        monkeypatch, precision,
                                                                        cpu_overflow_branch):
    """nGPT renormalises after each update (fairseq_adapter.train_step -> the model's after_update):
    the model's matrices and, under FP16Optimizer, the fp32 masters that the next step starts from."""
    from lnexp import fairseq_adapter as fa
    from lnexp.model.sphere import sphere_weights

    model, trainer, batches = build(small_multi30k, tmp_path, monkeypatch, precision,
                                    overrides=("placement=ngpt",
                                               *(FP16_BATCHES if precision == "fp16" else ())))
    for batch in batches:  # fp16: an update the loss scaler skips is no update
        assert fa.train_step(trainer, batch) is not None
        if trainer.get_num_updates() == 2:
            break
    assert trainer.get_num_updates() == 2
    master = fa._masters(trainer)
    assert (master is None) == (precision == "fp32")
    checked = 0
    for p, dim in sphere_weights(model):
        for held, tol in [(p.float(), 1e-6 if precision == "fp32" else 1e-2),
                          *([(master(p), 1e-6)] if master is not None else [])]:
            lengths = held.norm(dim=dim)
            lengths = lengths[lengths > 0]  # the padding embedding stays zero
            assert (lengths - 1).abs().max() < tol
            checked += 1
    # one shared table, then q, k, v, out (twice in the decoder), fc1 and fc2 of each 2+2 layer
    assert checked == (1 + 2 * 6 + 2 * 10) * (2 if master is not None else 1)
