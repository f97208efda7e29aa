"""What a node and the parameter server of iasgd.executors.cluster say to
each other (a Push, its Reply, over a Link), and what a cluster does when
the server is lost.

A lost server. Every reply tells the node how many updates its parameters
hold (`done`, and per node `contained`). When the server is lost, each node
stops at its next exchange and says where it stands (a Standing: the version
of its last pull, its tickets not yet pushed, its push in flight); the
driver starts a new server from the freshest parameters (`freshest`) and
`take_over` continues the run there. A node treats its push in flight as
applied (it may be: then the freshest parameters hold it), so nothing is
applied twice and at most that one push per node is lost (`lost_updates`);
its tickets come back to the epoch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Push:
    """What a node sends: its update since its base and what the server
    accounts. delta None: nothing to apply (the first pull)."""

    node: int
    delta: np.ndarray | None  # (P,) float32: params - base
    count: int  # updates of the node's threads in delta
    v_base: int  # server version of the base
    gen: int  # cluster interval of the base (wait) or -1
    computed: int = 0  # gradients the node computed since its last push
    loss_sum: float = 0.0  # sum of their losses
    hist: list[int] = field(default_factory=list)  # their staleness inside the node
    carried: int = 0  # of count: applied while the last exchange was in flight
    diverged: bool = False  # the node's threads met a non-finite loss or parameter


@dataclass
class Reply:
    params: np.ndarray  # (P,) float32: the server's parameters after the push
    version: int  # pushes applied at the server so far
    gen: int  # the interval the node's next push belongs to (wait policy) or -1
    granted: int  # tickets leased: updates the node may apply before its next push
    stop: bool  # the run is over: the node stops its threads
    applied: bool = True  # False: the drop policy dropped the push
    waited_s: float = 0.0  # the server waited this long for tickets, a slot or a round
    done: int = 0  # updates `params` hold (of this run, resumes included)
    contained: list[int] = field(default_factory=list)  # [n]: of those, node n's since the start


class ServerLostError(RuntimeError):
    """A node's link found the parameter server gone."""


@dataclass
class Standing:
    """Where a node stands when the server is lost (or, with node -1, the
    driver's copy of the server): what a new server continues from."""

    node: int
    version: int  # server version of its last pull; -1: it never pulled
    done: int  # updates the parameters of that pull hold
    contained: list[int]  # [n]: of those, node n's (Reply.contained)
    held: int = 0  # tickets leased to it and not yet pushed
    in_flight: int = 0  # updates of its push whose reply never came


def freshest(standings: list[Standing]) -> Standing:
    """The standing with the most recent parameters (the highest version;
    on a tie the first, so put the driver's copy, which needs no fetch,
    first)."""
    return max(standings, key=lambda s: s.version)


def lost_updates(standings: list[Standing], base: Standing) -> int:
    """Updates the nodes pushed into a lost server that `base`'s parameters
    do not hold: of each node's push in flight, what `base` does not
    contain beyond the node's own last pull (0 or all of it)."""
    # a node that never pulled has no push in flight (its first exchange is a pull)
    return sum(max(s.in_flight - (base.contained[s.node] - s.contained[s.node]), 0)
               for s in standings if s.in_flight)


Link = Callable[[Push, int], Callable[[float], Reply | None]]
"""How a node reaches the server: link(push, want) sends an exchange and
returns `poll`; poll(timeout_s) gives the Reply, or None while it is not
there yet, or raises ServerLostError."""

Rejoin = Callable[[Standing], bool]
"""How a node waits for a new server: rejoin(standing) tells the driver
where the node stands and returns once the link reaches a new server
(True) or the run is over (False)."""
