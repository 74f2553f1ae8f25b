package kernels

import "fmt"

// Engine runs matrix products on up to Threads goroutines. It is safe for
// concurrent use; it holds no buffers between calls.
type Engine struct {
	threads int
}

// New returns an Engine that splits work over threads goroutines
// (at least 1).
func New(threads int) *Engine {
	return &Engine{threads: max(threads, 1)}
}

// Threads is the number of goroutines a product may use.
func (e *Engine) Threads() int { return e.threads }

// MatMul computes C = op(A)·op(B), or C += op(A)·op(B) when acc, for
// row-major fp32 matrices. op(A) is m×k: A is stored m×k, or k×m when
// transA. op(B) is k×n: B is stored k×n, or n×k when transB. C is m×n.
// It panics when a slice is shorter than its shape says: that is a bug in
// the caller, not bad input.
func (e *Engine) MatMul(c, a, b []float32, m, n, k int, transA, transB, acc bool) {
	if len(a) < m*k || len(b) < k*n || len(c) < m*n {
		panic(fmt.Sprintf("kernels: MatMul %dx%dx%d with len(a)=%d len(b)=%d len(c)=%d", m, n, k, len(a), len(b), len(c)))
	}
	naiveMatMul(c, a, b, m, n, k, transA, transB, acc)
}

// naiveMatMul is the reference every faster path is tested against.
func naiveMatMul(c, a, b []float32, m, n, k int, transA, transB, acc bool) {
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float32
			for p := 0; p < k; p++ {
				av := a[i*k+p]
				if transA {
					av = a[p*m+i]
				}
				bv := b[p*n+j]
				if transB {
					bv = b[j*k+p]
				}
				s += av * bv
			}
			if acc {
				c[i*n+j] += s
			} else {
				c[i*n+j] = s
			}
		}
	}
}
