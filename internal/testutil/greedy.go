package testutil

import (
	"bufio"
	"encoding/json"
	"os"
	"testing"
)

// Greedy is one line of ../shared/testdata/*.greedy.jsonl: a prompt, the
// reference model's greedy continuation and its first-step logits.
type Greedy struct {
	Prompt       string    `json:"prompt"`
	PromptIDs    []int32   `json:"prompt_ids"`
	GeneratedIDs []int32   `json:"generated_ids"`
	FirstLogits  []float32 `json:"first_logits"`
}

// GreedyRecords reads the reference vectors in testdata file name (at
// least one record, or the test fails).
func GreedyRecords(t testing.TB, name string) []Greedy {
	t.Helper()
	f, err := os.Open(Testdata(t, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []Greedy
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24) // a line holds a vocabulary of logits
	for sc.Scan() {
		var r Greedy
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("%s line %d: %v", name, len(recs)+1, err)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 {
		t.Fatalf("%s holds no records", name)
	}
	return recs
}
