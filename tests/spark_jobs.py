"""What the tests ask a classic session about its Spark jobs."""
import time


def jobs_started(spark):
    """How many Spark jobs the application has started so far (every thread's), once Spark's listener bus,
    which fills the status store asynchronously, has caught up."""
    store = spark.sparkContext._jsc.sc().statusStore()
    count, deadline = store.jobsList(None).size(), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.3)
        again = store.jobsList(None).size()
        if again == count:
            return count
        count = again
    return count
