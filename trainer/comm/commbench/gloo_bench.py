"""One rank of the gloo side of `gorun bench comm`.

argv[1]: comma-separated op:bytes:iters specs. Rendezvous is env://
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE). Rank 0 prints one JSON line
per spec: {"op", "bytes", "iters", "seconds"} or {"op", "bytes", "error"}.
"""
import json
import sys
import time

import torch
import torch.distributed as dist


def run(op, nbytes, iters, n):
    if op == "allreduce":
        buf = torch.ones(nbytes // 4)
        call = lambda: dist.all_reduce(buf)
    elif op == "allgather":
        inp = torch.ones(nbytes // 4 // n)
        out = list(torch.zeros(inp.numel() * n).chunk(n))
        call = lambda: dist.all_gather(out, inp)
    elif op == "reducescatter":
        out = torch.zeros(nbytes // 4 // n)
        inp = list(torch.ones(out.numel() * n).chunk(n))
        call = lambda: dist.reduce_scatter(out, inp)
    else:
        raise RuntimeError("unknown op " + op)
    call()  # warm up (also where an unsupported op fails, on every rank alike)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    for spec in sys.argv[1].split(","):
        op, nbytes, iters = spec.split(":")
        nbytes, iters = int(nbytes), int(iters)
        rec = {"op": op, "bytes": nbytes, "iters": iters}
        try:
            rec["seconds"] = run(op, nbytes, iters, n)
        except RuntimeError as e:
            rec["error"] = str(e).splitlines()[0]
        if rank == 0:
            print(json.dumps(rec), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
