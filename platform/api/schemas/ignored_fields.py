"""OpenAI request fields that change nothing on this server, accepted so that frameworks sending them work.

Each is declared with its OpenAI type (a wrong type is still a 400 naming it) and listed in IGNORED_FIELDS;
a request that sets any of them is answered with their names in the `x-loraloom-ignored-fields` header
(api/generation/respond.py name_ignored_fields), so a client can see what had no effect. Fields this server
implements (metadata, which is stored with the usage record; prompt_cache_key) are not among them.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool, StrictStr, field_validator

IGNORED_FIELDS_HEADER = "x-loraloom-ignored-fields"

# OpenAI's bounds on metadata: what the usage record stores per request stays small.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

_NO_EFFECT = "Accepted and ignored: "


class IgnoredChatFields(BaseModel):
    """Chat completion fields of OpenAI's request schema with nothing to do here."""

    store: StrictBool | None = Field(default=None, description=_NO_EFFECT + "completions are not stored for "
                                     "distillation or evals (usage is metered whatever this says).")
    service_tier: StrictStr | None = Field(default=None, description=_NO_EFFECT + "one tier serves everyone.")
    safety_identifier: StrictStr | None = Field(default=None, description=_NO_EFFECT + "no abuse monitoring "
                                                "keys on it here.")
    verbosity: Literal["low", "medium", "high"] | None = Field(
        default=None, description=_NO_EFFECT + "it steers OpenAI's reasoning models; the served model does not take it."
    )
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = Field(
        default=None, description=_NO_EFFECT + "the served model does not reason before it answers."
    )
    modalities: list[StrictStr] | None = Field(default=None, description="Only `[\"text\"]` (accepted and ignored): "
                                               "only text is generated.")

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, modalities: list[str] | None) -> list[str] | None:
        if modalities is not None and set(modalities) != {"text"}:
            raise ValueError(f"only text output is supported, got {modalities!r}; send [\"text\"] or leave it out")
        return modalities


class MetadataField(BaseModel):
    """OpenAI's `metadata`: stored with the request's usage record (not an ignored field)."""

    metadata: dict[StrictStr, StrictStr] | None = Field(
        default=None, description=f"At most {MAX_METADATA_PAIRS} string pairs (keys of at most {MAX_METADATA_KEY_CHARS} "
        f"characters, values of at most {MAX_METADATA_VALUE_CHARS}); stored with the request's usage record.",
    )

    @field_validator("metadata")
    @classmethod
    def _bounded(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}; send fewer")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY_CHARS:
                raise ValueError(f"key {key[:20]!r}... has {len(key)} characters; at most {MAX_METADATA_KEY_CHARS}")
            if len(value) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(f"the value of {key!r} has {len(value)} characters; at most {MAX_METADATA_VALUE_CHARS}")
        return metadata


# Every field, of any endpoint, that is accepted and ignored (not `user`: it keeps a user on one version of a
# split alias, registry/splits.py). Dotted: a field of a nested object.
IGNORED_FIELDS = (*IgnoredChatFields.model_fields, "stream_options.include_obfuscation")


def ignored_field_names(body: BaseModel) -> list[str]:
    """The ignored fields the client set (explicitly: a null counts, as it was sent), in IGNORED_FIELDS' order."""
    sent = _sent_fields(body)
    return [name for name in IGNORED_FIELDS if name in sent]


def _sent_fields(body: BaseModel, prefix: str = "") -> set[str]:
    names: set[str] = set()
    for name in body.model_fields_set:
        names.add(prefix + name)
        value: Any = getattr(body, name)
        if isinstance(value, BaseModel):
            names |= _sent_fields(value, f"{prefix}{name}.")
    return names
