package comm

// summer returns a step's sum for adding received Ts to src into dst
// (see step.sum): dst and src may be the same slice.
func summer[T float32 | float64](dst, src []T) func(off int, b []byte) {
	size := sizeOf[T]()
	return func(off int, b []byte) {
		lo := off / size
		recv := floatsOf[T](b)
		add(dst[lo:lo+len(recv)], src[lo:lo+len(recv)], recv)
	}
}

// wideSummer is summer for float32s that are widened (see Widen) as they
// are added to received float64s.
func wideSummer(dst []float64, src []float32) func(off int, b []byte) {
	return func(off int, b []byte) {
		lo := off / 8
		recv := floatsOf[float64](b)
		addWide(dst[lo:lo+len(recv)], src[lo:lo+len(recv)], recv)
	}
}

// Widen sets dst[i] to 0 + float64(src[i]), which is float64(src[i])
// except that -0 becomes +0: the value a float64 accumulator that starts
// at zero holds once src[i] is added to it. len(dst) must be at least
// len(src).
func Widen(dst []float64, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = 0 + float64(x)
	}
}

// addWide sets dst[i] = (0 + float64(a[i])) + b[i] (see Widen). dst may
// not alias a.
func addWide(dst []float64, a []float32, b []float64) {
	n := len(dst)
	a, b = a[:n], b[:n]
	for i := range dst {
		dst[i] = (0 + float64(a[i])) + b[i]
	}
}

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

// accumulator is the step.sum of an accumulating reduce-scatter's last
// step: it adds the received sum and src, widened as Widen does, to dst,
// each element as dst + ((0 + src) + recv).
func accumulator[S, T float32 | float64](dst []T, src []S) func(off int, b []byte) {
	size := sizeOf[T]()
	return func(off int, b []byte) {
		lo := off / size
		recv := floatsOf[T](b)
		d, a := dst[lo:lo+len(recv)], src[lo:lo+len(recv)]
		for i := range d {
			d[i] += (0 + T(a[i])) + recv[i]
		}
	}
}

// addInto adds src, widened as Widen does, to dst: dst[i] + (0 + src[i]).
func addInto[S, T float32 | float64](dst []T, src []S) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += 0 + T(src[i])
	}
}
