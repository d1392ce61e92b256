package sched

import (
	"math"
	"slices"
	"time"
)

// agingSteps scales how fast a request past the slack clamp gains
// priority: every this many decode steps' worth of lateness add one to
// its numerator (which starts at most 1), so a long request overtakes
// fresh short ones within a bounded wait and nothing starves.
const agingSteps = 64

// rankSteps is how many full-batch steps a waiting request's priority is
// reused before it is computed again. Priorities drift slowly (aging
// adds one to the numerator in agingSteps steps), and recomputing every waiting
// request's at every admission made ranking the scheduler's largest cost
// with a deep queue.
const rankSteps = 4

// before reports whether a is served before b: the strict priority class
// first, then (tandem) what its deadline still has at stake (stake), then
// the policy's rank, then arrival order.
func before(a, b *task) bool {
	if a.req.Priority != b.req.Priority {
		return a.req.Priority > b.req.Priority
	}
	if a.stake != b.stake {
		return a.stake > b.stake
	}
	if a.pri != b.pri {
		return a.pri > b.pri
	}
	return a.seqNo < b.seqNo
}

// ranker computes priorities for one plan of one lane: the lane's
// measured costs and the score normalisation are read once, not per
// request.
type ranker struct {
	s        *Scheduler
	now      time.Time
	eta      time.Duration // η: time per token per member, at one more member than now
	minSlack time.Duration
	phi      time.Duration
	uNorm    float64       // the score that normalises û to 1: the 99th percentile of recent scores
	reuse    time.Duration // how long a computed priority stays valid
}

func (s *Scheduler) ranker(l *lane, now time.Time) ranker {
	eta := l.cost.perToken(len(l.running) + 1)
	r := ranker{s: s, now: now, eta: eta, minSlack: s.cfg.MinSlack, phi: s.cfg.Phi,
		uNorm: math.Max(1, s.quant.at(0.99, 1)), reuse: rankSteps * l.cost.step(s.cfg.MaxBatch, 0)}
	if r.minSlack <= 0 {
		r.minSlack = max(2*eta, time.Microsecond)
	}
	if r.phi <= 0 {
		r.phi = 8 * l.cost.perToken(1)
	}
	return r
}

// rank is the policy's priority of t (higher first).
func (r ranker) rank(t *task) float64 {
	switch r.s.cfg.Policy {
	case FIFO:
		return 0 // arrival order breaks the tie
	case LUF:
		return -math.Max(t.score-float64(len(t.generated)), 0)
	case EDF:
		return -r.deadline(t).Sub(r.s.started).Seconds()
	case RTLM:
		return t.static
	}
	return r.tandem(t)
}

// stake is what a request's deadline still has at stake, in TimelyLLM's
// view of deadlines as utilities: a request without a deadline loses
// nothing by waiting a step.
type stake int8

const (
	noStake   stake = iota // no deadline, or finishing now earns no utility
	lateStake              // the deadline will be missed, but finishing now still earns utility
	onTime                 // served now, it meets its deadline
)

// stake classifies t at the ranker's time. Tandem serves requests that
// can meet their deadline first, then those whose utility has not yet
// fallen to zero (a robot still waits for a late plan), then the rest,
// among which a request past its utility ages like any other. Letting a
// missed deadline fall back at once left it behind the backlog: on
// stories260K at load 1.6 and 20% adversarial prompts, a run's missed
// planners finished up to 277 ms late at the 90th percentile (median of
// 15 runs), and 5 ms with this class, for about two points fewer
// deadlines met (docs/scheduling.md, "Late deadlines").
func (r ranker) stake(t *task) stake {
	if r.s.cfg.Policy != Tandem || t.deadline.IsZero() {
		return noStake
	}
	rest := math.Max(t.score-float64(len(t.generated)), 1)
	done := r.now.Add(time.Duration(rest * float64(r.eta)))
	switch {
	case !done.After(t.deadline):
		return onTime
	case done.Before(t.deadline.Add(t.req.Utility.window(t.relDL))):
		return lateStake
	}
	return noStake
}

// deadline is t's deadline, or RT-LM's implicit one: r + φ·prompt length.
func (r ranker) deadline(t *task) time.Time {
	if !t.deadline.IsZero() {
		return t.deadline
	}
	return t.arrival.Add(time.Duration(t.promptLen) * r.phi)
}

// tandem is p = (1-α·û) / max(d - now - η·u_rest, m) with û the score
// normalised to [0,1] (so the numerator stays positive) and the slack
// clamped to m, a couple of decode steps. Past the clamp the priority
// keeps growing with the shortfall (aging): the shortfall in units of
// agingSteps decode steps is added to the numerator, not multiplied
// with it. Among overdue requests the order then tends to that of their
// (implicit) deadlines, whatever their scores: the tail of response times
// is set by the longest-waiting requests, and the published form scaled
// a long request's aging down by its own uncertainty, so it kept losing
// to later, shorter ones (p99 −14% against FIFO in the simulator at 20%
// adversarial prompts, −22% with the sum; see docs/scheduling.md).
func (r ranker) tandem(t *task) float64 {
	rest := math.Max(t.score-float64(len(t.generated)), 1)
	uhat := math.Min(1, t.score/r.uNorm)
	ref := r.now
	if !r.s.feat.aging {
		ref = t.arrival
	}
	d := r.deadline(t)
	slack := d.Sub(ref) - time.Duration(rest*float64(r.eta))
	num := 1 - r.s.cfg.Alpha*uhat
	if slack >= r.minSlack {
		return num / slack.Seconds()
	}
	short := (r.minSlack - slack).Seconds()
	return (num + short/(agingSteps*r.eta.Seconds())) / r.minSlack.Seconds()
}

// rtlm is RT-LM's published priority on raw token counts,
// p = (1-α'·u) / (d - r - η·u), computed once at arrival (r.now). α' =
// α/u_norm makes it agree with the normalised form while u stays below
// u_norm; a longer request turns the numerator negative, and a slack
// below zero turns the denominator negative: both flip the order.
func (r ranker) rtlm(t *task) float64 {
	alpha := r.s.cfg.Alpha / r.uNorm
	slack := r.deadline(t).Sub(r.now) - time.Duration(t.score*float64(r.eta))
	if slack == 0 {
		slack = time.Nanosecond
	}
	return (1 - alpha*t.score) / slack.Seconds()
}

// tandemPriority and rtlmPriority compute one priority (tests, arrival).
func (s *Scheduler) tandemPriority(t *task, l *lane, now time.Time) float64 {
	return s.ranker(l, now).tandem(t)
}

func (s *Scheduler) rtlmPriority(t *task, l *lane, now time.Time) float64 {
	if s.cfg.Policy != RTLM {
		return 0
	}
	return s.ranker(l, now).rtlm(t)
}

// admit moves waiting requests into l's batch: up to b·C candidates in
// priority order, consolidated by u, each passing admission control and
// finding a sequence slot (evicting a parked sequence if needed). A
// secondary lane that admits from one queue and still has room fills it
// from the others (see fill). It reports whether admission control
// refused a candidate (overload). limit is the plan's batchCap.
func (s *Scheduler) admit(l *lane, now time.Time, limit int) (refused bool) {
	free := limit - len(l.running)
	if free <= 0 {
		return false
	}
	k := int(math.Ceil(s.cfg.Lookahead * float64(s.cfg.MaxBatch)))
	r := s.ranker(l, now)
	p := s.sources(l, now)
	free, refused = s.take(l, s.topK(p, l, r, k), free, now)
	if free > 0 && p.own >= 0 {
		_, more := s.take(l, s.topK(s.fill(l, p.own), l, r, k), free, now)
		refused = refused || more
	}
	return refused
}

// take admits cands (in priority order) into l's batch while it has free
// slots, and returns the slots left and whether admission control
// refused a candidate.
func (s *Scheduler) take(l *lane, cands []*task, free int, now time.Time) (left int, refused bool) {
	if len(cands) == 0 {
		return free, false
	}
	if s.feat.consolidation {
		cands = s.consolidate(cands)
	}
	var off offloadCheck // every candidate pays on a lane alike in speed
	if s.feat.routing {
		off = s.offload(l)
	}
	for _, t := range cands {
		if free == 0 {
			break
		}
		if !off.pays(t) {
			// Left to the fastest lane: wake it. It may have slept since
			// it last planned, when the costs said the other way round (a
			// lane's measured cost moves with its load), and then no lane
			// served the request. Under the race detector on a loaded
			// machine, two alike CPU lanes stalled so in 4 of 4200 runs of
			// TestLiveSchedulerMatchesReference (one hung CI), and in
			// none of 1500 since.
			off.fastest.cond.Signal()
			continue
		}
		if s.feat.admission && !s.admissible(l, t, now) {
			refused = true
			s.stats.deferred++
			continue
		}
		if !t.hasSeq && l.held >= l.info.MaxSeqs && !s.evict(l) {
			break
		}
		s.removeWaiting(t)
		t.state = running
		t.lane = l.idx
		l.running = append(l.running, t)
		if !t.hasSeq {
			t.starting = true
			l.held++
		}
		free--
	}
	return free, refused
}

// fill is the pool a secondary lane tops its batch up from once its own
// queue (own) has nothing more to give: every other queue. Routing keeps
// long requests off the primary, not short ones off the secondary; a
// secondary lane that idled with short requests waiting made tandem's
// mean response time at light load 40% above FIFO's (stories260K, 40%
// adversarial prompts, load 0.6; docs/scheduling.md).
func (s *Scheduler) fill(l *lane, own int) pool {
	qs := l.others[:0]
	for j, q := range s.queues {
		if j != own {
			qs = append(qs, q)
		}
	}
	l.others = qs
	return pool{queues: qs, own: -1}
}

// sources are the queues l admits from. With one shared queue, that
// one. With routing, the primary lane ranks every queue together: a
// routed (long) request waits for the secondary lane only while the
// primary has something more urgent, so once it has aged past the
// primary's own queue the primary takes it. Keeping long requests off the
// primary altogether until its queue ran dry left them a lane's capacity
// while their backlog grew, and that set the tail of response times (p99
// in the simulator 5643 → 5228 s at 40% adversarial prompts, 1036 → 898 s
// at none; docs/scheduling.md). A secondary lane admits from one queue
// (source), and from the others requests whose deadline is at stake
// first: with the long requests routed to it, a planner otherwise had
// only the primary, which met 80% of deadlines where FIFO on both lanes
// met 95% (stories260K, 40% adversarial, load 0.6; docs/scheduling.md).
// Room left after that is filled from the other queues (fill).
func (s *Scheduler) sources(l *lane, now time.Time) pool {
	qs := l.sources[:0]
	p := pool{own: -1}
	switch {
	case len(s.queues) == 1:
		qs = append(qs, s.queues[0])
	case l.idx == 0:
		qs = append(qs, s.queues...)
	default:
		p.own = s.source(l)
		qs = append(qs, s.queues[p.own])
		p.urgent = s.deadlined(now)
		if p.own != l.idx {
			// Requests preempted here (or resumed after a segment) wait
			// in this lane's queue, and no other lane can run them
			// without their cache: serving another queue left them
			// waiting until that backlog was gone. With stories260K's
			// costs in the simulator at 20% adversarial prompts, 5 to 16
			// runs in 80 had long answers finish up to 0.5 s after the
			// rest for one preemption each; none since.
			p.pinned = s.queues[l.idx]
		}
	}
	l.sources = qs
	p.queues = qs
	return p
}

// pool is what a lane admits from: whole queues, and (a secondary lane)
// the requests with a deadline at stake that wait in the other queues.
type pool struct {
	queues [][]*task
	urgent []*task // tasks with deadlines, earliest first (deadlined), any state or queue
	own    int     // the queue in queues of a secondary lane, or -1
	// pinned is a queue not in queues whose requests with their sequence
	// on this lane it admits too: its own, while it serves another.
	pinned []*task
}

// source picks the queue a secondary lane admits from: its own, unless
// its own is empty or another lane's backlog takes more than twice as
// long to drain at each lane's measured full-batch speed. This keeps it
// from idling or the primary drowning (the τ quantile sends most requests
// to the primary).
func (s *Scheduler) source(l *lane) int {
	own := s.drain(l.idx)
	best, worst := l.idx, own
	for j := range s.queues {
		if j == l.idx {
			continue
		}
		if d := s.drain(j); d > worst {
			best, worst = j, d
		}
	}
	if best != l.idx && (len(s.queues[l.idx]) == 0 || worst > 2*own) {
		return best
	}
	return l.idx
}

// drain is the time lane i needs to serve its queue at full batch.
func (s *Scheduler) drain(i int) time.Duration {
	r := s.lanes[i].cost.rate(s.cfg.MaxBatch)
	if r <= 0 {
		return 0
	}
	return time.Duration(s.qtokens[i] / r * float64(time.Second))
}

// SlowLane is how many times longer a lane's time per token at full
// batch may be than the fastest lane's before it counts as much slower
// (the benchmark measures answer lengths only on lanes within it):
// routing then sends it the short requests (route), offloadCheck weighs
// what it takes, and it keeps its full batch (batchCap). Lanes within it
// (alike CPU lanes) serve whatever routing and their queues give them.
const SlowLane = 1.5

// offloadCheck says whether lane l should serve t rather than leave it to
// the fastest lane: always on a lane within SlowLane of the fastest, else
// only when t's predicted tokens left take no longer on l than they would
// on the fastest lane after its backlog. A CPU lane many times slower
// than a GPU lane beside it then takes short requests while the GPU is
// backed up, not long ones: in the simulator, with a second lane 29
// times slower at full batch, the long answers it served set tandem's
// p99 at 35% above FIFO's at 20% adversarial prompts (docs/scheduling.md,
// "Lanes that differ"). take asks it of every candidate, so what it
// reads of the lanes is worked out once (offload). A request whose
// sequence lives on l (preempted, or resumed after a segment) always
// pays: no other lane can run it without its cache, so refusing it left
// it waiting for good.
type offloadCheck struct {
	lane         int
	slow         bool
	fastest      *lane
	mine, theirs float64 // seconds per token at full batch, on l and on the fastest lane
	fastBacklog  float64 // seconds
}

func (s *Scheduler) offload(l *lane) offloadCheck {
	f, slow := s.muchSlower(l)
	if !slow {
		return offloadCheck{}
	}
	n := s.cfg.MaxBatch
	return offloadCheck{lane: l.idx, slow: true, fastest: f, mine: l.cost.perToken(n).Seconds(), theirs: f.cost.perToken(n).Seconds(),
		fastBacklog: s.backlog(f).Seconds()}
}

func (c offloadCheck) pays(t *task) bool {
	if !c.slow || t.hasSeq && t.lane == c.lane {
		return true
	}
	left := remaining(t)
	return left*c.mine <= c.fastBacklog+left*c.theirs
}

// muchSlower reports whether l's time per token at full batch is more
// than SlowLane times the fastest lane's, and returns the fastest lane.
// Only lanes whose costs are known (measured or seeded) are compared: the
// prior a lane starts from is far slower than any real engine, and a lane
// that had not run yet counted as much slower, so it was routed only
// short requests and took only what paid, and at light load never ran
// to learn otherwise.
func (s *Scheduler) muchSlower(l *lane) (fastest *lane, slow bool) {
	n := s.cfg.MaxBatch
	f := s.lanes[0]
	known := false
	for _, o := range s.lanes {
		if o.cost.known && (!known || o.cost.perToken(n) < f.cost.perToken(n)) {
			f, known = o, true
		}
	}
	if !known || !l.cost.known {
		return f, false
	}
	return f, l.cost.perToken(n).Seconds() > SlowLane*f.cost.perToken(n).Seconds()
}

// backlog is how long a request would wait for lane l: nothing while it
// has a free slot and nothing waits, else the predicted tokens waiting in
// every queue and left to its running members, at its full-batch rate.
func (s *Scheduler) backlog(l *lane) time.Duration {
	var work float64
	for _, q := range s.qtokens {
		work += q
	}
	if work == 0 && len(l.running) < s.cfg.MaxBatch {
		return 0
	}
	for _, t := range l.running {
		work += remaining(t)
	}
	r := l.cost.rate(s.cfg.MaxBatch)
	if r <= 0 {
		return 0
	}
	return time.Duration(work / r * float64(time.Second))
}

// awaitsAffine reports whether a lane other than the one routing chose
// for the context its engine keeps (affinity) leaves t to that lane:
// while it has room in its batch and t has waited less than two of its
// steps (at least affinityWait). A lane planning when t arrives would
// otherwise take it and prefill its whole context; one whose batch
// stays full leaves it to the others.
func (s *Scheduler) awaitsAffine(t *task, now time.Time) bool {
	return len(s.lanes[t.lane].running) < s.cfg.MaxBatch && now.Sub(t.arrival) < s.affinityHold(t)
}

// affinityHold is how long after its arrival the other lanes leave t to
// the lane its affinity chose (while that lane has room in its batch):
// two of its steps, at least affinityWait.
func (s *Scheduler) affinityHold(t *task) time.Duration {
	a := s.lanes[t.lane]
	return max(2*a.cost.step(max(len(a.running), 1), 0), affinityWait)
}

// affinityWait is the least time awaitsAffine holds a request for its
// lane: one that has not measured its steps yet, or steps in
// microseconds, may be mid-plan when the request arrives.
const affinityWait = 10 * time.Millisecond

// topK returns the k most urgent waiting requests in p that this lane
// can run, in service order. It computes each priority once per plan.
func (s *Scheduler) topK(p pool, l *lane, r ranker, k int) []*task {
	top := l.top[:0]
	defer func() { l.top = top[:0] }()
	now := r.now.UnixNano() // compared per task: cheaper than time.Time
	// The urgent list is walked after the queues, as one more source of
	// which only waiting requests at stake outside own count; then the
	// pinned queue, of which only requests with their sequence here.
	for qi := 0; qi <= len(p.queues)+1; qi++ {
		urgentOnly, pinnedOnly := qi == len(p.queues), qi == len(p.queues)+1
		var q []*task
		switch {
		case pinnedOnly:
			q = p.pinned
		case urgentOnly:
			q = p.urgent
		default:
			q = p.queues[qi]
		}
		for _, t := range q {
			if t.lane != l.idx && (t.hasSeq || t.affine && s.awaitsAffine(t, r.now)) ||
				urgentOnly && (t.state != waiting || t.qi == p.own) ||
				pinnedOnly && (!t.hasSeq || t.inDeadline && t.stake > noStake) {
				// Its sequence lives on another lane, or the lane keeping
				// its context will take it; or (urgent) it is not waiting
				// elsewhere; or (pinned) any lane may run it, or the
				// urgent list had it.
				continue
			}
			if t.rankedBy != l.idx+1 || now >= t.rankedUntil {
				t.pri = r.rank(t)
				t.stake = r.stake(t)
				t.rankedUntil, t.rankedBy = now+int64(r.reuse), l.idx+1
			}
			if urgentOnly && t.stake == noStake || len(top) == k && !before(t, top[k-1]) {
				continue
			}
			i := len(top)
			top = append(top, t)
			for i > 0 && before(t, top[i-1]) {
				top[i] = top[i-1]
				i--
			}
			top[i] = t
			if len(top) > k {
				top = top[:k]
			}
		}
	}
	return top
}

// consolidate implements RT-LM's dynamic consolidation on the candidates
// (in priority order): sorted by u, cut into groups where u grows by more
// than λ× from one to the next or a group reaches C, and the group that
// holds the most urgent candidate is taken, in priority order. The rest
// stay queued for a later step. It filters cands in place.
func (s *Scheduler) consolidate(cands []*task) []*task {
	byU := append(s.byU[:0], cands...)
	s.byU = byU
	defer clear(byU) // hold no finished task
	slices.SortStableFunc(byU, func(a, b *task) int {
		switch {
		case a.score < b.score:
			return -1
		case a.score > b.score:
			return 1
		}
		return 0
	})
	first := cands[0]
	start := 0
	for i := 1; i <= len(byU); i++ {
		cut := i == len(byU) || i-start >= s.cfg.MaxBatch ||
			byU[i].score > s.cfg.Lambda*math.Max(byU[i-1].score, 1)
		if !cut {
			continue
		}
		group := byU[start:i]
		if slices.Contains(group, first) {
			out := cands[:0]
			for _, t := range cands {
				if slices.Contains(group, t) {
					out = append(out, t)
				}
			}
			return out
		}
		start = i
	}
	return cands[:1]
}

// remaining predicts the tokens t still generates: what the estimate
// leaves, at least a quarter of what it generated already (a request that
// outlived its estimate is probably long), within its limits.
func remaining(t *task) float64 {
	g := float64(len(t.generated))
	r := math.Max(t.score-g, math.Max(g/4, 1))
	r = math.Max(r, float64(t.req.MinTokens)-g)
	return math.Min(r, math.Max(float64(t.maxTokens)-g, 1))
}

// prefillTime is what l's cost model predicts t's prefill takes: none
// when t holds its sequence, else its context (prompt and what it
// generated before its sequence was evicted) less what the engine would
// take from a finished request's rows (prefix reuse).
func (s *Scheduler) prefillTime(l *lane, t *task) time.Duration {
	if t.hasSeq {
		return 0
	}
	n := t.promptLen + len(t.generated)
	if r, ok := l.eng.(prefixReuser); ok {
		n -= r.Reusable(t.req.Prompt, t.generated)
	}
	return l.cost.prefill(n)
}

// admissible is TimelyLLM's admission control: t may join only if every
// running request that meets its deadline now still meets it with one
// more member (and t's prefill) at the measured step time.
func (s *Scheduler) admissible(l *lane, t *task, now time.Time) bool {
	n := len(l.running)
	if n == 0 {
		return true
	}
	stepNow := l.cost.step(n, 0)
	stepMore := l.cost.step(n+1, 0)
	tps := math.Max(l.cost.tokPerStep, 1e-3)
	pre := time.Duration(-1) // t's prefill, priced once a deadline needs it
	for _, m := range l.running {
		if m.deadline.IsZero() {
			continue
		}
		steps := remaining(m) / tps
		if now.Add(time.Duration(steps * float64(stepNow))).After(m.deadline) {
			continue // misses anyway: t's admission does not change that
		}
		if pre < 0 {
			pre = s.prefillTime(l, t)
		}
		if now.Add(pre + time.Duration(steps*float64(stepMore))).After(m.deadline) {
			return false
		}
	}
	return true
}

// preempt makes room for the request with the earliest deadline it can
// still meet (at least alone) but not in the batch it has or would join:
// a waiting one admission left waiting (the lane is full, or its batch
// is too large for the request to finish in time), or a running one
// whose batch got too slow after it was admitted (the steps slowed as
// the members' contexts grew, or it outran its length estimate). It
// moves running requests without a deadline at stake, least urgent
// first, back to the queue with their sequences (they continue where
// they stopped when admitted again, or are rebuilt by prefill if evict
// took the sequence meanwhile), as many as the request needs to meet its
// deadline at the measured step time, and only if that many can go.
// Admission control then keeps the batch that small until the deadline
// passes. On a model whose step time grows with every member this is
// what keeps a planner's deadline in a full lane; where members are
// nearly free it rarely fires, since the full batch already meets the
// deadline. It reports whether it preempted anything. limit is the
// plan's batchCap.
//
// Admission control keeps new members from a running deadline, not the
// ones already beside it. With stories260K's costs, where a member at
// 450 tokens of context costs twice one at 70, planners admitted beside
// long answers ran in their full batches and missed; making room for
// running ones too met 4-17 points more deadlines (11 on average) on the
// real engine (docs/scheduling.md, "Preempting for a running deadline").
func (s *Scheduler) preempt(l *lane, now time.Time, limit int) bool {
	if len(l.running) == 0 {
		return false // admit took what it could; nothing runs to make room
	}
	qi := 0
	if len(s.queues) > 1 {
		qi = l.idx
	}
	tps := math.Max(l.cost.tokPerStep, 1e-3)
	// finish is when t would finish in a batch of m (t included).
	finish := func(t *task, m int) time.Time {
		return now.Add(s.prefillTime(l, t) + time.Duration(remaining(t)/tps*float64(l.cost.step(m, 0))))
	}
	// u: the earliest deadline among the waiting requests and the
	// running ones that miss it in this batch, that can be met alone.
	n := len(l.running)
	secondary := s.leavesDeadlinesToPrimary(l) // makes no room for a running deadline
	var u *task
	for _, t := range s.deadlined(now) { // earliest deadline first
		// Cheap tests first: this runs every step.
		switch {
		case t.state == running && t.lane == l.idx:
			if secondary || n == 1 || t.starting || t.prefilling || !finish(t, n).After(t.deadline) {
				continue
			}
		case t.state != waiting || t.qi != qi || (t.hasSeq && t.lane != l.idx):
			continue
		}
		if finish(t, 1).After(t.deadline) {
			continue
		}
		u = t
		break
	}
	if u == nil {
		return false
	}
	with := n + 1 // the batch u would run in
	if u.state == running {
		with = n
	}
	// The largest batch, u included, that still meets u's deadline.
	fits := 1
	for m := min(with, s.cfg.MaxBatch); m > 1; m-- {
		if !finish(u, m).After(u.deadline) {
			fits = m
			break
		}
	}
	if u.state == waiting {
		// Admission takes u only below the batch cap, which the deadlines
		// arriving may have set below the batch u would meet its deadline
		// in (or below the batch running). Room for that batch admitted
		// nothing, and u waited until its slack forced a smaller one: 2-5
		// ms of a planner's 7-9 ms, most of the planners' missed deadlines
		// with stories260K's costs in the simulator (docs/scheduling.md).
		fits = min(fits, limit)
	}
	need := with - fits // members that must leave
	if need <= 0 {
		return false
	}
	// Victims: running, past their start, without a deadline they could
	// still meet.
	r := s.ranker(l, now)
	var victims []*task
	for _, t := range l.running {
		if t == u || t.starting || t.prefilling || t.cancel != nil || (!t.deadline.IsZero() && !finish(t, 1).After(t.deadline)) {
			continue
		}
		t.pri = r.rank(t)
		victims = append(victims, t)
	}
	if len(victims) < need {
		return false
	}
	slices.SortFunc(victims, func(a, b *task) int {
		switch {
		case before(a, b):
			return 1
		case before(b, a):
			return -1
		}
		return 0
	})
	victims = victims[:need]
	for _, t := range victims {
		l.running = removeTask(l.running, t)
	}
	if u.state == waiting && !s.admissible(l, u, now) {
		// u would push a running deadline past its end even so.
		l.running = append(l.running, victims...)
		return false
	}
	for _, t := range victims {
		t.state = waiting
		t.rankedBy = 0
		s.queues[qi] = append(s.queues[qi], t)
		t.qi, t.qtok = qi, remaining(t)
		s.qtokens[qi] += t.qtok
		s.stats.preempted++
	}
	return true
}

// shed is imprecise computation under overload: when a running request
// is predicted to miss its deadline, or admission control refused a
// waiting one, or the most urgent waiting request with a deadline will
// miss it, or the queue is backlogged (see backlogged), the request with the least utility that has optional tokens
// left (MinTokens set, MaxTokens not reached) is cut to what it has, or
// to its MinTokens. One request per step, so shedding stays gradual. It
// reports whether it shed anything.
func (s *Scheduler) shed(l *lane, now time.Time, refused bool) bool {
	// Nothing to cut spares the checks (they read every running request
	// and the deadline list on every step).
	if len(s.withOptional) == 0 || !refused && !s.backlogged(l, now) && !s.missing(l, now) {
		return false
	}
	var victim *task
	better := func(a, b *task) bool { // a is a better victim than b
		va, _ := a.req.Utility.resolved(a.relDL)
		vb, _ := b.req.Utility.resolved(b.relDL)
		if a.req.Priority != b.req.Priority {
			return a.req.Priority < b.req.Priority
		}
		if va != vb {
			return va < vb
		}
		return optional(a) > optional(b)
	}
	consider := func(t *task) {
		if optional(t) > 0 && (victim == nil || better(t, victim)) {
			victim = t
		}
	}
	for _, t := range l.running {
		consider(t)
	}
	qi := 0
	if len(s.queues) > 1 {
		qi = l.idx
	}
	for _, t := range s.withOptional {
		if t.state == waiting && t.qi == qi {
			consider(t)
		}
	}
	if victim == nil {
		return false
	}
	victim.maxTokens = max(victim.req.MinTokens, len(victim.generated))
	victim.shed = true
	s.unlistOptional(victim)
	victim.score = math.Min(victim.score, float64(victim.maxTokens))
	victim.rankedBy = 0
	if victim.state == waiting {
		rest := remaining(victim)
		s.qtokens[victim.qi] += rest - victim.qtok
		victim.qtok = rest
	}
	s.stats.shedRequests++
	// Cut to what it has: it ends now, running or waiting (a resumed or
	// preempted request may be past its mandatory part).
	if len(victim.generated) >= victim.maxTokens {
		var ev Event
		s.flushText(victim, &ev)
		s.endAt(victim, ReasonShed, &ev, now)
	}
	return true
}

// optional is how many optional tokens t could still shed.
func optional(t *task) int {
	if t.req.MinTokens <= 0 || t.shed {
		return 0
	}
	return t.maxTokens - max(t.req.MinTokens, len(t.generated))
}

// shedHorizon is the backlog, in full-batch steps, past which a lane
// counts as overloaded: its queue would take this long to drain even if
// nothing else arrived.
const shedHorizon = 128

// overloadHorizon is the shorter backlog, in full-batch steps, past which
// a lane sheds while the offered load exceeds the lanes' capacity. Then
// the queue can only grow, so waiting for shedHorizon's backlog would only
// make every request wait longer before the optional tokens go anyway.
const overloadHorizon = 16

// backlogged reports whether l's queue takes longer than shedHorizon
// full-batch steps to drain (sustained overload, not a burst), or longer
// than overloadHorizon while work arrives faster than the lanes decode.
func (s *Scheduler) backlogged(l *lane, now time.Time) bool {
	qi := 0
	if len(s.queues) > 1 {
		qi = l.idx
	}
	d, full := s.drain(qi), l.cost.step(s.cfg.MaxBatch, 0)
	return d > shedHorizon*full || (d > overloadHorizon*full && s.offeredRatio(now) > 1)
}

// missing reports whether a deadline in l is predicted to be missed: a
// running request at the current batch, or the most urgent waiting one
// given the wait for a free slot.
func (s *Scheduler) missing(l *lane, now time.Time) bool {
	n := len(l.running)
	step := l.cost.step(max(n, 1), 0)
	tps := math.Max(l.cost.tokPerStep, 1e-3)
	soonest := time.Duration(math.MaxInt64)
	for _, m := range l.running {
		d := time.Duration(remaining(m) / tps * float64(step))
		soonest = min(soonest, d)
		if !m.deadline.IsZero() && m.deadline.After(now) && now.Add(d).After(m.deadline) {
			return true
		}
	}
	wait := time.Duration(0)
	if n >= s.cfg.MaxBatch {
		wait = soonest
	}
	qi := 0
	if len(s.queues) > 1 {
		qi = l.idx
	}
	var urgent *task
	for _, t := range s.deadlined(now) { // earliest deadline first
		if t.state == waiting && t.qi == qi && t.deadline.After(now) {
			urgent = t
			break
		}
	}
	if urgent == nil {
		return false
	}
	need := wait + s.prefillTime(l, urgent) + time.Duration(remaining(urgent)/tps*float64(l.cost.step(min(n+1, s.cfg.MaxBatch), 0)))
	return now.Add(need).After(urgent.deadline)
}

// evict frees the KV of the parked request least worth keeping (lowest
// class, then parked longest), or else of a waiting request that holds
// one on this lane (one preempted, or resumed), the least urgent; it will
// be rebuilt by prefill when the request runs again. It reports whether a
// slot was freed.
func (s *Scheduler) evict(l *lane) bool {
	var victim *task
	for _, t := range l.parked {
		if victim == nil || t.req.Priority < victim.req.Priority ||
			(t.req.Priority == victim.req.Priority && t.parkedAt.Before(victim.parkedAt)) {
			victim = t
		}
	}
	if victim != nil {
		l.parked = removeTask(l.parked, victim)
	} else {
		for _, q := range s.queues {
			for _, t := range q {
				if t.hasSeq && t.lane == l.idx && (victim == nil || before(victim, t)) {
					victim = t
				}
			}
		}
	}
	if victim == nil {
		return false
	}
	s.releaseSeq(victim)
	s.stats.evicted++
	return true
}

// deadlined is withDeadline less the tasks whose deadline has passed (a
// prefix: the list is in deadline order).
func (s *Scheduler) deadlined(now time.Time) []*task {
	n := 0
	for n < len(s.withDeadline) && s.withDeadline[n].deadline.Before(now) {
		s.withDeadline[n].inDeadline = false
		n++
	}
	s.withDeadline = slices.Delete(s.withDeadline, 0, n)
	return s.withDeadline
}

// listDeadline puts t into withDeadline after the tasks due no later. t
// is not listed: a request is listed when queued (Submit, Resume) and
// leaves when it parks or ends.
func (s *Scheduler) listDeadline(t *task) {
	i := s.deadlineIndex(t.deadline)
	for i < len(s.withDeadline) && !s.withDeadline[i].deadline.After(t.deadline) {
		i++
	}
	s.withDeadline = slices.Insert(s.withDeadline, i, t)
	t.inDeadline = true
}

// unlistDeadline takes t out of withDeadline.
func (s *Scheduler) unlistDeadline(t *task) {
	for i := s.deadlineIndex(t.deadline); i < len(s.withDeadline); i++ {
		if s.withDeadline[i] == t {
			s.withDeadline = slices.Delete(s.withDeadline, i, i+1)
			break
		}
	}
	t.inDeadline = false
}

// deadlineIndex is where the tasks due at d or later begin in
// withDeadline.
func (s *Scheduler) deadlineIndex(d time.Time) int {
	i, _ := slices.BinarySearchFunc(s.withDeadline, d, func(t *task, d time.Time) int { return t.deadline.Compare(d) })
	return i
}

// unlistOptional takes t off withOptional: it ended, parked or was shed,
// so the list holds only tasks with optional tokens and an empty list
// means there is nothing to shed.
func (s *Scheduler) unlistOptional(t *task) {
	if !t.inOptional {
		return
	}
	t.inOptional = false
	if i := slices.Index(s.withOptional, t); i >= 0 {
		s.withOptional = slices.Delete(s.withOptional, i, i+1)
	}
}
