"""Notebook views: plain data models in, widgets (or text, outside a notebook) out."""
