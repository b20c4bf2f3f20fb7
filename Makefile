# The README's commands. Each sets up .venv first (idempotent: a stamp skips it when nothing changed).
PY := .venv/bin/python
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: env demo test bench bench-launch bench-data bench-horovod bench-ml bench-recovery clean
env:
	@bash scripts/setup_env.sh

demo: env
	$(PY) -m spark_dist.demo

test: env
	$(PY) -m pytest

bench: env bench-launch bench-data bench-horovod bench-ml bench-recovery

bench-launch: env
	$(PY) bench/bench_launch.py --out bench/results/launch.json

bench-data: env
	$(PY) bench/bench_data.py --out bench/results/data.json

clean:
	rm -rf .venv build *.egg-info

bench-horovod: env
	$(PY) bench/bench_horovod.py --out bench/results/horovod.json

bench-ml: env
	$(PY) bench/bench_ml.py --out bench/results/ml.json

bench-recovery: env
	$(PY) bench/bench_recovery.py --out bench/results/recovery.json
