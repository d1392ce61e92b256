package weights

import (
	"fmt"
	"math"
)

// ValueType is a GGUF metadata value type (gguf_metadata_value_type).
type ValueType uint32

const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32",
	"float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("valuetype(%d)", uint32(t))
}

// Value is one metadata value. V holds the Go value for Type:
// uint8 int8 uint16 int16 uint32 int32 float32 bool string uint64 int64
// float64, or for TypeArray a []Value whose elements all have type Elem.
type Value struct {
	Type ValueType
	Elem ValueType // element type when Type == TypeArray
	V    any
}

// Constructors used by writers and converters.
func Uint32Value(v uint32) Value   { return Value{Type: TypeUint32, V: v} }
func Int32Value(v int32) Value     { return Value{Type: TypeInt32, V: v} }
func Uint64Value(v uint64) Value   { return Value{Type: TypeUint64, V: v} }
func Float32Value(v float32) Value { return Value{Type: TypeFloat32, V: v} }
func BoolValue(v bool) Value       { return Value{Type: TypeBool, V: v} }
func StringValue(v string) Value   { return Value{Type: TypeString, V: v} }

// ArrayValue builds an array value of elem-typed elements.
func ArrayValue(elem ValueType, vs []Value) Value { return Value{Type: TypeArray, Elem: elem, V: vs} }

// StringsValue, Float32sValue and Int32sValue build the arrays tokenizer metadata uses.
func StringsValue(ss []string) Value {
	vs := make([]Value, len(ss))
	for i, s := range ss {
		vs[i] = StringValue(s)
	}
	return ArrayValue(TypeString, vs)
}

func Float32sValue(fs []float32) Value {
	vs := make([]Value, len(fs))
	for i, f := range fs {
		vs[i] = Float32Value(f)
	}
	return ArrayValue(TypeFloat32, vs)
}

func Int32sValue(is []int32) Value {
	vs := make([]Value, len(is))
	for i, x := range is {
		vs[i] = Int32Value(x)
	}
	return ArrayValue(TypeInt32, vs)
}

// Uint returns an integer value of any width as uint64; ok is false for
// non-integers and negative values.
func (v Value) Uint() (uint64, bool) {
	switch x := v.V.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8, int16, int32, int64:
		i, _ := v.Int()
		if i < 0 {
			return 0, false
		}
		return uint64(i), true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// Int returns an integer value of any width as int64.
func (v Value) Int() (int64, bool) {
	switch x := v.V.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8, uint16, uint32:
		u, _ := v.Uint()
		return int64(u), true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

// Float returns a numeric value as float64.
func (v Value) Float() (float64, bool) {
	switch x := v.V.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if i, ok := v.Int(); ok {
		return float64(i), true
	}
	if u, ok := v.Uint(); ok {
		return float64(u), true
	}
	return 0, false
}

// Len is the element count of an array value (0 otherwise).
func (v Value) Len() int {
	a, _ := v.V.([]Value)
	return len(a)
}

// KV is one metadata entry, in file order.
type KV struct {
	Key   string
	Value Value
}

// Metadata is an ordered set of key/value entries. The zero value is empty
// and ready to use.
type Metadata struct {
	kvs   []KV
	index map[string]int
}

// Set adds key or replaces its value, keeping the original position.
func (m *Metadata) Set(key string, v Value) {
	if m.index == nil {
		m.index = make(map[string]int)
	}
	if i, ok := m.index[key]; ok {
		m.kvs[i].Value = v
		return
	}
	m.index[key] = len(m.kvs)
	m.kvs = append(m.kvs, KV{key, v})
}

// Delete removes key if present.
func (m *Metadata) Delete(key string) {
	i, ok := m.index[key]
	if !ok {
		return
	}
	m.kvs = append(m.kvs[:i], m.kvs[i+1:]...)
	delete(m.index, key)
	for j := i; j < len(m.kvs); j++ {
		m.index[m.kvs[j].Key] = j
	}
}

// Get returns key's value.
func (m *Metadata) Get(key string) (Value, bool) {
	i, ok := m.index[key]
	if !ok {
		return Value{}, false
	}
	return m.kvs[i].Value, true
}

// All returns the entries in order. The slice must not be modified.
func (m *Metadata) All() []KV { return m.kvs }

// Len is the number of entries.
func (m *Metadata) Len() int { return len(m.kvs) }

// String returns a string value.
func (m *Metadata) String(key string) (string, bool) {
	v, ok := m.Get(key)
	if !ok {
		return "", false
	}
	s, ok := v.V.(string)
	return s, ok
}

// Uint returns an integer value of any width.
func (m *Metadata) Uint(key string) (uint64, bool) {
	v, ok := m.Get(key)
	if !ok {
		return 0, false
	}
	return v.Uint()
}

// Float returns a numeric value.
func (m *Metadata) Float(key string) (float64, bool) {
	v, ok := m.Get(key)
	if !ok {
		return 0, false
	}
	return v.Float()
}

// Bool returns a bool value.
func (m *Metadata) Bool(key string) (bool, bool) {
	v, ok := m.Get(key)
	if !ok {
		return false, false
	}
	b, ok := v.V.(bool)
	return b, ok
}

// Strings returns a string array.
func (m *Metadata) Strings(key string) ([]string, error) {
	a, err := m.array(key, TypeString)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(a))
	for i, v := range a {
		out[i] = v.V.(string)
	}
	return out, nil
}

// Float32s returns a numeric array as float32.
func (m *Metadata) Float32s(key string) ([]float32, error) {
	a, err := m.array(key, TypeFloat32)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(a))
	for i, v := range a {
		out[i] = v.V.(float32)
	}
	return out, nil
}

// Int32s returns an integer array of any width as int32 (values that do
// not fit are an error).
func (m *Metadata) Int32s(key string) ([]int32, error) {
	v, ok := m.Get(key)
	if !ok {
		return nil, fmt.Errorf("metadata key %q: missing", key)
	}
	a, ok := v.V.([]Value)
	if !ok {
		return nil, fmt.Errorf("metadata key %q: want an integer array, have %s", key, v.Type)
	}
	out := make([]int32, len(a))
	for i, e := range a {
		x, ok := e.Int()
		if !ok || x < math.MinInt32 || x > math.MaxInt32 {
			return nil, fmt.Errorf("metadata key %q[%d]: want an int32, have %s %v", key, i, e.Type, e.V)
		}
		out[i] = int32(x)
	}
	return out, nil
}

func (m *Metadata) array(key string, elem ValueType) ([]Value, error) {
	v, ok := m.Get(key)
	if !ok {
		return nil, fmt.Errorf("metadata key %q: missing", key)
	}
	a, ok := v.V.([]Value)
	if !ok || v.Elem != elem {
		return nil, fmt.Errorf("metadata key %q: want a %s array, have %s (elements %s)", key, elem, v.Type, v.Elem)
	}
	return a, nil
}
