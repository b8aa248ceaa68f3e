"""The project's exceptions: one base, typed subclasses, each message says what to do."""


class JacobiError(Exception):
    """Base of every error jacobi-rt raises on purpose. The CLI prints it as one line, exit 1."""


class ArtifactError(JacobiError):
    """An artifact folder is missing, incomplete, altered, or of an unknown format."""


class ModelSourceError(JacobiError):
    """A model to export cannot be found, read, or is of an unsupported architecture."""


class ExportCheckError(JacobiError):
    """The exported ONNX disagrees with PyTorch beyond tolerance."""


class InputError(JacobiError, ValueError):
    """A request the runtime cannot serve: empty prompt, ids out of vocabulary, bad limits."""


class OptionError(InputError):
    """An option passed to a library call is invalid. The message names the parameter in
    backquotes (`max_context`); a front end names it its own way with `naming` (`--max-context`)."""

    def __init__(self, message: str, *parameters: str):
        super().__init__(message)
        self.parameters = parameters

    def naming(self, rename) -> str:
        """The message with each `parameter` replaced by rename(parameter)."""
        text = str(self)
        for parameter in self.parameters:
            text = text.replace(f"`{parameter}`", rename(parameter))
        return text


class ContextLimitError(InputError):
    """The prompt (plus what must be generated) does not fit in the model's context."""


class BackendError(JacobiError):
    """A backend cannot be created or run: missing package, missing device, mismatched engine."""


class MissingDependencyError(JacobiError, ImportError):
    """An optional package is not installed; the message gives the pip command."""


def require(module: str, pip_hint: str):
    """Import an optional dependency or raise MissingDependencyError naming the install command."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"`{module}` is not installed ({exc}). Install it with: {pip_hint}") from exc
