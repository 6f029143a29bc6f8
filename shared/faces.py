"""The registries of a mechanism's faces, written where each face is defined.

A mechanism (a kind of metric, or one oracle of a category metric) has faces in
several packages: its parameters (:mod:`veil.shared.kinds`), the statistic the
collector keeps (:mod:`veil.shared.statistics`), the client's encoder, the
analysis's decoder and the simulation encoder. Each face has one
:class:`FaceRegistry`, keyed by the parameter class's ``mechanism_name`` (a
statistic by its own name), and each implementation adds itself when it is
defined: a subclass hook (``__init_subclass__``) or a decorator calls
:meth:`FaceRegistry.add`. Nothing keeps a list of the built-in mechanisms besides
the imports that define them, so a mechanism defined anywhere, a test module
included, is found by everything that looks its faces up.

A package whose ``__init__`` must stay cheap (the analysis, which the ``veil`` command
imports to list its subcommands) names the modules of its built-in implementations
instead (``FaceRegistry(face, built_in=...)``): they are imported on the registry's first
read, so it is complete however little of the package a program imported.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from veil.shared.errors import ParameterError

V = TypeVar("V")

#: every registry made, so that :func:`registrations_undone` can restore them all
_REGISTRIES: list[FaceRegistry[Any]] = []


class FaceRegistry(Mapping[str, V]):
    """One face of every mechanism, by name, in the order the implementations were defined.

    A read-only mapping for its users; :meth:`add` is for the hooks and decorators that
    define a face. ``face`` names what it holds, for error messages; ``built_in`` names the
    modules that define the built-in implementations, imported on the first read (for a
    registry whose package does not import them itself).
    """

    def __init__(self, face: str, built_in: Sequence[str] = ()) -> None:
        self.face = face
        self._items: dict[str, V] = {}
        self._built_in = tuple(built_in)
        _REGISTRIES.append(self)

    def _complete(self) -> dict[str, V]:
        """The items, once the :attr:`_built_in` modules have been imported."""
        while self._built_in:
            module, self._built_in = self._built_in[0], self._built_in[1:]
            importlib.import_module(module)
        return self._items

    def add(self, name: str, item: V) -> V:
        """Register ``item`` as the ``face`` of ``name`` and return it.

        A second, different implementation for one name is a mistake (two encoders for
        one mechanism) and raises :class:`ValueError`; the same definition again (its
        module re-imported) replaces the first.
        """
        held = self._items.get(name)
        if held is not None and held is not item and _origin(held) != _origin(item):
            raise ValueError(f"{name!r} already has a {self.face} ({_describe(held)}); "
                             f"{_describe(item)} cannot be a second one")
        self._items[name] = item
        return item

    def lookup(self, name: str, field: str = "params") -> V:
        """The ``face`` of ``name``; a :class:`ParameterError` on ``field`` naming the
        registered ones when it has none."""
        item = self._complete().get(name)
        if item is None:
            known = ", ".join(map(repr, self._items)) or "none"
            raise ParameterError(field, f"no {self.face} for {name!r} (registered: {known})")
        return item

    def __getitem__(self, name: str) -> V:
        return self._complete()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._complete())

    def __len__(self) -> int:
        return len(self._complete())

    def __repr__(self) -> str:
        return f"FaceRegistry({self.face!r}, {list(self._complete())!r})"


@contextlib.contextmanager
def registrations_undone() -> Iterator[None]:
    """Within the block, faces may be registered (a test defining a mechanism of its own);
    on leaving it every registry holds again exactly what it held on entering.

    Every registry is completed first; a module imported for the first time inside the
    block would have its registrations undone too, so import the faces' modules before."""
    saved = [(registry, dict(registry._complete())) for registry in _REGISTRIES]
    try:
        yield
    finally:
        for registry, items in saved:
            registry._items = items


def _origin(item: Any) -> tuple[str, str] | None:
    """Where ``item`` was defined (module and qualified name), for a class or function."""
    target = item if isinstance(item, type) or callable(item) else type(item)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return (module, name) if module and name else None


def _describe(item: Any) -> str:
    origin = _origin(item)
    return f"{origin[0]}.{origin[1]}" if origin else repr(item)
