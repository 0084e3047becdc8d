"""Capture layer: global PyTorch hooks -> lightweight records on a queue.

Nothing in this package touches SQL, JSON, files or hashing; it knows nothing of
storage. See ``recorder.py`` for the components that hold the hooks, ``context.py``
for what they share and ``buffer.py`` for the queue.
"""
