"""The compiled modules: the audit record encoder's common case (auditlog/_record_fast.c), the chain's sealer
the frame decoder's common case (auditlog/_frame_fast.c), the aggregator (auditlog/_aggregate_fast.c) and the
syslog forwarder's split, scan and frames of sealed lines (auditlog/_scan_fast.c), the digests and texts of the record
path (auditlog/_digest_fast.c);
NXT_PACKET_IN2 decoding by learned layout
(packetin/_layout_fast.c); the event loop's wait after a quiet spell, a lone packet-in's record written from inside it
(packetin/_quiet_fast.c).

`optional`: without a compiler (or OpenSSL's headers) the install still succeeds and records are encoded in pure Python
(auditlog/record_fast.py says so in the agent's log and npaudit_build_info); `make setup` installs gcc and
the headers (Python's, OpenSSL's).
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
setup(ext_modules=[Extension("auditlog._record_fast", ["auditlog/_record_fast.c", "auditlog/_frame_fast.c",
                                                      "auditlog/_aggregate_fast.c", "auditlog/_scan_fast.c",
                                                      "auditlog/_digest_fast.c"],
                             optional=True, depends=["auditlog/_frame_fast.h", "auditlog/_aggregate_fast.h",
                                                     "auditlog/_scan_fast.h", "auditlog/_digest_fast.h"],
                             libraries=["crypto"],  # SHA-256 without SHA extensions, the forwarder's scan: libssl-dev
                             extra_compile_args=FLAGS),
                   Extension("packetin._layout_fast", ["packetin/_layout_fast.c"], optional=True,
                             extra_compile_args=FLAGS),
                   Extension("packetin._quiet_fast", ["packetin/_quiet_fast.c"], optional=True,
                             extra_compile_args=FLAGS)])
