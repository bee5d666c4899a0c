"""``coevo serve``: a local, read-only web browser of runs (Starlette, served by uvicorn):
the episodes with filters, one episode turn by turn, an entry's lineage as linked pages.
:mod:`.data` reads a run through its audit index; :mod:`.app` renders the pages."""
