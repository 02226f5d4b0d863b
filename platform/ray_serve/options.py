"""The application's arguments (the `args` of deploy/ray/serve_config.yaml): which model, the engine's
sizing, and how requests are routed to engine replicas. The gateway and every engine replica read the
same ones."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loraloom.engine import EngineConfig
from loraloom.platform.ray_serve.affinity_rule import SpilloverPolicy

ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineConfig)}
ROUTING_FIELDS = {f.name for f in dataclasses.fields(SpilloverPolicy)}
ARGS = ("model", "engine", "routing")


@dataclass(frozen=True)
class AppOptions:
    model: str | None = None  # a checkpoint directory, on every node at the same path; None: the bundled model
    engine: dict[str, Any] = field(default_factory=dict)  # EngineConfig fields
    routing: dict[str, Any] = field(default_factory=dict)  # SpilloverPolicy fields (affinity_rule.py)

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> "AppOptions":
        unknown = set(args) - set(ARGS)
        if unknown:
            raise ValueError(f"args: unknown keys {sorted(unknown)}; the application takes {list(ARGS)}")
        engine = dict(args.get("engine") or {})
        bad = set(engine) - ENGINE_FIELDS
        if bad:
            raise ValueError(f"args.engine: unknown fields {sorted(bad)}; use EngineConfig's: {sorted(ENGINE_FIELDS)}")
        routing = dict(args.get("routing") or {})
        bad = set(routing) - ROUTING_FIELDS
        if bad:
            raise ValueError(f"args.routing: unknown fields {sorted(bad)}; use {sorted(ROUTING_FIELDS)}")
        SpilloverPolicy(**routing)  # its values are checked here, once, rather than in every gateway's router
        return cls(model=args.get("model"), engine=engine, routing=routing)

    def model_dir(self) -> Path:
        if self.model is not None:
            return Path(self.model)
        from loraloom.engine import import_bundled  # imported here: it needs torch, which the gateway may lack

        return import_bundled()

    def engine_config(self) -> EngineConfig:
        return EngineConfig(**self.engine)
