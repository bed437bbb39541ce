"""The training config: where ``configs/`` lives, how overrides are read, one way to compose and check.

Every reader of ``configs/train.yaml`` (``lnexp train``, the probes, the benchmarks, the tests) composes
through :func:`compose` or :func:`composer`, so an override means the same thing everywhere.
Imports only Hydra/OmegaConf (no torch, no fairseq).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from omegaconf import DictConfig, ListConfig, OmegaConf

from lnexp import overrides as override
from lnexp.errors import ConfigError
from lnexp.names import CONFIG_DIR, NORMS, PLACEMENTS, PRECISIONS, SCHEDULES, option_files
from lnexp.scheme import NUMBER_OR_FORMULA, Norm, Placement

GROUPS = tuple(sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir()))
# The most layers a stack may have: DeepNet (Wang et al. 2022), the deepest of the study's schemes,
# trained 1,000 layers in all; far more would fill the memory before the first update.
MAX_LAYERS = 1000
# The most updates a warm-up or a run may ask for: 100 times the longest Transformer runs published
# (~1M updates); a larger number is a typo (warmup=1e12 would train at lr ~1e-15 throughout).
MAX_UPDATES = 100_000_000
MAX_EPOCHS = 100_000  # epochs of a run: as many again would be a typo (the paper trains 100)


def config_keys() -> set[str]:
    """Every dotted key the training config can hold, under any option of any group (read from the
    YAML files, without composing: for readers of finished runs such as ``lnexp results``)."""
    train = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "train.yaml"))
    keys = {k for k in dotted(train) if k.split(".")[0] not in ("defaults", "hydra")}
    for group in GROUPS:
        keys.add(group)
        for yaml in (CONFIG_DIR / group).glob("*.yaml"):
            node = OmegaConf.to_container(OmegaConf.load(yaml))
            if isinstance(node, dict) and group != "experiment":  # experiments set existing keys
                keys |= {k for k in dotted(node, f"{group}.") if ".defaults" not in k}
    return keys


# --- overrides ----------------------------------------------------------------------------------


def normalise(overrides: list[str]) -> list[str]:
    """Overrides as Hydra can take them: numeric options of a group (``depth=12``) become quoted
    strings, and any ``depth=N`` gets a config node; sweeps Hydra's basic sweeper cannot enumerate
    are refused with the fix."""
    out = []
    for text in overrides:
        o = override.parse(text)
        key = o.get_key_element()
        if o.is_sweep_override() and not _enumerable(o):
            raise ConfigError(f"{text}: the basic sweeper takes lists and ranges, not "
                              f"{o.value_type.name.lower().replace('_', ' ')}s; write e.g. "
                              f"{key}=1e-4,5e-4,1e-3")
        if key not in GROUPS or o.package or o.is_delete():
            out.append(text)
            continue
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        shared = [v for v in values if isinstance(v, str) and v.startswith("_")]
        if shared:
            raise ConfigError(f"{key}={shared[0]} is what the {key} options share, not one of them: "
                              f"choose one of {', '.join(p.stem for p in option_files(key))}")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out.append(text)
            continue
        names = [_numeric_option(key, v) for v in values]
        prefix = "+" if o.is_add() else ""
        out.append(f"{prefix}{key}=" + ",".join(f"'{n}'" for n in names))
    return out


def given_once(overrides: list[str]) -> None:
    """A command line that sets a key twice is a mistake: Hydra would keep the last value silently,
    and both would name the run folder. (Code that composes may append overrides that win.)"""
    first: dict[str, str] = {}
    for text in overrides:
        key = override.parse(text).get_key_element()
        if key in first:
            raise ConfigError(f"{key} is given twice ({first[key]} and {text}): give it once, or "
                              f"sweep both values with -m {key}=a,b")
        first[key] = text


def _enumerable(o) -> bool:
    from hydra.core.override_parser.types import ValueType

    return o.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP,
                            ValueType.RANGE_SWEEP)


def _numeric_option(group: str, value: float) -> str:
    """``depth=N`` for any 1 <= N <= MAX_LAYERS (both stacks); other groups' numeric options must
    exist as files."""
    if group == "depth":
        if not math.isfinite(value) or value != int(value) or value < 1:
            raise ConfigError(f"depth={value} must be a whole number of layers >= 1 (e.g. depth=12; "
                              "depth.encoder_layers=... depth.decoder_layers=... for unequal stacks)")
        if value > MAX_LAYERS:
            raise ConfigError(f"depth={int(value)} is more than {MAX_LAYERS} layers a stack, the most "
                              f"lnexp builds: e.g. depth=12")
        n = int(value)
        if not (CONFIG_DIR / "depth" / f"{n}.yaml").is_file():
            from hydra.core.config_store import ConfigStore

            ConfigStore.instance().store(group="depth", name=str(n),
                                         node={"encoder_layers": n, "decoder_layers": n})
        return str(n)
    return str(int(value)) if value == int(value) else str(value)


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def explain(e: Exception) -> str:
    """One line for a Hydra/OmegaConf composition error, naming the valid options where it can."""
    from hydra.errors import MissingConfigException

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and e.options:
        group, _, name = str(e.missing_cfg_file).rpartition("/")
        return (f"{group}={name} is not an option of the {group} group: use one of "
                f"{', '.join(sorted(o for o in e.options if not o.startswith('_')))}")
    return f"{first_line(e)} (lnexp train --help lists the groups and options)"


# --- fairseq's schemas ---------------------------------------------------------------------------

# fairseq registers a Hydra schema per optimizer ("optimizer/adam", ...). Under version_base 1.1,
# which fairseq's own compose needs, Hydra would validate lnexp's configs/optimizer/adam.yaml
# against it. And Hydra deep-copies the whole ConfigStore at every compose: fairseq's ~110 schemas
# cost lnexp's composes about a third of their time, 4-6 of them a training. Keep all of fairseq's
# schemas out of the ConfigStore except while fairseq composes.
_HIDDEN: dict[tuple[str, str], object] = {}


def _fairseq_schemas(repo: dict) -> list[tuple[str, str]]:
    """(group, name) of what fairseq stored: its top config and one schema per field of it
    (fairseq.dataclass.initialize.hydra_init, group ""), and its components' schemas."""
    from fairseq.dataclass.configs import FairseqConfig

    top = {"config.yaml", *(f"{field}.yaml" for field in FairseqConfig.__dataclass_fields__)}
    found = [("", name) for name in sorted(top) if name in repo]
    for group, nodes in repo.items():
        if isinstance(nodes, dict):
            found += [(group, name) for name, node in nodes.items()
                      if getattr(node, "provider", None) == "fairseq"]
    return found


def hide_fairseq_schemas() -> None:
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for group, name in _fairseq_schemas(repo):
        _HIDDEN[(group, name)] = (repo[group] if group else repo).pop(name)


def restore_fairseq_schemas() -> None:
    """Put fairseq's schemas back while fairseq composes its own config."""
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for (group, name), node in _HIDDEN.items():
        (repo.setdefault(group, {}) if group else repo)[name] = node
    _HIDDEN.clear()


# --- composing ----------------------------------------------------------------------------------


# The config each combination of group options gives, for check_types (the same for the whole
# process: configs/ does not change under it).
_REFERENCES: dict[tuple[str, ...], dict] = {}


@contextmanager
def composer() -> Iterator[Callable[[list[str]], DictConfig]]:
    """A function that composes configs/train.yaml with overrides: resolved, every key known and of
    its config type (as Hydra refuses an unknown key without ``+``), the values' ranges not yet
    validated; ``raw=True``: unresolved, with Hydra's node, unchecked."""
    import sys

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    if "fairseq" in sys.modules:  # its Hydra schemas ("optimizer/adam") would shadow lnexp's groups
        hide_fairseq_schemas()

    def resolved(overrides: list[str], raw: bool = False) -> DictConfig:
        try:
            cfg = hydra_compose("train", overrides=overrides, return_hydra_config=raw)
            if raw:
                return cfg
            OmegaConf.resolve(cfg)
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(explain(e)) from None
        return cfg

    def compose_one(overrides: list[str], raw: bool = False) -> DictConfig:
        overrides = normalise(list(overrides))
        if raw:
            return resolved(overrides, raw=True)
        # The same group options without the key=value overrides: each key's value there is the
        # type and an example of what the key takes.
        groups = tuple(o for o in overrides if override.key(o) in GROUPS)
        if groups not in _REFERENCES:
            _REFERENCES[groups] = OmegaConf.to_container(resolved(list(groups)))
        try:
            cfg = resolved(overrides)
        except ConfigError as e:
            unknown = re.match(r"Could not override '([^']+)'", str(e))
            if unknown is None:
                raise
            raise ConfigError(f"Could not override '{unknown[1]}': "
                              f"{unknown_key(unknown[1], _REFERENCES[groups])}") from None
        check_types(OmegaConf.to_container(cfg), _REFERENCES[groups])
        return cfg

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.1"):
            yield compose_one
    finally:
        GlobalHydra.instance().clear()


def compose(overrides: list[str] | tuple[str, ...] = (), check: bool = True) -> DictConfig:
    """configs/train.yaml with these overrides, resolved, typed and (by default) validated."""
    with composer() as compose_one:
        cfg = compose_one(list(overrides))
    if check:
        validate(cfg)
    return cfg


# --- validation ---------------------------------------------------------------------------------


def check_types(cfg: dict, reference: dict, prefix: str = "") -> None:
    """Every key of ``cfg`` exists in ``reference`` (the config its group options give) and holds a
    value of the same kind: a whole number where the config has one, a list of numbers where it has
    a list, and so on. A ``null`` in the reference takes anything."""
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if key not in reference:
            raise ConfigError(f"{path} is {unknown_key(path, reference, prefix)}")
        _check_kind(path, value, reference[key])
    for key in reference:
        if key not in cfg:
            raise ConfigError(f"~{prefix}{key} deletes a key lnexp reads: set a value instead, "
                              f"e.g. {prefix}{key}={_hydra_value(reference[key])}")


def unknown_key(path: str, reference: dict, prefix: str = "") -> str:
    """'not a key ...' for a key the config lacks, with the nearest one it has."""
    import difflib

    near = difflib.get_close_matches(path, dotted(reference, prefix), n=1)
    hint = f"did you mean {near[0]}? " if near else ""
    return f"not a key of lnexp's training config ({hint}lnexp train --help lists the groups and keys)"


def dotted(node: dict, prefix: str = "") -> list[str]:
    """Every key of a nested config as a dotted path."""
    out = []
    for k, v in node.items():
        out.append(f"{prefix}{k}")
        if isinstance(v, dict):
            out += dotted(v, f"{prefix}{k}.")
    return out


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    return "text"


def _fits(value: object, like: object) -> bool:
    """Is ``value`` of the kind of the config's ``like``?"""
    if like is None:
        return True
    if isinstance(like, bool):
        return isinstance(value, bool)
    if isinstance(like, int | float):
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        return numeric and (isinstance(like, float) or not math.isfinite(value) or int(value) == value)
    return not isinstance(value, dict | list)


def _check_kind(path: str, value: object, like: object) -> None:
    if path.removeprefix("placement.") in NUMBER_OR_FORMULA:
        return  # a number or a formula's name, whichever the YAML has: Placement checks it
    if isinstance(like, dict):
        if not isinstance(value, dict):
            first = next(iter(like), "")
            raise ConfigError(f"{path}={value!r}: {path} holds keys ({', '.join(like)}), not a value: "
                              f"set one of them, e.g. {path}.{first}={_hydra_value(like.get(first))}")
        check_types(value, like, f"{path}.")
    elif isinstance(like, list):
        items = like[:1] or [None]
        if not isinstance(value, list) or not all(_fits(v, items[0]) for v in value):
            what = "a list" + (f" of {_kind(items[0]).removeprefix('a ')}s" if like else "")
            raise ConfigError(f"{path}={value!r} is not {what}: e.g. "
                              f"{_EXAMPLES.get(path, f'{path}={_hydra_value(like)}')}")
    elif not _fits(value, like):
        if isinstance(like, int) and not isinstance(like, bool) and isinstance(value, float):
            kind = "a whole number"
        else:
            kind = _kind(like)
        raise ConfigError(f"{path}={value!r} is not {kind}: e.g. "
                          f"{_EXAMPLES.get(path, f'{path}={_hydra_value(like)}')}")


def _hydra_value(value: object) -> str:
    """A value as an override writes it: ``[0.9,0.98]``, ``true``, ``null``."""
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


_EXAMPLES = {"lr": "lr=5e-4", "warmup": "warmup=4000", "max_epoch": "max_epoch=2",
             "max_update": "max_update=100", "residual_scale": "residual_scale=0.5",
             "seed": "seed=1", "optimizer.betas": "optimizer.betas=[0.9,0.98]"}


@dataclass(frozen=True)
class Bound:
    """The values a numeric key takes: from ``low`` to ``high`` (an end left out with ``above`` or
    ``below``), whole numbers or not; a list's items each so (``length`` of them if given); ``note``
    says what the ends mean."""

    low: float
    high: float | None = None
    above: bool = False  # low itself is excluded
    below: bool = False  # high itself is excluded
    whole: bool = True
    unit: str = ""
    note: str = ""
    length: int | None = None

    def fault(self, x: float) -> str | None:
        """Why ``x`` is not one of these values (None if it is)."""
        noun = ("a whole number" if self.whole else "a number") + (f" of {self.unit}" if self.unit else "")
        note = f" ({self.note})" if self.note else ""
        if self.high is not None and not self.whole:
            ok = math.isfinite(x) and (x > self.low or x == self.low and not self.above) \
                and (x < self.high or x == self.high and not self.below)
            ends = (f"{'(' if self.above else '['}{_num(self.low)}, {_num(self.high)}"
                    f"{')' if self.below else ']'}")
            return None if ok else f"{noun} in {ends}{note}"
        if not math.isfinite(x) or x < self.low or (x == self.low and self.above):
            if self.low == 0 and self.above and not self.whole:
                return f"a positive number{note}"
            return f"{noun} {'>' if self.above else '>='} {_num(self.low)}{note}"
        if self.high is not None and x > self.high:
            return f"{noun} <= {_num(self.high)}{note}"
        return None


def _num(x: float) -> str:
    return str(int(x)) if x == int(x) else f"{x:g}"


# Every numeric key a run reads (top-level and inside groups) and the values it takes; whether it
# is a number, text or a list is the config's own type (check_types). A key absent from the run's
# config (optimizer.momentum under adam) is skipped.
BOUNDS: dict[str, Bound] = {
    "lr": Bound(0, above=True, whole=False),
    "warmup": Bound(0, MAX_UPDATES, unit="updates", note="warmup=0 for none"),
    "seed": Bound(0, 2**32 - 1),
    "max_epoch": Bound(1, MAX_EPOCHS),
    "max_update": Bound(0, MAX_UPDATES, note="0 = no limit"),
    "log_interval": Bound(1, unit="updates"),
    "residual_scale": Bound(0, above=True, note="1.0 = plain residual", whole=False),
    "threads": Bound(0, note="0 = a fair share of the cores"),  # as configs/train.yaml says
    "save_interval_updates": Bound(0, unit="updates", note="0 = at the end of each epoch only"),
    "track_every": Bound(1, unit="updates"),
    "eval.beam": Bound(1),
    "eval.lenpen": Bound(0, whole=False),
    "eval.max_sentences": Bound(1),
    "eval.subset": Bound(0, note="0 = the whole validation set"),
    "checkpoint.keep_last_epochs": Bound(0, note="0 keeps no epoch checkpoints"),
    "divergence.plateau_epoch": Bound(1),
    "divergence.plateau_margin": Bound(0, unit="bits", whole=False),
    "divergence.plateau_min_updates": Bound(0, unit="updates", note="0 = no minimum"),
    "norm.alpha0": Bound(0, above=True, whole=False),
    "depth.encoder_layers": Bound(1, MAX_LAYERS, unit="layers"),
    "depth.decoder_layers": Bound(1, MAX_LAYERS, unit="layers"),
    "optimizer.betas": Bound(0, 1, below=True, length=2, whole=False),
    "optimizer.eps": Bound(0, above=True, whole=False),
    "optimizer.momentum": Bound(0, 1, below=True, whole=False),
    "optimizer.weight_decay": Bound(0, whole=False),
    "optimizer.clip_norm": Bound(0, note="0 = no clipping", whole=False),
    "schedule.epochs": Bound(1),
    "schedule.gamma": Bound(0, above=True, whole=False),
    "scale.max_tokens": Bound(1, unit="tokens"),
    "scale.update_freq": Bound(1),
    "scale.decay_epoch": Bound(1),
    "scale.dropout": Bound(0, 1, below=True, whole=False),
    "scale.label_smoothing": Bound(0, 1, below=True, whole=False),
    "dataset.vocab_size": Bound(1),
    "dataset.max_tokens": Bound(1, unit="tokens"),
    "dataset.update_freq": Bound(1),
    "dataset.beam": Bound(1),
    "dataset.lenpen": Bound(0, whole=False),
    "dataset.paper_epochs": Bound(1),
    "dataset.decay_epoch": Bound(1),
    "distributed.world_size": Bound(1),
    "distributed.port": Bound(-1, 65535, note="-1 = none"),
    "distributed.bucket_cap_mb": Bound(1),
    "distributed.heartbeat_timeout": Bound(-1, note="-1 = never"),
    "speed.buckets": Bound(1, unit="tokens"),
    "speed.gpu_threads": Bound(0, note="0 = as threads says"),
}
# lnexp.train.speed's settings (configs/train.yaml's speed group)
SYNCS = ("fewer", "every")
ADAM_KERNELS = ("auto", "fairseq", "foreach", "fused")
HALF_PATHS = ("cast", "autocast")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# Keys that take one of a few words.
CHOICES: dict[str, tuple[str, ...]] = {
    "norm.name": NORMS, "precision": PRECISIONS, "device": ("auto", "cpu", "cuda"),
    "placement.name": PLACEMENTS, "schedule.name": SCHEDULES,
    "checkpoint.at_end": ("keep", "delete"),
    "distributed.backend": ("auto", "gloo", "nccl", "mpi", "ucc"),  # torch.distributed's
    "distributed.ddp_backend": ("auto", "legacy_ddp", "pytorch_ddp", "c10d", "no_c10d",
                                "fully_sharded", "slowmo"),  # fairseq's --ddp-backend
    "speed.syncs": SYNCS, "speed.adam": ADAM_KERNELS, "speed.half": HALF_PATHS,
    "speed.compile_mode": COMPILE_MODES,
}


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line, naming the fix) for values no run can use."""
    root = OmegaConf.select(cfg, "runs_root", default="runs")
    if root is None or not str(root).strip():  # runs_root= would train into /NAME
        raise ConfigError("runs_root is empty: give the folder that holds the runs, e.g. runs_root=runs")
    for key, bound in BOUNDS.items():
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        many = isinstance(value, ListConfig | list)
        items = list(value) if many else [value]
        shown = _hydra_value(list(value)) if many else repr(value) if isinstance(value, str) else value
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in items):
            raise ConfigError(f"{key}={shown} is not {'a whole number' if bound.whole else 'a number'}"
                              + (f": e.g. {_EXAMPLES[key]}" if key in _EXAMPLES else ""))
        if bound.length is not None and len(items) != bound.length:
            raise ConfigError(f"{key}={shown} needs {bound.length} values: e.g. "
                              f"{_EXAMPLES.get(key, key + '=[...]')}")
        for v in items:
            fault = bound.fault(v) or (None if not bound.whole or v == int(v) else "a whole number")
            if fault:
                raise ConfigError(f"{key}={shown}: each value must be {fault}" if many
                                  else f"{key}={shown} must be {fault}")
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str | int | float) and value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    try:  # the placement and norm groups' structure (lnexp/scheme.py)
        placement, norm = Placement.from_config(cfg.placement), Norm.from_config(cfg.norm)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if placement.sphere and norm.name != "layernorm":
        raise ConfigError(f"placement={placement.name} normalises with x/|x| everywhere (placement.sphere"
                          f"=true), so norm={norm.name} would change nothing: drop norm={norm.name}")
