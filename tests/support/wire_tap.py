"""A plain TCP relay for tests that keeps every byte the client sent, to prove what crossed the wire."""

from __future__ import annotations

import socket
import threading

from tests.support.accepting import AcceptThread


class WireTap:
    """Listens on 127.0.0.1 and relays each connection, both ways, to `backend` unchanged."""

    def __init__(self, backend: tuple[str, int]) -> None:
        self._backend = backend
        self.wire = bytearray()  # every byte clients sent, in arrival order
        self.connections = 0
        self._accepting = AcceptThread(self._relay)
        self.port: int = self._accepting.port

    def close(self) -> None:
        self._accepting.close()

    def _relay(self, client: socket.socket) -> None:
        self.connections += 1
        try:
            server = socket.create_connection(self._backend)
        except OSError:
            client.close()
            return
        threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    self.wire += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
