package bench

import (
	"encoding/json"
	"io"
)

// OutcomeRecord is one request of one benchmark run, as `tandem bench
// sched --outcomes` writes it: a row's medians say how a policy did, its
// requests say who set its tail (which class waited, on which lane, how
// much was shed).
type OutcomeRecord struct {
	Engine      string  `json:"engine"`
	Policy      string  `json:"policy"`
	Load        float64 `json:"load"`
	Adversarial float64 `json:"adversarial"`
	Variance    string  `json:"variance"`
	Run         int     `json:"run"` // which of the setting's runs of this policy, from 0

	ID    string `json:"id"`
	Class string `json:"class"`
	// Times in seconds: the request's arrival in the workload, and its
	// first token and finish after it reached the scheduler.
	ArrivalS    float64  `json:"arrival_s"`
	FirstTokenS *float64 `json:"first_token_s"` // null when no token came
	ResponseS   float64  `json:"response_s"`

	PromptTokens int     `json:"prompt_tokens"`
	Generated    int     `json:"generated"`
	Shed         int     `json:"shed"`
	MaxTokens    int     `json:"max_tokens"`
	MinTokens    int     `json:"min_tokens"`
	Lane         int     `json:"lane"`
	Score        float64 `json:"score"` // the estimated answer length u
	Reason       string  `json:"reason"`
	DeadlineMS   float64 `json:"deadline_ms,omitempty"`
	DeadlineMet  *bool   `json:"deadline_met,omitempty"` // absent without a deadline
	Utility      float64 `json:"utility"`
}

// Records turns run's outcomes into records labelled with row's setting
// (engine, policy, load, share, variance) and the run's index.
func Records(row SchedRow, index int, run Run) []OutcomeRecord {
	out := make([]OutcomeRecord, 0, len(run.Outcomes))
	for _, o := range run.Outcomes {
		r := o.Result
		rec := OutcomeRecord{
			Engine: row.Engine, Policy: row.Policy, Load: row.Load, Adversarial: row.Adversarial, Variance: row.Variance, Run: index,
			ID: o.Req.ID, Class: o.Req.Class.String(), ArrivalS: o.Req.Arrival.Seconds(), ResponseS: o.Response.Seconds(),
			PromptTokens: r.PromptTokens, Generated: r.TotalGenerated, Shed: r.ShedTokens,
			MaxTokens: o.Req.MaxTokens, MinTokens: o.Req.MinTokens, Lane: r.Lane, Score: r.Score,
			Reason: r.Reason.String(), Utility: r.Utility,
		}
		if !r.FirstToken.IsZero() {
			s := r.FirstToken.Sub(r.Arrival).Seconds()
			rec.FirstTokenS = &s
		}
		if o.Req.Deadline > 0 {
			rec.DeadlineMS = float64(o.Req.Deadline.Microseconds()) / 1000
			met := r.DeadlineMet
			rec.DeadlineMet = &met
		}
		out = append(out, rec)
	}
	return out
}

// WriteRecords writes recs to w as JSON lines.
func WriteRecords(w io.Writer, recs []OutcomeRecord) error {
	enc := json.NewEncoder(w)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}
