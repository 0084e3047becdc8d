"""Signed checkpoints of chain heads (room for Ed25519 signatures).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("stream", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
        sa.Column("key_fingerprint", sa.String(64), nullable=False),
        sa.Column("signature", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
