"""The lower bound on a step's time that every engine figure is stated against.

A step must read every weight once (the layers, and lm_head when it samples), the KV cache of
every attended position and each active adapter's weights, and it must do the FLOPs of its
tokens. So it takes at least max(bytes / copy bandwidth, projection FLOPs / projection matrix
rate + other FLOPs / engine-dtype matrix rate). Not modelled: activations' own traffic, the
embedding lookup, sampling; all small next to the terms kept.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from gpusuite.adapters import adapter_params
from gpusuite.ceilings import Ceilings
from loraloom.engine.config import ModelConfig
from loraloom.engine.memory import kv_block_bytes, module_bytes
from loraloom.engine.model.llama import LlamaModel


@dataclass(frozen=True)
class Roofline:
    layer_weight_bytes: int  # decoder layers and final norm, as served (FP8 projections included)
    lm_head_bytes: int
    layer_linear_params: int  # multiply-adds per token through the layers' projections
    lm_head_params: int
    kv_token_bytes: int  # K and V of one position over all layers
    attention_flops_per_pair: int  # QK and PV of one (query token, attended position) pair over all layers
    lora_bytes_per_rank: int  # one rank of an adapter on all seven modules
    lora_flops_per_rank: int  # per token
    bandwidth: float  # bytes/s
    linear_rate: float  # FLOP/s of the projections (FP8 when quantized)
    matmul_rate: float  # FLOP/s of everything else

    @classmethod
    def of(cls, config: ModelConfig, dtype: torch.dtype, ceilings: Ceilings, served: LlamaModel | None = None,
           quantized: bool = False) -> "Roofline":
        """The bound for `config`'s shapes; weight bytes are `served`'s own (FP8 projections count one byte
        per weight), or, without a served model, every weight in `dtype`."""
        q, kv = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        hidden, inter = config.hidden_size, config.intermediate_size
        per_layer = hidden * (q + 2 * kv) + q * hidden + 2 * hidden * inter + inter * hidden
        if served is None:
            norms = (2 * config.num_layers + 1) * hidden
            layer_bytes = (per_layer * config.num_layers + norms) * dtype.itemsize
            lm_head_bytes = config.vocab_size * hidden * dtype.itemsize
        else:
            layer_bytes = module_bytes(served.layers) + module_bytes(served.norm)
            lm_head_bytes = module_bytes(served.embed_tokens if served.lm_head is None else served.lm_head)
        linear_rate = ceilings.fp8_matmul_rate if quantized and ceilings.fp8_matmul_rate else ceilings.matmul_rate
        return cls(
            layer_weight_bytes=layer_bytes,
            lm_head_bytes=lm_head_bytes,
            layer_linear_params=per_layer * config.num_layers,
            lm_head_params=config.vocab_size * hidden,
            kv_token_bytes=kv_block_bytes(config, 1, dtype),
            attention_flops_per_pair=4 * config.num_heads * config.head_dim * config.num_layers,
            lora_bytes_per_rank=adapter_params(config, 1) * dtype.itemsize,
            lora_flops_per_rank=2 * adapter_params(config, 1),
            bandwidth=ceilings.copy_bandwidth,
            linear_rate=linear_rate,
            matmul_rate=ceilings.matmul_rate,
        )

    @property
    def weight_bytes_per_step(self) -> int:
        return self.layer_weight_bytes + self.lm_head_bytes

    def step_seconds(
        self,
        *,
        new_tokens: float,
        sampled_rows: float,
        attended_pairs: float,
        kv_positions_read: float,
        adapter_ranks: list[int],  # rank of each distinct adapter active in the step
        token_rank_sum: float,  # sum over the step's tokens of their adapter's rank (0 for base)
    ) -> float:
        bytes_read = (
            self.layer_weight_bytes
            + (self.lm_head_bytes if sampled_rows else 0)
            + (kv_positions_read + new_tokens) * self.kv_token_bytes  # attended K/V read, new K/V written
            + sum(adapter_ranks) * self.lora_bytes_per_rank
        )
        linear_flops = 2 * self.layer_linear_params * new_tokens
        other_flops = (
            2 * self.lm_head_params * sampled_rows
            + self.attention_flops_per_pair * attended_pairs
            + self.lora_flops_per_rank * token_rank_sum
        )
        return max(bytes_read / self.bandwidth, linear_flops / self.linear_rate + other_flops / self.matmul_rate)

    def decode_step_seconds(self, contexts: list[int], request_ranks: list[int], distinct_ranks: list[int]) -> float:
        """One decode token for each request with `contexts[i]` positions already cached."""
        return self.step_seconds(
            new_tokens=len(contexts),
            sampled_rows=len(contexts),
            attended_pairs=sum(contexts) + len(contexts),
            kv_positions_read=sum(contexts) + len(contexts),
            adapter_ranks=distinct_ranks,
            token_rank_sum=sum(request_ranks),
        )

    def prefill_seconds(self, num_prompts: int, prompt_len: int, budget: int, adapter_ranks: list[int],
                        token_rank_sum: int) -> float:
        """Fresh prompts packed into ceil(tokens / budget) steps of equal share (each prompt fits one step).

        `adapter_ranks`: the distinct adapters' ranks, each read in every step (an upper bound);
        `token_rank_sum`: over all prompt tokens, their adapter's rank.
        """
        tokens = num_prompts * prompt_len
        steps = -(-tokens // budget)
        return steps * self.step_seconds(
            new_tokens=tokens / steps,
            sampled_rows=num_prompts / steps,
            attended_pairs=num_prompts * prompt_len * (prompt_len + 1) / 2 / steps,
            kv_positions_read=0,  # a fresh prompt attends only the K/V it writes in the same step
            adapter_ranks=adapter_ranks,
            token_rank_sum=token_rank_sum / steps,
        )
