"""Horovod 0.28.1's own tests (test/) are collected only in the ranks rank_main.py runs them in (it sets
SPARK_DIST_HOROVOD_OWN_SUITE): the project's suite, which collects everything under tests/, must not import
horovod or run them in one process (tests/unit/test_horovod_own_suite.py runs them in ranks)."""
import os

collect_ignore_glob = [] if os.environ.get("SPARK_DIST_HOROVOD_OWN_SUITE") else ["*"]
