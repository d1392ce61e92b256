package sched

import (
	"math"
	"strings"
	"unicode"
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
// words and patterns (a few microseconds for a chat prompt), so they run
// on every request:
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
	words := splitWords(text)
	n := float64(len(words))
	if n > 0 {
		clauses := float64(1 + countClauseBreaks(text))
		f[0] = saturate(structural(words)/clauses, 1.5)
		f[1] = saturate(countIn(words, posAmbiguous)/n, 0.15)
		f[2] = saturate((countIn(words, polysemous)+0.5*countIn(words, pronouns))/n, 0.15)
		f[3] = saturate((countIn(words, vagueWords)+countPhrases(words, vaguePhrases))/n, 0.12)
		f[4] = saturate(openEnded(words), 3)
		f[5] = saturate(multiPart(text, words), 3)
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
// apostrophes; other characters separate words.
func splitWords(text string) []string {
	return strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '\''
	})
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

func countIn(words []string, set map[string]bool) float64 {
	n := 0
	for _, w := range words {
		if set[w] {
			n++
		}
	}
	return float64(n)
}

// countPhrases counts occurrences of multi-word phrases.
func countPhrases(words []string, phrases [][]string) float64 {
	n := 0
	for i := range words {
		for _, p := range phrases {
			if hasPhrase(words[i:], p) {
				n++
			}
		}
	}
	return float64(n)
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
func structural(words []string) float64 {
	n := 0
	for i := 1; i < len(words); i++ {
		prev := words[i-1]
		if prepositions[words[i]] && !functionWords[prev] && !prepositions[prev] {
			n++
		}
		if (words[i] == "and" || words[i] == "or") && i+1 < len(words) && !functionWords[prev] && !functionWords[words[i+1]] {
			n++
		}
	}
	return float64(n)
}

// openEnded scores requests for explanation or creation; closed
// questions (yes/no, who/when/how many) count against it.
func openEnded(words []string) float64 {
	s := countIn(words, openWords) + 1.5*countPhrases(words, openPhrases)
	s -= 0.5 * countPhrases(words, closedPhrases)
	if len(words) > 0 && closedStarts[words[0]] {
		s -= 0.5
	}
	return math.Max(0, s)
}

// multiPart counts the parts beyond the first: extra question marks,
// enumerations ("1.", "first", "then") and task joiners ("also").
func multiPart(text string, words []string) float64 {
	q := float64(strings.Count(text, "?"))
	parts := math.Max(0, q-1)
	parts += countIn(words, sequenceWords)
	parts += 0.5 * countPhrases(words, [][]string{{"and", "then"}, {"as", "well", "as"}, {"in", "addition"}})
	for _, line := range strings.Split(text, "\n") {
		t := strings.TrimSpace(line)
		if len(t) >= 2 && (t[0] == '-' || t[0] == '*' || (t[0] >= '0' && t[0] <= '9' && (t[1] == '.' || t[1] == ')'))) {
			parts++
		}
	}
	return parts
}

func set(words ...string) map[string]bool {
	m := make(map[string]bool, len(words))
	for _, w := range words {
		m[w] = true
	}
	return m
}

func phrases(ps ...string) [][]string {
	out := make([][]string, len(ps))
	for i, p := range ps {
		out[i] = strings.Fields(p)
	}
	return out
}

var (
	prepositions = set("with", "in", "on", "at", "by", "for", "from", "about", "near", "under", "over",
		"behind", "beside", "between", "through", "into", "of", "without", "after", "before", "across")
	functionWords = set("the", "a", "an", "this", "that", "these", "those", "is", "are", "was", "were",
		"be", "to", "and", "or", "but", "if", "then", "i", "you", "he", "she", "it", "we", "they", "me",
		"him", "her", "us", "them", "my", "your", "his", "its", "our", "their", "do", "does", "did",
		"what", "who", "why", "how", "when", "where", "which", "not", "no", "so", "as", "can", "will")
	posAmbiguous = set("saw", "record", "present", "object", "lead", "watch", "duck", "fly", "flies",
		"park", "play", "light", "run", "runs", "set", "sets", "book", "books", "can", "cut", "drink",
		"fire", "kind", "left", "like", "mean", "miss", "move", "order", "plan", "point", "rest",
		"show", "sign", "sound", "stand", "start", "state", "step", "talk", "turn", "walk", "wave",
		"work", "time", "man", "still", "well", "back", "down", "fish", "rose", "bear", "project",
		"contract", "address", "permit", "produce", "refuse", "desert", "subject", "content", "close")
	polysemous = set("bank", "bat", "bark", "light", "right", "spring", "match", "bear", "bow", "crane",
		"date", "fair", "fine", "jam", "kind", "mean", "mine", "mole", "nail", "palm", "pitch", "plant",
		"ring", "rock", "row", "scale", "seal", "star", "tie", "trip", "wave", "well", "bill", "cell",
		"charge", "club", "court", "current", "draft", "file", "key", "note", "organ", "port", "press",
		"seal", "spell", "table", "tank", "term", "train", "watch", "model", "run", "line", "fan")
	pronouns   = set("it", "they", "them", "this", "that", "these", "those", "he", "she", "one", "its", "their")
	vagueWords = set("some", "several", "many", "few", "various", "things", "stuff", "something",
		"anything", "everything", "somehow", "somewhat", "maybe", "perhaps", "probably", "possibly",
		"around", "approximately", "roughly", "about", "etc", "whatever", "generally", "often",
		"sometimes", "soon", "later", "quite", "rather", "fairly", "stuff", "lots", "any", "other",
		"others", "someone", "somewhere", "usually", "mostly", "nearly", "almost", "more", "less")
	vaguePhrases = phrases("kind of", "sort of", "a lot", "a bit", "a few", "and so on", "or so",
		"more or less", "at some point", "in general", "things like", "and stuff")
	openWords = set("why", "how", "explain", "describe", "discuss", "elaborate", "write", "story",
		"essay", "imagine", "create", "generate", "continue", "compare", "analyze", "analyse",
		"brainstorm", "suggest", "summarize", "summarise", "invent", "compose", "poem", "plan",
		"design", "argue", "think", "opinion", "thoughts", "detail", "detailed", "everything",
		"tell", "reasons", "ideas", "long", "forever", "endless", "chapter", "chapters", "narrate")
	openPhrases = phrases("tell me about", "in detail", "step by step", "what do you think",
		"as much as", "all about", "once upon a time", "go on", "keep going", "and then", "list all",
		"pros and cons", "long story", "never ends", "as long as")
	closedPhrases = phrases("how many", "how much", "what is the", "what time", "yes or no",
		"one word", "true or false", "which one", "name the")
	closedStarts  = set("is", "are", "was", "were", "do", "does", "did", "can", "will", "who", "when", "where", "which")
	sequenceWords = set("first", "second", "third", "then", "also", "additionally", "finally", "next",
		"afterwards", "lastly", "furthermore", "moreover", "besides")
)
