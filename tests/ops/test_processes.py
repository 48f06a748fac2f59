"""The process layout of a call (jax_blink.processes.layout.layout_of): which
calls stay inside a process, which the hierarchical path serves, and why the
others go to lax. Pure: the owner of each mesh position is given."""

import numpy as np
import pytest

from jax_blink.processes.layout import Spanning, layout_of

# 2 processes x 4 devices, as jax.make_mesh((2, 4), ("host", "local")) lays them out
OWN = np.repeat(np.arange(2), 4).reshape(2, 4)


@pytest.mark.parametrize("axes", [("host", "local"), ("local", "host")])
def test_a_process_local_and_a_cross_process_axis(axes):
    assert layout_of(OWN, ("host", "local"), axes) == Spanning(2, 4, local_axes=("local",),
                                                               cross_axes=("host",))


def test_a_process_local_axis_stays_in_process():
    assert layout_of(OWN, ("host", "local"), ("local",)) is None
    # groups inside one process each: in-process too
    assert layout_of(OWN.reshape(8), ("i",), ("i",), groups=[[0, 1, 2, 3], [4, 5, 6, 7]]) is None


def test_one_axis_in_contiguous_runs_per_process():
    span = layout_of(OWN.reshape(8), ("i",), ("i",))
    assert span == Spanning(2, 4, groups=((0, 1, 2, 3), (4, 5, 6, 7)),
                            cross_groups=((0, 4), (1, 5), (2, 6), (3, 7)))
    assert "in-process groups [[0, 1, 2, 3], [4, 5, 6, 7]]" in span.describe()


def test_several_cross_and_local_axes():
    own = np.repeat(np.arange(4), 2).reshape(2, 2, 2)  # process = 2a + b
    assert layout_of(own, ("a", "b", "c"), ("a", "b", "c")) == Spanning(
        4, 2, local_axes=("c",), cross_axes=("a", "b"))
    # the other axis (a) picks which pair of processes: the same split for each
    assert layout_of(own, ("a", "b", "c"), ("b", "c")) == Spanning(
        2, 2, local_axes=("c",), cross_axes=("b",))


@pytest.mark.parametrize("owner, axes, groups, why", [
    (OWN, ("host",), None, "each process owns one of the reduced devices"),
    (np.array([0, 1] * 4), ("i",), None, "spread over processes in a way"),
    (np.array([0] * 3 + [1] * 5), ("i",), None, "different numbers of the reduced devices ([3, 5])"),
    (OWN.reshape(8), ("i",), [[0, 4], [1, 5], [2, 6], [3, 7]], "axis_index_groups whose devices span"),
    # axis b splits a's processes differently for a=0 and a=1
    (np.array([[0, 0, 1, 1], [2, 3, 2, 3]]), ("a", "b"), None, "split among processes differently"),
])
def test_layouts_the_hierarchical_path_does_not_take_say_why(owner, axes, groups, why):
    names = ("i",) if owner.ndim == 1 else ("host", "local") if axes == ("host",) else ("a", "b")
    got = layout_of(owner, names, axes if axes != ("a", "b") else ("b",), groups)
    assert isinstance(got, str) and why in got, got
