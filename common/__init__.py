"""Shared plumbing for the mathrl algorithm files: env (tasks, verifiers), models (loading,
generation), utils (numerics, distributed, logging)."""
