package sched

import (
	"math"
	"math/bits"
	"strings"
	"unicode"
	"unicode/utf8"
)

// NumFeatures is the length of a feature vector: six linguistic
// uncertainty intensities (RT-LM's categories) and the prompt length.
const NumFeatures = 7

// FeatureNames names the entries of a feature vector, in order.
var FeatureNames = [NumFeatures]string{
	"structural_ambiguity", "syntactic_ambiguity", "semantic_ambiguity",
	"vague_expressions", "open_endedness", "multi_part", "prompt_length",
}

// Features are the uncertainty intensities of one prompt, each in [0, 1],
// and its length.
type Features [NumFeatures]float64

// PromptLengthScale normalises the length feature: log1p(tokens) /
// log1p(PromptLengthScale), so a 4096-token prompt scores 1.
const PromptLengthScale = 4096

// Extract computes the features of a prompt. They are cheap counts of
// words and patterns (about 0.8 µs for a chat prompt, BenchmarkExtract),
// so they run on every request:
//
//   - structural ambiguity: attachment and coordination sites, where a
//     phrase can hang from more than one place ("saw the man with the
//     telescope", "old men and women"): prepositions after a noun phrase
//     and coordinations, per clause;
//   - syntactic ambiguity: words that are commonly both noun and verb
//     ("record", "present", "saw"), which a parser must guess;
//   - semantic ambiguity: polysemous words ("bank", "bat", "light") and
//     pronouns that may refer to more than one thing;
//   - vague expressions: hedges and unbounded quantities ("some",
//     "several", "kind of", "etc.");
//   - open-endedness: requests for explanation, description or creation
//     ("why", "explain", "write a story", "in detail") rather than a fact;
//   - multi-part questions: several questions or enumerated tasks in one
//     prompt.
//
// Each intensity saturates at 1; text is matched case-insensitively.
func Extract(text string, promptTokens int) Features {
	var f Features
	var buf [64]string // most prompts' words: no allocation for them
	words := splitWords(text, buf[:0])
	n := float64(len(words))
	if n > 0 {
		c := countWords(words)
		clauses := float64(1 + countClauseBreaks(text))
		f[0] = saturate(float64(c.structural)/clauses, 1.5)
		f[1] = saturate(c.words(clsPOSAmbiguous)/n, 0.15)
		f[2] = saturate((c.words(clsPolysemous)+0.5*c.words(clsPronoun))/n, 0.15)
		f[3] = saturate((c.words(clsVague)+c.phrases(phraseVague))/n, 0.12)
		f[4] = saturate(openEnded(c, words), 3)
		f[5] = saturate(multiPart(text, c), 3)
	}
	f[6] = math.Min(1, math.Log1p(float64(max(promptTokens, 0)))/math.Log1p(PromptLengthScale))
	return f
}

// saturate maps x >= 0 to [0, 1), reaching 0.5 at half.
func saturate(x, half float64) float64 {
	if x <= 0 {
		return 0
	}
	return x / (x + half)
}

// splitWords lowercases text into words of letters, digits and
// apostrophes, appended to words; other characters separate them. ASCII
// is classified a byte at a time: Submit pays this for every request, and
// strings.FieldsFunc's call per rune and its slice were a third of
// Extract's time.
func splitWords(text string, words []string) []string {
	lower := strings.ToLower(text) // text itself when it has no upper case
	start := -1                    // the current word's first byte, or -1
	for i := 0; i < len(lower); {
		c, size := lower[i], 1
		var inWord bool
		if c < utf8.RuneSelf {
			inWord = 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '\''
		} else {
			var r rune
			r, size = utf8.DecodeRuneInString(lower[i:])
			inWord = unicode.IsLetter(r) || unicode.IsDigit(r)
		}
		switch {
		case inWord && start < 0:
			start = i
		case !inWord && start >= 0:
			words = append(words, lower[start:i])
			start = -1
		}
		i += size
	}
	if start >= 0 {
		words = append(words, lower[start:])
	}
	return words
}

func countClauseBreaks(text string) int {
	n := 0
	for _, r := range text {
		switch r {
		case '.', '?', '!', ';', '\n':
			n++
		}
	}
	return n
}

// wordClass is a bit set of the word lists a word is on.
type wordClass uint16

const (
	clsPreposition wordClass = 1 << iota
	clsFunction
	clsPOSAmbiguous
	clsPolysemous
	clsPronoun
	clsVague
	clsOpen
	clsClosedStart
	clsSequence
	numClasses = iota
)

// phraseKind says which feature a multi-word phrase counts toward.
type phraseKind uint8

const (
	phraseVague phraseKind = iota
	phraseOpen
	phraseClosed
	phraseMulti
	numPhraseKinds
)

// lexEntry is what the lexicon knows of a word: its lists, and the
// phrases that start with it.
type lexEntry struct {
	class   wordClass
	phrases []lexPhrase
}

type lexPhrase struct {
	kind  phraseKind
	words []string
}

// wordCounts are a prompt's counts: words on each list, phrase
// occurrences of each kind, attachment and coordination sites.
type wordCounts struct {
	class      [numClasses]int
	phrase     [numPhraseKinds]int
	structural int
	first      wordClass // the first word's lists
}

func (c *wordCounts) words(cls wordClass) float64 {
	return float64(c.class[bits.TrailingZeros16(uint16(cls))])
}

func (c *wordCounts) phrases(k phraseKind) float64 { return float64(c.phrase[k]) }

// countWords looks every word up once: a per-request cost (Submit scores
// each request under the scheduler's overhead budget), so one map lookup
// per word finds its lists and the phrases it may start.
func countWords(words []string) wordCounts {
	var c wordCounts
	var buf [64]wordClass
	cls := buf[:0]
	if len(words) > len(buf) {
		cls = make([]wordClass, 0, len(words))
	}
	for i, w := range words {
		e := lexicon[w]
		cls = append(cls, e.class)
		for k := e.class; k != 0; k &= k - 1 {
			c.class[bits.TrailingZeros16(uint16(k))]++
		}
		for _, p := range e.phrases {
			if hasPhrase(words[i:], p.words) {
				c.phrase[p.kind]++
			}
		}
	}
	c.first = cls[0]
	c.structural = structural(words, cls)
	return c
}

func hasPhrase(words, p []string) bool {
	if len(words) < len(p) {
		return false
	}
	for j, w := range p {
		if words[j] != w {
			return false
		}
	}
	return true
}

// structural counts attachment sites (a preposition after a content
// word, which may modify the verb or the noun) and coordinations of
// phrases ("and"/"or" between two content words).
func structural(words []string, cls []wordClass) int {
	n := 0
	for i := 1; i < len(words); i++ {
		prev := cls[i-1]
		if cls[i]&clsPreposition != 0 && prev&(clsFunction|clsPreposition) == 0 {
			n++
		}
		if (words[i] == "and" || words[i] == "or") && i+1 < len(words) && prev&clsFunction == 0 && cls[i+1]&clsFunction == 0 {
			n++
		}
	}
	return n
}

// openEnded scores requests for explanation or creation; closed
// questions (yes/no, who/when/how many) count against it.
func openEnded(c wordCounts, words []string) float64 {
	s := c.words(clsOpen) + 1.5*c.phrases(phraseOpen)
	s -= 0.5 * c.phrases(phraseClosed)
	if len(words) > 0 && c.first&clsClosedStart != 0 {
		s -= 0.5
	}
	return math.Max(0, s)
}

// multiPart counts the parts beyond the first: extra question marks,
// enumerations ("1.", "first", "then") and task joiners ("also").
func multiPart(text string, c wordCounts) float64 {
	q := float64(strings.Count(text, "?"))
	parts := math.Max(0, q-1)
	parts += c.words(clsSequence)
	parts += 0.5 * c.phrases(phraseMulti)
	for line := range strings.SplitSeq(text, "\n") {
		t := strings.TrimSpace(line)
		if len(t) >= 2 && (t[0] == '-' || t[0] == '*' || (t[0] >= '0' && t[0] <= '9' && (t[1] == '.' || t[1] == ')'))) {
			parts++
		}
	}
	return parts
}

// lexicon maps every listed word to its entry.
var lexicon = func() map[string]lexEntry {
	m := map[string]lexEntry{}
	for _, l := range []struct {
		class wordClass
		words string
	}{
		{clsPreposition, prepositions}, {clsFunction, functionWords}, {clsPOSAmbiguous, posAmbiguous},
		{clsPolysemous, polysemous}, {clsPronoun, pronouns}, {clsVague, vagueWords}, {clsOpen, openWords},
		{clsClosedStart, closedStarts}, {clsSequence, sequenceWords},
	} {
		for _, w := range strings.Fields(l.words) {
			e := m[w]
			e.class |= l.class
			m[w] = e
		}
	}
	for _, l := range []struct {
		kind    phraseKind
		phrases []string
	}{
		{phraseVague, vaguePhrases}, {phraseOpen, openPhrases}, {phraseClosed, closedPhrases}, {phraseMulti, multiPhrases},
	} {
		for _, p := range l.phrases {
			ws := strings.Fields(p)
			e := m[ws[0]]
			e.phrases = append(e.phrases, lexPhrase{l.kind, ws})
			m[ws[0]] = e
		}
	}
	return m
}()

// The word lists, space-separated, and the phrases.
var (
	prepositions = "with in on at by for from about near under over behind beside between through into of without " +
		"after before across"
	functionWords = "the a an this that these those is are was were be to and or but if then i you he she it we they me " +
		"him her us them my your his its our their do does did what who why how when where which not no " +
		"so as can will"
	posAmbiguous = "saw record present object lead watch duck fly flies park play light run runs set sets book books " +
		"can cut drink fire kind left like mean miss move order plan point rest show sign sound stand " +
		"start state step talk turn walk wave work time man still well back down fish rose bear project " +
		"contract address permit produce refuse desert subject content close"
	polysemous = "bank bat bark light right spring match bear bow crane date fair fine jam kind mean mine mole nail " +
		"palm pitch plant ring rock row scale seal star tie trip wave well bill cell charge club court " +
		"current draft file key note organ port press seal spell table tank term train watch model run " +
		"line fan"
	pronouns   = "it they them this that these those he she one its their"
	vagueWords = "some several many few various things stuff something anything everything somehow somewhat maybe " +
		"perhaps probably possibly around approximately roughly about etc whatever generally often " +
		"sometimes soon later quite rather fairly stuff lots any other others someone somewhere usually " +
		"mostly nearly almost more less"
	vaguePhrases = []string{"kind of", "sort of", "a lot", "a bit", "a few", "and so on", "or so",
		"more or less", "at some point", "in general", "things like", "and stuff"}
	openWords = "why how explain describe discuss elaborate write story essay imagine create generate continue " +
		"compare analyze analyse brainstorm suggest summarize summarise invent compose poem plan design " +
		"argue think opinion thoughts detail detailed everything tell reasons ideas long forever endless " +
		"chapter chapters narrate"
	openPhrases = []string{"tell me about", "in detail", "step by step", "what do you think",
		"as much as", "all about", "once upon a time", "go on", "keep going", "and then", "list all",
		"pros and cons", "long story", "never ends", "as long as"}
	closedPhrases = []string{"how many", "how much", "what is the", "what time", "yes or no",
		"one word", "true or false", "which one", "name the"}
	closedStarts  = "is are was were do does did can will who when where which"
	sequenceWords = "first second third then also additionally finally next afterwards lastly furthermore moreover " +
		"besides"
	multiPhrases = []string{"and then", "as well as", "in addition"}
)
