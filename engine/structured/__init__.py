"""Constrained decoding: what a request asks its output to match, and the token masks."""
