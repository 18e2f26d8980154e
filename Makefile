# tokenguard — see README.md.
GO        ?= go
PKGS      := ./...
DATABASE_URL      ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
TEST_DATABASE_URL ?= $(DATABASE_URL)
STATICCHECK := $(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2

export TEST_DATABASE_URL

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

migrate:
	$(GO) run ./cmd/tokenctl migrate

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)
