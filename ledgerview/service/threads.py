"""The one shape of the service's background parts: work on a thread of its own until told to stop."""

from __future__ import annotations

import threading


class BackgroundThread:
    """``start`` runs ``run`` on a daemon thread named ``thread_name``; ``stop`` sets ``stopping`` and waits for
    ``run`` to return (it checks ``stopping`` between units of work and finishes the one in progress)."""

    thread_name = "ledgerview"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join()

    def run(self) -> None:
        raise NotImplementedError
