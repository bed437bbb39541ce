"""nGPT (placement=ngpt): its layers are NVIDIA/ngpt's block written again from the paper and the
authors' model.py (float64), its matrices stay on the sphere after each update (on the fp32 master
copies too), and its learned scales start where the authors' do."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.test_zoo import build


def justnorm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """NVIDIA/ngpt's ``justnorm``: x / |x|."""
    return x / x.norm(p=2, dim=dim, keepdim=True)


def linear(module, x: torch.Tensor) -> torch.Tensor:
    """The projection's own matrix and bias, without the hooks the scheme puts on it."""
    return F.linear(x, module.weight, module.bias)


def attention(attn, h, mem, causal: bool) -> torch.Tensor:
    """nGPT's attention (model.py Block.forward) with fairseq's projections: each head's q and k at
    unit length times s_qk, softmax scale sqrt(d_h); keys and values from ``mem`` (cross-attention)
    or from h."""
    t, b, d = h.shape
    heads, dh = attn.num_heads, attn.head_dim
    src = h if mem is None else mem
    sqk = (attn.qk_sphere.scale.weight * (1.0 * math.sqrt(d))).view(heads, dh)

    def split(y):
        return y.reshape(y.shape[0], b, heads, dh).permute(1, 2, 0, 3)  # (b, heads, len, dh)

    q = sqk[None, :, None, :] * justnorm(split(linear(attn.q_proj, h)))
    k = sqk[None, :, None, :] * justnorm(split(linear(attn.k_proj, src)))
    v = split(linear(attn.v_proj, src))
    scores = q @ k.transpose(-1, -2) * math.sqrt(dh)
    if causal:
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    y = scores.softmax(-1) @ v  # (b, heads, t, dh)
    return linear(attn.out_proj, y.permute(2, 0, 1, 3).reshape(t, b, d))


def step(h, branch, alpha_module, d: int) -> torch.Tensor:
    """h <- Norm(A + lr * (B - A)), A = Norm(h), B = Norm(branch), lr = |alpha * 0.05 / base_scale|."""
    lr = (alpha_module.weight * (0.05 * math.sqrt(d))).abs()
    a, b = justnorm(h), justnorm(branch)
    return justnorm(a + lr * (b - a))


def ngpt_layer(layer, h, mem=None) -> torch.Tensor:
    """One encoder (mem None) or decoder layer as nGPT's Block, the decoder's cross-attention the
    same rule on the encoder's output."""
    d = h.shape[-1]
    h = step(h, attention(layer.self_attn, h, None, causal=mem is not None), layer.self_attn_gain.alpha, d)
    if mem is not None:
        h = step(h, attention(layer.encoder_attn, h, mem, causal=False), layer.encoder_attn_gain.alpha, d)
    suv = layer.ffn_scale.scale.weight * (1.0 * math.sqrt(d))
    h_mlp = linear(layer.fc2, F.relu(suv * linear(layer.fc1, h)))
    return step(h, h_mlp, layer.final_gain.alpha, d)


@pytest.fixture(scope="module")
def ngpt(tiny_task):
    model = build(tiny_task, "ngpt").double().eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # the learned scales off their initial constants
        for name, p in model.named_parameters():
            if name.endswith(("alpha.weight", "scale.weight")):
                p.mul_(1 + 0.3 * torch.rand(p.shape, generator=g, dtype=p.dtype))
    return model


def test_ngpt_layers_are_the_authors_block(ngpt):
    g = torch.Generator().manual_seed(1)
    x = justnorm(torch.randn(5, 2, 16, generator=g, dtype=torch.float64))
    mem = justnorm(torch.randn(6, 2, 16, generator=g, dtype=torch.float64))
    causal = ngpt.decoder.buffered_future_mask(x)
    for depth in (1, 2, 4):
        enc, dec = ngpt.encoder.layers[depth - 1], ngpt.decoder.layers[depth - 1]
        torch.testing.assert_close(enc(x, None), ngpt_layer(enc, x), rtol=1e-6, atol=1e-6)
        got = dec(x, mem, None, self_attn_mask=causal)[0]
        torch.testing.assert_close(got, ngpt_layer(dec, x, mem), rtol=1e-6, atol=1e-6)
        assert torch.allclose(got.norm(dim=-1), torch.ones(5, 2, dtype=torch.float64))


def test_ngpt_embeddings_and_logits(ngpt, tiny_batch):
    """h0 = Norm(sqrt(d) e + positions) (the sphere's rule on fairseq's embedding), the decoder's
    output on the sphere (no final norm), logits s_z * cos(h, e_w) (model.py GPT.forward)."""
    src, lengths, prev, _ = tiny_batch
    enc = ngpt.encoder
    x, _ = enc.forward_embedding(src)
    raw = enc.embed_scale * enc.embed_tokens(src) + enc.embed_positions(src)
    real = src.ne(enc.padding_idx)  # padding: a zero vector, left at zero
    torch.testing.assert_close(x[real], justnorm(raw)[real])
    assert not x[~real].any()
    out = ngpt.encoder(src, lengths)
    features, _ = ngpt.decoder(prev, encoder_out=out, features_only=True)
    assert torch.allclose(features.norm(dim=-1), torch.ones_like(features[..., 0]))
    logits, _ = ngpt.decoder(prev, encoder_out=out)
    table = ngpt.decoder.output_projection.weight
    sz = ngpt.decoder.logit_scale.scale.weight * (1.0 * math.sqrt(16))
    torch.testing.assert_close(logits, sz * (features @ table.T))
    assert ngpt.encoder.layer_norm is None and ngpt.decoder.layer_norm is None


def test_ngpt_starts_where_the_authors_do(tiny_task):
    from lnexp.model.sphere import sphere_weights

    model = build(tiny_task, "ngpt")
    d = 16
    layer = model.decoder.layers[0]
    for module in (layer.self_attn_gain, layer.encoder_attn_gain, layer.final_gain):
        torch.testing.assert_close(module.alpha(), torch.full((d,), 0.05))  # eigen lr 0.05
        torch.testing.assert_close(module.alpha.weight, torch.full((d,), d ** -0.5))  # stored at base_scale
    torch.testing.assert_close(layer.self_attn.qk_sphere.scale(), torch.ones(d))
    torch.testing.assert_close(layer.ffn_scale.scale() * layer.ffn_scale.factor, torch.full((32,), d ** 0.5))
    vocab = model.decoder.output_projection.out_features
    torch.testing.assert_close(model.decoder.logit_scale.scale(), torch.ones(vocab))
    shapes = []
    for p, dim in sphere_weights(model):
        lengths = p.norm(dim=dim)
        nonzero = lengths > 0  # fairseq's padding embedding is zero and stays so
        torch.testing.assert_close(lengths[nonzero], torch.ones_like(lengths[nonzero]))
        shapes.append(tuple(p.shape))
    # one shared table, then q, k, v, out (x2 in the decoder), fc1, fc2 per layer
    assert len(shapes) == 1 + 4 * 6 + 4 * 10
    biases = [p for n, p in model.named_parameters()
              if n.endswith(("proj.bias", "fc1.bias", "fc2.bias")) and "output_projection" not in n]
    assert biases and all(not p.requires_grad and not p.any() for p in biases)


def test_ngpt_renormalises_after_each_update(tiny_task, tiny_batch):
    """An Adam step moves the matrices off the sphere; the model's after_update (the trainer's hook,
    fairseq_adapter.train_step) puts them back, and nothing else changes."""
    from lnexp.model.sphere import sphere_weights

    model = build(tiny_task, "ngpt")
    src, lengths, prev, target = tiny_batch
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    logits, _ = model(src, lengths, prev)
    F.cross_entropy(logits.transpose(1, 2), target).backward()
    opt.step()
    moved = [p.norm(dim=dim).sub(1).abs().max() for p, dim in sphere_weights(model)]
    assert max(moved) > 1e-3
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.after_update()
    for p, dim in sphere_weights(model):
        lengths_ = p.norm(dim=dim)
        assert torch.allclose(lengths_[lengths_ > 0], torch.ones(1), atol=1e-6)
    on_sphere = {id(p) for p, _ in sphere_weights(model)}
    for n, p in model.named_parameters():
        if id(p) not in on_sphere:
            assert torch.equal(p, before[n]), n


@pytest.mark.parametrize("overrides, needle", [
    (["placement=ngpt", "norm=rmsnorm"], "would change nothing: drop norm=rmsnorm"),
    (["placement=ngpt", "placement.sum_norm=false"], "set sum_norm=true"),
    (["placement=pre_ln", "placement.qk_norm=true", "placement.qk_norm_form=sphere"], "set sphere=true"),
    (["placement=ngpt", "placement.sphere_alpha0=0"], "sphere_alpha0=0 must be a number in (0, 1]"),
])
def test_ngpt_bad_combinations_are_one_line_errors(overrides, needle):
    from lnexp.config import compose
    from lnexp.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)
