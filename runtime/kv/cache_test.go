package kv

import (
	"errors"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

// fill writes row-identifying values into reserved rows so compaction can
// be checked: K = 1000*layer + 10*tag + i, V = -(that).
func fill(c *Cache, id, layer, row, tag int) {
	kvd := c.cfg.KVDim
	k := make([]float32, kvd)
	v := make([]float32, kvd)
	for i := range k {
		k[i] = float32(1000*layer + 10*tag + i)
		v[i] = -k[i]
	}
	c.Put(id, layer, row, k, v)
}

// rowTag reads back the tag written by fill, checking the whole row.
func rowTag(t *testing.T, c *Cache, id, layer, row int) int {
	t.Helper()
	kvd := c.cfg.KVDim
	get := func(plane, i int) float32 {
		if c.cfg.Type == weights.F16 {
			var p []uint16
			if plane == 0 {
				p = c.K16(id, layer)
			} else {
				p = c.V16(id, layer)
			}
			return weights.F16ToF32(p[row*kvd+i])
		}
		if plane == 0 {
			return c.K(id, layer)[row*kvd+i]
		}
		return c.V(id, layer)[row*kvd+i]
	}
	tag := (int(get(0, 0)) - 1000*layer) / 10
	for i := 0; i < kvd; i++ {
		want := float32(1000*layer + 10*tag + i)
		if get(0, i) != want || get(1, i) != -want {
			t.Fatalf("seq %d layer %d row %d elem %d: K %v V %v, want %v/%v", id, layer, row, i, get(0, i), get(1, i), want, -want)
		}
	}
	return tag
}

func TestCommitCompactsPath(t *testing.T) {
	for _, typ := range []weights.DType{weights.F32, weights.F16} {
		t.Run(typ.String(), func(t *testing.T) {
			c, err := New(Config{Layers: 2, KVDim: 4, Context: 16, Type: typ})
			if err != nil {
				t.Fatal(err)
			}
			id, err := c.NewSeq()
			if err != nil {
				t.Fatal(err)
			}
			// 3 committed rows tagged 0..2.
			start, err := c.Reserve(id, 3)
			if err != nil || start != 0 {
				t.Fatalf("Reserve: %d, %v", start, err)
			}
			for r := 0; r < 3; r++ {
				for l := 0; l < 2; l++ {
					fill(c, id, l, r, r)
				}
			}
			if err := c.CommitAll(id); err != nil {
				t.Fatal(err)
			}
			// A tree of 5 tentative rows tagged 10..14; keep rows 1, 3, 4.
			start, err = c.Reserve(id, 5)
			if err != nil || start != 3 {
				t.Fatalf("Reserve: %d, %v", start, err)
			}
			for r := 0; r < 5; r++ {
				for l := 0; l < 2; l++ {
					fill(c, id, l, start+r, 10+r)
				}
			}
			if got := c.Tentative(id); got != 5 {
				t.Fatalf("Tentative = %d, want 5", got)
			}
			// Rows 1 -> 3 -> 4 are a path; 0 and 2 are other branches.
			for _, l := range [][2]int{{2, 0}, {3, 1}, {4, 3}} {
				if err := c.Link(id, l[0], l[1]); err != nil {
					t.Fatal(err)
				}
			}
			if err := c.Commit(id, []int{1, 3, 4}); err != nil {
				t.Fatal(err)
			}
			if c.Len(id) != 6 || c.Tentative(id) != 0 || c.Room(id) != 10 {
				t.Fatalf("after commit: len %d tentative %d room %d", c.Len(id), c.Tentative(id), c.Room(id))
			}
			want := []int{0, 1, 2, 11, 13, 14}
			for r, w := range want {
				for l := 0; l < 2; l++ {
					if got := rowTag(t, c, id, l, r); got != w {
						t.Errorf("layer %d row %d holds tag %d, want %d", l, r, got, w)
					}
				}
			}
		})
	}
}

func TestCommitErrors(t *testing.T) {
	c, _ := New(Config{Layers: 1, KVDim: 2, Context: 8, Type: weights.F32})
	id, _ := c.NewSeq()
	if _, err := c.Reserve(id, 4); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		rows []int
	}{
		{"out of range", []int{0, 4}},
		{"negative", []int{-1}},
		{"not increasing", []int{2, 1}},
		{"repeated", []int{1, 1}},
		{"not a path", []int{0, 1}}, // row 1 follows the tip, not row 0
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.Commit(id, tc.rows); err == nil {
				t.Fatalf("Commit(%v) succeeded", tc.rows)
			}
			if c.Len(id) != 0 || c.Tentative(id) != 4 {
				t.Fatalf("failed commit changed the sequence: len %d tentative %d", c.Len(id), c.Tentative(id))
			}
		})
	}
	if err := c.Commit(id, nil); err != nil || c.Len(id) != 0 || c.Tentative(id) != 0 {
		t.Fatalf("empty commit: %v, len %d tentative %d", err, c.Len(id), c.Tentative(id))
	}
}

func TestContextFull(t *testing.T) {
	c, _ := New(Config{Layers: 1, KVDim: 2, Context: 4, Type: weights.F32})
	id, _ := c.NewSeq()
	if _, err := c.Reserve(id, 3); err != nil {
		t.Fatal(err)
	}
	_, err := c.Reserve(id, 2)
	if !errors.Is(err, ErrContextFull) {
		t.Fatalf("Reserve past the context: %v, want ErrContextFull", err)
	}
	if c.Tentative(id) != 3 {
		t.Fatalf("failed Reserve changed tentative rows to %d", c.Tentative(id))
	}
	if _, err := c.Reserve(id, 1); err != nil {
		t.Fatalf("last row: %v", err)
	}
	if c.Room(id) != 0 {
		t.Fatalf("Room = %d, want 0", c.Room(id))
	}
}

// TestTreeRows: rows past the context take tentative rows (a tree of
// many tokens at few positions), but committed rows never pass the
// context.
func TestTreeRows(t *testing.T) {
	c, err := New(Config{Layers: 1, KVDim: 2, Context: 4, Tree: 3, Type: weights.F32})
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Config().SeqBytes(); got != 7*2*2*4 {
		t.Fatalf("SeqBytes = %d, want 7 rows of K and V", got)
	}
	id, _ := c.NewSeq()
	if _, err := c.Reserve(id, 3); err != nil {
		t.Fatal(err)
	}
	if c.Link(id, 1, 0) != nil || c.Link(id, 2, 1) != nil {
		t.Fatal("link a chain")
	}
	if err := c.Commit(id, []int{0, 1, 2}); err != nil {
		t.Fatal(err)
	}
	// 3 committed, 4 rows left: a tree of four siblings at position 3.
	if c.Room(id) != 4 {
		t.Fatalf("Room = %d, want 4", c.Room(id))
	}
	first, err := c.Reserve(id, 4)
	if err != nil {
		t.Fatalf("a tree in the tree rows: %v", err)
	}
	for r := range 4 {
		fill(c, id, 0, first+r, 5+r)
	}
	if err := c.Commit(id, []int{0, 1}); !errors.Is(err, ErrContextFull) {
		t.Fatalf("commit past the context: %v, want ErrContextFull", err)
	}
	if c.Len(id) != 3 || c.Tentative(id) != 4 {
		t.Fatalf("failed commit changed the rows: %d committed, %d tentative", c.Len(id), c.Tentative(id))
	}
	if err := c.Commit(id, []int{2}); err != nil {
		t.Fatal(err)
	}
	if got := rowTag(t, c, id, 0, 3); got != 7 {
		t.Fatalf("committed row holds tag %d, want 7 (the third sibling)", got)
	}
	if _, err := New(Config{Layers: 1, KVDim: 2, Context: 4, Tree: -1, Type: weights.F32}); err == nil {
		t.Fatal("negative tree rows accepted")
	}
}

func TestTruncateAndDrop(t *testing.T) {
	c, _ := New(Config{Layers: 1, KVDim: 2, Context: 8, Type: weights.F32})
	id, _ := c.NewSeq()
	c.Reserve(id, 5)
	c.CommitAll(id)
	c.Reserve(id, 2)
	if err := c.Truncate(id, 6); err == nil {
		t.Fatal("Truncate past the committed rows succeeded")
	}
	if err := c.Truncate(id, -1); err == nil {
		t.Fatal("Truncate to -1 succeeded")
	}
	if err := c.Truncate(id, 3); err != nil {
		t.Fatal(err)
	}
	if c.Len(id) != 3 || c.Tentative(id) != 0 {
		t.Fatalf("after Truncate: len %d tentative %d", c.Len(id), c.Tentative(id))
	}
	c.Reserve(id, 2)
	if err := c.Drop(id); err != nil {
		t.Fatal(err)
	}
	if c.Len(id) != 3 || c.Tentative(id) != 0 {
		t.Fatalf("after Drop: len %d tentative %d", c.Len(id), c.Tentative(id))
	}
}

func TestSequences(t *testing.T) {
	cfg := Config{Layers: 3, KVDim: 8, Context: 10, Type: weights.F16, MaxSeqs: 2}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	per := int64(3 * 8 * 10 * 2 * 2)
	if cfg.SeqBytes() != per {
		t.Fatalf("SeqBytes = %d, want %d", cfg.SeqBytes(), per)
	}
	a, _ := c.NewSeq()
	b, _ := c.NewSeq()
	if a == b {
		t.Fatalf("two sequences share id %d", a)
	}
	if _, err := c.NewSeq(); err == nil {
		t.Fatal("third sequence allowed past MaxSeqs=2")
	}
	if c.Bytes() != 2*per {
		t.Fatalf("Bytes = %d, want %d", c.Bytes(), 2*per)
	}
	c.Reserve(a, 4)
	c.CommitAll(a)
	if c.Len(b) != 0 {
		t.Fatalf("sequence %d changed with %d", b, a)
	}
	if err := c.Free(a); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(a); !errors.Is(err, ErrUnknownSeq) {
		t.Fatalf("double Free: %v, want ErrUnknownSeq", err)
	}
	if c.Valid(a) || !c.Valid(b) {
		t.Fatal("Valid disagrees with Free")
	}
	for _, op := range []func() error{
		func() error { return c.CommitAll(a) },
		func() error { return c.Commit(a, nil) },
		func() error { return c.Drop(a) },
		func() error { return c.Truncate(a, 0) },
		func() error { _, err := c.Reserve(a, 1); return err },
		func() error { _, err := c.Reserve(-1, 1); return err },
		func() error { _, err := c.Reserve(99, 1); return err },
	} {
		if err := op(); !errors.Is(err, ErrUnknownSeq) {
			t.Errorf("operation on a freed/unknown sequence: %v, want ErrUnknownSeq", err)
		}
	}
	// The freed id and buffer are reused, and the new sequence starts empty.
	a2, err := c.NewSeq()
	if err != nil || a2 != a {
		t.Fatalf("NewSeq after Free: id %d, %v; want id %d", a2, err, a)
	}
	if c.Len(a2) != 0 || c.Tentative(a2) != 0 || c.Bytes() != 2*per {
		t.Fatalf("reused sequence: len %d tentative %d bytes %d", c.Len(a2), c.Tentative(a2), c.Bytes())
	}
}

func TestBadConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"zero layers", Config{Layers: 0, KVDim: 4, Context: 4, Type: weights.F32}},
		{"negative kvdim", Config{Layers: 1, KVDim: -4, Context: 4, Type: weights.F32}},
		{"zero context", Config{Layers: 1, KVDim: 4, Context: 0, Type: weights.F32}},
		{"quantized type", Config{Layers: 1, KVDim: 4, Context: 4, Type: weights.Q8_0}},
		{"negative max seqs", Config{Layers: 1, KVDim: 4, Context: 4, Type: weights.F32, MaxSeqs: -1}},
		{"too large", Config{Layers: 1 << 10, KVDim: 1 << 12, Context: 1 << 12, Type: weights.F32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil {
				t.Fatalf("New(%+v) succeeded", tc.cfg)
			}
		})
	}
}

// TestCommitKeepSubtree commits a path of a tentative tree and keeps the
// rows a draft grew below its last row, in order, re-linked under the new
// tip; everything else goes.
func TestCommitKeepSubtree(t *testing.T) {
	c, _ := New(Config{Layers: 2, KVDim: 3, Context: 32, Type: weights.F32})
	id, _ := c.NewSeq()
	c.Reserve(id, 2)
	for r := 0; r < 2; r++ {
		fill(c, id, 0, r, r)
		fill(c, id, 1, r, r)
	}
	c.CommitAll(id)
	// Tentative tree (row: parent): 0:-1, 1:0, 2:0, 3:1, 4:2, 5:3, 6:3, 7:-1, 8:5
	parents := []int{-1, 0, 0, 1, 2, 3, 3, -1, 5}
	start, err := c.Reserve(id, len(parents))
	if err != nil {
		t.Fatal(err)
	}
	for r, p := range parents {
		if err := c.Link(id, r, p); err != nil {
			t.Fatal(err)
		}
		fill(c, id, 0, start+r, 10+r)
		fill(c, id, 1, start+r, 10+r)
	}
	if d := c.Depth(id, 8); d != 4 {
		t.Fatalf("depth of row 8 = %d, want 4", d)
	}
	if _, err := c.CommitKeep(id, []int{0, 1}, 4); err == nil {
		t.Fatal("kept row 4, which does not follow the path's last row 1")
	}
	remap, err := c.CommitKeep(id, []int{0, 1}, 3)
	if err != nil {
		t.Fatal(err)
	}
	// Kept: 3 (under 1), 5, 6 (under 3), 8 (under 5), in order.
	wantRemap := []int{-1, -1, -1, 0, -1, 1, 2, -1, 3}
	for r, w := range wantRemap {
		if remap[r] != w {
			t.Fatalf("remap = %v, want %v", remap, wantRemap)
		}
	}
	if c.Len(id) != 4 || c.Tentative(id) != 4 {
		t.Fatalf("len %d tentative %d, want 4 and 4", c.Len(id), c.Tentative(id))
	}
	wantTags := []int{0, 1, 10, 11, 13, 15, 16, 18}
	for r, w := range wantTags {
		for l := 0; l < 2; l++ {
			if got := rowTag(t, c, id, l, r); got != w {
				t.Errorf("layer %d row %d holds tag %d, want %d", l, r, got, w)
			}
		}
	}
	wantParents := []int{-1, 0, 0, 1}
	wantDepth := []int{0, 1, 1, 2}
	for r := range wantParents {
		if c.Parent(id, r) != wantParents[r] || c.Depth(id, r) != wantDepth[r] {
			t.Errorf("row %d: parent %d depth %d, want %d and %d", r, c.Parent(id, r), c.Depth(id, r), wantParents[r], wantDepth[r])
		}
	}
	// An empty path keeps the subtree under one root row; -1 keeps none.
	if remap, err := c.CommitKeep(id, nil, 0); err != nil || c.Tentative(id) != 4 || remap[3] != 3 {
		t.Fatalf("CommitKeep(nil, 0): %v %v, tentative %d", remap, err, c.Tentative(id))
	}
	if _, err := c.CommitKeep(id, []int{0}, -1); err != nil || c.Len(id) != 5 || c.Tentative(id) != 0 {
		t.Fatalf("CommitKeep(path, -1): %v, len %d tentative %d", err, c.Len(id), c.Tentative(id))
	}
}

func TestLinkErrors(t *testing.T) {
	c, _ := New(Config{Layers: 1, KVDim: 2, Context: 8, Type: weights.F32})
	id, _ := c.NewSeq()
	c.Reserve(id, 3)
	for _, l := range [][2]int{{0, 0}, {1, 2}, {3, 0}, {-1, -1}, {2, -2}} {
		if err := c.Link(id, l[0], l[1]); err == nil {
			t.Errorf("Link(%d, %d) succeeded", l[0], l[1])
		}
	}
	if err := c.Link(99, 0, -1); !errors.Is(err, ErrUnknownSeq) {
		t.Errorf("Link on an unknown sequence: %v", err)
	}
}

// TestCopyPrefix: a sequence takes another's first committed rows, in
// every layer and both cache types, and whatever it held goes; bad
// arguments change nothing.
func TestCopyPrefix(t *testing.T) {
	for _, typ := range []weights.DType{weights.F32, weights.F16} {
		c, err := New(Config{Layers: 2, KVDim: 4, Context: 8, Tree: 2, Type: typ})
		if err != nil {
			t.Fatal(err)
		}
		src, _ := c.NewSeq()
		dst, _ := c.NewSeq()
		for id, rows := range map[int]int{src: 6, dst: 3} {
			first, _ := c.Reserve(id, rows)
			for r := first; r < first+rows; r++ {
				for l := 0; l < 2; l++ {
					fill(c, id, l, r, 10*id+r)
				}
			}
			c.CommitAll(id)
		}
		c.Reserve(dst, 2) // tentative rows, dropped by the copy
		if !c.CanCopy() {
			t.Fatal("a host cache cannot copy")
		}
		for _, bad := range [][3]int{{dst, src, 7}, {dst, src, -1}, {src, src, 2}, {dst, 9, 1}, {9, src, 1}} {
			if err := c.CopyPrefix(bad[0], bad[1], bad[2]); err == nil {
				t.Errorf("%v: CopyPrefix(%d, %d, %d) succeeded", typ, bad[0], bad[1], bad[2])
			}
		}
		if c.Len(dst) != 3 || c.Tentative(dst) != 2 {
			t.Fatalf("%v: failed copies changed the sequence: %d committed, %d tentative", typ, c.Len(dst), c.Tentative(dst))
		}
		if err := c.CopyPrefix(dst, src, 4); err != nil {
			t.Fatal(err)
		}
		if c.Len(dst) != 4 || c.Tentative(dst) != 0 {
			t.Fatalf("%v: after copying 4 rows: %d committed, %d tentative", typ, c.Len(dst), c.Tentative(dst))
		}
		for r := 0; r < 6; r++ {
			for l := 0; l < 2; l++ {
				if got := rowTag(t, c, src, l, r); got != 10*src+r {
					t.Errorf("%v: source row %d layer %d has tag %d", typ, r, l, got)
				}
				if r < 4 {
					if got := rowTag(t, c, dst, l, r); got != 10*src+r {
						t.Errorf("%v: copied row %d layer %d has tag %d, want %d", typ, r, l, got, 10*src+r)
					}
				}
			}
		}
		if err := c.CopyPrefix(dst, src, 0); err != nil || c.Len(dst) != 0 {
			t.Errorf("%v: copying no rows: %v, %d committed", typ, err, c.Len(dst))
		}
	}
}

// TestRelease: freed sequences' buffers count in Bytes until Release
// gives them back; live sequences keep their rows, and new ones work.
func TestRelease(t *testing.T) {
	c, err := New(Config{Layers: 2, KVDim: 4, Context: 8, Type: weights.F32})
	if err != nil {
		t.Fatal(err)
	}
	one := c.Config().SeqBytes()
	a, _ := c.NewSeq()
	b, _ := c.NewSeq()
	first, _ := c.Reserve(a, 3)
	for r := first; r < first+3; r++ {
		fill(c, a, 1, r, r)
	}
	c.CommitAll(a)
	c.Free(b)
	if c.Bytes() != 2*one {
		t.Fatalf("%d bytes with one live and one freed, want %d", c.Bytes(), 2*one)
	}
	if err := c.Release(); err != nil || c.Bytes() != one {
		t.Fatalf("Release: %v, %d bytes, want the live sequence's %d", err, c.Bytes(), one)
	}
	for r := 0; r < 3; r++ {
		if got := rowTag(t, c, a, 1, r); got != r {
			t.Errorf("live row %d has tag %d after Release", r, got)
		}
	}
	if id, err := c.NewSeq(); err != nil || c.Bytes() != 2*one || c.Len(id) != 0 {
		t.Fatalf("NewSeq after Release: %d, %v, %d bytes", id, err, c.Bytes())
	}
}
