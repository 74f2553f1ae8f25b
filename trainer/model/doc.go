// Package model is a small decoder-only transformer over bytes whose forward and backward passes
// are written out by hand over one flat fp32 parameter buffer.
package model
