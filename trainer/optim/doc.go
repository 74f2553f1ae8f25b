// Package optim is AdamW with decoupled weight decay, global-norm gradient clipping and a
// warmup-then-cosine learning-rate schedule, over any slice of a flat parameter buffer.
package optim
