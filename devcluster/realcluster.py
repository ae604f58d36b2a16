"""A cluster with a real node: its own control plane (with kube-controller-manager), one real
kubelet node (``devcluster.realnode``), and gpusched installed from manifests/ and running as in
the simulated-node stack. Kept apart from that stack on purpose: the node-lifecycle controller
would mark every simulated Node NotReady (they have no kubelet to heartbeat) and taint them."""

from __future__ import annotations

from devcluster.controlplane import ControlPlane, build_binaries
from devcluster.realnode import RealNode
from devcluster.stack import Stack


class RealCluster:
    def __init__(self, node_labels: dict[str, str] | None = None):
        self.cp = ControlPlane(build_binaries(), with_nodes=True)
        self.node = RealNode(self.cp, labels=node_labels)
        self.stack = Stack(self.cp)

    def start(self) -> "RealCluster":
        try:
            self.cp.start()
            self.node.start()
            self.stack.install()
            self.stack.start_extender()
            self.stack.start_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        try:
            self.node.stop()
        finally:
            self.cp.stop()
