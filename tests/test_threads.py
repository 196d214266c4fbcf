"""agent.threads: torch threads from the cores other work leaves free; the rollout pool's division
of them among its workers; a CLI saying what it chose."""
from __future__ import annotations

import re

import pytest

from agent.threads import ENV, ThreadsError, choose_threads, cpu_ticks, pick_threads, read_busy

LINE = re.compile(r"torch threads: (\d+) \((\d+) cores, (\d+\.\d) busy with other work; --threads to override\)")


@pytest.mark.parametrize(("cores", "busy", "workers", "want"), [
    (2, 0.0, 1, 2),     # an idle machine: every core
    (2, 1.3, 1, 1),     # the case: 0.7 free, still at least 1
    (2, 2.0, 1, 1),     # all busy: at least 1
    (2, 0.1, 1, 2),     # background noise within the slack does not halve a 2-core machine
    (2, 0.5, 1, 1),     # half a core taken is a core taken
    (16, 3.0, 1, 13),
    (16, 0.0, 3, 5),    # 16 free cores among 3 processes: 5 each (15 <= 16)
    (16, 4.0, 4, 3),    # 12 free among 4: 3 each
    (4, 0.0, 8, 1),     # more workers than cores: one each
    (8, -1.0, 1, 8),    # a negative load reading counts as none
])
def test_pick_threads_never_exceeds_the_free_cores(cores, busy, workers, want):
    got = pick_threads(cores, busy, workers)
    assert got == want
    free = cores - max(0.0, busy)
    assert got == 1 or got * workers <= free + 0.25


def test_pick_threads_rejects_nonsense():
    with pytest.raises(ThreadsError, match="at least 1"):
        pick_threads(0, 0.0)
    with pytest.raises(ThreadsError, match="at least 1"):
        pick_threads(4, 0.0, workers=0)


def test_an_explicit_choice_wins_then_the_environment_then_the_free_cores():
    auto = choose_threads(cores=8, busy=2.0, env={})
    assert (auto.threads, auto.source) == (6, "auto")
    assert auto.line() == "torch threads: 6 (8 cores, 2.0 busy with other work; --threads to override)"

    env = choose_threads(cores=8, busy=2.0, env={ENV: "3"})
    assert (env.threads, env.source) == (3, ENV)
    assert "set by TANDEM_THREADS" in env.line()

    flag = choose_threads(5, cores=8, busy=2.0, env={ENV: "3"})
    assert (flag.threads, flag.source) == (5, "--threads")  # more than free: the user asked for it

    with pytest.raises(ThreadsError, match="TANDEM_THREADS must be a whole number of threads, got 'many'"):
        choose_threads(cores=8, busy=0.0, env={ENV: "many"})
    with pytest.raises(ThreadsError, match="--threads must be at least 1, got 0"):
        choose_threads(0, cores=8, busy=0.0, env={})


def test_reserved_cores_and_workers_share_what_is_free():
    c = choose_threads(workers=2, reserved=2, cores=8, busy=2.0, env={})
    assert c.threads == 2 and c.busy == 2.0  # (8 - 2 - 2) / 2
    assert c.line("rollout workers' torch threads").startswith("rollout workers' torch threads: 2 each of 2 processes")


def _stat(path, rows):
    """A /proc/stat with `rows` (cpu index -> (user, system, idle)) ticks."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{k} {u} 0 {s} {i} 0 0 0 0 0 0" for k, (u, s, i) in rows.items()]
    path.write_text("\n".join(lines + ["intr 1 2 3", "ctxt 5"]) + "\n")


def test_cpu_ticks_reads_only_the_cpus_this_process_may_use(tmp_path):
    stat = tmp_path / "stat"
    _stat(stat, {0: (30, 10, 60), 1: (5, 5, 90), 2: (100, 0, 0)})
    assert cpu_ticks({0, 1}, str(stat)) == (50.0, 200.0)
    assert cpu_ticks({2}, str(stat)) == (100.0, 100.0)


def test_read_busy_from_a_faked_proc_stat(tmp_path, monkeypatch):
    """Two samples of a stat file: the busy share of the ticks between them, in cores."""
    import os

    stat = tmp_path / "stat"
    cpus = sorted(os.sched_getaffinity(0))
    _stat(stat, {k: (0, 0, 0) for k in cpus})
    # the second sample: every CPU of ours 3/4 busy (75 of 100 ticks), as if other work ran meanwhile
    monkeypatch.setattr("agent.threads.time.sleep", lambda _s: _stat(stat, {k: (50, 25, 25) for k in cpus}))
    busy = read_busy(len(cpus), sample_s=1.0, stat=str(stat))
    assert busy == pytest.approx(0.75 * len(cpus), abs=0.05)  # less this process's own (tiny) CPU time


def test_the_rollout_pool_divides_the_free_cores_among_its_workers(monkeypatch):
    import torch

    from trainer.rollout.pool import WorkerSpec, resolve_threads

    monkeypatch.delenv(ENV, raising=False)
    spec = WorkerSpec("model", "weights")
    assert spec.threads is None
    # sync: the learner waits while the workers play, so they split all 8 free cores
    assert resolve_threads(spec, 4, "sync", cores=10, busy=2.0).threads == 2
    # async: the learner trains beside them; its threads are set aside first
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert resolve_threads(spec, 3, "async", cores=10, busy=2.0).threads == 2  # (10 - 2 - 2) // 3
        assert resolve_threads(spec, 2, "async", cores=2, busy=1.5).threads == 1  # nothing free: one each
    finally:
        torch.set_num_threads(old)
    for cores, busy, n in ((2, 0.0, 2), (16, 5.0, 3), (64, 10.0, 7)):
        per = resolve_threads(spec, n, "sync", cores=cores, busy=busy).threads
        assert per * n <= cores - busy + 0.25 or per == 1
    # an explicit count (and TANDEM_THREADS) is kept
    assert resolve_threads(WorkerSpec("m", "w", threads=3), 4, "sync", cores=2, busy=0.0).threads == 3
    monkeypatch.setenv(ENV, "2")
    assert resolve_threads(spec, 4, "sync", cores=16, busy=0.0).threads == 2


def test_train_says_how_many_threads_it_chose(tmp_path, capsys, monkeypatch):
    """`train sft` decides its threads before loading the model and says so on stderr."""
    from main import main

    monkeypatch.delenv(ENV, raising=False)
    rc = main(["--data", str(tmp_path / "data"), "train", "sft", "--model", str(tmp_path / "missing"),
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2  # no model there
    m = LINE.search(err)
    assert m, err
    threads, cores, busy = int(m[1]), int(m[2]), float(m[3])
    assert 1 <= threads <= cores and 0.0 <= busy <= cores

    rc = main(["--data", str(tmp_path / "data"), "train", "sft", "--model", str(tmp_path / "missing"),
               "--out", str(tmp_path / "out"), "--threads", "0"])
    assert rc == 2 and "--threads must be at least 1, got 0" in capsys.readouterr().err
