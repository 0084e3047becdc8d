"""Catalog of content-addressed tensor snapshots.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "snapshot_blobs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("file", sa.Text, nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("shape", sa.Text, nullable=False),
        sa.Column("numel", sa.BigInteger, nullable=False),
        sa.Column("nbytes", sa.BigInteger, nullable=False),
        sa.Column("layout", sa.String(8), nullable=False),
        sa.Column("row_groups", sa.Integer, nullable=False),
        sa.Column("file_sha256", sa.String(64), nullable=False),
        sa.Column("created_ns", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("snapshot_blobs")
