package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/test/harness"
)

// corpusLine is one torchrun command line in a shape found in public
// repositories, run with gorun in torchrun's place.
//
// Placeholders, replaced word by word: {probe} the probe script's path,
// {python} the interpreter with torch, {port} a free loopback port (with
// the next one free too: a c10d endpoint's etcd peers at port+1), {node}
// the agent's node rank, {tmp} a fresh directory. Words are split at
// blanks; '...' and "..." quote (no escapes).
type corpusLine struct {
	name string
	// src is where the shape comes from.
	src string
	// line starts with the launcher: "torchrun" or "python -m
	// torch.distributed.run", either of which becomes gorun.
	line string
	// env is set in each agent's environment (placeholders too).
	env []string
	// nodes is how many agents run the line at once on this host (0: 1).
	nodes int
	// world is the world size the ranks must see.
	world int
	// nproc is the workers per agent (for torchrun's OMP_NUM_THREADS rule).
	nproc int
	// master, if set, is the MASTER_ADDR every rank must see; masterPort
	// says MASTER_PORT must be {port} (a static rendezvous at a given port).
	master     string
	masterPort bool
	// console is which local ranks' output reaches the console: "" every
	// rank's, "none" (--redirects without --tee), or a --local-ranks-filter
	// list such as "0".
	console string
	// logs says {tmp} is the --log-dir: each rank's output must be in a
	// stdout.log under it, once.
	logs bool
	// argv, if set, is what the probe must see after its own name (else
	// the line's words after the word naming the probe).
	argv []string
	// warn are strings every agent's log must hold: the warnings of what
	// torchrun ignores.
	warn []string
	// refuse, if set, says torchrun refuses the line: gorun must exit 2
	// with this in its error, having started no rank.
	refuse string
	// noGPU says the line means a machine without GPUs: it is skipped on
	// one with GPU devices.
	noGPU bool
	// skip names the gorun bug that keeps this line from running.
	skip string
}

// corpus holds the lines; kept small (1-2 agents x 1-2 workers) so that the
// whole corpus runs in about a minute on two cores.
var corpus = []corpusLine{
	{
		name: "ddp-series-standalone",
		src:  "pytorch/examples distributed/ddp-tutorial-series README: torchrun --standalone --nproc_per_node=4 multigpu_torchrun.py 50 10",
		line: "torchrun --standalone --nproc_per_node=2 {probe} 50 10", world: 2, nproc: 2,
	},
	{
		name:  "ddp-tutorial-elastic",
		src:   "pytorch/tutorials intermediate_source/ddp_tutorial.rst: torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29400 elastic_ddp.py",
		line:  "torchrun --nnodes=1 --nproc_per_node=2 --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:{port} {probe}",
		world: 2, nproc: 2,
	},
	{
		name:  "multinode-tutorial-sbatch",
		src:   "pytorch/examples distributed/ddp-tutorial-series slurm/sbatch_run.sh: srun torchrun --nnodes 4 --nproc_per_node 1 --rdzv_id $RANDOM --rdzv_backend c10d --rdzv_endpoint $head_node_ip:29500 multinode.py 50 10",
		line:  "torchrun --nnodes 2 --nproc_per_node 1 --rdzv_id 4242 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:{port} {probe} 50 10",
		nodes: 2, world: 2, nproc: 1,
	},
	{
		name:  "multinode-c10d-no-rdzv-id",
		src:   "torch/distributed/run.py docs (--rdzv-id defaults to none): torchrun --nnodes=$NUM_NODES --nproc-per-node=$NUM_TRAINERS --rdzv-backend=c10d --rdzv-endpoint=$HOST_NODE_ADDR YOUR_TRAINING_SCRIPT.py",
		line:  "torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port} {probe} --arg1 x",
		nodes: 2, world: 2, nproc: 1,
	},
	{
		name:  "c10d-two-nodes-two-procs",
		src:   "yukiman76/LLM base/llmfs/train_ddp.sh: torchrun --nnodes=2 --nproc_per_node=8 --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29400 llfs_train.py",
		line:  "torchrun --nnodes=2 --nproc_per_node=2 --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint=localhost:{port} {probe}",
		nodes: 2, world: 4, nproc: 2,
	},
	{
		name:  "torchtitan-run-train",
		src:   "pytorch/torchtitan run_train.sh: torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint=\"localhost:0\" --local-ranks-filter ${LOG_RANK} --role rank --tee 3 -m torchtitan.train --job.config_file ${CONFIG_FILE} \"$@\"",
		line:  `torchrun --nproc_per_node=2 --rdzv_backend c10d --rdzv_endpoint="localhost:0" --local-ranks-filter 0 --role rank --tee 3 -m probepkg.train --job.config_file ./torchtitan/models/llama3/train_configs/debug_model.toml --training.steps 10`,
		world: 2, nproc: 2, console: "0",
	},
	{
		name:  "torchtitan-run-llama-train-older",
		src:   "pytorch/torchtitan run_llama_train.sh (2024): torchrun --nproc_per_node=${NGPU} --rdzv_backend c10d --rdzv_endpoint=\"localhost:0\" --local-ranks-filter ${LOG_RANK} --role rank --tee 3 train.py --job.config_file ${CONFIG_FILE} $overrides",
		line:  `torchrun --nproc_per_node=2 --rdzv_backend c10d --rdzv_endpoint="localhost:0" --local-ranks-filter 0,1 --role rank --tee 3 {probe} --job.config_file ./train_configs/debug_model.toml`,
		world: 2, nproc: 2,
	},
	{
		name:  "megatron-distributed-args",
		src:   "NVIDIA/Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh: DISTRIBUTED_ARGS=(--nproc_per_node $GPUS_PER_NODE --nnodes $NUM_NODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR --master_port $MASTER_PORT); torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ...",
		line:  "torchrun --nproc_per_node 1 --nnodes 2 --node_rank {node} --master_addr localhost --master_port {port} {probe} --tensor-model-parallel-size 1 --num-layers 24 --lr 0.00015 --data-path my-gpt2_text_document --split 949,50,1",
		nodes: 2, world: 2, nproc: 1, master: "localhost", masterPort: true,
	},
	{
		name:  "megatron-single-node",
		src:   "Megatron-LM forks' pretrain scripts (search: torchrun $DISTRIBUTED_ARGS pretrain_gpt.py with DISTRIBUTED_ARGS=\"--master_port $MASTER_PORT\")",
		line:  "torchrun --nproc_per_node 2 --master_port {port} {probe} --sequence-parallel --distributed-backend nccl --load ./aaa --save ./aaa",
		world: 2, nproc: 2, masterPort: true,
	},
	{
		name:  "python-m-torch-distributed-run",
		src:   "Megatron-LM forks and timm's distributed_train.sh moved from python -m torch.distributed.launch to python -m torch.distributed.run --nproc_per_node=$NUM_PROC train.py \"$@\"",
		line:  "python -m torch.distributed.run --nproc_per_node=2 --master_port={port} {probe} --config configs/pretrain_gpt2_wikitext.yaml",
		world: 2, nproc: 2, masterPort: true,
	},
	{
		name:  "python-m-torch-distributed-run-two-nodes",
		src:   "flash-attention / NeMo style multi-node python -m torch.distributed.run --nnodes=$NNODES --node_rank=$RANK --nproc_per_node=8 --master_addr=$ADDR --master_port=$PORT tools/run_pretraining.py \"$@\"",
		line:  "python -m torch.distributed.run --nnodes=2 --node_rank={node} --nproc_per_node=1 --master_addr=127.0.0.1 --master_port={port} {probe} --distributed",
		nodes: 2, world: 2, nproc: 1, master: "127.0.0.1", masterPort: true,
	},
	{
		name:  "hf-transformers-examples",
		src:   "huggingface/transformers examples/pytorch/README.md: torchrun --nproc_per_node 8 pytorch/language-modeling/run_clm.py --model_name_or_path openai-community/gpt2 ...",
		line:  "torchrun --nproc_per_node 2 {probe} --model_name_or_path openai-community/gpt2 --dataset_name wikitext --dataset_config_name wikitext-2-raw-v1 --per_device_train_batch_size 8 --do_train --output_dir /tmp/test-clm",
		world: 2, nproc: 2,
	},
	{
		name:  "hf-accelerate-examples-multinode",
		src:   "huggingface/accelerate examples/README.md: torchrun --nproc_per_node 2 --nnodes 2 --rdzv_id 2299 --rdzv_backend c10d --rdzv_endpoint master_node_ip_address:29500 ./nlp_example.py",
		line:  "torchrun --nproc_per_node 1 --nnodes 2 --rdzv_id 2299 --rdzv_backend c10d --rdzv_endpoint 127.0.0.1:{port} {probe}",
		nodes: 2, world: 2, nproc: 1,
	},
	{
		name: "cuda-visible-devices-prefix",
		src:  "a train_clm.sh (code search): CUDA_VISIBLE_DEVICES=3,2,1,0 torchrun --master-port=9088 --nproc_per_node=4 train_clm.py --trainer_class=trainer --do_train --overwrite_output_dir=True",
		line: "torchrun --master-port={port} --nproc_per_node=2 {probe} --trainer_class=trainer --do_train --overwrite_output_dir=True",
		env:  []string{"CUDA_VISIBLE_DEVICES=3,2,1,0"}, world: 2, nproc: 2, masterPort: true,
	},
	{
		name: "omp-num-threads-prefix",
		src:  "a run script (code search): OMP_NUM_THREADS=1 torchrun --nnodes 1 --nproc_per_node 4 --rdzv_id ${id} --rdzv_backend c10d --rdzv_endpoint ${rendezvous_server}:29500 $@",
		line: "torchrun --nnodes 1 --nproc_per_node 2 --rdzv_id 31337 --rdzv_backend c10d --rdzv_endpoint localhost:{port} {probe}",
		env:  []string{"OMP_NUM_THREADS=3"}, world: 2, nproc: 2,
	},
	{
		name:  "cuda-and-omp-exported",
		src:   "tangjzh/LAH train.sh: export CUDA_VISIBLE_DEVICES=0,1,...; export MASTER_ADDR=localhost; export MASTER_PORT=25002; torchrun --nproc_per_node=$WORLD_SIZE train.py",
		line:  "torchrun --nproc_per_node=2 {probe}",
		env:   []string{"CUDA_VISIBLE_DEVICES=0,1", "OMP_NUM_THREADS=2", "MASTER_ADDR=localhost", "MASTER_PORT=25002", "WORLD_SIZE=2", "LOCAL_RANK=0"},
		world: 2, nproc: 2,
	},
	{
		name:  "kubeflow-pet-static",
		src:   "kubeflow/training-operator PyTorchJob: the operator sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT and the container runs torchrun train.py",
		line:  "torchrun {probe} --epochs 1",
		env:   []string{"PET_NNODES=2", "PET_NPROC_PER_NODE=1", "PET_NODE_RANK={node}", "PET_MASTER_ADDR=127.0.0.1", "PET_MASTER_PORT={port}"},
		nodes: 2, world: 2, nproc: 1, master: "127.0.0.1", masterPort: true,
	},
	{
		name:  "kubeflow-pet-elastic",
		src:   "kubeflow/training-operator elastic PyTorchJob: PET_RDZV_BACKEND=c10d, PET_RDZV_ENDPOINT, PET_RDZV_ID, PET_NNODES, PET_NPROC_PER_NODE; torchrun train.py",
		line:  "torchrun {probe}",
		env:   []string{"PET_RDZV_BACKEND=c10d", "PET_RDZV_ENDPOINT=127.0.0.1:{port}", "PET_RDZV_ID=elastic-job", "PET_NNODES=2", "PET_NPROC_PER_NODE=1", "PET_MAX_RESTARTS=3", "PET_MONITOR_INTERVAL=5"},
		nodes: 2, world: 2, nproc: 1,
	},
	{
		name:  "fault-tolerant-flags",
		src:   "torch/distributed/run.py docs, fault tolerant: torchrun --nnodes=$NUM_NODES --nproc-per-node=$NUM_TRAINERS --max-restarts=3 --rdzv-id=$JOB_ID --rdzv-backend=c10d --rdzv-endpoint=$HOST_NODE_ADDR YOUR_TRAINING_SCRIPT.py",
		line:  "torchrun --nnodes=1 --nproc-per-node=2 --max-restarts=3 --monitor-interval=5 --rdzv-id=job7 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port} {probe}",
		world: 2, nproc: 2,
	},
	{
		name:  "stacked-single-node",
		src:   "torch/distributed/run.py docs, stacked single-node multi-worker: torchrun --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=$NUM_TRAINERS YOUR_TRAINING_SCRIPT.py",
		line:  "torchrun --rdzv-backend=c10d --rdzv-endpoint=localhost:0 --nnodes=1 --nproc-per-node=2 {probe} --arg1 --arg2",
		world: 2, nproc: 2,
	},
	{
		name:  "start-method-spawn",
		src:   "torch/distributed/run.py --start-method {spawn,fork,forkserver}, as in torchx dist.ddp's generated command lines",
		line:  "torchrun --standalone --nproc-per-node=2 --start-method=spawn {probe}",
		world: 2, nproc: 2,
	},
	{
		name:  "redirects-tee-short",
		src:   "torch/distributed/run.py -r/--redirects and -t/--tee with --log-dir (torchx's dist.ddp passes --tee 3)",
		line:  "torchrun --standalone --nproc_per_node=2 --log-dir {tmp} -r 3 -t 3 {probe}",
		world: 2, nproc: 2, logs: true,
	},
	{
		name:  "redirects-to-log-dir",
		src:   "torch/distributed/run.py: --redirects 3 --log_dir sends worker output only to log files",
		line:  "torchrun --nnodes=1 --nproc_per_node=2 --redirects 3 --log_dir {tmp} --max_restarts=0 {probe}",
		world: 2, nproc: 2, console: "none", logs: true,
	},
	{
		name:  "run-path",
		src:   "torch/distributed/run.py --run-path: run the training script with runpy.run_path",
		line:  "torchrun --standalone --nproc-per-node=2 --run-path {probe} --seed 1",
		world: 2, nproc: 2,
	},
	{
		name:  "no-python",
		src:   "torch/distributed/run.py --no-python, as in launch scripts that run torchrun --no-python python3 train.py or a shell wrapper",
		line:  "torchrun --standalone --nproc_per_node=2 --no-python {python} {probe} --flag value",
		world: 2, nproc: 2,
	},
	{
		name:  "module-hydra-overrides",
		src:   "hydra-style research repos: torchrun --nproc_per_node=8 -m train experiment=... trainer.devices=8 'model.name=...'",
		line:  "torchrun --standalone --nproc_per_node=2 -m probe experiment=gpt2 trainer.devices=2 'model.name=a b' +seed=1 hydra.run.dir=outputs/${now:%H-%M}",
		world: 2, nproc: 2,
	},
	{
		name:  "launcher-flags-after-script",
		src:   "every script that takes its own --nproc_per_node/--master_port/-m/--local-rank style flags: they follow the script and are the script's",
		line:  "torchrun --standalone --nproc_per_node=1 {probe} --nproc_per_node=8 --master_port 1 -m x --local-rank=0 '' 'a b' --",
		world: 1, nproc: 1,
	},
	{
		name:  "double-dash-before-script",
		src:   "iluvn01/VFMTok scripts/autoregressive/torchrun.sh: torchrun --nproc_per_node $PROC_PER_NODE --master_addr $MASTER_ADDR --master_port ${MASTER_PORT:-5678} --nnodes $NODE_COUNT --node_rank $NODE_RANK -- ${@:1}",
		line:  "torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port {port} --nnodes 1 --node_rank 0 -- {probe} --cfg x.yaml",
		world: 2, nproc: 2, master: "127.0.0.1", masterPort: true,
	},
	{
		name:  "static-hyphen-spelling",
		src:   "torch/distributed/run.py docs (PyTorch 2.x hyphen spelling): torchrun --nproc-per-node=N --nnodes=1 --node-rank=0 --master-addr=... --master-port=...",
		line:  "torchrun --nproc-per-node=2 --nnodes=1 --node-rank=0 --master-addr=127.0.0.1 --master-port={port} {probe}",
		world: 2, nproc: 2, master: "127.0.0.1", masterPort: true,
	},
	{
		name: "python-exec",
		src:  "torch/distributed/run.py: PYTHON_EXEC overrides the workers' interpreter (sys.executable)",
		line: "torchrun --standalone --nproc_per_node=1 {probe}",
		env:  []string{"PYTHON_EXEC={python}"}, world: 1, nproc: 1,
	},
	{
		name:  "module-dash-dash-args",
		src:   "karpathy/nanochat speedrun.sh: torchrun --standalone --nproc_per_node=8 -m scripts.base_train -- --depth=20 --run=$WANDB_RUN (torchrun's argparse drops the -- after the module; a later one stays)",
		line:  "torchrun --standalone --nproc_per_node=2 -m probe -- --depth=20 --run=dummy -- --kept",
		argv:  []string{"--depth=20", "--run=dummy", "--", "--kept"},
		world: 2, nproc: 2,
	},
	{
		name:  "static-default-abbreviated",
		src:   "a launch script (code search): torchrun --rdzv_endpoint $MASTER_ADDR:$MASTER_PORT --nnode $nnode --nproc_per_node $npn --node_rank $NODE_RANK $script: no --rdzv_backend is torchrun's static, the endpoint its master; --nnode is argparse's abbreviation of --nnodes",
		line:  "torchrun --rdzv_endpoint 127.0.0.1:{port} --nnode 2 --nproc_per_node 1 --node_rank {node} {probe}",
		nodes: 2, world: 2, nproc: 1, master: "127.0.0.1", masterPort: true,
	},
	{
		name:  "static-default-hyphen-rdzv-id",
		src:   "a k8s indexed-job script (code search): torchrun --nnodes=$NNODES --nproc-per-node=$NPROC_PER_NODE --node-rank=$RANK --rdzv-id=$RDVZ_ID --rdzv-endpoint=$ENDPOINT train.py $@",
		line:  "torchrun --nnodes=2 --nproc-per-node=1 --node-rank={node} --rdzv-id=125 --rdzv-endpoint=127.0.0.1:{port} {probe} --epochs 1",
		nodes: 2, world: 2, nproc: 1, master: "127.0.0.1", masterPort: true,
	},
	{
		name:  "abbreviated-flags",
		src:   "argparse abbreviations torchrun takes: --nproc for --nproc_per_node (torch 1.x; 2.x's argparse finds it ambiguous between its two spellings of one flag), --redirect for --redirects, --max_r for --max_restarts",
		line:  "torchrun --standa --nproc=2 --redirect=3 --log_d {tmp} --max_r=0 {probe}",
		world: 2, nproc: 2, console: "none", logs: true,
	},
	{
		name:   "nproc-gpu-without-gpus",
		src:    "torchrun --nproc_per_node=gpu with CUDA_VISIBLE_DEVICES exported (Megatron/LLaVA-style run scripts) on a machine without a GPU: torchrun fails, ValueError: Cuda is not available.",
		line:   "torchrun --standalone --nproc_per_node=gpu {probe}",
		env:    []string{"CUDA_VISIBLE_DEVICES=0,1"},
		refuse: "--nproc-per-node=gpu: CUDA_VISIBLE_DEVICES=0,1 lists GPUs, but this machine has none", noGPU: true,
	},
	{
		name:  "rdzv-conf-quoted-c10d-elastic",
		src:   "pytorch test/distributed/launcher/run_test.py: --nnodes=1:2 --rdzv-backend=c10d \"--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'\" (a Python list: the quotes reach torchrun, which ignores the keys it does not know, 'join_timeout among them)",
		line:  `torchrun --nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=localhost:{port} "--rdzv-conf='join_timeout=5,last_call_timeout=1,timeout=5'" --rdzv-id=run1 --monitor-interval=1 --start-method=spawn {probe} --touch-file-dir={tmp}`,
		world: 2, nproc: 2,
		warn: []string{"'join_timeout", "ignored, as torchrun ignores it", "timeout=5' ignored, as torchrun's c10d rendezvous ignores it"},
	},
	{
		name:  "rdzv-conf-timeout-c10d",
		src:   "torchrun --nnodes=1:2 --rdzv_backend=c10d --rdzv_conf=timeout=...: torchrun's c10d rendezvous reads join_timeout, not timeout, so one agent of 1:2 waits out the last call and runs",
		line:  "torchrun --nnodes=1:2 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=localhost:{port} --rdzv_conf=timeout=1,last_call_timeout=2 {probe}",
		world: 2, nproc: 2,
		warn: []string{"timeout=1 ignored, as torchrun's c10d rendezvous ignores it"},
	},
	{
		name:  "rdzv-conf-c10d-keys",
		src:   "torchrun's c10d --rdzv-conf keys (read_timeout, join_timeout, last_call_timeout), as NeMo/torchx launchers pass them",
		line:  "torchrun --nnodes=1 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=localhost:{port} --rdzv_conf=join_timeout=900,read_timeout=300 {probe}",
		world: 2, nproc: 2,
	},
}

// TestTorchrunCorpus runs each corpus line with gorun in torchrun's place
// against the probe script (a real gloo all-reduce over env://) and checks
// what every rank saw: exit 0, each rank exactly once, the world size, one
// master for all, the arguments intact, the user's CUDA_VISIBLE_DEVICES and
// OMP_NUM_THREADS kept (else OMP_NUM_THREADS=1 for more than one worker, as
// torchrun). Multi-node lines run several agents at once on this host.
func TestTorchrunCorpus(t *testing.T) {
	python := torch.Require(t)
	probeDir := filepath.Join(moduleRoot, "test", "e2e", "testdata", "torchrun_corpus")
	if len(corpus) < 25 {
		t.Fatalf("the corpus has %d lines, want at least 25", len(corpus))
	}
	for _, c := range corpus {
		t.Run(c.name, func(t *testing.T) {
			if c.skip != "" {
				t.Skip(c.skip)
			}
			if c.noGPU && machineHasGPU() {
				t.Skip("the line means a machine without GPUs; this one has some")
			}
			t.Parallel()
			runCorpusLine(t, c, python, probeDir)
		})
	}
}

func runCorpusLine(t *testing.T, c corpusLine, python, probeDir string) {
	t.Logf("shape from %s", c.src)
	nodes := max(c.nodes, 1)
	port := freePortPair(t, "127.0.0.1")
	out, tmp := t.TempDir(), t.TempDir()
	subst := func(s string, node int) string {
		return strings.NewReplacer(
			"{probe}", filepath.Join(probeDir, "probe.py"), "{python}", python,
			"{port}", strconv.Itoa(port), "{node}", strconv.Itoa(node), "{tmp}", tmp,
		).Replace(s)
	}
	words, err := splitWords(c.line)
	if err != nil {
		t.Fatal(err)
	}
	switch {
	case len(words) > 0 && words[0] == "torchrun":
		words = words[1:]
	case len(words) > 2 && strings.Join(words[:3], " ") == "python -m torch.distributed.run":
		words = words[3:]
	default:
		t.Fatalf("line %q does not start with torchrun or python -m torch.distributed.run", c.line)
	}
	// The probe's own arguments: every word after the entrypoint (the
	// first word naming the probe).
	var wantArgs []string
	for i, w := range words {
		if strings.Contains(w, "probe") {
			wantArgs = append([]string{}, words[i+1:]...)
			break
		}
	}
	if c.argv != nil {
		wantArgs = c.argv
	}
	for i := range wantArgs {
		wantArgs[i] = subst(wantArgs[i], 0)
	}
	// Every agent starts with no inherited launcher or worker settings but
	// the line's own: the test's environment must not leak into the line.
	base := []string{
		"GLOO_SOCKET_IFNAME=lo", "CORPUS_OUT=" + out, "PYTHONPATH=" + probeDir,
		"CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK",
	}
	// The lines of several agents all-reduce in a real gloo process group;
	// the others over plain sockets at the same MASTER_ADDR:MASTER_PORT (the
	// probe's doc): importing torch costs each rank about 3 s of CPU, the
	// most of this test's time, and proves nothing more about the line's
	// arguments and environment.
	if c.nodes > 1 {
		base = append(base, "CORPUS_TORCH=1")
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "PET_") || strings.HasPrefix(k, "SLURM_") || strings.HasPrefix(k, "GORUN_") {
			base = append(base, k)
		}
	}
	agents := make([]*gorunProc, nodes)
	var console strings.Builder
	for node := range agents {
		env := append([]string{}, base...)
		for _, e := range c.env {
			env = append(env, subst(e, node))
		}
		args := make([]string, len(words))
		for i, w := range words {
			args[i] = subst(w, node)
		}
		agents[node] = startGorun(t, fmt.Sprintf("node%d", node), env, args...)
	}
	for node, a := range agents {
		r := a.wait()
		switch {
		case c.refuse != "":
			if r.ExitCode != 2 || !strings.Contains(r.Stderr, c.refuse) {
				t.Errorf("node %d: exit %d, want 2 and %q, as torchrun refuses this line:\n%s", node, r.ExitCode, c.refuse, harness.Tail(r.Stderr, 20))
			}
		case r.ExitCode != 0:
			t.Errorf("node %d: exit %d, want 0:\n%s", node, r.ExitCode, harness.Tail(r.Stderr, 20))
		}
		for _, w := range c.warn {
			if !strings.Contains(r.Stderr, w) {
				t.Errorf("node %d: its log does not warn %q:\n%s", node, w, harness.Tail(r.Stderr, 20))
			}
		}
		console.WriteString(r.Stdout)
	}
	if c.refuse != "" {
		if files, _ := filepath.Glob(filepath.Join(out, "rank-*.jsonl")); len(files) > 0 {
			t.Errorf("a refused line started ranks: %v", files)
		}
		return
	}
	if t.Failed() {
		return
	}
	recs := checkCorpusRanks(t, c, out, port, wantArgs)
	checkCorpusOutput(t, c, recs, console.String(), tmp)
}

// checkCorpusOutput checks where the ranks' output went: the console
// (gorun's stdout, "[host:rank] " prefixed) shows each shown rank's line
// once and no other rank's; with logs, a stdout.log under logDir holds
// each rank's line once.
func checkCorpusOutput(t *testing.T, c corpusLine, recs map[int]probeRecord, console, logDir string) {
	t.Helper()
	shown := func(r probeRecord) bool {
		switch c.console {
		case "":
			return true
		case "none":
			return false
		}
		return slices.Contains(strings.Split(c.console, ","), r.LocalRank)
	}
	seen := map[int]int{}
	for _, l := range workerLines(console) {
		var r probeRecord
		if json.Unmarshal([]byte(l.Text), &r) == nil && l.Rank == r.Rank {
			seen[r.Rank]++
		}
	}
	for rank, r := range recs {
		if want := map[bool]int{true: 1, false: 0}[shown(r)]; seen[rank] != want {
			t.Errorf("rank %d (local rank %s): its line is on the console %d times, want %d (console %q)",
				rank, r.LocalRank, seen[rank], want, c.console)
		}
	}
	if !c.logs {
		return
	}
	logged := map[int]int{}
	err := filepath.WalkDir(logDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "stdout.log" {
			return err
		}
		raw, err := os.ReadFile(path)
		for _, l := range nonEmptyLines(string(raw)) {
			var r probeRecord
			if json.Unmarshal([]byte(l), &r) == nil {
				logged[r.Rank]++
			}
		}
		return err
	})
	if err != nil {
		t.Errorf("reading the log dir: %v", err)
	}
	for rank := range recs {
		if logged[rank] != 1 {
			t.Errorf("rank %d: its line is in the stdout.log files under --log-dir %d times, want once", rank, logged[rank])
		}
	}
}

// probeRecord is one line of the probe's output.
type probeRecord struct {
	Rank               int      `json:"rank"`
	WorldSize          int      `json:"world_size"`
	EnvRank            string   `json:"env_rank"`
	LocalRank          string   `json:"local_rank"`
	MasterAddr         string   `json:"master_addr"`
	MasterPort         string   `json:"master_port"`
	Argv               []string `json:"argv"`
	CUDAVisibleDevices *string  `json:"cuda_visible_devices"`
	OMPNumThreads      *string  `json:"omp_num_threads"`
	AllReduce          float64  `json:"allreduce"`
}

// checkCorpusRanks checks the probe's records in out against line c and
// returns them by rank.
func checkCorpusRanks(t *testing.T, c corpusLine, out string, port int, wantArgs []string) map[int]probeRecord {
	t.Helper()
	recs := map[int]probeRecord{}
	files, _ := filepath.Glob(filepath.Join(out, "rank-*.jsonl"))
	sort.Strings(files)
	if len(files) != c.world {
		t.Errorf("%d ranks reported (%v), want %d", len(files), files, c.world)
	}
	want := func(env string) *string {
		for _, e := range c.env {
			if k, v, _ := strings.Cut(e, "="); k == env {
				return &v
			}
		}
		return nil
	}
	wantCVD, wantOMP := want("CUDA_VISIBLE_DEVICES"), want("OMP_NUM_THREADS")
	if wantOMP == nil && c.nproc > 1 {
		one := "1"
		wantOMP = &one
	}
	show := func(p *string) string {
		if p == nil {
			return "unset"
		}
		return strconv.Quote(*p)
	}
	var master string
	wantSum := float64(c.world * (c.world + 1) / 2)
	for rank := range c.world {
		raw, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank-%d.jsonl", rank)))
		if err != nil {
			t.Errorf("rank %d: %v", rank, err)
			continue
		}
		lines := nonEmptyLines(string(raw))
		if len(lines) != 1 {
			t.Errorf("rank %d ran %d times, want once:\n%s", rank, len(lines), raw)
			continue
		}
		var rec probeRecord
		if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
			t.Errorf("rank %d: %v: %s", rank, err, lines[0])
			continue
		}
		recs[rank] = rec
		if rec.WorldSize != c.world || rec.EnvRank != strconv.Itoa(rank) || rec.AllReduce != wantSum {
			t.Errorf("rank %d: world size %d, RANK=%s, all-reduce %v; want %d, %d, %v",
				rank, rec.WorldSize, rec.EnvRank, rec.AllReduce, c.world, rank, wantSum)
		}
		if lr, err := strconv.Atoi(rec.LocalRank); err != nil || lr < 0 || lr >= c.nproc {
			t.Errorf("rank %d: LOCAL_RANK=%q, want 0..%d", rank, rec.LocalRank, c.nproc-1)
		}
		addr := net.JoinHostPort(rec.MasterAddr, rec.MasterPort)
		switch {
		case rec.MasterAddr == "" || rec.MasterPort == "":
			t.Errorf("rank %d: MASTER_ADDR=%q MASTER_PORT=%q", rank, rec.MasterAddr, rec.MasterPort)
		case master == "":
			master = addr
		case addr != master:
			t.Errorf("rank %d: master %s, rank 0's %s", rank, addr, master)
		}
		if c.master != "" && rec.MasterAddr != c.master {
			t.Errorf("rank %d: MASTER_ADDR=%s, want %s", rank, rec.MasterAddr, c.master)
		}
		if c.masterPort && rec.MasterPort != strconv.Itoa(port) {
			t.Errorf("rank %d: MASTER_PORT=%s, want %d", rank, rec.MasterPort, port)
		}
		if len(rec.Argv) == 0 || !reflect.DeepEqual(append([]string{}, rec.Argv[1:]...), wantArgs) {
			t.Errorf("rank %d: sys.argv %q, want [<probe> %s]", rank, rec.Argv, strings.Join(quoteAll(wantArgs), " "))
		}
		if show(rec.CUDAVisibleDevices) != show(wantCVD) && wantCVD != nil {
			t.Errorf("rank %d: CUDA_VISIBLE_DEVICES %s, want the user's %s", rank, show(rec.CUDAVisibleDevices), show(wantCVD))
		}
		if show(rec.OMPNumThreads) != show(wantOMP) {
			t.Errorf("rank %d: OMP_NUM_THREADS %s, want %s", rank, show(rec.OMPNumThreads), show(wantOMP))
		}
	}
	return recs
}

// machineHasGPU says whether this machine has a GPU device file.
func machineHasGPU() bool {
	for _, p := range []string{"/dev/nvidia[0-9]*", "/dev/nvidiactl", "/dev/kfd"} {
		if m, _ := filepath.Glob(p); len(m) > 0 {
			return true
		}
	}
	return false
}

func quoteAll(ss []string) []string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return q
}

// splitWords splits a command line at blanks; '...' and "..." quote
// (without escapes), and adjacent quoted and bare parts join, as in sh.
func splitWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote rune
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c in %q", quote, line)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// TestTorchrunCorpusSplitWords pins the corpus's word splitting.
func TestTorchrunCorpusSplitWords(t *testing.T) {
	got, err := splitWords(`torchrun --x="localhost:0" '' 'a b' c'd'e`)
	want := []string{"torchrun", "--x=localhost:0", "", "a b", "cde"}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("splitWords: %q, %v; want %q", got, err, want)
	}
}
