"""A run's folder name, from its resolved configuration rather than from how it was typed.

One configuration, one folder: ``lnexp train``, ``placement=post_ln``, ``seed=1``, ``lr=0.001``,
``lr=1e-3`` and ``schedule=auto`` are one run, ``runs/default``. An override is left out of the name
when the run's configuration is the same without it (a group's default choice, a value equal to
what the config gives the key anyway, in the context of the other overrides: ``lr=1e-3`` is the
mini scale's lr, not the paper scale's); numbers are written one way (``lr=0.001``, ``lr=5e-4`` ->
``lr=0.0005``, ``1e-05`` -> ``1e-5``). Keys that say how long to train or how to report do not name
a run (configs/train.yaml ``exclude_keys``; a ``linear`` schedule's length does). A name over
NAME_MAX bytes is cut, with a hash of the whole (:func:`fitted`).

Folders that older versions named after the overrides as typed keep working: when a run's folder
does not exist under today's name but does under the old one (its overrides as typed now, or any
folder of the runs root whose run.json holds this configuration), the run resumes there, with a
note.
Imports only Hydra/OmegaConf, like :mod:`lnexp.config`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lnexp import config, rundir
from lnexp import overrides as override
from lnexp.names import LENGTH_KEYS

Composer = Callable[[list[str]], DictConfig]  # overrides -> the unresolved config, hydra node included
_NOTED: set[str] = set()
NAME_MAX = 255  # bytes in one folder name (ext4, xfs, btrfs, APFS): a longer name fails to open


def register_resolver() -> None:
    """Make ``${run_name:...}`` of configs/train.yaml resolvable: the Hydra app calls it before it
    starts (Hydra's launchers carry OmegaConf's resolvers to their workers)."""
    if not OmegaConf.has_resolver("run_name"):
        OmegaConf.register_new_resolver("run_name", run_name)


def run_name(task_overrides: Any, exclude_keys: Any = (), runs_root: str = "",
             typed_name: str | None = None, *, _root_: DictConfig | None = None) -> str:
    """The ``run_name`` resolver of configs/train.yaml (``hydra.run.dir``, ``hydra.sweep.subdir``):
    today's name of the job's folder, or the old name (``typed_name``: Hydra's override_dirname)
    where only that folder exists under ``runs_root``. ``_root_``: the job's config (OmegaConf
    passes it), so that only the group choices' config is composed again."""
    exclude = set(exclude_keys or ())
    overrides = [str(o) for o in (task_overrides or ()) if override.key(str(o)) not in exclude]
    with composing() as compose_raw:
        name, resolved = name_and_config(overrides, compose_raw,
                                         None if _root_ is None else task_config(_root_))
    root = Path(str(runs_root or "."))
    if (root / name).exists():
        return name
    old = legacy_name(typed_name if typed_name is not None else ",".join(overrides), resolved)
    if len(old.encode()) > NAME_MAX or not (root / old).is_dir():  # typed another way, once?
        old = same_config(root, resolved, exclude) or name
    if old != name and old not in _NOTED:
        _NOTED.add(old)
        print(f"lnexp train: note: this run is in {root / old}, its folder's old name; "
              f"it stays there (today's name: {name})", file=sys.stderr, flush=True)
    return old


def same_config(root: Path, resolved: dict[str, Any], exclude: set[str]) -> str | None:
    """The folder under ``root`` whose run.json holds this configuration (keys that do not name a
    run aside), if one does: a run an older lnexp named after another spelling of it."""
    aside = exclude | {"runs_root"}
    if _lookup(resolved, "schedule.name") == "linear":  # its length names it
        aside -= set(LENGTH_KEYS)
    want = _without(resolved, aside)
    for run_json in sorted(root.glob(f"*/{rundir.RUN}")):
        try:
            cfg = json.loads(run_json.read_text())["config"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _without(cfg, aside) == want:
            return run_json.parent.name
    return None


def _without(tree: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    out = copy.deepcopy(tree)
    for key in keys:
        *path, last = key.split(".")
        node: Any = out
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return out


def name_of(overrides: list[str] | tuple[str, ...]) -> str:
    """The folder name of the run these overrides describe (outside a running Hydra app)."""
    with composing() as compose_raw:
        return name_and_config(list(overrides), compose_raw)[0]


def name_and_config(overrides: list[str], compose_raw: Composer,
                    full: DictConfig | None = None) -> tuple[str, dict[str, Any]]:
    """(folder name, the run's resolved config as plain values). ``full``: the run's config,
    unresolved, if the caller has it (else it is composed)."""
    parsed = [(text, override.parse(text)) for text in config.normalise(list(overrides))]
    groups = [(t, o) for t, o in parsed if _is_group(o)]
    if groups:  # a group's default choice changes nothing: leave it out before composing
        experiment = [t for t, o in groups if o.key_or_group == "experiment"]
        defaults = _default_choices(experiment, compose_raw)
        groups = [(t, o) for t, o in groups
                  if o.key_or_group == "experiment" or _choice(o) != defaults.get(o.key_or_group)]
    raw = _task_tree(compose_raw([t for t, _ in groups]))  # the group choices alone
    if full is None:
        if all(_is_group(o) or _is_plain(o) for _, o in parsed):  # as Hydra applies them
            full = OmegaConf.create(copy.deepcopy(raw))
            for _, o in parsed:
                if not _is_group(o):
                    OmegaConf.update(full, o.key_or_group, o.value(), merge=True)
        else:
            full = task_config(compose_raw([text for text, _ in parsed]))
    resolved = OmegaConf.to_container(full, resolve=True)
    values = [(t, o) for t, o in parsed if not _is_group(o) and _is_plain(o)
              and _lookup(resolved, o.key_or_group) is not _ABSENT]
    kept = [(t, o) for t, o in parsed if not _is_group(o) and (t, o) not in values] + groups
    kept += [(t, o) for t, o in values if not _same_without(o, raw, full, resolved)]
    items = [_spell(t, o, resolved) for t, o in kept]
    if _lookup(resolved, "schedule.name") == "linear":  # its length is part of what is trained
        items = [s for s in items if override.key(s) not in LENGTH_KEYS]
        items.append(f"max_epoch={resolved['max_epoch']}")
        if resolved.get("max_update"):
            items.append(f"max_update={resolved['max_update']}")
    return fitted(",".join(sorted(items)).replace("/", "_") or "default"), resolved


def fitted(name: str) -> str:
    """``name`` if the file system takes it as one folder name; else its first part, ``~`` and 12
    hex digits of its SHA-1, NAME_MAX bytes in all: still one folder per configuration (and
    run.json holds the whole configuration), where the full name could not be created at all."""
    raw = name.encode()
    if len(raw) <= NAME_MAX:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:12]
    head = raw[:NAME_MAX - len(digest) - 1].decode(errors="ignore")
    if name not in _NOTED:
        _NOTED.add(name)
        print(f"lnexp train: note: this run's name has {len(raw)} bytes, over the {NAME_MAX} a folder "
              f"name may have; its folder's name ends ~{digest} (run.json holds the whole configuration)",
              file=sys.stderr, flush=True)
    return f"{head}~{digest}"


def legacy_name(overrides: str, cfg: dict[str, Any] | None = None) -> str:
    """The name older versions gave a run: its overrides as typed (Hydra's override_dirname)."""
    items = [s.replace("'", "").replace('"', "") for s in overrides.split(",") if s]
    if cfg is not None and _lookup(cfg, "schedule.name") == "linear":
        items = [s for s in items if override.key(s) not in LENGTH_KEYS]
        items.append(f"max_epoch={cfg['max_epoch']}")
        if cfg.get("max_update"):
            items.append(f"max_update={cfg['max_update']}")
    return ",".join(sorted(items)).replace("/", "_") or "default"


def number(x: int | float) -> str:
    """One spelling per number: 1e-3, 0.001 and 1.0e-3 -> 0.001; 1e-5 -> 1e-5; 2.0 -> 2."""
    if isinstance(x, int) or (x == x and abs(x) != float("inf") and float(x).is_integer()
                              and abs(x) < 1e15):
        return str(int(x))
    text = repr(float(x))
    mantissa, e, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if e else text


# --- composing, inside `lnexp train` (the resolver) or not (tests, tools) --------------------------


@contextmanager
def composing() -> Iterator[Composer]:
    """``compose_raw(overrides)``: configs/train.yaml composed, unresolved, with Hydra's node (not to
    be modified: compositions are remembered for the process). Inside a running Hydra app (the
    resolver runs there, also in launcher workers) through that app's Hydra; elsewhere through
    :func:`lnexp.config.composer`."""
    from hydra import compose as hydra_compose
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        if "fairseq" in sys.modules:  # its schemas ("optimizer/adam") would shadow lnexp's groups
            config.hide_fairseq_schemas()
        yield _remembered("app", lambda overrides: hydra_compose(
            "train", overrides=overrides, return_hydra_config=True))
        return
    with config.composer() as compose_one:
        yield _remembered("lnexp", lambda overrides: compose_one(overrides, raw=True))


_COMPOSED: dict[tuple[str, tuple[str, ...]], DictConfig] = {}


def _remembered(where: str, compose_raw: Composer) -> Composer:
    def compose(overrides: list[str]) -> DictConfig:
        key = (where, tuple(overrides))
        if key not in _COMPOSED:
            _COMPOSED[key] = compose_raw(list(overrides))
        return _COMPOSED[key]
    return compose


_ABSENT = object()


def _is_group(o) -> bool:
    return o.key_or_group in config.GROUPS and not o.package and not o.is_delete() and not o.is_add()


def _is_plain(o) -> bool:
    """``key=value`` on an existing key (not ``+key``, ``~key``, ``key@pkg``)."""
    return not o.package and not o.is_delete() and not o.is_add() and not o.is_force_add()


def _choice(o) -> str:
    return str(o.value()).strip("'\"")


def _default_choices(experiment: list[str], compose_raw: Composer) -> dict[str, str]:
    """Each group's choice when none is typed (an experiment can change them)."""
    if not experiment:
        return default_choices()
    choices = compose_raw(experiment).hydra.runtime.choices
    return {str(k): str(v) for k, v in choices.items()}


@cache
def default_choices() -> dict[str, str]:
    """Each group's choice in configs/train.yaml's defaults list (no experiment)."""
    raw = OmegaConf.to_container(OmegaConf.load(config.CONFIG_DIR / "train.yaml"))
    out = {}
    for entry in raw["defaults"]:  # type: ignore[index]
        if isinstance(entry, dict):
            (group, choice), = entry.items()
            out[str(group)] = str(choice)
    return out


def task_config(cfg: DictConfig) -> DictConfig:
    """The task part of a composed config (Hydra's node dropped), unresolved."""
    return OmegaConf.create(copy.deepcopy(_task_tree(cfg)))


_TREES: dict[int, tuple[DictConfig, dict[str, Any]]] = {}


def _task_tree(cfg: DictConfig) -> dict[str, Any]:
    """The task part of a composed config as plain values, unresolved (remembered: do not modify)."""
    if id(cfg) not in _TREES or _TREES[id(cfg)][0] is not cfg:
        raw = OmegaConf.to_container(cfg, resolve=False)
        raw.pop("hydra", None)  # type: ignore[union-attr]
        _TREES[id(cfg)] = (cfg, raw)  # type: ignore[assignment]
    return _TREES[id(cfg)][1]


def _lookup(tree: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _ABSENT
        tree = tree[part]
    return tree


def _same_without(o, context: dict[str, Any], full: DictConfig, resolved: dict[str, Any]) -> bool:
    """Would the key of override ``o`` keep its value if ``o`` were left out? Without it the key
    has its config-file definition (``context``: composed with the same group choices), evaluated
    among the run's other values (``full``, given back as it came)."""
    key = o.key_or_group
    default = _lookup(context, key)
    if default is _ABSENT:
        return False
    if isinstance(default, str) and "${" in default:  # an interpolation: evaluate it in the run
        OmegaConf.update(full, key, default, merge=False)
        try:
            default = _select(full, key)
        except Exception:  # an interpolation that only resolves in its own config
            return False
        finally:
            OmegaConf.update(full, key, o.value(), merge=True)
    value = _lookup(resolved, key)
    return isinstance(default, bool) == isinstance(value, bool) and default == value


def _select(cfg: DictConfig, key: str) -> Any:
    node = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def _spell(text: str, o, resolved: dict[str, Any]) -> str:
    """``key=value`` with the value written one way: numbers as :func:`number`, group choices by
    name; anything else as typed (quotes dropped)."""
    if _is_group(o):
        return f"{o.key_or_group}={_choice(o)}"
    if _is_plain(o):
        value = _lookup(resolved, o.key_or_group)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return f"{o.key_or_group}={number(value)}"
    return text.replace("'", "").replace('"', "")
