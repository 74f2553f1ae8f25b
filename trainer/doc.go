// Package trainer runs one rank of the embedded trainer: it trains the
// byte-level GPT of a train.toml with AdamW under hybrid sharded data
// parallelism, logging progress and per-step metrics.
package trainer
