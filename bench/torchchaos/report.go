package main

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"
)

// result is one way's chaos run, measured.
type result struct {
	way       way
	costs     []cost
	sum       summary
	identical bool
}

// kindFigures are the costs of one kind of failure in one run.
type kindFigures struct {
	Kind        string  `json:"kind"`
	N           int     `json:"n"`
	Unrecovered int     `json:"unrecovered"`
	RedoneMean  float64 `json:"steps_redone_mean"`
	RedoneMax   int     `json:"steps_redone_max"`
	RecoveryMed float64 `json:"recovery_s_median"`
	RecoveryMax float64 `json:"recovery_s_max"`
}

// byKind sums costs per failure kind, in kinds' order (kinds with no failure left out).
func byKind(cs []cost) []kindFigures {
	out := []kindFigures{}
	for _, k := range kinds {
		f := kindFigures{Kind: k}
		var rec []time.Duration
		redone := 0
		for _, c := range cs {
			if c.Kind != k {
				continue
			}
			f.N++
			if c.Unrecovered {
				f.Unrecovered++
				continue
			}
			redone += c.Redone
			f.RedoneMax = max(f.RedoneMax, c.Redone)
			rec = append(rec, c.Recovery)
		}
		if f.N == 0 {
			continue
		}
		if len(rec) > 0 {
			f.RedoneMean = round3(float64(redone) / float64(len(rec)))
			f.RecoveryMed, f.RecoveryMax = round3(medianDuration(rec).Seconds()), round3(slices.Max(rec).Seconds())
		}
		out = append(out, f)
	}
	return out
}

// snapshotCost is the snapshot way's cost per step as a fraction of the fault-free run's step
// (median against median); NaN-free: 0 when either is unknown.
func snapshotCost(r result, ref summary) float64 {
	if !r.way.Snapshots || ref.StepTime == 0 || r.sum.StepTime == 0 {
		return 0
	}
	return float64(r.sum.StepTime-ref.StepTime) / float64(ref.StepTime)
}

func printTable(w io.Writer, b *bench, ref summary, rs []result, bw *bandwidth) {
	fmt.Fprintf(w, "\n## PyTorch DDP under chaos: %d nodes x %d workers (CPU, gloo), a %.0f MB model, %d steps; one failure every %v (seed %d); checkpoint every %d steps\n\n",
		nodes, b.nproc, b.modelMB, b.steps, b.period, b.seed, b.ckptEvery)
	fmt.Fprintln(w, "| way | failure | n | steps redone per failure (mean, max) | failure -> next step, s (median, max) |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, r := range rs {
		for _, k := range byKind(r.costs) {
			note := ""
			if k.Unrecovered > 0 {
				note = fmt.Sprintf(" (%d not recovered)", k.Unrecovered)
			}
			fmt.Fprintf(w, "| %s | %s%s | %d | %.2f, %d | %.2f, %.2f |\n", r.way.Name, k.Kind, note, k.N, k.RedoneMean, k.RedoneMax, k.RecoveryMed, k.RecoveryMax)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| way | median step, s | snapshot cost per step | effective training time | final model bit-identical to the fault-free run's |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	fmt.Fprintf(w, "| fault-free | %.3f | - | %.3f | - |\n", ref.StepTime.Seconds(), ref.Effective())
	for _, r := range rs {
		c := "-"
		if r.way.Snapshots {
			c = fmt.Sprintf("%+.1f %%", 100*snapshotCost(r, ref))
		}
		fmt.Fprintf(w, "| %s | %.3f | %s | %.3f | %s |\n", r.way.Name, r.sum.StepTime.Seconds(), c, r.sum.Effective(), yesNo(r.identical))
	}
	if bw != nil {
		fmt.Fprintf(w, "\nsnapshot of %.0f MB (python/bench_snapshots.py, one process): save %.2f GB/s until complete (%.2f GB/s until save returns), restore %.2f GB/s (verified by the agent, as under gorun); memcpy (Tensor.copy_) %.2f GB/s\n",
			float64(bw.Bytes)/1e6, bw.SaveGBps, bw.SaveReturnGB, bw.RestoreGBps, bw.MemcpyGBps)
	}
	for _, r := range rs {
		fmt.Fprintf(w, "\n%s: bit-identical: %s\n", r.way.Name, yesNo(r.identical))
		if len(r.costs) == 0 {
			fmt.Fprintf(w, "  no failure injected: the run trained its %d steps in less than half a period (%v); give it more -steps\n", b.steps, b.period)
		}
		for _, c := range r.costs {
			state := fmt.Sprintf("%d steps redone, next step %.2f s after", c.Redone, c.Recovery.Seconds())
			if c.Unrecovered {
				state = "not recovered"
			}
			fmt.Fprintf(w, "  %s %s: %s: %s\n", c.At.Format("15:04:05.000"), c.Kind, c.Victim, state)
		}
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func round3(x float64) float64 { return float64(int64(x*1000+0.5)) / 1000 }

// jsonOf is one way's figures as one JSON object.
func (r result) jsonOf(b *bench, ref summary, bw *bandwidth) any {
	v := struct {
		Way              string        `json:"way"`
		Nodes            int           `json:"nodes"`
		Workers          int           `json:"workers_per_node"`
		ModelMB          float64       `json:"model_mb"`
		Steps            int           `json:"steps"`
		PeriodS          float64       `json:"period_s"`
		CkptEvery        int           `json:"checkpoint_every,omitempty"`
		Failures         []kindFigures `json:"failures"`
		StepS            float64       `json:"step_s_median"`
		FaultFreeStepS   float64       `json:"fault_free_step_s_median"`
		SnapshotCost     *float64      `json:"snapshot_cost_per_step,omitempty"`
		Effective        float64       `json:"effective_training_time"`
		FaultFreeEff     float64       `json:"fault_free_effective_training_time"`
		BitIdentical     bool          `json:"bit_identical"`
		SnapshotSaveGBps float64       `json:"snapshot_save_GBps,omitempty"`
		SnapshotRestGBps float64       `json:"snapshot_restore_GBps,omitempty"`
		MemcpyGBps       float64       `json:"memcpy_GBps,omitempty"`
	}{Way: r.way.Name, Nodes: nodes, Workers: b.nproc, ModelMB: b.modelMB, Steps: b.steps, PeriodS: b.period.Seconds(),
		Failures: byKind(r.costs), StepS: round3(r.sum.StepTime.Seconds()), FaultFreeStepS: round3(ref.StepTime.Seconds()),
		Effective: round3(r.sum.Effective()), FaultFreeEff: round3(ref.Effective()), BitIdentical: r.identical}
	if r.way.Ckpt {
		v.CkptEvery = b.ckptEvery
	}
	if r.way.Snapshots {
		c := round3(snapshotCost(r, ref))
		v.SnapshotCost = &c
		if bw != nil {
			v.SnapshotSaveGBps, v.SnapshotRestGBps, v.MemcpyGBps = round3(bw.SaveGBps), round3(bw.RestoreGBps), round3(bw.MemcpyGBps)
		}
	}
	return v
}

// smokeCheck is the smoke mode's verdict: every way injected each kind of failure, recovered
// from each, and ended bit-identical to the fault-free run. No timing is judged.
func smokeCheck(rs []result) error {
	var errs []error
	if len(rs) == 0 {
		errs = append(errs, errors.New("smoke: no way ran"))
	}
	for _, r := range rs {
		for _, k := range kinds {
			if !slices.ContainsFunc(r.costs, func(c cost) bool { return c.Kind == k }) {
				errs = append(errs, fmt.Errorf("smoke: %s: no %s was injected", r.way.Name, k))
			}
		}
		for _, c := range r.costs {
			if c.Unrecovered {
				errs = append(errs, fmt.Errorf("smoke: %s: no step after the %s at %s", r.way.Name, c.Kind, c.At.Format("15:04:05.000")))
			}
		}
		if !r.identical {
			errs = append(errs, fmt.Errorf("smoke: %s: the final model is not bit-identical to the fault-free run's", r.way.Name))
		}
	}
	return errors.Join(errs...)
}
