"""The run's store seals every value: a peer who reaches the port reads nothing, forges nothing, names no key."""
import pickle

import pytest

from spark_dist.wire.sealed_store import FORGED, SealedStore, host_store, join_store
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


def test_a_short_secret_is_refused():
    with pytest.raises(ValueError, match="16 random bytes"):
        Sealer(b"short")


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
