package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"

	"github.com/gorun/gorun/rendezvous"
)

// RetentionTTL is how long a run's keys outlive it: when its job closes
// (or its last agent leaves), its unleased keys (state, failure reports,
// the current pointer) are attached to a lease of this TTL, so `gorun
// status` can still read a finished job for a day and an etcd that serves
// jobs for months does not fill up. A new incarnation of the same run id
// deletes them at once.
const RetentionTTL = 24 * time.Hour

// keyCurrent, under a run's prefix, names the run's current incarnation.
const keyCurrent = "current"

// enterAttempts bounds how often Enter re-reads after losing the race to
// replace an incarnation; each loss means another agent replaced it, so
// the next read finds a new incarnation to join.
const enterAttempts = 10

// Incarnation is one life of a run id on an etcd: a re-run of a finished
// or dead run, or a SLURM requeue, is a new incarnation with keys of its
// own under Prefix(). JobPrefix(RunID)+"current" holds the current one.
type Incarnation struct {
	RunID  string `json:"run_id"`
	Number int    `json:"incarnation"`
	// Generation is the SLURM_RESTART_COUNT of the launch that started
	// it (0 outside SLURM): a launch of a larger one is a requeue, and
	// starts a new incarnation whatever state the current one is in.
	Generation int `json:"generation"`
	// Step is the SLURM_STEP_ID of the launch that started it ("" outside
	// SLURM): the steps of one job are launches of one run id.
	Step string `json:"step,omitempty"`
	// Identified says the launch that started it was told apart from
	// any other launch of the run id (see Launch).
	Identified bool `json:"identified,omitempty"`
}

// Launch is what an agent knows of the launch it belongs to: one launch is
// one incarnation.
//
// Under SLURM the run id is the job id, and a launch is one step of one
// run of the job: (SLURM_RESTART_COUNT, SLURM_STEP_ID). On an etcd embedded
// for the launch (SLURM's first nodes, a c10d endpoint) there is no other
// launch to tell it from. Such a launch is Identified: every agent of it
// joins the incarnation its first agent started, whatever became of it,
// so that an agent that comes after another one failed (or after the job
// closed) sees the job's outcome and fails at once, naming the failure,
// instead of starting a new incarnation and waiting join_timeout for
// nodes that are gone.
//
// Outside SLURM on an etcd that outlives launches (gorun rendezvous serve,
// an etcd cluster), nothing tells the late agent of a launch from the
// first agent of the next launch with the same --rdzv-id: the run id's
// current incarnation is joined while it is starting or live, and one
// that closed or died is a previous launch's and is replaced (re-runs
// under one --rdzv-id work). A late agent whose peer failed at startup
// then starts a new incarnation and logs why; give each launch its own
// --rdzv-id, as torchrun asks, to avoid it.
type Launch struct {
	Generation int    // SLURM_RESTART_COUNT; 0 outside SLURM
	Step       string // SLURM_STEP_ID; "" outside SLURM
	Identified bool   // under SLURM, or on an etcd embedded for the launch
}

// same says whether in was started by launch l.
func (l Launch) same(in Incarnation) bool {
	return l.Identified && in.Identified && in.Generation == l.Generation && in.Step == l.Step
}

// Prefix is the etcd prefix of the incarnation's keys.
func (in Incarnation) Prefix() string {
	return JobPrefix(in.RunID) + strconv.Itoa(in.Number) + "/"
}

// currentKey is the etcd key naming the run's current incarnation.
func currentKey(runID string) string { return JobPrefix(runID) + keyCurrent }

// pointer is the value of the current key.
type pointer struct {
	Number     int    `json:"incarnation"`
	Generation int    `json:"generation"`
	Step       string `json:"step,omitempty"`
	Identified bool   `json:"identified,omitempty"`
}

// Entry is the incarnation an agent entered, and whether it started it.
type Entry struct {
	Incarnation
	// Replaced says why this agent ended the run's previous incarnation
	// and started this one, e.g. "run x finished before (incarnation 0,
	// succeeded)"; empty when it joined the current one (new or live).
	Replaced string
}

// String says what the agent did, for its log.
func (e Entry) String() string {
	if e.Replaced != "" {
		return fmt.Sprintf("%s: starting incarnation %d", e.Replaced, e.Number)
	}
	return fmt.Sprintf("run %s: joining incarnation %d", e.RunID, e.Number)
}

// Enter finds the incarnation of run runID that an agent of launch joins,
// before it registers: the current one while it is new or live, or, for
// an Identified launch, whatever its state when that launch started it
// (see Launch); a new one, number n+1, when the current one closed, died
// (it has a state but no agent is registered: all of them died and their
// leases expired) or belongs to an earlier generation. A fresh run id
// starts at incarnation 0. Moving the current pointer is a
// compare-and-swap that also deletes the run's old keys, so agents of one
// launch that start together land in the same incarnation: the one that
// wins starts it, the others re-read and join it. Enter gives up when ctx
// ends or etcd stays away (with that error).
func (c *Conn) Enter(ctx context.Context, runID string, launch Launch) (Entry, error) {
	for range enterAttempts {
		cur, rev, err := readCurrent(ctx, c.client.KV, runID)
		if err != nil {
			return Entry{}, err
		}
		entry := Entry{Incarnation: cur}
		if rev != 0 {
			st, live, current, err := readIncarnation(ctx, c.client.KV, cur, rev)
			if err != nil {
				return Entry{}, err
			}
			if !current {
				continue // replaced since: its keys may be gone already
			}
			if entry.Replaced = replacement(cur, st, live, launch); entry.Replaced == "" {
				return entry, nil
			}
			entry.Number, entry.Generation = cur.Number+1, max(cur.Generation, launch.Generation)
		} else {
			entry.Generation = launch.Generation
		}
		entry.Step, entry.Identified = launch.Step, launch.Identified
		won, err := claim(ctx, c.client.KV, rev, entry.Incarnation)
		if err != nil || won {
			return entry, err
		}
	}
	return Entry{}, fmt.Errorf("rendezvous: run %s: the current incarnation changed %d times while this agent entered it", runID, enterAttempts)
}

// replacement says why an agent of launch must start a new incarnation
// after in, whose state (nil: none yet) and number of registered agents
// it read at one revision; "" means it joins in.
func replacement(in Incarnation, st *rendezvous.State, registered int64, launch Launch) string {
	switch {
	case launch.Generation > in.Generation:
		return fmt.Sprintf("run %s was started by SLURM restart %d and this is restart %d (requeued; incarnation %d is over)", in.RunID, in.Generation, launch.Generation, in.Number)
	case st == nil:
		return "" // nobody has opened a round yet: agents of this launch are starting
	case launch.same(in):
		return "" // this launch's own: its outcome is this agent's
	case st.Phase == rendezvous.PhaseClosed:
		return fmt.Sprintf("run %s finished before (incarnation %d, %s)", in.RunID, in.Number, st.Result)
	case registered == 0:
		return fmt.Sprintf("run %s died before (incarnation %d: round %d %s, no agent alive)", in.RunID, in.Number, st.Round, st.Phase)
	}
	return ""
}

// readCurrent reads the run's current incarnation and the revision of its
// pointer; rev 0: the run id is new here (incarnation 0).
func readCurrent(ctx context.Context, kv clientv3.KV, runID string) (in Incarnation, rev int64, err error) {
	in = Incarnation{RunID: runID}
	var resp *clientv3.GetResponse
	if err := retry(ctx, callPatience, func(ctx context.Context) (err error) {
		resp, err = kv.Get(ctx, currentKey(runID))
		return err
	}); err != nil {
		return in, 0, fmt.Errorf("rendezvous: read the current incarnation of run %s: %w", runID, err)
	}
	if len(resp.Kvs) == 0 {
		return in, 0, nil
	}
	var p pointer
	if err := json.Unmarshal(resp.Kvs[0].Value, &p); err != nil || p.Number < 0 {
		return in, 0, fmt.Errorf("rendezvous: %s holds %q, not an incarnation of gorun (another program's key?)", currentKey(runID), resp.Kvs[0].Value)
	}
	in.Number, in.Generation, in.Step, in.Identified = p.Number, p.Generation, p.Step, p.Identified
	return in, resp.Kvs[0].ModRevision, nil
}

// readIncarnation reads in's state (nil when no round was opened yet) and
// how many agents are registered, at one revision at which in is still
// the current incarnation (its pointer at rev); current is false when it
// is not.
func readIncarnation(ctx context.Context, kv clientv3.KV, in Incarnation, rev int64) (st *rendezvous.State, registered int64, current bool, err error) {
	var resp *clientv3.TxnResponse
	if err := retry(ctx, callPatience, func(ctx context.Context) (err error) {
		resp, err = kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(currentKey(in.RunID)), "=", rev)).
			Then(
				clientv3.OpGet(in.Prefix()+rendezvous.KeyState),
				clientv3.OpGet(in.Prefix()+rendezvous.PrefixNodes, clientv3.WithPrefix(), clientv3.WithCountOnly()),
			).Commit()
		return err
	}); err != nil {
		return nil, 0, false, fmt.Errorf("rendezvous: read incarnation %d of run %s: %w", in.Number, in.RunID, err)
	}
	if !resp.Succeeded {
		return nil, 0, false, nil
	}
	registered = resp.Responses[1].GetResponseRange().Count
	states := resp.Responses[0].GetResponseRange().Kvs
	if len(states) == 0 {
		return nil, registered, true, nil
	}
	st = &rendezvous.State{}
	if err := json.Unmarshal(states[0].Value, st); err != nil {
		return nil, 0, false, fmt.Errorf("rendezvous: state of incarnation %d of run %s: %w", in.Number, in.RunID, err)
	}
	return st, registered, true, nil
}

// claim makes next the run's current incarnation if the pointer is still
// at rev (0: absent), and in the same transaction deletes every other key
// of the run: the replaced incarnation's and any left over from older
// ones. It reports whether it won.
func claim(ctx context.Context, kv clientv3.KV, rev int64, next Incarnation) (bool, error) {
	value, err := json.Marshal(pointer{Number: next.Number, Generation: next.Generation, Step: next.Step, Identified: next.Identified})
	if err != nil {
		return false, err
	}
	run, cur := JobPrefix(next.RunID), currentKey(next.RunID)
	var resp *clientv3.TxnResponse
	err = retry(ctx, callPatience, func(ctx context.Context) (err error) {
		resp, err = kv.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(cur), "=", rev)).
			Then(
				// Everything under the run's prefix but the pointer itself:
				// a transaction may not delete a key it also puts.
				clientv3.OpDelete(run, clientv3.WithRange(cur)),
				clientv3.OpDelete(cur+"\x00", clientv3.WithRange(clientv3.GetPrefixRangeEnd(run))),
				clientv3.OpPut(cur, string(value)),
			).Commit()
		return err
	})
	if err != nil {
		return false, fmt.Errorf("rendezvous: start incarnation %d of run %s: %w", next.Number, next.RunID, err)
	}
	return resp.Succeeded, nil
}

// retainBatch bounds the keys attached to the retention lease in one
// transaction (etcd allows 128 operations per transaction by default).
const retainBatch = 60

// retain attaches in's unleased keys, and the run's current pointer while
// it names in, to a new lease of RetentionTTL. With ifDeserted, it does so
// only while no agent is registered. A key that changes meanwhile (the run
// goes on) cancels the rest: keys a live run rewrites are unleased again.
func (c *Conn) retain(ctx context.Context, in Incarnation, ifDeserted bool) error {
	fail := func(err error) error {
		return fmt.Errorf("rendezvous: keep the keys of run %s (incarnation %d) for %s: %w", in.RunID, in.Number, RetentionTTL, err)
	}
	nodes := in.Prefix() + rendezvous.PrefixNodes
	if ifDeserted {
		resp, err := c.client.Get(ctx, nodes, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return fail(err)
		}
		if resp.Count > 0 {
			return nil // the last agent to leave does it
		}
	}
	resp, err := c.client.Txn(ctx).Then(clientv3.OpGet(currentKey(in.RunID)), clientv3.OpGet(in.Prefix(), clientv3.WithPrefix())).Commit()
	if err != nil {
		return fail(err)
	}
	var keys []*clientv3.GetResponse
	for _, r := range resp.Responses {
		keys = append(keys, (*clientv3.GetResponse)(r.GetResponseRange()))
	}
	var unleased []kvAt
	for _, kv := range keys[0].Kvs {
		var p pointer
		if json.Unmarshal(kv.Value, &p) == nil && p.Number == in.Number && kv.Lease == 0 {
			unleased = append(unleased, kvAt{string(kv.Key), kv.Value, kv.ModRevision})
		}
	}
	for _, kv := range keys[1].Kvs {
		if kv.Lease == 0 {
			unleased = append(unleased, kvAt{string(kv.Key), kv.Value, kv.ModRevision})
		}
	}
	if len(unleased) == 0 {
		return nil
	}
	lease, err := c.client.Grant(ctx, int64(RetentionTTL/time.Second))
	if err != nil {
		return fail(err)
	}
	attached := false
	for start := 0; start < len(unleased); start += retainBatch {
		batch := unleased[start:min(start+retainBatch, len(unleased))]
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		if ifDeserted {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(nodes), "=", 0).WithPrefix())
		}
		for _, kv := range batch {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(kv.key), "=", kv.rev))
			ops = append(ops, clientv3.OpPut(kv.key, string(kv.value), clientv3.WithLease(lease.ID)))
		}
		tresp, err := c.client.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return fail(err)
		}
		if !tresp.Succeeded {
			break
		}
		attached = true
	}
	if !attached {
		if _, err := c.client.Revoke(ctx, lease.ID); err != nil {
			return fail(err)
		}
	}
	return nil
}

// kvAt is a key with its value at one revision.
type kvAt struct {
	key   string
	value []byte
	rev   int64
}

// ReadCurrent returns run runID's current incarnation; ok is false when no
// agent of the run id ever started on this etcd (or its keys expired).
func (c *Conn) ReadCurrent(ctx context.Context, runID string) (in Incarnation, ok bool, err error) {
	in, rev, err := readCurrent(ctx, c.client.KV, runID)
	return in, rev != 0, err
}

// incarnationKV is the incarnation's key space, keys relative to it.
func incarnationKV(client *clientv3.Client, in Incarnation) clientv3.KV {
	return namespace.NewKV(client.KV, in.Prefix())
}
