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
// A step of d ≤ batch decoding members and p prefill tokens costs
// A + B·d + C·p ≥ d·(A/batch + B) + C·p, so request i needs at least
// w_i = (tokens_i - 1)·(A/batch + B) + prompt_i·C of lane time, where
// tokens_i is its mandatory output (its natural length, cut to MinTokens
// when it has one: every optional token may be shed). For the quantile to
// be R, every request that arrived by time a, except the k = n-1-⌊q(n-1)⌋
// slowest, must be finished by a+R, and the lanes have done at most
// lanes·(a+R-first arrival) of work by then. So R ≥ (W(≤a) - the k
// largest w in it)/lanes - (a - first arrival) for every arrival time a.
// Also, a request takes at least one step per token, each costing at
// least A+B (A+C·prompt for its prefill), and at most k requests may take
// longer than R, so R is at least the (k+1)-th largest of those times.
//
// The bound lets work spread over the lanes perfectly and every request
// be served at full batch, so it is optimistic: no schedule reaches it.
func ResponseFloor(reqs []WorkRequest, lane StepCosts, lanes, batch int, q float64, promptTokens func(string) int) time.Duration {
	n := len(reqs)
	if n == 0 || lanes <= 0 || batch <= 0 {
		return 0
	}
	if promptTokens == nil {
		promptTokens = simPromptTokens
	}
	k := n - 1 - int(math.Floor(q*float64(n-1)))
	perToken := lane.A.Seconds()/float64(batch) + lane.B.Seconds()
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
		prefill := float64(promptTokens(r.Prompt)) * lane.C.Seconds()
		w := decode*perToken + prefill
		own = append(own, lane.A.Seconds()+prefill+decode*(lane.A+lane.B).Seconds())
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
		best = math.Max(best, (total-largestSum)/float64(lanes)-(r.Arrival-first).Seconds())
	}
	slices.Sort(own)
	best = math.Max(best, own[n-1-k])
	return time.Duration(best * float64(time.Second))
}
