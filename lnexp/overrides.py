"""Override strings (``key=value``, ``+key=v``, ``++key=v``, ``~key``, ``group@pkg=option``,
quoted values, sweeps) read the way Hydra reads them, with Hydra's own ``OverridesParser``: the one
place in lnexp that looks inside an override, so that every reader (lnexp train's checks, the run
names, the atlas, its launchers) agrees with what Hydra will do with the string.

Below the config layer: imports Hydra's parser only when a string is read.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from lnexp.errors import ConfigError

if TYPE_CHECKING:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override

LAUNCHER_GROUP = "hydra/launcher"  # the launcher's choice; hydra.launcher.KEY its settings


@lru_cache(maxsize=1)
def _parser() -> OverridesParser:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse(text: str) -> Override:
    """Hydra's reading of one override (not to be modified: readings are remembered); a malformed
    one is a ConfigError naming the syntax."""
    return _parse(text)


@lru_cache(maxsize=4096)
def _parse(text: str) -> Override:
    from hydra.errors import HydraException

    try:
        return _parser().parse_override(text)
    except HydraException as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise ConfigError(f"{lines[0] if lines else text} (syntax: key=value, group=option)") from None


def parse_all(texts: Iterable[str]) -> list[Override]:
    return [parse(t) for t in texts]


def key(text: str) -> str:
    """The key or group an override sets (``+a.b=1``, ``~a.b`` and ``a.b@pkg=x`` all give ``a.b``).
    A string that is no override gives what precedes its ``=`` (its own check names the mistake)."""
    try:
        return parse(text).key_or_group
    except ConfigError:
        return text.lstrip("+~").split("=", 1)[0].split("@", 1)[0]


def value(texts: Iterable[str], wanted: str) -> Any:
    """The value the last override of ``wanted`` among ``texts`` gives it, as Hydra types it
    (``max_update=5`` -> 5, ``device='cpu'`` -> 'cpu'); None where none sets it or the last one
    deletes it (``~key``)."""
    found = None
    for text in texts:
        if wanted in text and key(text) == wanted:  # (a text without the key's name is not parsed)
            o = parse(text)
            found = None if o.is_delete() else o.value()
    return found


def choices(o: Override) -> list[str]:
    """``key=value`` for each value an override gives its key: one, or each of a sweep's."""
    values = list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
    return [f"{o.get_key_element()}={v}" for v in values]


def is_hydra(text: str) -> bool:
    """A setting of Hydra itself (``hydra.KEY``, ``hydra/GROUP``), not of the training's config."""
    k = key(text)
    return k == "hydra" or k.startswith(("hydra.", "hydra/"))


def is_launcher(text: str) -> bool:
    """``hydra/launcher=...`` or ``hydra.launcher.KEY=...``: a launcher's settings, not a run's."""
    k = key(text)
    return k == LAUNCHER_GROUP or k.startswith("hydra.launcher.")


def launcher_key(text: str) -> str:
    """The key of a ``hydra.launcher.KEY=...`` override within the launcher's config (``KEY``)."""
    return key(text).removeprefix("hydra.launcher.")
