"""User-facing errors: the CLI prints them as one line and exits with status 2."""


class UserError(Exception):
    """A mistake the user can fix; the message names the fix."""


class DataError(UserError):
    """Missing, malformed or inconsistent input data."""


class ConfigError(UserError):
    """An invalid configuration value."""
