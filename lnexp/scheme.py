"""Placement and norm as data: what ``configs/placement/NAME.yaml`` and ``configs/norm/NAME.yaml``
become, checked, torch-free (the CLI's start-up path validates them before anything is built).

The path of a scheme from its YAML to a layer, with no guessing through fairseq's parser:

    configs/placement/NAME.yaml over _base.yaml  --Placement.from_config-->  Placement (this module)
      --Placement.to_json-->  fairseq flag --placement-spec (lnexp/train/settings.py fairseq_flags)
      --placement_of(args)-->  Placement again, parsed once per process and spec
      --ResidualSpec.for_layer-->  each layer's ``spec`` (lnexp/model/placement.py): that one
      Placement and what the layer's place makes of it, read by the single ``residual_step``.

Checkpoints written before placements were data carry only ``--placement NAME`` (and
``--embed-norm``, ``--norm NAME``): :func:`placement_of` and :func:`norm_of` map those old arguments
onto the same YAML files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import cache, lru_cache
from typing import Any

from lnexp.names import CONFIG_DIR, option_files

# --- named formulas of depth -------------------------------------------------------------------
# Each takes (stack, l, N, M): "encoder"/"decoder", the 1-based layer index, the encoder's and the
# decoder's depth. A YAML value that is a string names one of these; a number is a constant.


def deepnorm_constants(enc_layers: int, dec_layers: int) -> dict[str, tuple[float, float]]:
    """DeepNet's (alpha, beta) for an N-layer encoder and M-layer decoder (Wang et al. 2022, Table 1)."""
    n, m = enc_layers, dec_layers
    return {
        "encoder": (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)),
        "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25),
    }


def t_fixup_gain(stack: str, n: int, m: int) -> float:
    """T-Fixup (Huang et al. 2020, Alg. 1): encoder 0.67 N^-1/4, decoder (9M)^-1/4."""
    return 0.67 * n ** -0.25 if stack == "encoder" else (9 * m) ** -0.25


FORMULAS: dict[str, Callable[[str, int, int, int], float]] = {
    "deepnorm_alpha": lambda s, layer, n, m: deepnorm_constants(n, m)[s][0],
    "deepnorm_beta": lambda s, layer, n, m: deepnorm_constants(n, m)[s][1],
    "inv_sqrt_layer": lambda s, layer, n, m: 1 / math.sqrt(layer),  # LayerNorm Scaling's 1/sqrt(l)
    "t_fixup": lambda s, layer, n, m: t_fixup_gain(s, n, m),
    # Magneto / Sub-LN, encoder-decoder (Wang et al. 2022, arXiv 2210.06423; torchscale subln):
    # encoder sqrt(log(3M) log(2N) / 3), decoder sqrt(log(3M))
    "subln_gain": lambda s, layer, n, m: math.sqrt(math.log(3 * m) * math.log(2 * n) / 3)
    if s == "encoder" else math.sqrt(math.log(3 * m)),
    # lnexp's earlier T-Fixup reading: every embedding table times the decoder's factor (9M)^-1/4
    "t_fixup_embed": lambda s, layer, n, m: (9 * m) ** -0.25,
    # T-Fixup as layer6ai-labs/T-Fixup builds it (fairseq/models/transformer.py TransformerEncoder and
    # TransformerDecoder __init__): each stack's table times (9N)^-1/4 (encoder), (9M)^-1/4 (decoder);
    # a shared table is scaled once, by the encoder
    "t_fixup_embedding": lambda s, layer, n, m: (9 * (n if s == "encoder" else m)) ** -0.25,
    # B2T (takase/b2t_connection, fairseq/modules/transformer_layer.py rescaling_init): the stack's
    # depth L^-1/2 on every non-LN weight of its layers
    "inv_sqrt_depth": lambda s, layer, n, m: (n if s == "encoder" else m) ** -0.5,
}


def evaluate(value: float | str, stack: str, layer: int, n: int, m: int) -> float:
    """A constant, or a named formula of depth at layer ``layer`` of ``stack``."""
    return float(value) if not isinstance(value, str) else FORMULAS[value](stack, layer, n, m)


# --- block structures: how a layer chains its residual steps -----------------------------------
# A structure's ``layer`` gets the layer's steps in order (self-attention, [cross-attention,] FFN),
# each a function step(x, skip) -> (x, branch) of lnexp.model.placement.residual_step (the new
# stream and the branch it added), the layer's input, ``stream``: a dict the stack empties at the
# start of each forward and its layers share, for what a structure carries from layer to layer, and
# ``parts``: each step's own module where the structure names ``parts`` (else None). Its ``join``, if
# any, makes the stack's output from the last layer's x, the stack's final norm and the stream. A
# scheme with new wiring is one entry here, named by its YAML's ``structure``.
Step = Callable[[Any, Any], tuple[Any, Any]]


@dataclass(frozen=True)
class Structure:
    layer: Callable[[list[Step], Any, dict, list[Any] | None], Any]
    join: Callable[[Any, Callable[[Any], Any], dict], Any] | None = None  # None: final_norm(x)
    # learned connections per sub-layer, built by the model side (lnexp/model/connections.py PARTS
    # under this name: this module stays torch-free); None: the structure has none
    parts: str | None = None


def residual_layer(steps: list[Step], x: Any, stream: dict, parts: list[Any] | None = None) -> Any:
    """The plain chain: x <- step(x) for each sub-layer."""
    for step in steps:
        x, _ = step(x, None)
    return x


def b2t_layer(steps: list[Step], x: Any, stream: dict, parts: list[Any] | None = None) -> Any:
    """B2T connection (Takase et al. 2022): the layer's input also joins its last residual sum,
    LN(y + FFN(y) + x)."""
    x0 = x
    for i, step in enumerate(steps):
        x, _ = step(x, x0 if i == len(steps) - 1 else None)
    return x


def resi_dual_layer(steps: list[Step], x: Any, stream: dict, parts: list[Any] | None = None) -> Any:
    """ResiDual (Xie et al. 2023): the Post-LN stream x <- LN(x + F(x)) goes on as the steps
    compute it; the dual stream d, which starts as the first layer's input (the embeddings), sums
    every branch: d <- d + F(x)."""
    if "dual" not in stream:
        stream["dual"] = x
    for step in steps:
        x, branch = step(x, None)
        stream["dual"] = stream["dual"] + branch
    return x


def resi_dual_join(x: Any, final_norm: Callable[[Any], Any], stream: dict) -> Any:
    """ResiDual's stack output: the Post-LN stream plus the normalised dual stream, x + LN(d)
    (taken out of the stream: nothing outlives the forward)."""
    return x + final_norm(stream.pop("dual"))


def streams_layer(steps: list[Step], x: Any, stream: dict, parts: list[Any] | None = None) -> Any:
    """Hyper-connections (Zhu et al. 2024) and mHC (Xie et al. 2025): n residual streams H, at the
    stack's first layer n copies of its input (the papers expand the embeddings). Each sub-layer's
    part mixes them into the branch input h (width connection), the Pre-LN step computes the branch
    y = F(Norm(h)) (its own sum h + y is not used), and the part writes y back into the streams,
    H <- A_r^T H + B y (depth connection). fairseq gets the streams' sum, which the next layer does
    not read: it reads the streams."""
    assert parts is not None and len(parts) == len(steps), "streams: one part per step"
    if "streams" not in stream:
        stream["streams"] = parts[0].expand(x)
    h_all = stream["streams"]
    for step, part in zip(steps, parts, strict=True):
        h, kept = part.width(h_all)
        _, y = step(h, None)
        h_all = part.depth(kept, y)
    stream["streams"] = h_all
    return parts[-1].reduce(h_all)


def streams_join(x: Any, final_norm: Callable[[Any], Any], stream: dict) -> Any:
    """The papers' stack output, Norm(sum_k H_k): the last layer's x is that sum (the streams leave
    the dict: nothing outlives the forward)."""
    stream.pop("streams", None)
    return final_norm(x)


STRUCTURES: dict[str, Structure] = {
    "residual": Structure(residual_layer),
    "b2t": Structure(b2t_layer),
    "resi_dual": Structure(resi_dual_layer, resi_dual_join),
    "hyper_connections": Structure(streams_layer, streams_join, parts="hyper_connections"),
    "mhc": Structure(streams_layer, streams_join, parts="mhc"),
}
# profiling passes a scheme's init can ask for (lnexp/model/admin.py runs them on a fresh run)
PROFILES = ("admin",)
MATRICES = ("fc1", "fc2", "q_proj", "k_proj", "v_proj", "out_proj")
DRAWS = ("fairseq", "xavier_normal")
SWITCHES = ("input_norm", "output_norm", "sum_norm", "inner_norm", "norm_residual")
# the sub-layer kinds a ``sublayers`` entry can name; cross_attention (the decoder's) takes the
# attention entry first, then its own
SUBLAYERS = ("attention", "cross_attention", "ffn")
# what a ``sublayers`` entry can set: the switches, NormFormer's head scale, and whether the scheme's
# init gain reaches that sub-layer's matrices (torchscale's Sub-LN skips the cross-attention)
SUBLAYER_KEYS = (*SWITCHES, "head_scale", "scaled_init")
QK_NORM_FORMS = ("layernorm", "l2", "sphere")


@dataclass(frozen=True)
class Init:
    """Which matrices get which gain at initialisation."""

    draw: str = "fairseq"  # fairseq: keep fairseq's draw and multiply by gain; xavier_normal: redraw
    gain: float | str = 1.0  # a number or a formula name (deepnorm_beta, t_fixup)
    scaled: tuple[str, ...] = ()  # matrices that get ``gain``
    unit: tuple[str, ...] = ()  # matrices redrawn with gain 1 (draw=xavier_normal)
    embed_gain: float | str = 1.0  # multiplies the token embeddings after fairseq's draw
    profile: str | None = None  # admin: a pass over one batch sets the residual gains (fresh runs)
    bias: bool = False  # the scaled matrices' biases get the gain too (torchscale scales both)
    # matrices whose fairseq draw is first brought to a plain Xavier-uniform draw, as the older
    # fairseq of T-Fixup's code drew them: q/k/v x sqrt(2) (fairseq draws them with gain 1/sqrt(2)),
    # fc1/fc2 from torch's default bound 1/sqrt(fan_in) to sqrt(6/(fan_in+fan_out)) with bias 0
    plain_xavier: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """A scheme's structure, as its YAML states it (every key of configs/placement/*.yaml but
    ``recipe``)."""

    name: str
    structure: str = "residual"  # a registered block structure (STRUCTURES above)
    input_norm: bool = False  # F(Norm(x))
    output_norm: bool = False  # Norm(F(.))
    sum_norm: bool = True  # Norm(x + F)
    inner_norm: bool = False  # Sub-LN: a norm inside F before its output projection
    norm_residual: bool = False  # HybridNorm: x <- Norm(x) + F(Norm(x)), the sum starts after the norm
    input_norm_scale: float | str = 1.0  # multiplies the input norm's output (LayerNorm Scaling)
    residual_weight: float | str = 1.0  # multiplies x in the sum (DeepNorm's alpha)
    branch_gate: bool = False  # ReZero: a learnable scalar, 0 at init, multiplies the branch
    shared_gate: bool = False  # ReZero's code: one gate per layer, shared by its sub-layers
    residual_gain: bool = False  # Admin: a learnable per-dimension weight on x, set by init.profile
    qk_norm: bool = False  # queries and keys normalised per head before their dot product
    # layernorm: the configured norm per head, 1/sqrt(d_h) kept (ViT-22B's QK-LayerNorm); l2: Henry
    # et al. 2020's q/|q|, k/|k| per head with a learned scalar g (from qk_scale0) in place of 1/sqrt(d_h);
    # sphere: nGPT's s_qk*q/|q|, s_qk*k/|k| per head, s_qk learned per dimension, softmax scale sqrt(d_h)
    qk_norm_form: str = "layernorm"
    qk_scale0: float = 9.954196310386875  # Henry et al.'s g at init: log2(L^2 - L), L = 32 tokens
    v_norm: bool = False  # values normalised per head too (HybridNorm's QKV-norm)
    head_scale: bool = False  # NormFormer: a learnable scale per head before the output projection
    final_norm: bool = False  # a norm on each stack's output
    embed_norm: bool = False  # a norm on the embeddings
    fix_norm: bool = False  # FixNorm: every word embedding at unit length (times fairseq's sqrt(d))
    # nGPT (Loshchilov et al. 2024): every norm is x/|x|, the sum h + a*(y - h) with a learned per
    # dimension, weights renormalised after each update (lnexp/model/sphere.py)
    sphere: bool = False
    sphere_alpha0: float = 0.05  # nGPT's a at init (its eigen learning rate), every dimension
    streams: int = 1  # n residual streams (structure hyper_connections or mhc; 1 elsewhere)
    dynamic: bool = False  # the connection weights also depend on the streams (HC's DHC; mHC's form)
    sublayers: dict[str, dict[str, bool]] | None = None  # {attention|ffn: {switch: value}}
    first_layers: dict[str, Any] | None = None  # {fraction: a, switch: value...}: layers l <= floor(a L)
    init: Init = field(default_factory=Init)

    def __post_init__(self) -> None:
        where = f"placement {self.name}"
        flags = ("branch_gate", "shared_gate", "residual_gain", "qk_norm", "v_norm", "head_scale",
                 "final_norm", "embed_norm", "fix_norm", "sphere", "dynamic", *SWITCHES)
        for key in flags:
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}: {key}={getattr(self, key)!r} must be true or false: "
                                 f"e.g. placement.{key}=true")
        if self.structure not in STRUCTURES:
            raise ValueError(f"{where}: structure={self.structure!r} is not one of {', '.join(STRUCTURES)}")
        if isinstance(self.streams, bool) or not isinstance(self.streams, int) or self.streams < 1:
            raise ValueError(f"{where}: streams={self.streams!r} must be an integer >= 1: e.g. "
                             "placement.streams=4")
        if STRUCTURES[self.structure].parts is None and (self.streams != 1 or self.dynamic):
            raise ValueError(f"{where}: streams and dynamic are hyper-connections' keys: set "
                             "placement.structure=hyper_connections (or mhc), or streams=1 dynamic=false")
        for key in NUMBER_OR_FORMULA:
            _check_value(where, key, getattr(self.init if key.startswith("init.") else self,
                                             key.removeprefix("init.")))
        if self.init.profile is not None and self.init.profile not in PROFILES:
            raise ValueError(f"{where}: init.profile={self.init.profile!r} is not one of "
                             f"{', '.join(PROFILES)} (or null)")
        if self.residual_gain != (self.init.profile == "admin"):
            raise ValueError(f"{where}: residual_gain and init.profile=admin go together (the "
                             "profiling pass sets the gains): set both or neither")
        if self.shared_gate and not self.branch_gate:
            raise ValueError(f"{where}: shared_gate shares ReZero's gate (branch_gate): set "
                             "branch_gate=true or shared_gate=false")
        if self.qk_norm_form not in QK_NORM_FORMS:
            raise ValueError(f"{where}: qk_norm_form={self.qk_norm_form!r} is not one of "
                             f"{', '.join(QK_NORM_FORMS)}")
        if isinstance(self.qk_scale0, bool) or not isinstance(self.qk_scale0, int | float):
            raise ValueError(f"{where}: qk_scale0={self.qk_scale0!r} must be a number: e.g. "
                             "placement.qk_scale0=9.954")
        if isinstance(self.sphere_alpha0, bool) or not isinstance(self.sphere_alpha0, int | float) \
                or not 0 < self.sphere_alpha0 <= 1:
            raise ValueError(f"{where}: sphere_alpha0={self.sphere_alpha0!r} must be a number in (0, 1]: "
                             "e.g. placement.sphere_alpha0=0.05")
        if self.sphere and (not self.sum_norm or self.residual_gain or self.branch_gate):
            raise ValueError(f"{where}: sphere keeps the stream on the unit sphere with its own sum "
                             "(h + a*(y - h), then x/|x|): set sum_norm=true, residual_gain=false and "
                             "branch_gate=false")
        if self.qk_norm_form == "sphere" and not self.sphere:
            raise ValueError(f"{where}: qk_norm_form=sphere is nGPT's attention and needs its unit "
                             "stream: set sphere=true, or qk_norm_form=l2")
        if not isinstance(self.init.bias, bool):
            raise ValueError(f"{where}: init.bias={self.init.bias!r} must be true or false")
        if self.init.draw not in DRAWS:
            raise ValueError(f"{where}: init.draw={self.init.draw!r} is not one of {', '.join(DRAWS)}")
        bad = [m for m in (*self.init.scaled, *self.init.unit, *self.init.plain_xavier)
               if m not in MATRICES]
        if bad:
            raise ValueError(f"{where}: init matrices {bad} are not among {', '.join(MATRICES)}")
        if self.first_layers is not None:
            extra = set(self.first_layers) - {"fraction", *SWITCHES}
            frac = self.first_layers.get("fraction")
            if extra or not isinstance(frac, int | float) or not 0 <= frac <= 1:
                raise ValueError(f"{where}: first_layers takes fraction (0..1) and "
                                 f"{', '.join(SWITCHES)}; got {dict(self.first_layers)}")
        for kind, over in (self.sublayers or {}).items():
            if kind not in SUBLAYERS or not isinstance(over, dict) or set(over) - set(SUBLAYER_KEYS):
                raise ValueError(f"{where}: sublayers takes {', '.join(SUBLAYERS)}, each with "
                                 f"{', '.join(SUBLAYER_KEYS)}; got {dict(self.sublayers or {})}")
        for kind in SUBLAYERS:
            for first in (False, True):
                switches = self._resolve(kind, first)
                if switches["input_norm"] and switches["sum_norm"]:
                    raise ValueError(f"{where}: input_norm and sum_norm share one norm per "
                                     "sub-layer; set one of them false")
                if switches["norm_residual"] and not switches["input_norm"]:
                    raise ValueError(f"{where}: norm_residual takes the residual after the input "
                                     "norm: set input_norm=true where norm_residual is")

    def _resolve(self, kind: str, first: bool) -> dict[str, bool]:
        s = {k: bool(getattr(self, k)) for k in SWITCHES}
        s.update(head_scale=bool(self.head_scale), scaled_init=True)
        kinds = ("attention", kind) if kind == "cross_attention" else (kind,)
        for k in kinds:
            s.update({key: bool(v) for key, v in (self.sublayers or {}).get(k, {}).items()})
        if first:
            s.update({k: bool(v) for k, v in (self.first_layers or {}).items() if k in SWITCHES})
        return s

    def switches(self, layer: int, n_layers: int, sublayer: str = "attention") -> dict[str, bool]:
        """The switches (SUBLAYER_KEYS) of one sub-layer kind (attention, cross_attention or ffn)
        of 1-based layer ``layer`` of an ``n_layers`` stack: the scheme's, then its ``sublayers``
        entries, then Mix-LN's rule."""
        first = self.first_layers is not None and \
            layer <= math.floor(self.first_layers["fraction"] * n_layers)
        return self._resolve(sublayer, first)

    @classmethod
    def from_config(cls, node: Any) -> Placement:
        """From a placement group node (a DictConfig or dict); ``recipe`` (the schedule's) and
        ``about`` (how it is shown) are not the model's and are left out. Unknown keys are an error
        (a typo would silently do nothing)."""
        from omegaconf import DictConfig, OmegaConf

        data = dict(OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else node)
        for key in NOT_THE_NETWORK:
            data.pop(key, None)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"placement {data.get('name')}: unknown keys {unknown}; "
                             f"a placement has {', '.join(sorted(names))}")
        init = dict(data.pop("init", None) or {})
        init_names = {f.name for f in fields(Init)}
        if set(init) - init_names:
            raise ValueError(f"placement {data.get('name')}: unknown init keys "
                             f"{sorted(set(init) - init_names)}; init has {', '.join(sorted(init_names))}")
        for key in ("scaled", "unit", "plain_xavier"):
            init[key] = tuple(init.get(key) or ())
        return cls(**data, init=Init(**init))

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    def model_spec(self) -> str:
        """``to_json`` for the model's --placement-spec: the model reading it back in this process
        gets this very Placement (the latest handed over; a comparison's to_json registers nothing)."""
        text = self.to_json()
        _WRITTEN[text] = self
        return text

    @classmethod
    def from_json(cls, text: str) -> Placement:
        return _WRITTEN.get(text) or _parsed(text)


_WRITTEN: dict[str, Placement] = {}  # the Placements this process wrote as --placement-spec


@lru_cache(maxsize=64)
def named_placement(name: str) -> Placement:
    """configs/placement/NAME.yaml as written (no switch overridden), read once per process."""
    return Placement.from_config(group_file("placement", name))


@lru_cache(maxsize=64)
def _parsed(text: str) -> Placement:
    """A --placement-spec read once per process: a model's layers all ask for the same one (a
    Placement is frozen, so the layers can share it)."""
    return Placement.from_config(json.loads(text))


NOT_THE_NETWORK = ("recipe", "about")  # a placement YAML's keys that the model is not built from


# the keys that take a number or a formula's name (one placement's YAML has the one, another the other)
NUMBER_OR_FORMULA = ("input_norm_scale", "residual_weight", "init.gain", "init.embed_gain")


def _check_value(where: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not (isinstance(value, int | float) or value in FORMULAS):
        raise ValueError(f"{where}: {key}={value!r} must be a number or one of {', '.join(FORMULAS)}")


# LayerNorm's, RMSNorm's and SeeDNorm's eps is added under the root; ScaleNorm's bounds the norm from below
_DEFAULT_EPS = {"layernorm": 1e-5, "rmsnorm": 1e-6, "scalenorm": 1e-5, "seednorm": 1e-6}
# alpha at init where it is not 0.5 (DyT's, Derf's): SeeDNorm's alpha multiplies beta's gradient
_DEFAULT_ALPHA0 = {"seednorm": 1.0}


@dataclass(frozen=True)
class Norm:
    """A norm group's settings (configs/norm/NAME.yaml)."""

    name: str = "layernorm"
    eps: float | None = None  # None: the norm's usual one (LayerNorm, ScaleNorm 1e-5; RMSNorm, SeeDNorm 1e-6)
    alpha0: float | None = None  # DyT's, Derf's (None: 0.5) and SeeDNorm's (None: 1.0) initial alpha
    shift0: float = 0.0  # Derf's initial shift s
    beta0: float = 0.0  # SeeDNorm's initial beta, every entry (0: RMSNorm at init)

    def __post_init__(self) -> None:
        from lnexp.names import NORMS

        if self.name not in NORMS:
            raise ValueError(f"norm={self.name} is not one of {', '.join(NORMS)}")
        if self.eps is None and self.name in _DEFAULT_EPS:  # so that equal norms compare equal
            object.__setattr__(self, "eps", _DEFAULT_EPS[self.name])
        if self.alpha0 is None:
            object.__setattr__(self, "alpha0", _DEFAULT_ALPHA0.get(self.name, 0.5))
        for key in ("eps", "alpha0"):
            value = getattr(self, key)
            if value is None and key == "eps":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"norm.{key}={value!r} must be a number > 0: e.g. norm.{key}="
                                 f"{'1e-5' if key == 'eps' else '0.5'}")
        for key in ("shift0", "beta0"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"norm.{key}={value!r} must be a number: e.g. norm.{key}=0.0")

    @classmethod
    def from_config(cls, node: Any) -> Norm:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(node, str):  # a run config written before norm was a group: norm: rmsnorm
            return cls(node)
        data = dict(OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node)
        names = {f.name for f in fields(cls)}
        if set(data) - names:
            raise ValueError(f"norm {data.get('name')}: unknown keys {sorted(set(data) - names)}; "
                             f"a norm has {', '.join(sorted(names))}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)


def group_file(group: str, name: str) -> Any:
    """configs/GROUP/NAME.yaml as a node, as Hydra composes it: its defaults list (other files of
    the group, then ``_self_``: a scheme over placement/_base.yaml) merged in order. An unknown name
    lists the options."""
    from omegaconf import OmegaConf

    if name.startswith("_") or not (CONFIG_DIR / group / f"{name}.yaml").is_file():
        options = [p.stem for p in option_files(group)]
        raise ValueError(f"{group}={name} is not one of {', '.join(options)}")
    return OmegaConf.merge(*_layers(group, name))


def _layers(group: str, name: str) -> list[Any]:
    from omegaconf import OmegaConf

    own, entries = _read(group, name)
    out = []
    for entry in entries:
        out += [OmegaConf.create(own)] if entry == "_self_" else _layers(group, entry)
    return out


@cache
def _read(group: str, name: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """configs/GROUP/NAME.yaml's own keys (unresolved) and its defaults list, read once per process
    (every scheme starts from placement/_base.yaml; the files do not change under a process)."""
    from omegaconf import OmegaConf

    own = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml"), resolve=False)
    entries = list(own.pop("defaults", None) or [])
    if "_self_" not in entries:  # Hydra's rule for a config that is not the primary one
        entries.append("_self_")
    bad = [e for e in entries if not isinstance(e, str)]
    if bad:
        raise ValueError(f"configs/{group}/{name}.yaml: its defaults list takes names of "
                         f"configs/{group}/ files and _self_, got {bad[0]!r}")
    return own, tuple(entries)


def about(placement: str) -> dict[str, Any]:
    """How figures and docs show a scheme (its YAML's ``about``: label, color, paper, block, init,
    checked) and its ``recipe``, unresolved."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(group_file("placement", placement), resolve=False)
    return {**node["about"], "recipe": node["recipe"]}


def placement_of(args: Any) -> Placement:
    """The placement a fairseq namespace/config describes: --placement-spec, or, in a checkpoint
    written before it existed, --placement NAME (+ --embed-norm) read through configs/placement."""
    spec = getattr(args, "placement_spec", None)
    if spec:
        return Placement.from_json(spec)
    node = group_file("placement", getattr(args, "placement", None) or "post_ln")
    placement = Placement.from_config(node)
    if getattr(args, "embed_norm", False):
        from dataclasses import replace

        placement = replace(placement, embed_norm=True)
    return placement


def placement_of_run(node: Any) -> Placement:
    """The placement of a run's saved config (run.json): its structure, or, in a run written before
    placements were data (only name, embed_norm, recipe), its YAML's."""
    data = dict(node)
    if set(data) <= {"name", "embed_norm", "recipe"}:
        from types import SimpleNamespace

        return placement_of(SimpleNamespace(placement=data.get("name"),
                                            embed_norm=data.get("embed_norm", False)))
    return Placement.from_config(data)


def norm_of(args: Any) -> Norm:
    """The norm of a fairseq namespace: --norm-spec, or an old checkpoint's --norm NAME."""
    spec = getattr(args, "norm_spec", None)
    if spec:
        return Norm.from_config(json.loads(spec))
    return Norm.from_config(group_file("norm", getattr(args, "norm", None) or "layernorm"))
