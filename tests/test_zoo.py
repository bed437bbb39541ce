"""The normalisation zoo: each scheme's layers compute its paper's formula, written here again from
the layer's own parameters (float64), its init is the paper's, gradients reach the embeddings and
incremental decoding equals the full forward (so beam search works)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_args

ZOO = ("sandwich_ln", "olmo2", "qk_norm", "qk_layernorm", "ln_scaling", "mix_ln", "rezero",
       "rezero_per_sublayer", "b2t", "b2t_noinit", "t_fixup", "sub_ln", "normformer", "hybridnorm",
       "admin", "resi_dual", "fixnorm", "hyper_connections", "mhc")
NORM_ZOO = ("dyt", "scalenorm", "derf", "seednorm")  # Pre-LN with each norm that is not LayerNorm's kin
OWN_TESTS = ("ngpt",)  # schemes whose formula tests live in a file of their own (tests/test_ngpt.py)
LAYERS = 4  # Mix-LN: floor(0.25 * 4) = 1 Post-LN layer, then Pre-LN


def build(task, placement: str, seed: int = 0, **over):
    from types import SimpleNamespace

    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.scheme import Placement, placement_of

    # the path lnexp train takes: the YAML's structure as JSON in --placement-spec
    spec = placement_of(SimpleNamespace(placement=placement))
    assert Placement.from_json(spec.to_json()) == spec
    torch.manual_seed(seed)
    args = tiny_args("ln_transformer", placement=placement, placement_spec=spec.to_json(),
                     **{"encoder_layers": LAYERS, "decoder_layers": LAYERS, **over})
    return ARCH_MODEL_REGISTRY["ln_transformer"].build_model(args, task)


# --- the formulas, from the parameters alone -------------------------------------------------------

def norm(mod, x):
    """LayerNorm, RMSNorm, SeeDNorm, DyT, Derf or ScaleNorm, by the module's parameters."""
    if hasattr(mod, "beta"):  # SeeDNorm (Cai et al. 2025): [tanh(x beta^T) alpha + gamma] * x / RMS(x)
        dot = (x * mod.beta).sum(-1, keepdim=True)  # one scalar per token
        rms = torch.sqrt((x * x).mean(-1, keepdim=True) + mod.eps)
        return (torch.tanh(dot) * mod.alpha + mod.weight) * x / rms
    if hasattr(mod, "shift"):  # Derf (Chen et al. 2025): gamma erf(alpha x + s) + beta
        return mod.weight * torch.erf(mod.alpha * x + mod.shift) + mod.bias
    if hasattr(mod, "alpha"):  # DyT (Zhu et al. 2025)
        return mod.weight * torch.tanh(mod.alpha * x) + mod.bias
    if hasattr(mod, "scale"):  # ScaleNorm (Nguyen & Salazar 2019): g x / max(|x|, eps)
        return mod.scale * x / torch.clamp(torch.sqrt((x * x).sum(-1, keepdim=True)), min=mod.eps)
    if isinstance(mod, torch.nn.RMSNorm):
        return mod.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + mod.eps)
    return F.layer_norm(x, x.shape[-1:], mod.weight, mod.bias, mod.eps)


def attention(attn, x, mem, causal: bool):
    """Multi-head attention of T x B x d states (:func:`mha`) with the per-head Q/K/V norms, the
    inner norm and head scales before the output projection where the module has them."""
    l2 = hasattr(attn, "q_norm") and hasattr(attn.q_norm, "scale")  # Henry et al.: g q^ k^T
    qkv = [None if l2 and n != "v_norm" else getattr(attn, n, None) for n in ("q_norm", "k_norm", "v_norm")]
    qkv = None if not any(qkv) else [None if m is None else (lambda y, m=m: norm(m.norm, y)) for m in qkv]
    before = getattr(attn, "before_out_proj", None)
    return mha(attn, x, mem, causal, qkv_norm=qkv, l2_scale=attn.q_norm.scale if l2 else None,
               inner=None if before is None or before.norm is None else (lambda y: norm(before.norm, y)),
               gamma=None if before is None else before.head_scale)


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

    if placement in ("hyper_connections", "mhc"):  # a first layer: n copies of x, their sum out
        return sum(streams_reference(layer, [x] * layer.spec.scheme.streams, mem))
    x0 = x
    subs = sublayers(layer, mem)
    for i, (name, f) in enumerate(subs):
        if placement in ("sandwich_ln",):      # x + LN(F(LN(x)))
            x = x + out(name)(f(n(name)(x)))
        elif placement == "olmo2":              # x + Norm(F(x))
            x = x + out(name)(f(x))
        elif placement in ("qk_norm", "qk_layernorm", "fixnorm"):  # Pre-LN (q, k or embeddings apart)
            x = x + f(n(name)(x))
        elif placement == "ln_scaling":         # x + F(LN(x) / sqrt(l))
            x = x + f(n(name)(x) / math.sqrt(depth))
        elif placement == "mix_ln":             # Post-LN for l <= floor(0.25 L), Pre-LN after
            x = n(name)(x + f(x)) if depth <= math.floor(0.25 * LAYERS) else x + f(n(name)(x))
        elif placement == "rezero":             # x + alpha F(x), one alpha per layer
            x = x + layer.layer_gate * f(x)
        elif placement == "rezero_per_sublayer":  # x + alpha_i F_i(x)
            x = x + getattr(layer, f"{name}_gate") * f(x)
        elif placement in ("b2t", "b2t_noinit"):  # Post-LN; the layer input joins the last sum
            x = n(name)(x + f(x) + (x0 if i == len(subs) - 1 else 0))
        elif placement == "t_fixup":            # no norm
            x = x + f(x)
        elif placement == "sub_ln":             # x + W_out LN(G(LN(x))), G's inner norm in f
            x = x + f(n(name)(x))
        elif placement == "normformer":         # self-attn: x + LN(Attn_hs(LN x)); FFN: Sub-LN's
            x = x + (out(name)(f(n(name)(x))) if name == "self_attn" else f(n(name)(x)))
        elif placement == "hybridnorm":         # x + Attn(QKV-norm)(x); z = Norm(x), z + FFN(z)
            x = n(name)(x) + f(n(name)(x)) if name == "final" else x + f(x)
        elif placement == "admin":              # LN(w * x + F(x)), w per dimension
            x = n(name)(getattr(layer, f"{name}_gain").weight * x + f(x))
        elif placement == "resi_dual":          # the Post-LN stream (the dual one: test below)
            x = n(name)(x + f(x))
        else:
            raise AssertionError(placement)
    return x


def connection_weights(part, streams: list) -> tuple[list, list]:
    """One sub-layer's A[k][j] (stream k into the branch, j = 0, and into stream j, j >= 1) and
    B[k], written from the papers with each stream apart. Hyper-connections (Zhu et al. 2024,
    eqs. 5-8 with tanh, App. J Alg. 2): A + s_a tanh(N(H_k) W_a), B + s_b tanh(N(H_k) W_b); mHC
    (Xie et al. 2025, eqs. 7-8): the same without tanh (A_m's and A_r's own scale), then
    H_pre = sigmoid(A_m), H_post = 2 sigmoid(B), H_res = Sinkhorn-Knopp of exp(A_r), 20 times
    each column then each row made to sum 1 (the order of lucidrains/hyper-connections). N is
    the reference package's per-stream RMSNorm H/rms(H) (1 + g)."""
    n = len(streams)
    a = [[part.static_alpha[k, j] for j in range(n + 1)] for k in range(n)]
    b = [part.static_beta[k] for k in range(n)]
    act = (lambda t: t) if part.manifold else torch.tanh
    if part.dynamic:
        s = part.alpha_scale
        scales = [s[0]] + [s[1]] * n if part.manifold else [s] * (n + 1)
        for k, h in enumerate(streams):
            normed = h / h.pow(2).mean(-1, keepdim=True).sqrt() * (1 + part.norm_gain)
            a[k] = [a[k][j] + scales[j] * act(normed @ part.dynamic_alpha[:, j]) for j in range(n + 1)]
            b[k] = b[k] + part.beta_scale * act(normed @ part.dynamic_beta)
    if part.manifold:
        m = torch.stack([torch.stack(a[k][1:]) for k in range(n)]).exp()  # k, j[, T, B]
        for _ in range(20):
            m = m / m.sum(0, keepdim=True)
            m = m / m.sum(1, keepdim=True)
        a = [[torch.sigmoid(a[k][0])] + [m[k, j] for j in range(n)] for k in range(n)]
        b = [2 * torch.sigmoid(bk) for bk in b]
    return a, b


def streams_reference(layer, streams: list, mem=None) -> list:
    """One layer of hyper-connections or mHC on the streams H (a list of n T x B x d tensors):
    for each sub-layer, h = sum_k A[k][0] H_k, y = F(LN(h)), H_j <- sum_k A[k][j+1] H_k + B[j] y."""
    def w(c):
        return c.unsqueeze(-1) if c.dim() > 0 else c  # a per-token weight on each token's vector

    for name, f in sublayers(layer, mem):
        a, b = connection_weights(layer.connections[name], streams)
        n = len(streams)
        y = f(norm(getattr(layer, f"{name}_layer_norm"), sum(w(a[k][0]) * streams[k] for k in range(n))))
        streams = [sum(w(a[k][j + 1]) * streams[k] for k in range(n)) + w(b[j]) * y for j in range(n)]
    return streams


@pytest.fixture(scope="module")
def zoo_models(tiny_task):
    models = {p: build(tiny_task, p).double().eval() for p in ZOO}
    for n in NORM_ZOO:
        models[n] = build(tiny_task, "pre_ln", norm=n).double().eval()
    for p in OWN_TESTS:
        models[p] = build(tiny_task, p).double().eval()
    # Move every parameter that starts at a constant (norm gains and biases, ReZero's gates,
    # NormFormer's head scales) off it, so that the formulas test where each one sits.
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for model in models.values():
            for name, p in model.named_parameters():
                if "norm" in name or ".connections." in name or name.endswith(
                        ("_gate", "head_scale", ".alpha", ".shift", ".scale", "_gain.weight")):
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
        model.encoder.stream.clear()  # each layer called alone, as a stack's first (n streams: x's copies)
        model.decoder.stream.clear()
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


# each norm group's module and its initial values: DyT's alpha0 (configs/norm/dyt.yaml, the paper's
# default), Derf's alpha0 and shift0 (zlab-princeton/Derf Dynamic_erf's defaults), ScaleNorm's g = sqrt(d)
# (tnq177/transformers_without_tears: ScaleNorm(args.embed_dim ** 0.5)), SeeDNorm's lnexp reading
# (configs/norm/seednorm.yaml: alpha = 1, beta = 0, gamma = 1 in every entry, eps 1e-6)
NORM_INIT = {
    "dyt": ("DyT", lambda m: m.alpha.item() == 0.5),
    "derf": ("Derf", lambda m: m.alpha.item() == 0.5 and m.shift.item() == 0.0),
    "scalenorm": ("ScaleNorm", lambda m: m.scale.item() == pytest.approx(16 ** 0.5, rel=1e-7)),
    "seednorm": ("SeeDNorm", lambda m: m.alpha.shape == m.beta.shape == m.weight.shape == (16,)
                 and bool((m.alpha == 1).all() and (m.beta == 0).all() and (m.weight == 1).all())
                 and m.eps == 1e-6),
}


def test_seednorm_with_beta_zero_is_rmsnorm():
    """SeeDNorm's gain tanh(x beta^T) alpha + gamma is gamma where beta = 0: torch's RMSNorm with
    that gamma and eps, whatever alpha is, so a fresh SeeDNorm network is an RMSNorm one; beta's
    gradient (proportional to alpha) is not 0 there, alpha's (proportional to tanh(0)) is."""
    from lnexp.model.norms import make_norm
    from lnexp.scheme import Norm

    g = torch.Generator().manual_seed(3)
    seed = make_norm(Norm("seednorm"), 16)
    assert seed.eps == 1e-6 and seed.alpha.eq(1).all() and seed.beta.eq(0).all()
    rms = torch.nn.RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        seed.alpha.copy_(torch.randn(16, generator=g))
        seed.weight.copy_(torch.rand(16, generator=g) + 0.5)
        rms.weight.copy_(seed.weight)
    x = torch.randn(5, 3, 16, generator=g) * 3 + 1
    torch.testing.assert_close(seed(x), rms(x))
    (seed(x) * torch.randn(5, 3, 16, generator=g)).sum().backward()  # alpha != 0: beta learns at once
    assert seed.beta.grad.abs().min() > 0 and seed.alpha.grad.abs().max() == 0  # d/d alpha: tanh(0)


def test_seednorm_is_its_formula_with_every_parameter_learnt():
    """float64, random non-zero beta, alpha and gamma: each token's own tanh(x beta^T) rescales
    gamma along alpha, over x / sqrt(mean_i x_i^2 + eps), per token written out here."""
    from lnexp.model.norms import make_norm
    from lnexp.scheme import Norm

    g = torch.Generator().manual_seed(4)
    seed = make_norm(Norm("seednorm", beta0=0.5), 8).double()
    assert seed.beta.eq(0.5).all()
    with torch.no_grad():
        for p in (seed.alpha, seed.beta, seed.weight):
            p.copy_(torch.randn(8, generator=g, dtype=torch.float64) * 0.3 + 0.2)
    x = torch.randn(4, 2, 8, generator=g, dtype=torch.float64) * 2
    out = seed(x)
    a, b, w = (p.detach().tolist() for p in (seed.alpha, seed.beta, seed.weight))
    for t in range(4):
        for n in range(2):
            v = x[t, n].tolist()
            s = math.tanh(sum(vi * bi for vi, bi in zip(v, b, strict=True)))
            rms = math.sqrt(sum(vi * vi for vi in v) / 8 + 1e-6)
            want = [(s * a[i] + w[i]) * v[i] / rms for i in range(8)]
            torch.testing.assert_close(out[t, n], torch.tensor(want, dtype=torch.float64),
                                       rtol=1e-12, atol=1e-12)
    assert abs(s) > 0.1  # beta moved the gain: not RMSNorm's


@pytest.mark.parametrize("name", NORM_ZOO)
def test_a_norm_group_replaces_every_norm(tiny_task, zoo_models, name):
    from lnexp.model import norms

    kind = getattr(norms, NORM_INIT[name][0])
    fresh = [m for m in build(tiny_task, "pre_ln", norm=name).modules() if isinstance(m, kind)]
    assert fresh and all(NORM_INIT[name][1](m) for m in fresh)
    model = zoo_models[name]
    found = [m for m in model.modules() if isinstance(m, kind)]
    # 2 per encoder layer, 3 per decoder layer, the two final norms
    assert len(found) == LAYERS * 5 + 2
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in model.modules())
    x = torch.randn(5, 2, 16, dtype=torch.float64)
    layer = model.encoder.layers[0]
    ref = x + sublayers(layer)[0][1](norm(layer.self_attn_layer_norm, x))
    ref = ref + sublayers(layer)[1][1](norm(layer.final_layer_norm, ref))
    torch.testing.assert_close(layer(x, None), ref, rtol=1e-10, atol=1e-10)


def test_fixnorm_is_the_authors_embeddings_and_logits(zoo_models, tiny_batch):
    """tnq177/transformers_without_tears model.py, Transformer.forward: the table made unit-length
    (F.normalize), the input embedding F.embedding(toks, table) * sqrt(d), the logits
    F.linear(decoder_output, table), the one table shared by encoder, decoder and output (float64)."""
    model = zoo_models["fixnorm"]
    src, lengths, prev, _ = tiny_batch
    table = embedding_table(model.encoder)
    assert table is embedding_table(model.decoder)
    unit = table / table.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    got = model.encoder.forward_embedding(src)[1]  # fairseq's (x, embed): embed before positions
    torch.testing.assert_close(got, F.embedding(src, unit) * math.sqrt(16), rtol=1e-12, atol=1e-12)
    features = model.decoder(prev, encoder_out=model.encoder(src, lengths), features_only=True)[0]
    torch.testing.assert_close(model.decoder.output_layer(features), F.linear(features, unit),
                               rtol=1e-12, atol=1e-12)
    # the rows' lengths do not matter: scaling one changes nothing the model computes
    before = model(src, lengths, prev)[0]
    with torch.no_grad():
        table[5:9] *= 3.0
    torch.testing.assert_close(model(src, lengths, prev)[0], before, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        table[5:9] /= 3.0


def test_norm_free_schemes_have_no_norms_and_rezero_starts_at_the_identity(tiny_task, zoo_models):
    for p in ("rezero", "t_fixup"):
        names = [n for n, m in zoo_models[p].named_modules()
                 if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm)]
        assert names == [], (p, names)
    gates = [p for n, p in build(tiny_task, "rezero").named_parameters() if n.endswith("_gate")]
    assert len(gates) == LAYERS * 2 and all(g.item() == 0 for g in gates)  # one alpha = 0 per layer
    gates = [p for n, p in build(tiny_task, "rezero_per_sublayer").named_parameters()
             if n.endswith("_gate")]
    assert len(gates) == LAYERS * 5 and all(g.item() == 0 for g in gates)  # one per sub-layer


# --- the authors' networks: each scheme against its reference code, float64 to 1e-12 -------------
#
# Each reference below is transcribed from the authors' code (file and function in its docstring)
# and reads only the layer's own parameters. The models are built in float64 (torch's default dtype
# for the build), every norm gain and bias, gate, head scale, QK scale and linear bias moved off its
# initial value, and fairseq's attention softmax taken in float64 (fairseq.utils.softmax casts to
# float32 otherwise): the layers agree with the references to rounding.

ENC, DEC = 3, 2  # N != M, so that the encoder's and the decoder's factors differ


@pytest.fixture
def float64(monkeypatch):
    """torch's default dtype float64 while building; fairseq's attention softmax in float64."""
    import fairseq.utils

    monkeypatch.setattr(fairseq.utils, "softmax",
                        lambda x, dim, onnx_trace=False: F.softmax(x, dim=dim))
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def build64(task, placement: str, seed: int = 3):
    return build(task, placement, seed=seed, encoder_layers=ENC, decoder_layers=DEC)


def randomise_(model, seed: int = 2):
    """Every parameter that starts at a constant or that a scheme scales, moved off it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("_gate", "head_scale", "bias")):
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype) + 0.1)
    return model.eval()


def mha(attn, x, mem, causal: bool, qkv_norm=None, l2_scale=None, inner=None, gamma=None):
    """Multi-head attention of T x B x d states with the projections of ``attn``: optional per-head
    norms of q, k, v (``qkv_norm``: three functions or None), Henry et al.'s L2-normalised q, k with
    the learned scale ``l2_scale`` in place of 1/sqrt(d_h), per-head scales ``gamma`` and a norm
    ``inner`` before the output projection."""
    t, b, d = x.shape
    h = attn.num_heads

    def split(y):
        return y.reshape(y.shape[0], b, h, d // h).permute(1, 2, 0, 3)  # B H T dh

    q, k, v = (split(F.linear(z, p.weight, p.bias)) for z, p in
               ((x, attn.q_proj), (mem, attn.k_proj), (mem, attn.v_proj)))
    if qkv_norm is not None:
        q, k, v = (f(y) if f is not None else y for f, y in zip(qkv_norm, (q, k, v), strict=True))
    if l2_scale is not None:
        scores = l2_scale * F.normalize(q, p=2, dim=-1, eps=1e-12) @ \
            F.normalize(k, p=2, dim=-1, eps=1e-12).transpose(-1, -2)
    else:
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
    if causal:
        scores = scores + torch.full((t, t), float("-inf"), dtype=x.dtype).triu(1)
    heads = scores.softmax(-1) @ v
    if gamma is not None:
        heads = heads * gamma[None, :, None, None]
    out = heads.permute(2, 0, 1, 3).reshape(t, b, d)
    if inner is not None:
        out = inner(out)
    return F.linear(out, attn.out_proj.weight, attn.out_proj.bias)


def mlp(layer, x, inner=None):
    """W_2 act(W_1 x) (ReLU), with a norm ``inner`` after the activation (Sub-LN, NormFormer)."""
    h = F.relu(F.linear(x, layer.fc1.weight, layer.fc1.bias))
    return F.linear(inner(h) if inner is not None else h, layer.fc2.weight, layer.fc2.bias)


def _ln(mod):
    return lambda y: norm(mod, y)


def hybridnorm_layer(layer, x, mem=None):
    """BryceZhuo/HybridNorm, dense_model/configs/exps/1.2B-dense-HybriedNorm.yaml on OLMo's block:
    use_query_norm, use_key_norm, use_value_norm (per head), attn_norm: false (no norm before
    attention), ffn_norm: true with ffn_residual_after_norm: true: h = Norm(x), x = h + FFN(h).
    The decoder's cross-attention is built like its self-attention (OLMo is decoder-only)."""
    def qkv(attn):
        return tuple(_ln(getattr(attn, f"{p}_norm").norm) for p in "qkv")

    x = x + mha(layer.self_attn, x, x, mem is not None, qkv_norm=qkv(layer.self_attn))
    if mem is not None:
        x = x + mha(layer.encoder_attn, x, mem, False, qkv_norm=qkv(layer.encoder_attn))
    h = norm(layer.final_layer_norm, x)
    return h + mlp(layer, h)


def sub_ln_layer(layer, x, mem=None):
    """microsoft/torchscale with subln=True, normalize_before: architecture/encoder.py
    EncoderLayer.forward, decoder.py DecoderLayer.forward; component/multihead_attention.py
    MultiheadAttention (inner_attn_ln before out_proj, built only if self_attention);
    component/feedforward_network.py FeedForwardNetwork.forward (ffn_layernorm before fc2)."""
    assert mem is None or not hasattr(layer.encoder_attn, "before_out_proj")
    h = norm(layer.self_attn_layer_norm, x)
    x = x + mha(layer.self_attn, h, h, mem is not None,
                inner=_ln(layer.self_attn.before_out_proj.norm))
    if mem is not None:
        x = x + mha(layer.encoder_attn, norm(layer.encoder_attn_layer_norm, x), mem, False)
    return x + mlp(layer, norm(layer.final_layer_norm, x), inner=_ln(layer.final_inner_norm))


def t_fixup_layer(layer, x, mem=None):
    """layer6ai-labs/T-Fixup fairseq/modules/transformer_layer.py TransformerEncoderLayer.forward and
    TransformerDecoderLayer.forward with --dont-use-layernorm: x = residual + F(x), no norm."""
    x = x + mha(layer.self_attn, x, x, mem is not None)
    if mem is not None:
        x = x + mha(layer.encoder_attn, x, mem, False)
    return x + mlp(layer, x)


def b2t_layer(layer, x, mem=None):
    """takase/b2t_connection fairseq/modules/transformer_layer.py TransformerEncoderLayer.forward and
    TransformerDecoderLayer.forward with --residual-bottom-to-top, Post-LN: residual_bottom = x;
    x = LN(x + Attn(x)) [cross-attention alike]; x = residual + FFN(x); x = LN(residual_bottom + x)."""
    bottom = x
    x = norm(layer.self_attn_layer_norm, x + mha(layer.self_attn, x, x, mem is not None))
    if mem is not None:
        x = norm(layer.encoder_attn_layer_norm, x + mha(layer.encoder_attn, x, mem, False))
    return norm(layer.final_layer_norm, bottom + (x + mlp(layer, x)))


def rezero_layer(layer, x, mem=None):
    """majumderb/rezero rezero/transformer/rztx.py RZTXEncoderLayer.forward, RZTXDecoderLayer
    .forward: one resweight per layer, x = x + resweight * F(x) for each sub-layer, no norm."""
    a = layer.layer_gate
    x = x + mha(layer.self_attn, x, x, mem is not None) * a
    if mem is not None:
        x = x + mha(layer.encoder_attn, x, mem, False) * a
    return x + mlp(layer, x) * a


def normformer_layer(layer, x, mem=None):
    """fairseq modules/transformer_layer.py TransformerDecoderLayerBase.forward with --scale-attn
    (attn_ln after self-attention), --scale-heads (c_attn, here before out_proj as the paper puts
    it, fairseq#3973) and --scale-fc (ffn_layernorm after the activation), Pre-LN: the
    cross-attention (encoder_attn) gets neither; the encoder's layers are built as the decoder's."""
    assert mem is None or not hasattr(layer.encoder_attn, "before_out_proj")
    h = norm(layer.self_attn_layer_norm, x)
    y = mha(layer.self_attn, h, h, mem is not None, gamma=layer.self_attn.before_out_proj.head_scale)
    x = x + norm(layer.self_attn_out_norm, y)
    if mem is not None:
        assert layer.encoder_attn_out_norm is None
        x = x + mha(layer.encoder_attn, norm(layer.encoder_attn_layer_norm, x), mem, False)
    return x + mlp(layer, norm(layer.final_layer_norm, x), inner=_ln(layer.final_inner_norm))


def qk_norm_layer(layer, x, mem=None):
    """CyndxAI/QKNorm QKNorm/layers.py MultiheadAttention.forward with mha_sup (F.normalize of each
    head's q and k, ScaleUp's learned g on q^k^T instead of 1/sqrt(d_h)), Encoder/Decoder.forward
    with pre_act (Pre-Norm; a final norm)."""
    h = norm(layer.self_attn_layer_norm, x)
    x = x + mha(layer.self_attn, h, h, mem is not None, l2_scale=layer.self_attn.q_norm.scale)
    if mem is not None:
        x = x + mha(layer.encoder_attn, norm(layer.encoder_attn_layer_norm, x), mem, False,
                    l2_scale=layer.encoder_attn.q_norm.scale)
    return x + mlp(layer, norm(layer.final_layer_norm, x))


AUTHORS = {"hybridnorm": hybridnorm_layer, "sub_ln": sub_ln_layer, "t_fixup": t_fixup_layer,
           "b2t": b2t_layer, "rezero": rezero_layer, "normformer": normformer_layer,
           "qk_norm": qk_norm_layer}
# a norm on each stack's output: OLMo's ln_f, torchscale's and fairseq's Pre-LN layer_norm, Henry
# et al.'s last scale with pre_act; none in T-Fixup, B2T (Post-LN) and ReZero (encoder_norm None)
FINAL_NORM = {"hybridnorm": True, "sub_ln": True, "t_fixup": False, "b2t": False, "rezero": False,
              "normformer": True, "qk_norm": True}


@pytest.mark.parametrize("placement", sorted(AUTHORS))
def test_layers_are_the_authors_code_to_float64_rounding(tiny_task, float64, placement):
    model = randomise_(build64(tiny_task, placement))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 2, 16, generator=g, dtype=torch.float64) * 2
    mem = torch.randn(6, 2, 16, generator=g, dtype=torch.float64)
    causal = model.decoder.buffered_future_mask(x)
    for layer in model.encoder.layers:
        torch.testing.assert_close(layer(x, None), AUTHORS[placement](layer, x), rtol=1e-12, atol=1e-12)
    for layer in model.decoder.layers:
        got = layer(x, mem, None, self_attn_mask=causal)[0]
        torch.testing.assert_close(got, AUTHORS[placement](layer, x, mem), rtol=1e-12, atol=1e-12)
    for stack in (model.encoder, model.decoder):
        assert (stack.layer_norm is not None) == FINAL_NORM[placement]


# --- their initialisations, as functions of fairseq's draw (Post-LN's at the same seed) ---------

def _leaf(key: str) -> str:
    return key.split(".", 3)[-1]  # encoder.layers.0.self_attn.v_proj.weight -> self_attn.v_proj.weight


def t_fixup_init(key: str, w: torch.Tensor) -> torch.Tensor:
    """layer6ai-labs/T-Fixup fairseq/modules/transformer_layer.py
    TransformerEncoderLayer.fixup_initialization (fc1, fc2, self_attn.out_proj weights x 0.67 N^-1/4,
    self_attn.v_proj x 0.67 N^-1/4 x sqrt(2)) and TransformerDecoderLayer.fixup_initialization (the
    same with (9M)^-1/4, self- and cross-attention); Linear there draws fc1, fc2 Xavier-uniform with
    bias 0 (here: fairseq's U(+-1/sqrt(fan_in)) draw times the ratio of the two bounds); its
    MultiheadAttention draws v with gain 1/sqrt(2) as fairseq's does. fairseq/models/transformer.py
    TransformerEncoder.__init__: the token embeddings x (9N)^-1/4; TransformerDecoder.__init__ skips
    them when shared (share_all_embeddings, as here)."""
    if key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
               "decoder.output_projection.weight"):
        return w * (9 * ENC) ** -0.25
    if not key.startswith(("encoder.layers.", "decoder.layers.")):
        return w
    f = 0.67 * ENC ** -0.25 if key.startswith("encoder.") else (9 * DEC) ** -0.25
    leaf = _leaf(key)
    if leaf in ("fc1.bias", "fc2.bias"):
        return torch.zeros_like(w)
    if leaf in ("fc1.weight", "fc2.weight"):
        fan_out, fan_in = w.shape
        return w * (math.sqrt(6 / (fan_in + fan_out)) * math.sqrt(fan_in)) * f
    if leaf in ("self_attn.out_proj.weight", "encoder_attn.out_proj.weight"):
        return w * f
    if leaf in ("self_attn.v_proj.weight", "encoder_attn.v_proj.weight"):
        return w * 2 ** 0.5 * f
    return w


def sub_ln_init(key: str, w: torch.Tensor) -> torch.Tensor:
    """microsoft/torchscale torchscale/architecture/encoder.py Encoder.__init__ and decoder.py
    Decoder.__init__ (subln, is_encoder_decoder): every parameter whose name has fc1, fc2, out_proj
    or v_proj, weights and biases, x sqrt(log(3M) log(2N) / 3) in the encoder, x sqrt(log(3M)) in the
    decoder, which skips the names with encoder_attn."""
    if key.startswith("encoder.layers."):
        f = math.sqrt(math.log(3 * DEC) * math.log(2 * ENC) / 3)
    elif key.startswith("decoder.layers.") and "encoder_attn" not in key:
        f = math.sqrt(math.log(3 * DEC))
    else:
        return w
    return w * f if any(m in key for m in ("fc1", "fc2", "out_proj", "v_proj")) else w


def b2t_init(key: str, w: torch.Tensor) -> torch.Tensor:
    """takase/b2t_connection fairseq/modules/transformer_layer.py rescaling_init(layer, L), which
    TransformerEncoderLayer/TransformerDecoderLayer.__init__ call with --residual-bottom-to-top:
    every parameter named *weight* but not *layer_norm* x L^-1/2, L = encoder_layers (decoder_layers)."""
    for stack, depth in (("encoder.layers.", ENC), ("decoder.layers.", DEC)):
        if key.startswith(stack) and "weight" in key and "layer_norm" not in key:
            return w * depth ** -0.5
    return w


def fairseqs(key: str, w: torch.Tensor) -> torch.Tensor:
    """fairseq's draw unchanged (the authors' code scales nothing)."""
    return w


_STACK = r"(en|de)coder\.layers\.\d+\."
_FINAL = r"(en|de)coder\.layer_norm\.(weight|bias)"
# the authors' init, and each scheme's own parameters (name pattern: value at init), with the number
# of fairseq parameters the init changes (every layer's scaled matrices)
INITS = {
    "t_fixup": (t_fixup_init, {}, 6 * ENC + 8 * DEC + 3),  # fc1/fc2 w+b, v, out; + 3 embedding keys
    "sub_ln": (sub_ln_init, {_STACK + r"self_attn\.before_out_proj\.norm\.weight": 1.0,
                             _STACK + r"self_attn\.before_out_proj\.norm\.bias": 0.0,
                             _STACK + r"final_inner_norm\.weight": 1.0,
                             _STACK + r"final_inner_norm\.bias": 0.0,
                             _FINAL: None}, 7 * ENC + 7 * DEC),  # w+b of fc1, fc2, v; out's w
    "b2t": (b2t_init, {}, 6 * ENC + 10 * DEC),  # q, k, v, out per attention, fc1, fc2
    "rezero": (fairseqs, {_STACK + "layer_gate": 0.0}, 0),
    "normformer": (fairseqs, {_STACK + r"self_attn\.before_out_proj\.head_scale": 1.0,
                              _STACK + r"self_attn_out_norm\.weight": 1.0,
                              _STACK + r"self_attn_out_norm\.bias": 0.0,
                              _STACK + r"final_inner_norm\.weight": 1.0,
                              _STACK + r"final_inner_norm\.bias": 0.0, _FINAL: None}, 0),
    "hybridnorm": (fairseqs, {_STACK + r"(self|encoder)_attn\.[qkv]_norm\.norm\.weight": 1.0,
                              _STACK + r"(self|encoder)_attn\.[qkv]_norm\.norm\.bias": 0.0,
                              _FINAL: None}, 0),
    # Henry et al.'s g0 = log2(L^2 - L) (QKNorm/layers.py MultiheadAttention.__init__), L = 32
    "qk_norm": (fairseqs, {_STACK + r"(self|encoder)_attn\.q_norm\.scale": math.log2(32 ** 2 - 32),
                           _FINAL: None}, 0),
}


@pytest.mark.parametrize("placement", sorted(INITS))
def test_init_is_the_authors_code_to_float64_rounding(tiny_task, float64, placement):
    """Same seed, same fairseq draws: every parameter the scheme shares with Post-LN is the authors'
    function of Post-LN's, every one of its own starts where the authors' does (norms: gain 1, bias
    0; a final norm's values are fairseq's LayerNorm's)."""
    import re

    ours, base = build64(tiny_task, placement), build64(tiny_task, "post_ln")
    rule, own, n_changed = INITS[placement]
    s_base = base.state_dict()
    changed, seen = 0, set()
    for key, value in ours.state_dict().items():
        if key in s_base:
            want = rule(key, s_base[key])
            torch.testing.assert_close(value, want, rtol=1e-12, atol=0, msg=key)
            changed += not torch.equal(want, s_base[key])
            continue
        match = [p for p in own if re.fullmatch(p, key)]
        assert match, f"{placement}: {key} is no parameter of the authors' network"
        seen.add(match[0])
        if own[match[0]] is not None:
            assert torch.equal(value, torch.full_like(value, own[match[0]])), key
    assert changed == n_changed and seen == set(own)
    if placement == "t_fixup":  # fairseq draws fc1, fc2 from torch's default U(+-1/sqrt(fan_in))
        for key, w in s_base.items():
            if key.endswith(("fc1.weight", "fc2.weight")):
                bound = 1 / math.sqrt(w.shape[1])
                assert 0.9 * bound < w.abs().max() <= bound and s_base[key[:-6] + "bias"].abs().max() > 0


def test_t_fixup_scales_each_stacks_own_table_and_a_shared_one_once():
    """Unshared embeddings (T-Fixup's TransformerEncoder/TransformerDecoder __init__): the
    encoder's table x (9N)^-1/4, the decoder's x (9M)^-1/4; the shared case is the test above."""
    from types import SimpleNamespace

    from lnexp.model.transformer import _scale_embeddings_
    from lnexp.scheme import evaluate

    enc, dec = torch.nn.Embedding(7, 4), torch.nn.Embedding(7, 4)
    e0, d0 = enc.weight.detach().clone(), dec.weight.detach().clone()
    model = SimpleNamespace(encoder=SimpleNamespace(embed_tokens=enc),
                            decoder=SimpleNamespace(embed_tokens=dec))
    _scale_embeddings_(model, {s: evaluate("t_fixup_embedding", s, 0, ENC, DEC)
                               for s in ("encoder", "decoder")})
    torch.testing.assert_close(enc.weight.detach(), e0 * (9 * ENC) ** -0.25, rtol=1e-7, atol=0)
    torch.testing.assert_close(dec.weight.detach(), d0 * (9 * DEC) ** -0.25, rtol=1e-7, atol=0)


def test_kept_variants_are_the_earlier_networks():
    """b2t_noinit, rezero_per_sublayer and qk_layernorm are what b2t, rezero and qk_norm built
    before they became the authors' networks (old run folders' specs rebuild them too)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from lnexp.scheme import Init, placement_of

    def of(name):
        return placement_of(SimpleNamespace(placement=name))

    assert of("b2t_noinit") == replace(of("b2t"), name="b2t_noinit", init=Init())
    assert of("rezero_per_sublayer") == replace(of("rezero"), name="rezero_per_sublayer",
                                                shared_gate=False)
    assert of("qk_layernorm") == replace(of("qk_norm"), name="qk_layernorm", qk_norm_form="layernorm")


def test_stock_fairseq_equivalent_only_for_the_yaml_as_written():
    """settings.stock_flags: a Pre-LN run is stock fairseq's only with pre_ln.yaml unchanged."""
    from lnexp.config import compose
    from lnexp.train.settings import resolve, stock_flags

    base = ["placement=pre_ln", "schedule=inverse_sqrt", "warmup=100"]
    assert stock_flags(resolve(compose(base), "cpu").flags) is not None
    for extra in ("placement.qk_norm=true", "norm=rmsnorm", "norm.eps=1e-6"):
        assert stock_flags(resolve(compose([*base, extra]), "cpu").flags) is None, extra


@pytest.mark.parametrize("override,needle", [
    ("norm.alpha0=abc", "norm.alpha0='abc' is not a number: e.g. norm.alpha0=0.5"),
    ("norm.alpha0=0", "norm.alpha0=0 must be a positive number"),
    ("placement.qk_norm=yes", "placement.qk_norm='yes' is not true or false"),
    ("placement.residual_weight=alpha", "must be a number or one of deepnorm_alpha"),
    ("placement.structure=ladder", "structure='ladder' is not one of residual, b2t, resi_dual"),
    ("placement.streams=0", "streams=0 must be an integer >= 1: e.g. placement.streams=4"),
    ("placement.streams=4", "streams and dynamic are hyper-connections' keys"),
    ("placement.first_layers={fraction:2}", "first_layers takes fraction (0..1)"),
    ("placement.sublayers={mlp:{sum_norm:true}}", "sublayers takes attention, cross_attention, ffn"),
    ("placement.qk_norm_form=l1", "qk_norm_form='l1' is not one of layernorm, l2"),
    ("placement.shared_gate=true", "shared_gate shares ReZero's gate (branch_gate)"),
    ("placement.norm_residual=true", "norm_residual takes the residual after the input norm"),
])
def test_bad_scheme_keys_are_one_line_config_errors(override, needle):
    from lnexp.config import compose
    from lnexp.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose(["norm=dyt", override])
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("value", ["abc", "inf", "nan"])
def test_seednorm_beta0_is_a_finite_number(value):
    from lnexp.config import compose
    from lnexp.errors import ConfigError

    assert compose(["norm=seednorm", "norm.beta0=-0.25"]).norm.beta0 == -0.25
    with pytest.raises(ConfigError) as e:
        compose(["norm=seednorm", f"norm.beta0={value}"])
    assert str(e.value).startswith("norm.beta0=") and "e.g. norm.beta0=0.0" in str(e.value) \
        and "\n" not in str(e.value)


def test_qk_norm_is_a_switch_of_any_placement(tiny_task):
    """placement=NAME placement.qk_norm=true: one norm per head-projection, nothing else changes."""
    from dataclasses import replace
    from types import SimpleNamespace

    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.scheme import placement_of

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


def embedding_table(stack) -> torch.Tensor:
    """A stack's embedding parameter (under FixNorm's parametrization, the raw table)."""
    emb = stack.embed_tokens
    return emb.parametrizations.weight.original if hasattr(emb, "parametrizations") else emb.weight


@pytest.mark.parametrize("placement", ZOO + NORM_ZOO + OWN_TESTS)
def test_gradients_reach_embeddings_and_incremental_decoding_equals_full(zoo_models, tiny_batch,
                                                                         placement):
    model = zoo_models[placement]
    src, lengths, prev, target = tiny_batch
    model.zero_grad()
    logits, _ = model(src, lengths, prev)
    F.cross_entropy(logits.transpose(1, 2), target).backward()
    grad = embedding_table(model.encoder).grad
    assert torch.isfinite(grad).all() and grad.abs().sum() > 0
    enc = model.encoder(src, lengths)
    full = model.decoder(prev, encoder_out=enc)[0]
    state: dict = {}
    steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
             for t in range(prev.shape[1])]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-6, atol=1e-6)  # float32 softmax


def test_zoo_run_trains_evaluates_translates_and_fairseq_generates(tmp_path, tiny_multi30k,
                                                                   tiny_prepared_cache, capsys,
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

    # the session's tiny corpus, prepared once per session (its 20 test sentences: a path, not a score)
    monkeypatch.setenv("LNEXP_CACHE", str(tiny_prepared_cache))
    cfg = config.compose([
        "placement=mix_ln", "placement.qk_norm=true", "placement.structure=resi_dual",
        "norm=dyt", "norm.alpha0=0.7",
        f"dataset.dir={tiny_multi30k}", "dataset.vocab_size=600", "scale.max_tokens=512",
        "depth.encoder_layers=4", "depth.decoder_layers=4", "max_update=2", "eval.subset=4",
        "eval.beam=2", "divergence.plateau_epoch=99"])
    run = tmp_path / "run"
    assert train_run(cfg, run)["status"] == "stopped"
    flags = json.loads((run / "run.json").read_text())["fairseq_flags"]
    assert json.loads(flags["placement_spec"])["first_layers"]["fraction"] == 0.25
    assert json.loads(flags["placement_spec"])["structure"] == "resi_dual"
    assert json.loads(flags["norm_spec"]) == {"name": "dyt", "alpha0": 0.7, "eps": None, "shift0": 0.0,
                                              "beta0": 0.0}
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


@pytest.mark.parametrize("overrides", [["placement=fixnorm", "norm=scalenorm"],
                                       ["norm=derf", "norm.shift0=0.1"],
                                       ["placement=pre_ln", "norm=seednorm", "norm.beta0=0.01"],
                                       ["placement=ngpt"], ["placement=hyper_connections"],
                                       ["placement=mhc"]],
                         ids=["fixnorm+scalenorm", "derf", "seednorm", "ngpt", "hyper_connections", "mhc"])
def test_a_2026_scheme_trains_and_evaluates_from_its_checkpoint(tmp_path, tiny_multi30k,
                                                                tiny_prepared_cache, capsys,
                                                                monkeypatch, overrides):
    """Transformers without Tears' network, Derf, SeeDNorm, nGPT, hyper-connections and mHC, each a
    2-update lnexp train run whose checkpoint lnexp evaluate rebuilds (the placement and norm, init
    values too, travel as JSON; hyper-connections' weights are parameters it carries) and scores."""
    import json

    from lnexp import config
    from lnexp.cli import main
    from lnexp.scheme import Norm
    from lnexp.train.loop import train_run

    monkeypatch.setenv("LNEXP_CACHE", str(tiny_prepared_cache))
    cfg = config.compose([*overrides, f"dataset.dir={tiny_multi30k}", "dataset.vocab_size=600",
                          "scale.max_tokens=512", "max_update=2", "eval.subset=4", "eval.beam=2",
                          "divergence.plateau_epoch=99", "depth.encoder_layers=2",
                          "depth.decoder_layers=2"])  # a checkpoint's path, not depth 6's numbers
    run = tmp_path / "run"
    assert train_run(cfg, run)["status"] == "stopped"
    flags = json.loads((run / "run.json").read_text())["fairseq_flags"]
    assert Norm.from_config(json.loads(flags["norm_spec"])) == Norm.from_config(cfg.norm)
    assert json.loads(flags["placement_spec"])["fix_norm"] == (cfg.placement.name == "fixnorm")
    assert json.loads(flags["placement_spec"])["streams"] == cfg.placement.streams
    if cfg.placement.streams > 1:
        from lnexp.fairseq_adapter import load_checkpoint_state

        state = load_checkpoint_state(run / "checkpoints" / "checkpoint_last.pt")["model"]
        alpha = state["decoder.layers.0.connections.final.static_alpha"]
        assert alpha.shape == (4, 5) and not torch.equal(alpha[:, 1:], torch.eye(4))  # trained
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json", "--beam", "2"]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["n"] > 0 and record["bleu"] >= 0


def test_admin_run_profiles_once_records_omega_and_its_checkpoint_carries_it(
        tmp_path, tiny_multi30k, tiny_prepared_cache, monkeypatch):
    """lnexp train placement=admin: the fresh run profiles (run.json's profiled_init), the
    checkpoint carries the gains (trained from those values; evaluate and translate load the
    model from it), and a resumed run does not profile again."""
    import json

    from lnexp import config
    from lnexp.fairseq_adapter import load_checkpoint_state
    from lnexp.train.loop import train_run

    monkeypatch.setenv("LNEXP_CACHE", str(tiny_prepared_cache))
    base = ["placement=admin", f"dataset.dir={tiny_multi30k}", "dataset.vocab_size=600",
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
    from types import SimpleNamespace

    from lnexp.scheme import placement_of

    return placement_of(SimpleNamespace(placement=placement)).to_json()


def test_a_formula_key_takes_a_number_or_a_formula_whichever_the_yaml_has():
    from lnexp.config import compose

    assert compose(["placement=pre_ln", "placement.residual_weight=deepnorm_alpha"]).placement \
        .residual_weight == "deepnorm_alpha"
    assert compose(["placement=deepnorm", "placement.residual_weight=1.0"]).placement.residual_weight == 1.0


PAPER_SIZE = [(p, "layernorm") for p in __import__("lnexp.names", fromlist=["PLACEMENTS"]).PLACEMENTS] \
    + [("pre_ln", n) for n in NORM_ZOO]


@pytest.mark.parametrize("placement,norm_name", PAPER_SIZE, ids=[f"{p}+{n}" for p, n in PAPER_SIZE])
def test_every_scheme_takes_an_update_at_the_papers_size(tiny_task, tiny_batch, placement, norm_name):
    """The paper's IWSLT architecture (6+6 layers, d=512, FFN 1024, 4 heads; lnexp.names
    ARCH_SIZES), each scheme as lnexp train builds it (Admin profiled first), each norm in Pre-LN:
    a finite loss, gradients at the embeddings, and one SGD update that lowers the loss on its batch."""
    from types import SimpleNamespace

    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.model.admin import PROFILERS
    from lnexp.names import arch_flags
    from lnexp.scheme import placement_of

    spec = placement_of(SimpleNamespace(placement=placement))
    torch.manual_seed(0)
    args = tiny_args("ln_transformer_iwslt_de_en", placement=placement, norm=norm_name,
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
    assert torch.isfinite(before) and embedding_table(model.encoder).grad.abs().sum() > 0
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= 0.01 * p.grad  # (ReZero's and T-Fixup's first steps are small: a plain SGD step)
        assert loss() < before
