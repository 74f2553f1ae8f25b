package model

import "github.com/gorun/gorun/trainer/kernels"

// rowChunk is the number of rows a reduction over rows (the bias and layer norm gradients)
// sums into one partial sum: the chunks run in parallel and their partial sums are added in
// chunk order, so the order of every sum, and its bits, is fixed by the shapes alone, never by
// the thread count.
const rowChunk = 64

// chunks is the number of chunks of rowChunk rows (the last may be shorter) in n rows.
func chunks(n int) int { return (n + rowChunk - 1) / rowChunk }

// chunkRows is the range of rows [lo, hi) of chunk i of n rows.
func chunkRows(i, n int) (lo, hi int) { return i * rowChunk, min((i+1)*rowChunk, n) }

// chunkSum writes into part[i*cols:(i+1)*cols] the column sums of chunk i of the n rows of g
// (cols floats each), in row order: the partial sum that chunk contributes to a bias gradient.
func chunkSum(eng *kernels.Engine, part, g []float32, i, n, cols int) {
	lo, hi := chunkRows(i, n)
	p := part[i*cols : (i+1)*cols]
	copy(p, g[lo*cols:(lo+1)*cols])
	eng.SumRows(p, g[(lo+1)*cols:hi*cols], cols)
}
