package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// userHZ is the unit of utime and stime in /proc/PID/stat: USER_HZ, 100
// on every Linux ABI Go supports.
const userHZ = 100

// etcdMeter reads what the etcd server costs: the CPU time of its process
// and the size of its database.
type etcdMeter struct {
	pid      int // 0: CPU time unknown (the etcd is not ours to see)
	client   *clientv3.Client
	endpoint string
}

// etcdSample is the etcd's cost at one moment.
type etcdSample struct {
	At     time.Time     // when it was read
	CPU    time.Duration // user + system CPU time of the etcd process since it started; -1: unknown
	Status etcdStatus
}

// newEtcdMeter dials endpoint for Status calls; pid is the etcd process
// (0 when unknown). The caller closes it.
func newEtcdMeter(ctx context.Context, endpoint string, pid int) (*etcdMeter, error) {
	if pid < 0 {
		return nil, fmt.Errorf("etcd pid %d", pid)
	}
	cli, err := dialEtcd(ctx, endpoint)
	if err != nil {
		return nil, err
	}
	return &etcdMeter{pid: pid, client: cli, endpoint: endpoint}, nil
}

func (m *etcdMeter) close() { _ = m.client.Close() }

// sample reads the etcd's CPU time and database size now. A failed read
// leaves its part unknown (-1) rather than failing the measurement.
func (m *etcdMeter) sample(ctx context.Context) etcdSample {
	s := etcdSample{At: time.Now(), CPU: -1, Status: etcdStatus{DBBytes: -1, DBInUseBytes: -1}}
	if m.pid > 0 {
		if cpu, err := processCPU(m.pid); err == nil {
			s.CPU = cpu
		}
	}
	if st, err := readEtcdStatus(ctx, m.client, m.endpoint); err == nil {
		s.Status = st
	}
	return s
}

// cpuSince is the etcd's CPU time between from and to, in seconds; -1
// when either is unknown.
func cpuSince(from, to etcdSample) float64 {
	if from.CPU < 0 || to.CPU < 0 {
		return -1
	}
	return math.Round((to.CPU-from.CPU).Seconds()*100) / 100
}

// processCPU returns the user + system CPU time process pid has used.
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("cpu time of %d: %w", pid, err)
	}
	return parseStatCPU(string(data))
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/PID/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from its closing parenthesis.
func parseStatCPU(stat string) (time.Duration, error) {
	end := strings.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, fmt.Errorf("parse /proc stat %.40q: no ')'", stat)
	}
	fields := strings.Fields(stat[end+1:]) // fields[0] is field 3, the state
	if len(fields) < 13 {
		return 0, fmt.Errorf("parse /proc stat: %d fields after the name, want at least 13", len(fields))
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse /proc stat: %w", err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
