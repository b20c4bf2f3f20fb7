"""The contract between the driver and the tasks: the sealed store, its keys and records, the one
append-only log on it, and rank assignment. No Spark and no torch at import, so a rank, a task and a
driver all read it the same way; imports nothing of spark_dist but ``errors``.
"""
