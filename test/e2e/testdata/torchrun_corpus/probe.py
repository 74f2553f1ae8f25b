"""The torchrun corpus probe (test/e2e/torchrun_corpus_test.go).

Each rank all-reduces rank+1 over the rendezvous the launcher gave it
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) and prints one JSON line saying
what it saw. With CORPUS_TORCH=1 it does so as PyTorch does: a gloo process
group over env://. Otherwise it does the same with plain sockets (rank 0
listens at MASTER_ADDR:MASTER_PORT, as torch's TCPStore does, the others
connect), which proves the same contract without importing torch (about 3 s
of CPU per rank). With $CORPUS_OUT set it also appends that line to
CORPUS_OUT/rank-<RANK>.jsonl, so a test can count each rank's runs even when
the launcher sends worker output only to log files (--redirects).
"""

import json
import os
import socket
import sys
import time


def torch_all_reduce():
    """All-reduce rank+1 in a gloo process group; returns (rank, world, sum)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return rank, world, t.item()


def socket_all_reduce(timeout=120.0):
    """All-reduce rank+1 through rank 0 at MASTER_ADDR:MASTER_PORT."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    deadline = time.monotonic() + timeout
    if rank == 0:
        with socket.create_server(addr, reuse_port=False) as srv:
            srv.settimeout(timeout)
            peers = [srv.accept()[0] for _ in range(world - 1)]
            total = 1.0 + sum(float(p.makefile().readline()) for p in peers)
            for p in peers:
                p.sendall(b"%r\n" % total)
                p.close()
        return rank, world, total
    while True:
        try:
            conn = socket.create_connection(addr, timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # rank 0 is not listening yet
    with conn:
        conn.settimeout(timeout)
        conn.sendall(b"%d\n" % (rank + 1))
        return rank, world, float(conn.makefile().readline())


def main():
    if os.environ.get("CORPUS_TORCH") == "1":
        rank, world, total = torch_all_reduce()
    else:
        rank, world, total = socket_all_reduce()
    rec = {
        "rank": rank,
        "world_size": world,
        "env_rank": os.environ.get("RANK"),
        "local_rank": os.environ.get("LOCAL_RANK"),
        "local_world_size": os.environ.get("LOCAL_WORLD_SIZE"),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
        "argv": sys.argv,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "allreduce": total,
    }
    line = json.dumps(rec)
    print(line, flush=True)
    out = os.environ.get("CORPUS_OUT")
    if out:
        with open(os.path.join(out, "rank-%d.jsonl" % rank), "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
