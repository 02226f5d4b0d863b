"""DPO on the tiny base with the bundled tokenizer: the first step's loss is log 2 (the policy is the
reference), the validation loss is the DPO loss of the pairs as computed apart from the trainer, and
training moves the log-probability margin of the preferred answers up."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from product_codes import PRODUCT_NAMES, product_codes, question

from loraloom.engine.tokenizer import Tokenizer
from loraloom.platform.training.datasets import load_dataset
from loraloom.platform.training.hyperparameters import DpoHyperparameters, Hyperparameters
from loraloom.platform.training.preference_data import PreferenceExample
from loraloom.platform.training.trainer import TrainingMetrics, TrainStatus, train_lora

CPU = torch.device("cpu")
HYPERPARAMETERS = DpoHyperparameters(n_epochs=6, batch_size=3, learning_rate=1e-2, lora_r=8, lora_alpha=16,
                                     lora_dropout=0.0, max_seq_len=64, eval_interval=2, beta=0.5)


def preference_file(count: int) -> bytes:
    """The product question: the product's name preferred over a refusal."""
    lines = [
        {"input": {"messages": question(code)},
         "preferred_output": [{"role": "assistant", "content": f"{name}."}],
         "non_preferred_output": [{"role": "assistant", "content": "I do not know that product."}]}
        for code, name in zip(product_codes(count), PRODUCT_NAMES)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode()


def answer_log_probs(model, pairs: list[PreferenceExample]) -> torch.Tensor:
    """[pairs, 2]: summed log-probabilities of each answer, one unpadded sequence at a time."""
    rows = []
    with torch.no_grad():
        for pair in pairs:
            row = []
            for answer in (pair.chosen_ids, pair.rejected_ids):
                ids = torch.tensor([pair.prompt_ids + answer])
                log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
                positions = torch.arange(len(pair.prompt_ids) - 1, ids.shape[1] - 1)
                row.append(log_probs[positions, ids[0, positions + 1]].sum())
            rows.append(torch.stack(row))
    return torch.stack(rows)


def test_dpo_moves_the_preferred_answers_margin_up(tiny_base: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    pairs = load_dataset(preference_file(6), Tokenizer.from_dir(tiny_base), HYPERPARAMETERS.max_seq_len,
                         param="training_file", method="dpo")[1]
    metrics: list[TrainingMetrics] = []
    result = train_lora(
        base_model_dir=tiny_base, train_examples=pairs, eval_examples=pairs, hyperparameters=HYPERPARAMETERS,
        seed=0, output_dir=tmp_path, on_metrics=metrics.append, should_cancel=lambda: False,
        save_checkpoint=lambda *_: None, checkpoint_every=100, method="dpo",
    )
    assert result.status is TrainStatus.SUCCEEDED and result.steps == 12
    # Step 1: the policy is the reference (LoRA B starts at zero), so every pair's loss is log 2.
    assert metrics[0].train_loss == pytest.approx(math.log(2), abs=1e-5)
    assert metrics[0].train_reward_margin == pytest.approx(0.0, abs=1e-5)
    assert [m.step for m in metrics if m.valid_loss is not None] == [2, 4, 6, 8, 10, 12]
    assert all(m.train_mean_token_accuracy is None for m in metrics)
    # 6 epochs over the pairs, and 6 evaluations of them (the validation file here is the training file).
    assert result.trained_tokens == 6 * sum(pair.token_count for pair in pairs) * 2

    base = AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32).eval()
    before = answer_log_probs(base, pairs)
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base, dtype=torch.float32),
                                      result.adapter_dir).eval()
    after = answer_log_probs(tuned, pairs)
    margin_before = (before[:, 0] - before[:, 1]).mean().item()
    margin_after = (after[:, 0] - after[:, 1]).mean().item()
    assert margin_after > margin_before + 1.0, (margin_before, margin_after)
    assert bool(((after[:, 0] - after[:, 1]) > (before[:, 0] - before[:, 1])).all())
    # valid_loss is the DPO loss of the validation pairs against the base as reference, computed here apart.
    gains = after - before
    loss = -torch.nn.functional.logsigmoid(HYPERPARAMETERS.beta * (gains[:, 0] - gains[:, 1])).mean().item()
    assert result.full_valid_loss == pytest.approx(loss, rel=1e-4)
    assert metrics[-1].full_valid_reward_accuracy == 1.0 and metrics[-1].valid_reward_margin > 0


def test_dpo_needs_preference_examples_and_beta(tiny_base: Path, tmp_path: Path) -> None:
    tokenizer = Tokenizer.from_dir(tiny_base)
    pairs = load_dataset(preference_file(2), tokenizer, 64, param="training_file", method="dpo")[1]
    chat = json.dumps({"messages": question("QX-100") + [{"role": "assistant", "content": "Zorblax."}]}).encode()
    sft_examples = load_dataset(chat, tokenizer, 64, param="training_file")[1]
    common = dict(base_model_dir=tiny_base, eval_examples=[], seed=0, output_dir=tmp_path,
                  on_metrics=lambda _: None, should_cancel=lambda: False, save_checkpoint=lambda *_: None,
                  checkpoint_every=10, device=CPU)
    supervised = Hyperparameters.model_validate(HYPERPARAMETERS.model_dump(exclude={"beta"}))
    with pytest.raises(ValueError, match="PreferenceExample"):
        train_lora(train_examples=sft_examples, hyperparameters=HYPERPARAMETERS, method="dpo", **common)
    with pytest.raises(ValueError, match="TokenizedExample"):
        train_lora(train_examples=pairs, hyperparameters=HYPERPARAMETERS, **common)
    with pytest.raises(ValueError, match="DpoHyperparameters"):
        train_lora(train_examples=pairs, hyperparameters=supervised, method="dpo", **common)
