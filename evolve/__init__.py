"""evolve."""
