package defaultmodel

import (
	"testing"

	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
)

// TestPair checks the embedded files are a pair tandem can speculate
// with: both parse, carry their tokenizer and share its token table.
func TestPair(t *testing.T) {
	tf, err := Target()
	if err != nil {
		t.Fatal(err)
	}
	df, err := Draft()
	if err != nil {
		t.Fatal(err)
	}
	if !IsEmbedded(tf) || !IsEmbedded(df) {
		t.Error("IsEmbedded does not recognise the embedded models")
	}
	ttok, err := tokenizer.FromMetadata(&tf.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	dtok, err := tokenizer.FromMetadata(&df.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.CheckVocab(dtok, ttok, df.Path, tf.Path); err != nil {
		t.Fatal(err)
	}
}
