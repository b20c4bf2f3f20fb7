"""The controller: what runs where ``Distributor.run`` is called.

It validates a run before any Spark job, writes its datasets once, then drives attempts: each hosts the run's
store (or finds it in the first task), submits one barrier job, watches it through the
:class:`~spark_dist.driver.coordinator.Coordinator` and returns an :class:`~spark_dist.driver.outcome.Outcome`;
the failure policy (:func:`~spark_dist.driver.outcome.worth_retrying`, a pure function) decides whether
another attempt follows. Imports ``task``, ``data``, ``backends``, ``wire``, ``spark``, ``host``; never ``ml``
or ``cli``.
"""
