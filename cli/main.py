"""The ``auditlog`` Click group and the one place errors become exit codes.

Library errors (``AuditlogError``) become ``Error: ...`` on stderr with the exit
code their class documents (see ``auditlog.core.errors``); an unexpected exception is
one line too. Tracebacks only with ``--debug``.
"""

from __future__ import annotations

import traceback
from typing import Any

import click
from auditlog.cli import (
    attest_cmd,
    bom_cmd,
    combine_cmd,
    data_cmd,
    db_cmd,
    diff_cmd,
    events_cmd,
    export_cmd,
    heads_cmd,
    keys_cmd,
    metrics_cmd,
    plot_cmd,
    proofs_cmd,
    query_cmd,
    report_cmd,
    restore_cmd,
    run_cmd,
    runs_cmd,
    snapshots_cmd,
    tree_cmd,
    ui_cmd,
    verify_cmd,
)
from auditlog.cli.inert import guarded_streams, inert

from auditlog.core.errors import AuditlogError
from auditlog.core.version import __version__

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class CliError(click.ClickException):
    """A library error on its way out: ``Error: message`` and the error's exit code.

    The message is one line whatever stored text it quotes (``cli.inert.inert``).
    """

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(inert(message))
        self.exit_code = exit_code  # type: ignore[misc]  # click declares it on the class; each error has its own


class AuditlogGroup(click.Group):
    """Converts library errors into ``CliError`` for every subcommand."""

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
                f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", 1
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


cli.add_command(run_cmd.run)
cli.add_command(runs_cmd.runs)
cli.add_command(events_cmd.events)
cli.add_command(verify_cmd.verify)
cli.add_command(db_cmd.db)
cli.add_command(keys_cmd.keygen)
cli.add_command(heads_cmd.checkpoint)
cli.add_command(heads_cmd.export_head)
cli.add_command(tree_cmd.tree)
cli.add_command(snapshots_cmd.snapshots)
cli.add_command(restore_cmd.restore)
cli.add_command(query_cmd.query)
cli.add_command(query_cmd.schema)
cli.add_command(diff_cmd.diff)
cli.add_command(proofs_cmd.prove)
cli.add_command(proofs_cmd.verify_proof)
cli.add_command(attest_cmd.attest)
cli.add_command(attest_cmd.verify_attestation)
cli.add_command(combine_cmd.combine)
cli.add_command(export_cmd.export)
cli.add_command(metrics_cmd.metrics)
cli.add_command(metrics_cmd.nonfinite)
cli.add_command(data_cmd.data)
cli.add_command(plot_cmd.plot)
cli.add_command(report_cmd.report)
cli.add_command(bom_cmd.bom)
cli.add_command(ui_cmd.ui)


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="auditlog")


if __name__ == "__main__":
    main()
