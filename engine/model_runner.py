"""Turns one SchedulerOutput into tensors, runs the model, and samples.

The runner uses nothing but the scheduler's dataclass and the requests it
names: token ids, computed-token counts, block ids, adapter slot.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.cuda_graphs import DecodeGraphs, GraphLoRAMetadata
from loraloom.engine.model.kv_scales import kv_cache_torch_dtype
from loraloom.engine.lora.layers import LoRASlotPool, build_sgmv_metadata
from loraloom.engine.lora.weights import AdapterWeights
from loraloom.engine.model.llama import LlamaModel, allocate_kv_cache
from loraloom.engine.sampler import Sampler
from loraloom.engine.scheduler import SchedulerOutput
from loraloom.engine.speculation.verify import StepTokens, sample_step
from loraloom.engine.step_batch import HostBatch, flatten_step
from loraloom.engine.step_memo import AdapterMixMemo
from loraloom.kernels.metadata import AttentionMetadata, SGMVMetadata


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    attn: AttentionMetadata
    lora: SGMVMetadata | None  # None: no adapter token in this step, LoRA is skipped entirely
    logits_rows: torch.Tensor | None  # [N] rows of the flat batch whose next-token logits are sampled


@dataclass
class StepTimings:
    """Where one engine step's wall time went (seconds); the engine keeps the last step's."""

    schedule_s: float = 0.0
    prepare_s: float = 0.0  # flattening the batch and building metadata
    model_s: float = 0.0  # forward + lm_head
    sample_s: float = 0.0
    postprocess_s: float = 0.0  # scheduler update, detokenization, stop checks

    @property
    def host_overhead_s(self) -> float:
        """Everything but the model's compute."""
        return self.schedule_s + self.prepare_s + self.sample_s + self.postprocess_s


class ModelRunner:
    def __init__(
        self,
        *,
        model: LlamaModel,
        model_config: ModelConfig,
        config: EngineConfig,
        lora_pool: LoRASlotPool,
        eos_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.model = model
        self.model_config = model_config
        self.config = config
        self.lora_pool = lora_pool
        self.device = torch.device(config.device)
        self.kv_caches = allocate_kv_cache(
            model_config, config.num_kv_blocks, config.block_size, kv_cache_torch_dtype(config), self.device
        )
        self.sampler = Sampler(eos_token_ids)
        self.decode_graphs: DecodeGraphs | None = None  # enable_decode_graphs turns them on
        self._lora_memo: AdapterMixMemo[SGMVMetadata | None] = AdapterMixMemo()

    def enable_decode_graphs(self, max_model_len: int, *, capture: bool) -> None:
        """Replay plain decode steps from CUDA graphs (engine/cuda_graphs.py) from now on.

        capture=False runs the same static buffers and padding eagerly: the CPU test path.
        """
        kv_caches = self.kv_caches
        model = self.model

        def forward(input_ids, positions, attn, lora):
            return model(input_ids, positions, kv_caches, attn, lora)

        graphs = DecodeGraphs(
            forward,
            max_num_seqs=self.config.max_num_seqs,
            max_blocks_per_seq=-(-max_model_len // self.config.block_size),
            device=self.device,
            capture=capture,
            lora_metadata=GraphLoRAMetadata(lambda: self.lora_pool.slot_ranks_host, self.lora_pool.num_slots,
                                            self.device),
        )
        with torch.inference_mode():
            graphs.capture_all()
        self.decode_graphs = graphs

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, generators: dict[str, torch.Generator | None],
                timings: StepTimings) -> tuple[StepTokens | None, list[int]]:
        """Run one step; return the sampled tokens of the requests with `sample=True`, in scheduled
        order (several for a request whose draft was verified), and the indices among those requests
        whose logits were not finite (their tokens mean nothing).

        The step's adapter_loads must have been copied in with `load_adapter` first.
        """
        started = time.perf_counter()
        batch = flatten_step(step, self.config.block_size)
        graphs = self.decode_graphs
        if graphs is not None and graphs.can_run(batch):
            staged = graphs.stage(batch)
            prepared = time.perf_counter()
            hidden = graphs.replay(staged)  # [n, hidden]: a decode step samples every row
            logits = self.model.compute_logits(hidden)
        else:
            inputs = self._device_inputs(batch)
            prepared = time.perf_counter()
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn, inputs.lora)
            logits = None if inputs.logits_rows is None else self.model.compute_logits(hidden[inputs.logits_rows])
        computed = time.perf_counter()
        sampled, failed = None, []
        if logits is not None:
            requests = step.sampled_requests
            drafts = [item.draft for item in step.scheduled if item.sample]
            failed_rows = nonfinite_rows(logits)
            if failed_rows:  # sampled like the others so the step's shapes hold; the engine fails these requests
                logits[failed_rows] = 0.0
                failed = _requests_of_rows(failed_rows, drafts)
            # Only seeded requests own a generator; most steps have none to look up.
            request_generators = ([generators.get(request.request_id) for request in requests] if generators
                                  else [None] * len(requests))
            sampled = sample_step(self.sampler, logits, requests, drafts, request_generators, set(failed))
        timings.prepare_s = prepared - started
        timings.model_s = computed - prepared
        timings.sample_s = time.perf_counter() - computed
        return sampled, failed

    def _device_inputs(self, batch: HostBatch) -> StepInputs:
        """The eager path's tensors for a flattened step."""
        device = self.device

        def tensor(values: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(values).to(device)

        return StepInputs(
            input_ids=tensor(batch.input_ids),
            positions=tensor(batch.positions),
            attn=AttentionMetadata(
                query_start_loc=tensor(batch.query_start_loc),
                seq_lens=tensor(batch.seq_lens),
                block_tables=tensor(batch.block_tables),
                slot_mapping=tensor(batch.slot_mapping),
                query_start_loc_host=batch.query_start_loc.tolist(),
                seq_lens_host=batch.seq_lens.tolist(),
            ),
            lora=self._lora_memo.get(None, batch.token_slots, self.lora_pool.slot_ranks_host,
                                     lambda: build_sgmv_metadata(batch.token_slots, self.lora_pool.slot_ranks_host,
                                                                 device)),
            logits_rows=tensor(batch.logits_rows) if len(batch.logits_rows) else None,
        )

    def load_adapter(self, slot: int, weights: AdapterWeights) -> None:
        self.lora_pool.load(slot, weights)


def _requests_of_rows(rows: list[int], drafts: list[list[int]]) -> list[int]:
    """The requests (indices among those sampled) owning some of the sampled `rows` (1 + len(draft) rows each)."""
    owners = np.repeat(np.arange(len(drafts)), [1 + len(draft) for draft in drafts])
    return sorted({int(owners[row]) for row in rows})


def nonfinite_rows(logits: torch.Tensor) -> list[int]:
    """Rows holding a NaN or an infinity: a broken adapter's requests (no other row can see its
    values: adapter rows are computed apart), failed alone rather than failing the step."""
    # A row sum is NaN or infinite whenever the row holds a NaN or an infinity, so one vectorized
    # sum screens the batch; torch's isfinite on CPU is several elementwise passes (about 2 ms
    # for 32 x 49k logits here, 2-5% of a decode step), the sum one pass at memory speed. A sum
    # that merely overflowed falls through to the exact check, which decides.
    if bool(torch.isfinite(logits.sum(dim=-1)).all()):  # one reduction and one sync in the usual case
        return []
    finite = torch.isfinite(logits).all(dim=-1)
    return (~finite).nonzero().flatten().tolist()
