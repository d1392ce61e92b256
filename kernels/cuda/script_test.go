package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/internal/testutil"
)

// TestCUDATestsScript runs tools/cuda-tests.sh, which runs the tagged test
// binaries on a GPU machine where nothing else checks it, against stand-in
// binaries: each must run in its package's folder with the models' path
// and its filter, a skip for want of a GPU or a missing binary must fail
// the script, and all passing must pass it.
func TestCUDATestsScript(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	root := testutil.RepoRoot(t)
	shared := testutil.SharedDir(t)
	stand := func(t *testing.T, body string) string {
		dir := t.TempDir()
		for _, name := range []string{"cuda.test", "model.test", "sched.test", "tandem.test"} {
			script := "#!/bin/sh\necho \"$(basename \"$0\") in $(pwd) shared=$TANDEM_SHARED require=$TANDEM_REQUIRE_SHARED args=$*\"\n" + body
			if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	run := func(t *testing.T, bins string) (string, error) {
		cmd := exec.Command("sh", filepath.Join(root, "tools", "cuda-tests.sh"), "-test.v")
		cmd.Env = append(os.Environ(), "CUDA_TESTS="+bins, "TANDEM_SHARED="+shared)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := run(t, stand(t, "exit 0\n"))
	if err != nil || !strings.Contains(out, "cuda-tests: all passed") {
		t.Fatalf("all passing: %v\n%s", err, out)
	}
	for _, want := range []string{
		"cuda.test in " + filepath.Join(root, "kernels", "cuda"),
		"model.test in " + filepath.Join(root, "runtime", "model"),
		"sched.test in " + filepath.Join(root, "runtime", "sched"),
		"tandem.test in " + filepath.Join(root, "tools", "tandem"),
		"require=1 args=-test.run CUDA -test.v",
		"args=-test.run GPULanes -test.v",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	abs, _ := filepath.Abs(shared)
	if !strings.Contains(out, "shared="+abs) {
		t.Errorf("the binaries were not given the shared folder %s:\n%s", abs, out)
	}

	for name, body := range map[string]string{
		"a failing test": "exit 1\n",
		"no GPU":         "echo '--- SKIP: every test of this cuda-tagged binary: CUDA driver cannot start: cuInit: no CUDA-capable device'\nexit 0\n",
	} {
		if out, err := run(t, stand(t, body)); err == nil || !strings.Contains(out, "cuda-tests: failed") {
			t.Errorf("%s: %v, want the script to fail:\n%s", name, err, out)
		}
	}
	missing := stand(t, "exit 0\n")
	os.Remove(filepath.Join(missing, "sched.test"))
	if out, err := run(t, missing); err == nil || !strings.Contains(out, "sched.test is missing: run make cuda") {
		t.Errorf("a missing binary: %v, want the script to fail naming it:\n%s", err, out)
	}
}
