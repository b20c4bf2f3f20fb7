"""NCCL's Flight Recorder dump, asked for by a stalled rank's supervisor and written by a thread of the rank
(spark_dist.task.flight_recorder). The dump itself needs NCCL on a GPU (tests/gpu_check.py checks it there):
here torch's dump function is the one stand-in; no JVM."""
import threading

from spark_dist.task import flight_recorder


def test_the_supervisor_gets_the_dump_the_rank_writes_while_its_main_thread_is_blocked(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "64")  # the user's own setting stays
    monkeypatch.setattr(flight_recorder, "_dump", lambda: b"the ring of collectives")
    flight_recorder.start(str(tmp_path))
    blocked = threading.Event()
    threading.Thread(target=blocked.wait, daemon=True).start()  # as a main thread in a collective would be
    assert flight_recorder.ask(str(tmp_path)) == b"the ring of collectives"
    assert flight_recorder.os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64"
    monkeypatch.setattr(flight_recorder, "_dump", lambda: (_ for _ in ()).throw(RuntimeError("no NCCL group")))
    assert flight_recorder.ask(str(tmp_path)) == b"no dump: RuntimeError: no NCCL group"
    blocked.set()
