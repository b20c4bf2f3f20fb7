"""spark_dist.tune without a run: what an objective may return, what a trial's value is, and the arguments
refused before any Spark job (or session) is touched."""
import numpy as np
import pytest

from spark_dist.errors import ConfigError
from spark_dist.tune.objective import step_of, training_of, values_of

optuna = pytest.importorskip("optuna")


def train(a, b=0):
    return a + b


def test_an_objective_returns_a_function_a_script_or_a_tuple_with_its_arguments(tmp_path):
    assert training_of(train, 0) == (train, (), {})
    assert training_of("train.py", 0) == ("train.py", (), {})
    assert training_of((train, [1]), 0) == (train, (1,), {})
    assert training_of((train, (1,), {"b": 2}), 0) == (train, (1,), {"b": 2})
    for bad in (3, (train,), (train, 1), (train, (), []), None):
        with pytest.raises(ConfigError, match="objective.*trial 7.*train_object, args"):
            training_of(bad, 7)


def test_a_trials_value_is_rank_0s_return_value_or_the_last_reported_metric():
    assert values_of(0.5, None, None, 1, 0) == 0.5
    assert values_of(np.float32(0.25), None, None, 1, 0) == 0.25
    assert values_of(np.array(0.75), None, None, 1, 0) == 0.75
    assert values_of([1, 2], None, None, 2, 0) == [1.0, 2.0]
    assert values_of(None, 0.125, "loss", 1, 0) == 0.125  # a script returns None
    with pytest.raises(ValueError, match=r"trial 3: rank 0 returned None.*a number.*metric="):
        values_of(None, None, None, 1, 3)
    with pytest.raises(ValueError, match="a sequence of 2 numbers"):
        values_of(1.0, None, None, 2, 3)
    with pytest.raises(ValueError, match="'x'"):
        values_of("x", None, "loss", 1, 3)


def test_a_reports_step_is_its_own_else_the_next():
    assert step_of({"epoch": 4}, ("step", "global_step", "epoch"), [1]) == 4
    assert step_of({"step": 2.0, "epoch": 9}, ("step", "epoch"), []) == 2
    assert step_of({"loss": 1.0}, ("step", "epoch"), [0, 5]) == 6
    assert step_of({"loss": 1.0, "epoch": True}, ("epoch",), []) == 0


@pytest.mark.parametrize("kwargs, names", [
    (dict(study="s"), "study must be an optuna.Study"),
    (dict(objective=3), "objective must be a function"),
    (dict(n_trials=0), "n_trials must be a positive integer"),
    (dict(max_concurrent=1.5), "max_concurrent must be a positive integer"),
    (dict(timeout=-1), "timeout must be a positive number"),
    (dict(run_timeout="1"), "run_timeout must be a positive number"),
    (dict(metric=""), "metric must be the name"),
    (dict(datasets=[1]), "datasets must be a dict"),
    (dict(catch=("x",)), "catch must be a sequence of exception types"),
    (dict(callbacks=[1]), "callbacks must be functions"),
    (dict(num_processes=0), "num_processes has to be a positive integer"),
    (dict(backend="mpi"), "backend"),
])
def test_bad_arguments_are_refused_naming_them_before_anything_runs(kwargs, names):
    from spark_dist.tune import optimize

    study = optuna.create_study()
    args = dict(study=study, objective=lambda trial: train, n_trials=1, local_mode=True)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=names):
        optimize(args.pop("study"), args.pop("objective"), args.pop("n_trials"), **args)
    assert study.trials == []  # nothing ran


def test_pruning_needs_a_single_objective_study():
    from spark_dist.tune import optimize

    study = optuna.create_study(directions=["minimize", "maximize"])
    with pytest.raises(ConfigError, match="metric=.*single-objective"):
        optimize(study, lambda trial: train, 1, metric="loss", local_mode=True)
    assert study.trials == []
