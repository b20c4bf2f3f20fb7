"""The only code that touches PySpark internals: what kind a session is (classic, Connect, local), its conf,
slots and executors, py4j handles into the driver JVM (:mod:`~spark_dist.spark.jvm`), GPU resources, job
cancellation and the Python daemon. Imports ``wire``, ``host`` and ``errors`` only.
"""
