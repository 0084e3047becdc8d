"""Initial event store: store identity, runs index, hash-chained events.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "auditlog_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(32), primary_key=True),
        sa.Column("name", sa.Text),
        sa.Column("started_ns", sa.BigInteger, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("proc_start", sa.BigInteger),
        sa.Column("last_seen_ns", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("stream", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("ts_ns", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("step", sa.BigInteger),
        sa.Column("module_id", sa.BigInteger),
        sa.Column("tensor_id", sa.BigInteger),
        sa.Column("snapshot", sa.String(64)),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.UniqueConstraint("run_id", "stream", "seq", name="uq_events_run_stream_seq"),
    )
    op.create_index("ix_events_run_kind", "events", ["run_id", "kind"])


def downgrade() -> None:
    op.drop_index("ix_events_run_kind", table_name="events")
    op.drop_table("events")
    op.drop_table("runs")
    op.drop_table("auditlog_meta")
