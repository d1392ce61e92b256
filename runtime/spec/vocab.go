package spec

import (
	"fmt"

	"github.com/tandem-llm/tandem/runtime/tokenizer"
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
