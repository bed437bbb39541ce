"""ln_transformer against fairseq's own Transformer, and each option changing only what it claims."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import tiny_args


def build(task, arch: str, seed: int = 0, **over):
    from fairseq.models import ARCH_MODEL_REGISTRY

    torch.manual_seed(seed)
    return ARCH_MODEL_REGISTRY[arch].build_model(tiny_args(arch, **over), task)


def loss_and_grads(model, batch):
    src, lengths, prev, target = batch
    model.train()
    model.zero_grad()
    logits, _ = model(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach(), grads


@pytest.mark.parametrize("placement,before", [("post_ln", False), ("pre_ln", True)])
def test_post_and_pre_ln_equal_fairseq_stock(tiny_task, tiny_batch, placement, before):
    stock = build(tiny_task, "transformer", encoder_normalize_before=before,
                  decoder_normalize_before=before)
    ours = build(tiny_task, "ln_transformer", placement=placement)
    # Same names, same random draws: the state dicts are identical without copying anything.
    s_stock, s_ours = stock.state_dict(), ours.state_dict()
    assert s_stock.keys() == s_ours.keys()
    for k in s_stock:
        assert torch.equal(s_stock[k], s_ours[k]), k
    out_s, g_s = loss_and_grads(stock, tiny_batch)
    out_o, g_o = loss_and_grads(ours, tiny_batch)
    torch.testing.assert_close(out_o, out_s, atol=1e-6, rtol=0)
    assert g_s.keys() == g_o.keys()
    for k in g_s:
        torch.testing.assert_close(g_o[k], g_s[k], atol=1e-6, rtol=0, msg=k)


def test_stock_checkpoint_loads_into_ln_transformer(tiny_task, tiny_batch):
    stock = build(tiny_task, "transformer", seed=1, encoder_normalize_before=True,
                  decoder_normalize_before=True, dropout=0.1)
    ours = build(tiny_task, "ln_transformer", seed=2, placement="pre_ln", dropout=0.1)
    ours.load_state_dict(stock.state_dict())
    stock.eval(), ours.eval()
    src, lengths, prev, _ = tiny_batch
    torch.testing.assert_close(ours(src, lengths, prev)[0], stock(src, lengths, prev)[0],
                               atol=1e-6, rtol=0)


def norm_names(model) -> set[str]:
    return {n for n, m in model.named_modules()
            if isinstance(m, torch.nn.LayerNorm | torch.nn.RMSNorm)}


def test_peri_ln_adds_exactly_one_output_norm_per_sublayer(tiny_task, tiny_batch):
    pre = build(tiny_task, "ln_transformer", placement="pre_ln")
    peri = build(tiny_task, "ln_transformer", placement="peri_ln")
    extra = norm_names(peri) - norm_names(pre)
    # 2 encoder layers x 2 sub-layers + 2 decoder layers x 3 sub-layers
    assert len(extra) == 2 * 2 + 2 * 3
    assert all(n.endswith("out_norm") for n in extra)
    assert norm_names(pre) <= norm_names(peri)
    assert all(p.requires_grad for n, p in peri.named_parameters() if "out_norm" in n)
    # With every output norm replaced by the identity, Peri-LN computes Pre-LN exactly.
    for name in extra:
        parent, attr = name.rsplit(".", 1)
        setattr(peri.get_submodule(parent), attr, torch.nn.Identity())
    peri.load_state_dict(pre.state_dict())
    out_pre, _ = loss_and_grads(pre, tiny_batch)
    out_peri, _ = loss_and_grads(peri, tiny_batch)
    torch.testing.assert_close(out_peri, out_pre, atol=1e-6, rtol=0)


def test_peri_ln_embedding_norm_option(tiny_task):
    with_emb = build(tiny_task, "ln_transformer", placement="peri_ln", embed_norm=True)
    without = build(tiny_task, "ln_transformer", placement="peri_ln")
    assert norm_names(with_emb) - norm_names(without) == {
        "encoder.layernorm_embedding", "decoder.layernorm_embedding"}


def test_peri_ln_output_norm_bounds_sublayer_output(tiny_task):
    """LN_out makes each sub-layer's contribution unit-RMS whatever the weights' scale."""
    from lnexp.model.layers import LNEncoderLayer

    peri = build(tiny_task, "ln_transformer", placement="peri_ln").encoder.layers[0]
    assert isinstance(peri, LNEncoderLayer)
    with torch.no_grad():
        peri.fc2.weight.mul_(1000.0)
    peri.eval()
    x = torch.randn(5, 2, 16)
    h = peri.final_out_norm(peri._ffn(peri.final_layer_norm(x)))
    assert h.pow(2).mean(-1).sqrt().max() < 1.5


def test_deepnorm_constants_and_residual_weight(tiny_task, tiny_batch):
    from lnexp.model import deepnorm_constants

    c = deepnorm_constants(6, 6)
    assert c["encoder"][0] == pytest.approx(0.81 * (6**5) ** (1 / 16))
    assert c["decoder"] == pytest.approx(((18) ** 0.25, (72) ** -0.25))
    deep = build(tiny_task, "ln_transformer", placement="deepnorm")
    post = build(tiny_task, "ln_transformer", placement="post_ln")
    assert norm_names(deep) == norm_names(post)
    enc_alpha, enc_beta = deepnorm_constants(2, 2)["encoder"]
    assert deep.encoder.layers[0].spec.alpha == pytest.approx(enc_alpha)
    # beta scales exactly the FFN, value and output projections (Xavier-normal std * beta)
    layer = deep.encoder.layers[0]
    fan = layer.fc1.in_features + layer.fc1.out_features
    expected = enc_beta * math.sqrt(2.0 / fan)
    assert layer.fc1.weight.std().item() == pytest.approx(expected, rel=0.25)
    # With alpha forced to 1 and Post-LN's weights, DeepNorm computes Post-LN exactly.
    from dataclasses import replace

    for stack in (deep.encoder, deep.decoder):
        for lay in stack.layers:
            lay.spec = replace(lay.spec, alpha=1.0)
    deep.load_state_dict(post.state_dict())
    torch.testing.assert_close(loss_and_grads(deep, tiny_batch)[0],
                               loss_and_grads(post, tiny_batch)[0], atol=1e-6, rtol=0)


def test_rmsnorm_replaces_every_norm_and_matches_formula(tiny_task, tiny_batch):
    from lnexp.model.norms import rms_norm_reference

    ln = build(tiny_task, "ln_transformer", placement="peri_ln")
    rms = build(tiny_task, "ln_transformer", placement="peri_ln", norm="rmsnorm")
    rms_modules = {n for n, m in rms.named_modules() if isinstance(m, torch.nn.RMSNorm)}
    assert rms_modules == norm_names(ln)
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in rms.modules())
    # Only the norms' biases disappear: every other parameter is the same, drawn identically.
    p_ln, p_rms = dict(ln.named_parameters()), dict(rms.named_parameters())
    assert set(p_ln) - set(p_rms) == {n for n in p_ln if n.endswith(".bias") and
                                       n.rsplit(".", 1)[0] in rms_modules}
    for k, v in p_rms.items():
        if k.rsplit(".", 1)[0] not in rms_modules:
            assert torch.equal(v, p_ln[k]), k
    m = next(m for m in rms.modules() if isinstance(m, torch.nn.RMSNorm))
    x = torch.randn(4, 16) * 3 + 1
    torch.testing.assert_close(m(x), rms_norm_reference(x, m.weight), atol=1e-6, rtol=1e-6)
    loss_and_grads(rms, tiny_batch)  # trains end to end


@pytest.mark.parametrize("placement", ["post_ln", "pre_ln", "peri_ln", "deepnorm"])
def test_residual_scale_is_the_only_change(tiny_task, tiny_batch, placement):
    one = build(tiny_task, "ln_transformer", placement=placement)
    same = build(tiny_task, "ln_transformer", placement=placement, residual_scale=1.0)
    small = build(tiny_task, "ln_transformer", placement=placement, residual_scale=0.1)
    assert one.state_dict().keys() == small.state_dict().keys()
    for k, v in one.state_dict().items():
        assert torch.equal(v, small.state_dict()[k]), k
    torch.testing.assert_close(loss_and_grads(same, tiny_batch)[0],
                               loss_and_grads(one, tiny_batch)[0], atol=0, rtol=0)
    assert not torch.allclose(loss_and_grads(small, tiny_batch)[0],
                              loss_and_grads(one, tiny_batch)[0])


def test_residual_scale_zero_makes_pre_ln_layers_identity(tiny_task, tiny_batch):
    """x + 0*F(LN(x)) = x: the encoder output is then the final LN of the embeddings."""
    model = build(tiny_task, "ln_transformer", placement="pre_ln", residual_scale=0.0)
    model.eval()
    src, lengths, _, _ = tiny_batch
    enc = model.encoder
    x, _ = enc.forward_embedding(src)
    expected = enc.layer_norm(x.transpose(0, 1))
    out = enc(src, lengths)["encoder_out"][0]
    mask = (src != 1).transpose(0, 1).unsqueeze(-1)
    torch.testing.assert_close(out * mask, expected * mask, atol=1e-6, rtol=0)


def test_architectures_have_paper_sizes():
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    import lnexp.model  # noqa: F401
    from tests.conftest import tiny_args as _  # noqa: F401

    def arch(name):
        a = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[name](a)
        return a

    iwslt = arch("ln_transformer_iwslt_de_en")
    assert (iwslt.encoder_layers, iwslt.encoder_embed_dim, iwslt.encoder_ffn_embed_dim,
            iwslt.encoder_attention_heads) == (6, 512, 1024, 4)
    wmt = arch("ln_transformer_wmt_en_de")
    assert (wmt.encoder_embed_dim, wmt.encoder_ffn_embed_dim, wmt.encoder_attention_heads) == (
        512, 2048, 8)
    mini = arch("ln_transformer_mini")
    assert (mini.decoder_layers, mini.decoder_embed_dim, mini.decoder_ffn_embed_dim,
            mini.decoder_attention_heads) == (6, 128, 512, 4)


def test_arch_sizes_table_is_what_fairseq_builds():
    """lnexp.names.ARCH_SIZES (read by settings.stock_flags and the report) is each registered
    architecture's real size, and the stock equivalent of the mini model has the same sizes."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    import lnexp.model  # noqa: F401
    from lnexp.names import ARCH_SIZES, arch_flags

    for name in ARCH_SIZES:
        a = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[name](a)
        assert {k: getattr(a, k) for k in arch_flags(name)} == arch_flags(name), name
    stock = argparse.Namespace(**arch_flags("ln_transformer_mini", layers=False))
    ARCH_CONFIG_REGISTRY["transformer"](stock)
    assert {k: getattr(stock, k) for k in arch_flags("ln_transformer_mini")} == \
        arch_flags("ln_transformer_mini")
