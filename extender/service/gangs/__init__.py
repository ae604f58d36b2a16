"""Gangs: all-or-nothing placement of pod groups, in one package by concern.

- ``coordinator``: :class:`GangCoordinator`, the :class:`~extender.service.core.Decider` in front
  of the decision core (the plan's states are described there);
- ``collaborators``: what it is given: the :class:`Judge` it asks, settings, hooks and clocks;
- ``index``: which pods declare which group, fed by filter requests and the watches (``GangWatch``,
  the pod watch's listener, hands a relist's commit records to the coordinator's ``adopt``);
- ``admission`` and ``simulation``: a group's plan made and reserved, or why not;
- ``barrier``: members arrive at reserve, pass once the last arrived, and are granted their bind;
- ``book``: the coordinator's records and a plan's transitions after admission;
- ``recovery``: committed plans rebuilt from bound members' records after a restart;
- ``plan``: the records themselves and how ``/debug/gangs`` shows them.
"""

from extender.service.gangs.collaborators import Clocks, GangHooks, GangObserver, GangSettings, Judge
from extender.service.gangs.coordinator import GangCoordinator
from extender.service.gangs.index import GangIndex, GangWatch
from extender.service.gangs.plan import PartialGang

__all__ = ["Clocks", "GangCoordinator", "GangHooks", "GangIndex", "GangObserver", "GangSettings", "GangWatch", "Judge",
           "PartialGang"]
