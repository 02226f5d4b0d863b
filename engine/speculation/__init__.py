"""Draft-free proposers for speculative decoding (pure Python, no torch).

Speculative decoding needs guesses of the next few tokens that the model then checks in one step. These
modules guess without a draft model, by copying from text already seen: `ngram_index` looks the request's
latest tokens up in its own prompt and output (prompt lookup), and `output_store` looks them up in the
recent finished outputs of the same tenant and adapter (templated answers). Both are called on the
engine's step thread for every running request, so every call costs a few dictionary lookups, never a scan.
"""
