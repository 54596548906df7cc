"""readers: see DESIGN.md."""
