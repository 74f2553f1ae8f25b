package replica

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/gorun/gorun/internal/snapshot"
)

// Fetch reads rank's complete snapshot at step from the Server at addr
// and writes it into dst (with the crash-safe protocol of RankSlots.Write:
// header last, and only once the whole payload came and its CRC-32 is the
// header's). It fails with an error wrapping ErrNotFound, which names what
// the server holds of the rank instead, when the server has no complete
// snapshot of rank at step; with ErrAuth when the two ends do not share
// auth; and with ctx's error when ctx ends first (the connection is then
// closed and dst's slot being written is left incomplete, its other slot
// whole).
func Fetch(ctx context.Context, addr string, auth Auth, rank int, step uint64, dst *snapshot.RankSlots) (err error) {
	what := fmt.Sprintf("replica: fetch of rank %d step %d from %s", rank, step, addr)
	switch {
	case rank < 0:
		return fmt.Errorf("%s: ranks are >= 0", what)
	case dst == nil:
		return fmt.Errorf("%s: no slots to write it into", what)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		if !stop() && err != nil {
			err = fmt.Errorf("%s: %w (%w)", what, ctx.Err(), err)
		}
	}()
	if err := auth.keys().dial(c, roleFetch); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	req := fetchRequest{rank: rank, step: step}.encode()
	if _, err := c.Write(req[:]); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := readVerdict(c, what); err != nil {
		return err
	}
	var raw [headerLen]byte
	if _, err := io.ReadFull(c, raw[:]); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	h, err := snapshot.ParseHeader(raw[:])
	if err == nil && h.Step != step {
		err = fmt.Errorf("the server sent step %d", h.Step)
	}
	if err == nil {
		err = checkLength(h)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := dst.Write(h, newPayloadReader(c, h, nil)); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
