"""The ``auditlog`` Click group and the one place errors become exit codes.

``Error: ...`` on stderr and a documented exit code (see ``auditlog.errors``);
a traceback only with ``--debug``.
"""

from __future__ import annotations

import sys
import traceback

import click

import auditlog
from auditlog.cli import db_cmd, events_cmd, run_cmd, runs_cmd, verify_cmd
from auditlog.errors import AuditlogError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(auditlog.__version__, "--version", prog_name="auditlog")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Record how a PyTorch model is built and trained; query and verify the record."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


cli.add_command(run_cmd.run)
cli.add_command(runs_cmd.runs)
cli.add_command(events_cmd.events)
cli.add_command(verify_cmd.verify)
cli.add_command(db_cmd.db)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        code = cli.main(args=args, prog_name="auditlog", standalone_mode=False)
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.Abort:
        click.echo("Aborted.", err=True)
        code = 130
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except AuditlogError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"Error: {exc}", err=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        click.echo("Interrupted.", err=True)
        code = 130
    except BrokenPipeError:
        code = 0
    except Exception as exc:  # a bug in auditlog: still one line unless --debug
        if debug:
            traceback.print_exc()
        click.echo(f"Error: internal error: {type(exc).__name__}: {exc} (rerun with --debug)", err=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
