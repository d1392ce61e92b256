package defaultmodel

import (
	"testing"

	"github.com/tandem-llm/tandem/runtime/sched"
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

// TestCalibration checks the embedded calibration belongs to the
// embedded target (make models writes both; a retrained target without
// it fails here), predicts better than the prompt-length fallback on the
// generations it held out, and ranks an open-ended, multi-part request
// above a closed question.
func TestCalibration(t *testing.T) {
	c, err := sched.ParseCalibration(Calibration(), CalibrationName)
	if err != nil {
		t.Fatal(err)
	}
	if c.ModelBytes != int64(len(target)) {
		t.Fatalf("calibrated on a %d-byte model, the embedded target has %d bytes: rerun make models (or tandem calibrate --model %s --out %s)",
			c.ModelBytes, len(target), "tools/tandem/defaultmodel/target.gguf", "tools/tandem/defaultmodel/target.calib.json")
	}
	if v := c.Validation; v.N < 20 || v.MAE >= v.FallbackMAE {
		t.Errorf("held-out error %.1f tokens over %d generations, the fallback's %.1f: the calibration does not pay", v.MAE, v.N, v.FallbackMAE)
	}
	tf, err := Target()
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromMetadata(&tf.Metadata)
	if err != nil {
		t.Fatal(err)
	}
	est := sched.NewEstimator(c)
	score := func(text string) float64 {
		ids, err := tok.Encode(text, tokenizer.EncodeOptions{AddBOS: true})
		if err != nil {
			t.Fatal(err)
		}
		return est.Score(text, len(ids))
	}
	closed := "Is the red ball in the box?"
	open := "Tell me everything about the little dog and the big tree, and then describe what might happen next, and why?"
	a, b := score(closed), score(open)
	if a >= b {
		t.Errorf("a closed question scores %.1f tokens, an open, multi-part one %.1f", a, b)
	}
	t.Logf("closed question %.1f tokens, open multi-part request %.1f", a, b)
}
