"""User-facing errors: the CLI prints them as one line, the server maps them to 400."""


class InferlabError(Exception):
    """A problem with the user's input (a file, a flag, a request); never a bug."""


class InvalidParameterError(InferlabError, ValueError):
    """A parameter outside its range (a ValueError too, as dataclass validation raises)."""


class ModelLoadError(InferlabError):
    """A model file or directory that cannot be loaded; the message names the file."""
