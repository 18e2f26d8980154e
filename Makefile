# tokenguard — see README.md.
# Two modules: the library (this directory) and its tools (tools/: the
# demo, the sandbox command, the soak, the benchmarks and their report,
# the scale bench, the conformance servers and the end-to-end suite), a
# module of their own so that their dependencies stay out of the
# library's. The targets below run on both.
GO        ?= go
PKGS      := ./...
TOOLS     := tools
STATICCHECK := $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOVULNCHECK := $(GO) run golang.org/x/vuln/cmd/govulncheck@v1.9.0
# Vulnerability database (a URL, or file:///dir for an offline mirror).
GOVULNDB    ?= https://vuln.go.dev
# VULNCHECK_REQUIRED=1: fail, instead of skipping, when GOVULNDB is unreachable.
VULNCHECK_REQUIRED ?=
# Tests find their Postgres server as the demo does (internal/pgserver):
# TEST_DATABASE_URL, else dockertest, else 127.0.0.1:5432 (user postgres,
# trust), else a throw-away cluster made with the local initdb (Debian:
# apt-get install postgresql). TESTDB_SKIP=env,docker,local skips steps.

.PHONY: build test test-short lint vulncheck migrate bench

build:
	@mkdir -p bin
	$(GO) build -o bin/ ./cmd/...
	cd $(TOOLS) && $(GO) build -o ../bin/ ./cmd/...

# All tests, with the race detector, against a real Postgres found as
# above; each test creates and drops a database of its own. The library's,
# then the tools'; both always run, and either failing fails the target.
test: conformance-deps
	@status=0; \
	echo "$(GO) test -race -count=1 -timeout 8m $(PKGS)"; \
	$(GO) test -race -count=1 -timeout 8m $(PKGS) || status=1; \
	echo "cd $(TOOLS) && $(GO) test -race -count=1 -timeout 16m $(PKGS)"; \
	(cd $(TOOLS) && $(GO) test -race -count=1 -timeout 16m $(PKGS)) || status=1; \
	exit $$status

# The conformance matrix against independent OAuth2 servers
# (tools/internal/conformance), alone; CONFORMANCE_MATRIX_OUT=file also
# writes the table to file.
.PHONY: conformance
conformance: conformance-deps
	cd $(TOOLS) && $(GO) test -race -count=1 -run '^TestConformance$$' -v ./internal/conformance/

# The oidc-provider server the conformance suite runs as a separate
# process: its npm dependencies, pinned by package-lock.json, installed
# once (tests never download anything).
OIDC_PROVIDER_DIR := $(TOOLS)/internal/conformance/oidcprovider
OIDC_DPOP_DIR := $(TOOLS)/internal/conformance/oidcdpop
.PHONY: conformance-deps
conformance-deps: $(OIDC_PROVIDER_DIR)/node_modules $(OIDC_DPOP_DIR)/node_modules
$(OIDC_PROVIDER_DIR)/node_modules:
	cd $(OIDC_PROVIDER_DIR) && npm ci --no-audit --no-fund
# oidc-provider's current major, requiring DPoP (sender-constrained grants).
$(OIDC_DPOP_DIR)/node_modules:
	cd $(OIDC_DPOP_DIR) && npm ci --no-audit --no-fund

# Unit tests only (no database).
test-short:
	$(GO) test -short -count=1 $(PKGS)
	cd $(TOOLS) && $(GO) test -short -count=1 $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd $(TOOLS) && $(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)
	cd $(TOOLS) && $(STATICCHECK) $(PKGS)
	@$(MAKE) --no-print-directory vulncheck

# govulncheck against GOVULNDB, on the library's module and on the tools'.
# Known vulnerabilities in code we call fail it. Only when the database
# cannot be fetched (no network) is it skipped, loudly, unless
# VULNCHECK_REQUIRED is set.
vulncheck:
	@for m in . $(TOOLS); do \
	echo "cd $$m && $(GOVULNCHECK) -db $(GOVULNDB) $(PKGS)"; \
	out=$$(cd $$m && $(GOVULNCHECK) -db $(GOVULNDB) $(PKGS) 2>&1); rc=$$?; \
	if [ $$rc -ne 0 ] && printf '%s\n' "$$out" | grep -q '^govulncheck: fetching vulnerabilities'; then \
		printf '%s\n' "$$out" | grep '^govulncheck: fetching vulnerabilities' >&2; \
		if [ -n "$(VULNCHECK_REQUIRED)" ]; then \
			echo "govulncheck: vulnerability database $(GOVULNDB) unreachable, and VULNCHECK_REQUIRED is set" >&2; exit 1; \
		fi; \
		echo "govulncheck: vulnerability database $(GOVULNDB) unreachable, SKIPPED (not checked)" >&2; exit 0; \
	fi; \
	printf '%s\n' "$$out"; [ $$rc -eq 0 ] || exit $$rc; \
	done

# Applies the migrations to DATABASE_URL.
migrate: build
	./bin/tokenctl migrate

# The performance figures, measured side by side in one run, then the table
# of ratios against the targets and the peer designs' table (tools/bench,
# tools/cmd/benchreport, docs/benchmarks.md). Run on a quiet machine. The
# storm runs in STORM_BATCHES batches of STORMS storms; its figures are the
# medians over the batches. The Nango-style peer needs Redis at
# TEST_REDIS_ADDR (default 127.0.0.1:6379).
# The standby's cost runs the storm on two throw-away clusters of its own
# (initdb, pg_basebackup: a lone server and a primary with a synchronous
# standby), STANDBY_STORMS storms on each per batch, alternating, in
# STANDBY_BATCHES batches; without initdb it is skipped, saying so. The
# mass expiry's time is the median of MASS_EXPIRIES expiries.
BENCH ?= TokenHot|ProactiveRefresh|CacheMemory|Invalidate|ConnectionTime
MASS_EXPIRIES ?= 3
STORMS ?= 10
STORM_BATCHES ?= 5
STANDBY_STORMS ?= 15
STANDBY_BATCHES ?= 3
bench:
	(cd $(TOOLS) && $(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -timeout 30m ./bench/) | tee bench.out
	(cd $(TOOLS) && $(GO) test -run '^$$' -bench '^BenchmarkMassExpiry$$' -benchtime $(MASS_EXPIRIES)x -timeout 10m ./bench/) | tee -a bench.out
	(cd $(TOOLS) && $(GO) test -run '^$$' -bench '^BenchmarkRefreshStorm$$' -benchtime $(STORMS)x -count $(STORM_BATCHES) -timeout 30m ./bench/) | tee -a bench.out
	(cd $(TOOLS) && $(GO) test -run '^$$' -bench '^BenchmarkRefreshStormStandby$$' -benchtime $(STANDBY_STORMS)x -count $(STANDBY_BATCHES) -timeout 10m ./bench/) | tee -a bench.out
	(cd $(TOOLS) && $(GO) test -run '^$$' -bench '^BenchmarkTokenBudget$$' -benchtime 1x -timeout 10m ./bench/) | tee -a bench.out
	$(GO) test -run '^$$' -bench 'AtRate$$|ConnectionsListing$$' -count 3 -timeout 15m ./infra/httpapi/ | tee -a bench.out
	cd $(TOOLS) && $(GO) run ./cmd/benchreport < ../bench.out

# The fleet benchmark (tools/internal/scalebench, docs/scaling.md): 1,000,000
# connections seeded by COPY, 8 app processes with a bounded and an
# unbounded token cache side by side. Postgres: DATABASE_URL (a server on
# which databases may be created), else found as for the tests. Fails when
# a process with TOKEN_CACHE_SIZE=1000 exceeds SCALE_RSS_BOUND_MB after
# touching 50,000 connections. Run it on a quiet machine.
SCALE_FLAGS ?= -sizes 1000,1000000 -caches 1000,10000000 -procs 8 -working-set 50000 -rate 200 \
	-wave 3000 -lifetime 30s -run 60s -provider-latency 50ms -sweep-concurrency 8
SCALE_RSS_BOUND_MB ?= 64
.PHONY: bench-scale
bench-scale:
	@mkdir -p bin
	cd $(TOOLS) && $(GO) build -o ../bin/benchscale ./cmd/benchscale
	./bin/benchscale $(SCALE_FLAGS) -rss-bound-mb $(SCALE_RSS_BOUND_MB) -bounded-max 1000 | tee bench-scale.out

# One command, a fresh machine: two sandbox providers (one of them stored
# with tokenctl provider add), a fresh database (on DATABASE_URL, else
# found as for the tests), and server, worker and batch as separate
# processes under load (README.md).
# DEMO_FLAGS: --duration 30s --token-lifetime 3s --stored-token-lifetime 6s --skew 1s
.PHONY: demo
demo: build
	./bin/demo $(DEMO_FLAGS)

# Renders demo-out/report.html (written by make demo) to demo-out/report.png
# with headless Chromium (Debian: apt-get install chromium), offline: the
# page is self-contained, and Chromium's own background traffic is off.
CHROMIUM ?= chromium
.PHONY: demo-screenshot
demo-screenshot:
	@test -f demo-out/report.html || { echo "demo-out/report.html is missing: run make demo first"; exit 1; }
	@command -v $(CHROMIUM) >/dev/null || { echo "$(CHROMIUM) not found: apt-get install chromium"; exit 1; }
	profile=$$(mktemp -d) && trap 'rm -rf "$$profile"' EXIT && \
	$(CHROMIUM) --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
		--disable-background-networking --disable-component-update --disable-sync \
		--user-data-dir="$$profile" --hide-scrollbars --window-size=1400,900 \
		--screenshot="$(CURDIR)/demo-out/report.png" "file://$(CURDIR)/demo-out/report.html"
	@test -s demo-out/report.png && echo "wrote demo-out/report.png"

# Renders the operator console (GET /console) to docs/console-*.png: the
# console's browser test (tools/cmd/e2e TestConsoleInBrowser) runs the server
# against the sandbox, drives headless Chromium through the pages and saves
# each one. Offline: the console loads nothing but its own stylesheet.
.PHONY: console-screenshot
console-screenshot:
	@command -v $(CHROMIUM) >/dev/null || { echo "$(CHROMIUM) not found: apt-get install chromium"; exit 1; }
	cd $(TOOLS) && CHROMIUM=$(CHROMIUM) CONSOLE_SCREENSHOTS=$(CURDIR)/docs $(GO) test -count=1 -run '^TestConsole(InBrowser|RulesInBrowser)$$' -v ./cmd/e2e/
	@ls docs/console-*.png

# Server, worker and batch as processes under load, against the sandbox
# provider with 4 s tokens, on a throw-away Postgres cluster (local
# initdb), while faults are injected at random: a slow, failing or hanging
# provider, ended database sessions, kill -9 of the apps, Postgres
# restarts, a stalled LISTEN session. Prints the invariant table
# (docs/operations.md, "Soak"), writes soak-out/report.json, and fails
# when an invariant does. SOAK_FLAGS: --seed N --fault-gap 8s
# SOAK_FAILOVER=1 runs the failover soak instead (soak-failover).
SOAK_DURATION ?= 10m
SOAK_FAILOVER ?=
.PHONY: soak
soak: build
ifneq ($(SOAK_FAILOVER),)
	@$(MAKE) --no-print-directory soak-failover
else
	./bin/soak --duration $(SOAK_DURATION) $(SOAK_FLAGS)
endif

# The failover soak (docs/operations.md, "High availability"): server,
# worker and batch under load with 4 s tokens, on a throw-away primary and
# streaming standby (initdb, pg_basebackup -R) behind a DSN naming both
# with target_session_attrs=read-write; SOAK_FAILOVERS times, at random
# moments (half of them right as a refresh answered), the replication link
# is cut, the primary stopped with -m immediate, the standby promoted and
# the old primary rebuilt as the new standby. Two runs: a synchronous
# standby (no rotation lost, no reuse, no needs_reauth) and an
# asynchronous one (every lost rotation detected and reported, as many as
# the provider's reuses). Reports in soak-out/failover-{sync,async}/.
SOAK_FAILOVERS ?= 10
.PHONY: soak-failover
soak-failover: build
	./bin/soak --failover sync --failovers $(SOAK_FAILOVERS) --out soak-out/failover-sync $(SOAK_FLAGS)
	./bin/soak --failover async --failovers $(SOAK_FAILOVERS) --out soak-out/failover-async $(SOAK_FLAGS)
