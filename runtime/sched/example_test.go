package sched_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/tokenizer"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
)

// Example links the runtime as a robot's Go program does: the embedded
// story model on one CPU lane, a request with a deadline, and its tokens
// read as they stream. A model file would come from weights.Open, its
// calibration from sched.CalibrationPath.
func Example() {
	f, err := defaultmodel.Target()
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.ForModel(f, "")
	if err != nil {
		log.Fatal(err)
	}
	lanes, closeLanes, err := sched.LoadLanes(f, sched.LaneOptions{Lanes: sched.CPULaneSpecs(1), MaxSeqs: 4})
	if err != nil {
		log.Fatal(err)
	}
	defer closeLanes()
	s, err := sched.New(sched.Config{}, nil, lanes...)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Shutdown(context.Background()) // before closeLanes: deferred calls run last first

	ctx := context.Background()
	text := "Once upon a time"
	prompt, err := tok.Encode(text, tokenizer.EncodeOptions{AddBOS: true})
	if err != nil {
		log.Fatal(err)
	}
	st, err := s.Submit(ctx, sched.Request{Prompt: prompt, Text: text, MaxTokens: 24, Deadline: 5 * time.Second})
	if err != nil {
		log.Fatal(err) // sched.ErrQueueFull: retry after sched.RetryAfter
	}
	var ids []int32
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			log.Fatal(err)
		}
		ids = append(ids, ev.Tokens...) // a robot would act on each step here
		if ev.Done {
			fmt.Println(ev.Result.Reason, ev.Result.CompletionTokens, "tokens")
			break
		}
	}
	fmt.Println(text + tok.DecodeAfter(prompt, ids))
	// Output:
	// length 24 tokens
	// Once upon a time, a happy girl called Molly lived near the village. She loved to draw picture
}
