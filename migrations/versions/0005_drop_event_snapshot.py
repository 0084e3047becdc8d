"""Chain format v2: the always-NULL ``events.snapshot`` column is dropped.

Every event ever recorded held NULL there (snapshot contents are named in the
``snapshot_taken`` payload). Events recorded before keep their chain format
(``auditlog-chain-v1``): they are hashed with that NULL in its place, so they
verify exactly as before; new streams are written in ``auditlog-chain-v2``,
whose canonical row has no ``snapshot`` (``auditlog.core.chain``).

A store where any event holds a value there was not written by auditlog (or was
edited): dropping the column would drop that value, which its chain hash covers,
so the upgrade refuses it (``CorruptRecordError``, one line naming the first such
event) and changes nothing. SQLite drops the column by copying the table (Alembic's
batch mode; ids, the unique (run, stream, seq) constraint and the (run, kind) index
are kept), PostgreSQL with ``ALTER TABLE ... DROP COLUMN``.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from auditlog.core.errors import CorruptRecordError

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    events = sa.table(
        "events",
        sa.column("id"),
        sa.column("run_id"),
        sa.column("stream"),
        sa.column("seq"),
        sa.column("kind"),
        sa.column("snapshot"),
    )
    held = sa.select(events).where(events.c.snapshot.is_not(None))
    bind = op.get_bind()
    first = bind.execute(held.order_by(events.c.id).limit(1)).first()
    if first is not None:
        count = bind.execute(sa.select(sa.func.count()).select_from(held.subquery())).scalar()
        raise CorruptRecordError(
            f"{count} event(s) hold a value in the snapshot column, which auditlog always left "
            f"NULL (first: event id {first.id}, run {str(first.run_id)[:12]!r} stream "
            f"{first.stream!r} seq {first.seq!r}, kind {str(first.kind)[:32]!r}, snapshot "
            f"{str(first.snapshot)[:70]!r}): written by other software or edited, and dropping the "
            "column would drop what their hashes cover; the store was left unchanged "
            "(run `auditlog verify` with the auditlog that wrote it)"
        )
    with op.batch_alter_table("events") as batch:
        batch.drop_column("snapshot")


def downgrade() -> None:
    # Streams recorded in chain format v2 do not verify under auditlog before 0005.
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("snapshot", sa.String(64)))
