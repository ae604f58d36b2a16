"""The one error of a validated input: the path of the offending field and a sentence about it.

Every document gpusched validates — the scheduling profile and its plugin arguments, the node's
GPU inventory (annotation or GPU Feature Discovery labels), the fake-GPU fleet file — fails the
same way: ``<field path>: <sentence naming the value and what to write instead>``, the path
spelt as in the input (``profile.scorePlugins[1].weight``, ``gpus[2].memoryMiB``). Callers that
only report it catch ``ValueError``; those that need the path read :attr:`FieldError.path`.
"""

from __future__ import annotations


class FieldError(ValueError):
    """An invalid field: ``path`` is where it stands in the input, ``message`` what is wrong with it."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
