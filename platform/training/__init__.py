"""Fine-tuning: dataset validation (datasets), hyperparameters, the LoRA trainer.

Nothing is imported here: the API validates uploads with `datasets` alone and
should not pay for importing torch, peft and transformers that `trainer` needs.
"""
