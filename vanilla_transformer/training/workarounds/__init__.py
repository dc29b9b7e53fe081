"""Workarounds for limits of the libraries the toolkit builds on: one module per limit, named after the library and
what it works around. Each module's docstring says which version it was written for, the limit, and how to tell it
can go.

Nothing is imported here.
"""
