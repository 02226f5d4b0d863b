"""Turns one SchedulerOutput into tensors, runs the model, and samples.

The runner uses nothing but the scheduler's dataclass and the requests it
names: token ids, computed-token counts, block ids, adapter slot.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.lora import AdapterWeights, LoRASlotPool, build_sgmv_metadata
from loraloom.engine.model import LlamaModel, allocate_kv_cache
from loraloom.engine.sampler import Sampler, SamplerOutput
from loraloom.engine.scheduler import SchedulerOutput
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
    ) -> None:
        self.model = model
        self.model_config = model_config
        self.config = config
        self.lora_pool = lora_pool
        self.device = torch.device(config.device)
        self.kv_caches = allocate_kv_cache(
            model_config, config.num_kv_blocks, config.block_size, getattr(torch, config.dtype), self.device
        )
        self.sampler = Sampler()

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput, generators: dict[str, torch.Generator | None],
                timings: StepTimings) -> SamplerOutput | None:
        """Run one step; return the sampled tokens of the requests with `sample=True`, in scheduled order.

        The step's adapter_loads must have been copied in with `load_adapter` first.
        """
        started = time.perf_counter()
        inputs = self._prepare_inputs(step)
        prepared = time.perf_counter()
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn, inputs.lora)  # [T, hidden]
        logits = None
        if inputs.logits_rows is not None:
            logits = self.model.compute_logits(hidden[inputs.logits_rows])  # [N, vocab]
        computed = time.perf_counter()
        sampled = None
        if logits is not None:
            requests = [item.request for item in step.scheduled if item.sample]
            sampled = self.sampler.sample(
                logits,
                [request.sampling_params for request in requests],
                [generators.get(request.request_id) for request in requests],
            )
        timings.prepare_s = prepared - started
        timings.model_s = computed - prepared
        timings.sample_s = time.perf_counter() - computed
        return sampled

    def _prepare_inputs(self, step: SchedulerOutput) -> StepInputs:
        """Flatten the scheduled requests into one batch of tokens plus attention and LoRA metadata."""
        block_size = self.config.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        token_slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        logits_rows: list[int] = []
        block_tables: list[list[int]] = []
        for item in step.scheduled:
            request = item.request
            start = request.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids.extend(request.token_ids_between(start, end))
            positions.extend(range(start, end))
            blocks = request.block_ids
            slot_mapping.extend(blocks[pos // block_size] * block_size + pos % block_size for pos in range(start, end))
            token_slots.extend([item.slot] * item.num_new_tokens)
            query_start_loc.append(query_start_loc[-1] + item.num_new_tokens)
            seq_lens.append(end)
            block_tables.append(blocks)
            if item.sample:
                logits_rows.append(query_start_loc[-1] - 1)
        max_blocks = max(len(blocks) for blocks in block_tables)
        padded_tables = [blocks + [0] * (max_blocks - len(blocks)) for blocks in block_tables]

        device = self.device
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            attn=AttentionMetadata(
                query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
                seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
                block_tables=torch.tensor(padded_tables, dtype=torch.int32, device=device),
                slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
                query_start_loc_host=query_start_loc,
                seq_lens_host=seq_lens,
            ),
            lora=build_sgmv_metadata(token_slots, self.lora_pool.slot_ranks_host, device),
            logits_rows=torch.tensor(logits_rows, device=device) if logits_rows else None,
        )

    def load_adapter(self, slot: int, weights: AdapterWeights) -> None:
        self.lora_pool.load(slot, weights)
