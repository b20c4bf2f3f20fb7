"""Installing the built wheel next to a user's Spark stack never moves it, and a run works right after.

The "user's environment" is a fresh virtual environment that sees this line's pinned packages (pyspark,
numpy, pyarrow, pandas, torch, ...) through a ``.pth`` file, but not spark_dist: pip counts them as
installed, so whatever it would change to satisfy spark_dist's requirements shows in its report. This is
what ``pip install spark_dist`` does on a machine that already has Spark, without downloading the stack
again. Runs on whichever Spark line the suite runs on (``make test`` runs both).
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from clusters import SPARK_4
from commands import run_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USER_STACK = ("pyspark", "numpy", "pyarrow", "pandas")
# The oldest stack of the Spark 4 line we support (the line's lock file pins the newest): installed into
# the user's venv over the line's packages.
OLDEST_SPARK_4 = ("pyspark==4.0.5", "pyarrow==18.1.0", "numpy==2.0.2", "pandas==2.2.3")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> str:
    """The wheel, built once for the module's tests."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def _build_wheel(tmp_path) -> str:
    """The wheel, built from a copy of the sources (so the checkout gets no build/ or egg-info)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "spark_dist", "spark_dist_daemon.py", "conf", "README.md"):
        copy = shutil.copytree if os.path.isdir(os.path.join(REPO, name)) else shutil.copy
        copy(os.path.join(REPO, name), src / name)
    result = run_command([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path / "dist"), str(src)], timeout=180)
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("spark_dist-*.whl")
    return str(wheel)


def _user_env(tmp_path) -> str:
    """A fresh venv that sees this line's packages (all but spark_dist) and returns its python."""
    site = sysconfig.get_paths()["purelib"]
    stack = tmp_path / "stack"
    stack.mkdir()
    for entry in os.listdir(site):
        if entry.lower().startswith(("spark_dist", "__editable__", "_spark_dist")) or entry.endswith(".pth"):
            continue
        os.symlink(os.path.join(site, entry), stack / entry)
    venv = tmp_path / "user-venv"
    result = run_command([sys.executable, "-m", "venv", str(venv)], timeout=120)
    assert result.returncode == 0, result.stderr
    python = str(venv / "bin" / "python")
    # The venv's own setuptools (ensurepip's, older than torch asks for) would hide the stack's.
    result = run_command([python, "-m", "pip", "uninstall", "-q", "-y", "setuptools"], timeout=120)
    assert result.returncode == 0, result.stderr
    user_site = subprocess.check_output([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip()
    with open(os.path.join(user_site, "user_stack.pth"), "w") as pth:
        pth.write(str(stack) + "\n")
    return python


def _versions(python) -> dict:
    code = ("import json, importlib.metadata as m; "
            f"print(json.dumps({{p: m.version(p) for p in {USER_STACK!r}}}))")
    return json.loads(subprocess.check_output([python, "-c", code], text=True))


@pytest.mark.parametrize("users_stack", [
    pytest.param((), id="this-line's-pins"),
    pytest.param(OLDEST_SPARK_4, id="oldest-spark4", marks=pytest.mark.skipif(
        not SPARK_4, reason="the oldest Spark 4 stack is checked from the Spark 4 line's environment")),
])
def test_pip_install_keeps_the_users_spark_and_a_run_works(tmp_path, users_stack, wheel):
    python = _user_env(tmp_path)
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    env = dict(os.environ, PYTHONPATH="")
    if users_stack:
        # --no-compile: byte-compiling the whole stack (pyspark's thousands of modules) took half of this
        # install's CPU (26 s, 11 s without); the run below compiles the few modules it imports.
        got = run_command(pip + ["install", "-q", "--no-compile", *users_stack], timeout=600, env=env)
        assert got.returncode == 0, got.stderr[-3000:]
    before = _versions(python)
    expected = dict(p.split("==") for p in users_stack) or {p: _versions(sys.executable)[p] for p in USER_STACK}
    assert before == expected

    report = tmp_path / "report.json"
    dry = run_command(pip + ["install", "--dry-run", "--report", str(report), wheel], timeout=180, env=env)
    assert dry.returncode == 0, dry.stderr
    would_install = sorted(item["metadata"]["name"] for item in json.loads(report.read_text())["install"])
    assert would_install == ["spark_dist"], f"pip would also install or move: {would_install}"

    real = run_command(pip + ["install", "-q", wheel], timeout=180, env=env)
    assert real.returncode == 0, real.stderr
    assert _versions(python) == before

    # Run from a folder of the user's: Spark starts its Python workers (`python -m`) in the driver's working
    # directory, which comes first on their path, and this checkout's would give them its spark_dist.
    smoke = run_command([python, os.path.join(REPO, "tests", "scripts", "install_smoke.py")], timeout=240,
                        cwd=tmp_path, env=dict(os.environ, PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python,
                                               PYTHONPATH=""))
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    result = json.loads(smoke.stdout.strip().splitlines()[-1])
    assert result["spark_dist_file"].startswith(str(tmp_path / "user-venv"))  # the wheel, not the checkout
    # The workers (and the ranks forked from them) ran the wheel's spark_dist; the wheel's spark_dist_daemon forked
    # them, on the installed PySpark rather than Spark's zip of it.
    workers = result["workers"]
    assert workers["spark_dist"].startswith(str(tmp_path / "user-venv")), workers
    assert workers["daemon"] == str(tmp_path / "user-venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                                    / "site-packages" / "spark_dist_daemon.py"), workers
    assert ".zip" not in workers["pyspark"], workers
    assert result["versions"] == {"pyspark": before["pyspark"], "numpy": before["numpy"],
                                  "pyarrow": before["pyarrow"], "pandas": before["pandas"]}
    first, second = result["per_rank"]
    assert len(first) == len(second) == 50 and sorted(first + second) == list(range(100))

