"""Planning tools: the capacity worksheet and the prefix-reuse replay of a traffic sample."""
