"""A simulated vLLM serving fleet: realistic series, values and remote-write 1.0 payloads.

Used by bench/live_dashboard.py. Each vLLM engine (one per instance, ``engine="0"`` as vLLM V1
labels it) exposes 79 series with the labels ``model_name``, ``instance``, ``job``, ``cluster``,
``engine`` (plus ``le`` / ``finished_reason``):

* histograms ``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds``,
  ``vllm:inter_token_latency_seconds`` with vLLM's own bucket bounds: ``_bucket`` per ``le`` (``+Inf``
  included), ``_sum``, ``_count``;
* counters ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:request_success_total{finished_reason=stop|length|abort}``;
* gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``.

Values come from one load model per engine: a per-model request rate with a diurnal cycle, a per-
instance factor and log-normal noise; finished requests ~ Poisson(rate x dt); TTFT / ITL / E2E
latencies log-normal with medians that grow with utilisation; bucket counts are multinomial draws
over vLLM's bounds (so every histogram is internally consistent: cumulative over ``le``, ``+Inf`` =
``_count``). Gauges follow the load (running ~ rate x latency, waiting only near saturation, KV
usage ~ running). Counters are monotone except when an engine restarts (about 1.5 times per engine
per day): then every counter of that engine starts again from 0.

Generation is columnar (numpy over engines x timestamps), and so is the payload encoder: a
remote-write 1.0 ``WriteRequest`` is assembled from pre-encoded label bytes and a fixed 18-byte
layout per sample (tests decode it with ``ingest.proto.messages.WriteRequest``; see ``self_check``).
"""
from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ingest.remote_write import encode_varint

# vLLM's bucket bounds (vllm/v1/metrics/loggers.py), +Inf appended
TTFT_LE = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
           40.0, 80.0, 160.0, 640.0, 2560.0]
E2E_LE = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
          960.0, 1920.0, 7680.0]
ITL_LE = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
FINISHED = [("stop", 0.90), ("length", 0.09), ("abort", 0.01)]


@dataclass(frozen=True)
class Model:
    name: str
    weight: float  # share of the instances
    rps: float  # mean finished requests / s per engine at the diurnal mean
    ttft_med: float  # s, idle engine
    itl_med: float  # s per output token, idle engine
    prompt_tokens: float  # mean per request
    output_tokens: float  # mean per request
    kv_tokens: float  # KV cache capacity in tokens


MODELS = [
    Model("meta-llama/Llama-3.1-8B-Instruct", 0.38, 4.0, 0.07, 0.012, 950, 260, 420_000),
    Model("Qwen/Qwen2.5-32B-Instruct", 0.25, 1.6, 0.22, 0.030, 1400, 330, 180_000),
    Model("meta-llama/Llama-3.3-70B-Instruct", 0.22, 0.8, 0.55, 0.055, 1800, 380, 120_000),
    Model("mistralai/Mistral-7B-Instruct-v0.3", 0.15, 3.0, 0.06, 0.011, 700, 210, 450_000),
]
CLUSTERS = ["us-east-1", "eu-west-1"]
RESTARTS_PER_DAY = 1.5


def _series_layout() -> list[tuple[str, dict[str, str]]]:
    """The 79 series of one engine, in value-row order: (metric name, extra labels)."""
    out: list[tuple[str, dict[str, str]]] = []
    for fam, bounds in (("vllm:time_to_first_token_seconds", TTFT_LE), ("vllm:e2e_request_latency_seconds", E2E_LE),
                        ("vllm:inter_token_latency_seconds", ITL_LE)):
        for b in bounds:
            out.append((f"{fam}_bucket", {"le": repr(float(b))}))
        out.append((f"{fam}_bucket", {"le": "+Inf"}))
        out.append((f"{fam}_sum", {}))
        out.append((f"{fam}_count", {}))
    out.append(("vllm:prompt_tokens_total", {}))
    out.append(("vllm:generation_tokens_total", {}))
    for reason, _ in FINISHED:
        out.append(("vllm:request_success_total", {"finished_reason": reason}))
    out.append(("vllm:num_requests_running", {}))
    out.append(("vllm:num_requests_waiting", {}))
    out.append(("vllm:kv_cache_usage_perc", {}))
    return out


LAYOUT = _series_layout()
PER_ENGINE = len(LAYOUT)  # 79
N_COUNTERS = PER_ENGINE - 3  # every row but the three gauges is a counter


def _erf(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): enough for bucket probabilities."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def _bin_probs(median: np.ndarray, sigma: float, bounds: list[float]) -> np.ndarray:
    """(..., K+1) probabilities of a log-normal(median, sigma) falling in each bucket interval
    (the last one is (last bound, +Inf))."""
    lb = np.log(np.asarray(bounds, float))
    z = (lb - np.log(median)[..., None]) / (sigma * math.sqrt(2.0))
    cdf = 0.5 * (1.0 + _erf(z))
    cdf = np.maximum.accumulate(np.clip(cdf, 0.0, 1.0), axis=-1)
    p = np.diff(cdf, prepend=0.0, append=1.0, axis=-1)
    p = np.clip(p, 0.0, None)
    return p / p.sum(axis=-1, keepdims=True)


def _lognormal_mean(median: np.ndarray, sigma: float) -> np.ndarray:
    return median * math.exp(sigma * sigma / 2.0)


@dataclass
class Fleet:
    """``n_instances`` vLLM engines; ``labels`` lists every series (row order of ``values``)."""

    n_instances: int
    seed: int = 7
    labels: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self.rng = np.random.default_rng(self.seed + 1)
        E = self.n_instances
        w = np.array([m.weight for m in MODELS])
        counts = np.floor(w / w.sum() * E).astype(int)
        counts[np.argsort(-(w / w.sum() * E - counts))[: E - counts.sum()]] += 1
        self.model_idx = np.repeat(np.arange(len(MODELS)), counts)
        self.cluster_idx = np.arange(E) % len(CLUSTERS)
        self.inst_factor = rng.uniform(0.7, 1.3, E)
        self.phase = rng.uniform(-0.05, 0.05, E) + self.cluster_idx * 0.25  # eu is 6h ahead
        # scrape offset of each engine (spread over the 5 s interval): its samples are 0-5 s older than the write
        self.offset_ms = rng.integers(0, 5000, E).astype(np.int64)
        self.wave_phase = rng.uniform(0.0, 2 * np.pi, E)
        self.labels = []
        self.engine_of_row = np.repeat(np.arange(E), PER_ENGINE)
        for e in range(E):
            m = MODELS[self.model_idx[e]]
            c = self.cluster_idx[e]
            base = {"cluster": CLUSTERS[c], "engine": "0", "instance": f"10.{c + 1}.{e // 200}.{e % 200 + 10}:8000",
                    "job": "vllm", "model_name": m.name}
            for name, extra in LAYOUT:
                self.labels.append({"__name__": name, **base, **extra})
        self.state = np.zeros((E, N_COUNTERS))  # counter values after the last generated step
        self.last_ts: np.ndarray | None = None  # (E,) ms of the last generated sample

    @property
    def num_series(self) -> int:
        return len(self.labels)

    @classmethod
    def for_series(cls, n_series: int, seed: int = 7) -> Fleet:
        return cls(max(1, round(n_series / PER_ENGINE)), seed)

    def timestamps(self, base_ms: np.ndarray) -> np.ndarray:
        """(S, n) sample timestamps for the write times ``base_ms`` (each engine's scrape offset)."""
        per_engine = np.asarray(base_ms, np.int64)[None, :] - self.offset_ms[:, None]
        return np.repeat(per_engine, PER_ENGINE, axis=0)

    def step(self, base_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(timestamps (S, n) int64 ms, values (S, n) float64) for the write times ``base_ms``
        (increasing, each after the previous call's), continuing every counter."""
        base_ms = np.asarray(base_ms, np.int64)
        ts_e = base_ms[None, :] - self.offset_ms[:, None]  # (E, n)
        E, n = ts_e.shape
        rng = self.rng
        prev = self.last_ts if self.last_ts is not None else ts_e[:, 0] - 5000
        dt = np.diff(np.concatenate([prev[:, None], ts_e], axis=1), axis=1) / 1000.0  # (E, n) s
        t_s = ts_e / 1000.0
        models = [MODELS[i] for i in self.model_idx]
        rps = np.array([m.rps for m in models])[:, None]
        ttft0 = np.array([m.ttft_med for m in models])[:, None]
        itl0 = np.array([m.itl_med for m in models])[:, None]
        p_tok = np.array([m.prompt_tokens for m in models])[:, None]
        o_tok = np.array([m.output_tokens for m in models])[:, None]
        kv_cap = np.array([m.kv_tokens for m in models])[:, None]
        diurnal = 1.0 + 0.4 * np.sin(2 * np.pi * (t_s / 86400.0 + self.phase[:, None]))
        slow = 1.0 + 0.15 * np.sin(2 * np.pi * t_s / 1800.0 + self.wave_phase[:, None])  # half-hour waves
        lam = rps * self.inst_factor[:, None] * diurnal * slow * np.exp(rng.normal(0.0, 0.12, (E, n)))
        util = np.clip(lam / (rps * 1.9), 0.0, 0.99)
        nreq = rng.poisson(lam * dt).astype(float)  # finished requests in each interval
        ttft_med = ttft0 * (1.0 + 2.5 * util ** 3)
        itl_med = itl0 * (1.0 + 0.9 * util ** 2)
        e2e_med = ttft_med + o_tok * 0.8 * itl_med
        out_tokens = np.round(nreq * o_tok * np.exp(rng.normal(0.0, 0.25, (E, n)) / np.sqrt(nreq + 1)))
        n_itl = np.maximum(out_tokens - nreq, 0.0)  # one ITL observation per output token after the first
        inc = np.empty((E, N_COUNTERS, n))
        row = 0
        for obs, med, sigma, bounds in ((nreq, ttft_med, 0.7, TTFT_LE), (nreq, e2e_med, 0.6, E2E_LE),
                                        (n_itl, itl_med, 0.35, ITL_LE)):
            k = len(bounds) + 1
            counts = rng.multinomial(obs.astype(np.int64), _bin_probs(med, sigma, bounds))  # (E, n, k)
            inc[:, row:row + k, :] = np.cumsum(counts, axis=2).transpose(0, 2, 1)
            mean = _lognormal_mean(med, sigma)
            inc[:, row + k, :] = obs * mean * np.exp(rng.normal(0.0, sigma, (E, n)) / np.sqrt(obs + 1))
            inc[:, row + k + 1, :] = obs
            row += k + 2
        inc[:, row, :] = np.round(nreq * p_tok * np.exp(rng.normal(0.0, 0.3, (E, n)) / np.sqrt(nreq + 1)))
        inc[:, row + 1, :] = out_tokens
        fin = rng.multinomial(nreq.astype(np.int64), [p for _, p in FINISHED])  # (E, n, 3)
        inc[:, row + 2:row + 5, :] = fin.transpose(0, 2, 1)
        assert row + 5 == N_COUNTERS
        # restarts: every counter of the engine starts again from 0 (the interval's increment is its new value)
        p_restart = 1.0 - np.exp(-RESTARTS_PER_DAY * dt / 86400.0)
        restart = rng.random((E, n)) < p_restart
        cum = self.state[:, :, None] + np.cumsum(inc, axis=2)
        off = np.where(restart[:, None, :], cum - inc, 0.0)
        vals_c = cum - np.maximum.accumulate(off, axis=2)
        self.state = vals_c[:, :, -1].copy()
        self.last_ts = ts_e[:, -1].copy()
        running = rng.poisson(np.minimum(lam * e2e_med, 256.0)).astype(float)
        running = np.where(restart, 0.0, running)
        waiting = rng.poisson(np.clip(util - 0.72, 0.0, None) * 90.0).astype(float)
        kv = np.clip(running * (p_tok + 0.5 * o_tok) / kv_cap + rng.normal(0.0, 0.01, (E, n)), 0.0, 1.0)
        vals = np.concatenate([vals_c, running[:, None, :], waiting[:, None, :], kv[:, None, :]], axis=1)
        return np.repeat(ts_e, PER_ENGINE, axis=0), vals.reshape(E * PER_ENGINE, n)


# --- remote write 1.0 encoding --------------------------------------------------------------------
def _field_bytes(num: int, payload: bytes) -> bytes:
    return bytes([(num << 3) | 2]) + encode_varint(len(payload)) + payload


class Encoder:
    """Builds snappy-compressed ``prometheus.WriteRequest`` bodies for a fixed list of series."""

    def __init__(self, labels: list[dict[str, str]]):
        self.label_bytes = []
        for lbl in labels:
            parts = []
            for k, v in sorted(lbl.items()):
                parts.append(_field_bytes(1, _field_bytes(1, k.encode()) + _field_bytes(2, v.encode())))
            self.label_bytes.append(b"".join(parts))

    def encode(self, ts: np.ndarray, vals: np.ndarray, rows: range | None = None) -> bytes:
        """Uncompressed WriteRequest for rows ``rows`` (default all) of (S, n) timestamps / values."""
        ts = np.ascontiguousarray(ts, np.int64)
        if ts.size and (ts.min() < (1 << 35) or ts.max() >= (1 << 42)):
            raise ValueError("timestamps outside the 6-byte varint range this encoder assumes")
        S, n = vals.shape
        buf = np.empty((S, n, 18), np.uint8)
        buf[:, :, 0] = 0x12  # TimeSeries.samples (field 2, length-delimited)
        buf[:, :, 1] = 16  # Sample length
        buf[:, :, 2] = 0x09  # Sample.value (field 1, fixed64)
        buf[:, :, 3:11] = np.ascontiguousarray(vals, "<f8").view(np.uint8).reshape(S, n, 8)
        buf[:, :, 11] = 0x10  # Sample.timestamp (field 2, varint)
        for k in range(6):
            b = (ts >> (7 * k)) & 0x7F
            buf[:, :, 12 + k] = (b | 0x80) if k < 5 else b
        sample_bytes = buf.reshape(S, n * 18)
        out = []
        for i in rows if rows is not None else range(S):
            body = self.label_bytes[i] + sample_bytes[i].tobytes()
            out.append(b"\x0a" + encode_varint(len(body)) + body)
        return b"".join(out)

    def body(self, ts: np.ndarray, vals: np.ndarray) -> bytes:
        import cramjam

        return bytes(cramjam.snappy.compress_raw(self.encode(ts, vals)))


def self_check(fleet: Fleet, enc: Encoder, ts: np.ndarray, vals: np.ndarray) -> None:
    """Decode one payload with the repository's protobuf classes and compare it with the arrays."""
    import cramjam

    from ingest.proto.messages import WriteRequest

    raw = bytes(cramjam.snappy.decompress_raw(enc.body(ts, vals)))
    w = WriteRequest.FromString(raw)
    assert len(w.timeseries) == fleet.num_series
    for i in (0, len(w.timeseries) // 2, len(w.timeseries) - 1):
        t = w.timeseries[i]
        assert {lb.name: lb.value for lb in t.labels} == fleet.labels[i]
        assert [s.timestamp for s in t.samples] == ts[i].tolist()
        assert [s.value for s in t.samples] == vals[i].tolist()


def history_bodies(fleet: Fleet, enc: Encoder, hours: float, interval_s: int, per_request: int,
                   now_ms: int) -> Iterator[tuple[bytes, int]]:
    """Remote-write bodies of ``hours`` of the fleet's history up to ``now_ms`` at ``interval_s``, in
    time order, each about ``per_request`` samples: (snappy body, samples in it)."""
    grid = np.arange(now_ms - int(hours * 3_600_000), now_ms + 1, interval_s * 1000, dtype=np.int64)
    for chunk in np.array_split(grid, math.ceil(len(grid) * fleet.num_series / per_request)):
        ts, vals = fleet.step(chunk)
        yield enc.body(ts, vals), int(vals.size)
