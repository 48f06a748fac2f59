"""Where jax 0.10 and 0.11 type values differently, jax_blink branches on what the
types have, not on version strings (issue 44).

jax 0.11 adds ``unreduced_kind`` to the manual axis type: a value unreduced over
some axes is a partial sum, max or min, and a type unreduced over no axis must
have no kind (0.11's ``ManualAxisType`` raises "unreduced_kind should be None
when unreduced is an empty set" otherwise). jax 0.10's types have no kind:
every unreduced value is a partial sum. CI has jax 0.10, so the 0.11 branch is
exercised here on stand-in types that check what 0.11's checks; the tests at
the end run the real thing where jax has unreduced kinds (the GPU image's jax,
benchmarks/gpu_check.sh) and skip, saying why, elsewhere.
"""

import dataclasses
import enum

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_blink
from jax_blink.ops.axes import check_unreduced_kind, unreduced_kind
from jax_blink.ops.primitive import reduced_type
from ops_common import N


class Kind(enum.Enum):
    """jax.sharding.UnreducedKind of jax 0.11."""
    sum = 1
    max = 2
    min = 3


@dataclasses.dataclass(frozen=True)
class Type011:
    """jax 0.11's ManualAxisType: its defaulting and its checks (core._check_mat)."""
    varying: frozenset = frozenset()
    unreduced: frozenset = frozenset()
    reduced: frozenset = frozenset()
    unreduced_kind: object = None

    def __post_init__(self):
        if self.unreduced and self.unreduced_kind is None:
            object.__setattr__(self, "unreduced_kind", Kind.sum)
        if self.varying & self.unreduced:
            raise ValueError("varying and unreduced cannot have common mesh axes")
        if not self.unreduced and self.unreduced_kind is not None:
            raise ValueError("`unreduced_kind` should be `None` when `unreduced` is an empty set. "
                             f"Got unreduced_kind={self.unreduced_kind} and unreduced={self.unreduced}")

    def update(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Type010:
    """jax 0.10's ManualAxisType: no kind; ``update`` takes no ``unreduced_kind``."""
    varying: frozenset = frozenset()
    unreduced: frozenset = frozenset()
    reduced: frozenset = frozenset()

    def update(self, **changes):
        return dataclasses.replace(self, **changes)  # TypeError for unreduced_kind


def test_a_fully_reduced_type_has_no_kind_where_jax_types_kinds():
    """The bug of issue 44: keeping the kind of a partial sum on the summed (no longer
    unreduced) type is jax 0.11's ValueError."""
    for kind in Kind:
        mat = Type011(unreduced=frozenset({"x"}), unreduced_kind=kind)
        with pytest.raises(ValueError, match="should be `None`"):
            mat.update(unreduced=frozenset())  # the stand-in checks what 0.11 checks
        out = reduced_type(mat, {"x"})
        assert out.unreduced == frozenset() and out.unreduced_kind is None
        assert out.varying == frozenset()
        # reduce_scatter: varying over the axes, no longer unreduced, no kind
        out = reduced_type(Type011(varying=frozenset({"y"}), unreduced=frozenset({"x"}),
                                   unreduced_kind=kind), ("x",), scatter=True)
        assert out == Type011(varying=frozenset({"x", "y"}))


def test_a_partly_reduced_type_keeps_its_kind():
    mat = Type011(unreduced=frozenset({"x", "y"}), unreduced_kind=Kind.max)
    out = reduced_type(mat, {"x"})
    assert out.unreduced == frozenset({"y"}) and out.unreduced_kind is Kind.max
    out = reduced_type(Type011(unreduced=frozenset({"x", "y"})), ("y",), scatter=True)
    assert out == Type011(varying=frozenset({"y"}), unreduced=frozenset({"x"}),
                          unreduced_kind=Kind.sum)


def test_types_without_kinds_get_none():
    """jax 0.10: reduced_type must not pass a kind its types do not take."""
    out = reduced_type(Type010(varying=frozenset({"y"}), unreduced=frozenset({"x"})), {"x"})
    assert out == Type010(varying=frozenset({"y"}))
    out = reduced_type(Type010(unreduced=frozenset({"x", "z"})), {"x"}, scatter=True)
    assert out == Type010(varying=frozenset({"x"}), unreduced=frozenset({"z"}))


def test_the_installed_jaxs_own_type():
    """The same rule on this jax's ManualAxisType (0.10 or 0.11, whichever is installed)."""
    empty = jax.typeof(jnp.zeros(3)).manual_axis_type
    mat = empty.update(varying=frozenset({"y"}), unreduced=frozenset({"x", "z"}))
    out = reduced_type(mat, {"x", "z"})
    assert out.unreduced == frozenset() and out.varying == frozenset({"y"})
    assert getattr(out, "unreduced_kind", None) is None
    out = reduced_type(mat, {"x"}, scatter=True)
    assert out.unreduced == frozenset({"z"}) and out.varying == frozenset({"x", "y"})
    if hasattr(out, "unreduced_kind"):
        assert out.unreduced_kind is mat.unreduced_kind


def test_the_kind_of_an_unreduced_value():
    assert unreduced_kind(Type010(unreduced=frozenset({"x"}))) == "sum"  # jax 0.10: sums only
    assert unreduced_kind(Type011(unreduced=frozenset({"x"}))) == "sum"
    for kind in Kind:
        assert unreduced_kind(Type011(unreduced=frozenset({"x"}), unreduced_kind=kind)) == kind.name


def test_a_collective_takes_only_its_own_kind_of_unreduced_value():
    """As lax 0.11: psum of a partial max is an error (lax: "unreduced_psum cannot accept
    args with unreduced_kind=max"), pmax of it is its maximum."""
    partial_max = Type011(unreduced=frozenset({"x"}), unreduced_kind=Kind.max)
    check_unreduced_kind(partial_max, ("x",), "pmax", "max")
    with pytest.raises(ValueError, match=r"jax_blink.psum cannot accept a value unreduced over "
                                         r"\('x',\) by max .* reduce it with jax_blink.pmax"):
        check_unreduced_kind(partial_max, ("x",), "psum", "sum")
    with pytest.raises(ValueError, match="does not accept a value unreduced over"):
        check_unreduced_kind(partial_max, ("x",), "all_gather", None)
    # jax 0.10: every unreduced value is a partial sum
    partial_sum = Type010(unreduced=frozenset({"x"}))
    check_unreduced_kind(partial_sum, ("x",), "psum", "sum")
    with pytest.raises(ValueError, match="by sum"):
        check_unreduced_kind(partial_sum, ("x",), "pmin", "min")


def _explicit_mesh():
    return jax.make_mesh((N,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))


@pytest.mark.parametrize("name", ["pmax", "pmin"])
def test_pmax_and_pmin_of_a_partial_sum_are_errors_as_in_lax(name):
    """On every jax: lax refuses pmax/pmin of a value unreduced by sum (0.10: "pvary cannot
    accept args which are unreduced"; 0.11: "unreduced_pmax cannot accept args with
    unreduced_kind=sum"); so does jax_blink, with its own message."""
    def run(op):
        with jax.set_mesh(_explicit_mesh()):
            arr = jax.reshard(jnp.arange(16.0), P(unreduced={"x"}))
            return jax.shard_map(lambda v: op(v, "x"), out_specs=P())(arr)

    with pytest.raises(ValueError):
        run(getattr(lax, name))
    with pytest.raises(ValueError, match=rf"jax_blink.{name} cannot accept a value unreduced over "
                                         r"\('x',\) by sum"):
        run(getattr(jax_blink, name))


@pytest.mark.parametrize("name", ["pmax", "pmin"])
def test_partial_max_and_min_as_lax_where_jax_types_them(name):
    """jax >= 0.11 only (jax.sharding.UnreducedKind): a reduction to a value unreduced by
    max (min) over "x", then pmax (pmin) over "x" inside shard_map, as lax and numpy; psum of
    it is an error, as lax's."""
    kinds = getattr(jax.sharding, "UnreducedKind", None)
    if kinds is None:
        pytest.skip(f"jax {jax.__version__} has no unreduced kinds (jax.sharding.UnreducedKind, "
                    "jax >= 0.11): its unreduced values are all partial sums")
    op = name[1:]
    kind = getattr(kinds, op)
    reduce = {"max": lax.reduce_max, "min": lax.reduce_min}[op]
    x = np.random.default_rng(0).standard_normal((2 * N, 5)).astype(np.float32)

    def run(collective):
        with jax.set_mesh(_explicit_mesh()):
            arr = jax.device_put(x, P("x", None))

            @jax.jit
            def f(a):
                u = reduce(a, axes=(0,), out_sharding=P(None, unreduced={"x"}, unreduced_kind=kind))
                return jax.shard_map(lambda v: collective(v, "x"), out_specs=P())(u)

            return f(arr)

    try:
        ref = run(getattr(lax, name))
    except Exception as e:  # the reference itself: nothing of jax_blink's has run
        pytest.skip(f"lax cannot make or reduce a value unreduced by {op} here: {e!s:.200}")
    np.testing.assert_array_equal(ref, getattr(np, op)(x, axis=0))
    np.testing.assert_array_equal(run(getattr(jax_blink, name)), ref)
    with pytest.raises(ValueError, match="unreduced_psum cannot accept"):
        run(lax.psum)
    with pytest.raises(ValueError, match=rf"jax_blink.psum cannot accept a value unreduced over "
                                         rf"\('x',\) by {op}"):
        run(jax_blink.psum)
