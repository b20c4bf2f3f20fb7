"""Two hosts on one machine: network namespaces on a bridge, a standalone worker in each, the master and
the driver in the root namespace.

    bridge spdist-br0  10.213.0.1/24   (root namespace: master, driver)
    namespace spdist-h1 eth0 10.213.0.2  worker 1
    namespace spdist-h2 eth0 10.213.0.3  worker 2

The namespaces keep the machine's /etc/hosts, where its host name resolves to 127.0.0.1, as in many
containers: exactly what breaks gloo's mesh across hosts unless spark_dist points gloo at the right
interface. No default route: nothing leaves the bridge. Needs root and iproute2; `available()` says why
not. Everything is removed by `stop()` (processes by group, then namespaces and the bridge), also after
a failed start, and stale ones of a crashed earlier run are removed before starting.
"""
import fcntl
import os
import shutil
import subprocess
import tempfile
import time

from clusters import StandaloneCluster, free_port

BRIDGE, DRIVER_IP = "spdist-br0", "10.213.0.1"
HOSTS = (("spdist-h1", "spdist-v1", "10.213.0.2"), ("spdist-h2", "spdist-v2", "10.213.0.3"))


def available():
    """``None`` when namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    # Root without CAP_NET_ADMIN (some containers) cannot make links or namespaces: try once.
    probe = _ip("netns", "add", "spdist-probe", check=False)
    _ip("netns", "del", "spdist-probe", check=False)
    if probe.returncode != 0:
        return f"cannot create a network namespace here: {probe.stderr.strip()}"
    return None


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def _remove_network():
    for ns, veth, _ in HOSTS:
        _ip("netns", "del", ns, check=False)
        _ip("link", "del", veth, check=False)
    _ip("link", "del", BRIDGE, check=False)


def _make_network():
    _remove_network()  # what a crashed earlier run of ours left
    _ip("link", "add", BRIDGE, "type", "bridge")
    _ip("addr", "add", f"{DRIVER_IP}/24", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    for ns, veth, address in HOSTS:
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", BRIDGE)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")


# How long to wait for the other line's two-host tests to let go of the namespaces. This wait is in a fixture's
# set-up, which pytest.ini's per-test limit (timeout_func_only) does not cover: without a bound of its own, a run
# of the other line stalled while holding the lock would hang this one for good.
LOCK_TIMEOUT_S = 1200


def _take_lock(path, timeout=LOCK_TIMEOUT_S):
    """The file ``path``, open and exclusively locked (flock) by this process, which is named in it; raises
    TimeoutError naming the holder after ``timeout`` seconds."""
    lock = open(path, "a+")
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                lock.seek(0)
                holder = lock.read().strip() or "unknown"
                lock.close()
                raise TimeoutError(
                    f"two hosts: {path} is still locked after {timeout} s by another test run (holder: {holder}): "
                    "its two-host cluster holds the namespaces spdist-h1/h2 and the bridge spdist-br0. If that run "
                    "is stuck, stop it (its pid is above); the kernel drops the lock when it exits") from None
            time.sleep(1.0)
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()} (pytest of spark_dist's tests), since {time.strftime('%H:%M:%S')}\n")
    lock.flush()
    return lock


class TwoHostCluster(StandaloneCluster):
    """A standalone master on the bridge address and one worker (2 cores) in each namespace. A run of two ranks
    still has one on each host: Spark deals a stage's tasks out to the executors in turn."""

    def __init__(self, tmpdir, gpu_script):
        super().__init__(tmpdir, gpu_script, n_workers=len(HOSTS), cores=2)
        self.hosts = [address for _, _, address in HOSTS]
        # A directory only the driver sees: each worker's mount namespace (ip netns exec makes one) has an
        # empty tmpfs over it, as a path that is not a shared mount looks from other machines.
        self.driver_only_dir = os.path.join(tmpdir, "driver-only")
        # Each host's own temp dir (TMPDIR of its worker and of the executors and Python processes under it), as
        # separate machines have: what a run leaves on a host shows there, apart from the driver's temp dir.
        self.host_tmp = {address: os.path.join(tmpdir, f"tmp-{ns}") for ns, _, address in HOSTS}

    def start(self):
        # The namespaces, links and addresses have fixed names: a test run of the other Spark line (make test
        # runs both at once) waits here until this one has removed them. The kernel drops the lock if we die.
        # The machine's temp dir, not this run's (conftest): the other line's run must see the same file.
        self._lock = _take_lock(os.path.join(os.environ.get("SPARK_DIST_TEST_MACHINE_TMP", tempfile.gettempdir()),
                                             "spark_dist-two-hosts.lock"))
        try:
            _make_network()
            port, ui_port = free_port(), free_port()
            self.master_url = f"spark://{DRIVER_IP}:{port}"
            self.webui_url = f"http://{DRIVER_IP}:{ui_port}"
            self.master = self._spawn("master", [
                "org.apache.spark.deploy.master.Master", "--host", DRIVER_IP, "--port", str(port),
                "--webui-port", str(ui_port)], extra_env={"SPARK_LOCAL_IP": DRIVER_IP})
            os.makedirs(self.driver_only_dir, exist_ok=True)
            hide = ("sh", "-c", 'mount -t tmpfs spdist-hidden "$0" && exec "$@"', self.driver_only_dir)
            for i, (ns, _, address) in enumerate(HOSTS):
                work_dir = os.path.join(self.tmpdir, f"worker-{ns}")
                os.makedirs(work_dir, exist_ok=True)
                os.makedirs(self.host_tmp[address], exist_ok=True)
                self.workers.append(self._spawn(
                    f"worker-{ns}",
                    ["org.apache.spark.deploy.worker.Worker", "--host", address, "--cores", str(self.cores),
                     "--memory", self.memory, "--webui-port", str(free_port()), "--work-dir", work_dir,
                     self.master_url],
                    extra_env={"SPARK_LOCAL_IP": address, "SPARK_LOCAL_HOSTNAME": address,
                               "TMPDIR": self.host_tmp[address]},
                    prefix=("ip", "netns", "exec", ns, *hide)))
            self._wait_for_workers("workers in both namespaces to register", timeout=120)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self):
        try:
            super().stop()
        finally:
            time.sleep(0.2)  # let the namespaces' last sockets close before their links go
            _remove_network()
            lock, self._lock = getattr(self, "_lock", None), None
            if lock is not None:
                lock.close()  # releases the flock

    def take_down(self, index):
        """Take host ``index`` off the network (its link down), as a lost host looks to the others."""
        ns, veth, _ = HOSTS[index]
        _ip("link", "set", veth, "down")

    def host_pids(self, index):
        """The pids of every process on host ``index`` (in its network namespace: its worker, executors, Python
        workers and ranks)."""
        ns, _, _ = HOSTS[index]
        return [int(pid) for pid in _ip("netns", "pids", ns).stdout.split()]

    def bring_up(self, index):
        """Put host ``index`` back on the network (before stopping Spark: a driver that cannot reach an executor
        waits out its RPC timeouts, two minutes, to stop)."""
        ns, veth, _ = HOSTS[index]
        _ip("link", "set", veth, "up")
