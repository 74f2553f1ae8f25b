package config

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// Hash is the hex sha256 of a canonical JSON encoding of the fields that
// change the math of a run: [model], data.files as written (before $VARS
// and the toml's directory), train.seed, train.global_batch and [optim].
// Checkpoints record it; a run resumes only from a checkpoint whose hash
// matches. Steps, micro batch, logging, activation checkpointing, parallel
// layout and checkpointing (memory copies included) leave it alone, so a
// run may be extended or resharded.
func (c Config) Hash() string {
	files := c.rawFiles
	if files == nil {
		files = c.Data.Files
	}
	canon := struct {
		Model       Model    `json:"model"`
		Files       []string `json:"data_files"`
		Seed        uint64   `json:"seed"`
		GlobalBatch int      `json:"global_batch"`
		Optim       Optim    `json:"optim"`
	}{c.Model, files, c.Train.Seed, c.Train.GlobalBatch, c.Optim}
	b, err := json.Marshal(canon)
	if err != nil {
		// Only NaN or Inf in [optim] can fail, and Validate rejects them.
		b = []byte(err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
