GO ?= go

.PHONY: build test

build:
	$(GO) build ./...

# test is exactly what CI runs.
test:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1)
	$(GO) vet ./...
	$(GO) test -race ./...
