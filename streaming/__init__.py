"""streaming: see DESIGN.md."""
