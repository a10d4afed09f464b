"""Subcommands of the segc CLI (one module each)."""
