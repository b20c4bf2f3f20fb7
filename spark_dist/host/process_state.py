"""What the kernel says of a process on this host (Linux ``/proc``), for the supervisor's reports."""


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state T or t in ``/proc/<pid>/stat``: SIGSTOP, a tracer such as a debugger);
    False where ``/proc`` cannot say (no such process, no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False
