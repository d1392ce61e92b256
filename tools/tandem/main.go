// Command tandem runs LLaMA-family models on device: generate text,
// inspect and convert model files, tokenize, synthesize benchmark models
// and measure speed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime/pprof"
	"sort"
	"strings"
)

// version is set at link time (-ldflags "-X main.version=...").
var version = "dev"

// verb is one subcommand.
type verb struct {
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

var verbs map[string]verb

func init() {
	verbs = map[string]verb{
		"generate": {"generate text from a prompt", runGenerate},
		"inspect":  {"show a model file's metadata and tensors", runInspect},
		"info":     {"show the platform: Jetson board, memory, power mode, thermals", runInfo},
		"convert":  {"convert a llama2.c .bin or GGUF model to GGUF (optionally quantized)", runConvert},
		"tokenize": {"encode text to token ids", runTokenize},
		"synth":    {"write a random-weight model of a real shape (for benchmarks)", runSynth},
		"inflate":  {"embed a real small model in a large shape, output unchanged (for benchmarks)", runInflate},
		"bench":    {"benchmarks: decode, streaming, speculative decoding, the scheduler", runBench},
		"corpus":   {"write a synthetic story corpus and learn a BPE vocabulary", runCorpus},
		"train":    {"train a llama model on a text corpus", runTrain},
		"distill":  {"train a draft model for a target on the target's own outputs", runDistill},
		"eval":     {"held-out loss of models and a draft's agreement with a target", runEval},
		"version":  {"print the version", runVersion},

		// The scheduler's verbs (a block of their own keeps the alignment above).
		"serve":     {"serve a model over an OpenAI-compatible HTTP API with the scheduler", runServe},
		"calibrate": {"train the scheduler's uncertainty estimator for a model", runCalibrate},
	}
}

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// errUsage marks errors caused by how the command was called (exit 2).
var errUsage = errors.New("usage")

// errWriter keeps the first error writing to w.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil && e.err == nil {
		e.err = err
	}
	return n, err
}

// interruptedError is a Ctrl-C that leaves something to say, such as what
// was saved: the command exits 130 with this message.
type interruptedError string

func (e interruptedError) Error() string { return string(e) }
func (e interruptedError) Unwrap() error { return context.Canceled }

// run executes one command line and returns the exit code: 0 success,
// 1 failure, 2 bad usage, 130 interrupted.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run([]string{args[1], "--help"}, stdout, stderr)
		}
		usage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	v, ok := verbs[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "tandem: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	stop, err := startProfile(os.Getenv("TANDEM_CPUPROFILE"))
	if err != nil {
		fmt.Fprintf(stderr, "tandem %s: %v\n", args[0], err)
		return 1
	}
	out := &errWriter{w: stdout}
	err = v.run(args[1:], out, stderr)
	stop()
	switch {
	case err == nil && out.err != nil:
		// Commands print with fmt.Fprint and do not check each write: a
		// report lost to a full disk must not exit 0.
		fmt.Fprintf(stderr, "tandem %s: writing the output: %v\n", args[0], out.err)
		return 1
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "tandem %s: %v\n", args[0], err)
		return 2
	case errors.Is(err, context.Canceled):
		// Verbs cancel their context on Ctrl-C (signal.NotifyContext).
		msg := "interrupted"
		var saved interruptedError
		if errors.As(err, &saved) {
			msg = string(saved)
		}
		fmt.Fprintf(stderr, "tandem %s: %s\n", args[0], msg)
		return 130
	default:
		fmt.Fprintf(stderr, "tandem %s: %v\n", args[0], err)
		return 1
	}
}

// startProfile writes a CPU profile of the command to path (the
// TANDEM_CPUPROFILE variable, for go tool pprof) until stop is called; an
// empty path profiles nothing.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("TANDEM_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("TANDEM_CPUPROFILE: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

func runVersion(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("version", "", "Prints tandem's version (set at link time; dev for a plain go build).", stdout, stderr, "tandem version")
	if _, err := parse(fs, args, 0, 0); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "tandem", version)
	return nil
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "tandem runs LLaMA-family models on device (Jetson, Android, Linux).")
	fmt.Fprintln(w, "\nUsage: tandem COMMAND [flags] [args]\n\nCommands:")
	names := make([]string, 0, len(verbs))
	for n := range verbs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-9s %s\n", n, verbs[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'tandem COMMAND --help' for a command's flags and examples.")
	fmt.Fprintln(w, "Set TANDEM_CPUPROFILE=FILE to write a CPU profile of a command for go tool pprof.")
}

// newFlags makes a FlagSet whose --help prints about, the flags and
// examples to stdout.
func newFlags(name, args, about string, stdout, stderr io.Writer, examples ...string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		w := stdout
		fmt.Fprintf(w, "Usage: tandem %s\n\n%s\n", strings.TrimSpace(name+" "+args), about)
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(w, "\nFlags:")
			fs.SetOutput(w)
			fs.PrintDefaults()
			fs.SetOutput(stderr)
		}
		if len(examples) > 0 {
			fmt.Fprintf(w, "\nExamples:\n  %s\n", strings.Join(examples, "\n  "))
		}
	}
	return fs
}

// invalidFlagValue matches the flag package's error for a value its
// flag.Value refused.
var invalidFlagValue = regexp.MustCompile(`^invalid value "(.*)" for flag -(\S+): (.*)$`)

// parse parses flags placed anywhere among the positional arguments and
// checks the positional count is within [minArgs, maxArgs] (-1: any).
func parse(fs *flag.FlagSet, args []string, minArgs, maxArgs int) ([]string, error) {
	// The flag package prints a parse error and the whole help; a bad
	// flag gets one line on stderr here instead, and help only --help.
	help, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	defer func() { fs.Usage = help; fs.SetOutput(out) }()
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				help()
				return nil, err
			}
			msg := err.Error()
			// As the other usage errors write a flag: --threads -2: ...
			if m := invalidFlagValue.FindStringSubmatch(msg); m != nil {
				msg = fmt.Sprintf("--%s %s: %s", m[2], m[1], m[3])
			}
			return nil, fmt.Errorf("%w: %s (see tandem %s --help)", errUsage, msg, fs.Name())
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if args[0] == "--" {
			pos = append(pos, args[1:]...)
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	switch {
	case len(pos) < minArgs:
		want := fmt.Sprint(minArgs)
		switch {
		case maxArgs < 0:
			want = fmt.Sprintf("at least %d", minArgs)
		case maxArgs > minArgs:
			want = fmt.Sprintf("%d to %d", minArgs, maxArgs)
		}
		return nil, fmt.Errorf("%w: want %s argument(s), got %d (see tandem %s --help)", errUsage, want, len(pos), fs.Name())
	case maxArgs == 0 && len(pos) > 0:
		hint := ""
		if fs.Lookup("prompt") != nil {
			hint = "; the prompt goes in --prompt"
		}
		return nil, fmt.Errorf("%w: unexpected argument %q: tandem %s takes flags only%s (see tandem %[3]s --help)",
			errUsage, pos[0], fs.Name(), hint)
	case maxArgs >= 0 && len(pos) > maxArgs:
		return nil, fmt.Errorf("%w: unexpected argument %q: tandem %s takes at most %d (see tandem %[3]s --help)",
			errUsage, pos[maxArgs], fs.Name(), maxArgs)
	}
	return pos, nil
}
