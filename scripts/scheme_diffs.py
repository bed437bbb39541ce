"""How far each scheme rebuilt as its authors' network (issue 36) moved from lnexp's earlier one.

For each changed scheme: the earlier network (its earlier YAML, written here as the new one with
the earlier values) and the new one are built at one seed in float64 (6+6 layers, d=32, FFN 64, 4
heads), the new one's norm gains and biases, gates, head and QK scales moved off their initial
values; the earlier one gets the same weights (where it has the same parameter; ReZero's shared
gate fills each sub-layer gate). Printed: the largest difference of the logits on one batch with
the same weights, and at init (each network its own init at that seed, before the moves), and
the init ratios (new / earlier, at the same seed: |W_new| / |W_old| per matrix, which is the exact
factor where one is a multiple of the other).

    PYTHONPATH=. python scripts/scheme_diffs.py
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import torch

LAYERS, DIM, FFN, HEADS, VOCAB = 6, 32, 64, 4, 40


def task():
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(VOCAB):
        d.add_symbol(f"w{i}")
    return SimpleNamespace(source_dictionary=d, target_dictionary=d)


def build(placement, seed: int = 3):
    """ln_transformer with ``placement`` (a lnexp.scheme.Placement) in float64."""
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    import lnexp.model  # noqa: F401  (registers ln_transformer)

    sizes = dict(encoder_embed_dim=DIM, decoder_embed_dim=DIM, encoder_ffn_embed_dim=FFN,
                 decoder_ffn_embed_dim=FFN, encoder_attention_heads=HEADS,
                 decoder_attention_heads=HEADS, encoder_layers=LAYERS, decoder_layers=LAYERS,
                 dropout=0.0)
    argv = ["/nonexistent", "--arch", "ln_transformer", "--share-all-embeddings",
            "--placement-spec", placement.to_json()]
    for k, v in sizes.items():
        argv += ["--" + k.replace("_", "-"), str(v)]
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return ARCH_MODEL_REGISTRY["ln_transformer"].build_model(args, task()).eval()
    finally:
        torch.set_default_dtype(before)


def earlier(name: str):
    """(new placement, earlier placement) of a changed scheme."""
    from lnexp.scheme import placement_of

    def of(n):
        return placement_of(SimpleNamespace(placement=n))

    new = of(name)
    old = {
        "hybridnorm": lambda: replace(new, final_norm=False, sublayers={"ffn": {"sum_norm": True}}),
        "sub_ln": lambda: replace(new, sublayers=None, init=replace(new.init, bias=False)),
        "t_fixup": lambda: replace(new, init=replace(new.init, plain_xavier=(),
                                                     embed_gain="t_fixup_embed")),
        "b2t": lambda: of("b2t_noinit"),
        "rezero": lambda: of("rezero_per_sublayer"),
        "normformer": lambda: replace(new, sublayers={"attention": {"output_norm": True},
                                                      "ffn": {"inner_norm": True}}),
        "qk_norm": lambda: of("qk_layernorm"),
    }[name]()
    return new, old


def randomise_(model, seed: int = 2) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or n.endswith(("_gate", "head_scale", "bias")):
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype) + 0.1)


def same_weights_(old, new) -> None:
    """``new``'s values in ``old`` wherever the parameter is the same; a shared gate in each of the
    layer's per-sub-layer gates."""
    state = dict(new.state_dict())
    for key in list(state):
        if key.endswith("layer_gate"):
            for sub in ("self_attn", "encoder_attn", "final"):
                state[key.replace("layer_gate", f"{sub}_gate")] = state[key]
    mine = old.state_dict()
    old.load_state_dict({k: state.get(k, v) if state.get(k, v).shape == v.shape else v
                         for k, v in mine.items()})


def logits(model):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (3, 7), generator=g)
    prev = torch.randint(4, VOCAB, (3, 6), generator=g)
    prev[:, 0] = 2
    import fairseq.utils

    softmax = fairseq.utils.softmax
    fairseq.utils.softmax = lambda x, dim, onnx_trace=False: torch.softmax(x, dim=dim)
    try:
        with torch.no_grad():
            return model(src, torch.full((3,), 7), prev)[0]
    finally:
        fairseq.utils.softmax = softmax


def init_ratios(new, old) -> list[str]:
    """|W_new| / |W_old| for every parameter of both that the init changed, grouped by stack and
    matrix (one value when all layers agree)."""
    s_old = old.state_dict()
    groups: dict[str, set[float]] = {}
    for key, w in new.state_dict().items():
        if key not in s_old or torch.equal(w, s_old[key]):
            continue
        base = s_old[key].norm().item()
        ratio = w.norm().item() / base if base else math.inf
        parts = key.split(".")
        where = f"{parts[0]}.{'.'.join(parts[3:])}" if parts[1] == "layers" else key
        groups.setdefault(where, set()).add(round(ratio, 4))
    return [f"{k}: x{'/'.join(str(r) for r in sorted(v))}" for k, v in sorted(groups.items())]


def main() -> None:
    for name in ("hybridnorm", "sub_ln", "t_fixup", "b2t", "rezero", "normformer", "qk_norm"):
        new_p, old_p = earlier(name)
        new, old = build(new_p), build(old_p)
        ratios = init_ratios(new, old)
        at_init = (logits(new) - logits(old)).abs().max().item()
        randomise_(new)
        same_weights_(old, new)
        a, b = logits(new), logits(old)
        diff = (a - b).abs().max().item()
        print(f"{name}: logits max |new - earlier| = {diff:.3g} with the same weights (max |logit| "
              f"{a.abs().max().item():.3g}), {at_init:.3g} at init (each its own init, one seed); "
              f"float64, {LAYERS}+{LAYERS} layers, d={DIM}")
        for line in ratios or ["init: the same draws"]:
            print(f"    init {line}")


if __name__ == "__main__":
    main()
