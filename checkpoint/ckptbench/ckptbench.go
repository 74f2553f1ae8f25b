// Package ckptbench times the checkpoint package's save, cold load and
// async save of a synthetic sharded state, for bench/checkpoint.sh
// (`gorun ckpt bench`).
package ckptbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/checkpoint"
)

// Result is one run's timings, the JSON line `gorun ckpt bench` prints
// (read by bench/checkpoint.sh).
type Result struct {
	Ranks       int     `json:"ranks"`
	Bytes       int64   `json:"bytes"`
	SaveSeconds float64 `json:"save_s"`
	// LoadSeconds is a load at the same layout after the files were dropped from the page cache.
	LoadSeconds float64 `json:"load_s"`
	// AsyncStallSeconds is how long SaveAsync blocked the caller (the copy), AsyncSeconds until
	// the background save committed.
	AsyncStallSeconds float64 `json:"async_stall_s"`
	AsyncSeconds      float64 `json:"async_s"`
}

// Config is one run: a synthetic state of Bytes split into 8 float32
// tensors, saved by Ranks goroutines (layout 1 x Ranks: each rank owns
// 1/Ranks of every tensor) into Dir, which Run empties first. Fill is
// "zero" (the bytes dd if=/dev/zero writes) or "random".
type Config struct {
	Dir   string
	Bytes int64
	Ranks int
	Fill  string
}

// Validate reports what makes c unusable.
func (c Config) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("ckptbench: no directory")
	case c.Ranks < 1:
		return fmt.Errorf("ckptbench: ranks=%d: must be at least 1", c.Ranks)
	case c.Bytes < 4*8:
		return fmt.Errorf("ckptbench: bytes=%d: must be at least 32", c.Bytes)
	case c.Fill != "zero" && c.Fill != "random":
		return fmt.Errorf("ckptbench: fill=%q: must be zero or random", c.Fill)
	}
	return nil
}

// Run times a save, a load at the same layout after the files were
// dropped from the page cache, and an async save (the second of two, so
// its buffers are warm) of cfg's state. ctx is passed to every save and
// load; the first error of any rank ends the run.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.Validate(); err != nil {
		return Result{}, err
	}
	dir, total, ranks, fill := cfg.Dir, cfg.Bytes, cfg.Ranks, cfg.Fill
	if err := os.RemoveAll(dir); err != nil {
		return Result{}, err
	}
	world := checkpoint.World{Replicas: 1, Shards: ranks, Mode: "fsdp"}
	const ntensors = 8
	n := total / 4 / ntensors
	type rankState struct {
		saver   *checkpoint.Saver
		tensors []checkpoint.Tensor
		reqs    []checkpoint.Request
	}
	states := make([]rankState, ranks)
	group := checkpoint.NewLocalGroup(ranks)
	for r := range states {
		s, err := checkpoint.NewSaver(checkpoint.Config{Dir: dir, World: world, Coord: group[r]})
		if err != nil {
			return Result{}, err
		}
		states[r].saver = s
		for i := range ntensors {
			lo, hi := checkpoint.ShardRange(n, r, ranks)
			data := make([]float32, hi-lo)
			rng := rand.New(rand.NewPCG(uint64(r), uint64(i)))
			for j := range data {
				if fill == "random" {
					data[j] = float32(rng.NormFloat64())
				} else {
					data[j] = 0
				}
			}
			name := fmt.Sprintf("t%d", i)
			states[r].tensors = append(states[r].tensors, checkpoint.Tensor{Name: name, Shape: []int64{n}, Offset: lo, Data: data})
			dst := make([]float32, hi-lo)
			for j := range dst { // touch the pages now, not while timing
				dst[j] = 1
			}
			states[r].reqs = append(states[r].reqs, checkpoint.Request{Name: name, Offset: lo, Dst: dst})
		}
	}
	all := func(f func(r int) error) (float64, error) {
		start := time.Now()
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		for r := range ranks {
			wg.Go(func() { errs[r] = f(r) })
		}
		wg.Wait()
		return time.Since(start).Seconds(), errors.Join(errs...)
	}
	res := Result{Ranks: ranks, Bytes: n * ntensors * 4}
	var err error
	if res.SaveSeconds, err = all(func(r int) error {
		return states[r].saver.Save(ctx, checkpoint.Meta{Step: 1}, states[r].tensors)
	}); err != nil {
		return Result{}, err
	}
	dropCache(filepath.Join(dir, checkpoint.StepName(1)))
	if res.LoadSeconds, err = all(func(r int) error {
		_, err := checkpoint.Load(ctx, group[r], dir, states[r].reqs)
		return err
	}); err != nil {
		return Result{}, err
	}
	// Warm the async buffers with one save, then time the second.
	for step := int64(2); step <= 3; step++ {
		stall := make([]float64, ranks)
		res.AsyncSeconds, err = all(func(r int) error {
			t0 := time.Now()
			if err := states[r].saver.SaveAsync(ctx, checkpoint.Meta{Step: step}, states[r].tensors); err != nil {
				return err
			}
			stall[r] = time.Since(t0).Seconds()
			return states[r].saver.Wait()
		})
		if err != nil {
			return Result{}, err
		}
		res.AsyncStallSeconds = 0
		for _, s := range stall {
			res.AsyncStallSeconds = max(res.AsyncStallSeconds, s)
		}
	}
	return res, nil
}

// dropCache asks the kernel to drop the page cache of the files in dir (posix_fadvise
// DONTNEED), so a load reads from the disk; only these files are affected.
func dropCache(dir string) {
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		f, err := os.Open(filepath.Join(dir, de.Name()))
		if err != nil {
			continue
		}
		_ = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		f.Close()
	}
}
