package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tandem-llm/tandem/internal/budget"
	"github.com/tandem-llm/tandem/internal/progress"
	"github.com/tandem-llm/tandem/internal/sysmem"
	"github.com/tandem-llm/tandem/internal/units"
	"github.com/tandem-llm/tandem/kernels"
	"github.com/tandem-llm/tandem/kernels/cpuset"
	"github.com/tandem-llm/tandem/runtime/model"
	"github.com/tandem-llm/tandem/runtime/sched"
	"github.com/tandem-llm/tandem/runtime/server"
	"github.com/tandem-llm/tandem/runtime/spec"
	"github.com/tandem-llm/tandem/tools/tandem/defaultmodel"
	"github.com/tandem-llm/tandem/weights"
)

func runServe(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("serve", "[--addr HOST:PORT] [--model FILE] [--tokenizer FILE] [--draft FILE] [--lanes T[@CPUS]|cuda[:N],...] [flags]",
		"Serves a model over HTTP: OpenAI-compatible /v1/completions and\n"+
			"/v1/chat/completions (streaming with \"stream\": true), /v1/models, tandem's\n"+
			"scheduling extensions (deadline_ms, priority, segment, min_tokens, utility;\n"+
			"POST /v1/resume/{id}), /metrics (Prometheus) and /healthz. Requests are\n"+
			"scheduled by the uncertainty-aware scheduler over one or more lanes, each\n"+
			"with its own copy of the model and KV cache: a CPU lane computes on its own\n"+
			"threads, a GPU lane (--lanes cuda or cuda:N, a binary built with -tags cuda)\n"+
			"on an NVIDIA GPU. The first lane is the primary; the second takes the\n"+
			"requests predicted to be long, or, when it is over 1.5 times slower per\n"+
			"token (--lanes cuda,4: 4 CPU threads beside the GPU; --lanes big,little:\n"+
			"a phone's big and little cores, each lane pinned to its own), short ones\n"+
			"without deadlines, up to its share of the work (see README, \"Serving\").\n"+
			"With no --model it serves the embedded default model. The uncertainty\n"+
			"estimator is read from MODEL.calib.json when it exists (see tandem\n"+
			"calibrate); the embedded model has the calibration it ships with.\n"+
			"SIGINT or SIGTERM drain in-flight requests for\n"+
			"--drain-timeout, then cancel the rest.\n"+
			"With --draft every lane decodes speculatively: the small draft model, sharing\n"+
			"the model's tokenizer, guesses tokens that the model verifies in one pass\n"+
			"(--mode tree or sd: the output is the model's own; bild: lossy). The\n"+
			"speculative tuning flags (--max-tree, --draft-len, ...) are generate's.\n"+
			"With --budget each lane streams the model's weights through that much\n"+
			"memory; with --draft too, its draft keeps growing the tree while the model\n"+
			"waits for weights (--no-pipeline turns that off).", stdout, stderr,
		"tandem serve",
		"tandem serve --addr 127.0.0.1:8080 --model stories260K.gguf --lanes 3,1",
		"tandem serve --model model.gguf --lanes cuda,4   # GPU primary lane, 4-thread CPU lane for long requests",
		"tandem serve --model model.gguf --lanes big,2@little   # on a phone: a lane on the big cores, one on two little cores",
		"tandem serve --model stories260K.bin --tokenizer tok512.bin --draft llama2xs_model.bin",
		"tandem serve --model big.gguf --draft small.gguf --budget 1GiB   # stream the model, draft during its IO",
		`curl -s localhost:8080/v1/completions -d '{"prompt":"Once upon a time","max_tokens":32,"deadline_ms":2000}'`)
	addr := fs.String("addr", "127.0.0.1:8080", "listen address")
	modelPath := fs.String("model", "", "model file (default: the embedded model)")
	tokPath := fs.String("tokenizer", "", "tokenizer.bin or GGUF vocabulary (default: the model's own)")
	sf := addSpecFlags(fs)
	modeFlag := fs.String("mode", "tree", "with --draft: tree (token tree), sd (classic speculative decoding) or bild (Big-Little, lossy)")
	lanesFlag := fs.String("lanes", "", "lanes, comma separated: a thread count for a CPU lane, pinned to CPUs with @ (4@big, 4@little: a phone's big and little cores; 2@0-1: CPUs 0 and 1; big alone: a thread per big core), cuda or cuda:N for a GPU lane (GPU N; -tags cuda builds); the first lane is the primary, the second takes long requests, or short ones when it is much slower (default: one CPU lane of a thread per physical core, or per big core on a phone, placed by the OS)")
	name := fs.String("name", "", "model id in the API (default: the model file's name)")
	policyFlag := fs.String("policy", "tandem", "scheduling policy: tandem, fifo, luf, edf or rtlm")
	calib := fs.String("calibration", "", "uncertainty calibration file (default: MODEL.calib.json when it exists)")
	ctxLen := fs.Int("ctx", 0, "context per sequence (0: the model's)")
	kvType := fs.String("kv-type", "f32", "KV cache type: f32 or f16")
	maxSeqs := fs.Int("max-seqs", 16, "sequence slots per lane (running and parked; bounds KV memory)")
	maxBatch := fs.Int("max-batch", 8, "most sequences a lane decodes together")
	maxQueue := fs.Int("max-queue", 256, "waiting requests before 429")
	maxTokens := fs.Int("max-tokens", 256, "max_tokens for requests that do not set it")
	prefixReuse := fs.Bool("prefix-reuse", true, "start a request from a finished one's KV cache when their contexts share a prefix (a chat's earlier turns, a shared instruction), prefilling only the rest")
	budgetFlag := fs.String("budget", "", "most bytes of model weights the lanes hold in memory together, like 512MiB (split among them), N% of the weights each, auto ("+
		fmt.Sprintf("%.0f%%", 100*autoBudgetShare)+" of available memory) or min (the smallest each lane allows); the rest streams from the file every pass (default: the whole file mapped)")
	ioBandwidth := fs.String("io-bandwidth", "off", "with --budget: emulate slower storage for the streamed reads, like 400MB/s (eMMC) or 1.5GB/s (UFS), to measure a device's serving on a faster machine")
	prefixCache := fs.String("prefix-cache", "512MiB", "KV memory a lane may fill with finished requests' rows kept for --prefix-reuse, so that clients taking turns each keep their conversation (0: only the sequence slots live requests took)")
	trimBelow := fs.String("trim-below", "256MiB", "when the machine's available memory falls below this, give back the KV memory kept for --prefix-reuse (0: never)")
	parkTTL := fs.Duration("park-ttl", 10*time.Minute, "drop a parked segmented request not resumed within this")
	drain := fs.Duration("drain-timeout", 30*time.Second, "on shutdown, wait this long for in-flight requests")
	backend := fs.String("kernels", "", "kernel backend: c or go (default: fastest compiled in)")
	_, err := parse(fs, args, 0, 0)
	if err != nil {
		return err
	}
	var specCfg spec.Config
	if *sf.draft != "" {
		if specCfg, err = serveSpecConfig(sf, *modeFlag); err != nil {
			return err
		}
	} else if flagSet(fs, "mode") {
		return fmt.Errorf("%w: --mode %s needs a draft model: add --draft FILE", errUsage, *modeFlag)
	}
	mode := *modeFlag
	if *sf.draft == "" {
		mode = "no --draft" // --mode names the method a draft would use
	}
	if err := sf.check(fs, *sf.draft != "", specCfg.Method, mode); err != nil {
		return err
	}
	if *backend != "" {
		if err := kernels.SetBackend(*backend); err != nil {
			return fmt.Errorf("%w: --kernels: %v", errUsage, err)
		}
	}
	policy, err := sched.ParsePolicy(*policyFlag)
	if err != nil {
		return fmt.Errorf("%w: --policy: %v", errUsage, err)
	}
	laneSpecs, err := parseLanes(*lanesFlag)
	if err != nil {
		return err
	}
	kvt, err := weights.ParseDType(*kvType)
	if err != nil || (kvt != weights.F32 && kvt != weights.F16) {
		return fmt.Errorf("%w: --kv-type %q: want f32 or f16", errUsage, *kvType)
	}
	if *maxSeqs < 1 || *maxBatch < 1 || *maxQueue < 1 || *maxTokens < 1 {
		return fmt.Errorf("%w: --max-seqs, --max-batch, --max-queue and --max-tokens must be positive", errUsage)
	}
	keep, err := sched.ParsePrefixCache(*prefixCache)
	if err != nil {
		return fmt.Errorf("%w: --prefix-cache: %v", errUsage, err)
	}
	bw, err := parseBandwidth(*ioBandwidth)
	if err != nil {
		return fmt.Errorf("%w: --io-bandwidth: %v", errUsage, err)
	}
	if bw > 0 && *budgetFlag == "" {
		return fmt.Errorf("%w: --io-bandwidth emulates storage for streamed weights: add --budget", errUsage)
	}
	// The budget's form is checked before the port opens; whether the
	// model can stream through it is known once the model loads.
	if err := budget.Check(*budgetFlag, *modelPath == ""); err != nil {
		return fmt.Errorf("%w: --%v", errUsage, err)
	}
	floor, err := units.ParseSize(*trimBelow)
	if err != nil {
		return fmt.Errorf("%w: --trim-below: %v (or 0 to never trim)", errUsage, err)
	}
	if *drain < 0 {
		return fmt.Errorf("%w: --drain-timeout %v: want 0 (cancel at once) or more", errUsage, *drain)
	}
	if *parkTTL <= 0 {
		return fmt.Errorf("%w: --park-ttl %v: want a positive duration, such as 30s", errUsage, *parkTTL)
	}
	if *ctxLen < 0 || *ctxLen > 0 && *ctxLen < sched.MinContext {
		return fmt.Errorf("%w: --ctx %d: want 0 (the model's) or at least %d, for a prompt and its answer", errUsage, *ctxLen, sched.MinContext)
	}
	if *name == "" {
		*name = "default"
		if *modelPath != "" {
			*name = strings.TrimSuffix(filepath.Base(*modelPath), filepath.Ext(*modelPath))
		}
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)

	// The file's header, the tokenizer and the draft's first (a wrong
	// path, a context the model lacks or another model's tokenizer is bad
	// usage, said before listening), then listen: a busy port fails at
	// once, and /healthz answers (503, loading) while the lanes load the
	// weights.
	f, err := openModel(*modelPath)
	if err != nil {
		return err
	}
	defer f.Close()
	if mc, err := model.ConfigFrom(f); err == nil && *ctxLen > mc.Context {
		return fmt.Errorf("%w: --ctx %d: the model takes at most %d", errUsage, *ctxLen, mc.Context)
	}
	tok, err := loadTokenizer(f, *tokPath, stderr)
	if err != nil {
		return err
	}
	var draft *weights.File
	if *sf.draft != "" {
		if draft, err = sf.openDraftFile(tok, f.Path, *tokPath); err != nil {
			return err
		}
		defer draft.Close()
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	srv := server.New(server.Config{Model: *name, DefaultMaxTokens: *maxTokens})
	// Slow headers and idle connections are dropped in bounded time (the
	// server bounds each body itself); no read or write timeout for the
	// whole request, since a stream lasts as long as its answer.
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	fmt.Fprintf(stderr, "tandem serve: listening on http://%s, loading %s\n", ln.Addr(), *name)

	est, calPath, err := loadEstimator(*calib, *modelPath)
	if err != nil {
		hs.Close()
		return err
	}
	mem, err := budget.ForLanes(f, *budgetFlag, len(laneSpecs),
		budget.Options{AutoShare: autoBudgetShare, Available: sysmem.Available, Embedded: defaultmodel.IsEmbedded(f)})
	if err != nil {
		hs.Close()
		return err
	}
	if mem.Stream != nil {
		mem.Stream.Throttle.Bandwidth = bw
	}
	lopt := sched.LaneOptions{Lanes: laneSpecs, MaxSeqs: *maxSeqs, Context: *ctxLen, KVType: kvt, Stream: mem.Stream,
		NoPrefixReuse: !*prefixReuse, PrefixCache: keep}
	if draft != nil {
		lopt.Draft, lopt.Spec, lopt.DraftContext = draft, specCfg, *sf.draftCtx
	}
	lanes, closeLanes, err := sched.LoadLanes(f, lopt)
	if err != nil {
		hs.Close()
		return err // a draft's own failure says "draft:" after its lane
	}
	defer closeLanes()
	sc, err := sched.New(sched.Config{Policy: policy, MaxBatch: *maxBatch, MaxQueue: *maxQueue, ParkTTL: *parkTTL,
		DefaultMaxTokens: *maxTokens}, est, lanes...)
	if err != nil {
		hs.Close()
		return err
	}
	srv.Ready(sc, tok)
	if floor > 0 && *prefixReuse {
		wctx, stopWatch := context.WithCancel(context.Background())
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			watchMemory(wctx, sc, floor, memoryCheckEvery, sysmem.Available, stderr)
		}()
		// Waited for: a trim that finished as serve stopped said so
		// after serve had returned, or never (TestServeTrimBelow).
		defer func() {
			stopWatch()
			<-watched
		}()
	}
	estimator := "prompt length (uncalibrated: run tandem calibrate)"
	if calPath != "" {
		estimator = calPath
	}
	decoding := "plain"
	if *sf.draft != "" {
		pipe := ""
		if specCfg.Pipeline && mem.Stream != nil {
			pipe = ", drafting while weights stream"
		}
		decoding = fmt.Sprintf("speculative (%s, draft %s%s)", specCfg.Method, *sf.draft, pipe)
	}

	reuse := ", no prefix reuse"
	switch {
	case *prefixReuse && keep > 0:
		reuse = fmt.Sprintf(", prefix cache %s a lane", progress.Bytes(uint64(keep)))
	case *prefixReuse:
		reuse = ", prefix cache 0 (rows kept only in slots live requests took)"
	}
	if mem.Stream != nil {
		reuse += ", weights " + mem.Note
		if bw > 0 {
			reuse += fmt.Sprintf(" (reads emulated at %s/s)", progress.Bytes(uint64(bw)))
		}
	}
	fmt.Fprintf(stderr, "tandem serve: ready: %d lane(s) (%s), %s decoding%s, policy %s, context %d, estimator %s\n",
		len(lanes), describeLanes(lanes, laneSpecs), decoding, reuse, policy, sc.Context(), estimator)
	if topo, err := cpuset.Clusters(); err == nil {
		if hint := pinHint(laneSpecs, topo); hint != "" {
			fmt.Fprintln(stderr, "tandem serve: "+hint)
		}
	}
	if allowed, err := cpuset.Allowed(); err == nil {
		for _, hint := range []string{crowdHint(laneSpecs, allowed), turnsHint(laneSpecs, allowed)} {
			if hint != "" {
				fmt.Fprintln(stderr, "tandem serve: "+hint)
			}
		}
	}

	select {
	case err := <-serveErr:
		sc.Shutdown(context.Background())
		return fmt.Errorf("http server: %w", err)
	case s := <-sig:
		fmt.Fprintf(stderr, "tandem serve: %v: draining in-flight requests for up to %v (again to stop now)\n", s, *drain)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *drain)
	defer cancel()
	go func() {
		<-sig
		cancel()
	}()
	// The scheduler drains (then cancels) the requests while the HTTP
	// server still listens: /healthz says 503 shutting_down, /metrics
	// shows the drain, new work gets 503. Then the server stops and waits
	// for the handlers, which end with their requests.
	if err := srv.Shutdown(ctx); err != nil {
		why := "drain timed out"
		if errors.Is(err, context.Canceled) {
			why = "stopped before the drain ended"
		}
		fmt.Fprintf(stderr, "tandem serve: %s; the remaining requests were cancelled\n", why)
	}
	hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer hcancel()
	herr := hs.Shutdown(hctx)
	if herr != nil && !errors.Is(herr, context.DeadlineExceeded) {
		return herr
	}
	printSpecStats(stderr, lanes)
	fmt.Fprintln(stderr, "tandem serve: stopped")
	return nil
}

// parseLanes reads --lanes: comma-separated lanes, each a thread count
// for a CPU lane (also written cpu:N) or cuda / cuda:N for a lane on GPU
// N. A CPU lane may be pinned to CPUs: N@big, N@little (a phone's big or
// little cores), N@0-3, or big or little alone for a thread per core of
// the cluster. Empty means one CPU lane of kernels.DefaultThreads. Whether
// this binary can run a GPU lane is the model's to say when the lane
// loads.
func parseLanes(s string) ([]sched.LaneSpec, error) {
	return parseLanesWith(s, cpuset.Named)
}

// laneUsage is what --lanes takes, for its errors.
const laneUsage = "want lanes separated by commas: a thread count for a CPU lane, pinned to CPUs with @ (4@big, 2@little, 2@0-1), or cuda / cuda:N for a GPU lane; e.g. 3,1, 4@big,4@little or cuda,4"

// parseLanesWith is parseLanes resolving CPU names with named.
func parseLanesWith(s string, named func(string) (cpuset.Set, error)) ([]sched.LaneSpec, error) {
	if strings.TrimSpace(s) == "" {
		return []sched.LaneSpec{{Threads: kernels.DefaultThreads()}}, nil
	}
	var out []sched.LaneSpec
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		switch {
		case part == "cuda" || strings.HasPrefix(part, "cuda:"):
			if _, _, err := model.ParseDevice(part); err != nil {
				return nil, fmt.Errorf("%w: --lanes %q: %v", errUsage, s, err)
			}
			out = append(out, sched.LaneSpec{Device: part})
			continue
		case part == "gpu" || strings.HasPrefix(part, "gpu:"):
			return nil, fmt.Errorf("%w: --lanes %q: a GPU lane is written cuda or cuda:N", errUsage, s)
		case strings.HasPrefix(part, "cuda") && strings.Contains(part, "@"):
			return nil, fmt.Errorf("%w: --lanes %q: a GPU lane is not pinned to CPUs; pin CPU lanes only", errUsage, s)
		case part == "big" || part == "little":
			part = "0@" + part // a thread per core of the cluster
		}
		threads, where, pinned := strings.Cut(strings.TrimPrefix(part, "cpu:"), "@")
		n, err := strconv.Atoi(threads)
		if err != nil || n < 0 || n > sched.MaxLaneThreads || n == 0 && !pinned {
			return nil, fmt.Errorf("%w: --lanes %q: %s", errUsage, s, laneUsage)
		}
		spec := sched.LaneSpec{Threads: n}
		if pinned {
			if spec.CPUs, err = named(where); err != nil {
				return nil, fmt.Errorf("%w: --lanes %q: %v", errUsage, s, err)
			}
			if err := spec.Check(); err != nil {
				return nil, fmt.Errorf("%w: --lanes %q: %v", errUsage, s, err)
			}
			spec.Threads = spec.ThreadCount() // written out, as the ready line shows it
		}
		out = append(out, spec)
	}
	return out, nil
}

// pinHint suggests pinning when two or more CPU lanes float on a machine
// with big and little cores: the OS then moves every busy lane thread to
// the big cores, and the lanes are not the big and little lanes they
// look like.
func pinHint(specs []sched.LaneSpec, topo cpuset.Topology) string {
	floating := 0
	for _, l := range specs {
		if !l.GPU() && l.CPUs == nil {
			floating++
		}
	}
	if floating < 2 || len(topo) < 2 {
		return ""
	}
	big, _ := topo.Named("big")
	little, _ := topo.Named("little")
	return fmt.Sprintf("note: this machine has big cores (%s) and little ones (%s), and the OS moves busy lane threads to the big cores whichever lane they serve; --lanes %d@big,%d@little pins a lane to each", big, little, len(big), len(little))
}

// crowdHint warns when pinned lanes hold every CPU the process may use:
// a pinned lane yields its CPU only once a millisecond, so the HTTP
// handlers and clients wait for it (on a 2-vCPU VM, about 6 points fewer
// deadlines met at 0% adversarial prompts; docs/scheduling.md).
func crowdHint(specs []sched.LaneSpec, allowed cpuset.Set) string {
	var held []cpuset.Set
	for _, l := range specs {
		held = append(held, l.CPUs)
	}
	if len(allowed) == 0 || !cpuset.Union(held...).Contains(allowed) {
		return ""
	}
	return fmt.Sprintf("note: the pinned lanes hold every CPU this process may use (%s); a pinned lane yields only once a millisecond, so requests wait for it: leave a CPU out of --lanes for the server where one can be spared", allowed)
}

// noteTurns prints turnsHint's note for the lanes a command runs, when
// it has one, after the command's name (serve prints it with its other
// notes on the lanes).
func noteTurns(stderr io.Writer, command string, specs []sched.LaneSpec) {
	if allowed, err := cpuset.Allowed(); err == nil {
		if hint := turnsHint(specs, allowed); hint != "" {
			fmt.Fprintf(stderr, "tandem %s: %s\n", command, hint)
		}
	}
}

// turnsHint warns when the CPU lanes run more threads than the process
// has CPUs: the threads take turns, and a step waits for its slowest
// thread, so each lane runs slower than it would on fewer threads.
func turnsHint(specs []sched.LaneSpec, allowed cpuset.Set) string {
	threads := 0
	for _, l := range specs {
		if !l.GPU() {
			threads += l.ThreadCount()
		}
	}
	if len(allowed) == 0 || threads <= len(allowed) {
		return ""
	}
	return fmt.Sprintf("note: the CPU lanes run %d threads on the %d CPUs this process may use (%s); they take turns, and each step waits for its slowest thread: give the lanes at most %d threads together", threads, len(allowed), allowed, len(allowed))
}

// describeLanes says what each lane runs on: "cuda0 on cuda, cpu1 with 4
// threads".
func describeLanes(lanes []sched.Lane, specs []sched.LaneSpec) string {
	var parts []string
	for i, l := range lanes {
		if i < len(specs) && specs[i].GPU() {
			parts = append(parts, fmt.Sprintf("%s on %s", l.Name, specs[i].Device))
		} else {
			info := l.Engine.Info()
			parts = append(parts, fmt.Sprintf("%s with %d threads%s", l.Name, info.Threads, info.CPUs.Where()))
		}
	}
	return strings.Join(parts, ", ")
}

// serveSpecConfig reads --mode and the speculative tuning flags. The
// pipeline (drafting while a streamed target waits on IO) is on unless
// --no-pipeline; LoadLanes gives each streamed lane its spec.Lane.
func serveSpecConfig(sf *specFlags, mode string) (spec.Config, error) {
	for _, m := range runModes {
		if m.name == mode && m.speculative {
			cfg, err := sf.config(m.method, nil)
			cfg.Pipeline = !*sf.noPipeline
			return cfg, err
		}
	}
	return spec.Config{}, fmt.Errorf("%w: --mode %q: want tree, sd or bild", errUsage, mode)
}

// flagSet says whether name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// unusedFlags refuses the first of names given on the command line: the
// run would ignore it, which README makes bad usage. why follows the
// flag in the error: "--top-k only matters when sampling, ...".
func unusedFlags(fs *flag.FlagSet, why string, names ...string) error {
	for _, n := range names {
		if flagSet(fs, n) {
			return fmt.Errorf("%w: --%s %s", errUsage, n, why)
		}
	}
	return nil
}

// printSpecStats says how much the draft saved, lane by lane.
func printSpecStats(w io.Writer, lanes []sched.Lane) {
	for _, l := range lanes {
		e, ok := l.Engine.(*sched.SpecEngine)
		if !ok {
			continue
		}
		st := e.Stats()
		during := ""
		if st.PipelineSteps > 0 {
			during = fmt.Sprintf(", %d draft steps while weights streamed", st.PipelineSteps)
		}
		perPass := 0.0
		if p := e.Passes(); p > 0 {
			perPass = float64(st.Emitted) / float64(p)
		}
		fmt.Fprintf(w, "tandem serve: lane %s: %s: %d tokens in %d rounds (%.2f per round) verified in %d target passes (%.2f per pass), acceptance %.2f%s\n",
			l.Name, st.Method, st.Emitted, st.TargetPasses, st.TokensPerPass(), e.Passes(), perPass, st.AcceptanceRate(), during)
	}
}
