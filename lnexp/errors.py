"""User-facing errors: the CLI prints them as one line and exits with status 2."""

import argparse
import math
from pathlib import Path
from typing import NoReturn


class UserError(Exception):
    """A mistake the user can fix; the message names the fix."""


class DataError(UserError):
    """Missing, malformed or inconsistent input data."""


class ConfigError(UserError):
    """An invalid configuration value."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse for lnexp's commands: a bad argument is a UserError (one line, exit 2), not
    argparse's usage block."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} ({self.prog} --help)")


def at_least(low: int):
    """An argparse type: a whole number >= ``low`` (argparse names the option in its message)."""

    def whole(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {n}")
        return n

    whole.__name__ = f"whole number >= {low}"
    return whole


def finite(value: str) -> float:
    """An argparse type: a finite number."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {value}")
    return x


def output_file(value: str, flag: str, example: str) -> Path:
    """An output path from the command line, checked before anything is written: not empty (which
    would be the current folder) and not an existing folder (written into, or beside, by mistake)."""
    if not str(value).strip():
        raise UserError(f"{flag} is empty: give a file name, e.g. {flag} {example}")
    path = Path(value)
    if path.is_dir():
        raise UserError(f"{flag} {value} is a folder: give a file name, e.g. {flag} "
                        f"{path / Path(example).name}")
    return path


def cannot_write(e: OSError, fix: str) -> UserError:
    """One line for an output that could not be written: the path, the system's reason, the fix."""
    return UserError(f"cannot write {e.filename or 'the output'}: {e.strerror or e}: {fix}")
