"""Mutation check: plant each of a list of bugs in the gate (or the worker
loop, or the atomics) and run the tests that must catch it. Every mutant
must be killed: a suite that passes with a bug planted in the gate is not
done.

    python tests/protocol/mutants.py            every mutant; exit 1 if one survives
    python tests/protocol/mutants.py NAME ...   only these
    python tests/protocol/mutants.py --list

Each mutant runs in a temporary copy of iasgd/ and tests/ with the source
edited, so the working tree is never touched; numba compiles the copy into
its own cache. tests/protocol/test_mutants.py runs this script in the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL_TESTS = ("tests/protocol/test_gate.py::test_interval_protocol_in_every_interleaving",
               "tests/protocol/test_gate.py::test_unbounded_protocols_in_every_interleaving")
# the visibility mutants: the model first, then real threads with sentinel parameters
VISIBILITY_TESTS = (*MODEL_TESTS,
                    "tests/protocol/test_workers.py::test_every_read_sees_what_the_gate_promises")
ORDERING_TESTS = (
    "tests/protocol/test_atomics.py::test_atomics_are_emitted_sequentially_consistent",
    "tests/protocol/test_atomics.py::test_stores_are_sequentially_consistent")

# the run-time monitors of the bound, each driven on a hand-built gate state
WORKER_MONITOR_TESTS = (
    "tests/protocol/test_workers.py::test_the_monitor_counts_every_apply_outside_its_interval"
    "_or_bound",)
NODE_MONITOR_TESTS = (
    "tests/executors/test_cluster.py::test_the_server_counts_every_push_outside_its_interval"
    "_or_bound",)

# a resume against the run never stopped (one thread), and the arrays restored (4 threads)
RESUME_TESTS = (
    "tests/executors/test_resume.py::test_a_one_thread_resume_is_bit_identical_to_the_run_never"
    "_stopped",
    "tests/executors/test_resume.py::test_a_threaded_resume_starts_from_every_array_the_snapshot"
    "_holds")

# each worker its own batches: the seeds of worker ids 0..n-1 and of nodes (no
# compiling), then the streams real runs' workers drew from (threads, the
# simulator, cluster nodes in one process: a first and a resumed segment)
STREAMS = "tests/executors/test_worker_streams.py::"
STREAM_TESTS = (STREAM_SEEDS, STREAM_NODE_SEEDS, STREAM_THREADS, STREAM_SIMULATED, STREAM_NODES,
                STREAM_RESUMED_NODES) = (
    STREAMS + "test_every_worker_segment_and_seed_has_its_own_stream",
    STREAMS + "test_every_node_of_a_cluster_seeds_its_threads_apart",
    STREAMS + "test_each_thread_trains_on_batches_of_its_own_stream[sync]",
    STREAMS + "test_each_simulated_worker_trains_on_batches_of_its_own_stream",
    STREAMS + "test_the_threads_of_every_cluster_node_train_on_their_own_streams[0]",
    STREAMS + "test_the_threads_of_every_cluster_node_train_on_their_own_streams[1]")

# iasgd.torch across processes: a wake must reach a sleeper in another
# process, and a y = 1 reader must see every earlier update written
TORCH_WAKE_TESTS = (
    "tests/pytorch/test_torch_stress.py::test_a_wake_reaches_a_sleeper_in_another_process",)
TORCH_STRESS_TESTS = (
    "tests/pytorch/test_torch_stress.py::test_at_y1_every_read_sees_every_earlier_update"
    "[wait-4]",)
# a PyTorch step left without its write: the words after its give-back
TORCH_LEFT = "tests/pytorch/test_torch_left_steps.py::"
TORCH_PHASE = TORCH_LEFT + "test_a_step_given_back_in_each_phase"
TORCH_LEAVE = TORCH_LEFT + "test_leaving_the_block_without_apply_gives_the_step_back"
# give_back's end: the step's LEFT count, its record cleared, the run's completion
TORCH_GIVE_BACK_END = ("        row[LEFT] += 1\n    atomic_store(row, PHASE, IDLE)\n"
                       "    if atomic_load(state, G.DONE) >= atomic_load(state, G.LIMIT):\n"
                       "        atomic_cas(control, REASON, RUNNING, COMPLETED)\n"
                       "        G.request_stop(state)\n    return phase\n")

# a PyTorch step's write (the user's fn) and the gate call that closes it
TORCH_END_WRITE = ("        S.end_write(g.state, row, g.hists[self.row], g.control, g.ring, "
                   "g.code, value)\n")
TORCH_WRITE = ("        if fn is not None:\n            self._write(fn, scale_lr)\n"
               + TORCH_END_WRITE)

# apply_step's write and the gate steps around it, which the visibility
# mutants reorder
WRITE = ("N.apply_update(shared.params, shared.velocity, own.grad, rule.sgd, v_now, factor, 0, "
         "knobs)\n")
APPLY_BLOCK = (f"    {WRITE}"
               "    if rule.algo == ASYNC:\n        G.unlock(state)\n    elif interval:\n"
               "        # read in interval gen, applied in it, within its y - 1\n"
               "        if G.crossed(state, gen) or tau > atomic_load(state, G.Y) - 1:\n"
               "            own.counters[VIOLATIONS] += 1\n"
               "        G.finish_apply(state)\n"
               "    record_update(own, shared, tau, loss)\n")

LOCKED_APPLY = ("    if rule.algo == ASYNC:\n        G.lock(state)\n"
                "    v_now = G.begin_apply(state)  # the updates applied before this one\n"
                "    tau = v_now - v_read\n"
                "    factors = shared.lr_factors\n"
                "    factor = factors[min(tau, factors.size - 1)]\n"
                + APPLY_BLOCK)

# where options apply: the written-out answers, option by option (the walk of
# tests/test_config.py takes each rule as its own oracle, so it passes a wrong one)
OPTION_RULE_TESTS = ("tests/test_option_rules.py",)


@dataclass(frozen=True)
class Mutant:
    name: str
    why: str  # the bug it plants
    path: str
    old: str
    new: str
    tests: tuple[str, ...] = MODEL_TESTS


MUTANTS = [
    Mutant("y-store-before-publish",
           "finish_apply writes the next Y while the old interval's word is still open "
           "(the original gate: no CLOSED mark), so a late slot gets in under a larger y",
           "iasgd/protocol/gate.py",
           "    atomic_store(state, GEN_TAKEN, (gen << 32) | CLOSED)\n", ""),
    Mutant("y-store-after-publish",
           "finish_apply publishes the next interval before writing its Y, so slots of "
           "the new interval are handed out under the old y",
           "iasgd/protocol/gate.py",
           "    y = atomic_load(state, Y_NEXT)\n    atomic_store(state, Y, y)\n"
           "    if y > atomic_load(state, Y_MAX):\n        atomic_store(state, Y_MAX, y)\n"
           "    atomic_add(state, INTERVALS, 1)\n"
           "    atomic_store(state, GEN_TAKEN, (gen + 1) << 32)  # opens it\n",
           "    y = atomic_load(state, Y_NEXT)\n    atomic_add(state, INTERVALS, 1)\n"
           "    atomic_store(state, GEN_TAKEN, (gen + 1) << 32)  # opens it\n"
           "    atomic_store(state, Y, y)\n"
           "    if y > atomic_load(state, Y_MAX):\n        atomic_store(state, Y_MAX, y)\n"),
    Mutant("y-read-after-count",
           "finish_apply reads Y after counting its update, when another apply may have "
           "opened the next interval with a smaller y",
           "iasgd/protocol/gate.py",
           "    y = atomic_load(state, Y)\n    if atomic_add(state, APPLIED, 1) + 1 < y:\n",
           "    if atomic_add(state, APPLIED, 1) + 1 < atomic_load(state, Y):\n"),
    Mutant("open-on-yth-accept",
           "the next interval opens when its y-th slot is taken (the original C++ rule), "
           "not after all y updates are applied",
           "iasgd/protocol/gate.py",
           "        if atomic_cas(state, GEN_TAKEN, word, word + 1) == word:\n"
           "            return word >> 32\n",
           "        if atomic_cas(state, GEN_TAKEN, word, word + 1) == word:\n"
           "            if (word & _LOW32) + 1 == atomic_load(state, Y):\n"
           "                atomic_store(state, APPLIED, 0)\n"
           "                atomic_add(state, INTERVALS, 1)\n"
           "                atomic_store(state, GEN_TAKEN, ((word >> 32) + 1) << 32)\n"
           "            return word >> 32\n"),
    Mutant("slot-before-ticket",
           "the worker takes its interval slot before its ticket",
           "iasgd/protocol/workers.py",
           "        if not G.acquire_ticket(state, wid):\n            break\n"
           "        t0 = monotonic_ns()\n        gen = G.enter_interval(state, wait)\n",
           "        t0 = monotonic_ns()\n        gen = G.enter_interval(state, wait)\n"
           "        if not G.acquire_ticket(state, wid):\n            break\n"),
    Mutant("no-recheck-before-sleep",
           "wait_for_slot sleeps without re-checking after announcing itself: an interval "
           "that opened in between never wakes it",
           "iasgd/protocol/gate.py",
           "        gen = try_slot(state)\n        if gen < 0 and not stopped(state):\n",
           "        gen = -1\n        if not stopped(state):\n"),
    Mutant("no-recheck-before-allowance-sleep",
           "wait_for_allowance sleeps without re-checking: a ticket given back in between "
           "never wakes it",
           "iasgd/protocol/gate.py",
           "    if _no_allowance(state, have):\n        _sleep(state, ALLOWANCE",
           "    if True:\n        _sleep(state, ALLOWANCE"),
    Mutant("claim-ignores-generation",
           "the drop gate's claim_slot accepts an update read in an earlier interval",
           "iasgd/protocol/gate.py",
           "        if (word >> 32) != gen or (word & _LOW32) >= atomic_load(state, Y):\n",
           "        if (word & _LOW32) >= atomic_load(state, Y):\n"),
    Mutant("write-after-finish-apply",
           "interval writes its update after finish_apply, when the next interval may "
           "already be open and its readers miss the write",
           "iasgd/protocol/workers.py", APPLY_BLOCK,
           APPLY_BLOCK.replace(f"    {WRITE}", f"    if not interval:\n        {WRITE}")
           .replace("        G.finish_apply(state)\n",
                    f"        G.finish_apply(state)\n        {WRITE}"),
           VISIBILITY_TESTS),
    Mutant("write-after-the-gate",
           "every algorithm writes its update after the gate is done with it (after "
           "async's unlock, after interval's finish_apply)",
           "iasgd/protocol/workers.py", APPLY_BLOCK,
           APPLY_BLOCK.replace(f"    {WRITE}", "").replace(
               "    record_update(", f"    {WRITE}    record_update("),
           VISIBILITY_TESTS),
    Mutant("async-apply-without-lock",
           "lock-based async applies its update without taking the lock (the lock and "
           "its unlock removed)",
           "iasgd/protocol/workers.py", LOCKED_APPLY,
           LOCKED_APPLY.replace("    if rule.algo == ASYNC:\n        G.lock(state)\n", "")
           .replace("    if rule.algo == ASYNC:\n        G.unlock(state)\n    elif interval:",
                    "    if interval:"),
           VISIBILITY_TESTS),
    Mutant("snapshot-outside-lock",
           "async copies its snapshot after releasing the lock",
           "iasgd/protocol/workers.py",
           "        copy_values(shared.params, own.local)\n"
           "        v_read = G.read_version(state)\n"
           "        G.unlock(state)\n",
           "        v_read = G.read_version(state)\n        G.unlock(state)\n"
           "        copy_values(shared.params, own.local)\n",
           VISIBILITY_TESTS),
    Mutant("write-before-commit",
           "the update is written before the gate commits it, so the drop gate's dropped "
           "updates reach the parameters too",
           "iasgd/protocol/workers.py",
           "    if not G.commit_step(state, gen, interval and rule.policy == G.DROP):\n",
           "    N.sgd_momentum_update(shared.params, shared.velocity, own.grad, rule.sgd.lr,\n"
           "                          rule.sgd, 0)\n"
           "    if not G.commit_step(state, gen, interval and rule.policy == G.DROP):\n",
           VISIBILITY_TESTS),
    Mutant("monotonic-ordering",
           "atomics use LLVM's monotonic ordering instead of seq_cst: a store and a later "
           "load may be reordered, which loses wake-ups",
           "iasgd/protocol/atomics.py",
           '_ORDER = "seq_cst"', '_ORDER = "monotonic"', ORDERING_TESTS),
    # the run-time monitors, which every other test sees report 0 violations
    Mutant("worker-monitor-never-counts",
           "an interval apply outside its interval or past y - 1 is never counted "
           "(bound_violations stays 0 whatever the staleness)",
           "iasgd/protocol/workers.py",
           "            own.counters[VIOLATIONS] += 1\n", "            pass\n",
           WORKER_MONITOR_TESTS),
    Mutant("node-monitor-never-counts",
           "the parameter server never counts a push outside its interval or past y - 1",
           "iasgd/executors/cluster.py",
           "                self.violations += 1\n", "                pass\n", NODE_MONITOR_TESTS),
    Mutant("worker-monitor-allows-tau-y",
           "the run-time check of an interval apply lets tau = y pass (off by one)",
           "iasgd/protocol/workers.py",
           "tau > atomic_load(state, G.Y) - 1:", "tau > atomic_load(state, G.Y):",
           WORKER_MONITOR_TESTS),
    Mutant("node-monitor-allows-tau-y",
           "the parameter server's check lets tau_node = y pass (off by one)",
           "iasgd/executors/cluster.py",
           "tau > int(s[G.Y]) - 1:", "tau > int(s[G.Y]):", NODE_MONITOR_TESTS),
    # the gate across processes (iasgd.torch)
    Mutant("shared-futex-is-private",
           "the shared futex flavour emits the private operations: a wake reaches no "
           "sleeper in another process (each then sleeps out its timeout)",
           "iasgd/protocol/atomics.py",
           "_futex_wait_shared = _futex_wait_intrinsic(_FUTEX_WAIT)\n"
           "_futex_wake_all_shared = _futex_wake_all_intrinsic(_FUTEX_WAKE)\n",
           "_futex_wait_shared = _futex_wait_intrinsic(_FUTEX_WAIT | _PRIVATE)\n"
           "_futex_wake_all_shared = _futex_wake_all_intrinsic(_FUTEX_WAKE | _PRIVATE)\n",
           TORCH_WAKE_TESTS),
    Mutant("gate-wakes-privately",
           "the gate wakes on a private futex even when its state is shared between "
           "processes (SHARED ignored by _wake)",
           "iasgd/protocol/gate.py",
           "    if atomic_load(state, SHARED) != 0:\n        futex_wake_all_shared(state, word)\n",
           "    if False:\n        futex_wake_all_shared(state, word)\n", TORCH_WAKE_TESTS),
    Mutant("torch-write-after-close",
           "a PyTorch step closes its interval (end_write) before the optimiser writes, so "
           "a process reading in the next interval misses the write",
           "iasgd/torch/gate.py",
           TORCH_WRITE, TORCH_WRITE.replace(TORCH_END_WRITE, "").replace(
               "        if fn", TORCH_END_WRITE + "        if fn"),
           TORCH_STRESS_TESTS),
    # iasgd.torch: a step left without its write
    Mutant("torch-left-slot-unfilled",
           "give_back of a step holding a slot returns its ticket but fills the slot with no "
           "empty update: its interval never reaches y applies and never opens",
           "iasgd/torch/steps.py",
           "        G.begin_apply(state)  # an empty update fills the slot\n"
           "        G.finish_apply(state)\n", "        pass\n",
           (TORCH_PHASE + "[wait-slot-itself-left-first]",
            TORCH_PHASE + "[drop-slot-parent-left-last]")),
    Mutant("torch-left-not-counted",
           "give_back returns what a step held but does not count it in LEFT (the report's "
           "`left` stays 0)",
           "iasgd/torch/steps.py", "        row[LEFT] += 1\n", "",
           (TORCH_LEAVE + "[drop-break]",)),
    Mutant("torch-ticket-phase-not-recorded",
           "begin does not record TICKET after taking the ticket: a drop step left before "
           "its commit, or a wait step killed asleep for a slot, keeps its ticket for good",
           "iasgd/torch/steps.py", "    atomic_store(row, PHASE, TICKET)\n", "",
           (TORCH_PHASE + "[drop-ticket-itself-left-first]",
            TORCH_LEFT + "test_a_worker_killed_asleep_for_a_slot_gets_its_ticket_back")),
    Mutant("torch-slot-phase-not-recorded",
           "begin does not record SLOT for the wait policy's slot: a step left before "
           "applying returns its ticket as if it held none, and its slot is never filled",
           "iasgd/torch/steps.py", "    if wait:\n        atomic_store(row, PHASE, SLOT)\n", "",
           (TORCH_LEAVE + "[wait-raise]",)),
    Mutant("torch-dead-write-not-finished",
           "give_back of a dead worker's write in progress settles it but never calls "
           "finish_apply: its interval, counted in V, never opens",
           "iasgd/torch/steps.py",
           "        if algo == INTERVAL:\n            G.finish_apply(state)\n"
           "        G.settle(state)\n", "        G.settle(state)\n",
           (TORCH_PHASE + "[wait-writing-parent-left-first]",)),
    Mutant("torch-write-given-back-returns-ticket",
           "give_back returns the ticket of a write in progress as well as settling it: one "
           "ticket more than max_updates allows comes back",
           "iasgd/torch/steps.py",
           "    if phase < WRITING:  # TICKET or SLOT\n", "    if phase <= WRITING:\n",
           (TORCH_PHASE + "[drop-writing-parent-left-last]",)),
    Mutant("torch-give-back-keeps-phase",
           "give_back does not clear the row's record: the parent's give_back after a worker "
           "that raised (and gave its step back) exits gives the same step back again",
           "iasgd/torch/steps.py", TORCH_GIVE_BACK_END,
           TORCH_GIVE_BACK_END.replace("    atomic_store(row, PHASE, IDLE)\n", ""),
           (TORCH_PHASE + "[wait-slot-itself-left-last]",)),
    Mutant("torch-give-back-never-completes",
           "give_back never stops the run when the step it settles is the last of "
           "max_updates: the others wait for a ticket none is left of",
           "iasgd/torch/steps.py", TORCH_GIVE_BACK_END,
           TORCH_GIVE_BACK_END.replace(
               "    if atomic_load(state, G.DONE) >= atomic_load(state, G.LIMIT):\n"
               "        atomic_cas(control, REASON, RUNNING, COMPLETED)\n"
               "        G.request_stop(state)\n", ""),
           (TORCH_LEFT + "test_a_write_given_back_completes_the_run[wait]",)),
    Mutant("torch-exit-gives-back-only-on-raise",
           "Step.__exit__ gives back only when the block raised: a `break` or `return` "
           "without step.apply keeps the ticket and the slot",
           "iasgd/torch/gate.py",
           "        if self.applied is None or kind is not None:\n",
           "        if kind is not None:\n",
           (TORCH_LEAVE + "[wait-break]", TORCH_LEAVE + "[drop-return]")),
    Mutant("torch-read-raise-keeps-the-step",
           "a step whose read raises keeps its ticket and slot (a raising __enter__ gets no "
           "__exit__): the fault this file's tests found",
           "iasgd/torch/gate.py",
           "        except BaseException:\n"
           "            # raised in the read: the `with` never calls __exit__ for a raising\n"
           "            # __enter__, so the step gives back what it holds here (and async's lock)\n"
           "            S.give_back(g.state, g.rows[self.row], g.control, g.code)\n"
           "            raise\n", "",
           (TORCH_LEAVE + "[wait-raise-in-read]",
            TORCH_LEFT + "test_a_read_that_raises_releases_async_lock_and_ticket")),
    # each worker its own batches
    Mutant("thread-streams-never-seeded",
           "a threaded run's team never seeds its workers' streams: every worker starts at "
           "state 0 and trains on the same batch sequence",
           "iasgd/executors/threads.py",
           "        self.seed_streams(self.cfg.seed, segment)\n", "", (STREAM_THREADS,)),
    Mutant("workers-seeded-alike",
           "every worker's stream is seeded as worker 0's: all train on the same batches",
           "iasgd/executors/arrays.py",
           "W.stream_seed(seed, wid, segment)", "W.stream_seed(seed, 0, segment)",
           (STREAM_THREADS,)),
    Mutant("simulated-workers-share-a-stream",
           "the simulator's workers, which share one workspace, share one random stream too: "
           "a worker's batches depend on when the others draw theirs",
           "iasgd/executors/arrays.py",
           "self.rngs[w])", "self.rngs[0 if one is not None else w])", (STREAM_SIMULATED,)),
    Mutant("stream-seed-ignores-run-seed",
           "a worker's stream does not depend on the run's seed: every seed draws the same "
           "batches",
           "iasgd/protocol/workers.py",
           "SeedSequence([seed, 2, wid, segment])", "SeedSequence([2, wid, segment])",
           (STREAM_SEEDS,)),
    Mutant("node-seed-ignores-run-seed",
           "a cluster node's seed does not depend on the run's seed",
           "iasgd/executors/cluster.py",
           "SeedSequence([seed, 3, node])", "SeedSequence([3, node])", (STREAM_NODE_SEEDS,)),
    Mutant("nodes-seeded-alike",
           "every cluster node seeds its threads with the run's seed: thread w of one node "
           "trains on thread w's batches of every other",
           "iasgd/executors/cluster.py",
           "seed=node_seed(cfg.seed, node))", "seed=cfg.seed)", (STREAM_NODES,)),
    Mutant("resumed-nodes-redraw-their-batches",
           "a node of a resumed cluster run seeds its threads as the first segment did: the "
           "resumed run trains on the very batches the run drew from its start",
           "iasgd/executors/cluster.py",
           "team.start(self.segment)", "team.start(0)", (STREAM_RESUMED_NODES,)),
    # what a resume restores
    Mutant("resume-drops-momentum",
           "a threaded run's resume starts the momentum (velocity) again from zero instead "
           "of restoring it",
           "iasgd/executors/threads.py",
           "            getattr(team, name)[...] = snap.arrays[name]\n",
           "            getattr(team, name)[...] = snap.arrays[name]\n"
           "        team.velocity[:] = 0.0\n", RESUME_TESTS),
    # where options apply
    Mutant("crop-padding-applies-to-flip",
           "--crop-padding is taken with any augmentation, --augment flip included, where "
           "nothing is cropped",
           "iasgd/config.py",
           "              lambda c: AUGMENTS.get(c.augment, (False, False))[0])\n",
           "              lambda c: c.augment != \"none\")\n", OPTION_RULE_TESTS),
    Mutant("nesterov-without-momentum",
           "--nesterov is taken with --momentum 0, where there is no momentum to look ahead "
           "with",
           "iasgd/config.py",
           "lambda c: c.momentum > 0)", "lambda c: c.momentum >= 0)", OPTION_RULE_TESTS),
    Mutant("interval-knobs-for-every-stale-algo",
           "--interval, --gate and --interval-schedule are taken for hogwild and async, which "
           "have no intervals",
           "iasgd/config.py",
           "lambda c: ALGORITHMS[c.algo].bound == \"interval\")\nMOVING_Y",
           "lambda c: ALGORITHMS[c.algo].stale)\nMOVING_Y", OPTION_RULE_TESTS),
    Mutant("y-min-for-per-worker",
           "--y-min is taken with --interval-schedule per-worker, which has no floor",
           "iasgd/config.py",
           "_schedule_is(\"decay\", \"probe\", \"follow-loss\", \"budget\")",
           "_schedule_is(\"decay\", \"probe\", \"follow-loss\", \"budget\", \"per-worker\")",
           OPTION_RULE_TESTS),
    Mutant("probe-steps-for-follow-loss",
           "--probe-steps and --exec-steps are taken with follow-loss (the loss readers' rule), "
           "which probes nothing",
           "iasgd/config.py",
           "lambda c: c.interval_schedule == \"probe\" or c.threads_schedule == \"window\")",
           "lambda c: c.interval_schedule in (\"probe\", \"follow-loss\")\n"
           "                 or c.threads_schedule == \"window\")", OPTION_RULE_TESTS),
    Mutant("threads-schedule-for-sync",
           "--threads-schedule is taken for sync (every parallel algorithm), whose rounds "
           "take every thread",
           "iasgd/config.py",
           "choices=S.THREAD_SCHEDULES, applies=STALE)",
           "choices=S.THREAD_SCHEDULES, applies=PARALLEL)", OPTION_RULE_TESTS),
    Mutant("lr-decay-on-ray",
           "--lr-decay and --lr-warmup are taken on every backend, where a Ray node counts "
           "only its own updates",
           "iasgd/config.py",
           "lambda c: c.backend == \"threads\")", "lambda c: c.backend in BACKENDS)",
           OPTION_RULE_TESTS),
    Mutant("node-gate-without-ray",
           "--node-interval and --node-gate are taken for any interval run, without "
           "--backend ray and its nodes",
           "iasgd/config.py",
           "lambda c: c.backend == \"ray\" and ALGORITHMS[c.algo].bound == \"interval\")",
           "lambda c: ALGORITHMS[c.algo].bound == \"interval\")", OPTION_RULE_TESTS),
    Mutant("test-fraction-for-archives",
           "--test-fraction and --layout are taken for every dataset but synthetic, the "
           "archives (which have their own test split and layout) included",
           "iasgd/run.py",
           "lambda run: run.dataset not in datasets.DATASETS)",
           "lambda run: run.dataset != \"synthetic\")", OPTION_RULE_TESTS),
    Mutant("resume-drops-crop-padding",
           "a resume takes --crop-padding from its own command line, as --quiet, not from the "
           "saved run: a resumed crop run trains with the default padding",
           "iasgd/resume.py",
           "\"archive\", \"resume\"}\n"
           "# Options of this command only, never the saved run's: a flag cannot be unset.\n"
           "NOT_INHERITED = {\"quiet\"}\n",
           "\"archive\", \"resume\", \"crop_padding\"}\n"
           "NOT_INHERITED = {\"quiet\", \"crop_padding\"}\n", OPTION_RULE_TESTS),
    Mutant("resume-resets-every-ruled-option",
           "a resume resets every option that has a rule to its default, not only those that "
           "did nothing to the saved run",
           "iasgd/resume.py",
           "if O.applies(f) is not None and not O.applies(f).test(run)}}",
           "if O.applies(f) is not None}}", OPTION_RULE_TESTS),
]


def plant(mutant: Mutant, into: Path) -> None:
    """Copy the package and tests into `into`, with the mutant's edit made."""
    for folder in ("iasgd", "tests"):
        shutil.copytree(ROOT / folder, into / folder,
                        ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    target = into / mutant.path
    source = target.read_text()
    if source.count(mutant.old) != 1:
        raise SystemExit(f"mutant {mutant.name}: its text is not found once in {mutant.path}; "
                         "update tests/protocol/mutants.py to the current source")
    target.write_text(source.replace(mutant.old, mutant.new))


def run(mutant: Mutant, examples: int) -> tuple[bool, str, float]:
    """(killed, by which test or why not, seconds)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"iasgd-mutant-{mutant.name}-") as tmp:
        plant(mutant, Path(tmp))
        env = {**os.environ, "PYTHONPATH": tmp, "IASGD_MODEL_EXAMPLES": str(examples)}
        env.pop("NUMBA_CACHE_DIR", None)  # the copy compiles into its own cache
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
               "--hypothesis-seed=0", "-o", "addopts=", *mutant.tests]
        out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                             timeout=600)
    seconds = time.perf_counter() - t0
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in out.stdout.splitlines()
              if line.startswith("FAILED ")]
    if out.returncode == 1 and failed:
        return True, failed[0], seconds
    if out.returncode == 0:
        return False, "every test passed", seconds
    return False, f"pytest exited {out.returncode}: {out.stdout[-400:]} {out.stderr[-400:]}", \
        seconds


def main(argv: list[str]) -> int:
    if "--list" in argv:
        for m in MUTANTS:
            print(f"{m.name}: {m.why}")
        return 0
    chosen = [m for m in MUTANTS if not argv or m.name in argv]
    unknown = set(argv) - {m.name for m in MUTANTS}
    if unknown:
        print(f"unknown mutant(s) {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        return 2
    examples = int(os.environ.get("IASGD_MUTANT_EXAMPLES", "1000"))
    # Each mutant mostly compiles its copy cold, on one core: one at a time
    # per core (IASGD_MUTANT_JOBS to choose), reported in the list's order.
    jobs = int(os.environ.get("IASGD_MUTANT_JOBS", str(min(2, os.cpu_count() or 1))))
    survivors = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outcomes = pool.map(lambda m: run(m, examples), chosen)
        for m, (killed, by, seconds) in zip(chosen, outcomes, strict=True):
            print(f"{'killed  ' if killed else 'SURVIVED'} {m.name:34s} {seconds:5.1f} s  {by}",
                  flush=True)
            if not killed:
                survivors.append(m.name)
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutants killed")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
