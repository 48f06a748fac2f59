"""Machine profiles: the costs of jax_blink's executor and of the lax collectives, measured
on the machine that runs them (``python -m jax_blink calibrate``).

A profile holds, per layout of devices (``"1x8"``: one process of 8 devices), what one
allreduce adds to a program's time by float32 elements per device, for jax_blink's CPU
executor (``blink``) and for ``lax.psum`` (``lax``): the tables of
:data:`jax_blink.planning.cost.CPU_ALLREDUCE_US`, measured here rather than on the VM
those constants come from. It is keyed by everything that makes the numbers valid (CPU
model and core count, device kind and count, jax and jaxlib versions, the extension's
build), so another machine, an upgrade or a rebuilt executor never reuses it; a profile
whose key differs, or that is corrupt, is ignored with a warning (:func:`load`).

A full calibration also times training steps (``steps``): per layout, what summing a
small MLP's gradient pytree adds to a jitted step, by the pytree's bytes per device, for
both. Inside a step the devices reach each bucket at different times, which isolated calls
do not show. It also times those steps with the gradients in buckets of each size of
``buckets`` (per layout: per model, by its ``bytes``, and per candidate ``bucket_bytes``,
``vs_lax``: what jax_blink adds to the step over what lax.psum adds): psum's default
bucket size for a pytree is the size measured best on the model nearest it in bytes
(:meth:`Profile.bucket_bytes`).

Like FFTW's wisdom, a profile is a plain JSON file (``"format":
"jax_blink.machine_profile"``) that can be copied to machines of the same kind.

Pure Python: never imports jax.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import platform
from pathlib import Path
from typing import Optional

from jax_blink._jsonio import read_document
from jax_blink.planning.cache import disk_store
from jax_blink.planning.cost import cpu_allreduce_seconds

__all__ = ["Profile", "ProfileError", "FORMAT", "VERSION", "COLLECTIVES", "path_for", "load", "save",
           "nearest_layout", "best_bucket", "cpu_model", "HOSTS"]

logger = logging.getLogger("jax_blink")

FORMAT = "jax_blink.machine_profile"
VERSION = 1
_WHICH = ("blink", "lax")


class ProfileError(ValueError):
    """A machine profile that cannot be used: unreadable, corrupt, or of another machine."""


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or the platform's best guess: the ``cpu`` of a
    profile's key."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _check_table(layout: str, table, sizes: str = "elements", which=_WHICH) -> dict:
    """``table`` as the cost model's table (``sizes``: the name of its size column, ``which``
    its other columns, and optionally ``spread``: per size, how far apart the two columns could
    be by noise alone, microseconds, 0 or more), or ProfileError naming what is wrong."""
    if not isinstance(table, dict) or not {sizes, *which} <= set(table) <= {sizes, *which, "spread"}:
        raise ProfileError(f"layout {layout!r}: expected an object with "
                           + ", ".join(f"'{k}'" for k in (sizes, *which)[:-1]) + f" and '{which[-1]}'"
                           + " (and optionally 'spread')")
    columns = {k: table[k] for k in (sizes, *which)}
    n = len(columns[sizes]) if isinstance(columns[sizes], (list, tuple)) else -1
    if n < 2:
        raise ProfileError(f"layout {layout!r}: needs at least two measured sizes")
    for k, column in columns.items():
        if not isinstance(column, (list, tuple)) or len(column) != n or not all(map(_positive, column)):
            raise ProfileError(f"layout {layout!r}: {k!r} must be {n} positive numbers")
    if list(columns[sizes]) != sorted(set(columns[sizes])):
        raise ProfileError(f"layout {layout!r}: '{sizes}' must increase")
    out = {k: tuple(float(v) if k != sizes else int(v) for v in column) for k, column in columns.items()}
    if "spread" in table:
        spread = table["spread"]
        if not isinstance(spread, (list, tuple)) or len(spread) != n or not all(
                v == 0 or _positive(v) for v in spread):
            raise ProfileError(f"layout {layout!r}: 'spread' must be {n} numbers, 0 or more")
        out["spread"] = tuple(float(v) for v in spread)
    return out


#: The collectives besides the allreduce a profile may measure (``Profile.collectives``).
COLLECTIVES = ("reduce_scatter", "allgather")
#: The suffix of a layout whose processes were measured as separate hosts (``"2x2:hosts"``):
#: Blink's phases across hosts (``blink``) against lax over all the devices.
HOSTS = ":hosts"


def _check_collectives(layout: str, tables) -> dict:
    if not isinstance(tables, dict) or not set(tables) <= set(COLLECTIVES):
        raise ProfileError(f"layout {layout!r}: 'collectives' must map some of {', '.join(COLLECTIVES)} "
                           "to tables")
    return {c: _check_table(f"{layout}/{c}", t) for c, t in tables.items()}


def _nearest_spread(table: dict, size_bytes: float) -> Optional[float]:
    """The ``spread`` (seconds) measured at the size of ``table`` nearest ``size_bytes`` per
    device (float32 elements), None where the table has none."""
    if "spread" not in table:
        return None
    near = min(range(len(table["elements"])),
               key=lambda i: abs(math.log(table["elements"][i] * 4 / max(size_bytes, 1.0))))
    return table["spread"][near] * 1e-6


def _check_buckets(layout: str, table) -> dict:
    """A ``buckets`` table (``bytes`` of the models, candidate ``bucket_bytes``, and
    ``vs_lax``: a row per model, a ratio per candidate), or ProfileError naming what is wrong."""
    if not isinstance(table, dict) or set(table) != {"bytes", "bucket_bytes", "vs_lax"}:
        raise ProfileError(f"layout {layout!r}: expected an object with 'bytes', 'bucket_bytes' and 'vs_lax'")
    out = {}
    for k in ("bytes", "bucket_bytes"):
        column = table[k]
        if not isinstance(column, (list, tuple)) or not column or not all(
                _positive(v) and v == int(v) for v in column):
            raise ProfileError(f"layout {layout!r}: {k!r} must be a list of positive whole numbers")
        if list(column) != sorted(set(column)):
            raise ProfileError(f"layout {layout!r}: {k!r} must increase")
        out[k] = tuple(int(v) for v in column)
    if len(out["bucket_bytes"]) < 2:
        raise ProfileError(f"layout {layout!r}: needs at least two candidate bucket sizes")
    rows = table["vs_lax"]
    if (not isinstance(rows, (list, tuple)) or len(rows) != len(out["bytes"]) or not all(
            isinstance(r, (list, tuple)) and len(r) == len(out["bucket_bytes"]) and all(map(_positive, r))
            for r in rows)):
        raise ProfileError(f"layout {layout!r}: 'vs_lax' must be {len(out['bytes'])} rows (one per model) of "
                           f"{len(out['bucket_bytes'])} positive numbers (one per candidate)")
    out["vs_lax"] = tuple(tuple(float(v) for v in r) for r in rows)
    return out


def best_bucket(table: dict, nbytes: Optional[float] = None) -> int:
    """Of a ``buckets`` table's candidates, the one measured best for a pytree of ``nbytes``
    per device: the least ``vs_lax`` on the model nearest it in bytes (by ratio); a tie (two
    sizes that bucket that model's leaves alike, timed once) goes to the better mean over
    all models, then to the smaller size. ``nbytes`` None: by the mean alone.

    Examples
    --------
    >>> t = {"bytes": [10**6, 10**7], "bucket_bytes": [1 << 20, 1 << 22, 1 << 40],
    ...      "vs_lax": [[0.9, 0.8, 0.7], [0.5, 0.5, 0.9]]}
    >>> best_bucket(t, 2e6), best_bucket(t, 8e6), best_bucket(t, 1e9), best_bucket(t)
    (1099511627776, 4194304, 4194304, 4194304)
    """
    rows = table["vs_lax"]
    mean = [sum(r[j] for r in rows) / len(rows) for j in range(len(table["bucket_bytes"]))]
    if nbytes is None:
        row = mean
    else:
        near = min(range(len(rows)), key=lambda i: abs(math.log(table["bytes"][i] / max(nbytes, 1))))
        row = rows[near]
    return min(zip(row, mean, table["bucket_bytes"]))[2]


def _lists(layouts: dict) -> dict:
    """Tables of layouts with JSON's lists for their tuples (and rows)."""
    return {k: {c: [list(x) if isinstance(x, tuple) else x for x in v] for c, v in t.items()}
            for k, t in layouts.items()}


@dataclasses.dataclass(frozen=True)
class Profile:
    """What one calibration measured on one machine.

    ``key``: the machine's identity (:func:`jax_blink.choice.machine.machine_key`);
    ``tables``: per layout (``"<processes>x<devices per process>"``), microseconds one
    allreduce adds to a program, by float32 elements per device, for ``blink`` and
    ``lax``; ``quick``: made by ``calibrate --quick`` (fewer sizes and calls);
    ``seconds``: how long the calibration took; ``created``: when (ISO 8601); ``steps``:
    per layout, microseconds that summing a gradient pytree adds to a training step, by
    its ``bytes`` per device, for ``blink`` (in the buckets of :meth:`bucket_bytes`) and
    ``lax``; ``buckets``: per layout, the models' ``bytes``, candidate ``bucket_bytes`` and
    the ``vs_lax`` each candidate was measured at in each model's steps (``steps`` and
    ``buckets``: a full calibration's; empty otherwise); ``collectives``: per layout, the
    tables of the reduce-scatter and all-gather (:data:`COLLECTIVES`), by float32 elements of
    each device's input; ``provisional``: measured while the machine was busy, so the next
    calibration replaces it even where it would keep a profile. A table's optional
    ``spread`` column is how far apart ``blink`` and ``lax`` could be by noise alone.
    """

    key: dict
    tables: dict
    quick: bool = False
    seconds: float = 0.0
    created: str = ""
    steps: dict = dataclasses.field(default_factory=dict)
    buckets: dict = dataclasses.field(default_factory=dict)
    collectives: dict = dataclasses.field(default_factory=dict)
    provisional: bool = False

    def __post_init__(self):  # checked and normalised (tuples) however it was made
        if not isinstance(self.tables, dict) or not self.tables:
            raise ProfileError("machine profile: 'tables' must name at least one layout")
        object.__setattr__(self, "tables", {str(k): _check_table(str(k), t) for k, t in self.tables.items()})
        if not isinstance(self.steps, dict):
            raise ProfileError("machine profile: 'steps' must be an object of layouts")
        object.__setattr__(self, "steps", {str(k): _check_table(str(k), t, "bytes") for k, t in self.steps.items()})
        if not isinstance(self.buckets, dict):
            raise ProfileError("machine profile: 'buckets' must be an object of layouts")
        object.__setattr__(self, "buckets", {str(k): _check_buckets(str(k), t) for k, t in self.buckets.items()})
        if not isinstance(self.collectives, dict):
            raise ProfileError("machine profile: 'collectives' must be an object of layouts")
        object.__setattr__(self, "collectives",
                           {str(k): _check_collectives(str(k), t) for k, t in self.collectives.items()})

    def table(self, collective: str, layout: str) -> Optional[dict]:
        """The measured table of ``collective`` (``"allreduce"`` or one of
        :data:`COLLECTIVES`) in ``layout``, or None where the profile has none."""
        if collective == "allreduce":
            return self.tables.get(layout)
        return self.collectives.get(layout, {}).get(collective)

    def layouts(self, collective: str) -> list:
        """The layouts in which the profile measured ``collective``."""
        if collective == "allreduce":
            return list(self.tables)
        return [k for k, t in self.collectives.items() if collective in t]

    def spread_seconds(self, collective: str, size_bytes: float, layout: str) -> Optional[float]:
        """How far apart jax_blink's and lax's times of ``collective`` could be by noise alone
        at ``size_bytes`` per device in ``layout`` (the spread measured at the nearest size),
        None where the profile recorded no spread.

        Examples
        --------
        >>> p = Profile({}, {"1x8": {"elements": [1, 1000], "blink": [50.0, 80.0], "lax": [90.0, 95.0],
        ...                          "spread": [5.0, 30.0]}})
        >>> round(p.spread_seconds("allreduce", 3000, "1x8") * 1e6, 3), p.spread_seconds("reduce_scatter", 4, "1x8")
        (30.0, None)
        """
        table = self.table(collective, layout)
        return None if table is None else _nearest_spread(table, size_bytes)

    def bucket_bytes(self, layout: str, nbytes: Optional[float] = None) -> Optional[int]:
        """The bucket size measured best in ``layout``'s training steps for a pytree of
        ``nbytes`` per device (:func:`best_bucket`; None: over all models), or None where the
        profile measured no buckets there.

        Examples
        --------
        >>> p = Profile({}, {"1x8": {"elements": [1, 1000], "blink": [50.0, 80.0], "lax": [90.0, 95.0]}},
        ...             buckets={"1x8": {"bytes": [10**6], "bucket_bytes": [1 << 18, 1 << 20],
        ...                              "vs_lax": [[1.2, 0.9]]}})
        >>> p.bucket_bytes("1x8", 4e6), p.bucket_bytes("2x1")
        (1048576, None)
        """
        table = self.buckets.get(layout)
        return None if table is None else best_bucket(table, nbytes)

    def named(self, layout: str) -> str:
        """How ``explain()`` names this profile's ``layout``: ``this machine's profile (1x8,
        2026-11-28)``."""
        kind = "quick " if self.quick else ""
        busy = ", provisional: measured while the machine was busy" if self.provisional else ""
        return f"this machine's {kind}profile ({layout}, {self.created[:10] or 'undated'}{busy})"

    def allreduce_seconds(self, which: str, size_bytes: float, layout: str) -> float:
        """The measured time of an allreduce of ``size_bytes`` per device by ``which``
        (``"blink"`` or ``"lax"``) in ``layout``, interpolated as the cost model's
        recorded tables are (:func:`jax_blink.planning.cost.cpu_allreduce_seconds`).

        Examples
        --------
        >>> p = Profile({}, {"1x8": {"elements": [1, 1000], "blink": [50.0, 80.0], "lax": [90.0, 95.0]}})
        >>> round(p.allreduce_seconds("blink", 4000, "1x8") * 1e6, 1)
        80.0
        """
        return cpu_allreduce_seconds(which, size_bytes, self.tables[layout])

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "key": self.key, "quick": self.quick,
                "seconds": self.seconds, "created": self.created,
                "tables": _lists(self.tables)} | ({"steps": _lists(self.steps)} if self.steps else {}) | (
                    {"buckets": _lists(self.buckets)} if self.buckets else {}) | (
                    {"collectives": {k: _lists(t) for k, t in self.collectives.items()}}
                    if self.collectives else {}) | ({"provisional": True} if self.provisional else {})

    @classmethod
    def from_json(cls, source) -> "Profile":
        """A profile from a dict, JSON text or a file path; ProfileError for anything else."""
        d = read_document(source, fmt=FORMAT, version=VERSION, error=ProfileError, what="machine profile")
        if not isinstance(d.get("key"), dict):
            raise ProfileError("machine profile: 'key' must be an object")
        seconds = d.get("seconds", 0.0)
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise ProfileError("machine profile: 'seconds' must be a number")
        return cls(key=d["key"], tables=d.get("tables"),
                   quick=bool(d.get("quick", False)), seconds=float(seconds), created=str(d.get("created", "")),
                   steps=d.get("steps", {}), buckets=d.get("buckets", {}),
                   collectives=d.get("collectives", {}), provisional=bool(d.get("provisional", False)))


def path_for(key: dict, directory) -> Path:
    """Where the profile of the machine ``key`` lives in ``directory`` (the cache directory)."""
    return Path(directory) / f"profile-{_digest(key)}.json"


def load(path, key: dict) -> Optional[Profile]:
    """The profile at ``path`` if it was made for ``key``; None if there is none; None with a
    warning (what is wrong, and the command that makes a valid one) if it is unreadable,
    corrupt, or of another machine."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        profile = Profile.from_json(path)
        if profile.key != key:
            differ = sorted(k for k in set(profile.key) | set(key) if profile.key.get(k) != key.get(k))
            raise ProfileError("it was made for another machine or build (" + ", ".join(
                f"{k}: {profile.key.get(k)!r} there, {key.get(k)!r} here" for k in differ[:4]) + ")")
        return profile
    except (ProfileError, OSError, RecursionError) as e:
        logger.warning("jax_blink: ignoring the machine profile %s: %s; run `python -m jax_blink "
                       "calibrate` to measure this machine", path, e)
        return None


def save(profile: Profile, path) -> Path:
    """Writes ``profile`` to ``path`` atomically (a reader sees the old file or the new one)."""
    path = Path(path)
    disk_store(path, json.dumps(profile.to_json(), indent=1) + "\n")
    return path


def nearest_layout(layouts, processes: int, devices: int, hosts: bool = False) -> Optional[str]:
    """Of ``layouts`` (a profile's, ``"<processes>x<devices>"``), the one that best stands for
    ``processes`` processes of ``devices`` devices each: one process for one process, several
    for several (a table for 2 processes also serves 4), nearest in process count, then in
    devices per process (a table for 8 devices also serves a psum over 4 of them); None
    when none is of the same kind. ``hosts``: among the layouts of processes measured as
    separate hosts instead (``"<processes>x<devices>"`` + :data:`HOSTS`), which stand for
    devices that span hosts.

    Examples
    --------
    >>> layouts = ["1x8", "1x2", "2x1", "2x2:hosts"]
    >>> nearest_layout(layouts, 1, 6), nearest_layout(layouts, 2, 1), nearest_layout(layouts, 4, 1)
    ('1x8', '2x1', '2x1')
    >>> nearest_layout(["2x1"], 1, 8) is None, nearest_layout(layouts, 4, 8, hosts=True)
    (True, '2x2:hosts')
    """
    found = []
    for layout in layouts:
        shape, colon, kind = layout.partition(":")
        p, _, d = shape.partition("x")
        if colon + kind == (HOSTS if hosts else "") and p.isdigit() and d.isdigit() \
                and (int(p) > 1) == (processes > 1):
            found.append((abs(math.log(int(p) / max(processes, 1))), abs(math.log(int(d) / max(devices, 1))),
                          layout))
    return min(found)[2] if found else None
