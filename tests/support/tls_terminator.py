"""A TLS server for tests that hands the decrypted bytes to a plain TCP backend and keeps every wire byte it saw."""

from __future__ import annotations

import socket
import ssl
import threading


class TlsTerminator:
    """Listens on 127.0.0.1; each connection: TLS handshake (server side), then plaintext to `backend`."""

    def __init__(self, cert: str, key: str, backend: tuple[str, int]) -> None:
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        self._ctx.load_cert_chain(cert, key)
        self._backend = backend
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.wire = bytearray()          # every byte clients sent, as they sent it
        self.handshake_errors: list[str] = []
        self.handshakes = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self._ctx.wrap_bio(incoming, outgoing, server_side=True)
        backend: socket.socket | None = None
        try:
            while data := conn.recv(65536):
                self.wire += data
                incoming.write(data)
                try:
                    if backend is None:
                        tls.do_handshake()
                        self.handshakes += 1
                        backend = socket.create_connection(self._backend)
                    while plain := tls.read(65536):
                        backend.sendall(plain)
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLZeroReturnError:
                    break
                except ssl.SSLError as exc:
                    self.handshake_errors.append(str(exc))
                    break
                finally:
                    if pending := outgoing.read():
                        conn.sendall(pending)
        except OSError:
            pass
        finally:
            conn.close()
            if backend is not None:
                backend.close()
