package weights

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/edsrzf/mmap-go"
)

// Open maps a model file read-only and parses it: GGUF (v2/v3) by its
// magic, otherwise a llama2.c .bin checked against its header. Tensor data
// are zero-copy views of the mapping until Close.
func Open(path string) (*File, error) {
	if err := RegularFile(path, "a .gguf or llama2.c .bin file"); err != nil {
		return nil, fmt.Errorf("open model: %w", err)
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open model: %w", err)
	}
	defer fh.Close() // the mapping stays valid after the descriptor closes
	// The size of the file opened, should the path have changed since.
	st, err := fh.Stat()
	if err != nil {
		return nil, fmt.Errorf("open model: %w", err)
	}
	if st.Size() == 0 {
		return nil, fmt.Errorf("open model: %s is empty", path)
	}
	m, err := mmap.Map(fh, mmap.RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("open model: map %s: %w", path, err)
	}
	adviseRandom(m)
	f, err := Parse(m, path)
	if err != nil {
		m.Unmap()
		return nil, err
	}
	adviseNormal(m)
	f.closer = unmapper{m}
	return f, nil
}

// Parse detects the format of data (GGUF magic or a valid llama2.c
// header) and parses it. Tensor data are views into data.
func Parse(data []byte, path string) (*File, error) {
	if len(data) >= 4 && binary.LittleEndian.Uint32(data) == GGUFMagic {
		return ParseGGUF(data, path)
	}
	if bytes.HasPrefix(data, []byte("FUGG")) {
		return nil, &FormatError{Path: path, Field: "magic", Msg: "big-endian GGUF files are not supported"}
	}
	f, err := ParseLlama2C(data, path)
	if err != nil {
		var fe *FormatError
		if errors.As(err, &fe) && fe.Field != llama2CCutShort {
			return nil, fmt.Errorf("not a GGUF file (no \"GGUF\" magic) and not a llama2.c .bin: %w", err)
		}
		return nil, err
	}
	return f, nil
}

type unmapper struct{ m mmap.MMap }

func (u unmapper) Close() error { return u.m.Unmap() }

// RegularFile checks that path names a regular file before it is opened,
// saying it wants want otherwise. Opening a named pipe blocks until a
// writer comes, and a pipe or a device can be neither mapped nor read
// twice (a tokenizer's format is told from its first bytes).
func RegularFile(path, want string) error {
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return err
	case st.IsDir():
		return fmt.Errorf("%s is a directory, want %s", path, want)
	case !st.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file (%v), want %s", path, st.Mode().Type(), want)
	}
	return nil
}
