package corpus

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestStoriesAreWellFormed expands many stories: no template syntax is
// left, every story is a run of capitalised sentences that ends with
// punctuation, the hero's name recurs, and the stories vary.
func TestStoriesAreWellFormed(t *testing.T) {
	seen := map[string]bool{}
	words := map[string]bool{}
	for i := range 3000 {
		s := Story(7, i)
		if strings.ContainsAny(s, "{}[]|\n") {
			t.Fatalf("story %d has template syntax or a newline: %q", i, s)
		}
		if !strings.ContainsAny(s[len(s)-1:], ".!?\"") || s[0] < 'A' || s[0] > 'Z' {
			t.Fatalf("story %d is not a sentence run: %q", i, s)
		}
		if n := len(strings.Fields(s)); n < 40 || n > 250 {
			t.Errorf("story %d has %d words", i, n)
		}
		seen[s] = true
		for _, w := range strings.Fields(s) {
			words[strings.Trim(w, ".,!?\"")] = true
		}
	}
	if len(seen) < 2990 {
		t.Errorf("only %d distinct stories of 3000", len(seen))
	}
	if len(words) < 400 {
		t.Errorf("only %d distinct words", len(words))
	}
	if a, b := Story(7, 12), Story(7, 12); a != b || a == Story(8, 12) {
		t.Error("stories are not a function of (seed, index)")
	}
}

func TestExpand(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	vars := map[string]string{"name": "lily", "he": "she"}
	for _, tc := range []struct{ tpl, want string }{
		{"{Name} and {he}", "Lily and she"},
		{"[a|a]-[[b|b]|b]", "a-b"},
		{"{missing}", "{missing}"},
		{"x[]y", "xy"},
	} {
		if got := expand(rng, tc.tpl, vars); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.tpl, got, tc.want)
		}
	}
}

func TestWriteAndRead(t *testing.T) {
	var buf bytes.Buffer
	n, written, err := Write(&buf, Options{Seed: 3, Stories: 25})
	if err != nil || n != 25 || written != int64(buf.Len()) {
		t.Fatalf("wrote %d stories, %d bytes (%d): %v", n, written, buf.Len(), err)
	}
	docs, err := ReadDocuments(&buf)
	if err != nil || len(docs) != 25 || docs[3] != Story(3, 3) {
		t.Fatalf("read %d documents: %v", len(docs), err)
	}
	buf.Reset()
	if _, written, _ = Write(&buf, Options{Seed: 3, Bytes: 5000, First: 100}); written < 5000 || written > 7000 {
		t.Errorf("asked for 5000 bytes, wrote %d", written)
	}
	if docs, _ := ReadDocuments(&buf); docs[0] != Story(3, 100) {
		t.Error("First does not offset the stories")
	}
	if _, _, err := Write(&buf, Options{}); err == nil {
		t.Error("no size: no error")
	}

	text := "  First para\nline two \n\n\n<|endoftext|>\nSecond\n" + Separator + "\nThird"
	docs, err = ReadDocuments(strings.NewReader(text))
	if err != nil || len(docs) != 3 || docs[0] != "First para\nline two" || docs[2] != "Third" {
		t.Errorf("documents %q: %v", docs, err)
	}
	if _, err := ReadDocuments(strings.NewReader("\n\n  \n")); !errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), "3 lines are all blank") {
		t.Errorf("blank text: %v", err)
	}
	if _, err := ReadDocuments(strings.NewReader("")); !errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), "the text is empty") {
		t.Errorf("empty text: %v", err)
	}
	if _, err := ReadDocuments(strings.NewReader("ok\n\xff\n")); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("bad UTF-8: %v", err)
	}
	long := "ok\n\n" + strings.Repeat("a", 65<<20) + "\n"
	if _, err := ReadDocuments(strings.NewReader(long)); err == nil || !strings.Contains(err.Error(), "line 3 is over 64 MiB") {
		t.Errorf("a 65 MiB line: %v", err)
	}
}

func FuzzReadDocuments(f *testing.F) {
	f.Add("a\n\nb")
	f.Add("<|endoftext|>\n\n x \n")
	f.Fuzz(func(t *testing.T, s string) {
		docs, err := ReadDocuments(strings.NewReader(s))
		for _, d := range docs {
			if d == "" || strings.Contains(d, "\n\n") {
				t.Fatalf("document %q", d)
			}
		}
		_ = err
	})
}
