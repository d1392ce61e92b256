package jetson

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tandem-llm/tandem/kernels/cpuset"
)

func TestParseTegraRelease(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     Release
		err      string
	}{
		{"R35", "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n",
			Release{Major: 35, Revision: "4.1", Version: "35.4.1", GCID: "33958178", Board: "t186ref", EABI: "aarch64", Date: "Tue Aug  1 19:57:35 UTC 2023"}, ""},
		{"R36 with trailer", "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: Wed Jan  8 01:49:37 UTC 2025\n# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n",
			Release{Major: 36, Revision: "4.3", Version: "36.4.3", GCID: "38968081", Board: "generic", EABI: "aarch64", Date: "Wed Jan  8 01:49:37 UTC 2025", KernelVariant: "oot"}, ""},
		{"R32 with checksums", "# R32 (release), REVISION: 7.1, GCID: 29818004, BOARD: t210ref, EABI: aarch64, DATE: Sat Feb 19 17:05:08 UTC 2022\na0ff2bf2d9ba9be0b6f66305dba03b4a17be0dc3 */usr/lib/aarch64-linux-gnu/tegra/libnvmmlite_video.so\n",
			Release{Major: 32, Revision: "7.1", Version: "32.7.1", GCID: "29818004", Board: "t210ref", EABI: "aarch64", Date: "Sat Feb 19 17:05:08 UTC 2022"}, ""},
		{"no trailing newline, short", "# R35 (release), REVISION: 5.0", Release{Major: 35, Revision: "5.0", Version: "35.5.0"}, ""},
		{"CRLF", "# R35 (release), REVISION: 6.0, BOARD: t186ref\r\n", Release{Major: 35, Revision: "6.0", Version: "35.6.0", Board: "t186ref"}, ""},
		{"empty", "", Release{}, "does not start with"},
		{"no hash", "R35 (release), REVISION: 4.1", Release{}, "does not start with"},
		{"bad major", "# Rxx (release), REVISION: 4.1", Release{}, "bad release major"},
		{"no revision", "# R35 (release), GCID: 1", Release{}, "no REVISION"},
		{"bad revision", "# R35 (release), REVISION: four", Release{}, "bad REVISION"},
		{"empty revision part", "# R35 (release), REVISION: 4.", Release{}, "bad REVISION"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseTegraRelease([]byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v\nwant %+v", got, err, tc.want)
			}
		})
	}
	if JetPackFor("35.4.1") != "5.1.2" || JetPackFor("36.4.3") != "6.2" || JetPackFor("99.0.0") != "" {
		t.Error("JetPack table")
	}
}

func TestParseMeminfo(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]uint64
		err      string
	}{
		{"typical", "MemTotal:        7802060 kB\nMemAvailable:    6288140 kB\nHugePages_Total:       0\nCmaTotal:         262144 kB\n",
			map[string]uint64{"MemTotal": 7802060 << 10, "MemAvailable": 6288140 << 10, "HugePages_Total": 0, "CmaTotal": 262144 << 10}, ""},
		{"parenthesised names", "Active(anon):       3760 kB\n", map[string]uint64{"Active(anon)": 3760 << 10}, ""},
		{"empty", "", map[string]uint64{}, ""},
		{"bad lines kept apart", "MemTotal: 10 kB\nMemFree 5 kB\nSwapTotal: 4 MB\nSwapFree: -1 kB\nX: 1 kB extra\n",
			map[string]uint64{"MemTotal": 10 << 10}, "line 2"},
		{"overflow", "MemTotal: 18446744073709551615 kB\n", map[string]uint64{}, "overflows"},
		{"too big", "MemTotal: 99999999999999999999 kB\n", map[string]uint64{}, "bad value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseMeminfo([]byte(tc.in))
			if (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
				t.Errorf("err %v, want %q", err, tc.err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
			if err != nil && strings.Contains(err.Error(), "\n") {
				t.Errorf("multi-line error %q", err)
			}
		})
	}
	var many strings.Builder
	for i := range 10 {
		fmt.Fprintf(&many, "bad line %d\n", i)
	}
	if _, err := ParseMeminfo([]byte(many.String())); err == nil || !strings.Contains(err.Error(), "and 7 more bad lines") {
		t.Errorf("many bad lines: %v", err)
	}
}

func TestParseNvpmodel(t *testing.T) {
	for _, tc := range []struct {
		name, in    string
		id          int
		mode, fan   string
		errContains string
	}{
		{"orin", "NV Power Mode: MAXN\n0\n", 0, "MAXN", "", ""},
		{"with fan and warnings", "NVPM WARN: fan mode is not set!\nNV Fan Mode:quiet\nNV Power Mode: MODE_15W\n1\n", 1, "MODE_15W", "quiet", ""},
		{"blank line before id", "NV Power Mode: 7W\n\n3\n", 3, "7W", "", ""},
		{"CRLF", "NV Power Mode: MAXN_SUPER\r\n2\r\n", 2, "MAXN_SUPER", "", ""},
		{"no id", "NV Power Mode: MAXN\n", 0, "", "", "no mode id"},
		{"bad id", "NV Power Mode: MAXN\nzero\n", 0, "", "", "bad mode id"},
		{"huge id", "NV Power Mode: MAXN\n70000\n", 0, "", "", "bad mode id"},
		{"empty name", "NV Power Mode:\n0\n", 0, "", "", "empty power mode name"},
		{"not nvpmodel", "bash: nvpmodel: command not found\n", 0, "", "", "no \"NV Power Mode:\" line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseNvpmodelQuery([]byte(tc.in))
			if tc.errContains != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errContains) {
					t.Fatalf("err %v, want %q", err, tc.errContains)
				}
				return
			}
			if err != nil || got.ID != tc.id || got.Name != tc.mode || got.FanMode != tc.fan {
				t.Errorf("got %+v, %v", got, err)
			}
		})
	}

	for in, want := range map[string]string{
		"pmode:0000 fmode:quiet\n": "0 quiet <nil>",
		"pmode:0002\n":             "2  <nil>",
		"fmode:cool pmode:0008":    "8 cool <nil>",
		"":                         "0  no pmode",
		"pmode:MAXN":               `0  bad mode id "MAXN"`,
		"pmode 2":                  `0  want "pmode:NNNN", got "pmode"`,
	} {
		id, fan, err := ParseNvpmodelStatus([]byte(in))
		if got := fmt.Sprintf("%d %s %v", id, fan, err); got != want {
			t.Errorf("status %q: %s, want %s", in, got, want)
		}
	}

	conf := "# comment < not a tag\n< PARAM TYPE=FILE NAME=CPU_ONLINE >\nCORE_0 /sys/devices/system/cpu/cpu0/online\n" +
		"< POWER_MODEL ID=0 NAME=MAXN >\n< POWER_MODEL ID=1 NAME=MODE_15W >\n< POWER_MODEL ID=x NAME=BAD >\n< PM_CONFIG DEFAULT=1 >\n"
	modes, def, err := ParseNvpmodelConf([]byte(conf))
	if !reflect.DeepEqual(modes, []ModeDef{{0, "MAXN"}, {1, "MODE_15W"}}) || def == nil || *def != 1 || err == nil || !strings.Contains(err.Error(), "line 6") {
		t.Errorf("conf: %v %v %v", modes, def, err)
	}
}

// FuzzParsers feeds the same bytes to every text parser: none may panic,
// hang or allocate without bound, and what they accept must be consistent.
func FuzzParsers(f *testing.F) {
	for _, name := range []string{"etc/nv_tegra_release", "proc/meminfo", "etc/nvpmodel.conf", "var/lib/nvpmodel/status"} {
		for _, fx := range []string{"orin-agx-jp5", "orin-nano-jp6", "xavier-nx-jp5", "malformed"} {
			if b, err := os.ReadFile(filepath.Join("testdata", fx, name)); err == nil {
				f.Add(b)
			}
		}
	}
	f.Add([]byte("NVPM WARN: fan mode is not set!\nNV Fan Mode:quiet\nNV Power Mode: MAXN\n0\n"))
	f.Add([]byte("0-3,5,7-11"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := ParseTegraRelease(b); err == nil {
			if r.Version != fmt.Sprintf("%d.%s", r.Major, r.Revision) || r.Revision == "" {
				t.Errorf("release %+v", r)
			}
		}
		fields, _ := ParseMeminfo(b)
		for k, v := range fields {
			if k == "" || strings.ContainsAny(k, "\n:") {
				t.Errorf("meminfo key %q = %d", k, v)
			}
		}
		if m, err := ParseNvpmodelQuery(b); err == nil && (m.Name == "" || m.ID < 0 || m.ID > 65535) {
			t.Errorf("nvpmodel -q %+v", m)
		}
		if id, _, err := ParseNvpmodelStatus(b); err == nil && (id < 0 || id > 65535) {
			t.Errorf("status id %d", id)
		}
		modes, _, _ := ParseNvpmodelConf(b)
		for _, m := range modes {
			if m.Name == "" {
				t.Errorf("conf mode %+v", m)
			}
		}
		if ids, err := cpuset.Parse(string(b)); err == nil {
			for i, id := range ids {
				if id < 0 || id > cpuset.MaxCPU || i > 0 && id <= ids[i-1] {
					t.Fatalf("cpu list %v", ids)
				}
			}
		}
	})
}
