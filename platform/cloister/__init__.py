"""cloister."""
