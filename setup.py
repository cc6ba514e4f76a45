"""The one compiled module: the audit record encoder's common case (auditlog/_record_fast.c).

`optional`: without a compiler the install still succeeds and records are encoded in pure Python
(auditlog/record_fast.py says so in the agent's log and npaudit_build_info); `make setup` installs gcc and
the headers.
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("auditlog._record_fast", ["auditlog/_record_fast.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers"])])
