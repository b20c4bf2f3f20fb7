"""Checkpoint directories (spark_dist.task.checkpoint_dirs): what a rank refuses to write to or unpickle from, where
the default lives on each host, and when a host removes it. No JVM: real files, a real TCPStore; chown to
another uid needs root (the tests that need it are skipped without)."""
import os
import stat

import pytest
import torch

from spark_dist.task.context import CHECKPOINT_FILE, TrainContext

OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


class Trap:
    """Unpickling it makes a directory: whether a checkpoint was unpickled shows on disk."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def rank(checkpoint_dir, r=0):
    return TrainContext(rank=r, local_rank=r, world_size=2, local_world_size=2, node_rank=0, attempt=0,
                        run_id="run1", host="127.0.0.1", checkpoint_dir=str(checkpoint_dir))


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """This process's temp dir, as a rank's: the default checkpoint dirs go below it."""
    tmp = tmp_path / "host-tmp"
    tmp.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    monkeypatch.chdir(tmp_path)  # a relative path must never land in the working directory
    return tmp


def refused(excinfo):
    message = str(excinfo.value)
    return "spark.dist.checkpointDir" in message and "checkpoint_dir=" in message


# -- a given directory (<dir>/<run_id>, absolute) -------------------------------------------------------------
def test_a_given_directory_round_trips_and_is_made_owner_only(tmp_path):
    ctx = rank(tmp_path / "shared" / "run1")
    ctx.save_checkpoint({"epoch": 3, "w": torch.ones(2)})
    assert ctx.load_checkpoint()["epoch"] == 3
    assert rank(tmp_path / "shared" / "run1", r=1).load_checkpoint()["w"].tolist() == [1.0, 1.0]
    assert stat.S_IMODE(os.stat(tmp_path / "shared" / "run1").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "shared" / "run1" / CHECKPOINT_FILE).st_mode) == 0o600
    assert os.listdir(tmp_path / "shared" / "run1") == [CHECKPOINT_FILE]  # no temp file left behind
    assert rank(tmp_path / "none").load_checkpoint(default="fresh") == "fresh"


@pytest.mark.parametrize("tamper", ["dir group-writable", "dir other-writable", "dir another owner",
                                    "dir a symlink", "file group-writable", "file another owner",
                                    "file a symlink"])
def test_a_checkpoint_someone_else_could_write_is_never_unpickled(tmp_path, tamper):
    if "another owner" in tamper and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    run_dir = tmp_path / "ckpt" / "run1"
    rank(run_dir).save_checkpoint(Trap(tmp_path / "unpickled"))
    path = run_dir / CHECKPOINT_FILE
    if tamper == "dir group-writable":
        run_dir.chmod(0o770)
    elif tamper == "dir other-writable":
        run_dir.chmod(0o703)
    elif tamper == "dir another owner":
        os.chown(run_dir, OTHER_UID, -1)
    elif tamper == "dir a symlink":  # the run's directory swapped for a link to one of ours
        os.rename(run_dir, tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", run_dir)
    elif tamper == "file group-writable":
        path.chmod(0o620)
    elif tamper == "file another owner":
        os.chown(path, OTHER_UID, -1)
    elif tamper == "file a symlink":
        os.rename(path, tmp_path / "planted.pt")
        os.symlink(tmp_path / "planted.pt", path)
    with pytest.raises(PermissionError) as info:
        rank(run_dir, r=1).load_checkpoint()
    assert refused(info) and not (tmp_path / "unpickled").exists()
    if tamper.startswith("dir"):  # nor is one written there
        with pytest.raises(PermissionError) as info:
            rank(run_dir).save_checkpoint({"epoch": 1})
        assert refused(info)
    rank(tmp_path / "fine" / "run1").save_checkpoint(Trap(tmp_path / "unpickled"))
    rank(tmp_path / "fine" / "run1", r=1).load_checkpoint()
    assert (tmp_path / "unpickled").exists()  # the trap works: where nothing was tampered with, it ran


def test_the_given_roots_own_permissions_are_the_users(tmp_path):
    # A shared root writable by a group (a team's mount) is the user's choice; the run's directory is checked.
    root = tmp_path / "team"
    root.mkdir()
    root.chmod(0o775)
    rank(root / "run1").save_checkpoint({"epoch": 2})
    assert rank(root / "run1", r=1).load_checkpoint() == {"epoch": 2}


# -- the default: a name each host places under <its temp dir>/spark_dist-<uid>/ ------------------------------
def test_the_default_is_made_owner_only_under_this_hosts_private_temp_dir(private_tmp, tmp_path):
    from spark_dist.task import checkpoint_dirs

    name = checkpoint_dirs.default_name("run1", named=False)
    ctx = rank(name)
    root = private_tmp / f"spark_dist-{os.getuid()}"
    assert ctx.checkpoint_dir == str(root / name)  # this host's path, absolute
    ctx.save_checkpoint({"epoch": 1})
    assert rank(name, r=1).load_checkpoint() == {"epoch": 1}
    assert stat.S_IMODE(os.stat(root).st_mode) == stat.S_IMODE(os.stat(root / name).st_mode) == 0o700
    assert os.listdir(tmp_path) == ["host-tmp"]  # nothing in the working directory


@pytest.mark.parametrize("tamper", ["root readable by others", "root another owner", "root a symlink",
                                    "root a file", "run dir a symlink"])
def test_a_default_whose_parent_is_not_private_is_refused(private_tmp, tmp_path, tamper):
    from spark_dist.task import checkpoint_dirs

    if tamper == "root another owner" and os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    name = checkpoint_dirs.default_name("run1", named=False)
    root = private_tmp / f"spark_dist-{os.getuid()}"
    if tamper == "root a file":
        root.write_bytes(b"")
    elif tamper == "root a symlink":  # to a private directory of ours: still refused, never followed
        (tmp_path / "mine").mkdir(mode=0o700)
        os.symlink(tmp_path / "mine", root)
    else:
        rank(name).save_checkpoint(Trap(tmp_path / "unpickled"))
    if tamper == "root readable by others":
        root.chmod(0o755)
    elif tamper == "root another owner":
        os.chown(root, OTHER_UID, -1)
    elif tamper == "run dir a symlink":
        os.rename(root / name, tmp_path / "moved")
        os.symlink(tmp_path / "moved", root / name)
    with pytest.raises(checkpoint_dirs.CheckpointDirError) as info:
        rank(name).save_checkpoint({"epoch": 1})
    assert refused(info)
    if tamper in ("root readable by others", "root another owner", "run dir a symlink"):
        with pytest.raises(checkpoint_dirs.CheckpointDirError) as info:
            rank(name, r=1).load_checkpoint()
        assert refused(info) and not (tmp_path / "unpickled").exists()


def test_a_default_name_is_fresh_per_run_and_stable_for_a_named_run():
    from spark_dist.task import checkpoint_dirs
    from spark_dist.config import RunConfig
    from spark_dist.task.checkpoint_dirs import run_dir

    drawn = RunConfig.build(num_processes=1)
    first, second = run_dir(drawn), run_dir(drawn)
    assert first != second and first.startswith(f"{drawn.run_id}-") and not os.path.isabs(first)
    assert checkpoint_dirs.removed_after_success(drawn)
    named = RunConfig.build(num_processes=1, run_id="resume-me")
    assert run_dir(named) == run_dir(named)  # run it again: it resumes
    assert not checkpoint_dirs.removed_after_success(named)  # kept to be resumed
    given = RunConfig.build(num_processes=1, checkpoint_dir="/no/such/mount")
    assert run_dir(given) == f"/no/such/mount/{given.run_id}"
    assert not checkpoint_dirs.removed_after_success(given)


@needs_root
def test_the_driver_refuses_a_given_run_dir_it_sees_is_someone_elses(tmp_path):
    from spark_dist.config import RunConfig
    from spark_dist.errors import ConfigError
    from spark_dist.task.checkpoint_dirs import run_dir

    config = RunConfig.build(num_processes=1, checkpoint_dir=str(tmp_path), run_id="theirs")
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", OTHER_UID, -1)
    with pytest.raises(ConfigError, match="owned by uid 65534.*spark.dist.checkpointDir.*use another run_id"):
        run_dir(config)


# -- removal on each host, once the driver said the run succeeded --------------------------------------------
@pytest.fixture
def store():
    from spark_dist.wire.sealed_store import SealedStore, host_store

    server, _ = host_store("127.0.0.1", 10)
    yield SealedStore(server, b"s" * 32, "spark_dist/run1/0")
    del server


def spec_for(checkpoint_dir, remove=True):
    from spark_dist.wire.protocol import LaunchSpec

    return LaunchSpec(run_id="run1", attempt=0, store_host="127.0.0.1", store_port=0, job_bytes=b"",
                      secret=b"s" * 32, checkpoint_dir=checkpoint_dir, remove_checkpoint_dir=remove)


def test_each_host_removes_its_default_once_the_run_succeeded(private_tmp, store, monkeypatch):
    from spark_dist.task import checkpoint_dirs
    from spark_dist.wire.protocol import ABORT, RUN_SUCCEEDED, Abort, TaskOutcome

    monkeypatch.setattr(checkpoint_dirs, "SUCCESS_WAIT_S", 0.3)
    name = checkpoint_dirs.default_name("run1", named=False)
    ctx = rank(name)
    ctx.save_checkpoint({"epoch": 1})
    ok = [TaskOutcome.OK, TaskOutcome.OK]
    # A rank of this task failed, or the run's success never came: kept, for the retry to resume.
    assert not checkpoint_dirs.remove_after_success(spec_for(name), store, [TaskOutcome.OK, TaskOutcome.FAILED])
    assert not checkpoint_dirs.remove_after_success(spec_for(name), store, ok)  # waited 0.3 s: no word
    assert os.path.exists(os.path.join(ctx.checkpoint_dir, CHECKPOINT_FILE))
    store.put(ABORT, Abort.RANK_FAILED)  # a rank elsewhere failed, and the driver says the run did
    store.put(RUN_SUCCEEDED, False)
    assert not checkpoint_dirs.remove_after_success(spec_for(name), store, ok)
    assert os.path.exists(ctx.checkpoint_dir)
    store.put(RUN_SUCCEEDED, True)
    assert not checkpoint_dirs.remove_after_success(spec_for(name, remove=False), store, ok)  # a named run's
    assert os.path.exists(ctx.checkpoint_dir)
    assert checkpoint_dirs.remove_after_success(spec_for(name), store, ok)
    assert not os.path.exists(ctx.checkpoint_dir)
    assert os.listdir(os.path.dirname(ctx.checkpoint_dir)) == []
    assert not checkpoint_dirs.remove_after_success(spec_for(name), store, ok)  # nothing here: no wait, no error


def test_a_given_directory_is_never_removed(tmp_path, store):
    from spark_dist.task import checkpoint_dirs
    from spark_dist.wire.protocol import RUN_SUCCEEDED, TaskOutcome

    given = tmp_path / "mine" / "run1"
    rank(given).save_checkpoint({"epoch": 1})
    store.put(RUN_SUCCEEDED, True)
    assert not checkpoint_dirs.remove_after_success(spec_for(str(given)), store, [TaskOutcome.OK])
    assert not checkpoint_dirs.remove(str(given))
    assert (given / CHECKPOINT_FILE).exists()


@needs_root
def test_a_default_under_a_parent_that_is_not_ours_is_not_removed(private_tmp):
    from spark_dist.task import checkpoint_dirs

    name = checkpoint_dirs.default_name("run1", named=False)
    rank(name).save_checkpoint({"epoch": 1})
    root = private_tmp / f"spark_dist-{os.getuid()}"
    os.chown(root, OTHER_UID, -1)
    assert not checkpoint_dirs.remove(name)
    assert (root / name / CHECKPOINT_FILE).exists()
