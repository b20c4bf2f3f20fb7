"""A rank cut off from its driver stops itself.

The driver names a host lost once its ranks' supervisors have not beaten for ``spark.dist.hostLostTimeout``, and
goes on without them: the next attempt (or an elastic run's smaller one) starts elsewhere. A host that is only off
the network does not know it: its ranks would go on, holding the host's slots and memory, and a rank 0 among them
could write a checkpoint beside the next attempt's. So each supervisor fences its own rank: when none of its beats
has reached the driver's store for twice that timeout (the driver has named the host lost
by then), it stops the rank, as the driver would stop it could it still reach it, and reports nothing: the
driver has its own account of the host.

The margin is a whole ``hostLostTimeout`` more: a driver that stalls for a moment (its machine swapping, a VM
paused) delays every supervisor's beats alike, and must not make every rank stop itself before the driver could
even tell a host from the others.
"""
import sys
import threading
import time
from typing import Callable

# Past the driver's hostLostTimeout, a margin of this many of it: the driver has named the host lost and aborted
# (it reads the beats twice a second) well before the supervisor stops its rank.
FENCE_MARGIN = 1.0


class Fence(threading.Thread):
    """Calls ``stop`` once no :meth:`reached` came for ``host_lost_timeout`` * (1 + :data:`FENCE_MARGIN`) seconds;
    ``host_lost_timeout`` 0 (local mode: the ranks are the driver's own processes) fences nothing. ``what`` names
    the rank and the store in the line the supervisor writes to its task's log when it stops the rank."""

    def __init__(self, host_lost_timeout: float, stop: Callable[[], None], what: str):
        super().__init__(daemon=True, name="spark_dist-fence")
        self.bound = host_lost_timeout * (1 + FENCE_MARGIN) if host_lost_timeout > 0 else 0.0
        self.stop, self.what = stop, what
        self.last = time.monotonic()
        self.ended = threading.Event()
        self.fenced = False

    def reached(self) -> None:
        """A beat reached the driver's store just now."""
        self.last = time.monotonic()

    def run(self) -> None:
        if not self.bound:
            return
        while not self.ended.wait(min(1.0, self.bound / 4)):
            silent = time.monotonic() - self.last
            if silent > self.bound:
                self.fenced = True
                sys.stderr.write(f"spark_dist: {self.what} could not reach the driver's store for {silent:.0f}s, "
                                 "over twice spark.dist.hostLostTimeout, after which the driver goes on without "
                                 "this host: the rank is stopped\n")
                self.stop()
                return
