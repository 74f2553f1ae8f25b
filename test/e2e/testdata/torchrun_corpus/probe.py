"""The torchrun corpus probe (test/e2e/torchrun_corpus_test.go).

Each rank joins a gloo process group over env:// (MASTER_ADDR, MASTER_PORT,
RANK, WORLD_SIZE from the launcher), all-reduces rank+1, and prints one JSON
line saying what it saw. With $CORPUS_OUT set it also appends that line to
CORPUS_OUT/rank-<RANK>.jsonl, so a test can count each rank's runs even when
the launcher sends worker output only to log files (--redirects).
"""

import json
import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
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
        "allreduce": t.item(),
    }
    line = json.dumps(rec)
    print(line, flush=True)
    out = os.environ.get("CORPUS_OUT")
    if out:
        with open(os.path.join(out, "rank-%d.jsonl" % rank), "a") as f:
            f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
