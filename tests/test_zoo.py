"""The normalisation zoo: each scheme's layers compute its paper's formula, written here again from
the layer's own parameters (float64), its init is the paper's, gradients reach the embeddings and
incremental decoding equals the full forward (so beam search works)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_args

ZOO = ("sandwich_ln", "olmo2", "qk_norm", "ln_scaling", "mix_ln", "rezero", "b2t", "t_fixup",
       "sub_ln", "normformer", "hybridnorm", "admin", "resi_dual")
LAYERS = 4  # Mix-LN: floor(0.25 * 4) = 1 Post-LN layer, then Pre-LN


def build(task, placement: str, seed: int = 0, **over):
    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.scheme import Placement, placement_of
    from lnexp.train.settings import SimpleNamespace

    # the path lnexp train takes: the YAML's structure as JSON in --placement-spec
    spec = placement_of(SimpleNamespace(placement=placement))
    assert Placement.from_json(spec.to_json()) == spec
    torch.manual_seed(seed)
    args = tiny_args("ln_transformer", placement=placement, placement_spec=spec.to_json(),
                     encoder_layers=LAYERS, decoder_layers=LAYERS, **over)
    return ARCH_MODEL_REGISTRY["ln_transformer"].build_model(args, task)


# --- the formulas, from the parameters alone -------------------------------------------------------

def norm(mod, x):
    """LayerNorm, RMSNorm or DyT, by the module's parameters."""
    if hasattr(mod, "alpha"):  # DyT (Zhu et al. 2025)
        return mod.weight * torch.tanh(mod.alpha * x) + mod.bias
    if isinstance(mod, torch.nn.RMSNorm):
        return mod.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + mod.eps)
    return F.layer_norm(x, x.shape[-1:], mod.weight, mod.bias, mod.eps)


def attention(attn, x, mem, causal: bool):
    """Multi-head attention of T x B x d states; per-head Q/K/V norms, an inner norm and head
    scales before the output projection where the module has them."""
    t, b, d = x.shape
    h = attn.num_heads

    def heads(y):
        return y.reshape(y.shape[0], b, h, d // h).permute(1, 2, 0, 3)  # B H T dh

    q, k, v = (heads(F.linear(z, p.weight, p.bias)) for z, p in
               ((x, attn.q_proj), (mem, attn.k_proj), (mem, attn.v_proj)))
    if hasattr(attn, "q_norm"):
        q, k = norm(attn.q_norm.norm, q), norm(attn.k_norm.norm, k)
    if hasattr(attn, "v_norm"):
        v = norm(attn.v_norm.norm, v)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
    if causal:
        scores = scores + torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
    heads_out = scores.softmax(-1) @ v  # B H T dh
    before = getattr(attn, "before_out_proj", None)
    if before is not None and before.head_scale is not None:  # NormFormer: gamma_h per head
        heads_out = heads_out * before.head_scale[None, :, None, None]
    out = heads_out.permute(2, 0, 1, 3).reshape(t, b, d)
    if before is not None and before.norm is not None:  # Sub-LN: LN before W_out
        out = norm(before.norm, out)
    return F.linear(out, attn.out_proj.weight, attn.out_proj.bias)


def sublayers(layer, mem=None):
    """(name, F) for each sub-layer of an encoder (mem None) or decoder layer."""
    subs = [("self_attn", lambda x: attention(layer.self_attn, x, x, causal=mem is not None))]
    if mem is not None:
        subs.append(("encoder_attn", lambda x: attention(layer.encoder_attn, x, mem, causal=False)))
    def ffn(x):
        h = F.relu(F.linear(x, layer.fc1.weight, layer.fc1.bias))
        if layer.final_inner_norm is not None:  # Sub-LN, NormFormer: LN before W_2
            h = norm(layer.final_inner_norm, h)
        return F.linear(h, layer.fc2.weight, layer.fc2.bias)

    subs.append(("final", ffn))
    return subs


def reference(placement: str, layer, depth: int, x, mem=None):
    """One layer (1-based index ``depth``) as its paper writes it."""
    def n(name):
        return lambda y: norm(getattr(layer, f"{name}_layer_norm"), y)

    def out(name):
        return lambda y: norm(getattr(layer, f"{name}_out_norm"), y)

    x0 = x
    subs = sublayers(layer, mem)
    for i, (name, f) in enumerate(subs):
        if placement in ("sandwich_ln",):      # x + LN(F(LN(x)))
            x = x + out(name)(f(n(name)(x)))
        elif placement == "olmo2":              # x + Norm(F(x))
            x = x + out(name)(f(x))
        elif placement == "qk_norm":            # Pre-LN, normalised q and k
            x = x + f(n(name)(x))
        elif placement == "ln_scaling":         # x + F(LN(x) / sqrt(l))
            x = x + f(n(name)(x) / math.sqrt(depth))
        elif placement == "mix_ln":             # Post-LN for l <= floor(0.25 L), Pre-LN after
            x = n(name)(x + f(x)) if depth <= math.floor(0.25 * LAYERS) else x + f(n(name)(x))
        elif placement == "rezero":             # x + alpha F(x)
            x = x + getattr(layer, f"{name}_gate") * f(x)
        elif placement == "b2t":                # Post-LN; the layer input joins the last sum
            x = n(name)(x + f(x) + (x0 if i == len(subs) - 1 else 0))
        elif placement == "t_fixup":            # no norm
            x = x + f(x)
        elif placement == "sub_ln":             # x + W_out LN(G(LN(x))), G's inner norm in f
            x = x + f(n(name)(x))
        elif placement == "normformer":         # attention: x + LN(Attn_hs(LN x)); FFN: Sub-LN's
            x = x + (f(n(name)(x)) if name == "final" else out(name)(f(n(name)(x))))
        elif placement == "hybridnorm":         # x + Attn(QKV-norm)(x); Norm(x + FFN(x))
            x = n(name)(x + f(x)) if name == "final" else x + f(x)
        elif placement == "admin":              # LN(w * x + F(x)), w per dimension
            x = n(name)(getattr(layer, f"{name}_gain").weight * x + f(x))
        elif placement == "resi_dual":          # the Post-LN stream (the dual one: test below)
            x = n(name)(x + f(x))
        else:
            raise AssertionError(placement)
    return x


@pytest.fixture(scope="module")
def zoo_models(tiny_task):
    models = {p: build(tiny_task, p).double().eval() for p in ZOO}
    models["dyt"] = build(tiny_task, "pre_ln", norm="dyt").double().eval()
    # Move every parameter that starts at a constant (norm gains and biases, ReZero's gates,
    # NormFormer's head scales) off it, so that the formulas test where each one sits.
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for model in models.values():
            for name, p in model.named_parameters():
                if "norm" in name or name.endswith(("_gate", "head_scale", ".alpha", "_gain.weight")):
                    p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype) + 0.1)
    return models


@pytest.mark.parametrize("placement", ZOO)
def test_layers_compute_the_papers_formula(zoo_models, placement):
    model = zoo_models[placement]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, 16, generator=g, dtype=torch.float64) * 2
    mem = torch.randn(6, 2, 16, generator=g, dtype=torch.float64)
    causal = model.decoder.buffered_future_mask(x)
    # fairseq's unfused attention (the decoder's, QK-norm's) takes its softmax in float32
    # (fairseq.utils.softmax): agreement to 1e-6 on O(1) outputs, not to float64's 1e-12
    for depth in (1, 2, LAYERS):
        enc, dec = model.encoder.layers[depth - 1], model.decoder.layers[depth - 1]
        torch.testing.assert_close(enc(x, None), reference(placement, enc, depth, x), rtol=1e-6, atol=1e-6)
        got = dec(x, mem, None, self_attn_mask=causal)[0]
        torch.testing.assert_close(got, reference(placement, dec, depth, x, mem), rtol=1e-6, atol=1e-6)


def _layer_inputs(model, src, prev):
    """The embeddings each stack's first layer receives (captured from a forward)."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [getattr(model, s).layers[0].register_forward_pre_hook(
        lambda m, args, s=s: seen.setdefault(s, args[0])) for s in ("encoder", "decoder")]
    model(src, torch.full((src.shape[0],), src.shape[1]), prev)
    for h in hooks:
        h.remove()
    return seen["encoder"], seen["decoder"]


def _unpadded_batch():
    g = torch.Generator().manual_seed(4)
    prev = torch.randint(4, 40, (2, 5), generator=g)
    prev[:, 0] = 2
    return torch.randint(4, 40, (2, 6), generator=g), prev


def test_resi_dual_joins_the_post_ln_stream_and_the_dual_stream(zoo_models):
    """Xie et al. 2023: x <- LN(x + F(x)), d <- d + F(x) from d = the embeddings; each stack's
    output x + LN(d); the decoder's cross-attention reads the encoder's joined output."""
    model = zoo_models["resi_dual"]
    src, prev = _unpadded_batch()
    x_enc, x_dec = _layer_inputs(model, src, prev)

    def stack(module, x, mem=None):
        d = x
        for layer in module.layers:
            for name, f in sublayers(layer, mem):
                y = f(x)
                d = d + y
                x = norm(getattr(layer, f"{name}_layer_norm"), x + y)
        return x + norm(module.layer_norm.norm, d)

    enc_ref = stack(model.encoder, x_enc)
    enc = model.encoder(src, torch.full((2,), src.shape[1]))
    torch.testing.assert_close(enc["encoder_out"][0], enc_ref, rtol=1e-6, atol=1e-6)
    dec = model.decoder.extract_features(prev, encoder_out=enc)[0]
    torch.testing.assert_close(dec, stack(model.decoder, x_dec, enc_ref).transpose(0, 1),
                               rtol=1e-6, atol=1e-6)


def test_admin_gains_are_the_papers_formula_of_the_profiled_variances(tiny_task):
    """Liu et al. 2020 (the authors' adaptive-profiling): per stack, in the order the sub-layers
    run, w_1 = 1, w_{i+1} = sqrt(Var[w_i x_i] + Var[F_i(x_i)]), x_{i+1} = LN(w_i x_i + F_i(x_i));
    recomputed here from the parameters, the encoder first (the decoder attends to its output)."""
    from lnexp.model.admin import profile_admin

    model = build(tiny_task, "admin", seed=5).double()
    assert all(p.eq(1).all() for n, p in model.named_parameters() if "_gain." in n)  # before
    src, prev = _unpadded_batch()
    x_enc, x_dec = _layer_inputs(model.eval(), src, prev)
    omega = profile_admin(model, {"src_tokens": src, "src_lengths": torch.full((2,), 6),
                                  "prev_output_tokens": prev}, seed=0)
    assert len(omega["encoder"]) == 2 * LAYERS and len(omega["decoder"]) == 3 * LAYERS

    def stack(module, x, mem=None):
        w, ws = 1.0, []
        for layer in module.layers:
            for name, f in sublayers(layer, mem):
                y = f(x)
                ws.append(w)
                x, w = norm(getattr(layer, f"{name}_layer_norm"), w * x + y), \
                    math.sqrt((w * x).var(unbiased=False).item() + y.var(unbiased=False).item())
        return x, ws

    enc_out, w_enc = stack(model.encoder, x_enc)
    _, w_dec = stack(model.decoder, x_dec, enc_out)
    assert w_enc[0] == w_dec[0] == 1.0 and all(w > 1 for w in w_enc[1:] + w_dec[1:])
    torch.testing.assert_close(omega["encoder"], w_enc, rtol=1e-9, atol=0)
    torch.testing.assert_close(omega["decoder"], w_dec, rtol=1e-6, atol=0)  # float32 softmax
    layer = model.decoder.layers[1]  # the model holds them: one vector per sub-layer, filled
    for i, name in enumerate(("self_attn", "encoder_attn", "final")):
        gain = getattr(layer, f"{name}_gain").weight
        assert gain.requires_grad and torch.equal(gain, torch.full_like(gain, omega["decoder"][3 + i]))


def test_dyt_replaces_every_norm(tiny_task, zoo_models):
    from lnexp.model.norms import DyT

    fresh = [m for m in build(tiny_task, "pre_ln", norm="dyt").modules() if isinstance(m, DyT)]
    assert fresh and all(m.alpha.item() == 0.5 for m in fresh)  # norm.alpha0 of configs/norm/dyt.yaml
    model = zoo_models["dyt"]
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    # 2 per encoder layer, 3 per decoder layer, the two final norms
    assert len(dyts) == LAYERS * 5 + 2
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    x = torch.randn(5, 2, 16, dtype=torch.float64)
    layer = model.encoder.layers[0]
    ref = x + sublayers(layer)[0][1](norm(layer.self_attn_layer_norm, x))
    ref = ref + sublayers(layer)[1][1](norm(layer.final_layer_norm, ref))
    torch.testing.assert_close(layer(x, None), ref, rtol=1e-10, atol=1e-10)


def test_norm_free_schemes_have_no_norms_and_rezero_starts_at_the_identity(tiny_task, zoo_models):
    for p in ("rezero", "t_fixup"):
        names = [n for n, m in zoo_models[p].named_modules()
                 if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm)]
        assert names == [], (p, names)
    gates = [p for n, p in build(tiny_task, "rezero").named_parameters() if n.endswith("_gate")]
    assert len(gates) == LAYERS * 5 and all(g.item() == 0 for g in gates)  # ReZero: alpha = 0 at init


N = M = LAYERS
GAINS = {  # (encoder, decoder, embeddings) factors on fairseq's draws, from each paper
    "t_fixup": (0.67 * N ** -0.25, (9 * M) ** -0.25, (9 * M) ** -0.25),  # Huang et al. 2020, Alg. 1
    "sub_ln": (math.sqrt(math.log(3 * M) * math.log(2 * N) / 3), math.sqrt(math.log(3 * M)), 1.0),
}


@pytest.mark.parametrize("placement", sorted(GAINS))
def test_init_scales_fairseqs_draws_by_the_papers_gain(tiny_task, placement):
    """fairseq's Xavier draws (the same as Post-LN's at one seed), then value, output and FFN weights
    times the paper's encoder/decoder factor, the (shared) embeddings times its embedding factor."""
    ours, base = build(tiny_task, placement, seed=3), build(tiny_task, "post_ln", seed=3)
    s_base = base.state_dict()
    enc, dec, emb = GAINS[placement]
    checked = 0
    for key, value in ours.state_dict().items():
        if key not in s_base:  # the scheme's own norms (Sub-LN's inner ones): gain 1, bias 0
            continue
        gain = 1.0
        if any(m in key for m in ("fc1.weight", "fc2.weight", "v_proj.weight", "out_proj.weight")):
            gain = enc if key.startswith("encoder.") else dec
        if "embed_tokens" in key or key == "decoder.output_projection.weight":
            gain = emb
        torch.testing.assert_close(value, s_base[key] * gain, rtol=1e-6, atol=0, msg=key)
        checked += gain != 1.0
    assert checked >= 4 * N + 6 * M  # fc1, fc2 and per attention v, out: every layer


def test_stock_fairseq_equivalent_only_for_the_yaml_as_written():
    """settings.stock_flags: a Pre-LN run is stock fairseq's only with pre_ln.yaml unchanged."""
    from lnexp.config import compose
    from lnexp.train.settings import fairseq_flags, stock_flags

    base = ["placement=pre_ln", "schedule=inverse_sqrt", "warmup=100"]
    assert stock_flags(fairseq_flags(compose(base), device="cpu")) is not None
    for extra in ("placement.qk_norm=true", "norm=rmsnorm", "norm.eps=1e-6"):
        assert stock_flags(fairseq_flags(compose([*base, extra]), device="cpu")) is None, extra


@pytest.mark.parametrize("override,needle", [
    ("norm.alpha0=abc", "norm.alpha0='abc' is not a number: e.g. norm.alpha0=0.5"),
    ("norm.alpha0=0", "norm.alpha0=0 must be a positive number"),
    ("placement.qk_norm=yes", "placement.qk_norm='yes' is not true or false"),
    ("placement.residual_weight=alpha", "must be a number or one of deepnorm_alpha"),
    ("placement.structure=ladder", "structure='ladder' is not one of residual, b2t, resi_dual"),
    ("placement.first_layers={fraction:2}", "first_layers takes fraction (0..1)"),
    ("placement.sublayers={mlp:{sum_norm:true}}", "sublayers takes attention and ffn"),
])
def test_bad_scheme_keys_are_one_line_config_errors(override, needle):
    from lnexp.config import compose
    from lnexp.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose(["norm=dyt", override])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_qk_norm_is_a_switch_of_any_placement(tiny_task):
    """placement=NAME placement.qk_norm=true: one norm per head-projection, nothing else changes."""
    from dataclasses import replace

    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.scheme import placement_of
    from lnexp.train.settings import SimpleNamespace

    spec = replace(placement_of(SimpleNamespace(placement="post_ln")), qk_norm=True)
    torch.manual_seed(0)
    qk = ARCH_MODEL_REGISTRY["ln_transformer"].build_model(
        tiny_args("ln_transformer", placement="post_ln", placement_spec=spec.to_json()), tiny_task)
    torch.manual_seed(0)
    plain = ARCH_MODEL_REGISTRY["ln_transformer"].build_model(
        tiny_args("ln_transformer", placement="post_ln"), tiny_task)
    extra = set(qk.state_dict()) - set(plain.state_dict())
    assert extra and all(".q_norm." in k or ".k_norm." in k for k in extra)
    assert len(extra) == 2 * 2 * (2 + 4)  # weight + bias, q + k, 2 encoder + 2x2 decoder attentions
    for k, v in plain.state_dict().items():
        assert torch.equal(v, qk.state_dict()[k]), k


@pytest.mark.parametrize("placement", ZOO)
def test_gradients_reach_embeddings_and_incremental_decoding_equals_full(zoo_models, tiny_batch,
                                                                         placement):
    model = zoo_models[placement]
    src, lengths, prev, target = tiny_batch
    model.zero_grad()
    logits, _ = model(src, lengths, prev)
    F.cross_entropy(logits.transpose(1, 2), target).backward()
    grad = model.encoder.embed_tokens.weight.grad
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    enc = model.encoder(src, lengths)
    full = model.decoder(prev, encoder_out=enc)[0]
    state: dict = {}
    steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
             for t in range(prev.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-6, atol=1e-6)  # float32 softmax


def test_zoo_run_trains_evaluates_translates_and_fairseq_generates(tmp_path, small_multi30k, capsys,
                                                                   monkeypatch):
    """One 2-update run of the zoo's most structured combination (Mix-LN's per-layer rule, QK-norm's
    hooks, ResiDual's dual stream and join, the DyT norm group) through lnexp train, evaluate,
    translate and stock fairseq-generate with lnexp's --user-dir plugin (the checkpoint carries the
    placement and norm as JSON)."""
    import io
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from lnexp import config
    from lnexp.cli import main
    from lnexp.train.loop import train_run
    from tests.conftest import REPO

    # the session corpus's shared cache (tests/test_precision.py): prepared once per session
    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    cfg = config.compose([
        "placement=mix_ln", "placement.qk_norm=true", "placement.structure=resi_dual",
        "norm=dyt", "norm.alpha0=0.7",
        f"dataset.dir={small_multi30k}", "dataset.vocab_size=600", "scale.max_tokens=512",
        "depth.encoder_layers=4", "depth.decoder_layers=4", "max_update=2", "eval.subset=4",
        "eval.beam=2", "divergence.plateau_epoch=99"])
    run = tmp_path / "run"
    assert train_run(cfg, run)["status"] == "stopped"
    flags = json.loads((run / "run.json").read_text())["fairseq_flags"]
    assert json.loads(flags["placement_spec"])["first_layers"]["fraction"] == 0.25
    assert json.loads(flags["placement_spec"])["structure"] == "resi_dual"
    assert json.loads(flags["norm_spec"]) == {"name": "dyt", "alpha0": 0.7, "eps": None}
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json", "--beam", "2"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["n"] > 0 and record["bleu"] >= 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("Ein Hund läuft .\n"))
    assert main(["translate", str(run), "--beam", "2"]) == 0
    assert capsys.readouterr().out.strip()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", record["fairseq_command"]],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == Path(record[record["fairseq_output"]]).read_text().splitlines()


def test_admin_run_profiles_once_records_omega_and_its_checkpoint_carries_it(
        tmp_path, small_multi30k, monkeypatch):
    """lnexp train placement=admin: the fresh run profiles (run.json's profiled_init), the
    checkpoint carries the gains (trained from those values; evaluate and translate load the
    model from it), and a resumed run does not profile again."""
    import json

    from lnexp import config
    from lnexp.fairseq_adapter import load_checkpoint_state
    from lnexp.train.loop import train_run

    monkeypatch.setenv("LNEXP_CACHE", str(small_multi30k.parent / "cache"))
    base = ["placement=admin", f"dataset.dir={small_multi30k}", "dataset.vocab_size=600",
            "scale.max_tokens=512", "depth.encoder_layers=2", "depth.decoder_layers=2",
            "eval.subset=4", "eval.beam=1", "divergence.plateau_epoch=99", "lr=1e-3"]
    run = tmp_path / "run"
    assert train_run(config.compose([*base, "max_update=2"]), run)["status"] == "stopped"
    profiled = json.loads((run / "run.json").read_text())["profiled_init"]
    assert profiled["profile"] == "admin"
    omega = profiled["omega"]
    assert len(omega["encoder"]) == 2 * 2 and len(omega["decoder"]) == 3 * 2
    assert omega["encoder"][0] == omega["decoder"][0] == 1.0 and min(omega["encoder"][1:]) > 1

    def gains(path):
        model = load_checkpoint_state(path)["model"]
        return {s: [model[f"{s}.layers.{i}.{n}_gain.weight"] for i in range(2) for n in names]
                for s, names in (("encoder", ("self_attn", "final")),
                                 ("decoder", ("self_attn", "encoder_attn", "final")))}

    after2 = gains(run / "checkpoints" / "checkpoint_last.pt")
    for stack, values in omega.items():  # each gain: its profiled value, moved by 2 Adam steps
        for w, trained in zip(values, after2[stack], strict=True):
            assert (trained - w).abs().max() <= 2 * 1e-3 + 1e-6 and not torch.equal(
                trained, torch.full_like(trained, 1.0))
    assert train_run(config.compose([*base, "max_update=3"]), run)["updates"] == 3  # resumed
    assert json.loads((run / "run.json").read_text())["profiled_init"] == profiled
    after3 = gains(run / "checkpoints" / "checkpoint_last.pt")
    assert any(not torch.equal(a, b) for s in after2 for a, b in zip(after2[s], after3[s], strict=True))


def test_probes_with_model_brings_the_placements_structure(tiny_task):
    """fig3/theory swap placements in a built config by name: the YAML's structure comes along."""
    from types import SimpleNamespace

    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.probes import with_model

    base = SimpleNamespace(model=tiny_args("ln_transformer", placement="post_ln",
                                           placement_spec=build_spec("post_ln")))
    model = ARCH_MODEL_REGISTRY["ln_transformer"].build_model(
        with_model(base, placement="peri_ln").model, tiny_task)
    assert model.encoder.layers[0].spec.output_norm and model.encoder.layer_norm is not None


def build_spec(placement: str) -> str:
    from lnexp.scheme import placement_of
    from lnexp.train.settings import SimpleNamespace

    return placement_of(SimpleNamespace(placement=placement)).to_json()


def test_a_formula_key_takes_a_number_or_a_formula_whichever_the_yaml_has():
    from lnexp.config import compose

    assert compose(["placement=pre_ln", "placement.residual_weight=deepnorm_alpha"]).placement \
        .residual_weight == "deepnorm_alpha"
    assert compose(["placement=deepnorm", "placement.residual_weight=1.0"]).placement.residual_weight == 1.0


@pytest.mark.parametrize("placement", __import__("lnexp.names", fromlist=["PLACEMENTS"]).PLACEMENTS)
def test_every_scheme_takes_an_update_at_the_papers_size(tiny_task, tiny_batch, placement):
    """The paper's IWSLT architecture (6+6 layers, d=512, FFN 1024, 4 heads; lnexp.names
    ARCH_SIZES), each scheme as lnexp train builds it (Admin profiled first): a finite loss,
    gradients at the embeddings, and one SGD update that lowers the loss on its batch."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.model.admin import PROFILERS
    from lnexp.names import arch_flags
    from lnexp.scheme import placement_of
    from lnexp.train.settings import SimpleNamespace

    spec = placement_of(SimpleNamespace(placement=placement))
    torch.manual_seed(0)
    args = tiny_args("ln_transformer_iwslt_de_en", placement=placement,
                     placement_spec=spec.to_json(), **arch_flags("ln_transformer_iwslt_de_en"))
    model = ARCH_MODEL_REGISTRY["ln_transformer"].build_model(args, tiny_task)
    assert model.encoder.layers[0].fc1.weight.shape == (1024, 512) and len(model.decoder.layers) == 6
    src, lengths, prev, target = tiny_batch
    if spec.init.profile:
        PROFILERS[spec.init.profile](model, {"src_tokens": src, "src_lengths": lengths,
                                             "prev_output_tokens": prev}, seed=0)

    def loss():
        return F.cross_entropy(model(src, lengths, prev)[0].transpose(1, 2), target)

    before = loss()
    before.backward()
    assert torch.isfinite(before) and model.encoder.embed_tokens.weight.grad.abs().sum() > 0
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.01 * p.grad  # (ReZero's and T-Fixup's first steps are small: a plain SGD step)
        assert loss() < before
