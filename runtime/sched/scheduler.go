package sched

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/sample"
)

// Lane is one compute backend the scheduler drives: lane 0 is the
// primary (fast) one; with two or more lanes, long requests go to lane 1.
type Lane struct {
	Name   string
	Engine Engine
}

// Scheduler orders requests over one or more lanes. Make it with New;
// Submit, Resume and Discard are safe for concurrent use.
type Scheduler struct {
	cfg   Config
	feat  features
	est   *Estimator
	lanes []*lane

	mu      sync.Mutex
	queues  [][]*task   // routed: one per lane; shared: queues[0]
	qtokens []float64   // per queue: the predicted tokens its requests still need
	offered offeredLoad // the predicted tokens of new work, for overload
	// deadlines: the time per token recent deadline requests afford
	deadlines recentDeadlines
	// withDeadline are the waiting and running tasks whose deadline has
	// not passed, earliest first: preempt and missing want the earliest
	// one that fits, so they stop at the first few instead of reading
	// every task with a deadline on every step (cold reads, a task each).
	// Tasks leave when they end or park, and at their deadline.
	withDeadline []*task
	// withOptional are the tasks with optional tokens, waiting or running,
	// that shed looks at instead of the whole queue. They leave when they
	// end, park or are shed, so an empty list means nothing can be shed.
	withOptional []*task
	byU          []*task // consolidate's buffer
	tasks        map[string]*task
	// parked are the parked tasks, oldest first (they are appended as they
	// park), so expiry and the MaxParked bound look at the front instead
	// of every live task on every step.
	parked  []*task
	quant   *quantiles
	split   workSplit // the slow lane's share of requests (route)
	closing bool      // no new work; lanes drain
	stopped bool      // lanes exit once their frees are done
	seqNo   uint64
	nextID  uint64
	stats   counters
	started time.Time
	// stallSince is when requests were last seen waiting with every lane
	// idle (zero: not now). Planning never leaves them so; if it does, a
	// request waits for good, and Stats.Stalled says how long.
	stallSince time.Time
	// stallTimer is the pending watchStall check (nil: none). Shutdown
	// stops it: it held the scheduler, its lanes and their KV caches for
	// up to a second after a mobile app closed the engine.
	stallTimer *time.Timer
	// wallClock: cfg.Now is time.Now, so one reading serves as both the
	// scheduler's clock and the start of its overhead accounting.
	wallClock bool

	wg       sync.WaitGroup
	stopOnce sync.Once
	janitor  *time.Ticker
	stopJan  chan struct{}
}

type taskState int

const (
	waiting taskState = iota
	running
	parked
	done
)

// task is a request's scheduler state; s.mu guards it.
type task struct {
	// Read on every step, by planning and delivery: they come first and
	// together, so a step touches a few cache lines of each task. An
	// engine step evicts the scheduler's data, and those misses, not
	// instructions, were most of the scheduler's cost per step.
	state                  taskState
	hasSeq                 bool // its sequence is allocated in lanes[lane]'s engine
	affine                 bool // routed to lanes[lane] for the context its engine keeps (affinity)
	starting               bool // a Start is in flight
	prefilling             bool // started, no token yet
	shed                   bool
	cut                    bool  // the current segment is complete: park after this token
	stake                  stake // cached: what its deadline still has at stake (tandem)
	inDeadline, inOptional bool  // listed in Scheduler.withDeadline, withOptional
	lane                   int   // queue/lane it belongs to (-1: shared queue while waiting)
	seq                    SeqID
	maxTokens              int // effective cap on generated tokens (shedding lowers it)
	promptLen              int
	score                  float64
	pri                    float64 // cached priority
	rankedUntil            int64   // UnixNano until which pri stands
	rankedBy               int     // 1 + the lane whose ranker computed pri; 0: stale
	seqNo                  uint64
	qi                     int     // its queue while waiting
	generated              []int32 // every token generated, segments included
	stream                 *Stream
	cancel                 error // set when the caller cancelled a running task
	sampler                *sample.Sampler
	deadline               time.Time // zero: none
	id                     string
	segTokens              int // delivered on the current stream
	firstTok               time.Time

	req      Request
	arrival  time.Time // this segment's Submit or Resume
	relDL    time.Duration
	static   float64 // RTLM priority, computed at arrival
	qtok     float64 // its share of qtokens[qi]
	parkedAt time.Time

	carry    []int32 // generated past a segment's end, delivered on resume
	segText  string  // text of the current segment so far
	held     string  // text withheld: it may begin a stop string
	restText string  // text after a segment's cut, opening the next one
	stopCtx  func() bool
}

type lane struct {
	idx     int
	name    string
	eng     Engine
	info    EngineInfo
	cost    *costModel
	running []*task
	parked  []*task // parked tasks whose sequence lives here
	held    int     // allocated sequences (running, parked, waiting with KV)
	toFree  []SeqID
	trims   []chan trimmed // TrimMemory calls waiting for this lane
	cond    *sync.Cond
	busy    bool      // between Begin and End
	step    Step      // the step in flight; its buffers are reused
	top     []*task   // topK's buffer
	sources [][]*task // sources' buffer
	others  [][]*task // fill's buffer

	// Written by the lane on every step; Stats sums them over lanes.
	steps      uint64
	tokens     uint64
	attended   uint64 // Σ over tokens of the context each followed
	engineWall time.Duration
	schedWall  time.Duration // its locked sections (planning and delivery)
	stepClock  time.Duration // sum of clock time between Begin and End
	cpus       cpuset.Set    // the CPUs the lane goroutine pinned itself to
}

// New makes a scheduler over lanes (at least one). est may be nil (the
// prompt-length fallback). Unless cfg.Manual, each lane runs on its own
// goroutine until Shutdown.
func New(cfg Config, est *Estimator, lanes ...Lane) (*Scheduler, error) {
	if len(lanes) == 0 {
		return nil, errors.New("sched: no lanes; give at least one engine")
	}
	wallClock := cfg.Now == nil
	cfg.defaults()
	if est == nil {
		est = NewEstimator(nil)
	}
	s := &Scheduler{cfg: cfg, feat: cfg.features(), est: est, tasks: map[string]*task{},
		quant: newQuantiles(est.scores), started: cfg.Now(), wallClock: wallClock}
	for i, l := range lanes {
		if err := s.addLane(i, l); err != nil {
			s.release() // the lanes added so far
			return nil, err
		}
	}
	if s.feat.routing && len(s.lanes) > 1 {
		s.queues = make([][]*task, len(s.lanes))
	} else {
		s.queues = make([][]*task, 1)
	}
	s.qtokens = make([]float64, len(s.queues))
	if !cfg.Manual {
		ready := make(chan struct{})
		for _, l := range s.lanes {
			s.wg.Add(1)
			go s.laneLoop(l, ready)
		}
		for range s.lanes {
			<-ready // each lane has pinned itself (if it pins): Stats says where
		}
		// Parked requests expire on time even when nothing else happens.
		s.janitor = time.NewTicker(min(max(cfg.ParkTTL/4, time.Millisecond), time.Minute))
		s.stopJan = make(chan struct{})
		go func() {
			for {
				select {
				case <-s.janitor.C:
					s.mu.Lock()
					s.expireParked(s.cfg.Now())
					s.mu.Unlock()
				case <-s.stopJan:
					return
				}
			}
		}()
	}
	return s, nil
}

// addLane checks lane i's engine, claims it and appends the lane.
func (s *Scheduler) addLane(i int, l Lane) error {
	if l.Engine == nil {
		return fmt.Errorf("sched: lane %d has no engine", i)
	}
	info := l.Engine.Info()
	if info.MaxSeqs <= 0 || info.Context <= 1 {
		return fmt.Errorf("sched: lane %d (%s): engine reports %d sequences of context %d", i, l.Name, info.MaxSeqs, info.Context)
	}
	name := l.Name
	if name == "" {
		name = info.Name
	}
	if c, ok := l.Engine.(claimable); ok && !c.claim(s) {
		return fmt.Errorf("%w: lane %d (%s)", ErrEngineInUse, i, name)
	}
	ln := &lane{idx: i, name: name, eng: l.Engine, info: info, cost: newCostModel()}
	ln.cond = sync.NewCond(&s.mu)
	s.lanes = append(s.lanes, ln)
	return nil
}

// SeedCost sets lane i's step-cost model to a + b·members + c·prefill
// tokens (seconds) before it has measured anything.
func (s *Scheduler) SeedCost(i int, a, b, c time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lanes[i].cost.seed(a.Seconds(), b.Seconds(), c.Seconds())
}

// Lanes is the number of lanes.
func (s *Scheduler) Lanes() int { return len(s.lanes) }

// Policy is the configured policy.
func (s *Scheduler) Policy() Policy { return s.cfg.Policy }

// Estimator is the uncertainty estimator in use.
func (s *Scheduler) Estimator() *Estimator { return s.est }

// checkVocab refuses prompt ids outside a lane's vocabulary at Submit:
// the engine's Start refused them too, but only once the request had
// queued, and its stream then ended in an error.
func (s *Scheduler) checkVocab(prompt []int32) error {
	v := 0 // the smallest a lane knows
	for _, l := range s.lanes {
		if lv := l.info.Vocab; lv > 0 && (v == 0 || lv < v) {
			v = lv
		}
	}
	for i, t := range prompt {
		if v > 0 && (t < 0 || int(t) >= v) {
			return fmt.Errorf("%w: token %d at %d is outside the vocabulary of %d", ErrInvalid, t, i, v)
		}
	}
	return nil
}

// Context is the smallest context among the lanes: the longest prompt
// plus output any request can have.
func (s *Scheduler) Context() int {
	c := s.lanes[0].info.Context
	for _, l := range s.lanes[1:] {
		c = min(c, l.info.Context)
	}
	return c
}

// Submit queues a request and returns its stream. Cancelling ctx ends the
// request and frees its sequence at the next step boundary. Errors:
// ErrInvalid (bad fields, prompt ids outside the vocabulary),
// ErrContextFull (the prompt leaves no room), ErrQueueFull (retry after
// RetryAfter), ErrClosed.
func (s *Scheduler) Submit(ctx context.Context, r Request) (*Stream, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if err := s.checkVocab(r.Prompt); err != nil {
		return nil, err
	}
	if ctxLen := s.Context(); len(r.Prompt) >= ctxLen {
		return nil, fmt.Errorf("prompt has %d tokens, the context is %d and one more is needed to generate: %w", len(r.Prompt), ctxLen, ErrContextFull)
	}
	// Scoring runs on the caller's goroutine beside the lanes and is
	// charged its thread's CPU time: when the OS set the thread aside
	// mid-way, wall time charged milliseconds the engine had, and single
	// stalls of 10-20 ms swung a whole run's overhead from 0.8% to 1.5%
	// (stories260K, 0% adversarial prompts).
	var score float64
	scoring := cpuTime(func() { score = s.est.Score(r.Text, len(r.Prompt)) })

	s.mu.Lock()
	defer s.mu.Unlock()
	// Overhead counts the scoring and the time holding the lock, not the
	// wait for it (concurrent submitters would count each other's work).
	wall, now := s.clock()
	defer func() { s.stats.schedWall += scoring + time.Since(wall) }()
	if s.closing {
		return nil, ErrClosed
	}
	if s.waitingCount() >= s.cfg.MaxQueue {
		s.stats.rejected++
		return nil, fmt.Errorf("%d requests are waiting: %w", s.cfg.MaxQueue, ErrQueueFull)
	}
	if r.ID == "" {
		// Numbered in order, skipping ids callers chose.
		for r.ID == "" || s.tasks[r.ID] != nil {
			s.nextID++
			r.ID = strconv.FormatUint(s.nextID, 10)
		}
	}
	if old, dup := s.tasks[r.ID]; dup {
		if old.state == parked {
			return nil, &idInUse{fmt.Sprintf("id %q belongs to a parked request: resume or discard it, or choose another id", r.ID)}
		}
		return nil, &idInUse{fmt.Sprintf("id %q is in use by a request still generating; choose another id", r.ID)}
	}
	t := &task{id: r.ID, req: r, promptLen: len(r.Prompt), sampler: sample.New(r.Sampling)}
	t.maxTokens = r.MaxTokens
	if t.maxTokens == 0 {
		t.maxTokens = s.cfg.DefaultMaxTokens
	}
	if room := s.Context() - len(r.Prompt); t.maxTokens <= 0 || t.maxTokens > room {
		t.maxTokens = room
	}
	t.score = min(score, float64(t.maxTokens))
	if r.Text == "" && s.est.Calibrated() {
		// Without text the features are silent: the prompt length is
		// the best the scheduler knows.
		t.score = min(float64(t.promptLen), float64(t.maxTokens))
	}
	// Room for the predicted answer up front: growing it token by token
	// was a tenth of delivery's time on a tiny model.
	t.generated = make([]int32, 0, min(t.maxTokens, int(t.score)+8))
	s.quant.add(t.score)
	if len(s.queues) > 1 {
		s.split.add(t.score, r.Deadline > 0)
	}
	s.route(t)
	s.stats.admitted++
	s.enqueue(t, now, r.Deadline)
	s.tasks[t.id] = t
	s.watch(ctx, t)
	return t.stream, nil
}

// ResumeOptions continue a parked request.
type ResumeOptions struct {
	Deadline  time.Duration // the next segment's deadline, from now (0: none)
	MaxTokens int           // more tokens allowed from now on (0: the rest of the original budget)
}

// Resume continues a parked segmented request; its next segment streams
// on the returned Stream. Errors: ErrNotParked, ErrBusy, ErrInvalid,
// ErrClosed.
func (s *Scheduler) Resume(ctx context.Context, id string, opt ResumeOptions) (*Stream, error) {
	if opt.Deadline < 0 || opt.Deadline > MaxDeadline {
		return nil, fmt.Errorf("%w: deadline %v outside 0..%v", ErrInvalid, opt.Deadline, MaxDeadline)
	}
	if opt.MaxTokens < 0 {
		return nil, fmt.Errorf("%w: max_tokens %d is negative", ErrInvalid, opt.MaxTokens)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	wall, now := s.clock()
	defer func() { s.stats.schedWall += time.Since(wall) }()
	if s.closing {
		return nil, ErrClosed
	}
	s.expireParked(now)
	t, ok := s.tasks[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("request %q: %w", id, ErrNotParked)
	case t.state != parked:
		return nil, fmt.Errorf("request %q: %w", id, ErrBusy)
	}
	if s.waitingCount() >= s.cfg.MaxQueue {
		s.stats.rejected++
		return nil, fmt.Errorf("%d requests are waiting: %w", s.cfg.MaxQueue, ErrQueueFull)
	}
	if opt.MaxTokens > 0 {
		// A parked request has room left (it ends at a limit instead);
		// min before adding, so a huge MaxTokens cannot overflow.
		t.maxTokens = len(t.generated) + min(opt.MaxTokens, s.Context()-t.promptLen-len(t.generated))
		// A new budget replaces one that shedding cut: the request is
		// whole again, and its optional part may be shed anew.
		t.req.MaxTokens = t.maxTokens
		t.shed = false
	}
	s.stats.admitted++
	t.req.Deadline = opt.Deadline
	s.unpark(t)
	if !t.hasSeq {
		s.route(t) // evicted: rebuilt wherever the routing sends it
	}
	s.enqueue(t, now, opt.Deadline)
	s.watch(ctx, t)
	// The text past the last cut and tokens generated past it open this
	// segment; they may complete it at once (then it parks again, keeping
	// the tokens not yet delivered).
	if t.restText != "" || len(t.carry) > 0 {
		rest, carry := t.restText, t.carry
		t.restText, t.carry = "", nil
		var ev Event
		s.emitText(t, rest, &ev, now)
		switch {
		case t.state == waiting && t.cut:
			s.park(t, &ev, carry, now)
		case t.state == waiting:
			s.consume(t, carry, &ev, now)
		}
		if t.state == waiting || t.state == running {
			s.push(t, &ev, now)
		}
	}
	return t.stream, nil
}

// route picks t's queue, or -1 with one shared queue. When the second
// lane is within SlowLane of the primary's speed, a score above the τ
// quantile goes to the second lane's queue, the rest to the primary's:
// long generations then do not hold up short ones. When it is much
// slower (little cores beside big ones, a CPU beside a GPU), that would
// stretch the longest answers by the lanes' speed ratio, so the roles
// turn: the second lane gets the shortest requests without deadlines,
// up to its share of the recent predicted work (its full-batch rate over
// both lanes'), where stretching a short answer costs little, and the
// primary keeps deadlines and long answers. With a second lane three
// times slower, this took the p99 cut against FIFO at 20% adversarial
// prompts from 17-30% to 28-42% over ten simulated workloads
// (docs/scheduling.md, "Lanes that differ").
func (s *Scheduler) route(t *task) {
	t.lane, t.affine = -1, false
	if len(s.queues) == 1 {
		return
	}
	t.lane = 0
	if f, slow := s.muchSlower(s.lanes[1]); slow {
		mine, theirs := s.lanes[1].cost.rate(s.cfg.MaxBatch), f.cost.rate(s.cfg.MaxBatch)
		if t.req.Deadline == 0 && t.score <= s.split.below(mine/(mine+theirs)) {
			t.lane = 1
		}
	} else if t.score > s.quant.at(s.cfg.TauQuantile, t.score) {
		t.lane = 1
	}
	if i, ok := s.affinity(t); ok {
		t.lane, t.affine = i, true
		s.stats.affine++
	}
}

// affinityMin is the fewest context tokens a lane must hold from a
// finished request (prefix reuse) for routing to send a request there
// whatever its score: a conversation's next turn, not a shared
// instruction's first words.
const affinityMin = 32

// affinity is the lane whose engine holds most of t's context in a
// finished request's KV rows, when that is at least affinityMin tokens
// and half the context: a chat's next turn, or a parked request rebuilt
// after its eviction, goes back to its rows instead of prefilling them
// all on the lane its score picks. A client resends the whole
// conversation each turn, and a growing prompt crosses the τ quantile:
// a five-turn chat over two alike lanes had its fifth turn routed to the
// second lane and prefilled 382 tokens there, 330 ms to its first token
// against 24 ms with its rows. A request with a deadline never goes to
// a much slower lane this way.
func (s *Scheduler) affinity(t *task) (int, bool) {
	if t.promptLen+len(t.generated) < affinityMin {
		// No lane can hold affinityMin tokens of a shorter context. Asking
		// every engine was a quarter of Submit's locked time on the
		// benchmark's workload with stories260K, where planners' and
		// chats' prompts (four requests in five) are shorter
		// (docs/scheduling.md, stop 52).
		return 0, false
	}
	best, at := 0, -1
	for i, l := range s.lanes {
		if r, ok := l.eng.(prefixReuser); ok {
			if n := r.Reusable(t.req.Prompt, t.generated); n > best {
				best, at = n, i
			}
		}
	}
	if at < 0 || best < affinityMin || 2*best < t.promptLen+len(t.generated) {
		return 0, false
	}
	if _, slow := s.muchSlower(s.lanes[at]); slow && t.req.Deadline > 0 {
		return 0, false
	}
	return at, true
}

// Discard drops a parked request and frees its sequence. Errors:
// ErrNotParked (no such request), ErrBusy (it is generating; cancel its
// context instead).
func (s *Scheduler) Discard(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	switch {
	case !ok:
		return fmt.Errorf("request %q: %w", id, ErrNotParked)
	case t.state != parked:
		return fmt.Errorf("request %q: %w", id, ErrBusy)
	}
	s.dropParked(t)
	return nil
}

// enqueue makes t wait for its next segment with a fresh stream.
func (s *Scheduler) enqueue(t *task, now time.Time, dl time.Duration) {
	s.seqNo++
	t.seqNo = s.seqNo
	t.state = waiting
	t.arrival = now
	t.relDL = dl
	t.deadline = time.Time{}
	if dl > 0 {
		t.deadline = now.Add(dl)
	}
	t.segTokens = 0
	t.firstTok = time.Time{}
	t.cancel = nil
	t.rankedBy = 0
	t.stream = newStream(t.id)
	q := max(t.lane, 0)
	if len(s.queues) == 1 {
		q = 0
	}
	t.static = s.rtlmPriority(t, s.laneFor(t), now)
	s.queues[q] = append(s.queues[q], t)
	t.qi, t.qtok = q, remaining(t)
	s.qtokens[q] += t.qtok
	s.offered.add(t.qtok, now, s.loadWindow())
	if dl > 0 {
		s.deadlines.add(dl/time.Duration(max(math.Round(t.qtok), 1)), now)
		s.listDeadline(t)
	}
	if optional(t) > 0 && !t.inOptional {
		t.inOptional = true
		s.withOptional = append(s.withOptional, t)
	}
	s.wake(t)
	if s.allIdle() {
		s.watchStall(stallCheck)
	}
}

// stallCheck is how long requests may wait with every lane idle before
// watchStall wakes the lanes again; a lane woken for them takes them in
// microseconds, and one the OS keeps from running for a second is rare.
const stallCheck = time.Second

// watchStall wakes every lane after d should requests still wait then
// with every lane idle, and again (after twice as long, up to a minute)
// while they do. Planning never leaves requests so: each such wake is a
// bug (a lost wakeup, a request no lane will take), counted in
// Stats.StallWakes, and the request it rescues waits a second or so
// instead of for good. Armed when a request arrives at idle lanes and
// when the lanes find nothing they can take; s.mu is held.
func (s *Scheduler) watchStall(d time.Duration) {
	if s.cfg.Manual || s.stallTimer != nil || s.stopped {
		return
	}
	s.stallTimer = time.AfterFunc(d, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.stallTimer = nil
		if s.stopped || s.waitingCount() == 0 || !s.allIdle() {
			return
		}
		s.stats.stallWakes++
		for _, l := range s.lanes {
			l.cond.Signal()
		}
		s.watchStall(min(2*d, time.Minute))
	})
}

// watch cancels t when ctx ends (until the segment ends).
func (s *Scheduler) watch(ctx context.Context, t *task) {
	if t.stopCtx != nil {
		t.stopCtx()
	}
	st := t.stream
	t.stopCtx = context.AfterFunc(ctx, func() {
		err := context.Cause(ctx)
		s.mu.Lock()
		defer s.mu.Unlock()
		if t.stream == st {
			s.cancelTask(t, err)
		}
	})
}

func (s *Scheduler) cancelTask(t *task, err error) {
	switch t.state {
	case waiting:
		s.removeWaiting(t)
		s.finish(t, ReasonCancelled, err, s.cfg.Now())
	case running:
		// The lane owns it during a step; Begin or End finishes it.
		if t.cancel == nil {
			t.cancel = err
			s.lanes[t.lane].cond.Signal()
		}
	}
}

// laneFor is the lane whose costs describe t (its own, or lane 0).
func (s *Scheduler) laneFor(t *task) *lane {
	if t.lane >= 0 {
		return s.lanes[t.lane]
	}
	return s.lanes[0]
}

func (s *Scheduler) wake(t *task) {
	// A request whose sequence lives on a lane wakes that lane; any lane
	// may take another (the primary ranks every queue, a secondary fills
	// its free slots from them: admit).
	if t.hasSeq || t.affine {
		// An affine request's lane alone: another idle lane woken
		// now could take it and prefill its whole context.
		s.lanes[t.lane].cond.Signal()
		if t.affine && !s.cfg.Manual {
			s.releaseAffine(t, t.arrival)
		}
		return
	}
	for _, l := range s.lanes {
		l.cond.Signal()
	}
}

// releaseAffine wakes every lane once the other lanes stop leaving t to
// the lane its affinity chose (awaitsAffine), should t still wait then:
// that lane may pass it over (a much slower lane past its share of the
// work, admission control), and the others, asleep since they left it,
// would let it wait for good. Called with s.mu held.
func (s *Scheduler) releaseAffine(t *task, now time.Time) {
	time.AfterFunc(s.affinityHold(t)-now.Sub(t.arrival)+time.Millisecond, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if t.state != waiting || !t.affine || s.stopped {
			return
		}
		if _, now := s.clock(); s.awaitsAffine(t, now) {
			s.releaseAffine(t, now) // its lane's steps grew longer meanwhile
			return
		}
		for _, l := range s.lanes {
			l.cond.Signal()
		}
	})
}

func (s *Scheduler) waitingCount() int {
	n := 0
	for _, q := range s.queues {
		n += len(q)
	}
	return n
}

func (s *Scheduler) removeWaiting(t *task) {
	q := s.queues[t.qi]
	s.queues[t.qi] = removeTask(q, t)
	if len(s.queues[t.qi]) < len(q) {
		s.qtokens[t.qi] -= t.qtok
		if len(s.queues[t.qi]) == 0 {
			s.qtokens[t.qi] = 0 // no rounding drift across busy periods
		}
	}
}

func removeTask(list []*task, t *task) []*task {
	for i, x := range list {
		if x == t {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

// releaseSeq queues t's sequence to be freed by its lane.
func (s *Scheduler) releaseSeq(t *task) {
	if !t.hasSeq {
		return
	}
	l := s.lanes[t.lane]
	l.toFree = append(l.toFree, t.seq)
	l.held--
	t.hasSeq = false
	l.cond.Signal()
}

// expireParked drops parked requests older than ParkTTL.
func (s *Scheduler) expireParked(now time.Time) {
	for len(s.parked) > 0 && now.Sub(s.parked[0].parkedAt) > s.cfg.ParkTTL {
		s.dropParked(s.parked[0])
		s.stats.expired++
	}
}

// dropAllParked drops every parked request (Shutdown).
func (s *Scheduler) dropAllParked() {
	for len(s.parked) > 0 {
		s.dropParked(s.parked[0])
	}
}

func (s *Scheduler) dropParked(t *task) {
	s.unpark(t)
	s.releaseSeq(t)
	t.state = done
	delete(s.tasks, t.id)
}

// unpark takes t off the parked lists: the scheduler's and, while its
// sequence is kept, its lane's.
func (s *Scheduler) unpark(t *task) {
	s.parked = removeTask(s.parked, t)
	if t.hasSeq {
		l := s.lanes[t.lane]
		l.parked = removeTask(l.parked, t)
	}
}

// Shutdown stops accepting requests and waits for the in-flight ones to
// finish; when ctx ends first it cancels the rest (their streams end with
// ReasonCancelled). Parked requests are dropped. The lanes stop and
// every sequence is freed before it returns. Calling it again is
// harmless.
func (s *Scheduler) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	var err error
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		s.mu.Lock()
		// A segment that completes during the drain parks, and nobody
		// can resume it now.
		s.dropAllParked()
		n := len(s.tasks)
		s.mu.Unlock()
		if n == 0 {
			break
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		case <-tick.C:
		}
	}
	s.mu.Lock()
	s.dropAllParked()
	for _, t := range s.tasks {
		s.cancelTask(t, ErrClosed)
	}
	s.stopped = true
	if s.stallTimer != nil {
		s.stallTimer.Stop()
		s.stallTimer = nil
	}
	for _, l := range s.lanes {
		l.cond.Broadcast()
	}
	s.mu.Unlock()
	if !s.cfg.Manual {
		s.wg.Wait()
		s.stopOnce.Do(func() {
			s.janitor.Stop()
			close(s.stopJan)
		})
	}
	// Every sequence is freed and the lanes have stopped: another
	// scheduler may use the engines.
	s.release()
	return err
}

// trimmed is what one lane's trim released.
type trimmed struct {
	bytes int64
	err   error
}

// TrimMemory gives back the KV memory the lanes hold beyond their live
// sequences: the finished requests' rows kept for prefix reuse, and the
// buffers earlier peaks left for reuse. Nothing running or parked is
// touched, and later requests only prefill what the kept rows would
// have saved. An app calls it when the system asks it to use less
// memory (Android's onTrimMemory). Each lane trims between its steps;
// TrimMemory returns the bytes released once every lane has, or ctx's
// error. A Manual scheduler's lanes trim at their next Begin.
func (s *Scheduler) TrimMemory(ctx context.Context) (int64, error) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return 0, ErrClosed
	}
	waits := make([]chan trimmed, len(s.lanes))
	for i, l := range s.lanes {
		waits[i] = make(chan trimmed, 1)
		l.trims = append(l.trims, waits[i])
		l.cond.Signal()
	}
	s.mu.Unlock()
	var total int64
	var errs []error
	for i, w := range waits {
		select {
		case r := <-w:
			total += r.bytes
			if r.err != nil {
				errs = append(errs, fmt.Errorf("sched: lane %s: trim: %w", s.lanes[i].name, r.err))
			}
		case <-ctx.Done():
			return total, ctx.Err()
		}
	}
	return total, errors.Join(errs...)
}

// release gives back the engines New claimed.
func (s *Scheduler) release() {
	for _, l := range s.lanes {
		if c, ok := l.eng.(claimable); ok {
			c.release(s)
		}
	}
}

// laneLoop runs a lane: under the lock, deliver the last step and plan
// the next (waiting for work), then Run it unlocked. It signals ready
// once it has pinned itself to its engine's CPUs, or found none.
func (s *Scheduler) laneLoop(l *lane, ready chan<- struct{}) {
	defer s.wg.Done()
	pinned := l.info.CPUs != nil
	if pinned {
		// The lane computes a share of every kernel on its own goroutine:
		// it runs where the engine's threads are pinned. Never unlocked:
		// the pinned thread ends with the lane. The pool that pinned the
		// engine's threads checked the set; should the kernel refuse it
		// now, the lane computes where it is placed, and its stats say so
		// (LaneStats.CPUs nil).
		runtime.LockOSThread()
		if cpuset.Pin(l.info.CPUs) == nil {
			s.mu.Lock()
			l.cpus = l.info.CPUs
			s.mu.Unlock()
		}
	}
	ready <- struct{}{}
	var st *Step
	var yielded time.Time
	for {
		// One locked section per step: the last step's results and the
		// next step's plan. Two (End, then Begin) cost a second lock
		// round trip and clock readings on every step, which on a tiny
		// model was a tenth of the scheduler's overhead.
		s.mu.Lock()
		wall, now := s.clock()
		if st != nil {
			s.deliver(st, now)
		}
		for {
			st = s.begin(l, now)
			if st != nil || (s.stopped && len(l.running) == 0) {
				break
			}
			l.schedWall += time.Since(wall)
			l.cond.Wait()
			wall, now = s.clock()
		}
		l.schedWall += time.Since(wall)
		s.mu.Unlock()
		if st == nil {
			return
		}
		st.Run(context.Background())
		// A step on a CPU lane is computation that never blocks, and with
		// as many lanes busy as the Go runtime has processors, clients,
		// stream readers and HTTP handlers ran only when it preempted a
		// lane, after 10 ms: requests reached Submit in bursts, up to 38
		// ms late on a 2-vCPU host. Yielding here costs a fraction of a
		// microsecond a step (TestLaneYieldsBetweenSteps). A pinned lane's
		// goroutine is locked to its thread, and a locked goroutine's
		// yield waits for the thread to be handed back, 20-40 µs on this
		// VM: it yields once a millisecond, which keeps clients within a
		// millisecond and costs a tiny model's 0.2 ms steps 2-4%, not
		// 10-20%.
		switch {
		case !pinned:
			runtime.Gosched()
		case time.Since(yielded) >= pinnedYield:
			runtime.Gosched()
			yielded = time.Now()
		}
	}
}

// pinnedYield is how often a pinned lane yields between steps.
const pinnedYield = time.Millisecond

// clock reads the wall clock that overhead accounting starts from and
// the scheduler's clock (the same reading unless Config.Now is set).
func (s *Scheduler) clock() (wall, now time.Time) {
	wall = time.Now()
	if s.wallClock {
		return wall, wall
	}
	return wall, s.cfg.Now()
}
