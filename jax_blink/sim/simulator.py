"""Discrete-event alpha-beta simulation of a :class:`~jax_blink.schedule.Schedule`.

:func:`simulate` plays a schedule over the links of a topology and returns
its completion time, how busy every directed link was, and when each tree and
rank finished. It is the instrument that compares Blink plans with the
baselines of :mod:`jax_blink.sim.baselines` on the same topology, and it is pure
Python + numpy: it never imports jax.

The model
---------
Every parameter lives in :class:`~jax_blink.sim.SimModel`; times below are
seconds, sizes bytes, and a bandwidth of ``b`` GB/s moves ``b * 1e9`` bytes per
second.

**Links.** The arcs are those of the topology's
:class:`~jax_blink.topo.LinkGraph` over all its link kinds: a link ``u``-``v``
is two independent directed *arcs* ``u->v`` and ``v->u``, each with the
bandwidth of its own direction (they differ where the topology says so), and
parallel links between the same pair add up into one arc per direction.

**Routes.** A transfer of tree ``t`` from rank ``u`` to rank ``v`` follows
the route the schedule carries for that tree and pair
(:attr:`Schedule.routes <jax_blink.schedule.Schedule.routes>`: the planner's
choice). Without one it takes the link graph's default route
(:meth:`~jax_blink.topo.LinkGraph.route`): the direct arc when there is one,
else the path through switch nodes only (GPUs never forward in hardware) with
the fewest hops and, among those, the widest bottleneck. A logical
rank-to-rank hop through a switch therefore consumes capacity on every arc of
its path -- the sender's uplink port *and* the receiver's downlink port -- at
the same time. Two ranks joined neither by a link nor through switches cannot
exchange data: :class:`~jax_blink.sim.SimError`.

**Channels.** SENDs are issued on *channels*, one transmission at a time per
channel, in the sender's list order. A SEND is issued ``step_overhead``
after its dependencies are done (the overhead overlaps a transmission in
progress, as an executor enqueues its next copy while the current one runs)
and transmits as soon as its channel is free. The channel is busy only while
it transmits; the data arrives ``latency`` later (the sum of the per-arc
latencies of the route), so latency delays a chunk's dependants but does not
cost bandwidth (links are pipes, as with NCCL's slices in flight). With
``SimModel.channels = "tree"`` (the default) each (sender, receiver, tree)
is a channel, as Blink gives each tree and NCCL each ring its own stream or
thread block; with ``"link"`` each (sender, receiver) pair is one channel.

**Sharing.** While transmitting, a transfer is a *flow* over every arc of its
route. An arc's bandwidth is shared among the flows crossing it in
proportion to their tree's share of the data (the bytes of its chunks over
the vector's), and a flow advances at the smallest of its arcs' shares. For
a plan this is the tree's weight, so every tree gets at least its planned
bandwidth on every arc it crosses (the plan keeps every arc within capacity)
and more while others idle: the executor is assumed to pace trees by their
weights. Equal per-flow sharing instead lets light trees run ahead while
heavy ones fall behind their plan. The sharing is work-conserving on each
arc but not max-min fair across arcs (bandwidth a flow cannot use because it
is bottlenecked elsewhere is not handed to the others), so it is slightly
pessimistic where flows with different bottlenecks share an arc. Rates change
only where a flow starts or ends, and are recomputed once every event of that
instant has run.

**Receives.** Data is pushed into a staging buffer at the receiver
(receivers always have room, as with NCCL's FIFOs). A ``RECV_REDUCE``
reduces the data *as it arrives* (the executors' fused reduce-copy): the
transfer is also a flow over the receiving rank's *reducer*, a resource of
``reduce_gbps`` shared with the rank's other reductions, so reduction costs
time only where it is slower than the links bringing the data. A RECV step
starts once its dependencies are done and its data has arrived, and lasts
``step_overhead``.

**Completion.** A SEND completes when its data has arrived (so a later write
to the chunk, which depends on the SEND, waits until the receiver has it, as
the executors enforce). The collective ends when the last step of any rank
completes.

Closed forms (``tests/sim/test_simulate.py``, ``tests/sim/test_fidelity.py``)
---------------------------------------------------------------------------
With ``step_overhead = 0`` and an infinitely fast reducer, a one-loop ring
allreduce of ``S`` bytes over ``n`` ranks takes ``2 (n - 1) alpha + 2 (n - 1)
/ n * S / B`` and a ``k``-chunk broadcast along a chain of ``P`` links takes
``P alpha + (P - 1 + k) S / (k B)`` (the pipeline's fill; the latency is paid
once per link, not once per chunk). With the default model at 256 MB, where the reducer is not the
bottleneck (``reduce_gbps`` at least the bandwidth into a rank), every
schedule whose pipeline keeps its busiest arc busy takes that arc's time,
``max over arcs of bytes(a) / c(a)``, within 2%: the NCCL-style ring (on a
switch of ``B`` GB/s ports, ``2 (n - 1) / n * S / B``: 171.4 GB/s algbw on the
DGX A100), reduce-scatter + all-gather, and Blink's plan on the switched
presets; a chain of ``k`` chunks adds its fill, ``(2 (n - 1) + k - 1) / k``
times that. Where the model departs from these forms: deep trees with a
clamped chunk count (Blink's plan on the DGX-1, the double binary tree on
NVSwitch) pay their pipeline fill, and a reducer slower than the links (the
300 GB/s default against an H100's 450 GB/s ports) or shared memory's
2 ms step latency dominates (``docs/simulator.md``).

Examples
--------
>>> from types import SimpleNamespace as T
>>> from jax_blink.schedule import lower_trees
>>> from jax_blink.topo import Topology
>>> chain = T(root=0, edges=[(0, 1), (1, 2)], weight=1.0)
>>> s = lower_trees([chain], nranks=3, collective="broadcast", root=0,
...                 count=2**20, dtype="float32", chunks=4)
>>> topo = Topology.from_links(3, [(0, 1, 10.0), (1, 2, 10.0)])
>>> model = SimModel(latency_us={"nvlink": 1.0}, step_overhead_us=0.0)
>>> r = simulate(s, topo, model=model)
>>> round(r.time_s * 1e6, 3)  # 2 links * 1 us + (2 links + 4 chunks - 1) * 1 MiB / 10 GB/s
526.288
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import defaultdict, deque

import numpy as np

from .._gcpause import gc_paused
from ..planning.collectives import bus_factor
from ..schedule import Schedule
from ..topo import TopologyError
from .model import SimError, SimModel

__all__ = ["simulate", "SimResult", "bus_factor"]

_GB = 1e9
_FLOW_END, _ISSUE, _FINISH = range(3)  # event kinds


@dataclasses.dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate`.

    Attributes
    ----------
    time_s : float
        Completion time of the collective.
    size_bytes : int
        Bytes of the vector reduced/broadcast.
    collective : str
    nranks : int
    link_utilisation : dict
        ``(src, dst) -> fraction`` of the arc's capacity used over ``time_s``
        (bytes carried / (bandwidth * time_s)), for every arc of the network.
    link_bytes : dict
        ``(src, dst) -> bytes`` carried by each arc.
    tree_finish_s : tuple of float
        When the last step of each tree of the schedule completed.
    rank_finish_s : tuple of float
        When each rank completed its last step.
    """

    time_s: float
    size_bytes: int
    collective: str
    nranks: int
    link_utilisation: dict
    link_bytes: dict
    tree_finish_s: tuple
    rank_finish_s: tuple

    @property
    def time_us(self) -> float:
        return self.time_s * 1e6

    @property
    def algbw_gbps(self) -> float:
        """Algorithm bandwidth ``size / time`` in GB/s (nccl-tests' algbw)."""
        return self.size_bytes / self.time_s / _GB if self.time_s > 0 else math.inf

    @property
    def busbw_gbps(self) -> float:
        """Bus bandwidth in GB/s (nccl-tests' busbw, DESIGN.md section 6)."""
        return self.algbw_gbps * bus_factor(self.collective, self.nranks)


@gc_paused
def simulate(schedule: Schedule, topology, size_bytes: int | None = None,
             model: SimModel | None = None) -> SimResult:
    """Simulate ``schedule`` on ``topology``; see the module docstring for the model.

    Parameters
    ----------
    schedule : Schedule
        A valid schedule (it is not re-validated; call ``validate()`` first if
        it comes from outside).
    topology : Topology
        Its rank count must equal ``schedule.nranks``.
    size_bytes : int, optional
        Simulate the same steps on a vector of this many bytes instead of
        ``schedule.size_bytes``: every chunk is scaled by
        ``size_bytes / schedule.size_bytes`` (the chunk count stays that of the
        schedule, so re-lower for a pipeline depth suited to the new size).
    model : SimModel, optional
        Cost parameters; ``SimModel()`` by default.

    Returns
    -------
    SimResult

    Raises
    ------
    SimError
        If the rank counts differ, ``size_bytes`` is not positive, a
        transfer joins two ranks with no route between them, or a route the
        schedule carries uses a link the topology lacks.
    """
    model = SimModel() if model is None else model
    if topology.n != schedule.nranks:
        raise SimError(f"the schedule has {schedule.nranks} ranks but the topology has {topology.n}")
    if size_bytes is None:
        size_bytes = schedule.size_bytes
    if not size_bytes > 0:
        raise SimError(f"size_bytes must be > 0, got {size_bytes}")
    graph = topology.link_graph(topology.kinds())
    return _Simulation(schedule, graph, int(size_bytes), model, model.reducer_gbps(topology)).run()


class _Simulation:
    """One run of the event loop. Steps are numbered globally (rank-major)."""

    def __init__(self, schedule, graph, size_bytes, model, reduce_gbps):
        self.schedule, self.graph, self.model = schedule, graph, model
        self.size_bytes = size_bytes
        scale = size_bytes / (schedule.count * schedule.itemsize)
        self.chunk_bytes = [length * schedule.itemsize * scale for _, length in schedule.chunks]
        self.overhead_s = model.step_overhead_us * 1e-6
        nranks = schedule.nranks

        # capacity (bytes/s) of every arc, then one reducer "arc" per rank
        self.capacity = [float(bw) * _GB for bw in graph.capacity_gbps]
        self.reducer = len(self.capacity)
        self.capacity += [reduce_gbps * _GB] * nranks
        # each tree's share of the data: flows share an arc in proportion to it
        tree_elems = [0] * max(schedule.ntrees, 1)
        seen = set()
        lengths = [length for _, length in schedule.chunks]
        for steps in schedule.steps:
            for st in steps:
                key = (st.tree, st.chunk)
                if key not in seen:
                    seen.add(key)
                    tree_elems[st.tree] += lengths[st.chunk]
        total = float(sum(tree_elems)) or 1.0
        self.tree_share = [max(e / total, 1e-12) for e in tree_elems]
        self.route_cache = {}  # (src, dst, tree) -> (arcs, latency)
        self.carried = defaultdict(dict)  # tree -> {(src, dst): node path}
        for t, paths in enumerate(schedule.routes):
            for path in paths:
                self.carried[t][path[0], path[-1]] = tuple(path)
                self.carried[t][path[-1], path[0]] = tuple(path[::-1])

        # flatten the steps
        base, g = [], 0
        for steps in schedule.steps:
            base.append(g)
            g += len(steps)
        self.base = base
        ops, ranks, chunk_of, peers, trees = [], [], [], [], []
        self.op, self.rank, self.chunk, self.peer, self.tree = ops, ranks, chunk_of, peers, trees
        self.missing = missing = []  # unfinished dependencies (+1 for a RECV's data)
        self.dependents = dependents = [[] for _ in range(g)]
        sends = {}
        channel_of = {}  # in step order: each (src, dst) channel's SENDs queue in list order
        by_tree = model.channels == "tree"
        gid = 0
        for r, steps in enumerate(schedule.steps):
            b = base[r]
            for s in steps:
                op, chunk, peer, tree, deps = s.op, s.chunk, s.peer, s.tree, s.deps
                ops.append(op)
                ranks.append(r)
                chunk_of.append(chunk)
                peers.append(peer)
                trees.append(tree)
                if op == "SEND":  # a triple may repeat: the k-th SEND matches the k-th RECV
                    missing.append(len(deps))
                    queue = sends.get((r, peer, chunk))
                    if queue is None:
                        queue = sends[r, peer, chunk] = deque()
                    queue.append(gid)
                    channel_of[gid] = (r, peer, tree if by_tree else 0)
                else:
                    missing.append(len(deps) + 1)
                for d in deps:
                    dependents[b + d].append(gid)
                gid += 1
        self.recv_of = recv_of = {}
        for gid, op in enumerate(ops):
            if op != "SEND":
                key = (peers[gid], ranks[gid], chunk_of[gid])
                queue = sends.get(key)
                if not queue:
                    raise SimError(f"rank {ranks[gid]} receives chunk {key[2]} from "
                                   f"{key[0]}, which never sends it (validate() the schedule)")
                recv_of[queue.popleft()] = gid
        # channels: the SENDs of each (src, dst) pair in list order
        self.channel_queue = defaultdict(deque)
        for gid, channel in channel_of.items():
            self.channel_queue[channel].append(gid)
        self.channel_of = channel_of
        self.channel_busy = dict.fromkeys(self.channel_queue, False)
        self.send_ready = set()
        self.arrival_latency = {}

        self.done_at = [math.nan] * g
        self.events = []          # (time, seq, kind, payload)
        self.seq = 0
        # flows: id -> [arcs, remaining bytes, rate, t_last, end time at this rate, owner step,
        #              data share, time of its pending end event]
        self.flows = {}
        self.arc_flows = defaultdict(set)
        self.arc_weight = [0.0] * len(self.capacity)  # sum of the data shares of the flows on each arc
        # capacity per unit of data share of each arc (capacity / weight), kept as flows come
        # and go: a flow's fair rate is its share times the smallest over its arcs
        self.arc_share = [math.inf] * len(self.capacity)
        self.arc_bytes = [0.0] * len(self.capacity)
        self.next_flow = 0
        self.dirty = set()  # arcs where flows started or ended at this instant

    # ------------------------------------------------------------- events
    def push(self, t, kind, payload):
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def run(self):
        now = 0.0
        for gid, m in enumerate(self.missing):
            if m == 0:
                self.ready(gid, now)
        events, dirty = self.events, self.dirty
        pop, issue, flow_end, finish = heapq.heappop, self.issue, self.flow_end, self.finish
        while events:
            now, _, kind, payload = pop(events)
            if kind == _FLOW_END:
                flow_end(payload, now)
            elif kind == _ISSUE:
                issue(payload, now)
            else:
                finish(payload, now)
            # flows that started or ended change the rates of those sharing their arcs: once
            # every event of this instant has run (no time passes between them)
            if dirty and (not events or events[0][0] != now):
                self.reshare(now)
        unfinished = [g for g, t in enumerate(self.done_at) if math.isnan(t)]
        if unfinished:
            g = unfinished[0]
            raise SimError(f"deadlock: rank {self.rank[g]} step {g - self.base[self.rank[g]]} "
                           f"({self.op[g]} chunk {self.chunk[g]}) never ran")
        return self.result()

    def ready(self, gid, now):
        """All of ``gid``'s dependencies (and, for a RECV, its data) are there."""
        op = self.op[gid]
        if op == "SEND":  # issued after its overhead, which overlaps the channel's transfer in progress
            self.push(now + self.overhead_s, _ISSUE, gid)
        else:  # the data is there (a reduction was done as it arrived)
            self.push(now + self.overhead_s, _FINISH, gid)

    def issue(self, gid, now):
        self.send_ready.add(gid)
        self.try_channel(self.channel_of[gid], now)

    def try_channel(self, channel, now):
        queue = self.channel_queue[channel]
        if self.channel_busy[channel] or not queue or queue[0] not in self.send_ready:
            return
        gid = queue.popleft()
        self.channel_busy[channel] = True
        arcs, latency = self.route(self.rank[gid], self.peer[gid], self.tree[gid])
        reducer = self.reducer + self.peer[gid]
        if self.op[self.recv_of[gid]] == "RECV_REDUCE" and self.capacity[reducer] < math.inf:
            arcs = arcs + (reducer,)  # reduced by the receiver as it arrives
        self.arrival_latency[gid] = latency
        self.start_flow((arcs, self.chunk_bytes[self.chunk[gid]], gid), now)

    def route(self, src, dst, tree):
        """Arcs and latency of a transfer of ``tree`` from ``src`` to ``dst``: the
        route the schedule carries, else the link graph's default route."""
        key = (src, dst, tree)
        if key not in self.route_cache:
            try:
                if not self.schedule.routes:
                    arcs = self.graph.route(src, dst)
                elif (src, dst) in self.carried[tree]:
                    arcs = self.graph.arcs_of_path(self.carried[tree][src, dst])
                else:
                    raise SimError(f"tree {tree} sends from {src} to {dst} but carries no route between "
                                   f"them (validate() the schedule)")
            except TopologyError as e:
                raise SimError(f"the schedule sends from {src} to {dst} (tree {tree}), but {e}") from None
            self.route_cache[key] = (arcs, self.model.route_latency_s(self.graph, arcs))
        return self.route_cache[key]

    def start_flow(self, payload, now):
        arcs, nbytes, owner = payload
        fid = self.next_flow
        self.next_flow += 1
        share = self.tree_share[self.tree[owner]]
        self.flows[fid] = [arcs, nbytes, 0.0, now, math.inf, owner, share, math.inf]
        weight, arc_share, capacity = self.arc_weight, self.arc_share, self.capacity
        for a in arcs:
            self.arc_flows[a].add(fid)
            weight[a] += share
            arc_share[a] = capacity[a] / weight[a]
            self.arc_bytes[a] += nbytes
        self.dirty.update(arcs)

    def flow_end(self, fid, now):
        flow = self.flows.get(fid)
        if flow is None or flow[7] != now:
            return  # superseded by an earlier end
        if flow[4] != now:  # its rate fell since this was pushed: it ends later
            flow[7] = flow[4]
            self.seq += 1
            heapq.heappush(self.events, (flow[4], self.seq, _FLOW_END, fid))
            return
        del self.flows[fid]
        weight, arc_share, capacity = self.arc_weight, self.arc_share, self.capacity
        for a in flow[0]:
            self.arc_flows[a].discard(fid)
            if self.arc_flows[a]:
                weight[a] -= flow[6]
                arc_share[a] = capacity[a] / weight[a]
            else:
                weight[a], arc_share[a] = 0.0, math.inf
        self.dirty.update(flow[0])
        gid = flow[5]  # a SEND: its channel is free, its data arrives after the route's latency
        channel = self.channel_of[gid]
        self.channel_busy[channel] = False
        self.try_channel(channel, now)
        self.push(now + self.arrival_latency[gid], _FINISH, gid)

    def reshare(self, now):
        """Recompute the rates of the flows crossing the arcs where flows started or ended."""
        arc_flows = self.arc_flows
        affected = set()
        for a in self.dirty:
            affected |= arc_flows[a]
        self.dirty.clear()
        flows, events, share = self.flows, self.events, self.arc_share.__getitem__
        for fid in affected:
            flow = flows[fid]
            new_rate = flow[6] * min(map(share, flow[0]))
            rate = flow[2]
            if new_rate == rate:  # its bottleneck is elsewhere: its end event still holds
                continue
            remaining = flow[1] - rate * (now - flow[3])
            flow[1], flow[2], flow[3] = 0.0 if 0.0 > remaining else remaining, new_rate, now
            flow[4] = end = now + flow[1] / new_rate
            if end < flow[7]:  # else the pending end event comes first and pushes this one then
                flow[7] = end
                self.seq += 1  # as push(), inline: this is the simulator's inner loop
                heapq.heappush(events, (end, self.seq, _FLOW_END, fid))

    def finish(self, gid, now):
        self.done_at[gid] = now
        if self.op[gid] == "SEND":
            recv = self.recv_of[gid]
            self.missing[recv] -= 1
            if self.missing[recv] == 0:
                self.ready(recv, now)
        for d in self.dependents[gid]:
            self.missing[d] -= 1
            if self.missing[d] == 0:
                self.ready(d, now)

    # -------------------------------------------------------------- result
    def result(self):
        s, graph = self.schedule, self.graph
        time_s = max(self.done_at, default=0.0)
        done = np.asarray(self.done_at)
        rank = np.asarray(self.rank, dtype=np.int64)
        tree = np.asarray(self.tree, dtype=np.int64)
        rank_finish = np.zeros(s.nranks)
        tree_finish = np.zeros(s.ntrees)
        if len(done):
            np.maximum.at(rank_finish, rank, done)
            np.maximum.at(tree_finish, tree, done)
        util, nbytes = {}, {}
        for a, arc in enumerate(graph.arcs):
            nbytes[arc] = self.arc_bytes[a]
            util[arc] = self.arc_bytes[a] / (self.capacity[a] * time_s) if time_s > 0 else 0.0
        return SimResult(time_s, self.size_bytes, s.collective, s.nranks, util, nbytes,
                         tuple(tree_finish.tolist()), tuple(rank_finish.tolist()))
