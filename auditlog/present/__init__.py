"""What a person reads, built once for the CLI, the web UI and Python users.

``text`` makes any stored string inert on a terminal (escaped control characters,
long values cut); ``tree_text`` and ``diff_text`` draw a module tree and a run diff
as ``auditlog tree`` and ``auditlog diff`` print them; ``report*`` build the HTML
pages of ``auditlog report``; ``plots`` draws the figures of ``plot`` and
``report``. The facts come from ``auditlog.read``; nothing here reads the store
except through it, and nothing here writes.
"""
