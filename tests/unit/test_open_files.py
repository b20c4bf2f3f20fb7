"""Whether the driver may open the store connections a run's ranks hold (``host/open_files.py``): checked before
any Spark job, since past the limit the store refuses connections mid-rendezvous."""
import resource

from spark_dist.host import open_files


def test_a_run_that_fits_under_the_soft_limit_passes(monkeypatch):
    monkeypatch.setattr(open_files, "limits", lambda: (1024, 4096))
    monkeypatch.setattr(open_files, "open_now", lambda: 20)
    assert open_files.shortfall(300) is None  # 20 + 3 x 300 + the reserve: 984
    assert open_files.shortfall(10_000) is not None


def test_a_run_past_the_soft_limit_names_the_limit_the_need_and_the_fix(monkeypatch):
    monkeypatch.setattr(open_files, "limits", lambda: (1024, 4096))
    monkeypatch.setattr(open_files, "open_now", lambda: 20)
    why = open_files.shortfall(500)
    assert why.startswith("a run of 500 ranks needs about 1,584 open files on the driver (3 store connections a rank")
    assert "may open 1,024 (RLIMIT_NOFILE soft limit; hard limit 4,096)" in why
    assert "`ulimit -n 4096`" in why and "resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))" in why


def test_past_the_hard_limit_too_it_says_so(monkeypatch):
    monkeypatch.setattr(open_files, "limits", lambda: (1024, 2048))
    monkeypatch.setattr(open_files, "open_now", lambda: 20)
    why = open_files.shortfall(1000)
    assert "the hard limit is too low as well" in why and "`ulimit -n 2048`" in why


def test_no_soft_limit_no_shortfall_and_this_process_counts_its_own_files(monkeypatch):
    assert open_files.open_now() > 0
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert open_files.limits() is None or open_files.limits()[0] == soft
    monkeypatch.setattr(open_files, "limits", lambda: None)
    assert open_files.shortfall(1_000_000) is None
