"""What ``verify`` found: problems pinned to events, each stream's tip, and notes.

Shared by the checks (``verify``: chains and trees, ``signed``: signatures and
coverage, ``runindex``: the runs index, ``snapshots``: snapshot files).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from auditlog.integrity.statements import HeadStatement


@dataclass(frozen=True)
class Problem:
    """One integrity failure, pinned to an event or to the checkpoint that caught it.

    ``altered`` is True when the problem proves the record was changed, False when
    something could not be verified (a signature by a key nobody trusted, an
    exported statement that does not verify, events no signature covers); both
    fail ``verify``.
    """

    run_id: str
    stream: int
    seq: int
    event_id: int | None
    kind: str | None
    what: str
    checkpoint_id: int | None = None
    altered: bool = True

    def describe(self) -> str:
        at = f"run {self.run_id[:12]} stream {self.stream} seq {self.seq}"
        if self.event_id is not None:
            at += f" (event id {self.event_id}, {self.kind})"
        if self.checkpoint_id is not None:
            at += f" (checkpoint {self.checkpoint_id})"
        return f"{at}: {self.what}"


@dataclass
class StreamTip:
    """One stream as verify read it: its last event, tree head, end and declared world size."""

    stream: int
    seq: int = 0
    head_hash: str = ""
    tree_root: str = ""
    ended_at: int | None = None
    world_size: int | None = None
    roots: dict[int, str] = field(
        default_factory=dict
    )  # tree heads at the sizes signed statements name
    # The fingerprint run_started names when the stream was recorded with a signing key (issue 29).
    signing_key: str | None = None
    end_status: str | None = (
        None  # its run_ended's status (completed, failed, interrupted, crashed)
    )

    @property
    def ended(self) -> bool:
        """The stream's last event is its ``run_ended``."""
        return self.ended_at is not None and self.ended_at == self.seq


@dataclass
class VerifyReport:
    """The outcome of verifying one run."""

    run_id: str
    events: int = 0
    streams: dict[int, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    checkpoints: int = 0
    statements: int = 0
    snapshots: int = 0
    tips: dict[int, StreamTip] = field(default_factory=dict)
    # Highest seq of each stream that a valid signature by a trusted key covers.
    covered: dict[int, int] = field(default_factory=dict)
    consistency: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and self.events > 0

    @property
    def signed(self) -> bool:
        """Every event of every stream is covered by a valid signature by a trusted key."""
        return self.events > 0 and all(
            self.covered.get(stream, 0) >= tip.seq
            for stream, tip in self.tips.items()
            if tip.seq > 0
        )

    @property
    def assurance(self) -> str:
        """What the verdict proves (issue 29): ``failed``; ``unsigned`` (the chain is intact,
        which an accidental damage or a naive edit would break, but anyone with write access
        can rewrite a chain with fresh hashes); ``signed`` (every event under a signature by a
        trusted key); ``signed-against-head`` (signed, and the record extends a head
        exported earlier and kept elsewhere)."""
        if not self.ok:
            return "failed"
        if not self.signed:
            return "unsigned"
        return "signed-against-head" if self.statements else "signed"

    @property
    def verdict(self) -> str:
        """The assurance in words, as ``verify`` prints it after the counts."""
        return VERDICTS[self.assurance]

    def first_problem(self) -> Problem | None:
        """The problem to name first: the first proven alteration, else the first doubt."""
        for problem in self.problems:
            if problem.altered:
                return problem
        return self.problems[0] if self.problems else None

    def world_size(self) -> int | None:
        """The world size the run's streams declare (None when none says, or they disagree)."""
        sizes = {t.world_size for t in self.tips.values() if t.world_size is not None}
        return sizes.pop() if len(sizes) == 1 else None


VERDICTS = {
    "failed": "FAILED",
    "unsigned": (
        "intact, unsigned: the chain detects accidental damage and naive edits, not a rewrite "
        "by someone with write access (sign with a key: `auditlog keygen`)"
    ),
    "signed": "intact, signed: every event is covered by a signature by a trusted key",
    "signed-against-head": (
        "intact, signed and checked against an exported head: every event is covered "
        "by a signature by a trusted key, and the record extends the head kept elsewhere"
    ),
}


# A statement read from a file, with the name to report it by (the file path).
SourcedStatement = tuple[str, HeadStatement]
