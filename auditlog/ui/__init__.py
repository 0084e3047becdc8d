"""``auditlog ui``: a read-only web UI over a store, served on this machine.

The web layer only: JSON answers built from the read API (``auditlog.read``:
runs, the module tree, the series behind ``plot`` and ``report``, the
non-finite finding, ``diff``, ``verify`` and the query sandbox of
``auditlog query``) and the static page that draws them (``static/``: plain
JavaScript, the uPlot charting library vendored with its licence, no build
step and nothing fetched from anywhere but this server). Starlette and
uvicorn come with the optional extra ``auditlog[ui]``; nothing else in the
package imports them.
"""
