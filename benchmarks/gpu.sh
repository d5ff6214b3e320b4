#!/usr/bin/env bash
# The GPU run, ready to go: at most 8.5 minutes on one CUDA GPU, four stages, each printed as it runs.
#
#   1. The position-only layer against its peers: the shared dense form, FlexAttention compiled
#      with the Gaussian as score_mod (forward and backward: FlexAttention has a CUDA backward),
#      the naive per-image form and the projection floor, at the paper's size, 32x32 and 64x64,
#      in float32 and under bf16 autocast (benchmarks/attention.py --sections peers).
#   2. The content model's training step: the content kernel against scaled_dot_product_attention
#      with the relative positional logits as its mask, float32 and bf16
#      (benchmarks/train.py, content comparison of the paper-size learned-content preset).
#   3. One epoch (50,000 images, batch 100) of the paper-size learned and quadratic models on
#      synthetic CIFAR-shaped data in bf16, eager and under torch.compile (benchmarks/epoch.py).
#   4. A one-GPU NCCL DDP smoke run: torchrun with one process trains the quick preset on the
#      embedded digits under DistributedDataParallel for one epoch; its start line must name nccl.
#
# Usage: benchmarks/gpu.sh [--dry-run]
#   --dry-run   the same four stages on the CPU at toy sizes (gloo instead of NCCL): a rehearsal
#               that checks the script and its commands, not a measurement.
# Environment: PYTHON (default python3) runs everything; the checkout's src/ is put first on
# PYTHONPATH, so the code measured is this checkout's, installed or not.
# Without a GPU (and without --dry-run) it prints one line and exits with status 2.
set -euo pipefail

dry_run=0
for argument in "$@"; do
    case "$argument" in
        --dry-run) dry_run=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "benchmarks/gpu.sh: unknown argument '$argument' (expected --dry-run or --help)" >&2
           exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

if [ "$dry_run" = 1 ]; then
    device=cpu
    peers=(--sizes paper --batch 2 --repeats 1 --precision bf16)
    content=(--content-preset learned-content-fashion --batch-size 4 --steps 1 --warmup 1
             --content-rounds 1)
    epoch=(--presets quick --images 40 --batch-size 20 --warmup 1 --gemm-size 256)
    smoke=(model.hidden=16 model.depth=1 model.heads=2)
    limits=(600 600 600 600)
else
    if ! "$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
            2>/dev/null; then
        echo "benchmarks/gpu.sh: no CUDA GPU visible to $python (torch.cuda.is_available() is" \
             "False or torch is missing); nothing was run: use --dry-run to rehearse on the CPU" >&2
        exit 2
    fi
    device=cuda
    peers=(--repeats 5 --precision bf16)
    content=(--content-preset learned-content --steps 5 --warmup 2 --content-rounds 2)
    epoch=()
    smoke=()
    limits=(150 60 240 60)  # seconds per stage: no stage eats the others' time; 8.5 minutes in all
fi

started=$SECONDS
stage() {
    echo
    echo "== stage $1 ($((SECONDS - started)) s in): $2"
}
# Each stage runs under its time limit (the first argument, seconds); a stage that runs out is
# reported and the next one runs.
limited() {
    local limit=$1 status=0
    shift
    timeout "$limit" "$@" || status=$?
    if [ "$status" = 124 ]; then
        echo "benchmarks/gpu.sh: stopped at the stage limit of $limit s: $*"
    elif [ "$status" != 0 ]; then
        echo "benchmarks/gpu.sh: failed with status $status: $*"
        failed=1
    fi
}
failed=0

stage 1/4 "position-only layer vs shared dense, FlexAttention, naive, projection floor"
limited "${limits[0]}" "$python" benchmarks/attention.py --sections peers --device "$device" "${peers[@]}"

stage 2/4 "content model: content kernel vs SDPA with the relative positional mask"
limited "${limits[1]}" "$python" benchmarks/train.py --presets --device "$device" "${content[@]}"

stage 3/4 "one epoch of paper-size models on synthetic CIFAR-shaped data, bf16, eager and compiled"
limited "${limits[2]}" "$python" benchmarks/epoch.py --device "$device" "${epoch[@]}"

stage 4/4 "one-process torchrun: DDP smoke run"
smoke_dir=$(mktemp -d)
trap 'rm -rf "$smoke_dir"' EXIT
smoke_log="$smoke_dir/train.log"
limited "${limits[3]}" "$python" -m torch.distributed.run --standalone --nproc_per_node 1 -m attnconv train \
    --preset quick --dataset digits --epochs 1 --device "$device" --out "$smoke_dir/run" \
    tensorboard=false progress=false "${smoke[@]}" 2>&1 | tee "$smoke_log"
backend=$([ "$device" = cuda ] && echo nccl || echo gloo)
if grep -q "device $device.* x1 (DDP, $backend)" "$smoke_log" \
        && [ -f "$smoke_dir/run/checkpoints/last.pt" ]; then
    echo "DDP smoke run: trained one epoch under DDP with $backend and wrote its checkpoint"
else
    echo "benchmarks/gpu.sh: the DDP smoke run did not train under DDP with $backend (log above)"
    failed=1
fi

echo
echo "== done in $((SECONDS - started)) s$([ "$failed" = 1 ] && echo ", with failures above")"
exit "$failed"
