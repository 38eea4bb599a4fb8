"""One module per model family; `engine.model.registry` lists them."""
