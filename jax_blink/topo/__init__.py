"""Topologies: ranks, switches and links; presets; nvidia-smi detection; the one link graph.

Modules: :mod:`~jax_blink.topo.topology` (:class:`Topology`, :class:`Link`),
:mod:`~jax_blink.topo.presets` (named machines as plain data),
:mod:`~jax_blink.topo.nvidia_smi` (parsing ``nvidia-smi topo -m``),
:mod:`~jax_blink.topo.detect` (running ``nvidia-smi`` on this machine),
:mod:`~jax_blink.topo.graph` (:class:`LinkGraph`: arcs, capacities and every
route), :mod:`~jax_blink.topo.limits` (node count and bandwidth range),
:mod:`~jax_blink.topo.errors` (:class:`TopologyError`).
Pure Python: never imports jax.
"""

from .errors import TopologyError
from .graph import LinkGraph
from .presets import preset_names
from .topology import FAST_KINDS, LINK_CHOICES, LINK_KINDS, Link, Topology, load_topology

__all__ = ["Topology", "Link", "LinkGraph", "TopologyError", "LINK_KINDS", "FAST_KINDS", "LINK_CHOICES", "load_topology",
           "preset_names"]
