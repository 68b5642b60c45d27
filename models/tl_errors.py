"""The errors a TransformerLens call raises on a groklens model when it cannot be right for it
(a BadInput: one line, exit status 2 from the CLI), kept apart so that the model, its cache and
its stream decomposition import them without importing each other."""

from __future__ import annotations

from groklens.errors import BadInput


class TLUnsupported(BadInput, ValueError):
    """A TransformerLens method that cannot be right for this model; the message says what to use."""


class TLUnsupportedAttribute(TLUnsupported, AttributeError):
    """An attribute TransformerLens users read that this model does not have (hasattr is False)."""


class TLUnknownName(TLUnsupported, KeyError):
    """A hook or cache name this model does not have (a KeyError too, as TransformerLens expects)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
