from glob import glob

from setuptools import find_packages, setup

setup(
    name="spark_dist",
    version="0.1.0",
    description="Distributed PyTorch training on Apache Spark (DDP or Horovod, Petastorm loaders)",
    packages=find_packages(include=["spark_dist", "spark_dist.*"]),
    # PySpark's daemon importing the installed PySpark (spark.python.daemon.module): outside the package, so
    # that the daemon does not import spark_dist (spark_dist_daemon.py says why).
    py_modules=["spark_dist_daemon"],
    python_requires=">=3.9",
    # Lower bounds only: a pip install must never move the user's pyspark, numpy, pyarrow or pandas (both
    # Spark lines are supported). The tested pins of each line are in requirements/*.lock.
    install_requires=[
        "pyspark>=3.5",
        "pyarrow>=11",
        "numpy>=1.22",
        "pandas>=1.5",
        "petastorm==0.12.1",
        "torch>=2.1",
        "cloudpickle>=2.0",
        "psutil>=5.9",
        # AES-GCM for the run's store values (spark_dist/wire/sealing.py): a well-kept AEAD, not our own.
        "cryptography>=3.1",
    ],
    extras_require={
        "horovod": ["horovod==0.28.1"],
        "dev": ["pytest>=7", "pytest-timeout>=2", "scikit-learn>=1.3"],
    },
    entry_points={"console_scripts": ["spark-dist=spark_dist.cli.commands:main"]},
    # The cluster templates (spark-defaults files, GPU discovery script, log4j2): `spark-dist conf-path`.
    data_files=[("share/spark_dist/conf", sorted(glob("conf/*")))],
)
