package spec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tandem-llm/tandem/runtime/model"
)

// Group runs a round of several decoders with all their trees verified in
// one target pass, so the target reads its weights once for every
// sequence: a scheduler lane serving several clients with one target
// (Decoder.Step verifies one sequence's tree per pass). The zero Group is
// ready to use and keeps its buffers between rounds; it is not safe for
// concurrent use.
type Group struct {
	batch  model.Batch
	logits model.Logits
	live   []int      // the decoders in this round's pass, by index
	snaps  []snapshot // per live decoder: its tree as it went to the target
	off    []int      // per live decoder: its first slot in the batch
	passes int

	// The draft steps that grow the trees before the pass, shared.
	dbatch      model.Batch
	dout        model.Logits
	growing     []int        // the decoders still drafting, by index
	rounds      []draftRound // per growing decoder: its rows in dbatch
	draftPasses int
}

// Passes is how many target passes the group has run: fewer than its
// decoders' TargetPasses together when their trees shared passes.
func (g *Group) Passes() int { return g.passes }

// DraftPasses is how many draft Forwards grew the group's trees before
// their passes: fewer than its decoders' DraftSteps together when their
// steps shared Forwards (those the pipeline runs during a pass are
// each a decoder's own).
func (g *Group) DraftPasses() int { return g.draftPasses }

// Step runs one round of every decoder: each drafts its tree as Step
// does, their draft steps sharing Forwards (the draft reads its weights
// once a step for all of them), then one target pass verifies them all,
// and each accepts its path. With the pipeline on, the decoders take
// turns drafting while the pass waits for weights. The decoders must
// share the target and both caches (and the Lane). out[i] gets decoder
// i's tokens and errs[i] its error; a decoder that fails is left as a
// failed Step leaves it, with its sequences freed, and the others go on
// (a failed pass fails them all). One decoder alone takes the same path
// as several.
func (g *Group) Step(ctx context.Context, decs []*Decoder, out [][]int32, errs []error) {
	if len(out) < len(decs) || len(errs) < len(decs) {
		panic(fmt.Sprintf("spec: Group.Step with %d decoders, %d outputs and %d errors", len(decs), len(out), len(errs)))
	}
	g.live, g.snaps, g.off = g.live[:0], g.snaps[:0], g.off[:0]
	for i, d := range decs {
		out[i], errs[i] = nil, nil
		if err := d.canStep(); err != nil {
			errs[i] = err
			continue
		}
		if i > 0 && (d.target != decs[0].target || d.draft != decs[0].draft || d.tcache != decs[0].tcache || d.dcache != decs[0].dcache) {
			errs[i] = errors.New("spec: Group.Step: the decoders must share the draft, the target and both caches")
			continue
		}
		g.live = append(g.live, i)
	}
	g.grow(ctx, decs, errs)
	if len(g.live) == 0 {
		return
	}
	g.verify(ctx, decs, errs)
	rows := g.batch.Len()
	for k, i := range g.live {
		d := decs[i]
		if errs[i] != nil {
			continue
		}
		off := g.off[k]
		toks, err := d.accept(g.snaps[k], func(slot int) []float32 { return g.logits.Row(off + slot) }, rows-len(d.tb.Tokens))
		if err != nil {
			errs[i] = d.fail(err)
			continue
		}
		out[i] = toks
	}
}

// grow drafts the live decoders' trees as Decoder.grow does, each step
// one draft Forward for every decoder whose trigger asks for more: its
// rows are its own step's, and it is charged its rows' share of the
// Forward's time. It leaves in g.live the decoders that grew without
// error, with their snapshots in g.snaps; the others fail, in errs.
func (g *Group) grow(ctx context.Context, decs []*Decoder, errs []error) {
	g.growing = g.growing[:0]
	for _, i := range g.live {
		d := decs[i]
		if err := d.startRound(); err != nil {
			errs[i] = d.fail(err)
			continue
		}
		g.growing = append(g.growing, i)
	}
	for {
		more := g.growing[:0]
		for _, i := range g.growing {
			if errs[i] == nil && !decs[i].shouldVerify(decs[i].cfg.MaxTree) {
				more = append(more, i)
			}
		}
		g.growing = more
		if len(more) == 0 {
			break
		}
		if err := ctx.Err(); err != nil {
			for _, i := range more {
				errs[i] = decs[i].fail(err)
			}
			break
		}
		b := &g.dbatch
		b.Reset()
		g.rounds = g.rounds[:0]
		stepping := more[:0]
		for _, i := range more {
			if r := decs[i].draftRows(b); r.picks != nil {
				g.rounds, stepping = append(g.rounds, r), append(stepping, i)
			} // else its pacer picked nothing: it is done growing
		}
		more, g.growing = stepping, stepping
		if len(more) == 0 {
			break
		}
		first := decs[more[0]]
		start := time.Now()
		err := first.draft.Forward(b, first.dcache, &g.dout)
		elapsed := time.Since(start)
		g.draftPasses++
		for k, i := range more {
			d := decs[i]
			share := elapsed * time.Duration(g.rounds[k].rows) / time.Duration(b.Len())
			if err != nil {
				d.stats.DraftTime += share
				errs[i] = d.fail(fmt.Errorf("spec: draft step: %w", err))
				continue
			}
			if err := d.draftTake(g.rounds[k], &g.dout, d.cfg.MaxTree, share); err != nil {
				errs[i] = d.fail(err)
				continue
			}
			d.roundDraft += d.last.time
		}
	}
	live := g.live[:0]
	for _, i := range g.live {
		if errs[i] == nil {
			live = append(live, i)
			g.snaps = append(g.snaps, decs[i].snapshot(decs[i].fill()))
		}
	}
	g.live = live
}

// verify runs the live decoders' trees through the target in one pass,
// and, with the pipeline, lets the decoders draft in turn while it waits
// for weights. A decoder whose draft step fails, or every one when the
// pass fails, gets its error in errs, failed.
func (g *Group) verify(ctx context.Context, decs []*Decoder, errs []error) {
	b := &g.batch
	b.Reset()
	for _, i := range g.live {
		tb := &decs[i].tb
		off := b.Len()
		g.off = append(g.off, off)
		for j, tok := range tb.Tokens {
			parent := tb.Parent[j]
			if parent >= 0 {
				parent += off
			}
			b.Add(tok, tb.Pos[j], tb.Seq[j], parent, tb.Logits[j])
		}
	}
	first := decs[g.live[0]]
	g.passes++
	wait0, read0 := first.ioTimes()
	start := time.Now()
	var err error
	if first.cfg.Pipeline {
		if err = g.verifyPipelined(ctx, decs, errs); err == nil {
			err = ctx.Err() // as Decoder.verifyPipelined: a cancelled round fails
		}
	} else {
		err = first.target.Forward(b, first.tcache, &g.logits)
	}
	pass := time.Since(start)
	wait, read := first.ioTimes()
	passIO, passRead := wait-wait0, read-read0
	for _, i := range g.live {
		d := decs[i]
		if err != nil {
			if errs[i] == nil {
				errs[i] = d.fail(fmt.Errorf("spec: verify: %w", err))
			}
			continue
		}
		d.pass, d.passIO, d.passRead = pass, passIO, passRead
		// Each tree's share of the pass, so the decoders' times add up
		// to the target's.
		d.stats.TargetTime += pass * time.Duration(len(d.tb.Tokens)) / time.Duration(b.Len())
		d.stats.TargetPasses++
	}
}

// verifyPipelined runs the group's pass in the background and keeps the
// decoders drafting, in turn, whenever the target lets go of the lane
// (see Decoder.verifyPipelined). A decoder whose draft step fails drafts
// no more and fails once the pass is done, since its rows are in it.
func (g *Group) verifyPipelined(ctx context.Context, decs []*Decoder, errs []error) error {
	first := decs[g.live[0]]
	done := make(chan error, 1)
	go func() { done <- first.target.Forward(&g.batch, first.tcache, &g.logits) }()
	stopped := map[*Decoder]error{} // nil: it had nothing to extend
	turn := 0
	next := func() *Decoder { // round robin over those with room left in their trees
		for k := range g.live {
			d := decs[g.live[(turn+k)%len(g.live)]]
			if _, out := stopped[d]; !out && !d.pipelineFull() {
				turn += k + 1
				return d
			}
		}
		return nil
	}
	err := draftDuringPass(ctx, first.cfg.Lane, done, next, func(d *Decoder, err error) { stopped[d] = err })
	for _, i := range g.live {
		if ferr := stopped[decs[i]]; ferr != nil {
			errs[i] = decs[i].fail(ferr)
		}
	}
	return err
}
