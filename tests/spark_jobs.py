"""What the tests ask a classic session about its Spark jobs, and how they interrupt one."""
import threading
import time

# Every job a run starts (its barrier job, a lane's) runs under a job group of this prefix
# (spark_dist.spark.session.job_scope: spark_dist-<run_id>-<attempt>, spark_dist-lane-<id>).
RUN_GROUP_PREFIX = "spark_dist-"


def _settle(sc, timeout=30.0):
    """Until Spark's listener bus has delivered every event posted so far: the status store (job groups,
    states) is filled from it asynchronously. ``LiveListenerBus.waitUntilEmpty`` is ``private[spark]`` in Scala,
    public to py4j; where it cannot be called, until the store's job count stops changing (a weaker wait)."""
    try:
        sc.listenerBus().waitUntilEmpty(int(timeout * 1000))  # raises TimeoutException when it did not empty
        return
    except Exception as exc:  # noqa: BLE001
        if "TimeoutException" in str(exc):
            raise AssertionError(f"Spark's listener bus did not empty in {timeout:.0f} s") from None
    store = sc.statusStore()
    count, deadline = store.jobsList(None).size(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        again = store.jobsList(None).size()
        if again == count:
            return
        count = again


def jobs_started(spark):
    """How many Spark jobs the application has started so far (every thread's, whatever their group).

    The DAGScheduler's job counter: every job (and every map stage AQE submits as a job) takes the next id when
    it is submitted, in the submitting thread, so the count is exact at once, and is not capped by
    ``spark.ui.retainedJobs`` as the status store's list is."""
    sc = spark.sparkContext._jsc.sc()
    try:
        next_id = sc.dagScheduler().nextJobId()  # private[scheduler] AtomicInteger; py4j may hand back its int
        return int(next_id if isinstance(next_id, int) else next_id.get())
    except Exception:  # noqa: BLE001 -- no such member: the status store, once the listener bus is empty
        _settle(sc)
        return sc.statusStore().jobsList(None).size()


def jobs_since(spark, before):
    """``[(job id, job group or None), ...]`` of the jobs started since ``jobs_started(spark)`` returned
    ``before``. A job the status store no longer holds is listed with the group ``"?"`` (so it is never taken
    for an ungrouped one)."""
    sc = spark.sparkContext._jsc.sc()
    now = jobs_started(spark)
    store, jobs, deadline = sc.statusStore(), [], time.monotonic() + 10
    for job_id in range(before, now):
        while True:
            _settle(sc)
            try:
                group = store.job(job_id).jobGroup()
                jobs.append((job_id, group.get() if group.isDefined() else None))
                break
            except Exception:  # noqa: BLE001 -- NoSuchElementException: not posted yet, or dropped since
                if time.monotonic() > deadline:  # (spark.ui.retainedJobs)
                    jobs.append((job_id, "?"))
                    break
                time.sleep(0.2)
    return jobs


class Interrupter:
    """From a thread: Ctrl-C on the test's main thread (what a terminal or a notebook's interrupt does) once
    ``count`` files matching ``pattern`` are in ``directory`` (each rank writes one when it runs).

    Never fires on a timeout, and never after :meth:`cancel` (``with`` calls it at the end of the block): a
    KeyboardInterrupt that lands after its test ended would hit whichever test runs then, and pytest would end
    the whole session. ``fired`` says whether it fired; :meth:`cancel` waits for the thread to end, so a
    KeyboardInterrupt that was already on its way is raised in the ``with`` block, not in a later test."""

    def __init__(self, directory, pattern, count, timeout):
        self.directory, self.pattern, self.count, self.timeout = directory, pattern, count, timeout
        self.fired = False
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="spark_jobs-interrupter")

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.cancel()
        return False

    def _watch(self):
        import _thread

        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and not self._cancelled.is_set():
            if len(list(self.directory.glob(self.pattern))) >= self.count:
                with self._lock:
                    if not self._cancelled.is_set():
                        self.fired = True
                        _thread.interrupt_main()
                return
            self._cancelled.wait(0.1)

    def cancel(self):
        with self._lock:
            self._cancelled.set()
        self._thread.join()


def interrupt_main_when(directory, pattern, count, timeout):
    """An :class:`Interrupter`; it watches from ``with interrupt_main_when(...) as ctrl_c:`` to the block's end."""
    return Interrupter(directory, pattern, count, timeout)
