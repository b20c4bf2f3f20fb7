"""What the tests ask a classic session about its Spark jobs, and how they interrupt one."""
import threading
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


def interrupt_main_when(directory, pattern, count, timeout):
    """From a thread: Ctrl-C on the test's main thread (what a terminal or a notebook's interrupt does) once
    ``count`` files matching ``pattern`` are in ``directory`` (each rank writes one when it runs), or after
    ``timeout`` seconds."""
    import _thread

    def interrupt():
        deadline = time.monotonic() + timeout
        while len(list(directory.glob(pattern))) < count and time.monotonic() < deadline:
            time.sleep(0.1)
        _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
