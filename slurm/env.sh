# The week-4 article's production environment for 8 nodes x 8 GPUs, as one file to `source` in a job
# (e.g. launcher.setup='[source slurm/env.sh]'). ablate's own groups set the same variables per run:
# nccl=tuned and allocator=expandable; prefer those in ablations, so that baseline and treatment differ
# in exactly the knob under study. Every value below is the article's; when to change it is noted.

# CUDA caching allocator (week-4 C5): grow segments by mapping pages (cuMemMap) instead of allocating
# new blocks, and never split blocks above 128 MB. Cuts fragmentation under variable-length batches.
# Must be set before CUDA starts. PYTORCH_ALLOC_CONF is the current name, PYTORCH_CUDA_ALLOC_CONF the alias.
export PYTORCH_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128
export PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_ALLOC_CONF

# 0 = use InfiniBand/RoCE for inter-node traffic (1 forces TCP sockets: only to debug a fabric).
export NCCL_IB_DISABLE=0
# GPUDirect RDMA: NIC reads/writes GPU memory directly when GPU and NIC are within this PCIe distance
# (5 = SYS, i.e. always). Lower it if a node's topology makes GDR slower than staging through host memory.
export NCCL_NET_GDR_LEVEL=5
# 8 MiB buffers per channel (default 4 MiB): more bytes in flight for large all-reduces; costs GPU memory.
export NCCL_BUFFSIZE=8388608
# Force the ring algorithm (NCCL otherwise picks ring/tree per message size). Ring gives the best
# bandwidth for large gradient buckets; tree wins on latency at many nodes and small messages: measure.
export NCCL_ALGO=RING
# Turn a hung or failed collective into an error instead of a silent hang. Newer PyTorch reads the
# TORCH_-prefixed name; the old one is kept for older releases.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=1
export NCCL_ASYNC_ERROR_HANDLING=1
# One hardware work queue per GPU, so kernels launch in issue order: what Megatron-style overlap of
# communication and compute relies on. Can reduce concurrency for other workloads.
export CUDA_DEVICE_MAX_CONNECTIONS=1
