package commbench

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorun/gorun/trainer/comm"
)

// GlooScript is the gloo side: one rank of torch.distributed running the
// same specs (see gloo_bench.py).
//
//go:embed gloo_bench.py
var GlooScript []byte

// DefaultOps are the collectives measured, in table order.
func DefaultOps() []string { return []string{"allreduce", "reducescatter", "allgather"} }

// DefaultSizes are the buffer sizes measured: 4 KiB to 256 MiB.
func DefaultSizes() []int64 {
	return []int64{4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20}
}

// Spec is one measurement: Iters calls of Op on a buffer of Bytes (the
// whole buffer: all-gather's output, reduce-scatter's input, as
// nccl-tests counts it).
type Spec struct {
	Op    string
	Bytes int64
	Iters int
}

// Specs returns the specs for ops and sizes on ranks ranks: sizes rounded
// down to a multiple of 4*ranks bytes, iterations enough for about 256 MiB
// of buffer per measurement (2 to 100).
func Specs(ops []string, sizes []int64, ranks int) []Spec {
	var out []Spec
	for _, op := range ops {
		for _, b := range sizes {
			b = b / int64(4*ranks) * int64(4*ranks)
			if b == 0 {
				continue
			}
			out = append(out, Spec{Op: op, Bytes: b, Iters: int(max(2, min(100, (256<<20)/b)))})
		}
	}
	return out
}

// EncodeSpecs is the op:bytes:iters,... form both workers take.
func EncodeSpecs(specs []Spec) string {
	parts := make([]string, len(specs))
	for i, s := range specs {
		parts[i] = fmt.Sprintf("%s:%d:%d", s.Op, s.Bytes, s.Iters)
	}
	return strings.Join(parts, ",")
}

// DecodeSpecs parses EncodeSpecs' form.
func DecodeSpecs(s string) ([]Spec, error) {
	var out []Spec
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(part, ":")
		if len(f) != 3 {
			return nil, fmt.Errorf("commbench: spec %q: want op:bytes:iters", part)
		}
		b, err1 := strconv.ParseInt(f[1], 10, 64)
		it, err2 := strconv.Atoi(f[2])
		if err := errors.Join(err1, err2); err != nil || b <= 0 || it <= 0 {
			return nil, fmt.Errorf("commbench: spec %q: want positive bytes and iterations", part)
		}
		out = append(out, Spec{Op: f[0], Bytes: b, Iters: it})
	}
	return out, nil
}

// Result is one measurement, as printed with --json. Bandwidths are in
// GB/s (10^9 bytes per second), bus bandwidth as nccl-tests defines it.
type Result struct {
	Impl    string  `json:"impl"` // gorun or gloo
	Op      string  `json:"op"`
	Ranks   int     `json:"ranks"`
	Bytes   int64   `json:"bytes"`
	Iters   int     `json:"iters,omitempty"`
	Seconds float64 `json:"seconds,omitempty"` // whole loop, slowest rank
	AlgBW   float64 `json:"algbw_gbps,omitempty"`
	BusBW   float64 `json:"busbw_gbps,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// fill computes the bandwidths from Seconds.
func (r *Result) fill() {
	if r.Seconds <= 0 || r.Error != "" {
		return
	}
	r.AlgBW = float64(r.Bytes) * float64(r.Iters) / r.Seconds / 1e9
	n := float64(r.Ranks)
	switch r.Op {
	case "allreduce":
		r.BusBW = r.AlgBW * 2 * (n - 1) / n
	default:
		r.BusBW = r.AlgBW * (n - 1) / n
	}
}

// measurement is what rank 0 of either side prints per spec.
type measurement struct {
	Op      string  `json:"op"`
	Bytes   int64   `json:"bytes"`
	Iters   int     `json:"iters"`
	Seconds float64 `json:"seconds,omitempty"`
	Error   string  `json:"error,omitempty"`
}

// Measure runs specs on w's world group; rank 0 writes one JSON line per
// spec to out. The time of a spec is the slowest rank's.
func Measure(w *comm.World, specs []Spec, out io.Writer) error {
	g := w.All()
	n := g.Size()
	enc := json.NewEncoder(out)
	for _, s := range specs {
		elems := int(s.Bytes / 4)
		var call func() error
		switch s.Op {
		case "allreduce":
			buf := ones(elems)
			call = func() error { return g.AllReduce(buf) }
		case "reducescatter":
			in, o := ones(elems/n*n), make([]float32, elems/n)
			call = func() error { return g.ReduceScatter(in, o) }
		case "allgather":
			in, o := ones(elems/n), make([]float32, elems/n*n)
			call = func() error { return g.AllGather(in, o) }
		default:
			return fmt.Errorf("commbench: unknown op %q", s.Op)
		}
		if err := call(); err != nil { // warm up
			return err
		}
		if err := g.Barrier(); err != nil {
			return err
		}
		start := time.Now()
		for range s.Iters {
			if err := call(); err != nil {
				return err
			}
		}
		elapsed := time.Since(start).Seconds()
		// The slowest rank's time: gather every rank's, take the max.
		all := make([]float32, n)
		if err := g.AllGather([]float32{float32(elapsed)}, all); err != nil {
			return err
		}
		worst := 0.0
		for _, e := range all {
			worst = max(worst, float64(e))
		}
		if w.Rank() == 0 {
			if err := enc.Encode(measurement{Op: s.Op, Bytes: s.Bytes, Iters: s.Iters, Seconds: worst}); err != nil {
				return err
			}
		}
	}
	return nil
}

func ones(n int) []float32 {
	b := make([]float32, n)
	for i := range b {
		b[i] = 1
	}
	return b
}

// WorkerEnv marks a process as one rank of our side; its value is the
// spec list. RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT place it.
const WorkerEnv = "BENCH_COMM_SPECS"

// TCPEnv set to 1 makes our side use TCP between ranks of one node.
const TCPEnv = "BENCH_COMM_TCP"

// RunWorker is one rank of our side, configured from lookup (the process
// environment): it connects, measures, and writes rank 0's lines to out.
func RunWorker(ctx context.Context, lookup func(string) (string, bool), out io.Writer) error {
	get := func(k string) string { v, _ := lookup(k); return v }
	specs, err := DecodeSpecs(get(WorkerEnv))
	if err != nil {
		return err
	}
	rank, err1 := strconv.Atoi(get("RANK"))
	size, err2 := strconv.Atoi(get("WORLD_SIZE"))
	port, err3 := strconv.Atoi(get("MASTER_PORT"))
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("commbench: worker environment: %w", err)
	}
	cfg := comm.Config{
		Rank: rank, WorldSize: size, MasterAddr: get("MASTER_ADDR"), MasterPort: port,
		Token: "bench/" + get("MASTER_PORT"), Timeout: time.Minute, TCPOnly: get(TCPEnv) == "1",
	}
	w, err := comm.Connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer w.Close()
	return Measure(w, specs, out)
}

// Options says what Run measures and how it starts the ranks.
type Options struct {
	Ranks []int
	Sizes []int64
	Ops   []string
	// Self is the command that runs one rank of our side (RunWorker); the
	// worker's variables are added to its environment.
	Self []string
	// Python runs gloo_bench.py; empty skips the gloo side.
	Python string
	// TCP also measures our side over TCP only, as impl "gorun-tcp".
	TCP bool
	// Rounds runs every side this many times, taking turns, and keeps each
	// measurement's best: on a shared machine, load comes and goes.
	Rounds int
	// Stderr receives the ranks' stderr and progress lines.
	Stderr io.Writer

	skipOurs bool // tests of the gloo side alone
}

// Run measures every spec for every rank count: ours (over the default
// transport, and over TCP if asked), then gloo, each as real processes on
// this machine, one after the other, Rounds times. It returns each
// measurement's best round, in order.
func Run(ctx context.Context, o Options) ([]Result, error) {
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	// Ranks copy their stderr from goroutines of their own when it is not
	// a file: serialize them.
	if _, isFile := o.Stderr.(*os.File); !isFile {
		o.Stderr = &syncWriter{w: o.Stderr}
	}
	var results []Result
	index := map[[4]string]int{} // impl, op, ranks, bytes -> results
	keep := func(r Result) {
		k := [4]string{r.Impl, r.Op, strconv.Itoa(r.Ranks), strconv.FormatInt(r.Bytes, 10)}
		i, ok := index[k]
		switch {
		case !ok:
			index[k] = len(results)
			results = append(results, r)
		case r.Error == "" && (results[i].Error != "" || r.Seconds < results[i].Seconds):
			results[i] = r
		}
	}
	script := ""
	if o.Python != "" {
		f, err := os.CreateTemp("", "gorun-gloo-bench-*.py")
		if err != nil {
			return nil, fmt.Errorf("commbench: %w", err)
		}
		defer os.Remove(f.Name())
		if _, err := f.Write(GlooScript); err != nil {
			f.Close()
			return nil, fmt.Errorf("commbench: %w", err)
		}
		f.Close()
		script = f.Name()
	}
	for _, n := range o.Ranks {
		specs := Specs(o.Ops, o.Sizes, n)
		type side struct {
			impl string
			argv []string
			env  []string
		}
		var sides []side
		if !o.skipOurs {
			sides = append(sides, side{"gorun", o.Self, []string{WorkerEnv + "=" + EncodeSpecs(specs)}})
		}
		if o.TCP {
			sides = append(sides, side{"gorun-tcp", o.Self, []string{WorkerEnv + "=" + EncodeSpecs(specs), TCPEnv + "=1"}})
		}
		if script != "" {
			sides = append(sides, side{"gloo", []string{o.Python, script, EncodeSpecs(specs)}, []string{"GLOO_SOCKET_IFNAME=lo", "OMP_NUM_THREADS=1"}})
		}
		for round := range max(1, o.Rounds) {
			for _, s := range sides {
				fmt.Fprintf(o.Stderr, "bench comm: round %d: %s, %d ranks\n", round+1, s.impl, n)
				ms, err := runRanks(ctx, n, s.argv, s.env, o.Stderr)
				if err != nil {
					return results, fmt.Errorf("commbench: %s with %d ranks: %w", s.impl, n, err)
				}
				for _, m := range ms {
					r := Result{Impl: s.impl, Op: m.Op, Ranks: n, Bytes: m.Bytes, Iters: m.Iters, Seconds: m.Seconds, Error: m.Error}
					r.fill()
					keep(r)
				}
			}
		}
	}
	return results, nil
}

// runRanks starts n processes of argv on 127.0.0.1 and a free port and
// returns rank 0's measurement lines. A rank that fails stops the others.
func runRanks(ctx context.Context, n int, argv, env []string, stderr io.Writer) ([]measurement, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, n)
	var out io.ReadCloser
	for r := range n {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env, "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r),
			"WORLD_SIZE="+strconv.Itoa(n), "LOCAL_WORLD_SIZE="+strconv.Itoa(n),
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port))
		cmd.Stderr = stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if r == 0 {
			if out, err = cmd.StdoutPipe(); err != nil {
				return nil, err
			}
		}
		cmds[r] = cmd
	}
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r, cmd := range cmds {
		if err := cmd.Start(); err != nil {
			cancel()
			wg.Wait()
			return nil, fmt.Errorf("start rank %d: %w", r, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r == 0 {
				return // waited for below, after its output is read
			}
			if errs[r] = cmd.Wait(); errs[r] != nil {
				cancel() // one rank failed: stop the others
			}
		}()
	}
	var ms []measurement
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var m measurement
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue // not ours: a library's chatter
		}
		ms = append(ms, m)
	}
	if errs[0] = cmds[0].Wait(); errs[0] != nil {
		cancel()
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			return ms, fmt.Errorf("rank %d: %w", r, err)
		}
	}
	return ms, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
