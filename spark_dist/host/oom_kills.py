"""How many processes the kernel's OOM killer has ended in this process's memory cgroup: what tells a rank killed
by SIGKILL for memory from one killed by anything else, since nothing catches SIGKILL and the rank says nothing.

The kernel counts each OOM kill in the victim's memory cgroup (cgroup v2: ``oom_kill`` in ``memory.events``,
which includes the cgroup's descendants; v1: ``oom_kill`` in ``memory.oom_control``, kernel 4.13 on), whether the
cgroup's own limit or the whole machine ran out. A rank forked by its supervisor shares the supervisor's cgroup,
so a count that rose while the rank ran means the OOM killer ended a process there, in practice the rank.
"""
import os
import re
from typing import Iterator, Optional

_COUNT = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)


def count(proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> Optional[int]:
    """The OOM kills counted in this process's memory cgroup, or ``None`` where no such count can be read (not
    Linux, no cgroup memory controller mounted, an older kernel)."""
    for path in _counters(proc, cgroup_root):
        try:
            with open(path) as f:
                found = _COUNT.search(f.read())
        except OSError:
            continue
        if found:
            return int(found.group(1))
    return None


def _counters(proc: str, root: str) -> Iterator[str]:
    """The files that may hold the count, most specific first: the cgroup ``/proc/self/cgroup`` names (v2's
    unified one, v1's memory one), then the mount's top, which is the process's own cgroup where a cgroup
    namespace hides the path (a container)."""
    try:
        with open(os.path.join(proc, "self", "cgroup")) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0" and controllers == "":
            yield os.path.join(root, path.lstrip("/"), "memory.events")
        elif "memory" in controllers.split(","):
            yield os.path.join(root, "memory", path.lstrip("/"), "memory.oom_control")
    yield os.path.join(root, "memory.events")
    yield os.path.join(root, "memory", "memory.oom_control")
