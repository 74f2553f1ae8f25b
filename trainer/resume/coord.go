package resume

import (
	"context"
	"fmt"

	"github.com/gorun/gorun/checkpoint"
	"github.com/gorun/gorun/trainer/comm"
)

// groupCoord is a checkpoint.Coordinator over a comm.Group whose ring follows the global ranks
// 0..n-1, so group ranks are checkpoint ranks.
type groupCoord struct {
	g     *comm.Group
	abort func()
}

// NewCoordinator adapts g, a group of every rank in rank order made for checkpointing alone
// (its own connections, so a background save runs beside the training collectives), to
// checkpoint.Coordinator. A comm collective cannot be abandoned half way, so when a call's ctx
// ends while it waits, abort is called (typically closing the comm.World, which fails the
// collective on every member) and the call returns ctx's cause; abort may be nil, and then the
// collective ends only when every member arrives, a peer is lost or the comm timeout passes.
func NewCoordinator(g *comm.Group, abort func()) checkpoint.Coordinator {
	return &groupCoord{g: g, abort: abort}
}

func (c *groupCoord) Rank() int { return c.g.Rank() }
func (c *groupCoord) Size() int { return c.g.Size() }

// GatherBytes collects every rank's b at rank 0 (an all-gather: the metadata is small).
func (c *groupCoord) GatherBytes(ctx context.Context, b []byte) ([][]byte, error) {
	var all [][]byte
	err := c.do(ctx, "gather", func() (err error) {
		all, err = c.g.AllGatherBytes(b)
		return err
	})
	if err != nil || c.g.Rank() != 0 {
		return nil, err
	}
	return all, nil
}

// BroadcastBytes returns rank 0's b on every rank.
func (c *groupCoord) BroadcastBytes(ctx context.Context, b []byte) ([]byte, error) {
	var out []byte
	err := c.do(ctx, "broadcast", func() (err error) {
		out, err = c.g.BroadcastBytes(b, 0)
		return err
	})
	return out, err
}

func (c *groupCoord) do(ctx context.Context, op string, f func() error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("checkpoint %s: %w", op, context.Cause(ctx))
	}
	if c.abort != nil {
		stop := context.AfterFunc(ctx, c.abort)
		defer stop()
	}
	err := f()
	if ctx.Err() != nil {
		return fmt.Errorf("checkpoint %s: %w", op, context.Cause(ctx))
	}
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", op, err)
	}
	return nil
}
