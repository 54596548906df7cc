"""The tests of Spark on a ``local-cluster`` master, with executors in processes of their own: they share the run's
one cluster (cluster.py), and under pytest-xdist run on one worker (tests/conftest.py), so it starts once."""

from tests.spark_cluster.cluster import spark_cluster  # noqa: F401  (fixture: the run's one local-cluster Spark)
