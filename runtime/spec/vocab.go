package spec

import (
	"fmt"

	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/weights"
)

// CheckVocab refuses a draft whose vocabulary is not the target's: same
// size and the same token table (tokenizer.Fingerprint), so that a token
// id means the same text to both. The names say which files they came
// from.
func CheckVocab(draft, target *tokenizer.Tokenizer, draftName, targetName string) error {
	dn, tn := draft.VocabSize(), target.VocabSize()
	if dn != tn {
		return fmt.Errorf("spec: draft %s has %d tokens, target %s has %d: a draft must use the target's tokenizer (%w)", draftName, dn, targetName, tn, ErrVocab)
	}
	if df, tf := draft.Fingerprint(), target.Fingerprint(); df != tf {
		return fmt.Errorf("spec: draft %s and target %s both have %d tokens but different token tables (fingerprints %016x and %016x): a draft must use the target's tokenizer (%w)",
			draftName, targetName, dn, df, tf, ErrVocab)
	}
	return nil
}

// CheckDraftFile checks that the model file draft shares the target's
// vocabulary (CheckVocab). The draft's tokenizer is the file at
// draftTokPath when given, else the draft's own vocabulary, else (a
// llama2.c draft has none) the file at targetTokPath, the target's.
func CheckDraftFile(draft *weights.File, draftTokPath, targetTokPath string, target *tokenizer.Tokenizer, targetName string) error {
	path := draftTokPath
	if _, ok := draft.Metadata.Get("tokenizer.ggml.tokens"); !ok && path == "" {
		path = targetTokPath
	}
	dtok, err := tokenizer.ForModel(draft, path)
	if err != nil {
		return err
	}
	name := draft.Path
	if path != "" {
		name += " (by its tokenizer " + path + ")" // the counts below are the file's
	}
	return CheckVocab(dtok, target, name, targetName)
}
