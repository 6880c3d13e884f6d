"""Every model/hardware constant of the simulator, in one place, with where it comes from.

The simulator is not the papers' testbed: these constants describe a plausible 7B-class model on
one 80 GB data-center GPU per instance. They are NOT tuned to reproduce any paper's numbers.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelConstants:
    # KV bytes per token for Qwen2.5-7B: 28 layers x 2 (K,V) x 4 KV heads x 128 head dim x 2 bytes (bf16)
    # = 57,344 B/token (model config.json: num_hidden_layers=28, num_key_value_heads=4, head_dim=128).
    kv_bytes_per_token: int = 57_344
    # Prefill: time(n) = fixed + n / tps + quad * n^2 (attention's quadratic term). 7B dense model at
    # ~14 TFLOP per 1k tokens (2 x 7.6e9 params x 1000) on a GPU sustaining ~250 TFLOP/s bf16 in
    # prefill gives ~17k tokens/s; we use 12k tokens/s to include framework overheads. The quadratic
    # term makes a 100k-token prefill ~2x its linear estimate, in line with FlashAttention-2 scaling.
    prefill_fixed_s: float = 0.015
    prefill_tokens_per_s: float = 12_000.0
    prefill_quad_s_per_token2: float = 8.0e-10
    # Decode: one step of a batch of B sequences takes base + per_seq * B (memory-bound weights read
    # once per step ~ 15 GB / 2 TB/s = 7.5 ms, plus KV reads growing with the batch).
    decode_step_base_s: float = 0.012
    decode_step_per_seq_s: float = 0.00025
    max_batch: int = 128
    # Colocated prefill/decode: prefill iterations are slowed by the running decode batch
    # (chunked-prefill interference); factor = 1 + interference * running / max_batch.
    decode_interference: float = 0.5


@dataclass(frozen=True)
class HardwareConstants:
    # Host (CPU DRAM) KV cache per instance, in tokens: 512 GB host cache / 57 KB per token ~ 9M tokens;
    # we allow 4M tokens (about 230 GB) per instance for sessions' accumulated KV.
    host_kv_capacity_tokens: int = 4_000_000
    # GPU KV budget (tokens) used for the kv_usage signal: (80 GB - 16 GB weights - activations) / 57 KB.
    gpu_kv_capacity_tokens: int = 900_000
    # Inter-instance link: 200 Gb/s RDMA NIC = 25 GB/s; we assume 20 GB/s achievable, 1 ms setup.
    link_bytes_per_s: float = 20e9
    link_latency_s: float = 0.001


@dataclass(frozen=True)
class SimConstants:
    model: ModelConstants = ModelConstants()
    hw: HardwareConstants = HardwareConstants()
    block_tokens: int = 512  # Mooncake hash_ids cover 512-token blocks
    signal_period_s: float = 0.25  # how often workers export metrics / schedulers see fresh signals

    def prefill_time(self, tokens: float, running: float = 0.0, colocated: bool = True) -> float:
        m = self.model
        if tokens <= 0:
            return 0.0
        t = m.prefill_fixed_s + tokens / m.prefill_tokens_per_s + m.prefill_quad_s_per_token2 * tokens * tokens
        if colocated:
            t *= 1.0 + m.decode_interference * min(running, m.max_batch) / m.max_batch
        return t

    def decode_time(self, output_tokens: int, batch: float) -> float:
        m = self.model
        return output_tokens * (m.decode_step_base_s + m.decode_step_per_seq_s * min(max(batch, 1.0), m.max_batch))

    def transfer_time(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        return self.hw.link_latency_s + tokens * self.model.kv_bytes_per_token / self.hw.link_bytes_per_s


DEFAULT = SimConstants()
