"""The `npaudit` command line: main (the parser of every verb), one module per verb, shared helpers in common."""
