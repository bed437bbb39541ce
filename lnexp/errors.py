"""User-facing errors: the CLI prints them as one line and exits with status 2."""

import argparse
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
