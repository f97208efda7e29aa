"""What every test runs under: verdicts that do not depend on the machine.

- Hypothesis draws the same examples on every run (derandomize) and never
  fails a slow example (no deadline): a busy machine makes examples slow, not
  wrong. `--hypothesis-profile explore` draws fresh examples, for a developer
  hunting bugs; the suite's verdict is a fixed set.
- Every test has a time bound (pytest-timeout) so that a bug which hangs the
  gate fails its test with a stack dump instead of running into CI's limit;
  the tests that wait on the gate get the tighter bound. When a test times
  out or fails, every gate state it made is aborted, so that workers asleep
  on it leave and the next test starts on a quiet machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "fixed", derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("fixed")

TESTS = Path(__file__).resolve().parent
# folders whose tests run real workers on a gate: a hang there is a bug, and
# it should fail in minutes even on a busy machine compiling cold
GATE_FOLDERS = ("protocol", "executors", "pytorch")
GATE_BOUND_S = 300
OTHER_BOUND_S = 900


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A time bound for every test that has none of its own."""
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        folder = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        bound = GATE_BOUND_S if folder in GATE_FOLDERS else OTHER_BOUND_S
        item.add_marker(pytest.mark.timeout(bound))


@pytest.fixture(autouse=True)
def abort_gates_left_behind(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """Record every gate state made during the test (iasgd.protocol.gate.new_state);
    if the test failed or timed out, abort them all, so that no worker of a
    hung gate outlives it."""
    from iasgd.protocol import gate as G

    made: list = []
    original = G.new_state

    def recording(*args, **kwargs):
        state = original(*args, **kwargs)
        made.append(state)
        return state

    monkeypatch.setattr(G, "new_state", recording)
    yield made
    report = getattr(request.node, "rep_call", None)
    if report is None or report.failed:
        for state in made:
            G.abort(state)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Keep the call's report on the item, for abort_gates_left_behind."""
    report = yield
    if report.when == "call":
        item.rep_call = report
    return report
