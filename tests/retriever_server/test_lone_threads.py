"""The rule that lends idle cores to a lone dense batch, its inputs (batch, loneliness, free cores)
and the free-core reading it takes them from."""

import os
import subprocess
import sys
import time

from hypothesis import given
from hypothesis import strategies as st

from retriever_server.lone_threads import LONE_BATCH_MIN, WINDOW_S, FreeCores, LoneThreads, threads_for

counts = st.integers(min_value=1, max_value=64)
free = st.floats(min_value=0, max_value=64, allow_nan=False)


@given(queries=st.integers(0, 1024), lone=st.booleans(), threads=counts, lone_threads=counts, free_cores=free)
def test_a_lone_large_batch_gets_the_free_cores_within_its_bounds(queries, lone, threads, lone_threads, free_cores):
    n = threads_for(queries, lone, threads, lone_threads, free_cores)
    if not lone or queries < LONE_BATCH_MIN:
        assert n == threads  # shared work, or too little to split: the process's own share
    else:
        assert threads <= n <= max(threads, lone_threads)
        assert n == threads or n <= free_cores + 0.25  # more than its share only on cores found free


@given(lone_threads=counts, free_cores=free, more=st.floats(min_value=0, max_value=8))
def test_more_free_cores_never_mean_fewer_threads(lone_threads, free_cores, more):
    fewer = threads_for(LONE_BATCH_MIN, True, 1, lone_threads, free_cores)
    assert threads_for(LONE_BATCH_MIN, True, 1, lone_threads, free_cores + more) >= fewer


def test_two_free_cores_lend_a_lone_batch_two_threads_and_a_busy_core_does_not():
    assert threads_for(32, True, 1, 2, free_cores=1.9) == 2
    assert threads_for(32, True, 1, 2, free_cores=1.5) == 1  # half a core busy elsewhere: keep to one
    assert threads_for(32, False, 1, 2, free_cores=2.0) == 1  # another request waits: the HTTP side works
    assert threads_for(LONE_BATCH_MIN - 1, True, 1, 2, free_cores=2.0) == 1


def test_threads_are_set_only_when_they_change_and_never_beyond_the_share_when_none_is_lent():
    calls = []
    fixed = LoneThreads(2, 2, calls.append)  # --lone-threads as --threads: no cores lent, none read
    assert [fixed.before(n, lone) for n, lone in ((1, True), (256, True), (256, False))] == [2, 2, 2]
    assert calls == []
    lending = LoneThreads(1, 64, calls.append)
    assert lending.before(LONE_BATCH_MIN - 1, True) == 1 and lending.before(256, False) == 1
    assert calls == []  # neither a small lone batch nor a shared one reads or changes anything
    n = lending.before(256, True)
    assert 1 <= n <= max(1, len(os.sched_getaffinity(0))) and calls == ([n] if n != 1 else [])
    assert lending.before(256, False) == 1 and calls[-1:] == ([1] if n != 1 else [])


def test_a_core_kept_busy_by_another_process_is_not_free():
    core = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {core})
        reading = FreeCores({core})
        time.sleep(WINDOW_S * 2)
        assert reading() <= 0.5  # whoever else runs there only adds to the busy time
    finally:
        spinner.kill()
        spinner.wait()


def test_free_cores_stay_within_the_affinity():
    reading = FreeCores()
    time.sleep(WINDOW_S)
    assert 0 <= reading() <= len(os.sched_getaffinity(0))
