"""What to record, and how often: the capture ``Policy``, its presets and files.

A policy is chosen, from weakest to strongest: a preset (``audit``, the default;
``debug``; ``minimal``), then a policy file (``auditlog.toml`` in the working
directory, or ``[tool.auditlog]`` in its ``pyproject.toml``, or an explicit
path), then keyword arguments / CLI flags. Unknown keys and bad values are
refused with a one-line error that names them: a typo in a compliance setting
must not silently record less.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from auditlog.core.errors import UsageError

BACKWARD_MECHANISMS = ("grad", "full", "legacy", "none")
STATS = ("full", "norm")
DURABILITY = ("fast", "step", "strict")
ON_ERROR = ("continue", "fail")


@dataclass(frozen=True)
class Policy:
    """Capture settings. Every field is documented in the README's policy table."""

    preset: str = "audit"
    # activity (forward/backward statistics per module call)
    activity: bool = True
    activity_every: int = 100
    activity_first: int = 1
    sample_nonfinite: bool = True
    backward: str = "grad"
    stats: str = "full"
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    # optimizer steps (always recorded; these choose the per-parameter statistics)
    grad_norms: bool = True
    update_norms: bool = True
    param_norms: bool = True
    norms_every: int = 10
    # metrics: the loss every step, from loss modules and model outputs (docs/forensics.md)
    loss: bool = True
    # data: every DataLoader iteration, its dataset's identity and the sample indices of
    # every batch, tied to the step that trained on them (docs/data.md)
    data: bool = True
    # iterable datasets: the content hash of every N-th batch of an iterator (0: none),
    # hashed on the writer thread (docs/data.md)
    batch_hash_every: int = 1
    # training FLOPs of one step, counted with torch.utils.flop_counter (docs/forensics.md)
    flops: bool = True
    # non-finite values: check gradients before every step (CUDA: one sync per step) and,
    # on the first NaN/Inf, record full gradient statistics and the parameters then;
    # keep_finite_state also copies the parameters before every step so that the last
    # finite state survives a step that makes them non-finite with finite gradients
    nonfinite_check: bool = False
    keep_finite_state: bool = False
    # structural checks (changes no hook reports: del, .half(), requires_grad_): after
    # every check_every-th step, spaced further (whole multiples of check_every) while
    # they would take more than check_share of the training time (0: exactly every
    # check_every steps)
    check_every: int = 10
    check_share: float = 0.01
    # snapshots of parameter and buffer values
    snapshot_initial: bool = True
    snapshot_every: int = 0
    snapshot_final: bool = True
    # storage: how much may be lost on a crash, and what a failing store does to training
    durability: str = "fast"
    on_error: str = "continue"
    source: str = field(default="preset", compare=False)

    def __post_init__(self) -> None:
        for key, value in dataclasses.asdict(self).items():
            _check(key, value, self.source)

    def samples(self, step: int) -> bool:
        """Is module activity recorded during step ``step`` (0-based: before the first optimizer step returns)?"""
        if not self.activity:
            return False
        return step < self.activity_first or step % self.activity_every == 0

    def check_interval(self, check_s: float, step_s: float) -> int:
        """Steps between structural checks that cost ``check_s`` each, with training
        steps of ``step_s``: ``check_every``, or the smallest multiple of it that keeps
        the checks within ``check_share`` of the training time."""
        every = self.check_every
        if self.check_share <= 0 or step_s <= 0 or check_s <= self.check_share * step_s * every:
            return every
        return every * math.ceil(check_s / (self.check_share * step_s * every))

    def norms_due(self, step: int) -> bool:
        """Are update and parameter norms taken during step ``step`` (0-based)?"""
        return step % self.norms_every == 0

    def module_selected(self, names: list[str], cls: str) -> bool:
        """Include/exclude globs against every qualified name and the class (short and full)."""
        if not self.include and not self.exclude:
            return True
        candidates = [*names, cls, cls.rsplit(".", 1)[-1]]

        def hit(patterns: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatchcase(c, p) for p in patterns for c in candidates)

        if self.include and not hit(self.include):
            return False
        return not (self.exclude and hit(self.exclude))

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.pop("source")
        data["include"] = list(self.include)
        data["exclude"] = list(self.exclude)
        return data


PRESETS: dict[str, dict[str, Any]] = {
    # construction, sealed initial values, every optimizer step with hyperparameters
    # and per-parameter gradient norms; update and parameter norms every 10th step,
    # module activity every 100th (and step 0)
    "audit": {},
    # everything, every step: forward and backward statistics of every module call
    "debug": {"activity_every": 1, "activity_first": 0, "norms_every": 1, "nonfinite_check": True},
    # construction and optimizer steps (hyperparameters, gradient norms); no activity
    "minimal": {
        "activity": False,
        "update_norms": False,
        "param_norms": False,
        "batch_hash_every": 0,
    },
}

_FIELDS = {f.name: f for f in dataclasses.fields(Policy) if f.name != "source"}


def _check(key: str, value: Any, source: str) -> None:
    where = f" in {source}" if source and source != "preset" else ""
    bad = UsageError

    def fail(expected: str) -> None:
        raise bad(f"policy key {key!r}{where} must be {expected}, not {value!r}")

    if key == "source":
        return
    if key == "preset":
        if value not in PRESETS:
            raise bad(f"unknown policy preset {value!r}{where}; presets: {', '.join(PRESETS)}")
    elif key in ("activity_every", "norms_every", "check_every"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            fail("an integer >= 1")
    elif key in ("activity_first", "snapshot_every", "batch_hash_every"):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            fail("an integer >= 0")
    elif key == "backward":
        if value not in BACKWARD_MECHANISMS:
            fail(" | ".join(BACKWARD_MECHANISMS))
    elif key == "stats":
        if value not in STATS:
            fail(" | ".join(STATS))
    elif key == "durability":
        if value not in DURABILITY:
            fail(" | ".join(DURABILITY))
    elif key == "on_error":
        if value not in ON_ERROR:
            fail(" | ".join(ON_ERROR))
    elif key == "check_share":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            fail("a number from 0 to 1")
    elif key in ("include", "exclude"):
        if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) and p for p in value):
            fail("a list of non-empty glob strings")
    elif not isinstance(value, bool):
        fail("true or false")


def make_policy(base: str | Policy | os.PathLike[str] | None = None, **overrides: Any) -> Policy:
    """Build a policy from a preset name, a file path, a Policy, or the defaults, then overrides.

    With ``base`` None, ``auditlog.toml`` or ``pyproject.toml`` ``[tool.auditlog]`` in
    the working directory is used when present.
    """
    values: dict[str, Any] = {}
    source = "preset"
    if isinstance(base, Policy):
        values = base.as_dict()
        source = base.source
    elif base is None or (isinstance(base, str) and base in PRESETS):
        if base is None:
            found = discover(Path.cwd())
            if found is not None:
                values, source = found
        else:
            values = {"preset": base}
    else:
        values, source = read_policy_file(Path(os.fspath(base)))
    unknown = [k for k in overrides if k not in _FIELDS]
    if unknown:
        raise UsageError(f"unknown policy key {unknown[0]!r}; known keys: {', '.join(_FIELDS)}")
    merged = {k: v for k, v in values.items()}
    merged.update({k: v for k, v in overrides.items() if v is not None})
    preset = merged.get("preset", "audit")
    _check("preset", preset, source)
    final = {**PRESETS[preset], **merged, "preset": preset}
    for key in ("include", "exclude"):
        if key in final and isinstance(final[key], list):
            final[key] = tuple(final[key])
    return Policy(**final, source=source)


def read_policy_file(path: Path) -> tuple[dict[str, Any], str]:
    """Read a policy TOML file (top-level keys, or ``[tool.auditlog]`` of a pyproject.toml)."""
    shown = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"policy {shown!r} is neither a preset ({', '.join(PRESETS)}) nor an existing file"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read policy file {shown!r}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"policy file {shown!r} is not valid TOML: {exc}") from exc
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("auditlog", {})
        shown += " [tool.auditlog]"
    unknown = [k for k in data if k not in _FIELDS]
    if unknown:
        raise UsageError(
            f"unknown policy key {unknown[0]!r} in {shown}; known keys: {', '.join(_FIELDS)}"
        )
    for key, value in data.items():
        _check(key, value, shown)
    return dict(data), shown


def discover(directory: Path) -> tuple[dict[str, Any], str] | None:
    """``auditlog.toml``, else ``pyproject.toml`` with a ``[tool.auditlog]`` table, in ``directory``."""
    own = directory / "auditlog.toml"
    if own.is_file():
        return read_policy_file(own)
    pyproject = directory / "pyproject.toml"
    if pyproject.is_file():
        try:
            has = "auditlog" in tomllib.loads(pyproject.read_text()).get("tool", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None  # someone else's broken pyproject is not our policy file
        if has:
            return read_policy_file(pyproject)
    return None
