"""The campaign's ``tune`` workload: an Optuna study of :data:`TRIALS` trials of 2 ranks, run by
``spark_dist.tune.optimize`` on lanes (docs/tune.md: one long-lived barrier job serves one trial after another),
each trial the DDP workload (tests/chaos/workload.py) with the learning rate the trial suggests, rank 0 reporting
:func:`~chaos.workload.weight_score` at each epoch's end to a ``MedianPruner``. The sampler is seeded and every
trial's training is decided bit for bit, so a fault-free study gives each trial the same parameters, the same
state (pruned or complete) and the same value every time.

A fault targets one trial's rank (``Fault.trial``): each trial's ranks leave their beacons and steps in a
directory of their own, ``t<trial number>`` (:func:`trial_beacons`). What the docs promise under such a fault
(docs/tune.md, "Lanes", "Failures"): the trial's run is retried (``max_retries``) from its checkpoint on a new
lane, so the study ends as the fault-free one did; the lanes end with it.
"""
import os

from chaos import workload

TRIALS = 4
METRIC = "score"


def trial_beacons(root: str, trial: int) -> str:
    """The beacons directory of trial number ``trial`` of a study whose beacons are under ``root``."""
    return os.path.join(root, f"t{trial}")


def train(beacons, lr, epochs, step_s):
    """A trial's function on every rank: the DDP workload at ``lr``; its value (rank 0's) the final weights'
    score."""
    from spark_dist import get_context

    out = workload.train(beacons, epochs, step_s, lr=lr, report=METRIC)
    # workload.weight_score of the final model: its parameters are all of its state
    return float(sum(t.abs().sum() for t in out["weights"].values())) if get_context().rank == 0 else None


def study():
    """A new in-memory study: a seeded sampler, a pruner that judges from the second trial and the second epoch
    on (so that a pruned trial trains into its second epoch, where faults still land)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The score grows as a trial trains: maximized, a trial's best so far is its latest (what the pruner judges).
    return optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0),
                               pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=1))


def objective_for(root: str, epochs: int, step_s: float):
    """The study's objective: suggests the learning rate and hands over the trial's training, its beacons under
    ``root``."""
    def objective(trial):
        lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
        beacons = trial_beacons(root, trial.number)
        os.makedirs(beacons, exist_ok=True)
        return train, (beacons, lr, epochs, step_s)
    return objective


def outcome(study) -> list:
    """What a study decided, trial by trial: ``(number, state, lr, value, intermediate values)``."""
    return [(t.number, t.state.name, t.params.get("lr"), t.value, dict(t.intermediate_values))
            for t in study.trials]


def same_study(got: list, expected: list) -> list:
    """How ``got`` (an :func:`outcome`) differs from the fault-free study's: each trial's parameters and state,
    a complete trial's value and every intermediate value both reported, bit for bit (a pruned trial may report
    once more or less as its ranks are stopped)."""
    found = []
    if len(got) != len(expected):
        return [f"the study has {len(got)} trials, the fault-free one {len(expected)}"]
    for (n, state, lr, value, steps), (_, state0, lr0, value0, steps0) in zip(got, expected):
        if (state, lr) != (state0, lr0):
            found.append(f"trial {n} ended {state} with lr={lr}, the fault-free study's {state0} with lr={lr0}")
        elif state == "COMPLETE" and value != value0:
            found.append(f"trial {n}'s value is {value!r}, the fault-free study's {value0!r}")
        differing = sorted(s for s in set(steps) & set(steps0) if steps[s] != steps0[s])
        if differing:
            found.append(f"trial {n} reported other values at epochs {differing} than in the fault-free study")
    return found
