"""The run's store seals every value: a peer who reaches the port reads nothing, forges nothing, names no key."""
import pickle
import threading
import time

import pytest

from spark_dist.wire.sealed_store import EMPTY, FORGED, SealedStore, host_store, join_store
from spark_dist.wire.sealing import Sealer, lane_run_secret, prefix_token

SECRET = bytes(range(32))


@pytest.fixture
def store_port():
    server, port = host_store("127.0.0.1", 10)
    yield port
    del server


def test_a_value_read_off_the_wire_holds_none_of_its_text(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "spark_dist/run1/0")
    ours.push("output", (0, [("stdout", "the password is hunter2")]))
    ours.put("progress", "epoch 3 of hunter2")
    raw = join_store("127.0.0.1", store_port, 10)
    blobs = [raw.queue_pop(ours.key("output"), False), raw.get(ours.key("progress"))]
    assert all(b"hunter2" not in blob and b"stdout" not in blob for blob in blobs)
    assert not any(blob.startswith(pickle.PROTO) for blob in blobs)  # not a pickle either


def test_keys_sit_under_a_part_only_the_secret_names(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "spark_dist/run1/0")
    ours.put("abort", "stop")
    token = prefix_token(SECRET)
    assert ours.key("abort") == f"spark_dist/run1/0/{token}/abort" and len(token) == 32
    raw = join_store("127.0.0.1", store_port, 10)
    # Whoever knows the run id (the Spark UI shows it) and the key names still finds nothing.
    assert not raw.check(["spark_dist/run1/0/abort"])
    assert prefix_token(SECRET) != prefix_token(bytes(32))


def test_a_value_sealed_under_another_secret_or_key_does_not_open(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    earlier = SealedStore(join_store("127.0.0.1", store_port, 10), b"e" * 32, "p")
    raw = join_store("127.0.0.1", store_port, 10)
    earlier.put("ended/0", True)
    raw.set(ours.key("ended/0"), raw.get(earlier.key("ended/0")))  # an earlier attempt's value, moved over
    ours.put("task/0", "mine")
    raw.set(ours.key("ended/1"), raw.get(ours.key("task/0")))  # ours, moved to another key
    assert ours.lookup("ended/0", "absent") == "absent" and ours.lookup("ended/1", "absent") == "absent"
    assert ours.get_many(["task/0", "ended/1"]) == ["mine", FORGED]


@pytest.mark.parametrize("damage", [
    lambda blob: blob[:-1],  # truncated
    lambda blob: blob[:-1] + bytes([blob[-1] ^ 1]),  # the tag
    lambda blob: blob[:30] + bytes([blob[30] ^ 1]) + blob[31:],  # the ciphertext
    lambda blob: b"\x02" + blob[1:],  # another version
    lambda blob: b"",
])
def test_a_damaged_value_does_not_open(damage):
    sealer = Sealer(SECRET)
    blob = sealer.seal("k", b"some data of a value")
    assert sealer.open_sealed("k", blob) == b"some data of a value"
    assert sealer.open_sealed("k", damage(blob)) is None


def test_two_seals_of_one_value_differ():
    sealer = Sealer(SECRET)
    assert sealer.seal("k", b"same") != sealer.seal("k", b"same")  # a fresh nonce each


def test_a_secret_needs_16_bytes_at_least():
    with pytest.raises(ValueError, match="^a sealing secret must hold at least 16 random bytes$"):
        Sealer(b"x" * 15)
    blob = Sealer(b"x" * 16).seal("k", b"enough")
    assert Sealer(b"x" * 16).open_sealed("k", blob) == b"enough"


def test_the_sealed_format_is_the_documented_one():
    """``VERSION | key id | nonce | AES-256-GCM ciphertext and tag``, each key HKDF-SHA256 of the secret with info
    ``spark_dist/<purpose>`` (the module's docstring): one key per purpose, none shared."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    def key(purpose, length):
        return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                    info=f"spark_dist/{purpose}".encode()).derive(SECRET)

    blob = Sealer(SECRET).seal("p/task/1", b"where I run")
    assert blob[:1] == b"\x01" and blob[1:9] == key("key id", 8)
    assert AESGCM(key("value key", 32)).decrypt(blob[9:21], blob[21:], b"p/task/1") == b"where I run"
    assert prefix_token(SECRET) == key("key prefix", 16).hex()
    assert lane_run_secret(SECRET, "r", 2) == key("lane run/r/2", 32)


def test_a_lane_run_secret_is_its_own_per_run_and_attempt():
    lane = b"l" * 32
    assert lane_run_secret(lane, "r", 0) == lane_run_secret(lane, "r", 0)
    assert len({lane_run_secret(lane, "r", 0), lane_run_secret(lane, "r", 1), lane_run_secret(lane, "s", 0),
                lane_run_secret(b"m" * 32, "r", 0), lane}) == 5


def test_a_strangers_add_on_a_sealed_value_leaves_the_store_serving(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    ours.put("ended/0", True)
    stranger = join_store("127.0.0.1", store_port, 10)
    with pytest.raises(Exception):  # noqa: B017 -- torch's error for a value that is no number
        stranger.add(ours.key("ended/0"), 1)
    assert ours.get("ended/0") is True
    assert SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p").get("ended/0") is True


def test_values_written_at_once_are_read_back_each_under_its_own_key(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    ours.put_many({"assignment/0": "rank 0", "assignment/1": "rank 1"})
    assert ours.get_many(["assignment/0", "assignment/1"]) == ["rank 0", "rank 1"]
    assert ours.get("assignment/1") == "rank 1"


def test_a_deleted_value_is_gone_and_deleting_it_again_is_fine(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    ours.put("ended/0", True)
    ours.put("ended/1", True)
    ours.delete("ended/0")
    assert not ours.has("ended/0") and ours.lookup("ended/0", "absent") == "absent" and ours.has("ended/1")
    ours.delete("ended/0")


def test_a_counter_is_unsealed_a_hint_anyone_can_move(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    assert [ours.counter("arrived"), ours.counter("arrived"), ours.counter("arrived", 0)] == [1, 2, 2]
    join_store("127.0.0.1", store_port, 10).add(ours.key("arrived"), 40)  # a stranger who found its key
    assert ours.counter("arrived", 0) == 42


def test_a_queue_pops_oldest_first_then_says_it_is_empty(store_port):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    ours.push("failures", "first")
    ours.push("failures", "second")
    assert ours.queue_len("failures") == 2
    assert [ours.pop("failures"), ours.pop("failures"), ours.pop("failures")] == ["first", "second", EMPTY]
    assert (repr(EMPTY), repr(FORGED)) == ("EMPTY", "FORGED")  # how they show in a log line


@pytest.mark.parametrize("forged", [False, True])
def test_wait_for_returns_a_value_once_another_process_puts_it(store_port, forged):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    if forged:  # a stranger's value is there first: waited past, until ours replaces it
        join_store("127.0.0.1", store_port, 10).set(ours.key("abort"), b"\x01" + b"\0" * 40)
    driver = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    later = threading.Timer(0.3, driver.put, ("abort", "timeout"))
    later.start()
    try:
        assert ours.wait_for("abort", 10) == "timeout"
    finally:
        later.join()
    assert ours.wait_for("abort", 0.5) == "timeout"  # already there: at once, whatever the timeout


@pytest.mark.parametrize("forged", [False, True])
def test_wait_for_gives_up_after_its_timeout_quietly(store_port, forged, capfd):
    ours = SealedStore(join_store("127.0.0.1", store_port, 10), SECRET, "p")
    if forged:  # a value that never opens is no value
        join_store("127.0.0.1", store_port, 10).set(ours.key("abort"), b"forged")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="^waited 1s for 'abort' in the run's store$"):
        ours.wait_for("abort", 1)
    assert 1 <= time.monotonic() - started < 5
    # A short wait that times out is routine (the driver looks again): torch's store would print two
    # "[c10d] waitForInput ... likely a timeout" lines for each one, on whatever console the process has.
    assert "c10d" not in capfd.readouterr().err
