package bench

import (
	"math"
	"slices"
	"time"
)

// ResponseFloor is a lower bound on the q-quantile of response time that
// any policy can reach on reqs with these lanes and at most batch members
// per step: the benchmark's yardstick for how far a policy is from the
// best possible, the way a bandwidth bound is for decode.
//
// On lane i a step of d ≤ batch decoding members and p prefill tokens
// costs A_i + B_i·d + C_i·p ≥ d·p_i + C_i·p, with p_i = A_i/batch + B_i
// the least lane time a decoded token takes there. So in time T the
// lanes decode at most R·T - Q·κ tokens while prefilling Q, where
// R = Σ 1/p_i and κ = min C_i/p_i: request i needs at least
// w_i = ((tokens_i - 1) + prompt_i·κ)/R of the lanes' time together, where
// tokens_i is its mandatory output (its natural length, cut to MinTokens
// when it has one: every optional token may be shed). (For identical
// lanes that is ((tokens_i - 1)·p + prompt_i·C)/lanes.) For the quantile
// to be R', every request that arrived by time a, except the
// k = n-1-⌊q(n-1)⌋ slowest, must be finished by a+R', so
// R' ≥ W(≤a) - the k largest w in it - (a - first arrival) for every
// arrival time a. Also, a request takes at least one step per token, each
// costing at least A+B on its lane (A+C·prompt for its prefill), and at
// most k requests may take longer than R', so R' is at least the (k+1)-th
// largest of those times on the fastest lane for each.
//
// The bound lets work spread over the lanes perfectly and every request
// be served at full batch, so it is optimistic: no schedule reaches it.
func ResponseFloor(reqs []WorkRequest, lanes []StepCosts, batch int, q float64, promptTokens func(string) int) time.Duration {
	n := len(reqs)
	if n == 0 || len(lanes) == 0 || batch <= 0 {
		return 0
	}
	if promptTokens == nil {
		promptTokens = simPromptTokens
	}
	k := n - 1 - int(math.Floor(q*float64(n-1)))
	var rate float64 // decoded tokens per second, every lane at full batch
	kappa := math.Inf(1)
	for _, l := range lanes {
		perToken := l.A.Seconds()/float64(batch) + l.B.Seconds()
		rate += 1 / perToken
		kappa = math.Min(kappa, l.C.Seconds()/perToken)
	}
	byArrival := slices.Clone(reqs)
	slices.SortStableFunc(byArrival, func(a, b WorkRequest) int { return int(a.Arrival - b.Arrival) })
	first := byArrival[0].Arrival
	var total, best float64
	own := make([]float64, 0, n)
	largest := make([]float64, 0, k+1) // the k largest w so far, ascending
	var largestSum float64
	for _, r := range byArrival {
		tokens := min(r.Natural, r.MaxTokens)
		if r.MinTokens > 0 {
			tokens = min(tokens, r.MinTokens)
		}
		decode := float64(max(tokens-1, 0))
		prompt := float64(promptTokens(r.Prompt))
		w := (decode + prompt*kappa) / rate
		fastest := math.Inf(1)
		for _, l := range lanes {
			fastest = math.Min(fastest, l.A.Seconds()+prompt*l.C.Seconds()+decode*(l.A+l.B).Seconds())
		}
		own = append(own, fastest)
		total += w
		if k > 0 {
			i, _ := slices.BinarySearch(largest, w)
			largest = slices.Insert(largest, i, w)
			largestSum += w
			if len(largest) > k {
				largestSum -= largest[0]
				largest = largest[1:]
			}
		}
		best = math.Max(best, total-largestSum-(r.Arrival-first).Seconds())
	}
	slices.Sort(own)
	best = math.Max(best, own[n-1-k])
	return time.Duration(best * float64(time.Second))
}
