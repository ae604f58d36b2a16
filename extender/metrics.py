"""The extender's Prometheus metrics, on a registry of its own (one per app, so several apps can
live in one test process). Names are documented in docs/observability.md's metrics table."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

# Filter/prioritize sit on kube-scheduler's serial critical path: buckets resolve 0.1 ms–1 s.
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ExtenderMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.request_seconds = Histogram(
            "gpusched_extender_request_duration_seconds",
            "Time to answer one extender call, by verb (filter, prioritize, bind).",
            ["verb"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.plugin_service_seconds = Histogram(
            "gpusched_plugin_service_duration_seconds",
            "Time the core took to answer one call of the GpuSched plugin, by method, from its request read to its "
            "reply encoded (streams not included); the plugin's gpusched_plugin_rpc_duration_seconds less this is "
            "time on the socket and waiting for the core.",
            ["method"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.requests = Counter(
            "gpusched_extender_requests_total",
            "Extender calls by verb and HTTP status code.",
            ["verb", "code"], registry=self.registry)
        self.decisions = Counter(
            "gpusched_extender_decisions_total",
            "Decisions by verb and result "
            "(feasible, unschedulable, unresolvable, scored, bound, bind-failed, bind-refused, error).",
            ["verb", "result"], registry=self.registry)

        self.rejections_total = Counter(
            "gpusched_extender_rejections_total",
            "Nodes rejected in filter, by the plugin that rejected them and its status code "
            "(UNSCHEDULABLE: may fit later; UNSCHEDULABLE_AND_UNRESOLVABLE: never on that node).",
            ["plugin", "code"], registry=self.registry)
        self.decision_records = Gauge(
            "gpusched_extender_decision_records",
            "Decision records held in memory for /debug and `gpusched explain`: the recent list (recent) and the "
            "per-pod index (pods); each is bounded by --decision-capacity.",
            ["index"], registry=self.registry)
        self.ledger_entries = Gauge(
            "gpusched_extender_ledger_entries",
            "Pods holding GPUs in gpusched's ledger (bound and assumed).", registry=self.registry)

        self.gang_events = Counter(
            "gpusched_extender_gang_events_total",
            "Gang events: wait (a member reached bind), commit (the barrier opened), complete (every member "
            "bound), timeout (not every member reached bind in time; nothing bound), bind-retry (a member's bind "
            "write failed after the barrier opened; its reservation is kept), partial (a group left partially "
            "bound), recovered (a committed plan rebuilt after a restart).",
            ["event"], registry=self.registry)
        for event in ("wait", "commit", "complete", "timeout", "bind-retry", "partial", "recovered"):
            self.gang_events.labels(event=event)  # exported at 0, so alerts see the series from the start
        self.assignment_mismatches = Counter(
            "gpusched_extender_assignment_mismatches_total",
            "Pods whose containers the kubelet gave other devices than gpusched assigned (the ledger follows the "
            "kubelet; the pod's decision record says which). With gpusched's device plugin, only pods whose "
            "assignment was no longer possible at admission.", registry=self.registry)
        self.shares_over = Gauge(
            "gpusched_extender_shares_over_budget",
            "GPU sharers whose node reports them using more GPU memory than their gpusched.io/gpu-memory share; "
            "their GPUs take no new shares until they are back under.", registry=self.registry)
        self.share_overruns = Counter(
            "gpusched_extender_share_overruns_total",
            "Times a sharer was first reported over its share (once per episode).", registry=self.registry)
        self.gang_gather_seconds = Histogram(
            "gpusched_extender_gang_gather_seconds",
            "From a gang's plan to its barrier opening (every member at bind); compare with the gang timeout.",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0), registry=self.registry)
        # Children by label values, each looked up once: ``labels()`` per decision (a lock, a
        # tuple, a dict lookup) cost ~3 % of the core's CPU in extender mode (issue 43). The label
        # values are gpusched's own (verbs, results, plugin names, status codes): a few dozen.
        self._decision_children: dict[tuple[str, str], Any] = {}
        self._rejection_children: dict[tuple[str, str], Any] = {}

    def decision(self, verb: str, result: str) -> None:
        child = self._decision_children.get((verb, result))
        if child is None:
            child = self._decision_children.setdefault((verb, result), self.decisions.labels(verb=verb, result=result))
        child.inc()

    def rejections(self, counts: Mapping[tuple[str, str], int]) -> None:
        for key, n in counts.items():
            child = self._rejection_children.get(key)
            if child is None:
                plugin, code = key
                child = self._rejection_children.setdefault(
                    key, self.rejections_total.labels(plugin=plugin or "Framework", code=code))
            child.inc(n)


class GangMetrics:
    """The gang coordinator's observer (``service.gangs.GangObserver``) over the extender's metrics."""

    def __init__(self, metrics: ExtenderMetrics):
        self._metrics = metrics

    def event(self, event: str) -> None:
        self._metrics.gang_events.labels(event=event).inc()

    def gathered(self, seconds: float) -> None:
        self._metrics.gang_gather_seconds.observe(seconds)


class ReasonCounts(Collector):
    """A counter family read at scrape time from a mapping reason -> count kept elsewhere; every
    reason in ``reasons`` is exported, 0 until counted."""

    def __init__(self, name: str, documentation: str, reasons: tuple[str, ...], counts: Mapping[str, int]) -> None:
        self._name, self._documentation, self._reasons, self._counts = name, documentation, reasons, counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._documentation, labels=["reason"])
        for reason in self._reasons:
            family.add_metric([reason], self._counts.get(reason, 0))
        yield family


def count_refused_claims(registry: CollectorRegistry, refused: Mapping[str, int]) -> None:
    """Export ``gpusched_pod_claims_refused_total{reason}`` from ``ClusterState.claims_refused``
    (refusals of a gpusched.io/assigned-gpus gpusched could not have written), read at scrape time.
    One refusal per observed pod event, not per pod: the ledger keeps no set of refused pods (a
    tenant could grow it), so a squatter is counted again at each of its events."""
    registry.register(ReasonCounts(
        "gpusched_pod_claims_refused",
        "Observations of a bound pod whose gpusched.io/assigned-gpus is not believed, by reason: count-mismatch "
        "(the pod does not ask for that many GPUs), malformed, unit-not-in-inventory (not its node's GPU), "
        "held-by-another (another pod holds a named GPU: a claim never displaces it). Counts refusals, not "
        "distinct pods: a squatter pod is counted again at each of its events (updates, relists). Such a pod "
        "holds what it requests, unattributed.",
        ("count-mismatch", "malformed", "unit-not-in-inventory", "held-by-another"), refused))


class CapacityGauge(Collector):
    """``gpusched_capacity_replicas{shape, node_class}`` read at scrape time from ``latest()``
    (``service.capacity.CapacityBoard.latest``: shape name -> its last count), which a periodic
    task refreshes: a scrape never judges anything."""

    def __init__(self, latest: Any) -> None:
        self._latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "gpusched_capacity_replicas",
            "How many more replicas of each configured engine shape (the model catalog ConfigMap's shapes.yaml) "
            "fit now, per node class (<count>x <GPU product>); sum by shape for the cluster's total.",
            labels=["shape", "node_class"])
        for name, capacity in sorted(self._latest().items()):
            for cls in capacity.classes:
                family.add_metric([name, cls.node_class], cls.replicas)
        yield family


SLICE_INPUT_IGNORED = ("other-driver", "no-node", "no-uuid", "wrong-type", "duplicate-uuid")


def count_ignored_slice_input(registry: CollectorRegistry, ignored: Mapping[str, int]) -> None:
    """Export ``gpusched_dra_slice_input_ignored_total{reason}`` from ``DraState.ignored``: what
    the ResourceSlice decoder left out (``extender.adapters.dra.feeds``), per slice event."""
    registry.register(ReasonCounts(
        "gpusched_dra_slice_input_ignored",
        "ResourceSlice input the extender left out, by reason: other-driver (a slice not of the judged DRA driver), "
        "no-node (a slice bound to no node), no-uuid (a device without a string uuid attribute: no GPU to map it "
        "to), wrong-type (an attribute of another type than the driver publishes, read as absent), duplicate-uuid "
        "(a second device naming a GPU already seen). Counted per slice event.", SLICE_INPUT_IGNORED, ignored))
