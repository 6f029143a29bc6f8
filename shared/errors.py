"""Exceptions shared by every part of Veil.

Each error names the field at fault so that a person can fix the input
without reading a traceback.
"""

from __future__ import annotations


def type_name(value: object) -> str:
    """The type of ``value`` for a message about it: the builtin's name (``str``,
    ``NoneType``), else ``module.qualname`` (``numpy.float64``, ``decimal.Decimal``).

    Messages about an application's values name their type, never the value
    itself: the value may be private, huge, or break when it is printed. This
    reads the type's attributes only, so it never fails.
    """
    kind = type(value)
    try:
        module, name = kind.__module__, kind.__qualname__
    except Exception:  # a hostile metaclass
        return "object"
    if type(module) is not str or type(name) is not str:
        return "object"
    return name if module == "builtins" else f"{module}.{name}"


class VeilError(Exception):
    """Base class for every error Veil raises on purpose."""


class ParameterError(VeilError, ValueError):
    """A mechanism parameter or metric definition is invalid."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class WireFormatError(VeilError, ValueError):
    """A batch or report does not follow the wire format."""

    def __init__(self, field: str, message: str, code: str = "invalid") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code

    def to_dict(self) -> dict[str, str]:
        """The error as the JSON object the collector returns."""
        return {"field": self.field, "code": self.code, "message": self.message}
