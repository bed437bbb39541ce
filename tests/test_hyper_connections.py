"""Hyper-connections (Zhu et al. 2024) and mHC (Xie et al. 2025): n residual streams mixed by learned
weights (lnexp/model/connections.py). Each stack is its papers' formula (tests/test_zoo.py
streams_reference, float64) and the reference package's modules (lucidrains/hyper-connections
0.4.11, the dev extra) given the same parameters; at initialisation hyper-connections are Pre-LN.
Gradients, incremental decoding, the paper's size and lnexp train/evaluate: tests/test_zoo.py's ZOO."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_args
from tests.test_zoo import (
    DEC,
    ENC,
    _layer_inputs,
    _unpadded_batch,
    float64,  # noqa: F401  (the fixture)
    norm,
    streams_reference,
    sublayers,
)

SCHEMES = ("hyper_connections", "mhc")


def build_with(task, placement: str, seed: int = 3, **keys):
    """The scheme's YAML with ``keys`` changed (streams, dynamic), N+M = 3+2 layers."""
    from types import SimpleNamespace

    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.scheme import placement_of

    spec = replace(placement_of(SimpleNamespace(placement=placement)), **keys)
    torch.manual_seed(seed)
    args = tiny_args("ln_transformer", placement=placement, placement_spec=spec.to_json(),
                     encoder_layers=ENC, decoder_layers=DEC)
    return ARCH_MODEL_REGISTRY["ln_transformer"].build_model(args, task)


def randomise_(model, seed: int = 2):
    """Every connection weight, norm gain and bias moved off its initial value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".connections." in name or "norm" in name or name.endswith("bias"):
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype) + 0.1)
    return model.eval()


def _inputs(model):
    """The stacks' first layers' inputs (T x B x d, captured from a forward), the source tokens and
    the previous output tokens."""
    src, prev = _unpadded_batch()
    x_enc, x_dec = _layer_inputs(model, src, prev)
    return x_enc, x_dec, src, prev


def _outputs(model, src, prev):
    enc = model.encoder(src, torch.full((src.shape[0],), src.shape[1]))
    return enc["encoder_out"][0], model.decoder.extract_features(prev, encoder_out=enc)[0].transpose(0, 1)


def papers_stack(module, x, mem=None):
    """A stack as the papers write it: n copies of its input, each layer's connections
    (streams_reference), the final norm of the streams' sum."""
    streams = [x] * module.layers[0].spec.scheme.streams
    for layer in module.layers:
        streams = streams_reference(layer, streams, mem)
    return norm(module.layer_norm.norm, sum(streams))


@pytest.mark.parametrize("placement,dynamic", [("hyper_connections", True), ("hyper_connections", False),
                                               ("mhc", True), ("mhc", False)])
@pytest.mark.usefixtures("float64")
def test_each_stack_is_the_papers_formula(tiny_task, placement, dynamic):
    model = randomise_(build_with(tiny_task, placement, dynamic=dynamic))
    x_enc, x_dec, src, prev = _inputs(model)
    enc, dec = _outputs(model, src, prev)
    enc_ref = papers_stack(model.encoder, x_enc)
    torch.testing.assert_close(enc, enc_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dec, papers_stack(model.decoder, x_dec, enc_ref), rtol=1e-12, atol=1e-12)


def _package_part(ours, index: int):
    """The package's module for one sub-layer (its ``index`` in the stack), at its own init."""
    from hyper_connections import HyperConnections, ManifoldConstrainedHyperConnections

    kind = ManifoldConstrainedHyperConnections if ours.manifold else HyperConnections
    return kind(ours.streams, dim=DIM, layer_index=index).double()


DIM = 16  # tiny_args' embedding size


def _package_init(pkg, ours) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(ours, the package's) for each initial value both have."""
    pairs = {"static_alpha": (ours.static_alpha, pkg.static_alpha),
             "static_beta": (ours.static_beta, pkg.static_beta)}
    if ours.dynamic:
        pairs |= {"norm_gain": (ours.norm_gain, pkg.norm.gamma),
                  "dynamic_beta": (ours.dynamic_beta, pkg.dynamic_beta_fn),
                  "dynamic_alpha": (ours.dynamic_alpha,
                                    pkg.dynamic_alpha_fn.reshape(ours.dynamic_alpha.shape))}
        if ours.manifold:
            pairs |= {"alpha_scale": (ours.alpha_scale,
                                      torch.cat((pkg.pre_branch_scale, pkg.residual_scale))),
                      "beta_scale": (ours.beta_scale, pkg.h_post_scale)}
        else:
            pairs |= {"alpha_scale": (ours.alpha_scale, pkg.dynamic_alpha_scale),
                      "beta_scale": (ours.beta_scale, pkg.dynamic_beta_scale)}
    return pairs


def _copy_into(pkg, ours) -> None:
    """Our parameters into the package's module (its names); without ``dynamic`` its dynamic
    terms are switched off by zero scales."""
    with torch.no_grad():
        pkg.static_alpha.copy_(ours.static_alpha)
        pkg.static_beta.copy_(ours.static_beta)
        if not ours.dynamic:
            for name in ("dynamic_alpha_scale", "dynamic_beta_scale", "pre_branch_scale",
                         "residual_scale", "h_post_scale"):
                if hasattr(pkg, name):
                    getattr(pkg, name).zero_()
            return
        pkg.norm.gamma.copy_(ours.norm_gain)
        pkg.dynamic_beta_fn.copy_(ours.dynamic_beta)
        pkg.dynamic_alpha_fn.copy_(ours.dynamic_alpha.reshape(pkg.dynamic_alpha_fn.shape))
        if ours.manifold:
            pkg.pre_branch_scale.copy_(ours.alpha_scale[:1])
            pkg.residual_scale.copy_(ours.alpha_scale[1:])
            pkg.h_post_scale.copy_(ours.beta_scale)
        else:
            pkg.dynamic_alpha_scale.copy_(ours.alpha_scale)
            pkg.dynamic_beta_scale.copy_(ours.beta_scale)


def package_stack(module, x, mem=None):
    """A stack through the package: its expand, for each sub-layer its module (our parameters)
    giving the branch input and taking the branch back, its reduce, the final norm. The package's
    layout is batch-first with the streams in the batch ((b s) t d)."""
    from hyper_connections import get_init_and_expand_reduce_stream_functions

    n = module.layers[0].spec.scheme.streams
    _, expand, reduce = get_init_and_expand_reduce_stream_functions(n, disable=False)
    residual, index = expand(x.transpose(0, 1)), 0
    for layer in module.layers:
        for name, f in sublayers(layer, mem):
            pkg = _package_part(layer.connections[name], index)
            _copy_into(pkg, layer.connections[name])
            index += 1
            h, add = pkg(residual)
            y = f(norm(getattr(layer, f"{name}_layer_norm"), h.transpose(0, 1)))
            residual = add(y.transpose(0, 1))
    return norm(module.layer_norm.norm, reduce(residual).transpose(0, 1))


@pytest.mark.parametrize("placement,dynamic", [("hyper_connections", True), ("hyper_connections", False),
                                               ("mhc", True)])
@pytest.mark.usefixtures("float64")
def test_each_stack_is_the_reference_packages(tiny_task, monkeypatch, placement, dynamic):
    """lucidrains/hyper-connections 0.4.11: every sub-layer's initial values are the package's
    (HyperConnections / ManifoldConstrainedHyperConnections with layer_index = the sub-layer's
    place in its stack), and with the same (randomised) values both stacks agree to float64
    rounding. The package takes mHC's weights in float32 (.float()); here .float() keeps float64."""
    pytest.importorskip("hyper_connections")
    monkeypatch.setattr(torch.Tensor, "float",
                        lambda self: self if self.dtype == torch.float64 else self.to(torch.float32))
    model = build_with(tiny_task, placement, dynamic=dynamic)
    for stack in (model.encoder, model.decoder):
        parts = [layer.connections[name] for layer in stack.layers for name in layer.sublayer_names()]
        for index, ours in enumerate(parts):
            for key, (a, b) in _package_init(_package_part(ours, index), ours).items():
                assert a.shape == b.shape and torch.equal(a.detach(), b.detach()), (index, key)
    randomise_(model)
    x_enc, x_dec, src, prev = _inputs(model)
    enc, dec = _outputs(model, src, prev)
    enc_ref = package_stack(model.encoder, x_enc)
    torch.testing.assert_close(enc, enc_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dec, package_stack(model.decoder, x_dec, enc_ref), rtol=1e-12, atol=1e-12)


def _logits(model, seed: int = 4):
    g = torch.Generator().manual_seed(seed)
    src, prev = torch.randint(4, 40, (2, 6), generator=g), torch.randint(4, 40, (2, 5), generator=g)
    prev[:, 0] = 2
    return model.eval()(src, torch.full((2,), 6), prev)[0]


@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.usefixtures("float64")
def test_at_init_hyper_connections_are_pre_ln(tiny_task, dynamic):
    """Zhu et al.'s init (A_m one-hot, A_r = I, B = 1, dynamic W = 0) is Pre-LN's network: with
    n = 1 exactly (h = x, x <- x + F(LN(x))); with n = 4 the streams stay equal, their sum is n
    times Pre-LN's x, which the final LN undoes up to its eps. Same seed, same fairseq draws."""
    pre_ln = _logits(build_with(tiny_task, "pre_ln"))
    one = _logits(build_with(tiny_task, "hyper_connections", streams=1, dynamic=dynamic))
    torch.testing.assert_close(one, pre_ln, rtol=1e-12, atol=1e-12)
    four = _logits(build_with(tiny_task, "hyper_connections", dynamic=dynamic))
    torch.testing.assert_close(four, pre_ln, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(four, pre_ln, rtol=1e-12, atol=1e-12)  # the eps: not bit for bit


@pytest.mark.usefixtures("float64")
def test_at_init_mhc_with_one_stream_is_pre_ln_with_its_branches_scaled(tiny_task):
    """mHC's constraints move the init off Pre-LN: with n = 1, H_pre = sigmoid(1) (which LN(h)
    undoes up to its eps), H_res = 1 (the only 1 x 1 doubly-stochastic matrix), H_post =
    2 sigmoid(1): x <- x + 2 sigmoid(1) F(LN(x)), Pre-LN with the residual step dt = 2 sigmoid(1)."""
    from types import SimpleNamespace

    from fairseq.models import ARCH_MODEL_REGISTRY

    from lnexp.scheme import placement_of

    torch.manual_seed(3)
    args = tiny_args("ln_transformer", placement="pre_ln", encoder_layers=ENC, decoder_layers=DEC,
                     placement_spec=placement_of(SimpleNamespace(placement="pre_ln")).to_json(),
                     residual_scale=2 / (1 + math.exp(-1)))
    scaled = _logits(ARCH_MODEL_REGISTRY["ln_transformer"].build_model(args, tiny_task))
    mhc = _logits(build_with(tiny_task, "mhc", streams=1))
    torch.testing.assert_close(mhc, scaled, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("placement", SCHEMES)
def test_connections_are_parameters_after_fairseqs_and_draw_nothing(tiny_task, tiny_batch, placement):
    """Each sub-layer's connections are the layer's parameters, after fairseq's own (which keep
    Pre-LN's values at the same seed: nothing here draws a random number); the optimizer sees them
    and the loss reaches them."""
    model, pre_ln = build_with(tiny_task, placement), build_with(tiny_task, "pre_ln")
    ours, theirs = model.state_dict(), pre_ln.state_dict()
    for key, value in theirs.items():  # the final norm sits in the stack's join
        torch.testing.assert_close(ours[key.replace("layer_norm.", "layer_norm.norm.")
                                        if key.count(".") == 2 else key], value, rtol=0, atol=0)
    layer = model.decoder.layers[1]
    names = [n for n, _ in layer.named_parameters()]
    first = next(i for i, n in enumerate(names) if n.startswith("connections."))
    assert all(n.startswith("connections.") for n in names[first:])
    parts = [m for m in model.modules() if hasattr(m, "static_alpha")]
    assert len(parts) == 2 * ENC + 3 * DEC and all(p.streams == 4 and p.dynamic for p in parts)
    assert [p.static_alpha[:, 0].argmax().item() for p in parts[:2 * ENC]] == [i % 4 for i in range(2 * ENC)]
    src, lengths, prev, target = tiny_batch
    F.cross_entropy(model(src, lengths, prev)[0].transpose(1, 2), target).backward()
    for part in parts:
        for name in ("static_alpha", "static_beta", "dynamic_alpha", "dynamic_beta"):
            grad = getattr(part, name).grad
            assert grad is not None and grad.abs().sum() > 0, name


def test_mhc_weights_lie_on_its_manifold(tiny_task):
    """For any streams: H_res doubly stochastic (rows and columns sum to 1, entries > 0), H_pre in
    (0, 1), H_post in (0, 2); hyper-connections' unconstrained weights are not."""
    g = torch.Generator().manual_seed(0)
    streams = torch.randn(5, 2, 4, 16, generator=g) * 3
    for placement in SCHEMES:
        model = randomise_(build_with(tiny_task, placement))
        alpha, beta = model.encoder.layers[1].connections["final"].weights(streams)
        assert alpha.shape == (5, 2, 4, 5) and beta.shape == (5, 2, 4)
        res = alpha[..., 1:]
        stochastic = bool(torch.allclose(res.sum(-1), torch.ones(5, 2, 4), atol=1e-6)
                          and torch.allclose(res.sum(-2), torch.ones(5, 2, 4), atol=1e-6))
        assert stochastic == (placement == "mhc")
        if placement == "mhc":
            assert (res > 0).all() and ((alpha[..., 0] > 0) & (alpha[..., 0] < 1)).all()
            assert ((beta > 0) & (beta < 2)).all()
