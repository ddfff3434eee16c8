"""User-facing errors: the CLI prints them as one line, the server maps them to 400."""


class InferlabError(ValueError):
    """A problem with the user's input (a file, a flag, a request); never a bug. A ValueError,
    as vLLM raises for the same inputs: callers catching ValueError catch these too."""


class InvalidParameterError(InferlabError):
    """A parameter outside its range (the server's 400 names it)."""


class PromptError(InferlabError):
    """A prompt the model cannot take: empty, or a token id outside its vocabulary (the server's
    400 names the request field that holds the prompt)."""


class ContextLengthError(PromptError):
    """A prompt, or a prompt and its max_tokens, longer than the model's context."""


class GuidedDecodingError(InferlabError):
    """A request's grammar could not be followed while it ran (one too ambiguous to track);
    the request fails with finish reason "error", the others go on."""


class ModelLoadError(InferlabError):
    """A model file or directory that cannot be loaded; the message names the file."""
