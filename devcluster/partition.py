"""Node agents behind a network link that a test can cut: each agent process in a network
namespace of its own, linked to this machine by a veth pair, so "the network partitioned" is a
real link going down — packets dropped, TCP connections left open and silent, nothing closed
politely — not a signal to a process.

Layout (all of it on this machine, in one /24 of 198.19.200.0–198.19.254.0 — inside the
harness's 198.18.0.0/15 and clear of ``devcluster.nodenet``'s Services, pods and node address —
the first one no other harness on the machine holds: ``create`` takes a lock per subnet, so two
runs side by side get two subnets):

- a host bridge ``gpsbr<tag>`` holding :attr:`AgentNetwork.host_ip` (198.19.X.1/24): what the
  agents dial. The extender's telemetry port listens there
  (``Stack.start_extender(telemetry_host=network.host_ip)``), and a
  :class:`TcpRelay` there forwards to the apiserver, which binds loopback in the simulated-node
  control plane (a namespace has a loopback of its own, so an agent cannot reach the host's);
- per agent (:meth:`AgentNetwork.add`): a namespace ``gpusched-<tag>-<n>`` whose veth end holds
  198.19.X.<10+n>/24 (the connected route is its only route: nothing else is reachable), the
  host end a port of the bridge;
- :meth:`AgentNetwork.cut` / :meth:`heal` take the host end of one agent's veth down / up: that
  agent, and only it, is partitioned from everything on the host.

:attr:`AgentNetwork.host_ip` is known once :meth:`create` returned (what the agents dial must be
known before the extender starts). :meth:`AgentNetwork.remove` undoes everything :meth:`create` and :meth:`add`
did — namespaces (their veth ends, and so the pairs, go with them) and the bridge — and is safe to
call after a partial create; a test fixture calls it in ``finally``.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
from dataclasses import dataclass
from typing import IO

from devcluster.nodenet import link_exists, run
from devcluster.processes import ComponentFailed

SUBNET_THIRD_OCTETS = range(200, 255)  # 198.19.200.0/24 .. 198.19.254.0/24
PREFIX_LEN = 24
FIRST_AGENT_HOST = 10  # agents get 198.19.X.10, .11, ...
MAX_AGENTS = 200
LOCK_DIR = "/run/lock"  # one lock file per subnet, held while a network uses it


@dataclass(frozen=True)
class AgentLink:
    """One agent's namespace and the two ends of its link. ``netns`` is what ``ip netns exec``
    takes; ``address`` the agent's source address; ``host_end`` the interface cut/heal toggle."""

    netns: str
    address: str
    host_end: str
    ns_end: str


class AgentNetwork:
    """The bridge and the agents' namespaces; see the module docstring for the layout."""

    def __init__(self, tag: str | None = None) -> None:
        self.tag = tag or os.urandom(2).hex()
        self.bridge = f"gpsbr{self.tag}"
        self.links: list[AgentLink] = []
        self._bridge_created = False
        self._net = ""  # "198.19.X" once create() chose X
        self._lock: IO[bytes] | None = None

    @property
    def host_ip(self) -> str:
        """What the agents dial (the bridge's address); set by :meth:`create`."""
        if not self._net:
            raise ComponentFailed("AgentNetwork.host_ip before create(): no subnet chosen yet")
        return f"{self._net}.1"

    def create(self) -> AgentNetwork:
        """Take the first free subnet and make the bridge with :attr:`host_ip`; fails naming what is
        in the way (every subnet taken, or this network's bridge name left over)."""
        if link_exists(self.bridge):
            raise ComponentFailed(f"interface {self.bridge} exists already; remove it with 'ip link del {self.bridge}'")
        self._claim_subnet()
        try:
            run("ip", "link", "add", self.bridge, "type", "bridge")
            self._bridge_created = True
            run("ip", "addr", "add", f"{self.host_ip}/{PREFIX_LEN}", "dev", self.bridge)
            run("ip", "link", "set", self.bridge, "up")
        except BaseException:
            self.remove()
            raise
        return self

    def _claim_subnet(self) -> None:
        """The first 198.19.X.0/24 whose lock no one holds and whose .1 no interface carries (a
        leftover of a run that did not clean up is stepped over, not fought)."""
        os.makedirs(LOCK_DIR, exist_ok=True)
        for octet in SUBNET_THIRD_OCTETS:
            lock = open(os.path.join(LOCK_DIR, f"gpusched-partition-198.19.{octet}.lock"), "wb")  # noqa: SIM115 - held
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue
            if run("ip", "-o", "addr", "show", "to", f"198.19.{octet}.1/32", check=False).stdout.strip():
                lock.close()
                continue
            self._net, self._lock = f"198.19.{octet}", lock
            return
        raise ComponentFailed(f"every partition subnet (198.19.{SUBNET_THIRD_OCTETS[0]}-{SUBNET_THIRD_OCTETS[-1]}.0/24) "
                              "is in use; remove leftover gpsbr* interfaces with 'ip link del'")

    def add(self) -> AgentLink:
        """A new namespace linked to the bridge, its link up; returns where an agent runs."""
        if not self._bridge_created:
            raise ComponentFailed("AgentNetwork.add before create(): there is no bridge to link to")
        n = len(self.links)
        if n >= MAX_AGENTS:
            raise ComponentFailed(f"at most {MAX_AGENTS} agents fit in {self._net}.0/{PREFIX_LEN}")
        link = AgentLink(netns=f"gpusched-{self.tag}-{n}", address=f"{self._net}.{FIRST_AGENT_HOST + n}",
                         host_end=f"gpsh{self.tag}{n}", ns_end=f"gpsn{self.tag}{n}")
        run("ip", "netns", "add", link.netns)
        self.links.append(link)  # from here on remove() deletes the namespace, whatever fails next
        run("ip", "link", "add", link.host_end, "type", "veth", "peer", "name", link.ns_end)
        # Until the ns end moves, both ends are on the host: remove() must find them there too.
        run("ip", "link", "set", link.ns_end, "netns", link.netns)
        run("ip", "link", "set", link.host_end, "master", self.bridge)
        run("ip", "link", "set", link.host_end, "up")
        inside = ("ip", "netns", "exec", link.netns)
        run(*inside, "ip", "link", "set", "lo", "up")
        run(*inside, "ip", "addr", "add", f"{link.address}/{PREFIX_LEN}", "dev", link.ns_end)
        run(*inside, "ip", "link", "set", link.ns_end, "up")
        return link

    def cut(self, link: AgentLink, how: str = "link-down") -> None:
        """Partition ``link``'s agent; no connection is closed either way. ``how``:

        - ``link-down``: its link goes down (its peer loses carrier), so every packet either way is
          dropped — and the agent's kernel knows its link is dead;
        - ``silent``: the link stays up and this machine drops every packet from and to the agent's
          address (iptables, filter table) — a partition somewhere in the network, which the agent
          can only notice by what stops arriving.
        """
        if how == "link-down":
            run("ip", "link", "set", link.host_end, "down")
        elif how == "silent":
            for rule in _silencing_rules(link):
                run("iptables", "-I", *rule)
        else:
            raise ValueError(f"unknown cut {how!r}: use 'link-down' or 'silent'")

    def heal(self, link: AgentLink) -> None:
        """Undo either cut (safe to call when ``link`` is not cut)."""
        run("ip", "link", "set", link.host_end, "up")
        for rule in _silencing_rules(link):
            while run("iptables", "-D", *rule, check=False).returncode == 0:
                pass

    def remove(self) -> list[str]:
        """Delete the namespaces and the bridge; returns what could not be removed (empty: all gone)."""
        left = []
        for link in reversed(self.links):
            self.heal(link) if link_exists(link.host_end) else None
            for rule in _silencing_rules(link):
                if run("iptables", "-C", *rule, check=False).returncode == 0:
                    left.append(f"iptables rule {' '.join(rule)}")
            run("ip", "netns", "del", link.netns, check=False)
            if link_exists(link.host_end):  # the pair outlives a namespace only if the move failed
                run("ip", "link", "del", link.host_end, check=False)
            if run("ip", "netns", "pids", link.netns, check=False).returncode == 0:
                left.append(f"network namespace {link.netns}")
        self.links.clear()
        if self._bridge_created:
            run("ip", "link", "del", self.bridge, check=False)
            if link_exists(self.bridge):
                left.append(f"interface {self.bridge}")
            self._bridge_created = False
        if self._lock is not None and not left:  # the subnet is free again only when all of it is gone
            self._lock.close()
            self._lock = None
        return left


def _silencing_rules(link: AgentLink) -> list[tuple[str, ...]]:
    """The two rules of a silent cut: what the agent sends this machine, and what this machine sends
    it. Tagged with a comment naming the namespace, so nothing else's rules are touched."""
    tag = ("-m", "comment", "--comment", f"gpusched-partition {link.netns}", "-j", "DROP")
    return [("INPUT", "-s", f"{link.address}/32", *tag), ("OUTPUT", "-d", f"{link.address}/32", *tag)]


class TcpRelay:
    """Forwards TCP connections accepted on ``listen_host`` (a free port: :attr:`port`) to
    ``target`` (host, port), byte for byte, on a thread and event loop of its own.

    It stands on the host side of a partition, so a cut link stalls it as it stalls a direct
    connection: it never closes a connection for silence, and TLS passes through it untouched
    (the client verifies the target's certificate). ``stop()`` closes the listener and every
    connection."""

    def __init__(self, listen_host: str, target: tuple[str, int]) -> None:
        self.listen_host = listen_host
        self.target = target
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._run, name=f"relay-{listen_host}", daemon=True)

    def start(self) -> TcpRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise ComponentFailed(f"the TCP relay on {self.listen_host} did not start within 10s")
        if self._error is not None:
            raise ComponentFailed(f"the TCP relay cannot listen on {self.listen_host}: {self._error}")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, self.listen_host, 0))
            self.port = self._server.sockets[0].getsockname()[1]
        except OSError as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:  # a reset either way ends both directions
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.close()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)
            self._loop.stop()
        asyncio.run_coroutine_threadsafe(close(), self._loop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()
