"""The service's collaborators at the edge, as small interfaces. Adapters implement them
(``extender.adapters``); tests use the fakes beside them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class BindError(Exception):
    """Binding failed. ``temporary`` errors (conflicts, timeouts, apiserver unavailable) may
    succeed on kube-scheduler's retry; permanent ones (forbidden, pod gone) will not."""

    def __init__(self, message: str, *, temporary: bool):
        super().__init__(message)
        self.message = message
        self.temporary = temporary


class Binder(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """Write ``annotations`` on the pod (guarded by ``uid``), then create its
        ``pods/binding`` to ``node``. Raises :class:`BindError`; returns only once bound."""


class DisabledBinder:
    """The binder of the standalone (``--no-kube``) mode: there is no cluster to bind in."""

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        raise BindError("bind is disabled: the extender runs without a cluster (--no-kube)", temporary=False)


class RecordingBinder:
    """A fake binder that records binds in memory; ``fail_with`` makes every bind fail."""

    def __init__(self, fail_with: BindError | None = None):
        self.bound: list[tuple[str, str, str, str, dict[str, str]]] = []
        self.fail_with = fail_with

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        if self.fail_with is not None:
            raise self.fail_with
        self.bound.append((namespace, name, uid, node, dict(annotations)))
