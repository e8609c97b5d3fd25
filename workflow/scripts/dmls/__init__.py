"""The pipeline's package; its map (layers, modules, what imports what): docs/architecture.md."""
