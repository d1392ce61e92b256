package corpus

import (
	"math/rand/v2"
	"strings"
	"unicode"
	"unicode/utf8"
)

// expand fills a template: "[a|b|c]" picks one alternative uniformly
// (alternatives may nest and may be empty), "{key}" is replaced by
// vars[key], a key starting with a capital ("{He}") gives the value
// capitalized. Unknown keys expand to themselves so a typo shows in the
// output (and fails the template test) rather than vanishing.
func expand(rng *rand.Rand, tpl string, vars map[string]string) string {
	var sb strings.Builder
	expandInto(&sb, rng, tpl, vars)
	return sb.String()
}

func expandInto(sb *strings.Builder, rng *rand.Rand, tpl string, vars map[string]string) {
	for i := 0; i < len(tpl); {
		switch tpl[i] {
		case '[':
			end := matching(tpl, i)
			alts := splitTop(tpl[i+1 : end])
			expandInto(sb, rng, alts[rng.IntN(len(alts))], vars)
			i = end + 1
		case '{':
			end := strings.IndexByte(tpl[i:], '}')
			if end < 0 {
				sb.WriteString(tpl[i:])
				return
			}
			key := tpl[i+1 : i+end]
			sb.WriteString(lookup(key, vars))
			i += end + 1
		default:
			j := strings.IndexAny(tpl[i:], "[{")
			if j < 0 {
				sb.WriteString(tpl[i:])
				return
			}
			sb.WriteString(tpl[i : i+j])
			i += j
		}
	}
}

func lookup(key string, vars map[string]string) string {
	if v, ok := vars[key]; ok {
		return v
	}
	r, n := utf8.DecodeRuneInString(key)
	if unicode.IsUpper(r) {
		if v, ok := vars[string(unicode.ToLower(r))+key[n:]]; ok {
			return capitalize(v)
		}
	}
	return "{" + key + "}"
}

// matching returns the index of the ']' closing the '[' at i.
func matching(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '[':
			depth++
		case ']':
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return len(s) - 1
}

// splitTop splits s at the '|' characters that are not inside brackets.
func splitTop(s string) []string {
	var out []string
	depth, start := 0, 0
	for j := 0; j < len(s); j++ {
		switch s[j] {
		case '[':
			depth++
		case ']':
			depth--
		case '|':
			if depth == 0 {
				out = append(out, s[start:j])
				start = j + 1
			}
		}
	}
	return append(out, s[start:])
}

func capitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError {
		return s
	}
	return string(unicode.ToUpper(r)) + s[n:]
}

// pick returns one element of xs.
func pick[T any](rng *rand.Rand, xs []T) T { return xs[rng.IntN(len(xs))] }
