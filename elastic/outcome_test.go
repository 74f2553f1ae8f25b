package elastic

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gorun/gorun/rendezvous"
)

// TestDecide: the agent's next state after each kind of pass, from each
// state it can be in then, and the edges it refuses: an outcome not yet
// settled with the rendezvous, and any move of an agent that ended.
func TestDecide(t *testing.T) {
	won := closed{rendezvous.End{Closed: true, Result: rendezvous.ResultSucceeded}}
	lost := closed{rendezvous.End{Closed: true, Result: rendezvous.ResultFailed}}
	next := rejoin{end: rendezvous.End{Cause: rendezvous.CauseFailure}}
	tests := []struct {
		from State
		out  outcome
		to   State // ignored when refused
		ok   bool
	}{
		// A round's end, as the rendezvous settled it.
		{StateRunning, next, StateRendezvous, true}, // succeeded here, a new round opened
		{StateStopping, next, StateRendezvous, true},
		{StateReforming, next, StateRendezvous, true},
		{StateRunning, won, StateSucceeded, true},
		{StateStopping, won, StateSucceeded, true},
		{StateStopping, lost, StateFailed, true},
		{StateReforming, lost, StateFailed, true}, // a worker restarted alone spent the budget
		{StateReforming, won, 0, false},           // a restart alone cannot close the job as succeeded
		// The agent's own ends, from wherever it is.
		{StateRendezvous, stopped{syscall.SIGTERM}, StateFailed, true},
		{StateStopping, stopped{syscall.SIGINT}, StateFailed, true},
		{StateReforming, stopped{syscall.SIGTERM}, StateFailed, true},
		{StateRendezvous, requeue{idle: syscall.SIGUSR1}, StateFailed, true},
		{StateRunning, requeue{}, StateFailed, true},
		{StateStopping, requeue{}, StateFailed, true},
		{StateRendezvous, leftOut{&rendezvous.ClosedError{Result: rendezvous.ResultSucceeded}}, StateFailed, true},
		{StateRendezvous, evicted{"slow"}, StateFailed, true},
		{StateRendezvous, broken{errors.New("x")}, StateFailed, true},
		{StateRunning, broken{errors.New("x")}, StateFailed, true},
		{StateRendezvous, lost, StateFailed, true},
		// No round ran: a next round cannot follow a wait for one.
		{StateRendezvous, next, 0, false},
		// A round's own outcomes are settled before the agent moves.
		{StateRunning, succeeded{}, 0, false},
		{StateStopping, failed{}, 0, false},
		{StateReforming, respawn{}, 0, false},
		{StateReforming, reform{}, 0, false},
		{StateStopping, ended{}, 0, false},
		{StateRunning, nil, 0, false},
		// An agent that ended moves no more.
		{StateSucceeded, next, 0, false},
		{StateFailed, stopped{syscall.SIGTERM}, 0, false},
		{StateFailed, broken{errors.New("x")}, 0, false},
		{StateInit, won, 0, false},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s+%T", tc.from, tc.out), func(t *testing.T) {
			to, err := decide(tc.from, tc.out)
			if !tc.ok {
				require.Error(t, err)
				require.Equal(t, tc.from, to, "a refused edge stays where it is")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.to, to)
		})
	}
}

// TestKeptAcross: only a membership change, or a failure the rendezvous
// lets this node recover from by restarting the worker alone, keeps the
// workers in place; a closed job never does.
func TestKeptAcross(t *testing.T) {
	tests := []struct {
		name string
		end  rendezvous.End
		want bool
	}{
		{"membership", rendezvous.End{Cause: rendezvous.CauseMembership}, true},
		{"failure restarted alone", rendezvous.End{Cause: rendezvous.CauseFailure, InPlace: true}, true},
		{"failure restarting everyone", rendezvous.End{Cause: rendezvous.CauseFailure}, false},
		{"closed", rendezvous.End{Closed: true, Cause: rendezvous.CauseMembership}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, keptAcross(tc.end))
		})
	}
}

// TestTransitionRefuses: an edge outside the table is not taken: the
// agent stays where it is, the observer hears nothing, and the caller
// gets the error.
func TestTransitionRefuses(t *testing.T) {
	rec := &recorder{}
	a, err := New(Spec{LocalWorkers: 1, Command: []string{"true"}, ErrorDir: t.TempDir(), Observer: rec}, &rendezvous.Static{})
	require.NoError(t, err)
	require.ErrorContains(t, a.transition(StateRunning), "init -> running is not an allowed transition")
	require.Equal(t, StateInit, a.State())
	require.Empty(t, rec.all())
	require.NoError(t, a.transition(StateRendezvous))
	require.Equal(t, StateRendezvous, a.State())
	require.Equal(t, []string{"state init->rendezvous"}, rec.all())
}

// The ends after which a job is run again (and should go on from its last
// snapshots) against those after which it is done, or goes on elsewhere.
func TestEndsUnfinished(t *testing.T) {
	tests := []struct {
		name string
		out  outcome
		want bool
	}{
		{"a stop signal", stopped{syscall.SIGTERM}, true},
		{"a requeue", requeue{}, true},
		{"a requeue signal while idle", requeue{idle: syscall.SIGUSR1}, true},
		{"the job failed", closed{rendezvous.End{Result: rendezvous.ResultFailed}}, true},
		{"the job succeeded", closed{rendezvous.End{Result: rendezvous.ResultSucceeded}}, false},
		{"evicted: the job goes on", evicted{"a straggler"}, false},
		{"left out of a job that succeeded", leftOut{&rendezvous.ClosedError{}}, false},
		{"the agent broke", broken{errors.New("x")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, endsUnfinished(tt.out))
		})
	}
}
