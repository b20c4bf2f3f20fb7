# The README's commands. Each sets up the environment it uses first (idempotent: a stamp skips it).
# Two Spark lines: 4 (the default, .venv) and 3.5 (.venv-spark35). `make test` runs the suite on both;
# LINES=4 (or LINES=3.5) picks one, for test and bench; SPARK_LINE=3.5 runs the demo on the 3.5 line.
export SPARK_LOCAL_IP := 127.0.0.1
LINES ?= 4 3.5
SPARK_LINE ?= 4
venv = $(if $(filter 3.5,$(1)),.venv-spark35,.venv)

.PHONY: env env35 env-mosaic demo test bench soak horovod-suite docs mutants clean
env:
	@bash scripts/setup_env.sh 4

env35:
	@bash scripts/setup_env.sh 3.5

demo:
	@bash scripts/setup_env.sh $(SPARK_LINE) --no-horovod
	$(call venv,$(SPARK_LINE))/bin/python -m spark_dist.cli.demo

# Both lines run at once (scripts/test_lines.sh), each output line prefixed with its Spark line.
test:
	@for line in $(LINES); do bash scripts/setup_env.sh $$line || exit 1; done
	@bash scripts/test_lines.sh $(LINES)

BENCHES := launch connect data scaling steady horovod ml history recovery rendezvous images inference checkpoints \
  elastic tune step_clock driver_scale
bench:
	@for line in $(LINES); do bash scripts/setup_env.sh $$line || exit 1; done
	@for line in $(LINES); do for b in $(BENCHES); do \
	  $(MAKE) --no-print-directory bench-$$b SPARK_LINE=$$line || exit 1; done; done
	$(call venv,$(SPARK_LINE))/bin/python bench/report.py --out BENCHMARKS.md

# The fault campaign, long: FAULTS faults drawn from SEED on each line (tests/chaos, bench/bench_chaos.py), on
# local[2], (CLUSTER=standalone) a standalone cluster of two workers it starts, (CLUSTER=connect, Spark 4) a
# Connect server in front of local[2], or (CLUSTER=two_hosts, root) the
# two-host cluster of tests/two_hosts.py; its figures go to bench/results/chaos[-<cluster>]-spark<line>.json and
# BENCHMARKS.md. A violation prints the seed to rerun.
SEED ?= 1
FAULTS ?= 200
CLUSTER ?= local
soak:
	@for line in $(LINES); do bash scripts/setup_env.sh $$line || exit 1; done
	@rc=0; suffix=$$([ "$(CLUSTER)" != local ] && echo -$(CLUSTER)); \
	for line in $(LINES); do venv=.venv; [ "$$line" = 3.5 ] && venv=.venv-spark35; \
	  $$venv/bin/python bench/bench_chaos.py --seed $(SEED) --faults $(FAULTS) --cluster $(CLUSTER) \
	    --out bench/results/chaos$$suffix-spark$$line.json || rc=1; done; \
	$(call venv,$(SPARK_LINE))/bin/python bench/report.py --out BENCHMARKS.md; exit $$rc

# Horovod 0.28.1's own test_torch.py and PyTorch examples against spark_dist.horovod and Horovod itself (a
# minute; not in `make test`, whose budget it would pass): tests/unit/test_horovod_own_suite.py.
horovod-suite:
	@bash scripts/setup_env.sh 3.5
	SPARK_DIST_HOROVOD_SUITE=1 .venv-spark35/bin/python -m pytest -q tests/unit/test_horovod_own_suite.py

bench-%:
	@bash scripts/setup_env.sh $(SPARK_LINE)
	$(call venv,$(SPARK_LINE))/bin/python bench/bench_$*.py --out bench/results/$*-spark$(SPARK_LINE).json

# Mosaic Streaming for bench_images.py, in an environment of its own: mosaicml-streaming 0.13 wants numpy < 2.2,
# transformers < 5 and torchvision, which neither line's pins allow. torch is the CPU build, named with its
# local version so that pip can never take a CUDA one; torchvision and Mosaic come without their dependencies
# (PyPI's torchvision would pull torch again; Mosaic's cloud clients are not needed to read local shards).
MOSAIC_DEPS := torch==2.13.0+cpu numpy==2.1.3 pillow==13.0.0 pyarrow==26.0.1 transformers==4.57.6 xxhash==3.8.2 \
  zstd==1.5.7.2 python-snappy==0.7.3 Brotli==1.2.1 catalogue==2.0.10
MOSAIC_NO_DEPS := mosaicml-streaming==0.13.0 torchvision==0.28.0
bench-images: env-mosaic
env-mosaic:
	@if [ "$$(cat .venv-mosaic/.stamp 2>/dev/null)" != "$(MOSAIC_DEPS) $(MOSAIC_NO_DEPS)" ]; then \
	  echo "setup: building .venv-mosaic (Mosaic Streaming, for bench_images.py)"; \
	  python3 -m venv .venv-mosaic && \
	  .venv-mosaic/bin/python -m pip install -q --disable-pip-version-check $(MOSAIC_DEPS) && \
	  .venv-mosaic/bin/python -m pip install -q --disable-pip-version-check --no-deps $(MOSAIC_NO_DEPS) && \
	  echo "$(MOSAIC_DEPS) $(MOSAIC_NO_DEPS)" > .venv-mosaic/.stamp; fi

# The notebooks (notebooks/01_... to 05_...) in Jupyter, on a kernel of the SPARK_LINE's environment: the kernel
# is registered for your user as "spark_dist (Spark 4)" (or 3.5), so any Jupyter can pick it. Jupyter itself is
# not in the pinned environments; when the environment has JupyterLab, it starts here on loopback.
docs:
	@bash scripts/setup_env.sh $(SPARK_LINE)
	@echo "JupyterLab on 127.0.0.1 with this line's environment as its kernel; open the URL it prints"
	$(call venv,$(SPARK_LINE))/bin/python -m jupyter lab notebooks/ --ip 127.0.0.1 --no-browser

# Mutation score of the unit tests (BENCHMARKS.md): mutmut, a dev tool installed here on demand (no lock has it),
# mutates the modules of setup.cfg's [mutmut] only_mutate, or MUTATE="spark_dist/a.py ..." (some of those) alone,
# runs their unit tests (setup.cfg's selection) against each mutant in mutants/, and prints killed/total per module
# with every mutant left alive (`.venv/bin/mutmut show NAME` shows one). Afresh each time: mutmut would keep an old
# verdict when only the tests changed. A mutant whose tests hang (mutmut's "timeout") counts as killed. Low
# priority: it shares the machine.
MUTMUT := mutmut==3.8.1
MUTATE ?=
mutant_modules = $(foreach m,$(MUTATE),$(subst /,.,$(m:.py=)))
mutants:
	@bash scripts/setup_env.sh 4
	@.venv/bin/python -m pip install -q --disable-pip-version-check $(MUTMUT)
	rm -rf mutants
	nice -n 10 .venv/bin/mutmut run $(foreach m,$(mutant_modules),'$(m).*')
	@.venv/bin/mutmut results --all true | awk -F': ' -v only='$(mutant_modules)' \
	  'BEGIN { n = split(only, names, " ") } \
	  { name = $$1; sub(/^ +/, "", name); module = name; sub(/\.[^.]*$$/, "", module); total[module]++; \
	    if ($$2 == "killed" || $$2 == "timeout") killed[module]++; \
	    else left[module] = left[module] "\n  " $$2 ": " name } \
	  END { if (!n) for (m in total) names[++n] = m; \
	    for (i = 1; i <= n; i++) { m = names[i]; if (!total[m]) { print m ": no mutants"; continue } \
	      printf "%s: %d of %d mutants killed (%.0f%%)%s\n", m, killed[m], total[m], \
	        100 * killed[m] / total[m], left[m] } }'

clean:
	rm -rf .venv .venv-spark35 .venv-mosaic build *.egg-info mutants
