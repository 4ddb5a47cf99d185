"""Errors a user can cause. Each carries a message meant to be shown as is."""


class DDTreeVizError(Exception):
    """Base class: bad input or an unusable model/trace, explained in plain words."""


class InputError(DDTreeVizError, ValueError):
    """A prompt, budget, token count or other setting is out of range."""


class ModelLoadError(DDTreeVizError):
    """A target, tokenizer or drafter could not be found or loaded."""


class PairingError(DDTreeVizError):
    """The drafter does not fit the target (hidden size, vocabulary, layer ids)."""


class TraceError(DDTreeVizError):
    """A trace file is missing, corrupt, or of an unsupported schema version."""
