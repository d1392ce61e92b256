package model

import "slices"

// Logits holds the output rows of the slots of a batch that asked for
// them. The zero value is ready to use; Forward grows it as needed and
// rows are overwritten by the next Forward with the same Logits.
type Logits struct {
	vocab int
	data  []float32 // one row of vocab floats per slot that asked
	row   []int     // per slot: index into data's rows, or -1
	slots []int     // the slots that have rows, in order
}

// Row returns the logits of a batch slot, or nil when the slot did not ask
// for them (or is out of range).
func (l *Logits) Row(slot int) []float32 {
	if slot < 0 || slot >= len(l.row) || l.row[slot] < 0 {
		return nil
	}
	r := l.row[slot]
	return l.data[r*l.vocab : (r+1)*l.vocab : (r+1)*l.vocab]
}

// Slots lists the slots that have logits, in batch order.
func (l *Logits) Slots() []int { return l.slots }

// Vocab is the length of each row.
func (l *Logits) Vocab() int { return l.vocab }

// reset sizes the rows for a batch of n slots with want[i] marking the
// slots that get a row, and returns the row count.
func (l *Logits) reset(vocab int, want []bool) int {
	l.vocab = vocab
	l.row = l.row[:0]
	l.slots = l.slots[:0]
	for i, w := range want {
		if w {
			l.row = append(l.row, len(l.slots))
			l.slots = append(l.slots, i)
		} else {
			l.row = append(l.row, -1)
		}
	}
	l.data = grow(l.data, len(l.slots)*vocab)
	return len(l.slots)
}

// grow returns buf with length n, reallocating only when it is too
// small, and then with append's room to spare: buffers that grow a row
// at a time (attention's scores as sequences lengthen) would otherwise
// be reallocated on every step. The contents are not kept.
func grow[T any](buf []T, n int) []T {
	return slices.Grow(buf[:0], n)[:n]
}
