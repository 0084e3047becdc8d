"""Signed tree heads: checkpoints gain a format, a Merkle tree root, the stream's end and the world size.

Rows from older versions keep ``format`` NULL and stay ``auditlog-checkpoint-v1``
statements, verifiable as before.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("format", sa.String(32)))
    op.add_column("checkpoints", sa.Column("tree_root", sa.String(64)))
    op.add_column("checkpoints", sa.Column("ended", sa.Integer))
    op.add_column("checkpoints", sa.Column("world_size", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        for column in ("world_size", "ended", "tree_root", "format"):
            batch.drop_column(column)
