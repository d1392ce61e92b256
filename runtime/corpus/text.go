package corpus

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// ErrEmpty is returned (wrapped) when a text holds no documents.
var ErrEmpty = errors.New("no documents")

// Separator is the line that may also end a document (TinyStories'
// convention); blank lines end documents too.
const Separator = "<|endoftext|>"

// ReadDocuments splits plain UTF-8 text into documents: runs of
// non-blank lines, ended by a blank line or a line holding only
// Separator. Lines inside a document keep their newlines; surrounding
// space is trimmed. Any text works: a book becomes one document per
// paragraph.
func ReadDocuments(r io.Reader) ([]string, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<26)
	var docs []string
	var cur []string
	line := 0
	flush := func() {
		if len(cur) > 0 {
			docs = append(docs, strings.Join(cur, "\n"))
			cur = cur[:0]
		}
	}
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if !utf8.ValidString(t) {
			return nil, fmt.Errorf("corpus: line %d is not valid UTF-8; convert the text to UTF-8 first", line)
		}
		if t == "" || t == Separator {
			flush()
			continue
		}
		cur = append(cur, t)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("corpus: line %d is over 64 MiB; break the text into lines (documents are separated by blank lines)", line+1)
	} else if err != nil {
		return nil, fmt.Errorf("corpus: after line %d: %w", line, err)
	}
	flush()
	switch {
	case len(docs) == 0 && line == 0:
		return nil, fmt.Errorf("corpus: the text is empty: %w", ErrEmpty)
	case len(docs) == 0:
		return nil, fmt.Errorf("corpus: the text's %d lines are all blank: %w (documents are separated by blank lines)", line, ErrEmpty)
	}
	return docs, nil
}

// Options sizes a generated corpus: it ends after Stories stories or
// once Bytes bytes are written, whichever comes first (0: no limit; at
// least one must be set).
type Options struct {
	Seed    uint64
	Stories int
	Bytes   int64
	// First is the index of the first story, so that disjoint held-out
	// text comes from the same seed (stories First, First+1, ...).
	First int
	// Progress is called now and then with the bytes written.
	Progress func(written int64)
}

// Write generates stories into w, one per line, separated by blank
// lines, and returns the number of stories and bytes written.
func Write(w io.Writer, o Options) (stories int, written int64, err error) {
	if o.Stories <= 0 && o.Bytes <= 0 {
		return 0, 0, fmt.Errorf("corpus: give a story count or a byte size")
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	for i := o.First; ; i++ {
		if o.Stories > 0 && stories >= o.Stories || o.Bytes > 0 && written >= o.Bytes {
			break
		}
		s := Story(o.Seed, i)
		n, err := bw.WriteString(s + "\n\n")
		written += int64(n)
		if err != nil {
			return stories, written, fmt.Errorf("corpus: %w", err)
		}
		stories++
		if o.Progress != nil && stories%1000 == 0 {
			o.Progress(written)
		}
	}
	if err := bw.Flush(); err != nil {
		return stories, written, fmt.Errorf("corpus: %w", err)
	}
	return stories, written, nil
}
