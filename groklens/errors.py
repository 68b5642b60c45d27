"""Error types shared by every room; the CLI maps them to exit status and a one-line message."""


class GroklensError(Exception):
    """Base class of every error groklens raises on purpose."""

    exit_code = 1


class BadInput(GroklensError):
    """The user asked for something invalid: bad option, bad config, bad or unknown file (exit 2)."""

    exit_code = 2


class RunFailure(GroklensError):
    """Valid input, but the work failed (non-finite loss, disk full, ...) (exit 1)."""

    exit_code = 1


class PluginWarning(UserWarning):
    """A plugin (an entry point of groklens.analyses, .models or .experiments) was left out:
    it failed to import, reused a registered name or called sys.exit; the CLI shows it as one
    `groklens: warning:` line."""


def require_pandas():
    """pandas, an optional extra imported on use (to_pandas); one ImportError line without it."""
    try:
        import pandas
    except ImportError:
        raise ImportError("to_pandas needs pandas, an optional extra: pip install 'groklens[pandas]'") from None
    return pandas
