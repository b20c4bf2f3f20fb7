"""What the campaign keeps of each run (tests/chaos/campaign.py, tests/chaos/driving.py)."""
import os
from dataclasses import dataclass, field
from typing import List, Optional

from chaos import faults
from chaos.faults import Fault


@dataclass
class RunRecord:
    index: int
    fault: Fault
    ending: str  # "success (attempt N)" or the error's class name
    wall: float
    bound: float
    recovery: Optional[float]  # seconds from the fault to the next training step, when there was one
    violations: List[str] = field(default_factory=list)
    rss_mib: float = 0.0  # the driver's resident memory after the run
    events: List[str] = field(default_factory=list)  # the driver's resizes and preemptions, as its history has them
    whole_after: Optional[float] = None  # on a standalone cluster: seconds after the run until it was whole again


def training_span(beacons: str) -> float:
    """Rank 0's training time in the run that left ``beacons``: from its start to its last step."""
    with open(os.path.join(beacons, "steps")) as f:
        last = max(float(line.split()[3]) for line in f if line.strip())
    return last - faults.beacon(beacons, 0)["time"]
