// Package trainer runs one rank of the embedded trainer: it trains the
// byte-level GPT of a train.toml with AdamW under hybrid sharded data
// parallelism, logging progress and per-step metrics. After a peer is
// lost or the world changes, a Trainer re-forms in place (Reform,
// Exchange) and goes on from the last step every rank completed.
package trainer
