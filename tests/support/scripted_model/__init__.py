"""A scripted model for the tests: real agent CLIs run whole sessions against it on 127.0.0.1.

``brain.py`` is the agent (protocol-neutral: it follows heartbeat's brief and keeps its own
record of the work it did); ``server.py`` serves it over HTTP; each wire module (``anthropic.py``
for ``claude``; a ``responses.py`` for ``codex`` goes beside it) maps one API's framing to the
brain's :class:`~tests.scripted_model.brain.Conversation` and :class:`~tests.scripted_model.brain.Reply`
and exposes ``ROUTES``. ``scripted_model(log_dir, workload)`` runs one.
"""

from .brain import Brain, Controls, Record, Workload, step_file
from .server import ScriptedModel, scripted_model

__all__ = ["Brain", "Controls", "Record", "Workload", "ScriptedModel", "scripted_model", "step_file"]
