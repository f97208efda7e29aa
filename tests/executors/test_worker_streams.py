"""Each parallel worker draws its own batches: from its own splitmix64
stream, seeded by (the run's seed, its worker id, the run's segment)
(iasgd.protocol.workers.stream_seed; a cluster node's threads by its node's
seed, iasgd.executors.cluster.node_seed), so no two workers of a run train
on the same batch sequence, the same seed draws the same batches again and
another seed other batches. Pinned here where the seeds are made, and at
the end of real runs: the threads executor, the simulator and cluster
nodes in one process (on a Ray cluster: tests/executors/test_ray_cluster.py).

What a run leaves to look at. A worker's stream is one uint64 (its row of
`rngs`) that every draw moves on by splitmix64's constant, and a batch is
`b` draws (no augmentation here), so after a run the stream's first state
is its last one less b * (steps computed) constants: whatever the
interleaving, that says which stream each worker drew from, and its
replay says which samples it used. The simulator calls the steps from
Python: it is watched step by step, every batch of every worker.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
from links import in_process_link  # tests/executors/links.py

from iasgd import data as datasets
from iasgd import engine
from iasgd.config import config_where_it_applies
from iasgd.executors import cluster as C
from iasgd.executors import sim_events, threads
from iasgd.executors import simulated as sim
from iasgd.nn import models
from iasgd.protocol import workers as W

N_TRAIN, BATCH, N = 400, 4, 4  # 100 updates an epoch, 4 workers
QUOTA = N_TRAIN // BATCH
SEED = 7
MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15  # splitmix64's step: every draw adds it to the state


def splitmix64(state: int) -> tuple[int, int]:
    """(next state, value) of splitmix64 (iasgd.nn.augment.next_random,
    pinned against this in tests/protocol/test_workers.py)."""
    state = (state + GOLDEN) & MASK
    z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def replay(first: int, batches: int, count: int = N_TRAIN, b: int = BATCH) -> list[tuple]:
    """The first `batches` batches (sample indices) of the stream whose
    first state is `first`, as draw_batch draws them from `count` samples."""
    out, state = [], int(first)
    for _ in range(batches):
        batch = []
        for _ in range(b):
            state, z = splitmix64(state)
            batch.append(z % count)
        out.append(tuple(batch))
    return out


def first_state(last: int, draws: int) -> int:
    """The first state of a stream now at `last` after `draws` draws."""
    return (int(last) - draws * GOLDEN) & MASK


def first_states(team, b: int = BATCH) -> list[int]:
    """Where each worker's stream of a team (after its run) started: its
    state less b draws per step it computed."""
    computed = team.counters[:, W.COMPUTED]
    return [first_state(team.rngs[w, 0], b * int(computed[w])) for w in range(len(team.own))]


def assert_apart(firsts: list[int], count: int = N_TRAIN, b: int = BATCH,
                 batches: int = 8) -> None:
    """Streams apart: distinct first states, and no batch among the first
    `batches` of any of them drawn again by another (a stream that is
    another's shifted by a few draws shares batches with it)."""
    assert len(set(firsts)) == len(firsts), firsts
    drawn = [batch for first in firsts for batch in replay(first, batches, count, b)]
    assert len(set(drawn)) == len(drawn)


@pytest.fixture(scope="module")
def tiny():
    data = datasets.synthetic(seed=1, n_train=N_TRAIN, n_test=40, shape=(1, 4, 4), num_classes=2)
    model = models.build("mlp", input_shape=(1, 4, 4), num_classes=2, hidden=(4,))
    return model, data


# ------------------------------------------------- where the seeds are made


def test_every_worker_segment_and_seed_has_its_own_stream():
    """stream_seed for worker ids 0..63 of runs of three seeds, first
    segment and resumed: every first state its own, the first batches of
    every stream apart, and the same arguments give the same state again."""
    seeds, workers, segments = (0, 1, SEED), range(64), (0, 1)
    states = {(s, w, g): int(W.stream_seed(s, w, g))
              for s in seeds for w in workers for g in segments}
    assert len(set(states.values())) == len(states)  # worker, run seed and segment all count
    assert all(int(W.stream_seed(*key)) == state for key, state in states.items())
    for s in seeds:  # one run's workers train on different batches
        assert_apart([states[s, w, 0] for w in workers], batches=4)
    for w in (0, 5):  # another seed: other batches for the same worker
        assert_apart([states[s, w, 0] for s in seeds], batches=4)


def test_every_node_of_a_cluster_seeds_its_threads_apart():
    """node_seed of nodes 0..15 for three run seeds: all different, the same
    again for the same arguments; the streams of their threads (worker ids
    0..3 of each) all apart, and apart from a one-machine run's."""
    seeds, nodes = (0, 1, SEED), range(16)
    node_seeds = {(s, i): C.node_seed(s, i) for s in seeds for i in nodes}
    assert len(set(node_seeds.values())) == len(node_seeds)
    assert all(C.node_seed(*key) == value for key, value in node_seeds.items())
    for s in seeds:
        firsts = [int(W.stream_seed(node_seeds[s, i], w, 0)) for i in nodes for w in range(N)]
        assert_apart(firsts + [int(W.stream_seed(s, w, 0)) for w in range(N)], batches=4)


# ------------------------------------------------------------- the threads


def threaded(model, data, algo: str, seed: int = SEED, init=None) -> threads.ThreadedRun:
    kw = {"interval": 3} if algo == "interval" else {}
    cfg = engine.TrainConfig(algo=algo, threads=N, epochs=1, batch_size=BATCH, lr=0.05,
                             seed=seed, **kw)
    run = threads.ThreadedRun(model, data, cfg, init=init)
    assert run.run(engine.Hooks()).status == "completed"
    return run


@pytest.mark.parametrize("algo", ["sync", "hogwild", "interval"])
def test_each_thread_trains_on_batches_of_its_own_stream(tiny, algo):
    """After a threaded run, each worker's stream is the one stream_seed
    gives its id (b draws per step it computed, from it alone), its last
    batch that stream's, and the streams of the workers apart. sync: every
    worker computes one gradient of every round, so each drew exactly its
    25 batches."""
    model, data = tiny
    team = threaded(model, data, algo).team
    computed = team.counters[:, W.COMPUTED]
    assert computed.sum() >= QUOTA
    if algo == "sync":
        assert computed.tolist() == [QUOTA // N] * N
    firsts = first_states(team)
    assert_apart(firsts)
    assert firsts == [int(W.stream_seed(SEED, w, 0)) for w in range(N)]
    for w, own in enumerate(team.own):
        if computed[w]:  # (with hogwild a thread may find every ticket taken)
            assert tuple(own.idx[:BATCH]) == replay(firsts[w], int(computed[w]))[-1]


def test_a_threaded_runs_streams_are_its_seeds(tiny):
    """sync on threads, from the same parameters: the same seed draws the
    very batches again (and trains to the same bits), another seed other
    batches for every worker (and other parameters)."""
    model, data = tiny
    init = model.init(0)
    runs = [threaded(model, data, "sync", seed, init).team for seed in (SEED, SEED, SEED + 1)]
    first, again, other = (first_states(team) for team in runs)
    assert again == first
    assert runs[1].rngs.tobytes() == runs[0].rngs.tobytes()
    assert runs[1].params.tobytes() == runs[0].params.tobytes()
    assert_apart(first + other)
    assert runs[2].params.tobytes() != runs[0].params.tobytes()


# ----------------------------------------------------------- the simulator


def simulated_batches(model, data, monkeypatch, seed: int = SEED, cores: int = 2,
                      algo: str = "interval") -> dict[int, list[tuple]]:
    """Every batch each simulated worker trains on, in order: the indices
    its step gathers (Simulation.complete), worker by worker."""
    used: dict[int, list[tuple]] = defaultdict(list)
    complete = sim_events.Simulation.complete

    def watched(self, w: int) -> None:
        used[w].append(tuple(int(i) for i in self.own[w].idx[:BATCH]))
        complete(self, w)

    monkeypatch.setattr(sim_events.Simulation, "complete", watched)
    kw = {"interval": 3} if algo == "interval" else {}
    cfg = engine.TrainConfig(algo=algo, threads=N, epochs=1, batch_size=BATCH, lr=0.05,
                             seed=seed, **kw)
    r = sim.simulate(model, data, cfg, sim.lognormal_steps(1e-3, 0.5), cores=cores)
    monkeypatch.undo()
    assert r.status == "completed" and sum(map(len, used.values())) == r.computed >= QUOTA
    return dict(used)


def test_each_simulated_worker_trains_on_batches_of_its_own_stream(tiny, monkeypatch):
    """4 simulated workers on 2 cores: every batch a worker trains on is the
    next of the stream stream_seed gives its id, no batch is drawn by two
    workers, and a worker's batches do not depend on the others: on 4
    cores (another interleaving, other step counts) each draws the same
    sequence as far as it goes."""
    model, data = tiny
    used = simulated_batches(model, data, monkeypatch)
    assert sorted(used) == list(range(N))
    for w, batches in used.items():
        assert batches == replay(int(W.stream_seed(SEED, w, 0)), len(batches)), w
    drawn = [batch for batches in used.values() for batch in batches]
    assert len(set(drawn)) == len(drawn)
    wider = simulated_batches(model, data, monkeypatch, cores=4)
    assert {w: len(b) for w, b in wider.items()} != {w: len(b) for w, b in used.items()}
    for w, batches in wider.items():
        k = min(len(batches), len(used[w]))
        assert batches[:k] == used[w][:k], w


def test_a_simulated_runs_streams_are_its_seeds(tiny, monkeypatch):
    """The simulator is deterministic: the same seed trains every worker on
    the very same batches again; another seed on other batches, from the
    first (every worker's first batch its own in both runs)."""
    model, data = tiny
    first = simulated_batches(model, data, monkeypatch, algo="hogwild")
    assert simulated_batches(model, data, monkeypatch, algo="hogwild") == first
    other = simulated_batches(model, data, monkeypatch, seed=SEED + 1, algo="hogwild")
    firsts = [batches[0] for run in (first, other) for batches in run.values()]
    assert len(set(firsts)) == len(firsts) == 2 * N


# ------------------------------------------------- cluster nodes, no Ray


@pytest.mark.parametrize("segment", [0, 1])
def test_the_threads_of_every_cluster_node_train_on_their_own_streams(tiny, segment):
    """Two nodes of two threads in one process, an epoch's updates: each
    node's threads drew from the streams of its own seed (node_seed) and of
    the run's segment (1: resumed once, so it draws new batches), and the
    four streams are apart: no thread of one node trains on the batches of
    a thread of the other."""
    model, data = tiny
    cfg = config_where_it_applies(algo="interval", backend="ray", nodes=2, threads=2,
                                  sync_every=4, interval=3, node_interval=2, batch_size=BATCH,
                                  lr=0.05, seed=SEED)
    server = C.ParameterServer(model.init(SEED), cfg)
    nodes = [C.Node(i, model, data, cfg, segment) for i in range(2)]
    server.allow(QUOTA)
    with ThreadPoolExecutor(4) as pool:
        runs = [threading.Thread(target=n.run, args=(in_process_link(pool, server),))
                for n in nodes]
        for t in runs:
            t.start()
        deadline = time.monotonic() + 120
        while server.progress()["done"] < QUOTA and time.monotonic() < deadline:
            time.sleep(0.01)
        server.stop()
        for t in runs:
            t.join(60)
            assert not t.is_alive()
    assert server.progress()["done"] == QUOTA
    firsts = []
    for i, node in enumerate(nodes):
        mine = first_states(node.team)
        assert mine == [int(W.stream_seed(C.node_seed(SEED, i), w, segment)) for w in range(2)]
        firsts += mine
    assert_apart(firsts)
    assert sum(int(n.team.counters[:, W.COMPUTED].sum()) for n in nodes) >= QUOTA
