package comm

// sum32 adds the float32s of b to those of a into dst (the bytes of
// float32s, see add).
func sum32(dst, a, b []byte) { add(floatsOf[float32](dst), floatsOf[float32](a), floatsOf[float32](b)) }

// sum64 adds the float64s of b to those of a into dst (the bytes of
// float64s, see add).
func sum64(dst, a, b []byte) { add(floatsOf[float64](dst), floatsOf[float64](a), floatsOf[float64](b)) }

// add sets dst[i] = a[i] + b[i]. dst may alias a. The loop is unrolled so
// the compiler drops bounds checks; the order of additions per element is
// one, so results are the same on every machine.
func add[T float32 | float64](dst, a, b []T) {
	n := len(dst)
	a, b = a[:n], b[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		d, x, y := dst[i:i+8:i+8], a[i:i+8:i+8], b[i:i+8:i+8]
		d[0] = x[0] + y[0]
		d[1] = x[1] + y[1]
		d[2] = x[2] + y[2]
		d[3] = x[3] + y[3]
		d[4] = x[4] + y[4]
		d[5] = x[5] + y[5]
		d[6] = x[6] + y[6]
		d[7] = x[7] + y[7]
	}
	for ; i < n; i++ {
		dst[i] = a[i] + b[i]
	}
}
