"""``python -m spark_dist``: the same as the ``spark-dist`` command (see :mod:`spark_dist.cli.commands`)."""
import sys

from spark_dist.cli.commands import main

if __name__ == "__main__":
    sys.exit(main())
