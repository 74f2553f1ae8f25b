// Package data turns the text files a train.toml names into training
// samples: the order of samples is a pure function of (seed, global
// sample index), whatever the world size.
package data
