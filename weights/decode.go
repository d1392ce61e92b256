package weights

import (
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"
)

// FormatError reports malformed model-file bytes: which file, where, which
// field, and what is wrong with it.
type FormatError struct {
	Path   string
	Offset int64  // byte offset of the field in the file
	Field  string // e.g. "tensor 3 (blk.0.attn_q.weight) type"
	Msg    string
}

func (e *FormatError) Error() string {
	return fmt.Sprintf("%s: offset %d: %s: %s", e.Path, e.Offset, e.Field, e.Msg)
}

// decoder reads little-endian fields from an in-memory (usually mapped)
// file. Every read checks the remaining length, so corrupt input turns
// into a FormatError instead of a panic.
type decoder struct {
	b    []byte
	off  int
	path string
	// values counts the metadata array elements decoded so far, against
	// maxMetadataValues.
	values uint64
}

func (d *decoder) fail(field, format string, args ...any) error {
	return &FormatError{Path: d.path, Offset: int64(d.off), Field: field, Msg: fmt.Sprintf(format, args...)}
}

func (d *decoder) remaining() int { return len(d.b) - d.off }

func (d *decoder) need(n int, field string) error {
	if n < 0 || d.remaining() < n {
		return d.fail(field, "file truncated: need %d bytes, %d left (file size %d)", n, d.remaining(), len(d.b))
	}
	return nil
}

func (d *decoder) bytes(n int, field string) ([]byte, error) {
	if err := d.need(n, field); err != nil {
		return nil, err
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p, nil
}

func (d *decoder) u8(field string) (uint8, error) {
	p, err := d.bytes(1, field)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

func (d *decoder) u16(field string) (uint16, error) {
	p, err := d.bytes(2, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(p), nil
}

func (d *decoder) u32(field string) (uint32, error) {
	p, err := d.bytes(4, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(p), nil
}

func (d *decoder) u64(field string) (uint64, error) {
	p, err := d.bytes(8, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p), nil
}

func (d *decoder) f32(field string) (float32, error) {
	u, err := d.u32(field)
	return math.Float32frombits(u), err
}

// str reads a GGUF string: u64 length then bytes. Keys and tensor names
// must be UTF-8 (checkUTF8); values are kept as stored, since some
// vocabularies hold raw byte pieces.
func (d *decoder) str(field string, checkUTF8 bool) (string, error) {
	start := d.off
	n, err := d.u64(field + " length")
	if err != nil {
		return "", err
	}
	if n > uint64(d.remaining()) {
		d.off = start
		return "", d.fail(field, "string length %d runs past the end of the file (%d bytes left)", n, d.remaining()-8)
	}
	p, _ := d.bytes(int(n), field)
	if checkUTF8 && !utf8.Valid(p) {
		d.off = start
		return "", d.fail(field, "string is not valid UTF-8")
	}
	return string(p), nil
}
