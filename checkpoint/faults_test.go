package checkpoint

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/gorun/gorun/internal/testutil"
)

// The test binary re-executes itself as one rank of a save when roleEnv is set.
const (
	roleEnv   = "CKPTTEST_RANK"
	sizeEnv   = "CKPTTEST_SIZE"
	addrEnv   = "CKPTTEST_ADDR"
	dirEnv    = "CKPTTEST_DIR"
	stepEnv   = "CKPTTEST_STEP"
	victimEnv = "CKPTTEST_STOP_AT_HALF" // "1": print "half" and hang once half the file is written
)

// faultWorld is the layout of the rank processes.
func faultWorld() World { return World{Replicas: 2, Shards: 2, Mode: "hsdp"} }

// faultSpecs is large enough that a rank's file takes several writes at the test write size.
func faultSpecs() []spec {
	return []spec{{"wte", []int64{512, 129}}, {"w2", []int64{40001}}, {"b", []int64{3}}}
}

// runRank is a rank process: it saves one step over a TCP coordinator and exits 0 on success.
func runRank() int {
	rank, _ := strconv.Atoi(os.Getenv(roleEnv))
	size, _ := strconv.Atoi(os.Getenv(sizeEnv))
	step, _ := strconv.ParseInt(os.Getenv(stepEnv), 10, 64)
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	var ln net.Listener
	if rank == 0 {
		var err error
		if ln, err = net.FileListener(os.NewFile(3, "listener")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 3
		}
	}
	c, err := joinNetGroup(ctx, rank, size, ln, os.Getenv(addrEnv))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	defer c.Close()
	cfg := Config{Dir: os.Getenv(dirEnv), World: faultWorld(), Coord: c, BlockBytes: 4096}
	if os.Getenv(victimEnv) == "1" {
		var once sync.Once
		cfg.Progress = func(written, total int64) {
			if written >= total/2 && written < total {
				once.Do(func() { fmt.Println("half") })
				select {} // hang mid-file until SIGKILL
			}
		}
	}
	s, err := NewSaver(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 3
	}
	s.writeBytes = 16 << 10
	specs := faultSpecs()
	if err := s.Save(ctx, Meta{Step: step}, rankTensors(specs, makeState(specs, step), faultWorld(), rank)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestKillRankMidSave SIGKILLs one rank process after it wrote half its file: no new checkpoint
// may become visible, the other ranks must fail rather than hang, the previous checkpoint loads,
// and the next save cleans up and succeeds.
func TestKillRankMidSave(t *testing.T) {
	for _, victim := range []int{0, 1, 3} {
		t.Run(fmt.Sprintf("rank %d", victim), func(t *testing.T) {
			specs := faultSpecs()
			dir := t.TempDir()
			saveWorld(t, dir, faultWorld(), 100, specs, makeState(specs, 100), nil)

			ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			require.NoError(t, err)
			addr := ln.Addr().String()
			lf, err := ln.File()
			require.NoError(t, err)
			require.NoError(t, ln.Close())
			defer lf.Close()

			type proc struct {
				cmd    *exec.Cmd
				stdout *bufio.Reader
				stderr *capture
				done   chan error
			}
			procs := make([]*proc, faultWorld().Size())
			for r := range procs {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), roleEnv+"="+strconv.Itoa(r), sizeEnv+"="+strconv.Itoa(len(procs)),
					addrEnv+"="+addr, dirEnv+"="+dir, stepEnv+"=200")
				if r == 0 {
					cmd.ExtraFiles = []*os.File{lf}
				}
				if r == victim {
					cmd.Env = append(cmd.Env, victimEnv+"=1")
				}
				out, err := cmd.StdoutPipe()
				require.NoError(t, err)
				p := &proc{cmd: cmd, stdout: bufio.NewReader(out), stderr: &capture{}, done: make(chan error, 1)}
				cmd.Stderr = p.stderr
				require.NoError(t, cmd.Start())
				procs[r] = p
			}
			t.Cleanup(func() { // never leave a rank behind
				for _, p := range procs {
					_ = p.cmd.Process.Kill()
				}
			})
			line, err := procs[victim].stdout.ReadString('\n')
			require.NoError(t, err, "victim output")
			require.Equal(t, "half\n", line)
			require.NoError(t, procs[victim].cmd.Process.Signal(syscall.SIGKILL))
			for _, p := range procs {
				go func() { _, _ = io.Copy(io.Discard, p.stdout); p.done <- p.cmd.Wait() }()
			}
			for r, p := range procs {
				select {
				case err := <-p.done:
					t.Logf("rank %d: %v: %s", r, err, p.stderr)
					require.Error(t, err, "rank %d must fail, stderr: %s", r, p.stderr)
					if r == victim {
						require.Equal(t, "signal: killed", err.Error())
					} else {
						require.Contains(t, p.stderr.String(), "save step-00000200", "rank %d", r)
					}
				case <-time.After(testDeadline):
					t.Fatalf("rank %d still running after the victim died", r)
				}
			}

			entries, err := List(dir)
			require.NoError(t, err)
			for _, e := range entries {
				require.False(t, e.Step == 200 && e.Complete, "step 200 must not be visible: %+v", e)
			}
			state := makeState(specs, 100)
			for _, w := range []World{{1, 1, ""}, faultWorld()} {
				loaded, reqs, errs := loadWorld(w, dir, specs)
				for r := range errs {
					require.NoError(t, errs[r])
					require.Empty(t, loaded[r].Skipped)
					require.Equal(t, int64(100), loaded[r].Manifest.Step)
					requireHolds(t, state, reqs[r])
				}
			}
			// The next save commits and removes what the killed one left.
			saveWorld(t, dir, faultWorld(), 200, specs, makeState(specs, 200), nil)
			entries, err = List(dir)
			require.NoError(t, err)
			require.Len(t, entries, 2)
			require.True(t, entries[0].Complete && entries[1].Complete, "%+v", entries)
		})
	}
}

// TestDiskFullDuringSave saves into a 1 MiB tmpfs (root only: skipped without, or failed when
// CI=true): the save that does not fit fails with ENOSPC on every rank, naming the rank and file,
// and the previous checkpoint stays intact.
func TestDiskFullDuringSave(t *testing.T) {
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		testutil.SkipOrFail(t, "cannot mount a tmpfs (needs root): %v", err)
	}
	t.Cleanup(func() { require.NoError(t, unix.Unmount(mnt, 0)) })
	dir := filepath.Join(mnt, "ckpt")
	w := World{Replicas: 2, Shards: 2, Mode: "hsdp"}
	small := []spec{{"w", []int64{20000}}} // 80 kB
	saveWorld(t, dir, w, 1, small, makeState(small, 1), nil)

	big := []spec{{"w", []int64{20000}}, {"big", []int64{400000}}} // 1.6 MB
	errs := onRanks(w, func(ctx context.Context, c Coordinator) error {
		s, err := NewSaver(Config{Dir: dir, World: w, Coord: c})
		if err != nil {
			return err
		}
		return s.Save(ctx, Meta{Step: 2}, rankTensors(big, makeState(big, 2), w, c.Rank()))
	})
	var nospc int
	for r, err := range errs {
		t.Logf("rank %d: %v", r, err)
		require.Error(t, err, "rank %d", r)
		require.Contains(t, err.Error(), "save step-00000002")
		if errors.Is(err, unix.ENOSPC) || strings.Contains(err.Error(), "no space left on device") {
			nospc++
		}
	}
	require.Contains(t, errs[0].Error(), "no space left on device")
	require.Regexp(t, `rank \d: reserve \d+ bytes for .*shard-0000\d\.bin: no space left on device`, errs[0].Error())
	require.Positive(t, nospc)

	entries, err := List(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "the temporary directory is gone: %+v", entries)
	ck, err := Open(entries[0].Path)
	require.NoError(t, err)
	require.NoError(t, ck.Verify(context.Background()))
	require.NoError(t, ck.Close())
	loaded, reqs, lerrs := loadWorld(w, dir, small)
	for r := range lerrs {
		require.NoError(t, lerrs[r])
		require.Equal(t, int64(1), loaded[r].Manifest.Step)
		requireHolds(t, makeState(small, 1), reqs[r])
	}
}

// capture is a goroutine-safe stderr buffer.
type capture struct {
	mu  sync.Mutex
	buf []byte
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.buf)
}

// netGroup is a Coordinator over TCP on 127.0.0.1 for rank processes: rank 0 accepts one
// connection per other rank; messages are length-prefixed.
type netGroup struct {
	rank, size int
	conns      []net.Conn // rank 0: by rank (nil at 0); others: conns[0] is rank 0
}

func joinNetGroup(ctx context.Context, rank, size int, ln net.Listener, addr string) (*netGroup, error) {
	g := &netGroup{rank: rank, size: size, conns: make([]net.Conn, size)}
	if rank == 0 {
		stop := context.AfterFunc(ctx, func() { ln.Close() })
		defer stop()
		for range size - 1 {
			c, err := ln.Accept()
			if err != nil {
				return nil, fmt.Errorf("accept: %w", err)
			}
			var hello [4]byte
			if _, err := io.ReadFull(c, hello[:]); err != nil {
				return nil, fmt.Errorf("hello: %w", err)
			}
			g.conns[binary.BigEndian.Uint32(hello[:])] = c
		}
		ln.Close()
		return g, nil
	}
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			var hello [4]byte
			binary.BigEndian.PutUint32(hello[:], uint32(rank))
			if _, err := c.Write(hello[:]); err != nil {
				return nil, err
			}
			g.conns[0] = c
			return g, nil
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (g *netGroup) Rank() int { return g.rank }
func (g *netGroup) Size() int { return g.size }

func (g *netGroup) Close() {
	for _, c := range g.conns {
		if c != nil {
			c.Close()
		}
	}
}

// watch makes the connections fail when ctx ends.
func (g *netGroup) watch(ctx context.Context) func() bool {
	return context.AfterFunc(ctx, func() {
		for _, c := range g.conns {
			if c != nil {
				_ = c.SetDeadline(time.Unix(1, 0))
			}
		}
	})
}

func (g *netGroup) GatherBytes(ctx context.Context, b []byte) ([][]byte, error) {
	defer g.watch(ctx)()
	if g.rank != 0 {
		return nil, send(g.conns[0], b)
	}
	all := make([][]byte, g.size)
	all[0] = b
	for r := 1; r < g.size; r++ {
		m, err := recv(g.conns[r])
		if err != nil {
			return nil, fmt.Errorf("gather from rank %d: %w", r, err)
		}
		all[r] = m
	}
	return all, nil
}

func (g *netGroup) BroadcastBytes(ctx context.Context, b []byte) ([]byte, error) {
	defer g.watch(ctx)()
	if g.rank != 0 {
		m, err := recv(g.conns[0])
		if err != nil {
			return nil, fmt.Errorf("broadcast from rank 0: %w", err)
		}
		return m, nil
	}
	var errs []error
	for r := 1; r < g.size; r++ {
		if err := send(g.conns[r], b); err != nil {
			errs = append(errs, fmt.Errorf("broadcast to rank %d: %w", r, err))
		}
	}
	return b, errors.Join(errs...)
}

func send(c net.Conn, b []byte) error {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	_, err := c.Write(append(n[:], b...))
	return err
}

func recv(c net.Conn) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(c, n[:]); err != nil {
		return nil, err
	}
	b := make([]byte, binary.BigEndian.Uint32(n[:]))
	_, err := io.ReadFull(c, b)
	return b, err
}
