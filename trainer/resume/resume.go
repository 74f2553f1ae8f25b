package resume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/trainer/comm"
	"github.com/gorun/gorun/trainer/config"
	"github.com/gorun/gorun/trainer/hsdp"
	"github.com/gorun/gorun/trainer/metrics"
	"github.com/gorun/gorun/trainer/model"
	"github.com/gorun/gorun/trainer/recovery"
)

// Trainer is what a Checkpointer needs of the trainer it checkpoints; *trainer.Trainer is one.
// Package resume names it here rather than importing package trainer, its parent.
type Trainer interface {
	// Plan is this rank's place in the world: its rank, and the replicas and shards.
	Plan() hsdp.Plan
	// World is this rank's connection to the others, nil in a world of one rank. The
	// Checkpointer makes groups of its own on it and closes it to abort a save.
	World() *comm.World
	// Layout names the tensors of the flat parameter buffer.
	Layout() model.Layout
	// State returns this rank's state between steps; its slices may alias the trainer's own.
	State() recovery.State
	// RestoreInPlace has fill write this rank's state into the trainer's own buffers (dst, the
	// slice at step 0), for a trainer that holds nothing yet; on fill's error, or a step and
	// sample that do not fit, the trainer is as new again and the error returned (fill's as it
	// is).
	RestoreInPlace(fill func(dst recovery.Slice) (step, sample int64, err error)) error
}

// Config is what a Checkpointer needs besides its Trainer.
type Config struct {
	// Train is the run's train.toml: [checkpoint] says where (dir), how often (every; the last
	// step, train.steps, is always saved), how many to keep and whether to write in the
	// background; parallel.mode is recorded in the manifest; Train.Hash() is recorded and must
	// match to resume.
	Train config.Config
	// Log receives rank 0's lines: what was resumed (the loader's summary, naming any corrupt
	// checkpoint skipped and why) and every save. nil discards them.
	Log io.Writer
	// Stop, when set, is read at every step boundary; a pending request on any rank makes every
	// rank save that step and stop. nil: no requests.
	Stop *Stop
}

// Checkpointer saves one rank's trainer state every checkpoint.every steps, at the last step and
// when a stop is requested, and resumes it from the newest valid checkpoint. Every rank of the
// world makes one for its Trainer, in the same order relative to other groups made on the
// Trainer's World. Its methods are called from the training goroutine (AfterStep from the
// Trainer's AfterStep hook).
type Checkpointer struct {
	cfg   Config
	t     Trainer
	rank  int
	hash  string
	ctrl  *comm.Group // the per-step agreement on stop requests; nil in a world of one rank
	coord checkpoint.Coordinator
	saver *checkpoint.Saver
	log   io.Writer
}

// New prepares checkpointing for t: in a world of several ranks it makes two groups of every
// rank on t.World() (one agrees on stop requests each step, one carries the saves' metadata so
// that a background save runs beside training) and waits, up to the comm timeout, for every rank
// to do the same. It touches no files.
func New(t Trainer, cfg Config) (*Checkpointer, error) {
	ck := cfg.Train.Checkpoint
	if ck.Dir == "" || ck.Every < 0 || ck.Keep < 1 {
		return nil, fmt.Errorf("resume: checkpoint.dir = %q, every = %d, keep = %d: want a directory, every >= 0 and keep >= 1",
			ck.Dir, ck.Every, ck.Keep)
	}
	plan := t.Plan()
	c := &Checkpointer{cfg: cfg, t: t, rank: plan.Rank, hash: cfg.Train.Hash(), coord: checkpoint.Solo(), log: io.Discard}
	if cfg.Log != nil && plan.Rank == 0 {
		c.log = cfg.Log
	}
	if w := t.World(); w != nil {
		all := make([]int, w.Size())
		for i := range all {
			all[i] = i
		}
		var err error
		if c.ctrl, err = w.Group(all); err != nil {
			return nil, fmt.Errorf("resume: join the checkpoint control group: %w", err)
		}
		g, err := w.Group(all)
		if err != nil {
			return nil, fmt.Errorf("resume: join the checkpoint group: %w", err)
		}
		c.coord = NewCoordinator(g, func() { _ = w.Close() })
	}
	saver, err := checkpoint.NewSaver(checkpoint.Config{
		Dir:   ck.Dir,
		World: checkpoint.World{Replicas: plan.Replicas, Shards: plan.Shards, Mode: cfg.Train.Parallel.Mode},
		Coord: c.coord, Keep: ck.Keep,
	})
	if err != nil {
		return nil, fmt.Errorf("resume: %w", err)
	}
	c.saver = saver
	return c, nil
}

// ConfigMismatchError refuses to resume from a checkpoint saved by a run whose model, data
// files, seed, global batch or optimizer differ: its parameters would not mean the same thing.
type ConfigMismatchError struct {
	Checkpoint  string // step directory
	Saved, Want string // config hashes
}

// Error says what differs and what to do.
func (e *ConfigMismatchError) Error() string {
	return fmt.Sprintf("resume: %s was saved by another configuration (config hash %.12s, this run %.12s: [model], data.files, "+
		"train.seed, train.global_batch or [optim] differ); restore the configuration to resume it, or set checkpoint.dir "+
		"to another directory to start afresh", e.Checkpoint, e.Saved, e.Want)
}

// Resume restores the trainer from the newest checkpoint in checkpoint.dir that every rank can
// read and verify, whatever world size and mode saved it: parameters, AdamW moments, step and
// sample index (no RNG state is needed: the data order is a pure function of train.seed and the
// sample index, and the model has no dropout). Every rank calls it before Run. Rank 0 logs the
// loader's summary, which names every newer checkpoint skipped as corrupt and why. With no
// checkpoint at all it returns nil, nil (a fresh start). It refuses, with a
// *ConfigMismatchError, a checkpoint whose config hash differs from this run's, and fails when
// checkpoints exist but none loads. ctx bounds the collectives.
func (c *Checkpointer) Resume(ctx context.Context) (*checkpoint.Loaded, error) {
	dir := c.cfg.Train.Checkpoint.Dir
	var l *checkpoint.Loaded
	var mismatch *ConfigMismatchError
	err := c.t.RestoreInPlace(func(dst recovery.Slice) (int64, int64, error) {
		var err error
		if l, err = checkpoint.Load(ctx, c.coord, dir, Requests(c.t.Layout(), dst)); err != nil {
			return 0, 0, err
		}
		if m := l.Manifest; m.ConfigHash != c.hash {
			mismatch = &ConfigMismatchError{Checkpoint: l.Dir, Saved: m.ConfigHash, Want: c.hash}
			return 0, 0, mismatch
		}
		return l.Manifest.Step, l.Manifest.SampleIndex, nil
	})
	switch {
	case errors.Is(err, checkpoint.ErrNoCheckpoint):
		fmt.Fprintf(c.log, "checkpoint: none in %s: starting at step 0\n", dir)
		return nil, nil
	case mismatch != nil:
		return nil, mismatch
	case err != nil && l == nil:
		// A run with another model asks for tensors the checkpoint lacks: say why.
		if m := c.newestMismatch(dir); m != nil {
			return nil, m
		}
		return nil, fmt.Errorf("resume: %w", err)
	case err != nil:
		return nil, fmt.Errorf("resume from %s: %w", l.Dir, err)
	}
	m := l.Manifest
	fmt.Fprintf(c.log, "checkpoint: %s: resuming at step %d, sample %d (saved by %s; read %d bytes on rank 0)\n",
		l.Summary(), m.Step, m.SampleIndex, m.World, l.BytesRead)
	return l, nil
}

// newestMismatch reads the newest complete checkpoint's manifest and returns a
// *ConfigMismatchError if its config hash is not this run's; nil otherwise (no checkpoint, an
// unreadable manifest, or a match).
func (c *Checkpointer) newestMismatch(dir string) error {
	step, err := checkpoint.Resolve(dir)
	if err != nil {
		return nil
	}
	m, err := checkpoint.ReadManifest(step)
	if err != nil || m.ConfigHash == c.hash {
		return nil
	}
	return &ConfigMismatchError{Checkpoint: step, Saved: m.ConfigHash, Want: c.hash}
}

// AfterStep is the Trainer's AfterStep hook: after the step rec.Step it agrees with every rank
// on pending stop requests, then saves when the step is a multiple of checkpoint.every, the last
// one, or a stop was requested anywhere. Saves are synchronous except the periodic ones with
// checkpoint.async, which copy the state and write in the background (an error of theirs is
// returned by the next save or by Close). After the save of a requested stop (not at the last
// step, where the run ends anyway) every rank returns the same *StoppedError. ctx bounds the
// collectives and the writes, background ones included; an error stops the run.
func (c *Checkpointer) AfterStep(ctx context.Context, rec metrics.Record) error {
	step := int64(rec.Step)
	last := rec.Step >= c.cfg.Train.Train.Steps
	kind, err := c.agree(c.cfg.Stop.Pending())
	if err != nil {
		return err
	}
	every := int64(c.cfg.Train.Checkpoint.Every)
	if !last && kind == 0 && (every == 0 || step%every != 0) {
		return nil
	}
	if err := c.save(ctx, c.cfg.Train.Checkpoint.Async && !last && kind == 0); err != nil {
		return err
	}
	if kind == 0 || last {
		return nil
	}
	// Leave together, so no rank takes another's goodbye for a death while the save drains.
	if c.ctrl != nil {
		if err := c.ctrl.Barrier(); err != nil {
			return fmt.Errorf("resume: barrier after the checkpoint of step %d: %w", step, err)
		}
	}
	return &StoppedError{Step: step, Kind: kind, Checkpoint: c.stepDir(step)}
}

// agree returns the stop requests of every rank combined.
func (c *Checkpointer) agree(mine StopKind) (StopKind, error) {
	if c.ctrl == nil {
		return mine, nil
	}
	all, err := c.ctrl.AllGatherBytes([]byte{byte(mine)})
	if err != nil {
		return 0, fmt.Errorf("resume: agree on stop requests: %w", err)
	}
	var k StopKind
	for _, b := range all {
		if len(b) == 1 {
			k |= StopKind(b[0])
		}
	}
	return k, nil
}

func (c *Checkpointer) stepDir(step int64) string {
	return filepath.Join(c.cfg.Train.Checkpoint.Dir, checkpoint.StepName(step))
}

func (c *Checkpointer) save(ctx context.Context, async bool) error {
	s := c.t.State()
	meta := checkpoint.Meta{Step: s.Step, SampleIndex: s.Sample, ConfigHash: c.hash}
	tensors := Tensors(c.t.Layout(), s)
	if async {
		if err := c.saver.SaveAsync(ctx, meta, tensors); err != nil {
			return fmt.Errorf("resume: %w", err)
		}
		fmt.Fprintf(c.log, "checkpoint: saving %s in the background\n", checkpoint.StepName(s.Step))
		return nil
	}
	start := time.Now()
	if err := c.saver.Save(ctx, meta, tensors); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	fmt.Fprintf(c.log, "checkpoint: saved %s in %v\n", c.stepDir(s.Step), time.Since(start).Round(time.Millisecond))
	return nil
}

// Close waits for a background save and returns its unreported error. Call it before closing
// the Trainer, whose World the save may still use.
func (c *Checkpointer) Close() error {
	if err := c.saver.Close(); err != nil {
		return fmt.Errorf("resume: %w", err)
	}
	return nil
}
