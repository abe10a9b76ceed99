"""Helpers for differential tests against upstream vLLM (see :mod:`vtinfer.testing.upstream`)."""
