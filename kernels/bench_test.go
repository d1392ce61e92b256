package kernels

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/tandem-llm/tandem/weights"
)

// BenchmarkMatMul reports weight bytes per second (b.SetBytes) for
// TinyLlama-sized matrices; compare with BenchmarkMemcpy, the memory
// bandwidth bound of decode (n=1). For n>1 the per-token cost is the
// time divided by n.
func BenchmarkMatMul(b *testing.B) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, wt := range []weights.DType{weights.Q4_0, weights.Q8_0, weights.Q4_K, weights.Q6_K, weights.F16} {
		for _, shape := range [][2]int{{2048, 5632}, {5632, 2048}} {
			rows, cols := shape[0], shape[1]
			w0, _ := randomMatrix(b, rng, wt, rows, cols)
			// Enough copies to exceed the last-level cache, as a model's
			// weights do: each call streams its matrix from memory.
			copies := make([][]byte, (streamBytes+len(w0)-1)/len(w0))
			for i := range copies {
				copies[i] = append([]byte(nil), w0...)
			}
			for _, threads := range []int{1, 2} {
				pool := NewPool(threads)
				for _, n := range []int{1, 8, 64} {
					x := randomVector(rng, n*cols)
					out := make([]float32, n*rows)
					b.Run(fmt.Sprintf("%s/%dx%d/n=%d/threads=%d/%s", wt, rows, cols, n, threads, Backend()), func(b *testing.B) {
						b.SetBytes(int64(len(w0)))
						i := 0
						for b.Loop() {
							if err := pool.MatMul(out, copies[i%len(copies)], wt, rows, cols, x, n); err != nil {
								b.Fatal(err)
							}
							i++
						}
					})
				}
				pool.Close()
			}
		}
	}
}

// streamBytes exceeds the last-level cache of the machines we run on.
const streamBytes = 256 << 20

// BenchmarkMemcpy copies 256 MiB (beyond the caches) with 1 and 2
// goroutines; the bytes reported are those read (written as many), the
// bound for a matvec that streams its weights.
func BenchmarkMemcpy(b *testing.B) {
	const size = streamBytes
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in before timing
	for _, threads := range []int{1, 2} {
		pool := NewPool(threads)
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			b.SetBytes(size)
			for b.Loop() {
				pool.Run(size>>16, func(lo, hi int) {
					copy(dst[lo<<16:hi<<16], src[lo<<16:hi<<16])
				})
			}
		})
		pool.Close()
	}
}

// BenchmarkMemRead sums 256 MiB of uint64s with 1 and 2 goroutines: the
// read-only bandwidth, closer to what a matvec does than a copy.
func BenchmarkMemRead(b *testing.B) {
	const words = streamBytes / 8
	src := make([]uint64, words)
	for i := range src {
		src[i] = uint64(i)
	}
	for _, threads := range []int{1, 2} {
		pool := NewPool(threads)
		sums := make([]uint64, words>>16)
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			b.SetBytes(streamBytes)
			for b.Loop() {
				pool.Run(words>>16, func(lo, hi int) {
					for c := lo; c < hi; c++ {
						blk := src[c<<16 : (c+1)<<16]
						var s0, s1, s2, s3 uint64
						for i := 0; i < len(blk); i += 4 {
							s0 += blk[i]
							s1 += blk[i+1]
							s2 += blk[i+2]
							s3 += blk[i+3]
						}
						sums[c] = s0 + s1 + s2 + s3
					}
				})
			}
		})
		pool.Close()
	}
}

// BenchmarkPoolRun is the fixed cost of one parallel kernel call.
func BenchmarkPoolRun(b *testing.B) {
	for _, threads := range []int{1, 2, 4} {
		pool := NewPool(threads)
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			for b.Loop() {
				pool.Run(64, func(lo, hi int) {})
			}
		})
		pool.Close()
	}
}

// BenchmarkAttention times one decode token's attention in one layer of
// TinyLlama's shape (32 query heads of 64 sharing 4 KV heads) over a
// cached context, F32 and F16, with the heads that share a KV head
// attended together (grouped) and one at a time (alone); the bytes are
// the layer's K and V rows, the least a token reads.
func BenchmarkAttention(b *testing.B) {
	const heads, kvHeads, hd = 32, 4, 64
	const group = heads / kvHeads
	rng := rand.New(rand.NewPCG(11, 12))
	for _, ctx := range []int{64, 512, 2048} {
		stride := kvHeads * hd
		k, v := randVec(rng, ctx*stride, 1), randVec(rng, ctx*stride, 1)
		k16, v16 := make([]uint16, len(k)), make([]uint16, len(v))
		for i := range k {
			k16[i], v16[i] = weights.F32ToF16(k[i]), weights.F32ToF16(v[i])
		}
		q := randVec(rng, heads*hd, 1)
		out := make([]float32, heads*hd)
		scores := make([]float32, group*ctx)
		scale := float32(0.125)
		for _, f16 := range []bool{false, true} {
			kind, es := "f32", 4
			if f16 {
				kind, es = "f16", 2
			}
			for _, per := range []int{group, 1} {
				mode := "grouped"
				if per == 1 {
					mode = "alone"
				}
				b.Run(fmt.Sprintf("%s/ctx=%d/%s/%s", kind, ctx, mode, Backend()), func(b *testing.B) {
					b.SetBytes(int64(2 * ctx * stride * es))
					for b.Loop() {
						for h := 0; h < heads; h += per {
							off := h / group * hd
							o, qh := out[h*hd:(h+per)*hd], q[h*hd:(h+per)*hd]
							if f16 {
								AttentionF16(o, qh, k16, v16, per, stride, off, ctx, nil, scale, scores)
							} else {
								Attention(o, qh, k, v, per, stride, off, ctx, nil, scale, scores)
							}
						}
					}
				})
			}
		}
	}
}

// BenchmarkAttentionTree times one layer's attention for a 16-slot token
// tree of one sequence (TinyLlama's heads, F16 cache) over a cached
// context: each slot attended alone, reading the context once per slot
// as before AttentionTree, and the tree's slots together, reading it
// once. The bytes are the layer's K and V rows of the context, the least
// a verification pass reads.
func BenchmarkAttentionTree(b *testing.B) {
	const heads, kvHeads, hd, slots = 32, 4, 64, 16
	const group = heads / kvHeads
	rng := rand.New(rand.NewPCG(11, 12))
	for _, ctx := range []int{512, 2048, 8192} {
		stride := kvHeads * hd
		rows := ctx + slots
		k16, v16 := make([]uint16, rows*stride), make([]uint16, rows*stride)
		for i := range k16 {
			k16[i], v16[i] = weights.F32ToF16(float32(rng.NormFloat64())), weights.F32ToF16(float32(rng.NormFloat64()))
		}
		// A tree of depth 4 to 5: slot j hangs under slot (j-1)/2.
		var anc []int32
		lo, hi := make([]int, slots), make([]int, slots)
		for j := range slots {
			lo[j] = len(anc)
			var path []int32
			for r := j; ; r = (r - 1) / 2 {
				path = append(path, int32(ctx+r))
				if r == 0 {
					break
				}
			}
			slices.Reverse(path)
			anc = append(anc, path...)
			hi[j] = len(anc)
		}
		dim := heads * hd
		q := randVec(rng, slots*dim, 1)
		out := make([]float32, slots*dim)
		ld := treeWidth(ctx, lo, hi)
		scores := make([]float32, slots*group*ld)
		scale := float32(0.125)
		for _, tree := range []bool{false, true} {
			mode := "alone"
			if tree {
				mode = "tree"
			}
			b.Run(fmt.Sprintf("f16/ctx=%d/%s/%s", ctx, mode, Backend()), func(b *testing.B) {
				b.SetBytes(int64(2 * ctx * stride * 2))
				for b.Loop() {
					for h := 0; h < heads; h += group {
						off := h / group * hd
						if tree {
							AttentionTreeF16(out[h*hd:(slots-1)*dim+(h+group)*hd], q[h*hd:(slots-1)*dim+(h+group)*hd], k16, v16,
								group, slots, dim, stride, off, ctx, anc, lo, hi, scale, scores)
							continue
						}
						for s := range slots {
							AttentionF16(out[s*dim+h*hd:s*dim+(h+group)*hd], q[s*dim+h*hd:s*dim+(h+group)*hd], k16, v16,
								group, stride, off, ctx, anc[lo[s]:hi[s]], scale, scores)
						}
					}
				}
			})
		}
	}
}
