package model

// embedForward writes x[b,t,:] = wte[tok[b,t],:] + wpe[t,:] for the n = B*T input tokens
// (tokens[i] is the token at row i, position i mod T).
func embedForward(x, wte, wpe []float32, tokens []byte, t, d int) {
	for i, tok := range tokens {
		row := x[i*d : (i+1)*d]
		te := wte[int(tok)*d : int(tok)*d+d]
		pe := wpe[(i%t)*d : (i%t)*d+d]
		for j := range row {
			row[j] = te[j] + pe[j]
		}
	}
}

// embedBackward is the gradient of a lookup: each row of dx flows back to the row of wte it was
// read from and to the row of wpe of its position, dwte[tok] += dx[i], dwpe[i mod T] += dx[i].
// Rows are added in token order, so the sum order is fixed.
func embedBackward(dwte, dwpe, dx []float32, tokens []byte, t, d int) {
	for i, tok := range tokens {
		g := dx[i*d : (i+1)*d]
		te := dwte[int(tok)*d : int(tok)*d+d]
		pe := dwpe[(i%t)*d : (i%t)*d+d]
		for j, v := range g {
			te[j] += v
			pe[j] += v
		}
	}
}
