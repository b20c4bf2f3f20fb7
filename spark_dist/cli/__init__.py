"""The command line: ``spark-dist`` (:mod:`~spark_dist.cli.commands`), the file ``spark-submit`` runs
(:mod:`~spark_dist.cli.submit_entry`) and the demo (``python -m spark_dist.cli.demo``, ``make demo``).
The top layer: it may import anything in spark_dist, and nothing imports it.
"""
from .commands import main

__all__ = ["main"]
