"""Traceflow: inject one tagged packet at a Pod's port and report each table it met and what decided.

tags (which packet is whose trace), flows (the per-trace observation flows), packet (the
packet itself), result (observations -> the answer), service (runs a trace on the agent).
"""
