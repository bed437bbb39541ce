"""What only a GPU can show (``pytest -m gpu``; skipped without CUDA; scripts/gpu_session.py runs
them on the GPU machine): bf16 and fp16 training steps through lnexp's trainer (the 2026 zoo's
nGPT and streams too), the GPU LayerNorm kernel against the formula within its precision, a
checkpoint trained on GPU evaluated on CPU."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# 2+2 layers of the mini model, small batches, a few updates: seconds on a GPU
TINY = ["dataset.vocab_size=600", "depth.encoder_layers=2", "depth.decoder_layers=2",
        "scale.max_tokens=1024", "eval.subset=8", "eval.beam=2", "divergence.plateau_epoch=99",
        "threads=1", "device=cuda", "schedule=constant", "warmup=0", "lr=5e-4"]


def train(tmp_path, small_multi30k, monkeypatch, *over: str):
    from lnexp import config
    from lnexp.train.loop import train_run

    monkeypatch.setenv("LNEXP_CACHE", str(tmp_path / "cache"))
    cfg = config.compose([f"dataset.dir={small_multi30k}", *TINY, *over])
    run_dir = tmp_path / "run"
    return run_dir, train_run(cfg, run_dir)


def updates_csv(run_dir) -> list[dict[str, str]]:
    import csv

    with open(run_dir / "updates.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_training_steps_on_the_gpu(tmp_path, small_multi30k, monkeypatch, precision):
    run_dir, status = train(tmp_path, small_multi30k, monkeypatch, f"precision={precision}", "max_update=8",
                            "log_interval=1")
    assert status["status"] == "stopped" and status["updates"] == 8, status
    rows = updates_csv(run_dir)
    losses = [float(r["loss"]) for r in rows]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    if precision == "fp16":  # fairseq's loss scaler is there, and skipped updates are counted
        assert rows[-1]["loss_scale"] != "" and int(rows[-1]["overflows"]) < 8
    run = json.loads((run_dir / "run.json").read_text())
    assert run["fairseq_flags"].get(precision) == "True"


@pytest.mark.parametrize("placement", ["ngpt", "hyper_connections", "mhc"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_2026_schemes_train_in_half_precision_on_the_gpu(tmp_path, small_multi30k, monkeypatch,
                                                          precision, placement):
    """nGPT's renormalisation under fairseq's flat fp32 master copy (a GPU-only layout), and the
    streams' weights, computed in fp32 at least, under bf16/fp16: finite losses, and nGPT's saved
    matrices on the sphere within half precision."""
    from lnexp import fairseq_adapter as fa
    from lnexp.model.sphere import READ, WRITE

    run_dir, status = train(tmp_path, small_multi30k, monkeypatch, f"placement={placement}",
                            f"precision={precision}", "max_update=6", "log_interval=1")
    assert status["status"] == "stopped" and status["updates"] == 6, status
    assert all(math.isfinite(float(r["loss"])) for r in updates_csv(run_dir))
    if placement != "ngpt":
        return
    state = fa.load_checkpoint_state(run_dir / "checkpoints" / "checkpoint_last.pt")["model"]
    checked = 0
    for key, w in state.items():
        leaf = key.rsplit(".", 2)[-2] if key.endswith(".weight") else ""
        if leaf in READ + WRITE or leaf == "embed_tokens":
            lengths = w.float().norm(dim=0 if leaf in WRITE else 1)
            assert (lengths[lengths > 0] - 1).abs().max() < 1e-2, key
            checked += 1
    assert checked > 20


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_gpu_norm_kernels_match_the_formula_within_their_precision(kind, dtype, tol):
    from lnexp.model.norms import make_norm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 37, 512, generator=g) * 3 + 1
    norm = make_norm(kind, 512)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(512, generator=g) + 0.5)
        if getattr(norm, "bias", None) is not None:
            norm.bias.copy_(torch.randn(512, generator=g))
    # the float64 reference of the input and weights the kernel sees: rounded to ``dtype`` (from
    # the float32 input, fp16's rounding alone moved the reference 2.2e-3 on the H200, 2026-12-04)
    def seen(t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(dtype).double()

    x64, w64 = seen(x), seen(norm.weight)
    if kind == "layernorm":
        mu, var = x64.mean(-1, keepdim=True), x64.var(-1, unbiased=False, keepdim=True)
        ref = (x64 - mu) / torch.sqrt(var + norm.eps) * w64 + seen(norm.bias)
    else:
        ref = w64 * x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    gpu = norm.to("cuda", dtype)
    with torch.no_grad():
        got = gpu(x.to("cuda", dtype)).double().cpu()
    err = ((got - ref).abs() / (ref.abs() + 1)).max().item()
    assert err < tol, f"{kind} in {dtype}: max relative error {err:.2e} (tolerance {tol:g})"


def test_checkpoint_trained_on_gpu_evaluates_on_cpu(tmp_path, small_multi30k, monkeypatch, capsys):
    from lnexp.cli import main

    run_dir, status = train(tmp_path, small_multi30k, monkeypatch, "precision=bf16", "max_update=6")
    assert status["status"] == "stopped"
    capsys.readouterr()
    rc = main(["evaluate", str(run_dir), "--device", "cpu", "--split", "valid", "--checkpoint", "last",
               "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    assert math.isfinite(float(res["bleu"])) and res["device"] == "cpu"


# --- issue 44's speed settings on the GPU (their CPU side: tests/test_speed.py) ----------------


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_autocast_trains_on_the_gpu(tmp_path, small_multi30k, monkeypatch, precision):
    """speed.half=autocast: fp32 weights, torch.autocast (bf16) or fairseq's --amp (fp16)."""
    run_dir, status = train(tmp_path, small_multi30k, monkeypatch, f"precision={precision}",
                            "speed.half=autocast", "speed.adam=fused", "max_update=8",
                            "log_interval=1")
    assert status["status"] == "stopped" and status["updates"] == 8, status
    losses = [float(r["loss"]) for r in updates_csv(run_dir)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    run = json.loads((run_dir / "run.json").read_text())
    assert run["precision"]["autocast"] and "autocast on the GPU" in run["precision"]["why"]
    flags = run["fairseq_flags"]
    assert flags["bf16"] == "False" and flags["fp16"] == "False"
    assert flags["amp"] == str(precision == "fp16")


def test_torch_adam_kernels_on_the_gpu_step_as_fairseqs_adam():
    """fused and foreach AdamW with fairseq's arithmetic against fairseq's Adam on CUDA tensors:
    20 steps, gradients near eps in size (where the two differ unless eps is rescaled: then the
    steps differ by a factor, far past the bound below). The kernels order their operations
    differently, so each step may round a parameter differently by an ulp: over 20 steps up to 20
    ulps of the largest parameter (the H200, 2026-12-04: foreach 4.8e-6 = 20 ulps at |p| in [2, 4),
    4e-4 of the movement, which the earlier bound of 1e-4 of the movement refused)."""
    from fairseq.optim.adam import Adam

    from lnexp.optim import torch_kernel_adam

    g = torch.Generator(device="cuda").manual_seed(0)
    start = [torch.randn(64, 32, device="cuda", generator=g) for _ in range(4)]

    def run(kind: str) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(p.clone()) for p in start]
        opt = Adam(params, lr=1e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)
        if kind != "fairseq":
            opt = torch_kernel_adam(opt, kind)
        gg = torch.Generator(device="cuda").manual_seed(1)
        for _ in range(20):
            for p in params:
                p.grad = torch.randn(p.shape, device="cuda", generator=gg) * 1e-7
            opt.step()
        return params

    ref = run("fairseq")
    ulp = torch.finfo(torch.float32).eps  # relative: eps * |p| >= one ulp of p
    for kind in ("foreach", "fused"):
        for p, q, s in zip(run(kind), ref, start, strict=True):
            rounding = 20 * ulp * float(q.abs().max())
            assert float((p - q).abs().max()) <= rounding, kind
            assert rounding < 1e-2 * float((q - s).abs().max())  # the bound is far below a step


def test_cuda_graphs_with_buckets_train_like_eager(tmp_path, small_multi30k, monkeypatch, caplog):
    """compile=true with speed.compile_mode=reduce-overhead and buckets: no fallback, and the first
    update's loss is eager's (no dropout: the same function of the same weights)."""
    import logging

    over = ("scale.dropout=0", "max_update=6", "log_interval=1")
    eager_dir, _ = train(tmp_path / "eager", small_multi30k, monkeypatch, *over)
    with caplog.at_level(logging.INFO, logger="lnexp.train"):
        run_dir, status = train(tmp_path / "graphs", small_multi30k, monkeypatch, *over,
                                "compile=true", "speed.compile_mode=reduce-overhead",
                                "speed.buckets=[8,16,24,32,48,64,128]")
    assert status["status"] == "stopped" and status["updates"] == 6, status
    assert "compile=true failed" not in caplog.text and "mode=reduce-overhead" in caplog.text
    graphs = [float(r["loss"]) for r in updates_csv(run_dir)]
    eager = [float(r["loss"]) for r in updates_csv(eager_dir)]
    assert all(math.isfinite(x) for x in graphs)
    assert graphs[0] == pytest.approx(eager[0], rel=1e-3)
