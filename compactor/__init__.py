"""compactor: see DESIGN.md."""
