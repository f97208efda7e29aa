"""The cluster level without Ray (iasgd.executors.cluster): the parameter server's gate
and accounting under real concurrent node threads, a planted gate bug that
the checks must see, lost nodes, and whole nodes training in one process."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np
import pytest
from links import in_process_link  # tests/executors/links.py

from iasgd import data as datasets
from iasgd import engine
from iasgd.config import config_where_it_applies
from iasgd.executors import cluster as C
from iasgd.executors import exchange as X
from iasgd.nn import models
from iasgd.protocol import gate as G

P = 64  # parameters of the toy server runs


def config(**kw) -> engine.TrainConfig:
    base = {"algo": "interval", "threads": 1, "backend": "ray", "nodes": 4, "sync_every": 2}
    return config_where_it_applies(**{**base, **kw})


def push_many(server: C.ParameterServer, node: int, rounds: int, seed: int) -> list:
    """A node that pushes random deltas as fast as it can, with random
    pauses; returns [(delta, count, applied)] of its pushes."""
    rng = np.random.default_rng(seed)
    reply = server.exchange(C.Push(node, None, 0, 0, -1), 2)
    pushes = []
    for _ in range(rounds):
        if reply.stop:
            break
        delta = rng.standard_normal(P).astype(np.float32)
        if rng.random() < 0.3:
            time.sleep(rng.uniform(0, 2e-4))
        push = C.Push(node, delta, reply.granted, reply.version, reply.gen,
                      computed=reply.granted)
        reply = server.exchange(push, 2)
        pushes.append((delta, push.count, reply.applied))
    server.node_lost(node, None)  # done: its slot must not hold the others up
    return pushes


def run_nodes(server: C.ParameterServer, nodes: int, rounds: int) -> list:
    server.allow(10**9)
    with ThreadPoolExecutor(nodes) as pool:
        done = [pool.submit(push_many, server, i, rounds, i) for i in range(nodes)]
        return [p for f in done for p in f.result(timeout=60)]


@pytest.mark.parametrize("algo,gate", [("interval", "wait"), ("interval", "drop"),
                                       ("hogwild", "wait"), ("async", "wait")])
def test_every_push_is_applied_once_and_staleness_between_nodes_stays_bounded(algo, gate):
    init = np.linspace(-1, 1, P, dtype=np.float32)
    server = C.ParameterServer(init, config(algo=algo, node_gate=gate, node_interval=2))
    pushes = run_nodes(server, 4, 300)
    s = server.summary()
    applied = [(d, n) for d, n, ok in pushes if ok]
    assert s["pushes"] == len(applied) and s["dropped_pushes"] == len(pushes) - len(applied)
    assert s["applied"] == sum(n for _, n in applied)  # DONE counts the nodes' updates
    expected = init + np.sum([d for d, _ in applied], axis=0, dtype=np.float64)
    # float32 sums of ~1,200 pushes round by ~1e-4; a push lost or applied twice
    # moves some parameter by ~1
    np.testing.assert_allclose(server.get_params(), expected, rtol=0, atol=1e-2)
    st = s["node_staleness"]
    assert st["violations"] == 0 and sum(st["hist"]) == len(applied)
    if algo == "interval":
        assert st["bound"] == 1 and st["max"] <= 1
        assert s["intervals"] >= len(applied) // 2 - 1
    else:
        assert st["bound"] is None and st["max"] >= 1  # 4 nodes racing: some staleness
    if gate == "drop":
        assert s["dropped_pushes"] > 0  # 4 nodes on 2 slots: some arrive too late


def test_a_gate_that_admits_without_slots_is_caught():
    """Mutant: the pull takes no slot of the interval (no admission), so
    intervals close under nodes still computing in them. The server's check
    must count the pushes applied outside their interval."""
    server = C.ParameterServer(np.zeros(P, np.float32), config(node_interval=2))

    def no_admission(node: int) -> int:
        server.slot[node] = int(G.generation(server.state))
        return server.slot[node]

    server._take_slot = no_admission
    run_nodes(server, 4, 200)
    st = server.summary()["node_staleness"]
    assert st["violations"] > 0 and st["max"] > st["bound"]


@pytest.mark.parametrize("gate", ["wait", "drop"])
def test_the_server_counts_every_push_outside_its_interval_or_bound(gate):
    """The server's run-time check of the cluster gate, push by push: a push
    with tau_node = y - 1 inside its interval is not counted (the exact
    bound), one with tau_node = y is, and (wait policy, where the pull's slot
    says the interval) so is one whose slot is of an interval that is over.
    Bases older than the gate allows, and the stale slot, are planted: a
    correct gate never makes them."""
    y = 3
    server = C.ParameterServer(np.zeros(P, np.float32),
                               config(nodes=3, node_interval=y, node_gate=gate))
    server.allow(100)

    def pull(node: int) -> C.Reply:
        return server.exchange(C.Push(node, None, 0, 0, -1), 1)

    def push(node: int, reply: C.Reply, v_base: int) -> int:
        """Push the node's one update against a base at version v_base (and
        hold no ticket after it: no slot is taken); returns the violations."""
        after = server.exchange(C.Push(node, np.ones(P, np.float32), reply.granted, v_base,
                                       reply.gen), 0)
        assert after.applied
        return server.summary()["node_staleness"]["violations"]

    pulls = [pull(node) for node in range(3)]  # interval 0, V = 0
    assert [(r.version, r.gen) for r in pulls] == [(0, 0)] * 3
    # tau_node 0, 1 and 2 = y - 1: the last completes interval 0
    assert [push(node, r, 0) for node, r in enumerate(pulls)] == [0, 0, 0]
    s = server.summary()
    assert s["intervals"] == 1 and s["node_staleness"]["hist"] == [1, 1, 1]
    again = pull(0)  # interval 1, V = 3
    assert (again.version, again.gen) == (3, 1)
    assert push(0, again, again.version - y) == 1  # tau_node = y
    if gate == "wait":
        late = pull(1)  # V = 4
        server.slot[1] = 0  # its slot is of interval 0, which is over
        assert push(1, late, late.version) == 2  # tau_node 0, but outside its interval
    assert server.snapshot()[1]["violations"] == (2 if gate == "wait" else 1)


def test_sync_applies_the_mean_of_one_push_per_node_per_round():
    init = np.zeros(P, np.float32)
    server = C.ParameterServer(init, config(algo="sync", nodes=3))
    server.allow(10**9)
    deltas = [np.full(P, v, np.float32) for v in (1.0, 2.0, 6.0)]

    def node(i: int) -> C.Reply:
        reply = server.exchange(C.Push(i, None, 0, 0, -1), 2)
        return server.exchange(C.Push(i, deltas[i], reply.granted, reply.version, -1), 2)

    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(node, range(3)))
    for reply in replies:  # every node pulls the same averaged parameters
        np.testing.assert_allclose(reply.params, np.full(P, 3.0), atol=1e-6)
        assert reply.version == 1
    s = server.summary()
    assert s["sync_rounds"] == 1 and s["node_staleness"]["max"] == 0


def test_a_lost_node_gives_back_its_slot_and_tickets():
    server = C.ParameterServer(np.zeros(P, np.float32), config(nodes=2, node_interval=2))
    server.allow(32)
    a = server.exchange(C.Push(0, None, 0, 0, -1), 8)
    b = server.exchange(C.Push(1, None, 0, 0, -1), 8)
    assert (a.gen, b.gen, a.granted, b.granted) == (0, 0, 8, 8)
    assert int(server.state[G.TICKETS]) == 16
    # node 1 pushes, and its pull waits: interval 0 still waits for node 0's push
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(server.exchange,
                              C.Push(1, np.ones(P, np.float32), 8, b.version, b.gen), 4)
        with pytest.raises(FutureTimeout):
            waiting.result(timeout=0.2)
        assert server.summary()["intervals"] == 0
        assert server.node_lost(0, "killed") == 1
        pulled = waiting.result(timeout=5)
    assert server.summary()["intervals"] == 1  # its slot counted: the interval completed
    assert (pulled.gen, pulled.granted) == (1, 4)
    assert int(server.state[G.TICKETS]) == 16 - 8 + 4  # node 0's 8 came back
    assert server.summary()["lost_nodes"][0]["node"] == 0
    late = server.exchange(C.Push(0, np.ones(P, np.float32), 8, a.version, a.gen), 8)
    assert late.stop  # a lost node's late push is not applied
    np.testing.assert_array_equal(server.get_params(), np.ones(P, np.float32))


def test_a_sync_round_completes_without_a_lost_node():
    server = C.ParameterServer(np.zeros(P, np.float32), config(algo="sync", nodes=2))
    server.allow(100)
    server.exchange(C.Push(0, None, 0, 0, -1), 4)
    server.exchange(C.Push(1, None, 0, 0, -1), 4)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(server.exchange, C.Push(0, np.full(P, 2, np.float32), 4, 0, -1), 4)
        with pytest.raises(FutureTimeout):
            waiting.result(timeout=0.2)  # the round waits for node 1
        server.node_lost(1, "killed")
        reply = waiting.result(timeout=5)
    np.testing.assert_array_equal(reply.params, np.full(P, 2, np.float32))


def test_the_last_tickets_of_an_allowance_are_shared_among_the_nodes():
    server = C.ParameterServer(np.zeros(P, np.float32), config(algo="hogwild", nodes=2))
    server.allow(10)
    a = server.exchange(C.Push(0, None, 0, 0, -1), 8)
    b = server.exchange(C.Push(1, None, 0, 0, -1), 8)
    assert (a.granted, b.granted) == (5, 3)  # a share of what is left each: 10/2, 5/2


def test_the_server_stops_blocked_exchanges_and_refuses_non_finite_pushes():
    server = C.ParameterServer(np.zeros(P, np.float32), config(nodes=1, algo="hogwild"))
    with ThreadPoolExecutor(1) as pool:  # no tickets allowed: the pull waits
        waiting = pool.submit(server.exchange, C.Push(0, None, 0, 0, -1), 4)
        time.sleep(0.1)
        assert not waiting.done()
        server.stop()
        assert waiting.result(timeout=5).stop
    server = C.ParameterServer(np.zeros(P, np.float32), config(nodes=1, algo="hogwild"))
    server.allow(10)
    r = server.exchange(C.Push(0, None, 0, 0, -1), 4)
    bad = np.full(P, np.nan, np.float32)
    r = server.exchange(C.Push(0, bad, 4, r.version, r.gen), 4)
    assert r.stop and server.progress()["diverged"]
    assert np.all(server.get_params() == 0)


@pytest.mark.parametrize("algo", ["interval", "sync"])
def test_nodes_train_with_their_threads_and_exchange_in_one_process(algo, monkeypatch):
    limited = []  # each node trains under the one-thread BLAS limit, as a threaded run does

    @contextlib.contextmanager
    def record_limit():
        limited.append(threading.get_ident())
        yield
    monkeypatch.setattr(C, "single_threaded_blas", record_limit)
    data = datasets.synthetic(seed=0, n_train=600, n_test=100)
    model = models.build("lenet", "synthetic")
    cfg = config(algo=algo, nodes=2, threads=2, sync_every=4, interval=3, node_interval=2,
                 lr=0.01)
    server = C.ParameterServer(model.init(0), cfg)
    nodes = [C.Node(i, model, data, cfg) for i in range(2)]
    server.allow(240)
    figures: list[dict] = []
    with ThreadPoolExecutor(8) as pool:
        runs = [threading.Thread(target=lambda n=n: figures.append(
            n.run(in_process_link(pool, server)))) for n in nodes]
        for t in runs:
            t.start()
        deadline = time.monotonic() + 120
        while server.progress()["done"] < 240 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.stop()
        for t in runs:
            t.join(60)
    s = server.summary()
    assert len(set(limited)) == 2  # once in each node's thread
    assert s["applied"] == 240 and s["computed"] >= 240
    assert sum(f["applied"] for f in figures) >= 240  # the updates after the stop are lost
    for f in figures:
        assert f["pushes"] > 0 and f["staleness"]["violations"] == 0
        if algo == "interval":
            assert f["staleness"]["bound"] == 2 and f["staleness"]["max"] <= 2
    node_level = s["node_staleness"]
    assert node_level["violations"] == 0
    assert node_level["max"] <= (1 if algo == "interval" else 0)
    assert np.all(np.isfinite(server.get_params()))


def test_a_nodes_threads_augment_their_batches_as_configured():
    """--augment reaches a cluster node's team (its workers draw and gather
    as a threaded run's do: tests/nn/test_augment.py)."""
    data = datasets.synthetic(seed=0, n_train=64, n_test=16)
    model = models.build("lenet", "synthetic")
    node = C.Node(1, model, data, config(augment="crop,flip", crop_padding=2, threads=2))
    inputs = node.team.inputs
    assert (inputs.shape, inputs.pad, inputs.flip) == ((3, 32, 32), 2, True)
    assert all(own.codes.shape == (16, 3) for own in node.team.own)


def test_a_node_still_holding_tickets_is_never_kept_waiting_for_more():
    """With overlap a node asks for more while it still holds unpushed
    tickets; if it waited for more at the end of an allowance, the allowance
    (which waits for those very updates) would never end."""
    server = C.ParameterServer(np.zeros(P, np.float32), config(algo="hogwild", nodes=1))
    server.allow(8)
    first = server.exchange(C.Push(0, None, 0, 0, -1), 8)
    assert first.granted == 8
    d = np.ones(P, np.float32)
    half = server.exchange(C.Push(0, d, 4, first.version, first.gen), 4)  # 4 still held
    assert half.granted == 0 and not half.stop
    with ThreadPoolExecutor(1) as pool:  # all pushed: now it waits for the next allowance
        rest = pool.submit(server.exchange, C.Push(0, d, 4, half.version, half.gen), 4)
        with pytest.raises(FutureTimeout):
            rest.result(timeout=0.2)
        assert server.progress()["done"] == 8
        server.allow(16)
        assert rest.result(timeout=5).granted == 4


# ------------------------------------------------------- a lost server


def test_replies_say_which_updates_the_parameters_hold():
    server = C.ParameterServer(np.zeros(P, np.float32), config(algo="hogwild", nodes=2))
    server.allow(100)
    a = server.exchange(C.Push(0, None, 0, 0, -1), 4)
    assert (a.done, a.contained) == (0, [0, 0])
    a = server.exchange(C.Push(0, np.ones(P, np.float32), 4, a.version, a.gen), 4)
    b = server.exchange(C.Push(1, None, 0, 0, -1), 4)
    b = server.exchange(C.Push(1, np.ones(P, np.float32), 3, b.version, b.gen), 4)
    assert (a.done, a.contained) == (4, [4, 0])
    assert (b.done, b.contained, b.version) == (7, [4, 3], 2)


def test_a_sync_round_counts_in_the_parameters_only_once_applied():
    server = C.ParameterServer(np.zeros(P, np.float32), config(algo="sync", nodes=2))
    server.allow(100)
    server.exchange(C.Push(0, None, 0, 0, -1), 4)
    server.exchange(C.Push(1, None, 0, 0, -1), 4)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(server.exchange, C.Push(0, np.ones(P, np.float32), 4, 0, -1), 4)
        with pytest.raises(FutureTimeout):
            waiting.result(timeout=0.2)  # the round waits for node 1
        # DONE counts node 0's push already; the parameters do not hold it yet
        arrays, meta = server.snapshot()
        assert int(arrays["server_state"][G.DONE]) == 4
        assert (meta["in_params"], meta["node_done"]) == (0, [0, 0])
        b = server.exchange(C.Push(1, np.ones(P, np.float32), 4, 0, -1), 4)
        a = waiting.result(timeout=5)
    assert (a.done, a.contained) == (b.done, b.contained) == (8, [4, 4])


def test_freshest_and_lost_updates_of_a_lost_server():
    copy = C.Standing(-1, 3, 12, [6, 6])  # the driver's copy
    n0 = C.Standing(0, 5, 20, [10, 10], held=4, in_flight=8)  # its push went in after v5...
    n1 = C.Standing(1, 6, 28, [18, 10], held=0, in_flight=4)  # ...and v6 holds it
    assert X.freshest([copy, n0, n1]) is n1
    # n0's push is in n1's parameters (18 - 10 = 8 of node 0's); n1's own is not
    assert X.lost_updates([n0, n1], n1) == 4
    assert X.lost_updates([n0, n1], X.freshest([copy, n0])) == 8 + 4
    assert X.freshest([copy, C.Standing(0, 3, 12, [6, 6])]) is copy  # a tie: no fetch


def test_a_server_taken_over_continues_from_the_given_parameters_and_counters():
    init = np.zeros(P, np.float32)
    lost = C.ParameterServer(init, config(algo="hogwild", nodes=2))
    lost.allow(40)
    a = lost.exchange(C.Push(0, None, 0, 0, -1), 8)
    b = lost.exchange(C.Push(1, None, 0, 0, -1), 8)
    d0, d1 = np.full(P, 1, np.float32), np.full(P, 10, np.float32)
    a = lost.exchange(C.Push(0, d0, 8, a.version, a.gen, computed=8), 8)
    lost.exchange(C.Push(1, d1, 8, b.version, b.gen, computed=8), 8)  # its reply never came
    counters = lost.counters()
    n0 = C.Standing(0, a.version, a.done, a.contained, held=8)  # 8 granted, not pushed
    n1 = C.Standing(1, b.version, b.done, b.contained, held=0, in_flight=8)
    base = X.freshest([n0, n1])
    assert base is n0 and X.lost_updates([n0, n1], base) == 8  # d1 came after n0's pull

    server = C.ParameterServer(a.params, config(algo="hogwild", nodes=2))
    server.take_over(base, {0: 8, 1: 0}, 40, counters)
    p = server.progress()
    assert (p["done"], p["limit"], p["live"]) == (8, 40, [0, 1])
    assert int(server.state[G.TICKETS]) == 16  # n1's lost 8 are handed out again
    assert server.summary()["pushes"] == 2 and server.summary()["computed"] == 16
    again = server.exchange(C.Push(1, None, 0, 0, -1), 8)  # n1 pulls from it
    assert again.granted == 8 and again.version == 1
    np.testing.assert_array_equal(again.params, d0)  # d1 is lost
    r = server.exchange(C.Push(0, d0, 8, a.version, a.gen), 8)  # n0 pushes what it held
    assert (r.done, r.contained, r.version) == (16, [16, 0], 2)
    s = server.summary()
    assert s["pushes"] == 3 and s["node_staleness"]["max"] == 1  # tau: n1's pull came between


class Switchboard:
    """An in-process link to a server that the test can lose and replace:
    polls of a lost server's exchanges raise ServerLostError."""

    def __init__(self, pool: ThreadPoolExecutor, server: C.ParameterServer):
        self.pool, self.server, self.lost = pool, server, set()

    def link(self, push: C.Push, want: int):
        server = self.server
        future = self.pool.submit(server.exchange, push, want)

        def poll(timeout_s: float):
            try:
                reply = future.result(timeout=timeout_s)
            except FutureTimeout:
                reply = None
            if id(server) in self.lost:  # looked at after the reply: it may be the stop's
                raise C.ServerLostError("lost")
            return reply
        return poll


@pytest.mark.parametrize("algo", ["interval", "sync"])
def test_nodes_go_on_with_a_new_server_when_theirs_is_lost(algo):
    """The whole restart in one process: the nodes stop at the lost server
    and say where they stand; a new server continues from the freshest
    parameters; every update of the run is applied, within both bounds."""
    data = datasets.synthetic(seed=0, n_train=600, n_test=100)
    model = models.build("lenet", "synthetic")
    K = 4
    cfg = config(algo=algo, nodes=2, threads=2, sync_every=K, interval=3, node_interval=2,
                 lr=0.01)
    first = C.ParameterServer(model.init(0), cfg)
    arrays, meta = first.snapshot()
    copy = C.Standing(-1, int(arrays["server_state"][G.VERSION]), meta["in_params"],
                      meta["node_done"])
    nodes = [C.Node(i, model, data, cfg) for i in range(2)]
    standings: list[C.Standing] = []
    reconnected = threading.Event()

    def rejoin(standing: C.Standing) -> bool:
        standings.append(standing)
        return reconnected.wait(60)

    first.allow(240)
    figures: list[dict] = []
    with ThreadPoolExecutor(8) as pool:
        board = Switchboard(pool, first)
        runs = [threading.Thread(target=lambda n=n: figures.append(n.run(board.link, rejoin)))
                for n in nodes]
        for t in runs:
            t.start()
        deadline = time.monotonic() + 120
        while first.progress()["done"] < 80 and time.monotonic() < deadline:
            time.sleep(0.005)
        board.lost.add(id(first))  # the server is lost, mid-run
        first.stop()
        while len(standings) < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(standings) == 2, "the nodes did not stop at the lost server"
        base = X.freshest([copy, *standings])
        params = nodes[base.node].base.copy() if base.node >= 0 else arrays["params"]
        server = C.ParameterServer(params, cfg)
        server.take_over(base, {s.node: s.held for s in standings}, 240, first.counters())
        lost = X.lost_updates(standings, base)
        board.server = server
        reconnected.set()
        while server.progress()["done"] < 240 and time.monotonic() < deadline:
            time.sleep(0.005)
        server.stop()
        for t in runs:
            t.join(60)
    s = server.summary()
    assert s["applied"] == 240  # the lost push's tickets were handed out again
    assert 0 <= lost <= 2 * 2 * K  # at most one push in flight per node, of at most 2K
    assert s["node_staleness"]["violations"] == 0
    assert s["node_staleness"]["max"] <= (1 if algo == "interval" else 0)
    for f in figures:
        assert f["rejoins"] == 1 and f["staleness"]["violations"] == 0
    assert np.all(np.isfinite(server.get_params()))


def test_rays_log_messages_stay_out_of_iasgds_output(capsys):
    """Ray's warnings are dropped and its errors are one plain line (no colour
    codes), whatever Ray's loggers are asked to print."""
    import logging

    from iasgd.executors.ray_connect import quiet_ray_logging

    quiet_ray_logging()
    quiet_ray_logging()  # once is enough: no second handler
    log = logging.getLogger("ray._private.somewhere")
    log.warning("Token authentication is enabled for this Ray cluster.\nSee the docs.")
    log.error("\x1b[33mA worker died\x1b[0m\nTraceback (most recent call last): ...")
    err = capsys.readouterr().err
    assert err == "iasgd: ray: A worker died\n", err


def test_what_rays_native_code_prints_while_it_starts_is_set_aside(capfd):
    import os

    from iasgd.executors.ray_connect import _ray_notices_aside

    with _ray_notices_aside():
        os.write(2, b"Token authentication is enabled for this Ray cluster.\n")
    assert capfd.readouterr().err == ""
    with _ray_notices_aside():
        os.write(2, b"\x1b[31m[2026] Error: the GCS did not answer\x1b[0m\nmore\n")
    assert capfd.readouterr().err == "iasgd: ray: [2026] Error: the GCS did not answer\n"
