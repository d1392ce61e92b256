// Package sample turns logits into the next token: greedy, or seeded
// sampling after a repeat penalty, temperature, top-k, top-p and min-p.
package sample

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/tandem-llm/tandem/kernels"
)

// Options selects the transforms. Zero values switch a transform off, so
// the zero Options is greedy decoding.
type Options struct {
	// Temperature divides the logits; 0 (or less) is greedy decoding.
	Temperature float32
	// TopP keeps the smallest set of most likely tokens whose probability
	// reaches TopP (off when <= 0 or >= 1).
	TopP float32
	// MinP drops tokens less likely than MinP × the most likely one (off
	// when <= 0; 1 or more keeps only the most likely).
	MinP float32
	// RepeatPenalty divides positive logits and multiplies negative ones
	// of tokens seen in the last RepeatLastN history tokens (off when 0
	// or 1).
	RepeatPenalty float32
	// TopK keeps the K most likely tokens (off when <= 0).
	TopK int
	// RepeatLastN is the penalty window; 0 or less means all the history.
	RepeatLastN int
	// Seed makes a run reproducible: the same seed gives the same tokens.
	Seed uint64
}

// Sampler draws tokens. It is not safe for concurrent use; give each
// sequence its own.
type Sampler struct {
	opt   Options
	src   *rand.PCG // rng's state, copied to look ahead (RaceAhead)
	rng   *rand.Rand
	buf   []float32 // working logits / probabilities of Sample
	idx   []int32   // the most likely token ids in order, for top-k and top-p
	pre   []float32 // the scaled logits, made again when top-p ranks past its head
	kept  []float32 // the values keepOnly keeps
	keys  []uint64  // rank's sort keys: value order, then id
	spare []uint64  // radixSort's other buffer
	seen  map[int32]struct{}
}

// New makes a sampler. Its random stream is PCG seeded from opt.Seed.
func New(opt Options) *Sampler {
	src := rand.NewPCG(opt.Seed, opt.Seed^0x9e3779b97f4a7c15)
	return &Sampler{opt: opt, src: src, rng: rand.New(src), seen: map[int32]struct{}{}}
}

// Options returns the options the sampler was made with.
func (s *Sampler) Options() Options { return s.opt }

// Greedy reports whether the sampler always takes the most likely token.
func (s *Sampler) Greedy() bool { return !(s.opt.Temperature > 0) }

// Sample picks the next token from logits (one per vocabulary entry).
// history is the sequence so far (prompt and generated ids), used by the
// repeat penalty. logits is not modified. It returns -1 only for empty
// logits.
func (s *Sampler) Sample(logits []float32, history []int32) int32 {
	if len(logits) == 0 {
		return -1
	}
	if s.Greedy() {
		if !s.penalizes(history) {
			// The most likely token, read in place: building the one-hot
			// distribution first took four passes over the vocabulary
			// (113 µs a token for 32000 tokens).
			return argmax(logits)
		}
		s.buf = s.probs(s.buf[:0], logits, history)
		return argmax(s.buf)
	}
	if s.racesLogits(len(logits)) {
		return s.raceLogits(logits, history)
	}
	var cut []int32
	s.buf, cut = s.shape(s.buf[:0], logits, history, false)
	return s.raceShaped(s.buf, cut)
}

// raceShaped is Draw(Probs(…)) on what shape returned: the race runs
// over the ids top-p kept (all tokens without a cut) whose weight min-p
// leaves, with the softmax's values, not renormalised. Cutting the rest,
// applying min-p, renormalising and racing the whole vocabulary each took
// a pass over it. It draws the token Draw would but where two finishers'
// times agree to float32 rounding (Probs rounds once more).
func (s *Sampler) raceShaped(p []float32, cut []int32) int32 {
	var best int32
	if cut != nil {
		best = cut[0] // the most likely: rank's order
	} else {
		best = heaviest(p)
	}
	if best < 0 {
		return -1
	}
	var floor float32
	if s.opt.MinP > 0 {
		floor = min(s.opt.MinP, 1) * p[best]
	}
	var one [1]int32
	return race(one[:0], p, cut, floor, best, s.rng.Uint64(), 1)[0]
}

// racesLogits reports whether Sample draws by racing the logits in place
// (raceLogits): with no top-k or top-p nothing needs ranking, and the race
// needs neither the other tokens' probabilities nor their sum.
func (s *Sampler) racesLogits(n int) bool {
	topK := s.opt.TopK > 0 && s.opt.TopK < n
	topP := s.opt.TopP > 0 && s.opt.TopP < 1
	return !topK && !topP
}

// raceLogits is Draw(Probs(…)) for a sampler without top-k or top-p:
// token i's weight is w_i = e^(x_i − m), x_i its scaled logit and m the
// largest, which is p_i up to the sum the race does not need, so neither
// the sum nor the normalising pass is made. The weights are the kernels'
// exponentials, eight at a time: bounding each token's weight from its
// exponent's bits and taking math.Exp for the few the bound let through
// cost twice as much, the bound's arithmetic a token outweighing the
// exponentials. It takes one word of the stream, as Draw does, and draws
// the same token but where two finishers' times agree to float32
// rounding (Probs rounds each weight once more).
func (s *Sampler) raceLogits(logits []float32, history []int32) int32 {
	var best int
	var m float32
	s.buf, best, m = s.penalized(s.buf[:0], logits, history)
	w := s.buf
	word := s.rng.Uint64()
	if best < 0 || math.IsInf(float64(m), 1) {
		// No finite largest: the +Inf tokens share the mass, or every
		// token does when all are −Inf.
		return raceFlat(w, m, word)
	}
	scaleFromTop(w, m, 1/s.opt.Temperature)
	kernels.ExpSum(w, 0) // the largest reads 0
	var one [1]int32
	return race(one[:0], w, nil, min(s.opt.MinP, 1)*w[best], int32(best), word, 1)[0]
}

// raceFlat is raceLogits when the logits have no finite maximum m: the
// tokens at +Inf share the mass, or, when every one is −Inf or NaN, all
// tokens do, as in probs. Equal weights finish in the order of their
// uniforms, the largest first.
func raceFlat(z []float32, m float32, word uint64) int32 {
	win, top := int32(-1), 0.0
	for i, v := range z {
		if m > 0 && !(v == m) {
			continue
		}
		if u := unit(word, int32(i)); win < 0 || u > top {
			win, top = int32(i), u
		}
	}
	return win
}

// Probs returns the distribution Sample draws from, after every transform
// (one-hot on the greedy token when Temperature is 0), empty for empty
// logits. Speculative sampling compares these distributions between
// draft and target. The slice is newly allocated.
func (s *Sampler) Probs(logits []float32, history []int32) []float32 {
	return s.probs(make([]float32, 0, len(logits)), logits, history)
}

// Draw samples an index from p, a non-negative weight per token that need
// not sum to 1, and returns -1 when p has no positive weight. It takes one
// word of the sampler's stream per draw (none when it returns -1).
//
// The draw is an exponential race: each token i gets an exponential time
// E_i from the word and i, and the token with the least E_i / p[i] wins,
// which it does with probability p[i] / Σp. Two distributions raced with
// the same word pick the same token about as often as any pairing of
// draws from them can (at least (1−d)/(1+d) of the time, d their total
// variation distance): a speculative draft racing its own distribution
// with the target's word (RaceAhead) proposes the token the target will
// draw, most of the time the two models agree.
func (s *Sampler) Draw(p []float32) int32 {
	best := heaviest(p)
	if best < 0 {
		return -1 // nothing to draw: the stream stays where it is
	}
	var one [1]int32
	return race(one[:0], p, nil, 0, best, s.rng.Uint64(), 1)[0]
}

// RaceAhead appends to dst the first n finishers of the race Draw would
// run on p with the word the draw k draws from now takes (0: the next),
// without taking it: fewer when p has fewer positive weights, the token
// Draw would pick first. When the target's distribution differs from p,
// its winner is most likely one of p's first finishers for the same
// word: a draft with room for several guesses proposes these.
func (s *Sampler) RaceAhead(dst []int32, p []float32, k, n int) []int32 {
	best := heaviest(p)
	if best < 0 || n <= 0 {
		return dst
	}
	return race(dst, p, nil, 0, best, s.ahead(k), n)
}

// ahead returns the word the draw k draws from now takes, leaving the
// stream as it is.
func (s *Sampler) ahead(k int) uint64 {
	fork := *s.src // PCG's state is two words: a copy is a fork
	for range k {
		fork.Uint64()
	}
	return fork.Uint64()
}

// heaviest is the index of p's largest positive weight, -1 if none.
func heaviest(p []float32) int32 {
	best := int32(-1)
	for i, x := range p {
		if x > 0 && (best < 0 || x > p[best]) {
			best = int32(i)
		}
	}
	return best
}

// race appends to dst the first n (n ≥ 1) finishers of the race over
// p's positive weights for word, by least E_i / p[i], E_i = −ln U_i with
// U_i uniform in (0, 1] from word and i: over the tokens in ids (every
// token when nil) whose weight is at least floor. best, the heaviest
// token, runs first, so the bound the n-th time sets rules out most
// others with a multiply: E_i/p[i] < b needs U_i > exp(−b·p[i]) ≥
// 1 − b·p[i], so a U_i at or below 1 − b·p[i] cannot finish ahead, and
// only the rest pay for a logarithm.
func race(dst []int32, p []float32, ids []int32, floor float32, best int32, word uint64, n int) []int32 {
	var buf [8]float64
	f := finishers{dst: dst, first: len(dst), times: buf[:0], n: n}
	b := f.enter(best, -math.Log(unit(word, best))/float64(p[best]))
	// The two loops differ only in where i comes from: one loop choosing
	// between them per token made a 32000-token race a quarter slower.
	if ids == nil {
		for i, x := range p {
			if !(x > 0) || x < floor || int32(i) == best {
				continue
			}
			if u := unit(word, int32(i)); u > 1-b*float64(x) {
				b = f.enter(int32(i), -math.Log(u)/float64(x))
			}
		}
		return f.dst
	}
	for _, i := range ids {
		x := p[i]
		if !(x > 0) || x < floor || i == best {
			continue
		}
		if u := unit(word, i); u > 1-b*float64(x) {
			b = f.enter(i, -math.Log(u)/float64(x))
		}
	}
	return f.dst
}

// finishers are a race's first n finishers so far, dst[first:], in order
// of their times.
type finishers struct {
	dst   []int32
	first int
	times []float64 // ascending
	n     int
}

// enter places token i, finishing at time e, and returns the time a
// token must beat to place: the n-th finisher's, or +Inf while fewer
// have finished.
func (f *finishers) enter(i int32, e float64) float64 {
	j := len(f.times)
	switch {
	case j < f.n:
		f.times, f.dst = append(f.times, 0), append(f.dst, 0)
	case e >= f.times[j-1]:
		return f.times[j-1]
	default:
		j--
	}
	for j > 0 && e < f.times[j-1] {
		f.times[j], f.dst[f.first+j] = f.times[j-1], f.dst[f.first+j-1]
		j--
	}
	f.times[j], f.dst[f.first+j] = e, i
	if len(f.times) < f.n {
		return math.Inf(1)
	}
	return f.times[f.n-1]
}

// unit is token i's uniform in (0, 1] for a draw's word: a SplitMix64
// finalizer over the two, so every token's time is independent of the
// others' and of the word's neighbours in the stream.
func unit(word uint64, i int32) float64 {
	z := word + uint64(i+1)*0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11+1) / (1 << 53)
}

// probs appends the final distribution for logits to dst.
func (s *Sampler) probs(dst, logits []float32, history []int32) []float32 {
	dst, cut := s.shape(dst, logits, history, true)
	if len(dst) == 0 || s.Greedy() {
		return dst
	}
	if cut != nil {
		s.keepOnly(dst, cut, 0)
	}
	if s.opt.MinP > 0 {
		// At most 1: the most likely token always stays.
		floor := min(s.opt.MinP, 1) * dst[argmax(dst)]
		for i, p := range dst {
			if p < floor {
				dst[i] = 0
			}
		}
	}
	normalize(dst)
	return dst
}

// shape appends to dst the distribution for logits before the last
// transforms: it returns the softmax after the penalty, temperature and
// top-k, and the ids top-p keeps, the most likely first (nil when it
// keeps all), without cutting the rest, applying min-p or normalising
// again. Greedy decoding's one-hot distribution is final. With all unset
// and a cut returned, only the cut's probabilities are written, the rest
// holding unnormalised weights: the draw reads no others, and
// normalising a 32000-token vocabulary was a sixth of its top-p draw.
func (s *Sampler) shape(dst, logits []float32, history []int32, all bool) (_ []float32, cut []int32) {
	dst, best, m := s.penalized(dst, logits, history)
	if len(dst) == 0 {
		return dst, nil // no tokens, no distribution (the transforms below read a first one)
	}
	if s.Greedy() {
		clear(dst)
		dst[max(best, 0)] = 1 // all -Inf: the first, as argmax
		return dst, nil
	}
	m, whole := s.scale(dst, m)
	n := len(dst)
	topP := s.opt.TopP > 0 && s.opt.TopP < 1
	if topP && !whole {
		s.rank(dst, min(n, rankHead))
	}
	inv := weights(dst, m)
	prob := func(id int32) float32 { return float32(float64(dst[id]) * inv) }
	if topP {
		// Walk the tokens from the most likely until the kept mass
		// reaches TopP; the rest go. Ties keep the lower id first.
		var acc float64
		for i := 0; ; i++ {
			if i == len(s.idx) {
				if whole || i == n {
					break // every token walked: all stay
				}
				// The head had too little mass: rank eight times more
				// (its first i ids are the same, in the same order), or
				// at once as many as the mass left needs at least, none
				// of the rest being likelier than the last: a flat
				// distribution then sorts once, not four times. The
				// order is the scaled logits', made again: keeping a
				// copy for this seldom walk cost every draw a pass.
				need := float64(i)
				if last := float64(prob(s.idx[i-1])); last > 0 {
					need += (float64(s.opt.TopP) - acc) / last
				}
				var pm float32
				s.pre, _, pm = s.penalized(s.pre[:0], logits, history)
				s.scale(s.pre, pm)
				s.rank(s.pre, int(min(float64(n), max(float64(8*i), need))))
			}
			acc += float64(prob(s.idx[i]))
			if acc >= float64(s.opt.TopP) {
				cut = s.idx[:i+1]
				break
			}
		}
	}
	if all || cut == nil {
		for i := range dst {
			dst[i] = prob(int32(i))
		}
	} else {
		for _, id := range cut {
			dst[id] = prob(id)
		}
	}
	return dst, cut
}

// penalized appends logits to dst with NaN read as −Inf and the repeat
// penalty applied, and returns the largest (best −1 when every one is
// −Inf).
func (s *Sampler) penalized(dst, logits []float32, history []int32) (_ []float32, best int, m float32) {
	dst = append(dst[:0], logits...)
	best, m = -1, float32(math.Inf(-1))
	for i, x := range dst {
		if x != x { // NaN never wins and is never drawn
			dst[i] = float32(math.Inf(-1))
		} else if x > m {
			best, m = i, x
		}
	}
	if len(dst) > 0 && s.penalizes(history) {
		s.penalize(dst, history)
		if best, m = topAfterPenalty(dst, history, best, m); math.IsInf(float64(m), -1) {
			best = -1 // the penalty took the last finite ones to −Inf
		}
	}
	return dst, best, m
}

// scale applies the temperature and top-k to penalised logits x whose
// largest is m, and returns the largest after and whether top-k ranked
// every token with mass into s.idx (all of them −Inf is not that: softmax
// then spreads the mass over every token).
func (s *Sampler) scale(x []float32, m float32) (top float32, whole bool) {
	m = scaleFromTop(x, m, 1/s.opt.Temperature)
	n := len(x)
	if k := min(s.opt.TopK, n); k > 0 && k < n {
		s.rank(x, k)
		s.keepOnly(x, s.idx, float32(math.Inf(-1)))
		whole = x[s.idx[0]] > float32(math.Inf(-1))
	}
	return m, whole // top-k kept the largest
}

// scaleFromTop divides each logit's distance from m, the largest, by the
// temperature (multiplies it by inv = 1/T): the largest reads 0 and the
// rest less, so no temperature overflows float32. Scaling the logits
// themselves took every positive one to +Inf below T ≈ 1e-38, where the
// draw spread over them all instead of nearing the greedy token. An
// infinite m leaves x as it is: softmax gives the +Inf tokens all the
// mass, or spreads it evenly when every token is −Inf. It returns the
// largest value after: 0, or m when infinite.
func scaleFromTop(x []float32, m, inv float32) float32 {
	switch {
	case math.IsInf(float64(m), 0):
		return m
	case inv == 0 || math.IsInf(float64(inv), 1):
		for i, v := range x {
			x[i] = fromTop(v, m, inv)
		}
	default: // (m − m)·inv is 0 and −Inf·inv −Inf: no test a token
		for i, v := range x {
			x[i] = (v - m) * inv
		}
	}
	return 0
}

// fromTop is v's scaled distance from the largest logit m (finite), for
// any inv: an overflowing 1/T (T below 3e-39) or an infinite T.
func fromTop(v, m, inv float32) float32 {
	switch {
	case v == m:
		return 0 // not 0·Inf
	case math.IsInf(float64(v), -1):
		return v // not −Inf·0
	}
	return (v - m) * inv
}

// topAfterPenalty is argmax of x and its value once penalize has changed
// the history's tokens, m having been the largest before, at best (-1:
// none). Only those tokens moved: unless the largest was one of them and
// moved, the answer is it or one of theirs, without a pass over the
// vocabulary.
func topAfterPenalty(x []float32, history []int32, best int, m float32) (int, float32) {
	if best < 0 || x[best] != m {
		best = int(argmax(x))
		return best, x[best]
	}
	for _, id := range history {
		if i := int(id); i >= 0 && i < len(x) && (x[i] > m || x[i] == m && i < best) {
			best, m = i, x[i] // ties to the lowest index, as argmax
		}
	}
	return best, m
}

// penalize applies the repeat penalty to each distinct token of the window.
func (s *Sampler) penalize(logits []float32, history []int32) {
	if !s.penalizes(history) {
		return
	}
	pen := s.opt.RepeatPenalty
	if n := s.opt.RepeatLastN; n > 0 && n < len(history) {
		history = history[len(history)-n:]
	}
	clear(s.seen)
	for _, id := range history {
		if id < 0 || int(id) >= len(logits) {
			continue
		}
		if _, done := s.seen[id]; done {
			continue
		}
		s.seen[id] = struct{}{}
		if logits[id] > 0 {
			logits[id] /= pen
		} else {
			logits[id] *= pen
		}
	}
}

// rankHead is how many of the most likely tokens top-p ranks first. A
// model's next-token distribution puts its mass on a few tokens, so the
// walk seldom needs more; when it does, it ranks eight times as many.
const rankHead = 64

// rank sets s.idx to the m best token ids of v in order: by value, then
// by id. Top-k and top-p read only the head of that order, so while m is
// small against the vocabulary a bounded heap finds it in one pass:
// sorting a 32000-token vocabulary took 11 ms a token. Heap and sort
// compare keys that hold the order themselves (rankKey), not values
// through a comparison function: that made a flat distribution's top-p,
// which ranks the whole vocabulary, cost 5 ms. v has no NaN.
func (s *Sampler) rank(v []float32, m int) {
	n := len(v)
	h := s.keys[:0]
	switch {
	case m <= 0:
	case m*4 >= n:
		for i, x := range v {
			h = append(h, rankKey(x, i))
		}
		h, s.spare = radixSort(h, s.spare)
	default:
		// A max-heap of the best m keys so far, the worst of them at
		// h[0]. Ids come in increasing order, so a newcomer that ties the
		// worst has the larger key and stays out: once the heap is full,
		// only a value above the worst's enters, and a float compare
		// turns the rest away before their key is built (keys and
		// compares were a third of a 32000-token top-p draw).
		for i, x := range v[:m] {
			h = append(h, rankKey(x, i))
			for c := len(h) - 1; c > 0; {
				p := (c - 1) / 2
				if h[c] < h[p] {
					break
				}
				h[c], h[p] = h[p], h[c]
				c = p
			}
		}
		worst := keyValue(h[0])
		for i := m; i < n; i++ {
			if !(v[i] > worst) {
				continue
			}
			h[0] = rankKey(v[i], i)
			for p := 0; ; {
				c := 2*p + 1
				if c >= m {
					break
				}
				if c+1 < m && h[c+1] > h[c] {
					c++ // the worse child
				}
				if h[c] < h[p] {
					break
				}
				h[c], h[p] = h[p], h[c]
				p = c
			}
			worst = keyValue(h[0])
		}
		slices.Sort(h)
	}
	s.idx = s.idx[:0]
	for _, k := range h[:max(m, 0)] {
		s.idx = append(s.idx, int32(uint32(k)))
	}
	s.keys = h
}

// radixSort sorts keys whose low 32 bits ascend (ids in the order rank
// appends them) by their high 32 bits, stably, so by the whole key: byte
// by byte from the lowest, a pass for each byte that is not the same in
// every key. It returns the sorted keys and the other buffer. Sorting
// 32000 keys by comparisons took 2 ms.
func radixSort(keys, spare []uint64) (sorted, other []uint64) {
	if len(keys) == 0 {
		return keys, spare
	}
	spare = slices.Grow(spare[:0], len(keys))[:len(keys)]
	for shift := 32; shift < 64; shift += 8 {
		var at [257]int
		for _, k := range keys {
			at[k>>shift&0xff+1]++
		}
		if at[keys[0]>>shift&0xff+1] == len(keys) {
			continue // one value of this byte: the pass moves nothing
		}
		for b := 1; b < len(at); b++ {
			at[b] += at[b-1]
		}
		for _, k := range keys {
			b := k >> shift & 0xff
			spare[at[b]] = k
			at[b]++
		}
		keys, spare = spare, keys
	}
	return keys, spare
}

// rankKey is token i's place in rank's order as a number: the larger
// value first (±0 alike), then the lower id.
func rankKey(x float32, i int) uint64 {
	b := math.Float32bits(x + 0) // -0 + 0 is +0
	if b>>31 == 0 {
		b |= 1 << 31 // non-negative: above every negative
	} else {
		b = ^b // negative: the more negative, the lower
	}
	return uint64(^b)<<32 | uint64(i)
}

// keyValue is the value a rankKey was made from (+0 for ±0).
func keyValue(k uint64) float32 {
	b := ^uint32(k >> 32)
	if b>>31 == 1 {
		return math.Float32frombits(b &^ (1 << 31))
	}
	return math.Float32frombits(^b)
}

// keepOnly sets every entry of p but those at ids to drop.
func (s *Sampler) keepOnly(p []float32, ids []int32, drop float32) {
	s.kept = s.kept[:0]
	for _, id := range ids {
		s.kept = append(s.kept, p[id])
	}
	for i := range p {
		p[i] = drop
	}
	for j, id := range ids {
		p[id] = s.kept[j]
	}
}

// penalizes reports whether the repeat penalty changes any logit for
// history.
func (s *Sampler) penalizes(history []int32) bool {
	pen := s.opt.RepeatPenalty
	return pen > 0 && pen != 1 && len(history) > 0
}

// argmax returns the index of the largest value, the lowest index on
// ties, reading NaN as -Inf (so logits need no copy to clear them); 0 when
// there is none. The top stays in a register: reading x[best] each time
// cost a third more.
func argmax(x []float32) int32 {
	best, top := 0, float32(math.Inf(-1))
	for i, v := range x {
		if v > top {
			best, top = i, v
		}
	}
	return int32(best)
}

// weights sets x, whose largest value is m, to softmax's unnormalised
// weights and returns the factor that normalises them: p_i is
// float32(float64(x_i) · inv). The exponentials are the kernels' (eight
// at a time on AVX2): with math.Exp they were two thirds of a top-p
// draw. A multiply by the inverse, not a division: a division cost as
// much as the exponentials.
func weights(x []float32, m float32) (inv float64) {
	if !math.IsInf(float64(m), 0) {
		return 1 / kernels.ExpSum(x, m)
	}
	// All -Inf: nothing to prefer, so uniform. Some +Inf: they share
	// all the mass.
	var sum float64
	for i, v := range x {
		if v == m || m < 0 {
			x[i] = 1
			sum++
		} else {
			x[i] = 0
		}
	}
	return 1 / sum
}

func normalize(p []float32) {
	var sum float64
	for _, v := range p {
		sum += float64(v)
	}
	if sum <= 0 {
		return
	}
	inv := 1 / sum
	for i := range p {
		p[i] = float32(float64(p[i]) * inv)
	}
}
