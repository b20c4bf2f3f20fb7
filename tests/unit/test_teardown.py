"""spark_dist.task.teardown in this process: destroyed process groups stay referenced until the rank exits."""
import subprocess
import sys
import textwrap


# A one-rank gloo group on loopback and two subgroups: one destroyed alone, then everything. Prints the groups
# teardown kept (the first alone, then the rest in any order), whether torch still has a default group, and
# whether torch.distributed's own name is the wrapper.
_ONE_RANK_GROUPS = """
import socket
import torch.distributed as dist
from spark_dist.task import teardown

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
world, first, second = dist.group.WORLD, dist.new_group([0]), dist.new_group([0])
dist.destroy_process_group(first)
dist.destroy_process_group()
kept = [{id(world): "world", id(first): "first", id(second): "second"}.get(id(g), "other") for g in teardown._kept]
print(kept[:1] + sorted(kept[1:]), dist.is_initialized(),
      getattr(dist.destroy_process_group, "_spark_dist_keeps_groups", False))
"""


KEPT_ALL = "['first', 'second', 'world'] False True"


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_groups_destroyed_after_the_hook_stay_referenced_when_torch_was_imported_first():
    code = "import torch.distributed\nfrom spark_dist.task import teardown\nteardown.keep_process_groups_until_exit()\n"
    assert _run(code + _ONE_RANK_GROUPS) == KEPT_ALL


def test_groups_destroyed_after_the_hook_stay_referenced_when_torch_is_imported_later():
    # A spawned rank (local mode) imports torch only in the user's code: the hook waits for torch.distributed.
    code = ("import sys\nfrom spark_dist.task import teardown\nteardown.keep_process_groups_until_exit()\n"
            "assert 'torch' not in sys.modules\n")
    assert _run(code + _ONE_RANK_GROUPS) == KEPT_ALL


def test_without_the_hook_nothing_is_kept():
    assert _run(_ONE_RANK_GROUPS) == "[] False False"
