package model

// embedRows is the number of rows of wte or wpe whose gradient embedBackward sums as one item.
const embedRows = 16

// embedForward writes x[b,t,:] = wte[tok[b,t],:] + wpe[t,:] for the n = B*T input tokens
// (tokens[i] is the token at row i, position i mod T). Rows run in parallel on p.
func embedForward(p pool, x, wte, wpe []float32, tokens []byte, t, d int) {
	p.forRows(len(tokens), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			tok, pos := int(tokens[i]), i%t
			row := x[i*d : (i+1)*d]
			copy(row, wte[tok*d:(tok+1)*d])
			p.eng.Add(row, wpe[pos*d:(pos+1)*d])
		}
	})
}

// embedBackward is the gradient of a lookup: each row of dx flows back to the row of wte it was
// read from and to the row of wpe of its position, dwte[tok] += dx[i], dwpe[i mod T] += dx[i].
// The rows of dwte and dwpe are split into blocks of embedRows that run in parallel on p, and
// each row adds its rows of dx in token order, so the sums do not depend on the thread count.
func embedBackward(p pool, dwte, dwpe, dx []float32, tokens []byte, t, d int) {
	teBlocks := (len(dwte)/d + embedRows - 1) / embedRows
	peBlocks := (t + embedRows - 1) / embedRows
	p.forEach(teBlocks+peBlocks, func(b int) {
		if b < teBlocks {
			lo, hi := b*embedRows, (b+1)*embedRows
			for i, tok := range tokens {
				if tok := int(tok); tok >= lo && tok < hi {
					p.eng.Add(dwte[tok*d:(tok+1)*d], dx[i*d:(i+1)*d])
				}
			}
			return
		}
		lo := (b - teBlocks) * embedRows
		for pos := lo; pos < min(lo+embedRows, t); pos++ {
			for i := pos; i < len(tokens); i += t {
				p.eng.Add(dwpe[pos*d:(pos+1)*d], dx[i*d:(i+1)*d])
			}
		}
	})
}
