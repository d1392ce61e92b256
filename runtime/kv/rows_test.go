package kv

import (
	"errors"
	"slices"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

// mirrorRows is a Rows that keeps each sequence's planes in host slices,
// laid out as the Cache's own, so a Rows cache can be checked against a
// host cache given the same operations.
type mirrorRows struct {
	cfg      Config
	seqs     map[int][]float32
	freed    []int
	released int // Release calls
	allocErr error
	moveErr  error
}

func (m *mirrorRows) Alloc(id int) error {
	if m.allocErr != nil {
		return m.allocErr
	}
	if m.seqs[id] != nil {
		return errors.New("sequence allocated twice")
	}
	m.seqs[id] = make([]float32, 2*m.cfg.Layers*m.cfg.Context*m.cfg.KVDim)
	return nil
}

func (m *mirrorRows) Free(id int) {
	delete(m.seqs, id)
	m.freed = append(m.freed, id)
}

func (m *mirrorRows) Move(id int, dst, src []int) error {
	if m.moveErr != nil {
		return m.moveErr
	}
	kvd, plane := m.cfg.KVDim, m.cfg.Context*m.cfg.KVDim
	p := m.seqs[id]
	for i := range dst {
		for pl := 0; pl < 2*m.cfg.Layers; pl++ {
			copy(p[pl*plane+dst[i]*kvd:pl*plane+(dst[i]+1)*kvd], p[pl*plane+src[i]*kvd:])
		}
	}
	return nil
}

func (m *mirrorRows) Release() error {
	m.released++
	return nil
}

// plainRows is a Rows without RowCopier.
type plainRows struct{ m *mirrorRows }

func (p plainRows) Alloc(id int) error                { return p.m.Alloc(id) }
func (p plainRows) Free(id int)                       { p.m.Free(id) }
func (p plainRows) Move(id int, dst, src []int) error { return p.m.Move(id, dst, src) }

func (m *mirrorRows) CopyRows(dst, src, n int) error {
	plane := m.cfg.Context * m.cfg.KVDim
	for pl := 0; pl < 2*m.cfg.Layers; pl++ {
		copy(m.seqs[dst][pl*plane:pl*plane+n*m.cfg.KVDim], m.seqs[src][pl*plane:])
	}
	return nil
}

// put writes the same row into the mirror and the host cache.
func (m *mirrorRows) put(host *Cache, id, layer, row int, k, v []float32) {
	host.Put(id, layer, row, k, v)
	kvd, plane := m.cfg.KVDim, m.cfg.Context*m.cfg.KVDim
	copy(m.seqs[id][2*layer*plane+row*kvd:], k)
	copy(m.seqs[id][(2*layer+1)*plane+row*kvd:], v)
}

func TestRowsMirrorCommit(t *testing.T) {
	cfg := Config{Layers: 2, KVDim: 3, Context: 24, Type: weights.F32}
	host, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rows := &mirrorRows{cfg: cfg, seqs: map[int][]float32{}}
	dcfg := cfg
	dcfg.Rows = rows
	dev, err := New(dcfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		a, err1 := host.NewSeq()
		b, err2 := dev.NewSeq()
		if err1 != nil || err2 != nil || a != b {
			t.Fatalf("NewSeq: host %d %v, rows %d %v", a, err1, b, err2)
		}
	}
	if dev.K(1, 0) != nil || dev.V16(1, 0) != nil {
		t.Fatal("a Rows cache returned host planes")
	}
	// Sequence 1: 3 committed rows, then a tree; commit a path through it.
	parents := []int{-1, 0, 0, 1, 2, 4}
	val := float32(0)
	for _, c := range []*Cache{host, dev} {
		c.Reserve(1, 3)
		c.CommitAll(1)
		c.Reserve(1, len(parents))
		for r, p := range parents {
			if err := c.Link(1, r, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	for row := 0; row < 3+len(parents); row++ {
		for l := 0; l < cfg.Layers; l++ {
			k := []float32{val, val + 1, val + 2}
			v := []float32{-val, -val - 1, -val - 2}
			val += 3
			rows.put(host, 1, l, row, k, v)
		}
	}
	path := []int{0, 2, 4, 5}
	if err := host.Commit(1, path); err != nil {
		t.Fatal(err)
	}
	if err := dev.Commit(1, path); err != nil {
		t.Fatal(err)
	}
	if host.Len(1) != dev.Len(1) || host.Tentative(1) != dev.Tentative(1) {
		t.Fatalf("rows cache: %d committed %d tentative, host %d %d", dev.Len(1), dev.Tentative(1), host.Len(1), host.Tentative(1))
	}
	n := host.Len(1) * cfg.KVDim
	for l := 0; l < cfg.Layers; l++ {
		plane := cfg.Context * cfg.KVDim
		if !slices.Equal(rows.seqs[1][2*l*plane:2*l*plane+n], host.K(1, l)[:n]) ||
			!slices.Equal(rows.seqs[1][(2*l+1)*plane:(2*l+1)*plane+n], host.V(1, l)[:n]) {
			t.Fatalf("layer %d: rows moved by Rows differ from the host cache's", l)
		}
	}

	// A failed move drops the tentative rows and keeps the committed ones.
	dev.Reserve(1, 3)
	dev.Link(1, 2, 1)
	rows.moveErr = errors.New("device lost")
	if err := dev.Commit(1, []int{1, 2}); err == nil {
		t.Fatal("Commit: no error from a failed move")
	}
	if dev.Len(1) != host.Len(1) || dev.Tentative(1) != 0 {
		t.Fatalf("after a failed move: %d committed %d tentative, want %d and 0", dev.Len(1), dev.Tentative(1), host.Len(1))
	}

	// Free releases the rows; a failed Alloc leaves the cache as it was.
	if err := dev.Free(0); err != nil || !slices.Equal(rows.freed, []int{0}) {
		t.Fatalf("Free: %v, freed %v", err, rows.freed)
	}
	rows.allocErr = errors.New("out of device memory")
	if _, err := dev.NewSeq(); err == nil || dev.Valid(0) {
		t.Fatalf("NewSeq with a failing Alloc: %v, sequence 0 valid %v", err, dev.Valid(0))
	}
	rows.allocErr = nil
	if id, err := dev.NewSeq(); err != nil || id != 0 {
		t.Fatalf("NewSeq after a failed Alloc: %d, %v", id, err)
	}
}

// TestRowsCopyPrefix: CopyPrefix on a Rows cache copies what the host
// cache copies; Rows without RowCopier refuse it with ErrUnsupported.
func TestRowsCopyPrefix(t *testing.T) {
	cfg := Config{Layers: 2, KVDim: 3, Context: 8, Type: weights.F32}
	host, _ := New(cfg)
	rows := &mirrorRows{cfg: cfg, seqs: map[int][]float32{}}
	dcfg := cfg
	dcfg.Rows = rows
	dev, _ := New(dcfg)
	for _, c := range []*Cache{host, dev} {
		for range 2 {
			if _, err := c.NewSeq(); err != nil {
				t.Fatal(err)
			}
		}
		c.Reserve(0, 5)
		c.CommitAll(0)
	}
	val := float32(1)
	for row := 0; row < 5; row++ {
		for l := 0; l < cfg.Layers; l++ {
			rows.put(host, 0, l, row, []float32{val, val + 1, val + 2}, []float32{-val, -val - 1, -val - 2})
			val += 3
		}
	}
	for _, c := range []*Cache{host, dev} {
		if !c.CanCopy() {
			t.Fatal("CanCopy false")
		}
		if err := c.CopyPrefix(1, 0, 4); err != nil || c.Len(1) != 4 {
			t.Fatalf("CopyPrefix: %v, %d committed", err, c.Len(1))
		}
	}
	plane, n := cfg.Context*cfg.KVDim, 4*cfg.KVDim
	for l := 0; l < cfg.Layers; l++ {
		if !slices.Equal(rows.seqs[1][2*l*plane:2*l*plane+n], host.K(1, l)[:n]) ||
			!slices.Equal(rows.seqs[1][(2*l+1)*plane:(2*l+1)*plane+n], host.V(1, l)[:n]) ||
			!slices.Equal(host.K(1, l)[:n], host.K(0, l)[:n]) {
			t.Fatalf("layer %d: rows copied by Rows differ from the host cache's", l)
		}
	}

	pcfg := cfg
	pcfg.Rows = plainRows{&mirrorRows{cfg: cfg, seqs: map[int][]float32{}}}
	plain, _ := New(pcfg)
	plain.NewSeq()
	plain.NewSeq()
	plain.Reserve(0, 2)
	plain.CommitAll(0)
	if plain.CanCopy() {
		t.Error("CanCopy true for Rows without RowCopier")
	}
	if err := plain.CopyPrefix(1, 0, 2); !errors.Is(err, errors.ErrUnsupported) || plain.Len(1) != 0 {
		t.Errorf("CopyPrefix without RowCopier: %v, %d committed; want ErrUnsupported and none", err, plain.Len(1))
	}
}

// TestRowsRelease: Cache.Release hands the release on to Rows that keep
// freed rows.
func TestRowsRelease(t *testing.T) {
	cfg := Config{Layers: 1, KVDim: 2, Context: 4, Type: weights.F32}
	rows := &mirrorRows{cfg: cfg, seqs: map[int][]float32{}}
	cfg.Rows = rows
	c, _ := New(cfg)
	id, _ := c.NewSeq()
	c.Free(id)
	if err := c.Release(); err != nil || rows.released != 1 || c.Bytes() != 0 {
		t.Errorf("Release: %v, %d releases by the rows, %d bytes; want one and none", err, rows.released, c.Bytes())
	}
}
