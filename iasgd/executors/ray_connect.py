"""Reaching Ray for iasgd.executors.ray_cluster: Ray imported (an optional
extra), connected to a cluster or a new local one, its log messages kept
out of iasgd's output, and the errors that say why a cluster cannot run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import sys
import tempfile

from iasgd.config import TrainConfig
from iasgd.results import RunResult

# Ray starts its workers at nice 15, so that its own processes stay responsive.
# Here the workers are the nodes that train: at nice 15 any other busy process
# on the machine starves them (measured beside two CPU burners: a two-node test
# run took about 150 s instead of 5-12 s). A local Ray starts them at nice 0; a
# cluster joined keeps its own setting (RAY_worker_niceness, docs/cluster.md).
LOCAL_RAY_CONFIG = {"worker_niceness": 0}
CONNECT_S = 5.0  # how long --address may take to answer


class ClusterError(RuntimeError):
    """The cluster cannot go on (one line: what and what to do). `result`:
    the results so far, where the run got that far."""

    exit_code = 1  # the command line's exit code: a failure

    def __init__(self, message: str, result: RunResult | None = None):
        super().__init__(message)
        self.result = result


class UnreachableClusterError(ClusterError):
    """Ray is missing, or the cluster cannot be started or reached."""

    exit_code = 2  # bad input: nothing was computed


def import_ray():
    try:
        import ray
    except ImportError:
        raise UnreachableClusterError("--backend ray needs Ray: pip install -e '.[ray]'") from None
    return ray


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _OneLine(logging.Handler):
    """Prints a log record on stderr (whatever sys.stderr is then) as one
    plain line: its first line, colour codes removed."""

    def emit(self, record: logging.LogRecord) -> None:
        text = _ANSI.sub("", record.getMessage()).strip()
        line = text.splitlines()[0] if text else record.levelname
        print(f"iasgd: ray: {line}", file=sys.stderr, flush=True)


def quiet_ray_logging() -> None:
    """Keep Ray's own log messages out of iasgd's output: its warnings (the
    token notice, multi-line advice with colour codes) are dropped, its
    errors shown as one plain line. Ray's logs on disk are untouched."""
    logger = logging.getLogger("ray")
    if any(isinstance(h, _OneLine) for h in logger.handlers):
        return
    logger.addHandler(_OneLine(logging.ERROR))
    logger.propagate = False  # nor Python's last-resort handler, which prints warnings


@contextlib.contextmanager
def _ray_notices_aside():
    """What Ray's native code prints on stderr while it starts (its token
    notice) goes to a file instead, and only a line that reports an error
    reaches iasgd's output, as one plain line."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as aside:
        os.dup2(aside.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            aside.seek(0)
            errors = [line for line in aside.read().splitlines() if "error" in line.lower()]
            if errors:
                print(f"iasgd: ray: {_ANSI.sub('', errors[0]).strip()}", file=sys.stderr)


def connect(address: str | None, cfg: TrainConfig):
    """Ray, connected: to the cluster at `address` ("auto": the one this
    machine belongs to), or to a new local one with room for every node's
    threads and no dashboard. Ray (>= 2.59) authenticates a local cluster
    with a token of its own; a cluster joined uses the token its nodes were
    started with (docs/cluster.md)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    quiet_ray_logging()
    if address not in (None, "auto"):
        check_reachable(address)
    try:
        with _ray_notices_aside():
            if address is None:
                ray.init(address="local",  # a new one, even where another is running
                         num_cpus=max(os.cpu_count() or 1, cfg.nodes * cfg.threads),
                         include_dashboard=False, configure_logging=False,
                         log_to_driver=False, _system_config=LOCAL_RAY_CONFIG)
            else:
                ray.init(address=address, configure_logging=False, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = "a local Ray" if address is None else f"the Ray cluster at {address}"
        raise UnreachableClusterError(f"cannot start or reach {where} ({first}); check that "
                           "`ray status` works there") from None
    return ray


def check_reachable(address: str) -> None:
    """UnreachableClusterError at once if nothing answers at HOST[:PORT]
    (Ray itself would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        host, port = address.removeprefix("ray://"), "6379"
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_S).close()
    except OSError as e:
        raise UnreachableClusterError(
            f"cannot reach the Ray cluster at {address} ({e.strerror or e}); start it with "
            "`ray start --head` there, or check --address") from None
