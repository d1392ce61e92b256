#!/bin/sh
# cuda-tests.sh runs the cuda-tagged tests that `make cuda` compiles into
# bin/cuda, on a machine with an NVIDIA GPU and no Go. Each binary runs in
# its package's folder, as go test runs it: the tests read testdata and the
# .cu sources by relative paths. Models come from $TANDEM_SHARED, by
# default the shared/ folder beside the repository. Extra arguments go to
# every binary (for example -test.v). It exits non-zero when any fails.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
bins=${CUDA_TESTS:-$root/bin/cuda}
shared=${TANDEM_SHARED:-$root/../shared}
if [ ! -d "$shared/models" ]; then
	echo "cuda-tests: no models at $shared/models; set TANDEM_SHARED to the shared folder" >&2
	exit 2
fi
TANDEM_SHARED=$(cd "$shared" && pwd)
TANDEM_REQUIRE_SHARED=1 # a test that cannot find a model fails, not skips
export TANDEM_SHARED TANDEM_REQUIRE_SHARED
failed=""
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# run PACKAGE BINARY PATTERN [ARGS...]
run() {
	pkg=$1 bin=$2 pattern=$3
	shift 3
	if [ ! -x "$bins/$bin" ]; then
		echo "cuda-tests: $bins/$bin is missing: run make cuda (where Go is) and bring bin/cuda here" >&2
		failed="$failed $bin"
		return
	fi
	echo "== $pkg ($bin -test.run '$pattern')"
	(cd "$root/$pkg" && "$bins/$bin" -test.run "$pattern" "$@") >"$log" 2>&1 || failed="$failed $bin"
	cat "$log"
	# Without a GPU the binaries skip every test and exit 0; that is no pass.
	if grep -q "CUDA driver cannot start" "$log"; then
		failed="$failed $bin(no GPU)"
	fi
}
run kernels/cuda cuda.test . "$@"          # every kernel against its Go twin, the embedded PTX
run runtime/model model.test CUDA "$@"     # parity, tree commits, streamed weights
run runtime/sched sched.test CUDA "$@"     # a GPU lane beside a CPU lane, prefix reuse, batches sharing rows and passes
run tools/tandem tandem.test GPULanes "$@" # tandem serve --lanes cuda,1 over HTTP
if [ -n "$failed" ]; then
	echo "cuda-tests: failed:$failed" >&2
	exit 1
fi
echo "cuda-tests: all passed"
