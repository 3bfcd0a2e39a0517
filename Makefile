# Targets named in the README. Each one sets up what it needs first.
PY := .venv/bin/python
# Python's own bytecode cache, even where the environment turns it off: without it
# every agent, runner and CLI a test starts compiles edgeplex from source, and
# pytest rewrites every test module's asserts anew (collection 10 s against 4).
unexport PYTHONDONTWRITEBYTECODE
DEMO_REPO ?= .cache/demo-repo

.PHONY: setup test lint proto demo bench bench-profile bench-overcommit bench-variants bench-control-plane bench-fuzz compose-rig clean

setup:
	./scripts/setup.sh

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) scripts/typecheck.py

# The compose rig beside lint: both are their own (the rig mostly waits on Docker, lint
# times nothing), and the rig's engine is stopped again before any other test looks
# for one. Then four at a time, each test file on one worker (its module fixtures set
# up once), the longest first (tests/conftest.py, LONGEST_FIRST); then the tests that
# measure time or hold fixed ports, alone.
test: setup
	@mkdir -p .cache
	@$(PY) -m pytest -q -m compose >.cache/compose-test.log 2>&1 & rig=$$!; \
	$(MAKE) --no-print-directory lint; linted=$$?; \
	wait $$rig; rigged=$$?; \
	echo "$(PY) -m pytest -q -m compose"; cat .cache/compose-test.log; \
	[ $$linted -eq 0 ] && [ $$rigged -eq 0 ]
	$(PY) -m pytest -q -n 4 --dist loadfile --no-loadscope-reorder -m 'not compose and not serial'
	$(PY) -m pytest -q -m serial

proto: setup
	$(PY) scripts/gen_proto.py

demo: setup
	@[ -f $(DEMO_REPO)/.edgeplex-demo ] || .venv/bin/edgeplex demo-repo $(DEMO_REPO)
	.venv/bin/edgeplex agent --model-repo $(DEMO_REPO) --grpc-port 8001 --http-port 8000

bench:
	EDGEPLEX_SETUP_BENCH=1 ./scripts/setup.sh
	@[ -f $(DEMO_REPO)/.edgeplex-demo ] || .venv/bin/edgeplex demo-repo $(DEMO_REPO)
	$(PY) bench/agent_overhead.py --repo $(DEMO_REPO)

# Where the agent's time goes: py-spy per-function tables of the agent and a runner
# under each workload, written to .cache/profile/<workload>/.
bench-profile:
	EDGEPLEX_SETUP_BENCH=1 ./scripts/setup.sh
	for w in http-binary http-json grpc; do \
		$(PY) bench/profile_agent.py --workload $$w --out .cache/profile/$$w || exit 1; \
	done

bench-variants: setup
	$(PY) bench/variants_density.py

bench-overcommit: setup
	$(PY) bench/swap_in.py
	$(PY) bench/density.py --factor 4 --budget 128MiB
	$(PY) bench/density.py --factor 10 --budget 128MiB
	$(PY) bench/density_closed_loop.py

bench-fuzz: setup
	$(PY) bench/fuzz.py

bench-control-plane: setup
	$(PY) bench/placement_speed.py
	$(PY) bench/placement_quality.py
	$(PY) bench/report_ingest.py

# Builds the images (no registry), brings up the 3-region compose rig, runs its
# smoke test and takes everything down (scripts/compose_rig.py; root, apt).
compose-rig: setup
	$(PY) scripts/compose_rig.py

clean:
	rm -rf .venv .cache build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
