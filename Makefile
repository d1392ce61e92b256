GO ?= go
SHARED ?= $(abspath ../shared)
FUZZTIME ?= 20s
# Packages with cgo kernels or model code, tested again without cgo (the
# Android build uses the pure-Go kernels).
PURE_GO_PKGS = ./kernels/... ./runtime/... ./tools/...

.PHONY: build test openai-node bench bench-stream bench-spec bench-sched fuzz cross test-arm64 models cuda cuda-check cuda-build cuda-deps cuda-dev-deps debian-nonfree cuda-ptx

build:
	$(GO) build -o bin/tandem ./tools/tandem

# test is exactly what CI runs. Where npm is found it first installs the
# official OpenAI Node library for runtime/server's client test (which
# skips without it, or fails under TANDEM_REQUIRE_NODE=1 as in CI).
test:
	@if command -v npm >/dev/null; then $(MAKE) --no-print-directory openai-node || \
		echo "could not install the OpenAI Node library: TestOfficialOpenAINodeClient will skip"; fi
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1)
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	@# The slowest packages (runtime/spec, tools/tandem) take about four
	@# minutes under -race; with four busy loops on two CPUs they ran past
	@# go test's default 10-minute limit before any test failed.
	$(GO) test -race -timeout 15m ./...
	@# runtime/spec's pure-Go run went past go test's default 10 minutes in
	@# one CI run (stop 59) while a second job shared the two CPUs.
	CGO_ENABLED=0 $(GO) test -timeout 15m $(PURE_GO_PKGS)
	GOOS=android GOARCH=arm64 CGO_ENABLED=0 $(GO) build ./...
	@# A developer's Mac builds it too (the pure-Go kernels, no madvise).
	GOOS=darwin GOARCH=arm64 CGO_ENABLED=0 $(GO) build ./...

# openai-node installs the official OpenAI Node library, pinned by its
# package-lock.json, where TestOfficialOpenAINodeClient runs it (npm ci
# keeps the files' old dates: the touch marks the install done).
NODE_CLIENT = runtime/server/testdata/openai-node
openai-node: $(NODE_CLIENT)/node_modules/openai/package.json
$(NODE_CLIENT)/node_modules/openai/package.json: $(NODE_CLIENT)/package.json $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2x ./kernels/... ./weights/... ./runtime/... ./bench/...
	$(GO) run ./tools/tandem bench decode --shape tinyllama-1.1b --types q4_0,q8_0,f16 --threads 1,2

# bench-stream measures streamed decode (resident, Std, StdPL at 25/50/75%
# budgets; real disk, 400 MB/s and 1.5 GB/s) on stories260K inflated to the
# tinyllama-1.1b shape, in Q4_0 and F16, median of 3 runs of 2 tokens
# (Q4_0 took 2 minutes on the quiet 2-core machine with 5 runs, F16 12 on a
# loaded one; 2.3 GB in /tmp, removed afterwards).
STREAM_PLOTS ?= bench/results
bench-stream:
	@mkdir -p $(STREAM_PLOTS)
	$(GO) run ./tools/tandem bench stream --from $(SHARED)/models/stories260K.bin --shape tinyllama-1.1b --types q4_0,f16 --runs 3 --plots $(STREAM_PLOTS)

# bench-spec measures speculative decoding (std, stdpl, tuned sd, bild, tree
# and its ablations) with stories260K inflated to the tinyllama-1.1b shape
# as the streamed target and llama2xs as the resident draft (README,
# "Speculative decoding"): Q4_0 at 25/50% budgets from 400 MB/s, 1.5 GB/s
# and the real disk; F16 at 25% from 1.5 GB/s (its 400 MB/s cell alone
# would take a quarter of an hour). Median of 5 runs of 32 tokens each.
SPEC_PLOTS ?= bench/results
SPEC_PAIR = --from $(SHARED)/models/stories260K.bin --draft $(SHARED)/models/llama2xs_model.bin \
	--prompts $(SHARED)/testdata/stories260K.greedy.jsonl --shape tinyllama-1.1b --runs 5 --plots $(SPEC_PLOTS)
bench-spec:
	@mkdir -p $(SPEC_PLOTS)
	$(GO) run ./tools/tandem bench spec $(SPEC_PAIR) --types q4_0 --budgets 25,50 --storage 400MB/s,1.5GB/s,disk
	$(GO) run ./tools/tandem bench spec $(SPEC_PAIR) --types f16 --budgets 25 --storage 1.5GB/s

# bench-sched runs the scheduling benchmark: the real engine on
# stories260K (two 1-thread lanes) and the simulator with step costs
# measured on tinyllama-1.1b q4_0, FIFO/LUF/EDF/RT-LM/tandem at loads from
# light to overload with 0-40% adversarial prompts; it writes sched.md,
# sched.json and sched.svg to bench/results (about half an hour).
bench-sched:
	$(GO) run ./tools/tandem bench sched --model $(SHARED)/models/stories260K.gguf --out bench/results

# fuzz runs every fuzz target for FUZZTIME and stops at the first failure
# (past Go 1.26's late stop at -fuzztime: see tools/fuzzall).
fuzz:
	$(GO) run ./tools/fuzzall -go $(GO) -fuzztime $(FUZZTIME)

cross:
	GOOS=linux GOARCH=arm64 CGO_ENABLED=0 $(GO) build -o bin/tandem-linux-arm64 ./tools/tandem
	GOOS=android GOARCH=arm64 CGO_ENABLED=0 $(GO) build -o bin/tandem-android-arm64 ./tools/tandem
	GOOS=linux GOARCH=arm64 CGO_ENABLED=1 CC=aarch64-linux-gnu-gcc $(GO) build -o bin/tandem-linux-arm64-cgo ./tools/tandem

# test-arm64 runs, as arm64 binaries under qemu in -short mode, the tests
# of the packages whose code differs by architecture: the cgo NEON kernels,
# the model files (mmap, pread, fadvise) and the model and KV cache that
# run on them (parity with the reference vectors). The packages above them
# (spec, sched, server, ...) compute through these and qemu runs them 30-50
# times slower than native: CI's time goes to the native race run instead.
# Needs gcc-aarch64-linux-gnu and qemu-user-static.
QEMU ?= $(shell command -v qemu-aarch64 || command -v qemu-aarch64-static)
ARM64_PKGS = kernels weights runtime/kv runtime/model

test-arm64:
	@test -n "$(QEMU)" || (echo "qemu-aarch64 not found: apt-get install qemu-user-static"; exit 1)
	@mkdir -p bin/arm64
	@for pkg in $(ARM64_PKGS); do \
		pkg=$${pkg%/}; bin=$(CURDIR)/bin/arm64/$$(echo $$pkg | tr / _).test; \
		echo "== $$pkg (arm64)"; \
		CGO_ENABLED=1 GOARCH=arm64 CC=aarch64-linux-gnu-gcc $(GO) test -c -o $$bin ./$$pkg || exit 1; \
		(cd $$pkg && TANDEM_SHARED=$(SHARED) $(QEMU) -L /usr/aarch64-linux-gnu $$bin -test.short) || exit 1; \
	done

# mobile-check generates the gomobile bindings of mobile/ with gobind (Java
# and Objective-C) and compiles the Java, with a stand-in for Android's
# Context and a class calling the API as the example app does, with javac
# (needs a JDK: apt-get install openjdk-17-jdk-headless).
# The "_" keeps the generated Go files out of ./... patterns.
MOBILE_BIND = bin/_mobile-bind
.PHONY: mobile-check
mobile-check:
	@command -v javac >/dev/null || (echo "javac not found: apt-get install openjdk-17-jdk-headless"; exit 1)
	rm -rf $(MOBILE_BIND) && mkdir -p $(MOBILE_BIND)/classes
	$(GO) tool gobind -lang=java,objc -outdir $(MOBILE_BIND) ./mobile
	javac --release 8 -d $(MOBILE_BIND)/classes $$(find $(MOBILE_BIND)/java mobile/testdata/javastubs mobile/testdata/javacheck -name '*.java')
	@echo "mobile-check: bindings generated and the Java compiles ($$(find $(MOBILE_BIND)/classes -name '*.class' | wc -l) classes)"

# cuda builds the CUDA backend (build tag cuda, kernels/cuda): it installs
# Debian's CUDA toolkit when cuda.h is missing (cuda-deps, needs root),
# vets the tagged code, builds bin/tandem-cuda and compiles the tagged
# test binaries into bin/cuda/ (run them on a machine with an NVIDIA GPU;
# tools/cuda-tests.sh runs them there, see README, "CUDA (Jetson GPU)").
# Without a GPU they skip.
CUDA_TEST_PKGS = ./kernels/cuda ./runtime/model ./runtime/sched ./tools/tandem
CUDA_HEADERS = test -f /usr/include/cuda.h || test -f /usr/local/cuda/include/cuda.h
cuda:
	@$(CUDA_HEADERS) || $(MAKE) cuda-deps
	$(MAKE) --no-print-directory cuda-build CUDA_OUT=bin

# cuda-check compiles everything behind the cuda tag without a GPU: go vet
# with the tag, the tagged test binaries and the CLI, into a temporary
# folder. CI runs it, so the GPU code cannot drift from the CPU code it
# shares between sessions that have a GPU to run it on. It needs cuda.h
# and the driver stub (Debian's nvidia-cuda-dev; cuda-dev-deps installs it).
cuda-check:
	@$(CUDA_HEADERS) || $(MAKE) cuda-dev-deps
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && $(MAKE) --no-print-directory cuda-build CUDA_OUT="$$d"
	@echo "cuda-check: the cuda-tagged code vets, and its tests and CLI build"

# cuda-build is what cuda and cuda-check share: vet with the tag, then
# CUDA_OUT/tandem-cuda and the tagged test binaries in CUDA_OUT/cuda/.
cuda-build:
	$(GO) vet -tags cuda ./...
	$(GO) build -tags cuda -o $(CUDA_OUT)/tandem-cuda ./tools/tandem
	@mkdir -p $(CUDA_OUT)/cuda
	$(GO) test -tags cuda -c -o $(CUDA_OUT)/cuda/ $(CUDA_TEST_PKGS)

# cuda-deps enables Debian's contrib and non-free components and installs
# nvcc (CUDA 11.8 in bookworm) and the driver API headers and stubs;
# cuda-dev-deps only the headers and stubs (enough to build, not for
# cuda-ptx).
cuda-deps: debian-nonfree
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nvidia-cuda-toolkit nvidia-cuda-dev

cuda-dev-deps: debian-nonfree
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nvidia-cuda-dev >/dev/null

debian-nonfree:
	sed -i 's/^Components: main$$/Components: main contrib non-free/' /etc/apt/sources.list.d/debian.sources
	apt-get update -q >/dev/null

# cuda-ptx regenerates the embedded PTX of kernels/cuda for every
# architecture in CUDA_ARCHS (kernels/cuda.Archs) and records the digest
# of the sources it was made from (checked by kernels/cuda's tests).
NVCC ?= nvcc
CUDA_ARCHS = 53 62 72 87 90
CUDA_MODULES = matmul ops attention
cuda-ptx:
	@cd kernels/cuda && for m in $(CUDA_MODULES); do for a in $(CUDA_ARCHS); do \
		echo "nvcc $$m.cu sm_$$a"; \
		$(NVCC) -ptx -arch=compute_$$a -o ptx/$$m.sm_$$a.ptx $$m.cu || exit 1; \
	done; done
	@cd kernels/cuda && for f in $$(ls *.cu *.cuh | LC_ALL=C sort); do \
		printf '%s\0' "$$f"; cat "$$f"; printf '\0'; \
	done | sha256sum | cut -d' ' -f1 > ptx/SOURCES

# models trains the embedded default pair (README "Training"): a synthetic
# story corpus and a 1024-token BPE vocabulary, the target trained on it,
# the draft trained on it and then distilled from the target (KL to its
# soft targets, on text the target samples), both written as Q8_0 into
# tools/tandem/defaultmodel with the target's uncertainty calibration.
# Every step is seeded, and the trainer's results do not depend on the
# thread count, so a rerun gives the same files. Interrupted steps resume
# from their checkpoints (--resume).
MODELS_DIR ?= /tmp/tandem-models
TARGET_SHAPE ?= 192,512,6,6,3,256
DRAFT_SHAPE ?= 96,256,3,4,2,256
TARGET_TOKENS ?= 1500000
DRAFT_TOKENS ?= 1000000
DISTILL_TOKENS ?= 400000
CORPUS_SIZE ?= 24MiB
MODELS_OUT ?= tools/tandem/defaultmodel
TANDEM_NICE = nice -n 10 $(MODELS_DIR)/tandem

models:
	@mkdir -p $(MODELS_DIR)
	$(GO) build -o $(MODELS_DIR)/tandem ./tools/tandem
	$(TANDEM_NICE) corpus --size $(CORPUS_SIZE) --seed 1 --vocab 1024 $(MODELS_DIR)/stories.txt
	$(TANDEM_NICE) corpus --stories 1000 --seed 1 --first 100000000 $(MODELS_DIR)/held-out.txt
	$(TANDEM_NICE) train --data $(MODELS_DIR)/stories.txt --vocab $(MODELS_DIR)/stories.vocab.gguf --shape $(TARGET_SHAPE) \
		--tokens $(TARGET_TOKENS) --lr 2e-3 --seed 1 --name "tandem default target" --out $(MODELS_DIR)/target.gguf --resume
	$(TANDEM_NICE) convert --type q8_0 $(MODELS_DIR)/target.gguf $(MODELS_OUT)/target.gguf
	$(TANDEM_NICE) train --data $(MODELS_DIR)/stories.txt --vocab $(MODELS_DIR)/stories.vocab.gguf --shape $(DRAFT_SHAPE) \
		--tokens $(DRAFT_TOKENS) --lr 3e-3 --seed 2 --name "tandem default draft" --out $(MODELS_DIR)/draft-pre.gguf --resume
	$(TANDEM_NICE) distill --target $(MODELS_OUT)/target.gguf --init $(MODELS_DIR)/draft-pre.gguf --kl \
		--tokens $(DISTILL_TOKENS) --lr 1e-3 --seed 3 --name "tandem default draft" --out $(MODELS_DIR)/draft.gguf --resume
	$(TANDEM_NICE) convert --type q8_0 $(MODELS_DIR)/draft.gguf $(MODELS_OUT)/draft.gguf
	$(TANDEM_NICE) eval --model $(MODELS_OUT)/target.gguf --draft $(MODELS_OUT)/draft.gguf \
		--data $(MODELS_DIR)/held-out.txt --prompts $(MODELS_OUT)/prompts.txt
	$(TANDEM_NICE) calibrate --model $(MODELS_OUT)/target.gguf --out $(MODELS_OUT)/target.calib.json
