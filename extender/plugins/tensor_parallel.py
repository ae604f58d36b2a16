"""TensorParallel: the TP size must split the model's attention heads and KV heads evenly.

vLLM refuses to start otherwise, after the pod has been placed, pulled and has loaded weights.
The check depends only on the pod, so it runs once as a pre-filter and, when it fails, marks every
node unresolvable with vLLM's own wording:

* ``Total number of attention heads (64) must be divisible by tensor parallel size (3).``
  (``ModelConfig.verify_with_parallel_config``);
* KV heads: vLLM's ``QKVParallelLinear`` divides KV heads by TP when TP is smaller and TP by KV
  heads otherwise, asserting ``"<a> is not divisible by <b>"`` when that fails.

Pods that state no TP size, TP=1 pods and pods whose heads are unknown are not checked (demand
parsing already rejects a stated TP > 1 with unknown heads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, StrictInt

from extender.framework.args import PluginArgs
from extender.framework.interfaces import CycleState
from extender.framework.status import Status
from extender.model.demand import PodDemand
from extender.model.heads import tp_problem, valid_tp_sizes
from gpusched_api.validation import BOUNDS, Say

__all__ = ["NAME", "TensorParallel", "TensorParallelArgs", "new", "tp_problem", "valid_tp_sizes"]

NAME = "TensorParallel"


@dataclass(frozen=True)
class TensorParallelArgs(PluginArgs):
    """``suggest_up_to``: list the valid TP sizes up to this bound in the reason (0: don't)."""

    suggest_up_to: Annotated[StrictInt, Field(ge=0, le=1024), Say("must be between 0 and 1024", kinds=BOUNDS)] = 16


class TensorParallel:
    name = NAME
    node_shape_only = True

    def __init__(self, args: TensorParallelArgs) -> None:
        self.args = args

    def pre_filter(self, state: CycleState, demand: PodDemand) -> Status:
        if not demand.parallelism_stated or demand.tp <= 1 or demand.attention_heads is None:
            return Status.success(NAME)
        problem = tp_problem(demand.attention_heads, demand.kv_heads, demand.tp)
        if problem is None:
            return Status.success(NAME)
        if self.args.suggest_up_to:
            sizes = valid_tp_sizes(demand.attention_heads, demand.kv_heads, self.args.suggest_up_to)
            model = f" for {demand.model}" if demand.model else ""
            problem += (f" Valid tensor parallel sizes{model} up to {self.args.suggest_up_to}: "
                        f"{', '.join(map(str, sizes))}.")
        return Status.unresolvable(NAME, problem)


def new(args: TensorParallelArgs) -> TensorParallel:
    return TensorParallel(args)
