# xlb — see README.md. Every target installs the Debian packages it needs first.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: test lint deps

deps:
	bash scripts/install-deps.sh test

## The whole test suite (CI runs this as root: namespace tests run for real).
test: deps lint
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: demo build-release
build-release:
	bash scripts/install-deps.sh demo
	$(CARGO) build --release -p xlb

## The main job: real traffic through xlb on the namespace testbed (needs root).
demo: build-release
	bash deploy/demo.sh
