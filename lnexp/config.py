"""The training config: where ``configs/`` lives, how overrides are read, one way to compose and check.

Every reader of ``configs/train.yaml`` (``lnexp train``, the probes, the benchmarks, the tests) composes
through :func:`compose` or :func:`composer`, so an override means the same thing everywhere.
Imports only Hydra/OmegaConf (no torch, no fairseq).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from lnexp.errors import ConfigError
from lnexp.names import NORMS, PLACEMENTS, PRECISIONS, SCHEDULES

# A link to the top-level configs/ in a checkout; the YAML files themselves in an installed wheel.
CONFIG_DIR = (Path(__file__).parent / "configs").resolve()
GROUPS = tuple(sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir()))
# Keys that say how long to train or how to report: they do not name the run, so raising max_epoch
# continues a finished run in its own folder (configs/train.yaml repeats them for Hydra).
LENGTH_KEYS = ("max_epoch", "max_update")


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("run_name"):
        from lnexp.run_names import run_name  # the run folder's name (lnexp/run_names.py)

        OmegaConf.register_new_resolver("run_name", run_name)


# --- overrides ----------------------------------------------------------------------------------


def normalise(overrides: list[str]) -> list[str]:
    """Overrides as Hydra can take them: numeric options of a group (``depth=12``) become quoted
    strings, and any ``depth=N`` gets a config node; sweeps Hydra's basic sweeper cannot enumerate
    are refused with the fix."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    out = []
    for text in overrides:
        try:
            o = parser.parse_override(text)
        except HydraException as e:
            raise ConfigError(f"{first_line(e)} (syntax: key=value, group=option)") from None
        key = o.get_key_element()
        if o.is_sweep_override() and not _enumerable(o):
            raise ConfigError(f"{text}: the basic sweeper takes lists and ranges, not "
                              f"{o.value_type.name.lower().replace('_', ' ')}s; write e.g. "
                              f"{key}=1e-4,5e-4,1e-3")
        if key not in GROUPS or o.package or o.is_delete():
            out.append(text)
            continue
        values = list(o.sweep_iterator()) if o.is_sweep_override() else [o.value()]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            out.append(text)
            continue
        names = [_numeric_option(key, v) for v in values]
        prefix = "+" if o.is_add() else ""
        out.append(f"{prefix}{key}=" + ",".join(f"'{n}'" for n in names))
    return out


def _enumerable(o) -> bool:
    from hydra.core.override_parser.types import ValueType

    return o.value_type in (ValueType.CHOICE_SWEEP, ValueType.SIMPLE_CHOICE_SWEEP,
                            ValueType.RANGE_SWEEP)


def _numeric_option(group: str, value: float) -> str:
    """``depth=N`` for any N >= 1 (both stacks); other groups' numeric options must exist as files."""
    if group == "depth":
        if value != int(value) or value < 1:
            raise ConfigError(f"depth={value} must be a whole number of layers >= 1 (e.g. depth=12; "
                              "depth.encoder_layers=... depth.decoder_layers=... for unequal stacks)")
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
                f"{', '.join(sorted(e.options))}")
    return f"{first_line(e)} (lnexp train --help lists the groups and options)"


# --- fairseq's schemas ---------------------------------------------------------------------------

# fairseq registers a Hydra schema per optimizer ("optimizer/adam", ...). Under version_base 1.1,
# which fairseq's own compose needs, Hydra would validate lnexp's configs/optimizer/adam.yaml
# against it. Keep those schemas out of the ConfigStore except while fairseq composes.
_HIDDEN: dict[tuple[str, str], object] = {}


def hide_fairseq_schemas() -> None:
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for group_dir in CONFIG_DIR.iterdir():
        group = repo.get(group_dir.name)
        if not group_dir.is_dir() or not isinstance(group, dict):
            continue
        for yaml in group_dir.glob("*.yaml"):
            if yaml.name in group:
                _HIDDEN[(group_dir.name, yaml.name)] = group.pop(yaml.name)


def restore_fairseq_schemas() -> None:
    """Put fairseq's schemas back while fairseq composes its own config."""
    from hydra.core.config_store import ConfigStore

    repo = ConfigStore.instance().repo
    for (group, name), node in _HIDDEN.items():
        repo.setdefault(group, {})[name] = node
    _HIDDEN.clear()


# --- composing ----------------------------------------------------------------------------------


@contextmanager
def composer() -> Iterator[Callable[[list[str]], DictConfig]]:
    """A function that composes configs/train.yaml with overrides (resolved, not yet validated;
    ``raw=True``: unresolved, with Hydra's node)."""
    import sys

    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    register_resolvers()
    if "fairseq" in sys.modules:  # its Hydra schemas ("optimizer/adam") would shadow lnexp's groups
        hide_fairseq_schemas()

    def compose_one(overrides: list[str], raw: bool = False) -> DictConfig:
        try:
            cfg = hydra_compose("train", overrides=normalise(list(overrides)),
                                return_hydra_config=raw)
            if raw:
                return cfg
            OmegaConf.resolve(cfg)
        except (HydraException, OmegaConfBaseException) as e:
            raise ConfigError(explain(e)) from None
        return cfg

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(str(CONFIG_DIR), version_base="1.1"):
            yield compose_one
    finally:
        GlobalHydra.instance().clear()


def compose(overrides: list[str] | tuple[str, ...] = (), check: bool = True) -> DictConfig:
    """configs/train.yaml with these overrides, resolved and (by default) validated."""
    with composer() as compose_one:
        cfg = compose_one(list(overrides))
    if check:
        validate(cfg)
    return cfg


# --- validation ---------------------------------------------------------------------------------

_EXAMPLES = {"lr": "lr=5e-4", "warmup": "warmup=4000", "max_epoch": "max_epoch=2",
             "max_update": "max_update=100", "residual_scale": "residual_scale=0.5",
             "seed": "seed=1"}


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (one line, naming the fix) for values no run can use."""

    def number(key: str, whole: bool = False) -> float:
        value = cfg[key]
        kind = "whole number" if whole else "number"
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                whole and int(value) != value):
            raise ConfigError(f"{key}={value!r} is not a {kind}: e.g. {_EXAMPLES[key]}")
        return float(value)

    lr = number("lr")
    if not math.isfinite(lr) or lr <= 0:
        raise ConfigError(f"lr={cfg.lr} must be a positive number: e.g. lr=5e-4")
    if number("warmup", whole=True) < 0:
        raise ConfigError(f"warmup={cfg.warmup} must be a whole number of updates >= 0 "
                          "(warmup=0 for none)")
    if number("max_epoch", whole=True) < 1:
        raise ConfigError(f"max_epoch={cfg.max_epoch} must be a whole number >= 1")
    if number("max_update", whole=True) < 0:
        raise ConfigError(f"max_update={cfg.max_update} must be >= 0 (0 = no limit)")
    number("seed", whole=True)
    if number("residual_scale") <= 0:
        raise ConfigError(f"residual_scale={cfg.residual_scale} must be > 0 (1.0 = plain residual)")
    for side in ("encoder_layers", "decoder_layers"):
        n = cfg.depth[side]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"depth.{side}={n!r} must be a whole number of layers >= 1")
    checks = [("norm", cfg.norm, NORMS), ("precision", cfg.precision, PRECISIONS),
              ("device", cfg.device, ("auto", "cpu", "cuda")),
              ("placement", cfg.placement.name, PLACEMENTS),
              ("schedule", cfg.schedule.name, SCHEDULES)]
    for key, value, allowed in checks:
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    for key in ("beam", "max_sentences", "subset"):
        value = cfg.eval[key]
        low = 0 if key == "subset" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"eval.{key}={value!r} must be a whole number >= {low}")
    keep = cfg.checkpoint.keep_last_epochs
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ConfigError(f"checkpoint.keep_last_epochs={keep!r} must be a whole number >= 0 "
                          "(0 keeps no epoch checkpoints)")
    log_interval = cfg.get("log_interval", 1)
    if isinstance(log_interval, bool) or not isinstance(log_interval, int) or log_interval < 1:
        raise ConfigError(f"log_interval={log_interval!r} must be a whole number of updates >= 1")
