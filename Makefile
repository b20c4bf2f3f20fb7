# The README's commands. Each sets up the environment it uses first (idempotent: a stamp skips it).
# Two Spark lines: 4 (the default, .venv) and 3.5 (.venv-spark35). `make test` runs the suite on both;
# LINES=4 (or LINES=3.5) picks one, for test and bench; SPARK_LINE=3.5 runs the demo on the 3.5 line.
export SPARK_LOCAL_IP := 127.0.0.1
LINES ?= 4 3.5
SPARK_LINE ?= 4
venv = $(if $(filter 3.5,$(1)),.venv-spark35,.venv)

.PHONY: env env35 demo test bench docs clean
env:
	@bash scripts/setup_env.sh 4

env35:
	@bash scripts/setup_env.sh 3.5

demo:
	@bash scripts/setup_env.sh $(SPARK_LINE)
	$(call venv,$(SPARK_LINE))/bin/python -m spark_dist.cli.demo

# Both lines run at once (scripts/test_lines.sh), each output line prefixed with its Spark line.
test:
	@for line in $(LINES); do bash scripts/setup_env.sh $$line || exit 1; done
	@bash scripts/test_lines.sh $(LINES)

BENCHES := launch connect data scaling steady horovod ml history recovery rendezvous
bench:
	@for line in $(LINES); do bash scripts/setup_env.sh $$line || exit 1; done
	@for line in $(LINES); do for b in $(BENCHES); do \
	  $(MAKE) --no-print-directory bench-$$b SPARK_LINE=$$line || exit 1; done; done
	$(call venv,$(SPARK_LINE))/bin/python bench/report.py --out BENCHMARKS.md

bench-%:
	@bash scripts/setup_env.sh $(SPARK_LINE)
	$(call venv,$(SPARK_LINE))/bin/python bench/bench_$*.py --out bench/results/$*-spark$(SPARK_LINE).json

# The notebooks (notebooks/01_... to 05_...) in Jupyter, on a kernel of the SPARK_LINE's environment: the kernel
# is registered for your user as "spark_dist (Spark 4)" (or 3.5), so any Jupyter can pick it. Jupyter itself is
# not in the pinned environments; when the environment has JupyterLab, it starts here on loopback.
docs:
	@bash scripts/setup_env.sh $(SPARK_LINE)
	@echo "JupyterLab on 127.0.0.1 with this line's environment as its kernel; open the URL it prints"
	$(call venv,$(SPARK_LINE))/bin/python -m jupyter lab notebooks/ --ip 127.0.0.1 --no-browser

clean:
	rm -rf .venv .venv-spark35 build *.egg-info
