# One command per gate. `make install` creates .venv; every other target installs first if needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= localhost/epick:$(VERSION)

.PHONY: install test lint format bench demo image image-test clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# xds-protos ships its own copy of opentelemetry/proto/*_pb2.py, older than opentelemetry-proto's,
	# and whichever is installed last wins the files: the OTLP exporter needs opentelemetry-proto's.
	$(BIN)/pip install --quiet --force-reinstall --no-deps 'opentelemetry-proto==1.45.2'
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples scripts/upstream-inventory scripts/lock-image
	$(BIN)/ruff format --check src tests benchmarks examples scripts/upstream-inventory scripts/lock-image
	$(BIN)/mypy src scripts/upstream-inventory

format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks examples
	$(BIN)/ruff check --fix src tests benchmarks examples

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_schedule.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_service.py
	$(BIN)/python benchmarks/bench_simulate.py
	$(BIN)/python benchmarks/bench_flowcontrol.py
	$(BIN)/python benchmarks/bench_precise.py
	$(BIN)/python benchmarks/bench_workers.py
	$(BIN)/python benchmarks/bench_replicas.py --quick
	$(BIN)/python benchmarks/bench_scrapes.py --quick
	$(BIN)/python benchmarks/bench_idle.py --quick
	$(BIN)/python benchmarks/bench_sweep.py --quick
	$(BIN)/python benchmarks/bench_watch.py --quick
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python benchmarks/bench_dataplane.py
	$(BIN)/python benchmarks/bench_scaling.py --quick
	$(BIN)/python benchmarks/bench_http_stacks.py --quick
	$(BIN)/python benchmarks/bench_grpc_servers.py --quick
	$(BIN)/python benchmarks/bench_streamed.py --quick
	$(BIN)/python benchmarks/bench_predictor.py --quick

# The image (Containerfile) with podman, and build/image/epick-$(VERSION).oci.tar; image/build says how.
image:
	image/build $(IMAGE)

# The image run as a cluster and as a standalone service run it (tests/image/test_image.py).
image-test: $(STAMP) image
	EPICK_IMAGE=$(IMAGE) $(BIN)/pytest -p no:cacheprovider tests/image

demo: $(STAMP)
	$(BIN)/epick demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
