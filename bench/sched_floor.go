package bench

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
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
// Lanes whose members cost more the longer their context (StepCosts.D)
// are priced at the mean context of the tokens it counts (MeanContext):
// exact for the work, since the cost is linear in the context, and an
// average for each request's own time.
func ResponseFloor(reqs []WorkRequest, lanes []StepCosts, batch int, q float64, promptTokens func(string) int) time.Duration {
	n := len(reqs)
	if n == 0 || len(lanes) == 0 || batch <= 0 {
		return 0
	}
	if promptTokens == nil {
		promptTokens = simPromptTokens
	}
	meanCtx := MeanContext(reqs, promptTokens)
	lanes = slices.Clone(lanes)
	for i := range lanes {
		lanes[i] = lanes[i].AtContext(meanCtx)
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
		decode := float64(max(floorTokens(r)-1, 0))
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

// floorTokens is the output of r that no schedule may shed: its natural
// length, cut to MinTokens when it has one.
func floorTokens(r WorkRequest) int {
	tokens := min(r.Natural, r.MaxTokens)
	if r.MinTokens > 0 {
		tokens = min(tokens, r.MinTokens)
	}
	return tokens
}

// MeasuredWork returns reqs with each Natural set to the answer the real
// model gave it in runs, so that ResponseFloor can bound the real engine,
// whose answer lengths are the model's rather than the workload's. A
// request's length is the fewest tokens it generated in a run that ended
// it by a stop token or its budget; where every run shed or cancelled it,
// the most it got in any, which can only undercount its work and so
// keeps the floor a bound. Every run must hold every request.
func MeasuredWork(reqs []WorkRequest, runs []Run) ([]WorkRequest, error) {
	type measured struct{ complete, partial int }
	byID := make(map[string]*measured, len(reqs))
	for _, r := range reqs {
		byID[r.ID] = &measured{complete: -1}
	}
	for _, run := range runs {
		if len(run.Outcomes) != len(reqs) {
			return nil, fmt.Errorf("bench: a %s run holds %d outcomes for %d requests", run.Policy, len(run.Outcomes), len(reqs))
		}
		for _, o := range run.Outcomes {
			m := byID[o.Req.ID]
			if m == nil {
				return nil, fmt.Errorf("bench: a %s run holds request %q, which is not in the workload", run.Policy, o.Req.ID)
			}
			switch n := o.Result.TotalGenerated; o.Result.Reason {
			case sched.ReasonStop, sched.ReasonLength:
				if m.complete < 0 || n < m.complete {
					m.complete = n
				}
			default:
				m.partial = max(m.partial, n)
			}
		}
	}
	out := slices.Clone(reqs)
	for i := range out {
		m := byID[out[i].ID]
		out[i].Natural = m.partial
		if m.complete >= 0 {
			out[i].Natural = m.complete
		}
	}
	return out, nil
}

// CapacityLanes turns a live capacity (tokens per second with every lane
// at full batch, measured on the workload) into step costs for
// ResponseFloor: each lane gets a share in proportion to its full-batch
// rate in isolation, charged per member (B) with no per-step part, and
// prefill folded into that rate as the capacity measured it. Lanes
// sharing a machine and long contexts make the live figure slower than
// the lanes alone, and it is the live one the runs are loaded from.
func CapacityLanes(capacity float64, isolated []StepCosts, batch int) []StepCosts {
	var total float64
	for _, l := range isolated {
		total += l.Capacity(batch)
	}
	out := make([]StepCosts, len(isolated))
	for i, l := range isolated {
		share := 1 / float64(len(isolated))
		if total > 0 && !math.IsInf(total, 1) {
			share = l.Capacity(batch) / total
		}
		out[i] = StepCosts{Name: l.Name, B: time.Duration(float64(time.Second) / (capacity * share)), MaxSeqs: l.MaxSeqs, Context: l.Context}
	}
	return out
}
