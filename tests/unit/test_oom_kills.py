"""The OOM killer's count in this process's memory cgroup (spark_dist/host/oom_kills.py): what tells a SIGKILL for
memory from any other."""
from spark_dist.host import oom_kills


def _tree(tmp_path, cgroup, files):
    proc = tmp_path / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(cgroup)
    root = tmp_path / "cgroup"
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return str(tmp_path / "proc"), str(root)


def test_cgroup_v2_reads_memory_events_of_the_process_cgroup(tmp_path):
    proc, root = _tree(tmp_path, "0::/user.slice/job\n", {
        "user.slice/job/memory.events": "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n",
        "memory.events": "oom_kill 9\n"})
    assert oom_kills.count(proc, root) == 2


def test_cgroup_v1_reads_the_memory_controller_oom_control(tmp_path):
    proc, root = _tree(tmp_path, "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n", {
        "memory/docker/abc/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"})
    assert oom_kills.count(proc, root) == 3


def test_a_container_whose_cgroup_path_is_hidden_reads_the_mount_top(tmp_path):
    # A cgroup namespace: /proc/self/cgroup names the host's path, the mount shows the container's cgroup as its top.
    proc, root = _tree(tmp_path, "4:memory:/process_api/0fd2\n0::/\n", {
        "memory/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"})
    assert oom_kills.count(proc, root) == 1


def test_no_memory_cgroup_or_an_old_kernel_counts_nothing(tmp_path):
    proc, root = _tree(tmp_path, "4:memory:/a\n", {"memory/a/memory.oom_control": "oom_kill_disable 0\n"})
    assert oom_kills.count(proc, root) is None
    assert oom_kills.count(str(tmp_path / "nowhere"), str(tmp_path / "none")) is None
