"""Turns one SchedulerOutput into tensors, runs the model, and samples.

The runner uses nothing but the scheduler's dataclass and the requests it
names: token ids, computed-token counts, block ids, adapter slot.
"""
from __future__ import annotations

import torch

from loraloom.engine.config import EngineConfig, ModelConfig
from loraloom.engine.lora import AdapterWeights, LoRASlotPool, build_sgmv_metadata
from loraloom.engine.model import LlamaModel, allocate_kv_cache
from loraloom.engine.sampler import Sampler, SamplerOutput
from loraloom.engine.scheduler import SchedulerOutput
from loraloom.kernels.metadata import AttentionMetadata


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
    def execute(self, step: SchedulerOutput, generators: dict[str, torch.Generator | None]) -> SamplerOutput | None:
        """Run one step; return the sampled tokens of the requests with `sample=True`, in scheduled order.

        The step's adapter_loads must have been copied in with `load_adapter` first.
        """
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
        attn = AttentionMetadata(
            query_start_loc=torch.tensor(query_start_loc, dtype=torch.int32, device=device),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
            block_tables=torch.tensor(padded_tables, dtype=torch.int32, device=device),
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            query_start_loc_host=query_start_loc,
            seq_lens_host=seq_lens,
        )
        lora = build_sgmv_metadata(token_slots, self.lora_pool.slot_ranks_host, device)
        hidden = self.model(  # [T, hidden]
            torch.tensor(input_ids, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
            self.kv_caches,
            attn,
            lora,
        )
        if not logits_rows:
            return None
        logits = self.model.compute_logits(hidden[torch.tensor(logits_rows, device=device)])  # [N, vocab]
        sampled = [item.request for item in step.scheduled if item.sample]
        return self.sampler.sample(
            logits,
            [request.sampling_params for request in sampled],
            [generators.get(request.request_id) for request in sampled],
        )

    def load_adapter(self, slot: int, weights: AdapterWeights) -> None:
        self.lora_pool.load(slot, weights)
