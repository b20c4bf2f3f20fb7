"""The worker group: what runs in a barrier task (or, in local mode, beside the driver).

A task reads its slots from the barrier context, joins the run's store, waits for its rank assignment, starts
one rank process per slot (forked from a warm process, or spawned), supervises them (heartbeats, the abort
key, their exit) and relays what they print and report; a rank process runs the user's function with a
:class:`~spark_dist.task.context.TrainContext`. Imports ``data``, ``backends``, ``wire``, ``spark``, ``host``;
never ``driver``.
"""
