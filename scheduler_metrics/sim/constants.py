"""Every model/hardware constant of the simulator, in one place, with where it comes from.

The testbed modelled is the one the Vesta paper names: Qwen2.5-7B served on NVIDIA H20 GPUs, one
GPU per instance, 8 GPUs per node. Rates are derived from the model's config.json and the H20's
published specification with one stated efficiency assumption each (marked ASSUMPTION); none was
tuned after a comparison was run. docs/scheduling.md lists them again with the sweeps that show
which of them decide an outcome.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

# NVIDIA H20 (product brief): 148 TFLOPS dense BF16, 96 GB HBM3 at 4.0 TB/s, NVLink 900 GB/s
# (bidirectional), PCIe Gen5 x16 (64 GB/s per direction).
H20_BF16_FLOPS = 148e12
H20_HBM_BYTES_PER_S = 4.0e12
H20_HBM_BYTES = 96e9
H20_NVLINK_BYTES_PER_S = 450e9  # one direction of 900 GB/s
H20_PCIE_BYTES_PER_S = 64e9  # Gen5 x16, one direction

# Qwen2.5-7B config.json: 7.61e9 parameters, 28 layers, hidden 3584, 4 KV heads x 128 head dim, bf16.
QWEN7B_PARAMS = 7.61e9
QWEN7B_LAYERS = 28
QWEN7B_HIDDEN = 3584
QWEN7B_WEIGHT_BYTES = QWEN7B_PARAMS * 2
QWEN7B_KV_BYTES_PER_TOKEN = QWEN7B_LAYERS * 2 * 4 * 128 * 2  # layers x (K,V) x 4 KV heads x head dim 128 x bf16

# ASSUMPTION: prefill reaches 55% of peak BF16 FLOPs (model FLOPs utilization typical of
# vLLM/SGLang prefill on Hopper-class GPUs for 7B models); decode reaches 70% of HBM bandwidth.
PREFILL_MFU = 0.55
DECODE_BW_EFFICIENCY = 0.70


@dataclass(frozen=True)
class ModelConstants:
    # KV bytes per token: 28 layers x 2 (K,V) x 4 KV heads x 128 head dim x 2 bytes = 57,344 B/token.
    kv_bytes_per_token: int = QWEN7B_KV_BYTES_PER_TOKEN
    # Prefill time(n) = fixed + n / tps + quad * n^2.
    #  linear: 2 x 7.61e9 FLOP per token at 148e12 x 0.55 FLOP/s -> 5,348 tokens/s;
    #  quadratic (causal attention, QK^T and AV): 2 x 2 x layers x hidden FLOP per token pair over
    #  n^2/2 pairs -> 0.5 x 4 x 28 x 3584 / (148e12 x 0.55) = 2.47e-9 s per token^2;
    #  fixed: scheduler step + kernel launches, ~15 ms (vLLM step overhead at small batch).
    prefill_fixed_s: float = 0.015
    prefill_tokens_per_s: float = H20_BF16_FLOPS * PREFILL_MFU / (2 * QWEN7B_PARAMS)
    prefill_quad_s_per_token2: float = 0.5 * 4 * QWEN7B_LAYERS * QWEN7B_HIDDEN / (H20_BF16_FLOPS * PREFILL_MFU)
    # Decode step of a batch = weights read once (15.2 GB at 4.0 TB/s x 0.7 = 5.4 ms) + the batch's KV
    # read (its context tokens x 57,344 B at the same bandwidth) + 1 ms framework overhead per step.
    decode_step_base_s: float = QWEN7B_WEIGHT_BYTES / (H20_HBM_BYTES_PER_S * DECODE_BW_EFFICIENCY) + 0.001
    decode_kv_read_s_per_token: float = QWEN7B_KV_BYTES_PER_TOKEN / (H20_HBM_BYTES_PER_S * DECODE_BW_EFFICIENCY)
    max_batch: int = 256  # vLLM's default max_num_seqs
    # Colocated prefill/decode with chunked prefill: each engine step carries at most this many
    # tokens (vLLM's max_num_batched_tokens for chunked prefill, 2048). A decode step that shares the
    # engine step with a prefill chunk waits for the chunk (2048 / 5,348 tok/s = 0.38 s), so while a
    # prefill runs, running decodes advance one token per chunk: they stall for the prefill's duration
    # less the share of decode steps, chunk_time / (chunk_time + decode step).
    chunk_budget_tokens: int = 2048


@dataclass(frozen=True)
class HardwareConstants:
    # Host (CPU DRAM) KV store per instance (the session holder's copy), in tokens: 2 TB of host DRAM
    # per 8-GPU node = 250 GB per GPU / 57 KB ~ 4.3M tokens; we use 4M.
    host_kv_capacity_tokens: int = 4_000_000
    # GPU KV budget: (96 GB - 15.2 GB weights - ~8 GB activations/graphs) / 57,344 B ~ 1.27M tokens.
    gpu_kv_capacity_tokens: int = 1_270_000
    # Of that, idle KV kept as a GPU prefix cache (sessions between turns, temporary copies of
    # fetched prefixes), LRU; the rest is the running batch's. ASSUMPTION: half.
    gpu_cache_tokens: int = 635_000
    # Host -> GPU load of KV kept in host DRAM: PCIe Gen5 x16, 64 GB/s; ASSUMPTION: 50% effective for
    # paged (block-scattered) copies -> 32 GB/s, i.e. 1.8 ms per 1k tokens.
    h2d_bytes_per_s: float = H20_PCIE_BYTES_PER_S * 0.5
    # Network between nodes: one 200 Gb/s RDMA NIC (25 GB/s), ASSUMPTION 90% achievable = 22.5 GB/s,
    # shared by the ``gpus_per_nic`` GPUs of a node (8: one NIC per node; 1: one NIC per GPU).
    nic_bytes_per_s: float = 200e9 / 8 * 0.9
    gpus_per_node: int = 8
    gpus_per_nic: int = 8
    link_latency_s: float = 0.001  # RDMA connection/registration setup per transfer
    # Inside a node KV moves GPU-to-GPU over NVLink (450 GB/s per direction, ASSUMPTION 70% = 315 GB/s).
    nvlink_bytes_per_s: float = H20_NVLINK_BYTES_PER_S * 0.7


@dataclass(frozen=True)
class SimConstants:
    model: ModelConstants = field(default_factory=ModelConstants)
    hw: HardwareConstants = field(default_factory=HardwareConstants)
    block_tokens: int = 512  # Mooncake hash_ids cover 512-token blocks
    signal_period_s: float = 0.25  # how often workers export metrics / schedulers see fresh signals

    def with_hw(self, **changes: float) -> "SimConstants":
        return replace(self, hw=replace(self.hw, **changes))

    def prefill_time(self, tokens: float, running: float = 0.0, colocated: bool = True) -> float:
        """Seconds to prefill ``tokens`` (``running`` decodes share the engine steps when colocated)."""
        m = self.model
        if tokens <= 0:
            return 0.0
        t = m.prefill_fixed_s + tokens / m.prefill_tokens_per_s + m.prefill_quad_s_per_token2 * tokens * tokens
        if colocated and running > 0:
            # every chunk step also runs one decode step for the running batch
            t *= 1.0 + self.decode_step_time(running, 0.0) / self.chunk_time()
        return t

    def chunk_time(self) -> float:
        m = self.model
        return m.chunk_budget_tokens / m.prefill_tokens_per_s

    def decode_step_time(self, batch: float, context_tokens: float) -> float:
        """One decode step of ``batch`` sequences holding ``context_tokens`` KV in total."""
        m = self.model
        if batch <= 0:
            return 0.0
        return m.decode_step_base_s + m.decode_kv_read_s_per_token * context_tokens

    def decode_time(self, output_tokens: int, batch: float, context_tokens: float = 0.0) -> float:
        """Decode of ``output_tokens`` in a batch of ``batch`` sequences (``context_tokens`` of KV in the
        batch at the start; it grows by half the output on average)."""
        b = min(max(batch, 1.0), self.model.max_batch)
        return output_tokens * self.decode_step_time(b, context_tokens + 0.5 * b * output_tokens)

    def decode_stall_fraction(self, batch: float, context_tokens: float) -> float:
        """Share of a co-running prefill's duration during which decodes on that GPU make no progress."""
        ct = self.chunk_time()
        return ct / (ct + self.decode_step_time(max(batch, 1.0), context_tokens))

    def network_time(self, tokens: float, same_node: bool) -> float:
        """Seconds to move ``tokens`` of KV between two GPUs (NVLink inside a node, NIC across nodes),
        not counting waiting for the link."""
        if tokens <= 0:
            return 0.0
        bw = self.hw.nvlink_bytes_per_s if same_node else self.hw.nic_bytes_per_s
        return self.hw.link_latency_s + tokens * self.model.kv_bytes_per_token / bw

    def transfer_time(self, tokens: float) -> float:
        """Cross-node KV transfer time (the common case for a remote executor)."""
        return self.network_time(tokens, same_node=False)

    def h2d_time(self, tokens: Any) -> Any:
        """Seconds to load ``tokens`` of KV from host DRAM into GPU memory (a number, or an array of them:
        the scheduler scores every candidate with the same cost the simulator charges)."""
        if np.ndim(tokens) == 0:
            return 0.0 if tokens <= 0 else tokens * self.model.kv_bytes_per_token / self.hw.h2d_bytes_per_s
        t = np.asarray(tokens, dtype=float)
        return np.where(t > 0, t * self.model.kv_bytes_per_token / self.hw.h2d_bytes_per_s, 0.0)


DEFAULT = SimConstants()


# ----------------------------------------------------------------------------- workflow stages
# The workflow simulator (sim/workflow_sim.py) runs the auxiliary models of agent workflows on the
# same H20s as the LLM (Qwen2.5-7B, ModelConstants above). A GPU stage's batch time is a roofline:
# per-call launch cost + max(weights read once from HBM, FLOPs of the batch at an assumed MFU), plus
# any per-batch decode steps. Parameter counts and sequence lengths come from the models' configs.
#
# ASSUMPTION: encoder inference (BERT/XLM-R/ViT class, fp16, batch >= 16) reaches 40% of peak BF16
# FLOPs; memory-bound phases reach the same 70% of HBM bandwidth as LLM decode.
ENCODER_MFU = 0.40
# ASSUMPTION: one eager PyTorch forward of a 24-layer encoder launches ~250 kernels at ~8 us each.
ENCODER_LAUNCH_S = 0.002


@dataclass(frozen=True)
class GpuStageModel:
    """Batch time of one auxiliary model on one H20 (a roofline, see ``batch_time``)."""

    params: float  # parameters
    tokens_per_item: int  # sequence length of one item (a query-passage pair, a frame's patches, ...)
    decode_steps: int = 0  # per batch: autoregressive steps of a small decoder (ASR)
    decoder_params: float = 0.0
    launch_s: float = ENCODER_LAUNCH_S
    mfu: float = ENCODER_MFU

    def batch_time(self, items: Any) -> Any:
        """Seconds for a batch of ``items`` (number or array; 0 items cost nothing)."""
        n = np.asarray(items, dtype=float)
        weights = 2.0 * self.params / (H20_HBM_BYTES_PER_S * DECODE_BW_EFFICIENCY)
        compute = 2.0 * self.params * self.tokens_per_item * n / (H20_BF16_FLOPS * self.mfu)
        dec_step = 2.0 * self.decoder_params / (H20_HBM_BYTES_PER_S * DECODE_BW_EFFICIENCY) + 0.0002
        t = self.launch_s + np.maximum(weights, compute) + self.decode_steps * dec_step
        t = np.where(n > 0, t, 0.0)
        return float(t) if np.ndim(t) == 0 else t


@dataclass(frozen=True)
class CpuStageModel:
    """A CPU/network stage (index probe, web call, frame decode): lognormal latency per item, run on
    a pool of ``slots`` concurrent workers per node."""

    median_s: float
    sigma: float = 0.0


@dataclass(frozen=True)
class WorkflowConstants:
    # Embedding: BAAI/bge-large-en-v1.5 (335M parameters, 24 layers, hidden 1024); a query is <= 32
    # tokens, a passage 256.
    embed_query: GpuStageModel = GpuStageModel(params=335e6, tokens_per_item=32)
    # Rerank: BAAI/bge-reranker-v2-m3 (568M parameters, XLM-RoBERTa-large); one item is a
    # query + passage pair of 32 + 256 tokens -> 2 x 568e6 x 288 / (148e12 x 0.4) = 5.5 ms per pair.
    rerank: GpuStageModel = GpuStageModel(params=568e6, tokens_per_item=288)
    # KB-RAG passages are longer (512-token knowledge-base sections): 32 + 512 tokens per pair.
    rerank_long: GpuStageModel = GpuStageModel(params=568e6, tokens_per_item=544)
    # Vision: the Qwen2-VL vision encoder (675M parameters, 14-pixel patches); a 448 x 448 frame is
    # 32 x 32 = 1024 patches, merged 2 x 2 into 256 LLM tokens (``visual_tokens_per_frame``).
    vision: GpuStageModel = GpuStageModel(params=675e6, tokens_per_item=1024)
    visual_tokens_per_frame: int = 256
    # ASR: Whisper large-v3 (1.55B parameters; encoder ~635M over 1500 frames per 30 s segment, the
    # decoder ~907M) emitting ~100 tokens per segment: the batch pays 100 decoder steps once.
    asr: GpuStageModel = GpuStageModel(params=635e6, tokens_per_item=1500, decode_steps=100, decoder_params=907e6)
    transcript_tokens_per_segment: int = 100
    # ASSUMPTION: dense ANN probe of one index shard (FAISS HNSW, ~10M 1024-d vectors, efSearch 128)
    # ~3 ms; ann-benchmarks reports 10^3-10^4 queries/s per core at recall 0.9 on 1M-vector sets.
    ann_probe: CpuStageModel = CpuStageModel(median_s=0.003, sigma=0.3)
    # ASSUMPTION: BM25 query on a Lucene/Elasticsearch shard ~15 ms.
    bm25: CpuStageModel = CpuStageModel(median_s=0.015, sigma=0.4)
    # ASSUMPTION: a web search API call ~0.8 s and a page fetch + HTML-to-text ~1.0 s median, both
    # heavy-tailed (sigma 0.6): they are network-bound and set DeepSearch's tool time.
    web_search: CpuStageModel = CpuStageModel(median_s=0.8, sigma=0.6)
    page_fetch: CpuStageModel = CpuStageModel(median_s=1.0, sigma=0.6)
    # ASSUMPTION: decoding + resizing one 448 x 448 frame with ffmpeg on one core ~4 ms.
    frame_decode: CpuStageModel = CpuStageModel(median_s=0.004, sigma=0.2)
    # Merging independent chunks' top-k lists (Ayo's aggregate primitive): a CPU task, ~1 ms.
    topk_merge: CpuStageModel = CpuStageModel(median_s=0.001)
    cpu_slots_per_gpu: int = 8  # CPU workers / connection slots per GPU's share of a node
    # ASSUMPTION: dispatching one batch or LLM iteration (scheduler decision, queue bookkeeping) 0.5 ms,
    # the same for every policy; handing a supplement (a running top-k) to the next chunk 0.2 ms.
    dispatch_s: float = 0.0005
    supplement_handoff_s: float = 0.0002
    # The LLM engine's KV budget on a GPU that also holds the auxiliary models (~3.2 GB of weights):
    # (96 - 15.2 - 3.2 - 8) GB / 57,344 B per token.
    llm_kv_tokens: int = 1_210_000


WORKFLOW = WorkflowConstants()
