"""Which modules travel by value when spark_dist pickles a training function (spark_dist.wire.pickling): a
module of the user's that executors cannot import by name, and the user's other modules its code uses, however
it imported them. The unpickling side is a fresh interpreter that has none of them on its path, as an executor
may not."""
import os
import subprocess
import sys
import textwrap

import cloudpickle
import pytest

from spark_dist.wire.pickling import by_value

HELPER = """
    SCALE = 3

    def helper(x):
        return x * SCALE
"""
TRAIN = """
    import helper_mod
    from helper_mod import helper

    def train(x):
        return helper(x) + helper_mod.helper(1)
"""


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    """``main_mod.train``, a user's function in a file of theirs that imports another of their files."""
    for name, text in (("helper_mod", HELPER), ("main_mod", TRAIN)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("helper_mod", "main_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import main_mod

    yield main_mod
    for name in ("helper_mod", "main_mod"):
        sys.modules.pop(name, None)


def unpickled_elsewhere(data: bytes, arg) -> subprocess.CompletedProcess:
    code = "import sys, cloudpickle; print(cloudpickle.loads(sys.stdin.buffer.read())(%r))" % (arg,)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", code], input=data, capture_output=True, env=env, cwd="/",
                          timeout=120)


def test_a_function_using_another_local_module_of_the_user_runs_where_neither_is_importable(user_modules):
    with by_value([user_modules.train]):
        data = cloudpickle.dumps(user_modules.train)
    done = unpickled_elsewhere(data, 2)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == "9"  # helper(2) + helper_mod.helper(1) = 6 + 3


def test_the_modules_go_back_to_by_reference_after_the_pickling(user_modules):
    with by_value([user_modules.train]):
        pass
    assert {"helper_mod", "main_mod"}.isdisjoint(cloudpickle.list_registry_pickle_by_value())
