package cuda

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

// TestPTX checks the embedded PTX, which CI cannot regenerate (it has no
// nvcc): every module exists for every arch, targets that arch, defines
// every kernel the Go side launches, and was made from the .cu files as
// they are now.
func TestPTX(t *testing.T) {
	for _, m := range Modules {
		for _, a := range Archs {
			src, err := PTX(m, a)
			if err != nil {
				t.Fatal(err)
			}
			target := regexp.MustCompile(`(?m)^\.target (sm_\d+)`).FindStringSubmatch(src)
			if target == nil || target[1] != fmt.Sprintf("sm_%d", a) {
				t.Errorf("%s: .target %v, want sm_%d", ptxName(m, a), target, a)
			}
			for _, e := range Entries[m] {
				if !regexp.MustCompile(`(?m)^\.visible \.entry ` + e + `\(`).MatchString(src) {
					t.Errorf("%s: no entry %s", ptxName(m, a), e)
				}
			}
		}
	}
	want, err := SourcesDigest(os.DirFS("."))
	if err != nil {
		t.Fatal(err)
	}
	got, err := recordedDigest()
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("the embedded PTX was made from other sources (ptx/SOURCES %s, the .cu files now %s): run make cuda-ptx", got, want)
	}
}

// TestSourcesDigestNeedsSources: a folder without .cu files (a test binary
// run from the repository root) is an error saying where to run, not the
// digest of nothing, which TestPTX reported as stale PTX.
func TestSourcesDigestNeedsSources(t *testing.T) {
	_, err := SourcesDigest(fstest.MapFS{"README.md": {Data: []byte("x")}})
	if err == nil || !strings.Contains(err.Error(), "kernels/cuda") {
		t.Fatalf("SourcesDigest of a folder without sources: %v, want an error naming kernels/cuda", err)
	}
	a, err := SourcesDigest(fstest.MapFS{"a.cu": {Data: []byte("x")}, "b.cuh": {Data: []byte("y")}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := SourcesDigest(fstest.MapFS{"a.cu": {Data: []byte("x")}, "b.cuh": {Data: []byte("z")}})
	if err != nil || a == b {
		t.Fatalf("digests %s and %s (%v): a changed header must change the digest", a, b, err)
	}
}

func TestChooseArch(t *testing.T) {
	for _, tc := range []struct {
		major, minor, want int
	}{
		{5, 3, 53}, {6, 1, 53}, {6, 2, 62}, {7, 0, 62}, {7, 2, 72}, {7, 5, 72},
		{8, 6, 72}, {8, 7, 87}, {8, 9, 87}, {9, 0, 90}, {10, 0, 90}, {12, 0, 90},
	} {
		got, err := ChooseArch(tc.major, tc.minor)
		if err != nil || got != tc.want {
			t.Errorf("ChooseArch(%d, %d) = %d, %v; want %d", tc.major, tc.minor, got, err, tc.want)
		}
	}
	for _, cc := range [][2]int{{3, 5}, {5, 2}} {
		if _, err := ChooseArch(cc[0], cc[1]); err == nil {
			t.Errorf("ChooseArch(%d, %d): no error for a GPU older than sm_53", cc[0], cc[1])
		}
	}
}
