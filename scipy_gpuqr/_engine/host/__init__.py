"""_engine.host."""
