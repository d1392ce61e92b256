package weights

import (
	"fmt"
	"math"
	"math/bits"
)

// GGUFMagic is "GGUF" read as a little-endian uint32.
const GGUFMagic = 0x46554747

// DefaultAlignment is the GGUF data alignment when general.alignment is absent.
const DefaultAlignment = 32

// maxArrayDepth bounds nested metadata arrays; real files nest at most once.
const maxArrayDepth = 8

// ParseGGUF parses a GGUF v2 or v3 file held in data (usually a read-only
// mapping). Tensor.Data are views into data, so data must outlive the File.
// path names the file in errors.
func ParseGGUF(data []byte, path string) (*File, error) {
	d := &decoder{b: data, path: path}
	magic, err := d.u32("magic")
	if err != nil {
		return nil, err
	}
	if magic != GGUFMagic {
		d.off = 0
		return nil, d.fail("magic", "not a GGUF file (magic %#08x, want %#08x \"GGUF\")", magic, GGUFMagic)
	}
	version, err := d.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version == 1:
		d.off -= 4
		return nil, d.fail("version", "GGUF v1 is not supported (re-convert the model with a current converter)")
	case version != 2 && version != 3:
		d.off -= 4
		if rev := bits.ReverseBytes32(version); rev >= 1 && rev <= 3 {
			return nil, d.fail("version", "big-endian GGUF files are not supported")
		}
		return nil, d.fail("version", "unsupported GGUF version %d (want 2 or 3)", version)
	}
	nTensors, err := d.u64("tensor_count")
	if err != nil {
		return nil, err
	}
	// Each tensor info takes at least 8+1+4+8+4+8 bytes, each kv at least 8+1+4+1.
	if nTensors > uint64(d.remaining())/33 {
		d.off -= 8
		return nil, d.fail("tensor_count", "%d tensors cannot fit in a %d-byte file (truncated or corrupt)", nTensors, len(data))
	}
	nKV, err := d.u64("metadata_kv_count")
	if err != nil {
		return nil, err
	}
	if nKV > uint64(d.remaining())/14 {
		d.off -= 8
		return nil, d.fail("metadata_kv_count", "%d metadata entries cannot fit in a %d-byte file (truncated or corrupt)", nKV, len(data))
	}

	f := &File{Path: path, Format: FormatGGUF, Version: version, Alignment: DefaultAlignment, Size: int64(len(data))}
	for i := uint64(0); i < nKV; i++ {
		key, err := d.str(fmt.Sprintf("metadata entry %d key", i), true)
		if err != nil {
			return nil, err
		}
		if _, dup := f.Metadata.Get(key); dup {
			return nil, d.fail("metadata key "+quote(key), "duplicate key")
		}
		v, err := d.value(key, 0)
		if err != nil {
			return nil, err
		}
		f.Metadata.Set(key, v)
	}
	if v, ok := f.Metadata.Get("general.alignment"); ok {
		a, isUint := v.Uint()
		if !isUint || v.Type != TypeUint32 || a == 0 || a&(a-1) != 0 {
			return nil, &FormatError{Path: path, Field: "metadata key \"general.alignment\"", Msg: fmt.Sprintf("must be a nonzero power-of-two uint32, have %s %v", v.Type, v.V)}
		}
		f.Alignment = a
	}

	type info struct {
		rel uint64 // offset relative to the data section
		at  int    // where the info starts, for errors
	}
	infos := make([]info, nTensors)
	f.Tensors = make([]Tensor, nTensors)
	for i := range f.Tensors {
		t := &f.Tensors[i]
		infos[i].at = d.off
		field := fmt.Sprintf("tensor %d", i)
		if t.Name, err = d.str(field+" name", true); err != nil {
			return nil, err
		}
		field = fmt.Sprintf("tensor %d (%s)", i, t.Name)
		nDims, err := d.u32(field + " n_dims")
		if err != nil {
			return nil, err
		}
		if nDims == 0 || nDims > 4 {
			d.off -= 4
			return nil, d.fail(field+" n_dims", "%d dimensions (want 1 to 4)", nDims)
		}
		t.Shape = make([]uint64, nDims)
		elems := uint64(1)
		for j := range t.Shape {
			if t.Shape[j], err = d.u64(fmt.Sprintf("%s dim %d", field, j)); err != nil {
				return nil, err
			}
			hi, lo := bits.Mul64(elems, t.Shape[j])
			if t.Shape[j] == 0 || hi != 0 || lo > math.MaxInt64 {
				d.off -= 8
				return nil, d.fail(fmt.Sprintf("%s dim %d", field, j), "dimension %d in shape %v is zero or overflows the element count", t.Shape[j], t.Shape[:j+1])
			}
			elems = lo
		}
		typ, err := d.u32(field + " type")
		if err != nil {
			return nil, err
		}
		t.Type = DType(typ)
		if !t.Type.Known() {
			d.off -= 4
			return nil, d.fail(field+" type", "unknown tensor type %d", typ)
		}
		rowBytes, err := t.Type.RowBytes(t.Shape[0])
		if err != nil {
			return nil, d.fail(field+" shape", "%v", err)
		}
		hi, size := bits.Mul64(rowBytes, elems/t.Shape[0])
		if hi != 0 || size > math.MaxInt64 {
			return nil, d.fail(field+" shape", "shape %v of %s overflows the byte size", t.Shape, t.Type)
		}
		t.Size = size
		if infos[i].rel, err = d.u64(field + " offset"); err != nil {
			return nil, err
		}
		if infos[i].rel%f.Alignment != 0 {
			d.off -= 8
			return nil, d.fail(field+" offset", "data offset %d is not a multiple of the alignment %d", infos[i].rel, f.Alignment)
		}
	}

	f.DataOffset = alignUp(uint64(d.off), f.Alignment)
	if f.DataOffset > uint64(len(data)) && nTensors > 0 {
		return nil, d.fail("tensor data", "data section would start at %d, past the end of the %d-byte file (truncated)", f.DataOffset, len(data))
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		end, carry := bits.Add64(f.DataOffset, infos[i].rel, 0)
		end2, carry2 := bits.Add64(end, t.Size, 0)
		if carry != 0 || carry2 != 0 || end2 > uint64(len(data)) {
			return nil, &FormatError{Path: path, Offset: int64(infos[i].at), Field: fmt.Sprintf("tensor %d (%s) offset", i, t.Name),
				Msg: fmt.Sprintf("data [%d, +%d) runs past the end of the %d-byte file (truncated download?)", infos[i].rel, t.Size, len(data))}
		}
		t.Offset = end
		t.Data = data[end:end2:end2]
	}
	if err := f.index(); err != nil {
		return nil, err
	}
	return f, nil
}

// value reads one typed metadata value for key.
func (d *decoder) value(key string, depth int) (Value, error) {
	field := "metadata key " + quote(key)
	vt, err := d.u32(field + " value type")
	if err != nil {
		return Value{}, err
	}
	return d.typed(ValueType(vt), field, depth)
}

func (d *decoder) typed(vt ValueType, field string, depth int) (Value, error) {
	v := Value{Type: vt}
	var err error
	switch vt {
	case TypeUint8:
		v.V, err = d.u8(field)
	case TypeInt8:
		var x uint8
		x, err = d.u8(field)
		v.V = int8(x)
	case TypeUint16:
		v.V, err = d.u16(field)
	case TypeInt16:
		var x uint16
		x, err = d.u16(field)
		v.V = int16(x)
	case TypeUint32:
		v.V, err = d.u32(field)
	case TypeInt32:
		var x uint32
		x, err = d.u32(field)
		v.V = int32(x)
	case TypeFloat32:
		v.V, err = d.f32(field)
	case TypeUint64:
		v.V, err = d.u64(field)
	case TypeInt64:
		var x uint64
		x, err = d.u64(field)
		v.V = int64(x)
	case TypeFloat64:
		var x uint64
		x, err = d.u64(field)
		v.V = math.Float64frombits(x)
	case TypeBool:
		var x uint8
		if x, err = d.u8(field); err == nil && x > 1 {
			d.off--
			return v, d.fail(field, "bool byte is %d (want 0 or 1)", x)
		}
		v.V = x == 1
	case TypeString:
		v.V, err = d.str(field, false)
	case TypeArray:
		return d.array(field, depth)
	default:
		d.off -= 4
		return v, d.fail(field, "unknown metadata value type %d", uint32(vt))
	}
	return v, err
}

func (d *decoder) array(field string, depth int) (Value, error) {
	if depth >= maxArrayDepth {
		return Value{}, d.fail(field, "arrays nested deeper than %d", maxArrayDepth)
	}
	et, err := d.u32(field + " array type")
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	if elem > TypeFloat64 {
		d.off -= 4
		return Value{}, d.fail(field+" array type", "unknown metadata value type %d", et)
	}
	n, err := d.u64(field + " array length")
	if err != nil {
		return Value{}, err
	}
	// Fail fast before allocating: every element needs at least this many bytes.
	minSize := uint64(1)
	switch elem {
	case TypeUint16, TypeInt16:
		minSize = 2
	case TypeUint32, TypeInt32, TypeFloat32:
		minSize = 4
	case TypeUint64, TypeInt64, TypeFloat64, TypeString:
		minSize = 8
	case TypeArray:
		minSize = 12
	}
	if n > uint64(d.remaining())/minSize {
		d.off -= 8
		return Value{}, d.fail(field+" array length", "%d %s elements cannot fit in the %d bytes left", n, elem, d.remaining())
	}
	// A decoded element takes 24 bytes or more, its encoding as little as
	// one: a 180 MB array of bytes needed 4 GB.
	if d.values += n; d.values > maxMetadataValues {
		d.off -= 8
		return Value{}, d.fail(field+" array length", "the metadata's arrays hold more than %d values (a model's vocabulary needs a few hundred thousand): the file is damaged or not a model", maxMetadataValues)
	}
	vs := make([]Value, n)
	for i := range vs {
		var err error
		if elem == TypeArray {
			vs[i], err = d.array(fmt.Sprintf("%s[%d]", field, i), depth+1)
		} else {
			vs[i], err = d.typed(elem, field, depth+1)
		}
		if err != nil {
			return Value{}, err
		}
	}
	return ArrayValue(elem, vs), nil
}

// maxMetadataValues bounds the array elements a file's metadata may hold
// in all, so that a small file cannot claim gigabytes once decoded (about
// 270 MB at most here). The largest vocabularies in use, 256k tokens with
// scores, types and merges, hold about a million.
const maxMetadataValues = 1 << 23

func alignUp(n, a uint64) uint64 {
	if r := n % a; r != 0 {
		return n + a - r
	}
	return n
}

func quote(s string) string { return fmt.Sprintf("%q", s) }
