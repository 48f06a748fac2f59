"""Machine profiles (issue 45): calibration writes one, psum's choices read it, and a profile
that does not fit this machine is ignored with a warning.

The choice is checked against the numbers a profile holds (a recorded one is replayed),
never against a copy of the choosing code.
"""

import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import jax_blink
from jax_blink.measure import calibration
from jax_blink.choice import decide, machine, predict_cpu, predict_gpu
from jax_blink.planning import profile as profiles

ROOT = Path(__file__).resolve().parents[2]
#: Recorded full calibrations, frozen copies (tests/fixtures/README.md): re-running the
#: calibration benchmark rewrites benchmarks/results/, never these.
RECORDED = sorted((ROOT / "tests" / "fixtures").glob("profile_*.json"))
assert RECORDED, "no recorded profile in tests/fixtures/"


@pytest.fixture
def use_profile(monkeypatch, tmp_path):
    """Installs a profile's tables under this machine's key at a path of the test's own and
    points JAX_BLINK_PROFILE at it; returns the path."""
    machine.forget()

    def install(tables, key=None, quick=False, steps=None, bucket_tables=None, collectives=None,
                provisional=False):
        p = profiles.Profile(key=machine.machine_key() if key is None else key,
                             tables={k: {c: list(v) for c, v in t.items()} for k, t in tables.items()},
                             quick=quick, created="2026-11-28T00:00:00+00:00", steps=steps or {},
                             buckets=bucket_tables or {}, collectives=collectives or {},
                             provisional=provisional)
        path = profiles.save(p, tmp_path / "profile.json")
        monkeypatch.setenv("JAX_BLINK_PROFILE", str(path))
        machine.forget()
        return path

    yield install
    machine.forget()


def choice(count, nranks=8):
    return decide.decide(count, "float32", nranks, platform="cpu")


def runs_blink(d):
    return d.request is not None


LAX_WINS = {"elements": [1, 1000, 100_000], "blink": [300.0, 400.0, 900.0], "lax": [100.0, 150.0, 300.0]}
BLINK_WINS = {"elements": [1, 1000, 100_000], "blink": [50.0, 60.0, 200.0], "lax": [100.0, 150.0, 300.0]}


@pytest.mark.parametrize("tables, blink", [(LAX_WINS, False), (BLINK_WINS, True)])
def test_auto_follows_the_profile_and_names_it(use_profile, tables, blink):
    use_profile({"1x8": tables})
    for count in (1, 1000, 100_000, 30_000):
        d = choice(count)
        assert runs_blink(d) == blink, d.text
        assert "this machine's profile (1x8, 2026-11-28)" in d.text


def test_a_profile_for_another_machine_is_ignored_with_a_warning(use_profile, caplog):
    key = dict(machine.machine_key(), jax="0.0.1", cores=4096)
    path = use_profile({"1x8": LAX_WINS}, key=key)
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        d = choice(1000)
    assert "defaults recorded on a 2-core AMD EPYC" in d.text
    assert runs_blink(d)  # the recorded costs: the plan at 4 KB
    assert any(str(path) in r.message and "another machine" in r.message and "jax" in r.message
               and "python -m jax_blink calibrate" in r.message for r in caplog.records)


@pytest.mark.parametrize("text", ["{not json", '{"format": "jax_blink.machine_profile", "version": 1}',
                                  '{"format": "jax_blink.machine_profile", "version": 1, "key": {}, '
                                  '"tables": {"1x8": {"elements": [1, 2], "blink": [1, -1], "lax": [1, 1]}}}'])
def test_a_corrupt_profile_is_ignored_with_a_warning(monkeypatch, tmp_path, caplog, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    monkeypatch.setenv("JAX_BLINK_PROFILE", str(path))
    machine.forget()
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        assert machine.profile() is None
        assert "defaults recorded" in predict_cpu.cpu_allreduce(4000).source
    assert any("ignoring the machine profile" in r.message for r in caplog.records)
    machine.forget()


def test_without_a_profile_the_defaults_are_used_and_said_once(monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("JAX_BLINK_PROFILE")
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path))
    machine.forget()
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        first = predict_cpu.cpu_allreduce(4000)
        predict_cpu.cpu_allreduce(400)
    notes = [r for r in caplog.records if "no machine profile" in r.message]
    assert len(notes) == 1 and "python -m jax_blink calibrate" in notes[0].message
    assert "defaults recorded" in first.source
    machine.forget()


def test_jax_blink_profile_defaults_is_quiet(caplog):
    assert os.environ["JAX_BLINK_PROFILE"] == "defaults"  # tests/conftest.py
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        assert "defaults recorded" in predict_cpu.cpu_allreduce(4000).source
    assert not caplog.records


def test_processes_of_one_host_read_their_own_layout(use_profile):
    """psum across processes of one host (the host transport against lax over gloo) reads
    the profile's layout of several processes, never the one-process table."""
    use_profile({"1x8": BLINK_WINS, "2x1": LAX_WINS})
    for processes, devices in ((2, 1), (4, 1), (2, 4)):
        p = predict_cpu.cpu_allreduce(4000, processes=processes, devices=devices)
        assert p.lax_s < p.blink_s and "(2x1," in p.source, p
    p = predict_cpu.cpu_allreduce(4000, processes=1, devices=8)
    assert p.blink_s < p.lax_s and "(1x8," in p.source


def test_a_profile_without_the_layout_falls_back_to_the_recorded_table(use_profile):
    use_profile({"2x1": LAX_WINS})
    p = predict_cpu.cpu_allreduce(4000, processes=1, devices=8)
    assert "the profile has no layout of one process" in p.source
    assert runs_blink(choice(1000))


def test_the_bucket_size_follows_the_profile(use_profile):
    """The smallest power of two (from 4 KB) whose measured time is at least twice the fixed
    cost (here the time of one element, the only measured size up to 1,000 elements): larger
    where the fixed cost is larger."""
    sizes = [1, 10_000, 1_000_000, 10_000_000]
    chosen = []
    for fixed_us in (100.0, 2000.0):
        use_profile({"1x8": {"elements": sizes, "blink": [fixed_us + 4e-3 * s for s in sizes],
                             "lax": [1e6] * 4}})
        p = machine.profile()
        size, why = decide.bucket_size(None, "cpu", 1 << 20)
        t = lambda b: p.allreduce_seconds("blink", b, "1x8")  # noqa: E731
        assert t(size) >= 2 * t(4) and (size == 4096 or t(size // 2) < 2 * t(4)), size
        assert "profile" in why
        chosen.append(size)
    assert chosen[1] >= 16 * chosen[0]


@pytest.mark.parametrize("small, large, best", [
    ([1.3, 0.9, 1.1, 1.5], [0.5, 0.5, 0.5, 0.9], (1 << 20, 1 << 20)),
    ([1.3, 1.2, 1.1, 0.95], [0.5, 0.5, 0.5, 0.9], (1 << 40, 1 << 22)),  # the tie on the large model: its mean
    ([1.0, 1.0, 1.2, 1.3], [0.6, 0.6, 0.6, 0.6], (1 << 18, 1 << 18)),  # ties all along: the smaller
])
def test_the_bucket_size_is_the_one_measured_best_in_training_steps(use_profile, small, large, best):
    """Where the profile timed training steps in buckets of several sizes, psum takes for a
    pytree the size whose steps cost least against lax on the model nearest it in bytes (a tie
    to the better mean over the models, then to the smaller size), whatever the isolated
    calls' model would take, and says where it came from."""
    sizes = [1 << 18, 1 << 20, 1 << 22, 1 << 40]
    use_profile({"1x8": BLINK_WINS}, bucket_tables={"1x8": {"bytes": [1_000_000, 16_000_000], "bucket_bytes": sizes,
                                                            "vs_lax": [small, large]}})
    for nbytes, expected in zip((2_000_000, 50_000_000), best):
        size, why = decide.bucket_size(None, "cpu", nbytes)
        assert size == expected and why.startswith("the training steps of this machine's profile (1x8")
    assert decide.bucket_size(4096, "cpu", 1e8) == (4096, "bucket_bytes=")  # the caller's size still rules
    use_profile({"1x8": BLINK_WINS})  # no step buckets measured: the isolated calls' model
    assert decide.bucket_size(None, "cpu", 1e6)[1].startswith("the CPU model (this machine's profile")


def test_the_tuned_bucket_size_reaches_psum(use_profile, monkeypatch):
    """psum of a pytree buckets its leaves by the profile's tuned size: 1 MiB groups four
    256 KiB leaves into one collective, where 256 KiB gives each its own."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "blink")  # count buckets, not the choice of each
    mesh = jax.make_mesh((8,), ("d",))
    tree = jax.device_put([jnp.ones((8, 65536), jnp.float32) * (i + 1) for i in range(4)],
                          NamedSharding(mesh, P("d")))
    calls = {}
    for best, vs_lax in ((1 << 20, [1.2, 0.9]), (1 << 18, [0.9, 1.2])):
        use_profile({"1x8": BLINK_WINS}, bucket_tables={"1x8": {"bytes": [1 << 20], "bucket_bytes": [1 << 18, 1 << 20],
                                                                "vs_lax": [vs_lax]}})
        f = jax.jit(jax.shard_map(lambda t: jax_blink.psum(t, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()))
        calls[best] = f.lower(tree).as_text().count("jax_blink_collective")
        out = f(tree)
        for i, o in enumerate(out):
            assert (abs(o - 8 * (i + 1)) == 0).all()
    assert calls == {1 << 20: 1, 1 << 18: 4}


# Every op's decision, in one process of 8 CPU devices: (collective, reduce op, root).
OPS = {"psum": ("allreduce", "sum", None), "pmax": ("allreduce", "max", None),
       "pmin": ("allreduce", "min", None), "psum_scatter": ("reduce_scatter", "sum", None),
       "all_gather": ("allgather", "sum", None), "broadcast": ("broadcast", "sum", 0)}
SIZES = (1, 1000, 100_000, 1_000_000, 10_000_000)


def ten_times(lax_faster):
    """A table where lax is 10x faster (or slower) than the plan at every size."""
    blink = [100.0 * (1 + s / 1000) for s in SIZES]
    return {"elements": list(SIZES), "blink": blink,
            "lax": [b / 10 if lax_faster else b * 10 for b in blink], "spread": [5.0] * len(SIZES)}


def decision(op, count, nranks=8, processes=1):
    collective, reduce_op, root = OPS[op]
    whole = count * nranks if collective == "allgather" else count  # decide's count: the whole vector
    return decide.decide(whole, "float32", nranks, collective=collective, op=reduce_op, root=root,
                         platform="cpu", processes=processes)


@pytest.mark.parametrize("lax_faster", [True, False], ids=["lax 10x faster", "lax 10x slower"])
def test_every_op_follows_a_profile_that_leaves_no_doubt(use_profile, lax_faster):
    """Every collective, at every size from 4 bytes to 40 MB per device, in one process and
    across the processes of one host (the allreduces: psum over the host transport), runs
    what the profile measured faster, and the decision carries the profile and its times."""
    table = ten_times(lax_faster)
    use_profile({"1x8": table, "2x1": table},
                collectives={"1x8": {"reduce_scatter": table, "allgather": table}})
    for op in OPS:
        for count in (1000, 4096, 250_000, 2_000_000):
            d = decision(op, count)
            assert d.uses_blink == (not lax_faster), (op, count, d.text)
            predicted = dict(d.predicted)
            assert (predicted["lax"] < predicted["blink"]) == lax_faster, (op, count, d.predicted)
            assert d.source == "this machine's profile (1x8, 2026-11-28)" and not d.undecided, d
    for op in ("psum", "pmax", "pmin"):
        d = decision(op, 4096, nranks=2, processes=2)
        assert d.uses_blink == (not lax_faster) and d.source.startswith("this machine's profile (2x1"), d


def test_a_profile_decides_without_the_recorded_costs(use_profile, monkeypatch):
    """Where this machine's profile covers a call, the costs recorded on another machine play
    no part: poisoned, they change no decision."""
    table = ten_times(lax_faster=True)
    use_profile({"1x8": table}, collectives={"1x8": {"reduce_scatter": table, "allgather": table}})
    before = {(op, c): decision(op, c) for op in OPS for c in (1000, 100_000)}
    poison = {"elements": (1, 10**7), "blink": (1e-3, 1e-3), "lax": (1e9, 1e9)}
    monkeypatch.setattr(predict_cpu, "CPU_ALLREDUCE_US", poison)
    monkeypatch.setattr(predict_cpu, "CPU_HOST_ALLREDUCE_US", poison)
    after = {(op, c): decision(op, c) for op in OPS for c in (1000, 100_000)}
    assert after == before and not any(d.uses_blink for d in after.values())


@pytest.mark.parametrize("lax_faster", [True, False], ids=["lax 10x faster", "lax 10x slower"])
def test_devices_spanning_hosts_follow_the_profile_that_measured_them(use_profile, monkeypatch, lax_faster):
    """On CPU devices spanning hosts, the reduce-scatter's and all-gather's choice reads the
    profile's layout measured as separate hosts; the range recorded on another VM plays no
    part: poisoned to say the opposite, it changes no decision."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "auto")
    table = ten_times(lax_faster)
    use_profile({"1x8": table}, collectives={"2x2" + profiles.HOSTS: {"reduce_scatter": table, "allgather": table}})
    opposite = (0.0, float("inf")) if lax_faster else (float("inf"), float("inf"))
    monkeypatch.setattr(predict_cpu, "CPU_CROSS_PROCESS_BYTES", {c: opposite for c in profiles.COLLECTIVES})
    for collective in profiles.COLLECTIVES:
        for nbytes in (4096, 1 << 20, 16 << 20):
            d = decide.across("op", ("h", "l"), "lax.op", collective, {"float32": nbytes // 4}, 2, 4, platform="cpu")
            assert d.chosen == ("lax" if lax_faster else "phases") and not d.undecided, d.text
            assert d.source == "this machine's profile (2x2:hosts, 2026-11-28)", d
            predicted = dict(d.predicted)
            assert (predicted["lax"] < predicted["phases"]) == lax_faster, d.predicted


def test_across_hosts_within_the_measured_spread_the_phases_run(use_profile, monkeypatch):
    """lax measured faster across hosts, but within the spread: the phases (the default) run,
    and the decision says the measurement could not tell."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "auto")
    near = {"elements": [1000, 100_000], "blink": [110.0, 1100.0], "lax": [100.0, 1000.0], "spread": [30.0, 50.0]}
    use_profile({"1x8": near}, collectives={"2x2" + profiles.HOSTS: {"allgather": near}})
    d = decide.across("op", ("h", "l"), "lax.op", "allgather", {"float32": 1000}, 2, 2, platform="cpu")
    assert d.phases and d.undecided and "the measurement could not tell" in d.text, d.text
    assert not decide.across("op", ("h", "l"), "lax.op", "allgather", {"float32": 100_000}, 2, 2,
                             platform="cpu").phases
    d = decide.across("op", ("h", "l"), "lax.op", "reduce_scatter", {"float32": 1000}, 2, 2, platform="cpu")
    assert "CPU_CROSS_PROCESS_BYTES" in d.source  # measured nowhere: the recorded range


def test_within_the_measured_spread_the_plan_runs_and_explain_says_why(use_profile):
    """lax measured 10% faster, but the rounds spread wider than that: the measurement cannot
    tell, so the plan (the default) runs, saying so; beyond the spread, lax."""
    near = {"elements": [1000, 100_000], "blink": [110.0, 1100.0], "lax": [100.0, 1000.0],
            "spread": [30.0, 50.0]}
    use_profile({"1x8": near}, collectives={"1x8": {"reduce_scatter": near}})
    for op in ("psum", "psum_scatter"):
        d = decision(op, 1000)
        assert d.uses_blink and d.undecided, d
        assert "the measurement could not tell" in d.text and "spread 30 us" in d.text, d.text
        d = decision(op, 100_000)
        assert not d.uses_blink and not d.undecided, d.text
    d = decision("all_gather", 1000)  # measured nowhere: the plan, no prediction
    assert d.uses_blink and d.predicted == () and d.source == ""


def test_a_provisional_profile_says_so():
    p = profiles.Profile({}, {"1x8": LAX_WINS}, provisional=True, created="2026-11-28T00:00:00+00:00")
    assert p.named("1x8") == ("this machine's profile (1x8, 2026-11-28, provisional: measured while the "
                              "machine was busy)")
    again = profiles.Profile.from_json(json.dumps(p.to_json()))
    assert again.provisional and again == p


@pytest.mark.parametrize("collectives, match", [
    ({"1x8": {"broadcast": LAX_WINS}}, "must map some of reduce_scatter, allgather"),
    ({"1x8": {"allgather": dict(LAX_WINS, spread=[1.0, -1.0, 2.0])}}, "'spread' must be 3 numbers, 0 or more"),
    ({"1x8": {"allgather": dict(LAX_WINS, extra=[1, 2, 3])}}, "and optionally 'spread'")])
def test_bad_collective_tables_are_refused_by_name(collectives, match):
    with pytest.raises(profiles.ProfileError, match=match):
        profiles.Profile({}, {"1x8": LAX_WINS}, collectives=collectives)


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_the_calibrations_checker_rejects_wrong_results(collective):
    """calibrate refuses to write a profile whose plan gave wrong elements: its checker
    counts a dropped rank and zeros, and passes the exact result."""
    rng = np.random.default_rng(1)
    n, count = 4, 8
    x = rng.standard_normal((n, count)).astype(np.float32)
    total = x.sum(axis=0, dtype=np.float64).astype(np.float32)
    right = {"allreduce": np.broadcast_to(total, (n, count)), "reduce_scatter": total.reshape(n, -1),
             "allgather": np.broadcast_to(x.reshape(-1), (n, n * count))}[collective]
    rows = list(range(n))
    assert calibration._wrong(collective, np.array(right), rows, x, n) == 0
    assert calibration._wrong(collective, np.zeros_like(right), rows, x, n) == right.size
    dropped = x.copy()
    dropped[1] = 0
    assert calibration._wrong(collective, np.array(right), rows, dropped, n) > 0
    if collective == "allreduce":  # in groups of 2 (rows 0-1, 2-3), the sum over all 4 is wrong
        assert calibration._wrong(collective, np.array(right), rows, x, 2) > 0


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather"])
def test_a_collective_over_groups_is_measured_and_checked(collective):
    """Over groups of 2 and 4 of the 8 devices (all groups at once), as an axis of that size
    of a 2-D mesh runs it: every result right."""
    for group in (2, 4):
        rows = calibration.measure_collective(collective, (16, 1000), 2, group=group)
        assert all(r["wrong"] == 0 and r["blink_added_us"] > 0 for r in rows), rows
    with pytest.raises(ValueError, match="group must divide the 8 devices"):
        calibration.measure_collective(collective, (16,), 2, group=3)


def test_the_calibration_measures_writes_and_is_used(monkeypatch, tmp_path):
    """A quick calibration on this process's 8 CPU devices: every row measured, the file
    valid, and psum then reads it."""
    monkeypatch.setenv("JAX_BLINK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("JAX_BLINK_PROFILE")
    made, where = calibration.calibrate(quick=True, rounds=3, progress=False)
    assert where == machine.profile_path() and where.parent == tmp_path
    again = profiles.Profile.from_json(where)
    assert again == made and again.key == machine.machine_key()
    layout = f"1x{jax.device_count()}"
    table = made.tables[layout]
    assert table["elements"] == calibration.QUICK_ELEMENTS and all(t > 0 for t in table["blink"] + table["lax"])
    assert len(table["spread"]) == len(table["elements"]) and all(v >= 0 for v in table["spread"])
    assert sorted(made.collectives) == [layout]  # quick: the groups of 2 and 4 only in a full one
    assert calibration._groups(8) == [2, 4, 8]
    for c in profiles.COLLECTIVES:  # measured beside the allreduce, and read by their choices
        t = made.collectives[layout][c]
        assert t["elements"] == calibration.COLLECTIVE_ELEMENTS[c][::2] and len(t["spread"]) == 2
        assert predict_cpu.cpu_collective(c, 4000, 1, jax.device_count()).source.startswith(
            "this machine's")
    assert "quick profile" in predict_cpu.cpu_allreduce(4000).source
    machine.forget()


def test_the_command_line_calibration_writes_a_valid_profile(tmp_path):
    out = tmp_path / "p.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_BLINK_", "XLA_FLAGS"))}
    env["JAX_PLATFORMS"] = "cpu"
    res = subprocess.run([sys.executable, "-m", "jax_blink", "calibrate", "--quick", "--rounds", "2",
                          "--cpu-devices", "4", "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"wrote {out}" in res.stdout and "calibrating [" in res.stderr
    made = profiles.Profile.from_json(out)
    assert list(made.tables) == ["1x4"] and made.quick


def test_the_command_line_refuses_bad_arguments_by_name():
    res = subprocess.run([sys.executable, "-m", "jax_blink", "calibrate", "--cpu-devices", "1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--cpu-devices must be >= 2" in res.stderr


@pytest.mark.parametrize("where", ["dir", "under_a_file"])
def test_a_profile_that_cannot_be_written_fails_before_measuring(tmp_path, where):
    """calibrate exits non-zero naming the path and what to do, before it measures anything."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = tmp_path if where == "dir" else blocker / "p.json"
    res = subprocess.run([sys.executable, "-m", "jax_blink", "calibrate", "--quick", "--cpu-devices", "2",
                          "--out", str(out)], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert res.returncode == 2, res.stderr[-2000:]
    assert f"error: cannot write the profile to {out}" in res.stderr and "--out FILE" in res.stderr, res.stderr
    assert "calibrating [" not in res.stderr  # nothing was measured


@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
def test_auto_picks_every_recorded_winner_that_was_clear(use_profile, path):
    """The recorded calibration replayed: wherever one side measured at least 10% faster,
    psum's auto choice at that size takes it."""
    recorded = json.loads(path.read_text())
    tables = recorded["tables"]
    use_profile(tables)
    layout = next(iter(tables))
    nranks = int(layout.split("x")[1])
    t = tables[layout]
    checked = 0
    for count, b, x in zip(t["elements"], t["blink"], t["lax"]):
        if min(b, x) > 0.9 * max(b, x):
            continue
        assert runs_blink(choice(count, nranks)) == (b < x), (count, b, x)
        checked += 1
    assert checked >= 3


def test_the_replay_rejects_a_swapped_profile(use_profile):
    """The replay's check fails on a choice against the numbers: with blink and lax swapped in
    the profile, the winners flip."""
    use_profile({"1x8": {"elements": LAX_WINS["elements"], "blink": LAX_WINS["lax"], "lax": LAX_WINS["blink"]}})
    assert all(runs_blink(choice(c)) for c in LAX_WINS["elements"])
    use_profile({"1x8": LAX_WINS})
    assert not any(runs_blink(choice(c)) for c in LAX_WINS["elements"])


def test_processes_of_one_host_are_measured_in_a_local_job():
    """The full calibration's second layout: two processes of one CPU device each (127.0.0.1),
    jax_blink over their shared memory against lax over gloo, every size measured and summed
    right."""
    job = calibration._measure_processes(2, {"allreduce": (1, 1000), **calibration.COLLECTIVE_ELEMENTS}, 3)
    assert [r["count"] for r in job["allreduce"]] == [1, 1000]
    for c in profiles.COLLECTIVES:
        assert [r["count"] for r in job[c]] == list(calibration.COLLECTIVE_ELEMENTS[c])
    for rows in job.values():
        assert all(r["wrong"] == 0 and r["blink_added_us"] > 0 and r["lax_added_us"] > 0 and r["spread_us"] >= 0
                   for r in rows)


def test_processes_as_hosts_are_measured_in_a_local_job():
    """The full calibration's layout of devices spanning hosts: two processes of two CPU devices,
    each labelled a host of its own, Blink's phases against lax over gloo, summed right."""
    job = calibration._measure_processes(2, {"reduce_scatter": (1000,), "allgather": (1000,)}, 3, 2, hosts=True)
    assert sorted(job) == sorted(profiles.COLLECTIVES)
    for rows in job.values():
        assert [r["count"] for r in rows] == [1000]
        assert all(r["wrong"] == 0 and r["blink_added_us"] > 0 and r["lax_added_us"] > 0 for r in rows)


def test_a_failed_processes_job_keeps_the_one_process_layout(monkeypatch, tmp_path, caplog):
    def fail(*args, **keywords):
        raise RuntimeError("measuring 2 processes of one host failed (process 1: exit -9)")

    monkeypatch.setattr(calibration, "_measure_processes", fail)
    monkeypatch.setattr(calibration, "FULL_ELEMENTS", (1, 1000))  # (a full calibration's steps, made small)
    monkeypatch.setattr(calibration, "COLLECTIVE_ELEMENTS", {"reduce_scatter": (64, 256), "allgather": (16, 64)})
    monkeypatch.setattr(calibration, "STEP_MODELS", ((1, 16), (2, 16)))
    with caplog.at_level(logging.WARNING, logger="jax_blink"):
        made, where = calibration.calibrate(path=tmp_path / "p.json", rounds=2, progress=False)
    assert list(made.tables) == [f"1x{jax.device_count()}"] and not made.quick
    assert all(":" not in layout and layout.startswith("1x") for layout in made.collectives)
    assert any("process 1: exit -9" in r.message and "one process's layout" in r.message for r in caplog.records)
    assert any("exit -9" in r.message and "keep the recorded range" in r.message for r in caplog.records)
    machine.forget()


def test_a_profile_keeps_its_step_and_bucket_tables():
    steps = {"1x8": {"bytes": [1_000_000, 4_000_000], "blink": [3000.0, 5000.0], "lax": [2000.0, 6000.0]}}
    tuned = {"1x8": {"bytes": [1_000_000, 4_000_000], "bucket_bytes": [1 << 18, 1 << 20, 1 << 40],
                     "vs_lax": [[1.1, 0.9, 0.8], [0.9, 0.95, 1.2]]}}
    p = profiles.Profile({}, {"1x8": LAX_WINS}, steps=steps, buckets=tuned)
    assert profiles.Profile.from_json(p.to_json()) == p and p.steps["1x8"]["bytes"] == (1_000_000, 4_000_000)
    assert p.bucket_bytes("1x8", 1e6) == 1 << 40 and p.bucket_bytes("1x8", 5e6) == 1 << 18
    assert p.bucket_bytes("2x1", 1e6) is None
    text = calibration.describe(p)
    assert "step,  1.00 MB of gradients/device" in text
    assert "step,  1.00 MB in buckets of 256 KiB 1.10, 1 MiB 0.90, one bucket 0.80 of lax  -> one bucket" in text
    assert "step,  4.00 MB in buckets of 256 KiB 0.90, 1 MiB 0.95, one bucket 1.20 of lax  -> 256 KiB" in text


@pytest.mark.parametrize("tuned, match", [
    ({"1x8": {"bytes": [5], "bucket_bytes": [2, 1], "vs_lax": [[1, 1]]}}, "'bucket_bytes' must increase"),
    ({"1x8": {"bytes": [5, 3], "bucket_bytes": [1, 2], "vs_lax": [[1, 1], [1, 1]]}}, "'bytes' must increase"),
    ({"1x8": {"bytes": [5], "bucket_bytes": [1.5, 2], "vs_lax": [[1, 1]]}}, "positive whole numbers"),
    ({"1x8": {"bucket_bytes": [1, 2], "vs_lax": [1, 1]}}, "'bytes', 'bucket_bytes' and 'vs_lax'"),
    ({"1x8": {"bytes": [5], "bucket_bytes": [1, 2], "vs_lax": [[1, float("nan")]]}}, "1 rows .* of 2 positive"),
    ({"1x8": {"bytes": [5], "bucket_bytes": [1, 2], "vs_lax": [1, 1]}}, "1 rows .* of 2 positive"),
    ({"1x8": {"bytes": [5, 6], "bucket_bytes": [1, 2], "vs_lax": [[1, 1]]}}, "2 rows"),
    ({"1x8": {"bytes": [5], "bucket_bytes": [1], "vs_lax": [[1]]}}, "at least two candidate"),
    ([1, 2], "'buckets' must be an object"),
])
def test_bad_bucket_tables_are_refused_by_name(tuned, match):
    with pytest.raises(profiles.ProfileError, match=match):
        profiles.Profile({}, {"1x8": LAX_WINS}, buckets=tuned)


@pytest.mark.parametrize("steps, match", [
    ({"1x8": {"bytes": [2, 1], "blink": [1, 1], "lax": [1, 1]}}, "'bytes' must increase"),
    ({"1x8": {"elements": [1, 2], "blink": [1, 1], "lax": [1, 1]}}, "'bytes', 'blink' and 'lax'"),
    ({"1x8": {"bytes": [1, 2], "blink": [1, 0], "lax": [1, 1]}}, "positive numbers"),
    ([1, 2], "'steps' must be an object"),
])
def test_bad_step_tables_are_refused_by_name(steps, match):
    with pytest.raises(profiles.ProfileError, match=match):
        profiles.Profile({}, {"1x8": LAX_WINS}, steps=steps)


def test_measure_steps_times_each_model_and_bucket_size_and_builds_valid_tables():
    # (2, 64): leaves of 16 KiB and 256 B; (1, 128): 64 KiB and 512 B. Buckets of 1 and 4 KiB
    # split both alike (the weights alone, the biases together), so they are timed once
    candidates = (1 << 10, 1 << 12, 1 << 40)
    table, tuned = calibration.measure_steps(((2, 64), (1, 128)), rounds=2, candidates=candidates)
    assert table["bytes"] == [2 * 64 * 65 * 4, 128 * 129 * 4]
    assert all(t > 0 for t in table["blink"] + table["lax"])
    assert tuned["bucket_bytes"] == list(candidates) and tuned["bytes"] == table["bytes"]
    assert all(row[0] == row[1] for row in tuned["vs_lax"]) and len(tuned["vs_lax"]) == 2
    p = profiles.Profile({}, {"1x8": LAX_WINS}, steps={"1x8": table}, buckets={"1x8": tuned})  # valid tables
    for nbytes, row in zip(table["bytes"], tuned["vs_lax"]):
        assert p.bucket_bytes("1x8", nbytes) in (1 << 10, 1 << 40)
        assert row[candidates.index(p.bucket_bytes("1x8", nbytes))] == min(row)


def gpu_profile(table):
    """A profile of a GPU machine (an 8-GPU host's key) holding ``table`` for its 8 devices."""
    key = {**machine.machine_key(), "platform": "gpu", "device_kind": "NVIDIA H200", "devices": 8}
    return profiles.Profile(key, {"1x8": table}, created="2026-11-28T00:00:00+00:00")


GPU_MEASURED = {"elements": [1, 1000, 1_000_000], "blink": [40.0, 45.0, 300.0], "lax": [20.0, 30.0, 900.0]}


def test_on_gpus_psum_chooses_from_the_measured_times(monkeypatch):
    """A GPU machine's profile decides an allreduce over the devices it measured, on their
    detected topology: lax (NCCL) where it measured faster, the tuned plan where that was,
    and explain() names the profile and both times. With the columns swapped the choices
    flip, so the check follows the numbers."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "auto")
    monkeypatch.setattr(machine, "profile", lambda: gpu_profile(GPU_MEASURED))
    small = decide.decide(1000, "float32", 8, platform="gpu")
    large = decide.decide(1_000_000, "float32", 8, platform="gpu")
    assert not runs_blink(small) and "measured by this machine's profile (1x8, 2026-11-28)" in small.text
    assert "blink-tuned 45 us, lax 30 us" in small.text
    assert runs_blink(large) and large.request.algo == "blink-tuned" and "blink-tuned 300 us, lax 900 us" in large.text
    swapped = dict(GPU_MEASURED, blink=GPU_MEASURED["lax"], lax=GPU_MEASURED["blink"])
    monkeypatch.setattr(machine, "profile", lambda: gpu_profile(swapped))
    assert runs_blink(decide.decide(1000, "float32", 8, platform="gpu"))
    assert not runs_blink(decide.decide(1_000_000, "float32", 8, platform="gpu"))


@pytest.mark.parametrize("case", ["another topology", "JAX_BLINK_TOPOLOGY", "another device count",
                                  "a CPU machine's profile", "several processes"])
def test_on_gpus_a_profile_that_does_not_cover_the_call_leaves_it_to_the_simulator(monkeypatch, case):
    """The GPU measurement holds for the devices and links it ran on: a topology given by
    hand, a device count it did not measure, a CPU machine's profile or devices in several
    processes go to the simulator and NCCL's model instead."""
    monkeypatch.setenv("JAX_BLINK_ALGO", "auto")
    found = gpu_profile(GPU_MEASURED)
    if case == "JAX_BLINK_TOPOLOGY":  # the same links, but named by hand: not what was measured
        monkeypatch.setenv("JAX_BLINK_TOPOLOGY", "shm:8")
    if case == "a CPU machine's profile":
        found = profiles.Profile(machine.machine_key(), {"1x8": GPU_MEASURED})
    monkeypatch.setattr(machine, "profile", lambda: found)
    request = decide.PlanRequest(decide.topology_for("hgx-h100" if case == "another topology" else None,
                                                     4 if case == "another device count" else 8),
                                 None, 0.0, "allreduce", "sum", None)
    processes = 2 if case == "several processes" else 1
    assert predict_gpu.measured_allreduce(request, 4e6, processes) is None
    covered = dataclasses.replace(request, topology=decide.topology_for(None, 8))
    assert (predict_gpu.measured_allreduce(covered, 4e6) is None) == (case in ("a CPU machine's profile",
                                                                              "JAX_BLINK_TOPOLOGY"))
    if case == "another topology":
        d = decide.decide(1_000_000, "float32", 8, topology="hgx-h100", platform="gpu")
        assert "measured by" not in d.text and "simulated" in d.text


def test_measure_steps_refuses_wrong_sums_of_the_bucketing_it_keeps(monkeypatch):
    checked = []

    def wrong(depth, width, variant):
        checked.append((depth, width, variant))
        return 3

    monkeypatch.setattr(calibration, "wrong_gradient_sums", wrong)
    with pytest.raises(RuntimeError, match="3 gradient elements of the 1x128 MLP .* were wrong; nothing was written"):
        calibration.measure_steps(((1, 128),), rounds=1, candidates=(1 << 10, 1 << 40))
    assert checked and checked[0][:2] == (1, 128)


def test_calibrate_counts_other_processes_cpu_as_busy():
    """A process spinning beside the calibration makes it busy (its own earlier work, which
    the load average counts, does not)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        assert calibration.others_cpu(0.5) > calibration.BUSY_CORES
    finally:
        spinner.kill()
        spinner.wait()
