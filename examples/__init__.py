"""Runnable examples: the demo, its job app, and a fenced receiver service."""
