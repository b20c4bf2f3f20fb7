"""The fault campaign's recovery figure (tests/chaos/invariants.py): seconds from a fault to training again, read
from rank 0's step beacons (``attempt epoch step time`` a line)."""
import os

from chaos import invariants
from chaos.faults import Fault


def _beacons(tmp_path, steps):
    with open(os.path.join(tmp_path, "steps"), "w") as f:
        f.writelines(f"{attempt} 0 {i} {t} {pid}\n" for i, (attempt, t, pid) in enumerate(steps))
    return str(tmp_path)


def test_a_retry_recovers_at_the_first_step_of_the_attempt_that_finished_the_run(tmp_path):
    fault = Fault("kill_rank", rank=1, at=0.5, fired_at=100.0)
    beacons = _beacons(tmp_path, [(0, 99.0, 7), (0, 100.1, 7), (1, 104.0, 8), (1, 104.1, 8)])
    assert invariants.recovery(beacons, fault, final_attempt=1) == 4.0


def test_an_interrupted_driver_recovers_at_the_first_step_of_its_run_again_not_at_its_own_last_steps(tmp_path):
    # The interrupted run's ranks take a step or two after the interrupt, even after the run raised (stopping them
    # takes a moment); the same run_id run again starts over at attempt 0, in new rank processes.
    fault = Fault("interrupt_driver", rank=0, at=0.5, workload="connect", fired_at=100.0)
    beacons = _beacons(tmp_path, [(0, 99.5, 7), (0, 100.02, 7), (0, 100.05, 7), (0, 101.2, 7), (0, 103.0, 9),
                                  (0, 103.1, 9)])
    assert invariants.recovery(beacons, fault, final_attempt=0, rerun_at=101.0) == 3.0
    assert invariants.recovery(beacons, fault, final_attempt=0, rerun_at=104.0) is None  # it never trained again
