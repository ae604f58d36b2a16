"""The service's collaborators at the edge, as small interfaces. Adapters implement them
(``extender.adapters``); tests use the fakes beside them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from extender.model.dra import DraClaim


class BindError(Exception):
    """Binding failed. ``temporary`` errors (conflicts, timeouts, apiserver unavailable) may
    succeed on kube-scheduler's retry; permanent ones (forbidden, pod gone) will not.
    ``may_have_landed``: no answer says the write did not happen (the connection broke, the request
    timed out, the apiserver answered 5xx while restarting), so the pod may be bound after all."""

    def __init__(self, message: str, *, temporary: bool, may_have_landed: bool = False):
        super().__init__(message)
        self.message = message
        self.temporary = temporary
        self.may_have_landed = may_have_landed


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


class ClaimReader(Protocol):
    def claim(self, namespace: str, name: str) -> DraClaim | None:
        """The ResourceClaim as the apiserver has it now; None when it does not exist. Raises
        :class:`BindError` when it cannot be read."""
        ...


class StaticClaimReader:
    """A fake reader: the claims it was given, by ``namespace/name``; records what was read."""

    def __init__(self, claims: Mapping[str, DraClaim] | None = None):
        self.claims = dict(claims or {})
        self.reads: list[str] = []

    def claim(self, namespace: str, name: str) -> DraClaim | None:
        self.reads.append(f"{namespace}/{name}")
        return self.claims.get(f"{namespace}/{name}")


class Evictor(Protocol):
    def evict(self, namespace: str, name: str, uid: str) -> str:
        """Evict the pod (the Eviction API: PodDisruptionBudgets enforced), guarded by ``uid``.
        "" when evicted or already gone; else why not (a budget, the apiserver's refusal)."""
        ...
