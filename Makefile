# vipkit: `make test` works on a fresh Debian machine by itself: it installs
# the system packages the tests need when they are missing, then runs every
# test with the race detector.

GO ?= go
TESTFLAGS ?=

.PHONY: test deps demo lint

deps:
	@bash scripts/deps.sh

test: deps
	$(GO) test -race -timeout 75m $(TESTFLAGS) ./...

demo:
	$(GO) run ./cmd/tsng demo

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet ./...
	@command -v staticcheck >/dev/null 2>&1 || GOFLAGS= $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" staticcheck ./...
