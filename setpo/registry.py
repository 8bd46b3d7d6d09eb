"""Registries by name: the base advantage estimators (``setpo.advantages``) and the diversity terms
(``setpo.diversity``) are each one dict filled by a decorator, so a new method is one decorated function."""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def registrar(registry: dict[str, Callable], kind: str) -> Callable[[str], Callable[[F], F]]:
    """A ``register(name)`` decorator adding functions to ``registry``; ``kind`` names them in errors."""

    def register(name: str) -> Callable[[F], F]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {kind}'s name must be a non-empty str, got {name!r}")

        def deco(fn: F) -> F:
            if not callable(fn):
                raise ValueError(f"{kind} {name!r} must be callable, got {type(fn).__name__}")
            if name in registry:
                raise ValueError(f"{kind} {name!r} is already registered")
            registry[name] = fn
            return fn

        return deco

    return register


def lookup(registry: dict[str, Callable], name, kind: str) -> Callable:
    """registry[name], or a ValueError naming the unknown ``kind`` and the registered names."""
    if not isinstance(name, str) or name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; registered: {sorted(registry)}")
    return registry[name]
