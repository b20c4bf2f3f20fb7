"""Hyperparameter search where each trial is a distributed run: :func:`optimize` runs an Optuna study's trials
as spark_dist runs of ``num_processes`` ranks, as many at once as the cluster's slots allow.

Contract: the study, its sampler, pruner, storage and trial states are Optuna's own (``study.optimize`` runs the
trials from its threads); a trial's value is what rank 0 returned; rank 0's reports of ``metric`` reach
``trial.report`` and the pruner, and a pruned trial's ranks are stopped; a failed run is a ``FAIL`` trial carrying
the rank's error while the study goes on; with MLflow in use, one parent run per study and a child per trial.
Optuna is imported only here (``pip install optuna``).
"""
from .optimize import optimize

__all__ = ["optimize"]
