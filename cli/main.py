"""The ``auditlog`` Click group and the one place errors become exit codes.

Library errors (``AuditlogError``) become ``Error: ...`` on stderr with the exit
code their class documents (see ``auditlog.core.errors``); an unexpected exception is
one line too. Tracebacks only with ``--debug``.

Each command's module is imported when that command runs (or when ``--help``
lists them all), not at start-up: a read command then loads the code it uses,
not that of 26 others (``COMMANDS``).
"""

from __future__ import annotations

import importlib
import traceback
from typing import Any

import click
from auditlog.cli.inert import guarded_streams

from auditlog.core.errors import AuditlogError
from auditlog.core.version import __version__
from auditlog.present.text import inert

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class CliError(click.ClickException):
    """A library error on its way out: ``Error: message`` and the error's exit code.

    The message is one line whatever stored text it quotes (``cli.inert.inert``).
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(inert(message))
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it on the class; each error has its own


# command name -> (module under auditlog.cli, attribute): imported on first use.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run_cmd", "run"),
    "runs": ("runs_cmd", "runs"),
    "events": ("events_cmd", "events"),
    "verify": ("verify_cmd", "verify"),
    "db": ("db_cmd", "db"),
    "keygen": ("keys_cmd", "keygen"),
    "checkpoint": ("heads_cmd", "checkpoint"),
    "export-head": ("heads_cmd", "export_head"),
    "tree": ("tree_cmd", "tree"),
    "snapshots": ("snapshots_cmd", "snapshots"),
    "restore": ("restore_cmd", "restore"),
    "query": ("query_cmd", "query"),
    "schema": ("query_cmd", "schema"),
    "diff": ("diff_cmd", "diff"),
    "prove": ("proofs_cmd", "prove"),
    "verify-proof": ("proofs_cmd", "verify_proof"),
    "attest": ("attest_cmd", "attest"),
    "verify-attestation": ("attest_cmd", "verify_attestation"),
    "combine": ("combine_cmd", "combine"),
    "export": ("export_cmd", "export"),
    "metrics": ("metrics_cmd", "metrics"),
    "nonfinite": ("metrics_cmd", "nonfinite"),
    "data": ("data_cmd", "data"),
    "plot": ("plot_cmd", "plot"),
    "report": ("report_cmd", "report"),
    "bom": ("bom_cmd", "bom"),
    "ui": ("ui_cmd", "ui"),
}


class AuditlogGroup(click.Group):
    """Converts library errors into ``CliError`` for every subcommand; loads each
    subcommand's module when it is asked for (``COMMANDS``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attribute = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"auditlog.cli.{module}"), attribute)
            self.add_command(command, cmd_name)
        return self.commands.get(cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with guarded_streams():  # every byte a command prints passes cli.inert
                return super().invoke(ctx)
        except click.UsageError as exc:
            # One line, like every other error (Click's own adds "Usage:" and "Try" lines).
            raise CliError(exc.format_message(), exc.exit_code) from exc
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except AuditlogError as exc:
            if ctx.meta.get("auditlog.debug"):
                traceback.print_exc()
            raise CliError(str(exc), exc.exit_code) from exc
        except KeyboardInterrupt:  # Ctrl-C: one line and 130, what a shell reports for SIGINT
            raise CliError("interrupted", 130) from None
        except BrokenPipeError:
            ctx.exit(0)
        except Exception as exc:  # a bug in auditlog: still one line unless --debug
            if ctx.meta.get("auditlog.debug"):
                traceback.print_exc()
            raise CliError(
                f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
                1,
            ) from exc


@click.group(cls=AuditlogGroup, context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="auditlog")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Record how a PyTorch model is built and trained; query and verify the record.

    Runs are selected by id, unique id prefix, name (refused when several runs
    have it), 'latest' or 'latest~N'.
    Exit codes: 0 ok, 1 error, 2 usage, 3 store refused, 4 verify failed,
    5 recording failed (--on-error fail), 130 interrupted.

    Shell completion (commands, options, run ids and names, event kinds):
    add to ~/.bashrc: eval "$(_AUDITLOG_COMPLETE=bash_source auditlog)";
    zsh: zsh_source in ~/.zshrc; fish: _AUDITLOG_COMPLETE=fish_source auditlog
    | source, in ~/.config/fish/completions/auditlog.fish.
    """
    ctx.meta["auditlog.debug"] = debug


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="auditlog")


if __name__ == "__main__":
    main()
