# marsh-mcp: the two set-up commands are `make demo` and `make test`.
CARGO     ?= cargo
PREFIX    ?= $(HOME)/.marsh-dev
DEMO_DIR  ?= /tmp/marsh-mcp-demo-$(shell id -u)
BENCH_DIR ?= /tmp/marsh-mcp-bench-peers-$(shell id -u)
PY_VENV   := target/py-venv
# The peers `make bench-peers` measures against: Python ones in their own venv
# (mcp-yieldshell unsandboxed, hares with bubblewrap per call), npm ones under
# target/peers-npm (the Codex shell tool server and the Codex CLI of the same version,
# whose executable is its `codex-linux-sandbox`).
PEERS_VENV := target/peers-venv
PEER_PY   := mcp-yieldshell==1.1.2 hares==0.5.2
PEERS_NPM := target/peers-npm
PEER_NPM  := @openai/codex-shell-tool-mcp@0.97.0 @openai/codex@0.97.0
CODEX_SANDBOX := $(PEERS_NPM)/node_modules/@openai/codex/vendor/x86_64-unknown-linux-musl/codex/codex
MCP_PY    := mcp==2.3.0
BINS      := marsh-mcp marsh marshd sbx
# What ships (`make build`, `install`, `bench-peers`) is statically linked (glibc,
# static-pie): every `marsh -c` of a run, and every `serve` start, then skips the
# dynamic loader (0.5-0.7 ms of each `marsh` process, measured). `--target` keeps the
# flag off build scripts and proc macros, which cannot be static. (Expanded only where
# used: the prerequisite check must run before anything, rustc included, is needed.)
HOST_TRIPLE = $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
RELEASE   = target/$(HOST_TRIPLE)/release
# The test hooks (invocation log, failure/delay markers, SBX_SHIM_FAIL): only the test
# build has them. `make build-debug` first builds what ships and keeps a copy in
# target/shipped (the demo runs it; a test proves it ignores the hooks), then the same
# binaries with the hooks in target/debug for the black-box suites.
# (One cargo call per crate: with --workspace, `--features crate/feature` would name
# the crates' self dev-dependencies, which a bins build does not activate.)
HOOKED    := marsh-linux-backend sbx-stand-in
SHIPPED   := target/shipped
NPM_DIR   := target/npm-clients
# The real clients the installer tests drive (offline, no login), and the MCP Inspector
# CLI the black-box protocol test drives (`mcp-inspector --cli`, no browser, no ports).
NPM_PKGS  := @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.332 @modelcontextprotocol/inspector@2.12.0
# Reinstalled whenever NPM_PKGS changes (the stamp records the list) or a binary is missing.
NPM_STAMP := $(NPM_DIR)/.installed
NPM_BINS  := codex claude mcp-inspector

.PHONY: all build build-debug build-debuginfo install dev test lint unit demo bench bench-peers fuzz chaos py-client npm-clients prereqs clean

all: build

## build: optimized, statically linked binaries (marsh-mcp and the stand-ins marsh,
## marshd, sbx) in target/<host triple>/release
build:
	$(if $(HOST_TRIPLE),,$(error cannot read the host triple from `rustc -vV`: is rustc on PATH?))
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --release --workspace --bins --target $(HOST_TRIPLE)

build-debug:
	$(CARGO) build --workspace --bins
	install -d $(SHIPPED)
	for b in $(BINS); do install -m 0755 target/debug/$$b $(SHIPPED)/$$b; done
	for c in $(HOOKED); do $(CARGO) build -p $$c --bins --features test-hooks || exit 1; done

## build-debuginfo: the release code with line tables (target/release-debug), for backtraces
## with file:line; `make build` ships without debug info
build-debuginfo:
	$(CARGO) build --profile release-debug --workspace --bins

## prereqs: before anything is built for `make demo`/`make test` (and bench-peers), check for
## bubblewrap, python3 with venv and (test) npm; as root install the missing ones with
## apt-get, otherwise stop with the command to run
demo: PREREQS_FOR := demo
test bench-peers: PREREQS_FOR := test
prereqs:
	@$(SHELL) tests/prereqs.sh $(PREREQS_FOR)

# Every step of those goals waits for the check, also under `make -j`.
lint build build-debug $(PY_VENV)/bin/python $(NPM_STAMP) $(PEERS_VENV)/bin/mcp-yieldshell $(PEERS_VENV)/bin/hares-mcp $(PEERS_NPM)/codex-linux-sandbox: | prereqs

## install: copy the release binaries into $(PREFIX)/bin (owner-only writable)
install: build
	install -d -m 0755 $(PREFIX)/bin
	for b in $(BINS); do install -m 0755 $(RELEASE)/$$b $(PREFIX)/bin/$$b; done

## dev: incremental build + install into ~/.marsh-dev
dev: install

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --bins -- -D warnings

## fuzz: the seeded, structure-aware protocol fuzzer against `serve` and `connect`
## (tests/fuzz/main.rs): FUZZ_SECONDS per target (here 60; `make test` runs it for 10),
## FUZZ_SEED to replay a printed seed
fuzz: build-debug
	FUZZ_SECONDS=$${FUZZ_SECONDS:-60} $(CARGO) test -p marsh-tests --test fuzz

## chaos: seeded fault injection (tests/chaos/main.rs): SIGKILL of the broker, a marsh,
## a marshd or a proxy during scope lifecycle work, then every scope back to rest by
## tool calls; CHAOS_ROUNDS (here 20; `make test` runs 4), CHAOS_SEED to replay
chaos: build-debug
	CHAOS_ROUNDS=$${CHAOS_ROUNDS:-20} $(CARGO) test -p marsh-tests --test chaos

## test: lint, unit tests, the black-box suites (they need the built binaries), and a
## check that every test contract/CONTRACT.md names exists
test: lint build-debug py-client npm-clients
	$(CARGO) test --workspace --no-fail-fast
	if [ "$$(id -u)" = 0 ]; then $(CARGO) test -p marsh-scope-registry --lib -- --ignored; fi
	python3 tests/contract_names.py $(CARGO)

$(PY_VENV)/bin/python:
	python3 -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet --disable-pip-version-check '$(MCP_PY)'

py-client: $(PY_VENV)/bin/python

# FORCE makes the recipe run every time; it reinstalls only when the recorded package list
# differs from NPM_PKGS or one of NPM_BINS is missing, so an existing target/npm-clients
# picks up a newly added or re-pinned package.
$(NPM_STAMP): FORCE
	@if [ "$$(cat $@ 2>/dev/null)" != "$(NPM_PKGS)" ] || \
	    ! (cd $(NPM_DIR)/node_modules/.bin 2>/dev/null && for b in $(NPM_BINS); do [ -x "$$b" ] || exit 1; done); then \
	  echo "npm install --prefix $(NPM_DIR) $(NPM_PKGS)"; \
	  npm install --silent --no-audit --no-fund --save-exact --prefix $(NPM_DIR) $(NPM_PKGS) && \
	  (cd $(NPM_DIR)/node_modules/.bin && for b in $(NPM_BINS); do [ -x "$$b" ] || { echo "npm installed no $$b" >&2; exit 1; }; done) && \
	  printf '%s\n' "$(NPM_PKGS)" > $@; \
	fi

npm-clients: $(NPM_STAMP)

FORCE:

## demo: build, install into a private prefix, run a real MCP client session
demo: build-debug py-client
	rm -rf $(DEMO_DIR)
	install -d -m 0700 $(DEMO_DIR) $(DEMO_DIR)/workspace
	install -d -m 0755 $(DEMO_DIR)/prefix $(DEMO_DIR)/prefix/bin
	for b in $(BINS); do install -m 0755 $(SHIPPED)/$$b $(DEMO_DIR)/prefix/bin/$$b; done
	printf 'hello from the demo workspace\n' > $(DEMO_DIR)/workspace/README.txt
	$(PY_VENV)/bin/python tests/clients/demo.py $(DEMO_DIR)/prefix/bin $(DEMO_DIR)/workspace $(DEMO_DIR)/root
	@for p in $(DEMO_DIR)/root/*/daemon/pid $(DEMO_DIR)/home/daemon/pid; do [ -f "$$p" ] && kill $$(cat "$$p") 2>/dev/null; done; true

## bench: figures printed, not asserted
bench:
	$(CARGO) build --release --workspace --bins
	$(CARGO) bench -p marsh-tests --bench serve --bench broker

$(PEERS_VENV)/bin/mcp-yieldshell $(PEERS_VENV)/bin/hares-mcp:
	python3 -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install --quiet --disable-pip-version-check $(PEER_PY)

$(PEERS_NPM)/codex-linux-sandbox:
	npm install --silent --no-audit --no-fund --save-exact --prefix $(PEERS_NPM) $(PEER_NPM)
	ln -sf $(abspath $(CODEX_SANDBOX)) $@

## bench-peers: marsh-mcp against the Codex shell tool server, mcp-yieldshell and hares,
## interleaved with one raw client (figures, not asserted)
bench-peers: build py-client $(PEERS_VENV)/bin/mcp-yieldshell $(PEERS_VENV)/bin/hares-mcp $(PEERS_NPM)/codex-linux-sandbox
	rm -rf $(BENCH_DIR)
	install -d -m 0700 $(BENCH_DIR) $(BENCH_DIR)/work
	install -d -m 0755 $(BENCH_DIR)/prefix $(BENCH_DIR)/prefix/bin
	for b in $(BINS); do install -m 0755 $(RELEASE)/$$b $(BENCH_DIR)/prefix/bin/$$b; done
	$(PY_VENV)/bin/python tests/clients/bench_peers.py $(BENCH_DIR)/prefix/bin $(PEERS_VENV)/bin/mcp-yieldshell $(BENCH_DIR)/work \
	  --codex-mcp $(PEERS_NPM)/node_modules/.bin/codex-shell-tool-mcp --codex-sandbox $(PEERS_NPM)/codex-linux-sandbox \
	  --hares $(PEERS_VENV)/bin/hares-mcp

clean:
	$(CARGO) clean
	rm -rf $(DEMO_DIR)
