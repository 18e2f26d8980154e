# tokenguard — see README.md.
GO        ?= go
PKGS      := ./...
STATICCHECK := $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2
# Tests use TEST_DATABASE_URL when it is set, otherwise dockertest.

.PHONY: build test test-short lint migrate bench

build:
	@mkdir -p bin
	$(GO) build -o bin/ ./cmd/...

# All tests, with the race detector, against a real Postgres.
test:
	$(GO) test -race -count=1 -timeout 8m $(PKGS)

# Unit tests only (no database).
test-short:
	$(GO) test -short -count=1 $(PKGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)

# Applies the migrations to DATABASE_URL.
migrate: build
	./bin/tokenctl migrate

# The performance figures, measured side by side in one run, then the table
# of ratios against the targets (cmd/benchreport). Run on a quiet machine.
BENCH ?= TokenHot|RefreshStorm|ProactiveRefresh|CacheMemory|Invalidate
bench:
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem -timeout 30m ./usecase/ | tee bench.out
	$(GO) run ./cmd/benchreport < bench.out

# One command, a fresh machine: the sandbox provider, a fresh database, and
# server, worker and batch as separate processes under load (README.md).
# DEMO_FLAGS: --duration 30s --token-lifetime 3s --skew 1s
.PHONY: demo
demo: build
	./bin/demo $(DEMO_FLAGS)
